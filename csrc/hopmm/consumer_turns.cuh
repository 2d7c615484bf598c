// Ping-pong turn-taking (FlashAttention-3, CUTLASS ping-pong): two consumer warpgroups with
// tiles of their own alternate on the tensor cores. Consumer c waits on named barrier
// kBarrierTurnBase + c before its tile's first wgmma and, right after its last commit, arrives
// on the other consumer's barrier: the other's main loop then runs while this one drains its
// pipeline and stores its tile.
//
// Every bar.sync must meet exactly one bar.arrive (128 + 128 threads). With the CTA's tiles
// j = 0, 1, ..., n-1 taken by consumer j % 2: consumer 1 hands consumer 0 the first turn
// (when n >= 1), and the consumer of tile j passes the turn only when tile j + 1 exists. So
// tile 0's wait meets the first hand-over, tile j's wait meets tile j-1's pass, and no arrival
// is left over at the end, whatever n (0, 1, odd, even) is. A barrier never holds two
// arrivals: the next arrive on it follows the wait it meets.
#pragma once
#include "tile_config.cuh"

namespace hopmm {

struct TensorCoreTurns {
    static constexpr u32 kThreads = 2 * kWarpgroupThreads;  // the waiter and the passer

    u32 mine;         // the barrier this consumer waits on
    u32 other;        // the barrier the other consumer waits on
    bool pass_on;     // whether the other consumer has a tile after this one

    // Consumer `consumer` (0 or 1) working on a tile; `next_tile_exists`: whether the CTA has
    // a tile after it (the other consumer's).
    __device__ __forceinline__ TensorCoreTurns(int consumer, bool next_tile_exists)
        : mine(kBarrierTurnBase + consumer),
          other(kBarrierTurnBase + (consumer ^ 1)),
          pass_on(next_tile_exists) {}

    // Consumer 1 gives consumer 0 the CTA's first turn (consumer 0 takes the first tile).
    __device__ __forceinline__ static void hand_first_turn(int consumer, bool cta_has_tiles) {
        if (consumer == 1 && cta_has_tiles) named_barrier_arrive(kBarrierTurnBase, kThreads);
    }

    __device__ __forceinline__ void wait() const { named_barrier_sync(mine, kThreads); }

    __device__ __forceinline__ void pass() const {
        if (pass_on) named_barrier_arrive(other, kThreads);
    }
};

}  // namespace hopmm

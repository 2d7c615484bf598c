// Slot `consumer`: one consumer warpgroup multiplies its rows of the A tile (64 when the
// consumers share a tile, all of them when each has tiles of its own) with the whole B tile
// for every k-block, accumulating in registers: one m64 wgmma per 64-row block per k16 step.
//
// The async pipeline (seed 000): one wgmma.commit_group per k-block, wait_group<1> inside the
// loop (the previous k-block's group is then complete, so its stage is released), and a single
// wait_group<0> flush after the loop, before anything reads the accumulators.
#pragma once
#include "tile_config.cuh"

namespace hopmm {

// Turn-taking hooks of a main loop (see consumer_turns.cuh); this one never waits: consumers
// that share each tile run their main loops side by side.
struct NoTurns {
    __device__ __forceinline__ void wait() const {}
    __device__ __forceinline__ void pass() const {}
};

template <class Cfg, class Consumer, class Turns>
__device__ __forceinline__ void wgmma_k_blocks(Consumer& state, const SharedStorage<Cfg>& smem,
                                               int consumer, int num_k_blocks, int& ring,
                                               bool leader, const Turns& turns);

template <class Cfg>
struct WgmmaConsumer {
    typedef TileShape<Cfg> S;
    typedef Wgmma<S::kBlockN, Cfg::kBf16, Cfg::kTransA, Cfg::kTransB> Mma;
    static constexpr int kAccRegs = Mma::kAccRegs;
    static constexpr int kKSteps = S::kBlockK / kWgmmaK;

    float acc[S::kRowBlocks][kAccRegs];

    // `row0`: the first A-tile row the wgmma reads (a multiple of 64).
    __device__ __forceinline__ static u64 desc_a(u32 tile, int row0, int kk) {
        return Cfg::kTransA ? desc_mn_major<S::kBlockK>(tile, row0 / kTmaBoxElems, kk)
                            : desc_k_major(tile, row0, kk);
    }
    __device__ __forceinline__ static u64 desc_b(u32 tile, int kk) {
        return Cfg::kTransB ? desc_mn_major<S::kBlockK>(tile, 0, kk) : desc_k_major(tile, 0, kk);
    }

    __device__ __forceinline__ void mainloop(const SharedStorage<Cfg>& smem, int consumer,
                                             int num_k_blocks, int& ring, bool leader) {
        mainloop(smem, consumer, num_k_blocks, ring, leader, NoTurns());
    }

    // Waits until the stage of ring position `ring` is full (the producer's loads landed).
    __device__ __forceinline__ static int wait_full(const SharedStorage<Cfg>& smem, int ring) {
        const int s = ring % S::kStages;
        mbar_wait(smem.full_bar(s), (ring / S::kStages) & 1);
        return s;
    }

    // Issues the wgmmas of one k-block from stage s as one committed group. The first k-block
    // of a tile overwrites the accumulators (scale-d 0 on its first k-step: no zeroing pass).
    __device__ __forceinline__ void issue(const SharedStorage<Cfg>& smem, int s, int row0,
                                          bool first_of_tile) {
        const u32 a_tile = smem_addr(smem.a_tile(s));
        const u32 b_tile = smem_addr(smem.b_tile(s));
        wgmma_fence_operands(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
            for (int r = 0; r < S::kRowBlocks; ++r)
                Mma::mma(acc[r], desc_a(a_tile, row0 + r * S::kWgmmaM, kk), desc_b(b_tile, kk),
                         !first_of_tile || kk != 0);
        }
        wgmma_commit_group();
    }

    // After a wgmma_wait_group that covers this object's groups: the accumulators may be read.
    __device__ __forceinline__ void settle() { wgmma_fence_operands(acc); }

    // `leader` is one thread of the warpgroup: it alone arrives on the empty barriers.
    // `turns.wait()` comes before the first full-barrier wait and wgmma of the tile,
    // `turns.pass()` right after the last commit, so another consumer's wgmmas queue behind
    // this tile's while this consumer drains its pipeline and runs its epilogue.
    template <class Turns>
    __device__ __forceinline__ void mainloop(const SharedStorage<Cfg>& smem, int consumer,
                                             int num_k_blocks, int& ring, bool leader,
                                             const Turns& turns) {
        wgmma_k_blocks<Cfg>(*this, smem, consumer, num_k_blocks, ring, leader, turns);
    }
};

// The main loop of a tile for any consumer whose issue(smem, s, row0, first_of_tile) commits
// one k-block's wgmmas as one group and whose settle() fences its accumulators
// (WgmmaConsumer, DualBWgmmaConsumer in kernel_dual_b.cuh).
template <class Cfg, class Consumer, class Turns>
__device__ __forceinline__ void wgmma_k_blocks(Consumer& state, const SharedStorage<Cfg>& smem,
                                               int consumer, int num_k_blocks, int& ring,
                                               bool leader, const Turns& turns) {
    typedef TileShape<Cfg> S;
    const int row0 = S::consumer_row0(consumer);
    int prev_stage = -1;
    turns.wait();
    for (int kb = 0; kb < num_k_blocks; ++kb, ++ring) {
        const int s = WgmmaConsumer<Cfg>::wait_full(smem, ring);
        state.issue(smem, s, row0, kb == 0);
        wgmma_wait_group<1>();
        state.settle();
        // Only the group of the previous k-block is known complete: release its stage.
        if (leader && prev_stage >= 0) release_stage(smem, prev_stage);
        prev_stage = s;
    }
    turns.pass();
    wgmma_wait_group<0>();
    state.settle();
    if (leader && prev_stage >= 0) release_stage(smem, prev_stage);
}

}  // namespace hopmm

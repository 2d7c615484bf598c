// Slot `consumer`: one consumer warpgroup multiplies its 64 rows of the A tile with the whole
// B tile for every k-block, accumulating in registers.
//
// The async pipeline (seed 000): one wgmma.commit_group per k-block, wait_group<1> inside the
// loop (the previous k-block's group is then complete, so its stage is released), and a single
// wait_group<0> flush after the loop, before anything reads the accumulators.
#pragma once
#include "tile_config.cuh"

namespace hopmm {

template <class Cfg>
struct WgmmaConsumer {
    typedef TileShape<Cfg> S;
    typedef Wgmma<S::kBlockN, Cfg::kBf16, Cfg::kTransA, Cfg::kTransB> Mma;
    static constexpr int kAccRegs = Mma::kAccRegs;
    static constexpr int kKSteps = S::kBlockK / kWgmmaK;

    float acc[kAccRegs];

    __device__ __forceinline__ u64 desc_a(u32 tile, int consumer, int kk) const {
        return Cfg::kTransA ? desc_mn_major<S::kBlockK>(tile, consumer, kk)
                            : desc_k_major(tile, consumer * S::kWgmmaM, kk);
    }
    __device__ __forceinline__ u64 desc_b(u32 tile, int kk) const {
        return Cfg::kTransB ? desc_mn_major<S::kBlockK>(tile, 0, kk) : desc_k_major(tile, 0, kk);
    }

    // `leader` is one thread of the warpgroup: it alone arrives on the empty barriers.
    __device__ __forceinline__ void mainloop(const SharedStorage<Cfg>& smem, int consumer,
                                             int num_k_blocks, int& ring, bool leader) {
        int prev_stage = -1;
        for (int kb = 0; kb < num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            mbar_wait(smem.full_bar(s), (ring / S::kStages) & 1);
            const u32 a_tile = smem_addr(smem.a_tile(s));
            const u32 b_tile = smem_addr(smem.b_tile(s));
            wgmma_fence_operands(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kKSteps; ++kk) {
                // The first k-step of a tile overwrites the accumulators (no zeroing pass).
                Mma::mma(acc, desc_a(a_tile, consumer, kk), desc_b(b_tile, kk), (kb | kk) != 0);
            }
            wgmma_commit_group();
            wgmma_wait_group<1>();
            wgmma_fence_operands(acc);
            // Only the group of the previous k-block is known complete: release its stage.
            if (leader && prev_stage >= 0) release_stage(smem, prev_stage);
            prev_stage = s;
        }
        wgmma_wait_group<0>();
        wgmma_fence_operands(acc);
        if (leader && prev_stage >= 0) release_stage(smem, prev_stage);
    }
};

}  // namespace hopmm

// Slot `producer`: one elected thread of the producer warpgroup streams A and B tiles into the
// stage ring with TMA. Stage s is reused only after both consumers released it (empty[s]).
#pragma once
#include "tile_config.cuh"

namespace hopmm {

template <class Cfg>
struct TmaProducer {
    typedef TileShape<Cfg> S;

    // `ring` counts k-blocks through the stage ring: stage = ring % kStages, and the parity of
    // that stage's current phase = (ring / kStages) & 1.
    __device__ __forceinline__ static void load_tile(const TensorMap* map_a, const TensorMap* map_b,
                                                     const SharedStorage<Cfg>& smem, int m0, int n0,
                                                     int za, int zb, int num_k_blocks, int& ring) {
        for (int kb = 0; kb < num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            const u32 phase = (ring / S::kStages) & 1;
            // A fresh barrier's "previous phase" (parity 1) counts as complete, so the first
            // pass over the ring does not wait.
            mbar_wait(smem.empty_bar(s), phase ^ 1);
            mbar_arrive_expect_tx(smem.full_bar(s), S::kStageBytes);
            const int k0 = kb * S::kBlockK;
            if (Cfg::kTransA) {  // A is M-major: boxes of 64 M x 64 K
#pragma unroll
                for (int i = 0; i < S::kBlockM / kTmaBoxElems; ++i)
                    tma_load_3d(smem.a_tile(s) + i * (S::kABytes / (S::kBlockM / kTmaBoxElems)),
                                map_a, smem.full_bar(s), m0 + i * kTmaBoxElems, k0, za);
            } else {  // A is K-major: one box of 64 K x kBlockM rows
                tma_load_3d(smem.a_tile(s), map_a, smem.full_bar(s), k0, m0, za);
            }
            if (Cfg::kTransB) {  // B is N-major: boxes of 64 N x 64 K
#pragma unroll
                for (int i = 0; i < S::kBlockN / kTmaBoxElems; ++i)
                    tma_load_3d(smem.b_tile(s) + i * (S::kBBytes / (S::kBlockN / kTmaBoxElems)),
                                map_b, smem.full_bar(s), n0 + i * kTmaBoxElems, k0, zb);
            } else {  // B is K-major: one box of 64 K x kBlockN rows
                tma_load_3d(smem.b_tile(s), map_b, smem.full_bar(s), k0, n0, zb);
            }
        }
    }
};

}  // namespace hopmm

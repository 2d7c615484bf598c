// Slot `producer`: one elected thread of the producer warpgroup streams A and B tiles into the
// stage ring with TMA. Stage s is reused only after every reader released it (empty[s], which
// counts TileShape::kEmptyArrivals: each consumer that reads the stage, in every CTA of a cluster).
#pragma once
#include "tile_config.cuh"

namespace hopmm {

template <class Cfg>
struct TmaProducer {
    typedef TileShape<Cfg> S;
    static constexpr u32 kMnBoxBytes = kTmaBoxElems * S::kBlockK * kElemBytes;

    // One operand's stage tile of ROWS (M or N) x kBlockK. MN-major: ROWS / 64 boxes of
    // 64 MN x 64 K, one after the other (the layout desc_mn_major reads); K-major: one box of
    // 64 K x ROWS.
    template <bool MN_MAJOR, int ROWS>
    __device__ __forceinline__ static void load_operand(unsigned char* tile, const TensorMap* map,
                                                        u64* bar, int row0, int k0, int z) {
        if (MN_MAJOR) {
#pragma unroll
            for (int i = 0; i < ROWS / kTmaBoxElems; ++i)
                tma_load_3d(tile + i * kMnBoxBytes, map, bar, row0 + i * kTmaBoxElems, k0, z);
        } else {
            tma_load_3d(tile, map, bar, k0, row0, z);
        }
    }

    // `ring` counts k-blocks through the stage ring: stage = ring % kStages, and the parity of
    // that stage's current phase = (ring / kStages) & 1. The tile's k-blocks are
    // first_k_block .. first_k_block + num_k_blocks - 1 (split-K loads a slice of K). A stage
    // of two B tiles (kBOperands = 2) loads the second from map_b2, at the same coordinates.
    __device__ __forceinline__ static void load_tile(const TensorMap* map_a, const TensorMap* map_b,
                                                     const SharedStorage<Cfg>& smem, int m0, int n0,
                                                     int za, int zb, int num_k_blocks, int& ring,
                                                     int first_k_block = 0,
                                                     const TensorMap* map_b2 = nullptr) {
        for (int kb = first_k_block; kb < first_k_block + num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            const u32 phase = (ring / S::kStages) & 1;
            // A fresh barrier's "previous phase" (parity 1) counts as complete, so the first
            // pass over the ring does not wait.
            mbar_wait(smem.empty_bar(s), phase ^ 1);
            mbar_arrive_expect_tx(smem.full_bar(s), S::kStageLoadBytes);
            const int k0 = kb * S::kBlockK;
            load_operand<Cfg::kTransA, S::kBlockM>(smem.a_tile(s), map_a, smem.full_bar(s), m0, k0, za);
            load_operand<Cfg::kTransB, S::kBlockN>(smem.b_tile(s), map_b, smem.full_bar(s), n0, k0, zb);
            if constexpr (S::kBOperands == 2)
                load_operand<Cfg::kTransB, S::kBlockN>(smem.b_tile(s, 1), map_b2, smem.full_bar(s),
                                                       n0, k0, zb);
        }
    }
};

}  // namespace hopmm

// Slot `producer`: one elected thread of the producer warpgroup streams A and B tiles into the
// stage ring with TMA. Stage s is reused only after every reader released it (empty[s], which
// counts TileShape::kEmptyArrivals: each consumer that reads the stage, in every CTA of a cluster).
#pragma once
#include "tile_config.cuh"

namespace hopmm {

template <class Cfg>
struct TmaProducer {
    typedef TileShape<Cfg> S;

    // The first `boxes` TMA boxes of one operand's stage tile, starting at row (M or N) row0:
    // MN-major, boxes of 64 MN x 64 K; K-major, boxes of 64 K x BOX_ROWS. Either way box i
    // lands i boxes into the tile (the layout desc_mn_major and desc_k_major read).
    template <bool MN_MAJOR, int BOX_ROWS, int MAX_BOXES>
    __device__ __forceinline__ static void load_boxes(unsigned char* tile, const TensorMap* map,
                                                      u64* bar, int row0, int k0, int z,
                                                      int boxes) {
        constexpr u32 kBoxBytes = BOX_ROWS * S::kBlockK * kElemBytes;
#pragma unroll
        for (int i = 0; i < MAX_BOXES; ++i) {
            if (i >= boxes) break;
            if (MN_MAJOR)
                tma_load_3d(tile + i * kBoxBytes, map, bar, row0 + i * BOX_ROWS, k0, z);
            else
                tma_load_3d(tile + i * kBoxBytes, map, bar, k0, row0 + i * BOX_ROWS, z);
        }
    }

    // One operand's whole stage tile of ROWS (M or N) x kBlockK, in 64-row boxes (the
    // multicast producer's A tiles).
    template <bool MN_MAJOR, int ROWS>
    __device__ __forceinline__ static void load_operand(unsigned char* tile, const TensorMap* map,
                                                        u64* bar, int row0, int k0, int z) {
        load_boxes<MN_MAJOR, kTmaBoxElems, ROWS / kTmaBoxElems>(tile, map, bar, row0, k0, z,
                                                                 ROWS / kTmaBoxElems);
    }

    // Boxes of `box_rows` of a tile of `tile_rows` that hold any of the `rows` the operand has
    // from the tile's first row on: the others would only be zero-filled, and TMA spends as
    // much time on zero-filled rows as on loaded ones (bench/NOTES.md v0.17). The rows of
    // those boxes keep whatever the stage held; a wgmma output row or column depends on its
    // own A row and B column only, so they make garbage only in rows or columns of C past M or
    // N, which no store writes.
    __device__ __forceinline__ static int boxes_holding(int rows, int tile_rows, int box_rows) {
        const int held = rows < tile_rows ? (rows > 0 ? rows : 0) : tile_rows;
        return (held + box_rows - 1) / box_rows;
    }

    // `ring` counts k-blocks through the stage ring: stage = ring % kStages, and the parity of
    // that stage's current phase = (ring / kStages) & 1. The tile's k-blocks are
    // first_k_block .. first_k_block + num_k_blocks - 1 (split-K loads a slice of K). A stage
    // of two B tiles (kBOperands = 2) loads the second from map_b2, at the same coordinates.
    // rows_a and rows_b: the rows of A and B (M and N) from m0 and n0 to the problem's edge.
    __device__ __forceinline__ static void load_tile(const TensorMap* map_a, const TensorMap* map_b,
                                                     const SharedStorage<Cfg>& smem, int m0, int n0,
                                                     int rows_a, int rows_b, int za, int zb,
                                                     int num_k_blocks, int& ring,
                                                     int first_k_block = 0,
                                                     const TensorMap* map_b2 = nullptr) {
        const int a_boxes = boxes_holding(rows_a, S::kARows, S::kABoxRows);
        const int b_boxes = boxes_holding(rows_b, S::kBlockN, kTmaBoxElems);
        const u32 stage_bytes = a_boxes * S::kABoxBytes + S::kBOperands * b_boxes * S::kBBoxBytes;
        for (int kb = first_k_block; kb < first_k_block + num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            const u32 phase = (ring / S::kStages) & 1;
            // A fresh barrier's "previous phase" (parity 1) counts as complete, so the first
            // pass over the ring does not wait.
            mbar_wait(smem.empty_bar(s), phase ^ 1);
            mbar_arrive_expect_tx(smem.full_bar(s), stage_bytes);
            const int k0 = kb * S::kBlockK;
            load_boxes<Cfg::kTransA, S::kABoxRows, S::kABoxes>(smem.a_tile(s), map_a,
                                                               smem.full_bar(s), m0, k0, za,
                                                               a_boxes);
            load_boxes<Cfg::kTransB, kTmaBoxElems, S::kBBoxes>(smem.b_tile(s), map_b,
                                                               smem.full_bar(s), n0, k0, zb,
                                                               b_boxes);
            if constexpr (S::kBOperands == 2)
                load_boxes<Cfg::kTransB, kTmaBoxElems, S::kBBoxes>(smem.b_tile(s, 1), map_b2,
                                                                   smem.full_bar(s), n0, k0, zb,
                                                                   b_boxes);
        }
    }
};

}  // namespace hopmm

// Slot `producer`: one elected thread of the producer warpgroup streams A and B tiles into the
// stage ring with TMA. Stage s is reused only after every reader released it (empty[s], which
// counts TileShape::kEmptyArrivals: each consumer that reads the stage, in every CTA of a cluster).
#pragma once
#include "tile_config.cuh"
#include "shifted_v4.cuh"

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

    // Elements between the 16-byte boundary phase map j starts on and row j of an operand of
    // row pitch `pitch_mod8` mod 8 elements (TileShape::kPhased; its base is on 16 bytes).
    __device__ __forceinline__ static constexpr int phase_lead(int j, int pitch_mod8) {
        return (j * pitch_mod8) % kPhases;
    }

    // A phased operand's raw stage (TileShape::kPhased): for each of the first `blocks` 64-row
    // blocks of its tile, one box of kPhaseRows rows of kRawRowElems per phase, at `raw` +
    // (block * kPhases + phase) boxes. A's blocks are 64 m rows of the K-block (map
    // coordinates: k0, the block's first row / 8); B's are the K-block's 64 k rows of 64
    // columns (n0 + 64 block, k0 / 8). Each box starts on its row's 16-byte boundary: the
    // phase's lead before the block.
    template <bool B_ROWS_ARE_K>
    __device__ __forceinline__ static void load_raw(unsigned char* raw, const TensorMap* maps,
                                                    u64* bar, int row0, int k0, int z,
                                                    int blocks) {
        constexpr int kMaxBlocks = B_ROWS_ARE_K ? S::kBRawBlocks : S::kARawBlocks;
#pragma unroll
        for (int b = 0; b < kMaxBlocks; ++b) {
            if (b >= blocks) break;
#pragma unroll
            for (int j = 0; j < kPhases; ++j) {
                unsigned char* box = raw + (b * kPhases + j) * S::kRawBoxBytes;
                if (B_ROWS_ARE_K)
                    tma_load_3d(box, maps + j, bar, row0 + b * kTmaBoxElems, k0 / kPhases, z);
                else
                    tma_load_3d(box, maps + j, bar, k0, (row0 + b * kTmaBoxElems) / kPhases, z);
            }
        }
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
        const u32 a_bytes = a_boxes * S::kABoxBytes;
        const u32 b_bytes = S::kBOperands * b_boxes * S::kBBoxBytes;
        // A phased operand's bytes land on the raw barrier, the others' on the full barrier.
        const u32 stage_bytes = (S::kPhasedA ? 0 : a_bytes) + (S::kPhasedB ? 0 : b_bytes);
        const u32 raw_bytes = ((S::kPhasedA ? a_boxes : 0) + (S::kPhasedB ? b_boxes : 0)) *
                              S::kRawBlockBytes;
        for (int kb = first_k_block; kb < first_k_block + num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            const u32 phase = (ring / S::kStages) & 1;
            // A fresh barrier's "previous phase" (parity 1) counts as complete, so the first
            // pass over the ring does not wait.
            mbar_wait(smem.empty_bar(s), phase ^ 1);
            mbar_arrive_expect_tx(smem.full_bar(s), stage_bytes);
            const int k0 = kb * S::kBlockK;
            if constexpr (S::kPhased) mbar_arrive_expect_tx(smem.raw_bar(s), raw_bytes);
            if constexpr (S::kPhasedA)
                load_raw<false>(smem.a_raw(s), map_a, smem.raw_bar(s), m0, k0, za, a_boxes);
            else
                load_boxes<Cfg::kTransA, S::kABoxRows, S::kABoxes>(smem.a_tile(s), map_a,
                                                                   smem.full_bar(s), m0, k0,
                                                                   za, a_boxes);
            if constexpr (S::kPhasedB)
                load_raw<true>(smem.b_raw(s), map_b, smem.raw_bar(s), n0, k0, zb, b_boxes);
            else
                load_boxes<Cfg::kTransB, kTmaBoxElems, S::kBBoxes>(smem.b_tile(s), map_b,
                                                                   smem.full_bar(s), n0, k0,
                                                                   zb, b_boxes);
            if constexpr (S::kBOperands == 2)
                load_boxes<Cfg::kTransB, kTmaBoxElems, S::kBBoxes>(smem.b_tile(s, 1), map_b2,
                                                                   smem.full_bar(s), n0, k0, zb,
                                                                   b_boxes);
        }
    }
};

// Whether producer-warpgroup thread `thread` shifts phased raw stages (the last
// kFixupThreads), and its index among them.
template <class Cfg>
__device__ __forceinline__ bool is_fixup_thread(int thread) {
    return thread >= kWarpgroupThreads - TileShape<Cfg>::kFixupThreads;
}
template <class Cfg>
__device__ __forceinline__ int fixup_index(int thread) {
    return thread - (kWarpgroupThreads - TileShape<Cfg>::kFixupThreads);
}

// The phased operands' shifting threads (TileShape::kFixupThreads of the producer
// warpgroup): for each k-block the producer loads, once its raw stage has landed, every row of
// each phased operand's raw buffer goes into the stage's tile: raw row q of phase j of block b
// is the tile's row 64 b + 8 q + j (A: an m row; B: a k row of its b-th 64 columns), its 64
// elements starting phase_lead(j) in. A 16-byte chunk of the tile takes the two aligned
// 16-byte vectors of the raw row around it, shifted down by the lead's bytes (shifted_v4),
// and lands at its 128-byte-swizzled place. Thread t takes chunk t % 8 of every row of phase
// t / 8, so its shift and its rows' swizzle are the same in every row (set once: no index
// arithmetic in the loop, NOTES v0.42), and each quarter-warp reads 144 contiguous bytes of
// one raw row and writes one 128-byte tile row (no bank conflicts). The writes are handed to
// the async proxy (wgmma) before each thread arrives on the stage's full barrier.
template <class Cfg>
struct PhasedFixup {
    typedef TileShape<Cfg> S;
    static constexpr int kChunksPerRow = kSwizzleBytes / 16;

    // Rows a fixup thread loads before it stores them: as many as its producer registers
    // hold (four spilled in some pitch classes).
    static constexpr int kBatch = 2;

    static_assert(S::kFixupThreads == kChunksPerRow * kPhases, "a thread per chunk and phase");
    static_assert(S::kPhaseRows % kBatch == 0, "whole batches of a block's rows");
    static_assert(S::kRawRowBytes % 16 == 0, "raw rows start on 16 bytes");

    // One operand's raw buffer `raw` of BLOCKS 64-row blocks into its tile, by fixup thread t.
    template <int BLOCKS, int PITCH_MOD8>
    __device__ __forceinline__ static void shift(u32 raw, u32 tile, int t) {
        const u32 chunk = t % kChunksPerRow, j = t / kChunksPerRow;
        const u32 lead = TmaProducer<Cfg>::phase_lead(j, PITCH_MOD8) * kElemBytes;
        // Raw row q of phase j of block b: box b * kPhases + j, row q. Its tile row 64 b + 8 q
        // + j: swizzle row (b * kPhaseRows + q), row j within it.
        const u32 src = raw + j * S::kRawBoxBytes + chunk * 16;
        const u32 dst = tile + j * kSwizzleBytes + ((chunk ^ j) * 16);
        // kBatch rows' loads are issued before their stores (a shared store is ordered
        // before every later load), so their latencies overlap.
#pragma unroll 1
        for (int r0 = 0; r0 < BLOCKS * S::kPhaseRows; r0 += kBatch) {   // r = b * 8 + q
            uint4 lo[kBatch], hi[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
                const int r = r0 + i;
                const u32 at = src + (r / S::kPhaseRows) * kPhases * S::kRawBoxBytes +
                               (r % S::kPhaseRows) * S::kRawRowBytes;
                lo[i] = ld_shared_v4(at);
                hi[i] = ld_shared_v4(at + 16);
            }
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
                const uint4 v = shifted_v4(lo[i], hi[i], lead);
                st_shared_v4(dst + (r0 + i) * (8 * kSwizzleBytes), v.x, v.y, v.z, v.w);
            }
        }
    }

    // Every k-block of the CTA's `k_blocks` (all its tiles'), in the producer's ring order.
    __device__ __forceinline__ static void run(const SharedStorage<Cfg>& smem, int t,
                                               int k_blocks) {
#pragma unroll 1
        for (int ring = 0; ring < k_blocks; ++ring) {
            const int s = ring % S::kStages;
            mbar_wait(smem.raw_bar(s), (ring / S::kStages) & 1);
            if constexpr (S::kPhasedA)
                shift<S::kARawBlocks, Cfg::kAPitchMod8>(smem_addr(smem.a_raw(s)),
                                                        smem_addr(smem.a_tile(s)), t);
            if constexpr (S::kPhasedB)
                shift<S::kBRawBlocks, Cfg::kBPitchMod8>(smem_addr(smem.b_raw(s)),
                                                        smem_addr(smem.b_tile(s)), t);
            fence_proxy_async_smem();
            mbar_arrive(smem.full_bar(s));
        }
    }
};

}  // namespace hopmm

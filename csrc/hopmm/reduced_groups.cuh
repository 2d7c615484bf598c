// The 8-row groups into which the split-K reductions spread over the splits
// (split_k_cluster_reduce.cuh, split_k_parallel_reduce.cuh) cut each consumer's 64 rows: split
// s reduces groups s, s + splits, ... and stages each as 16-bit rows in SWIZZLE_128B boxes of
// 64 columns x 8 rows (one 128-byte swizzle period, so a box of any group starts on the
// pattern), which one thread then TMA-stores (the C map's boxes are 64 columns x 8 rows).
#pragma once
#include "epilogue_tma_store.cuh"
#include "partial_f32.cuh"

namespace hopmm {

template <class Cfg>
struct ReducedGroups {
    typedef TileShape<Cfg> S;
    typedef PartialF32<Cfg> Partial;

    static constexpr int kRows = 8;
    static constexpr int kCount = S::kWgmmaM / kRows;  // of a consumer's 64 rows
    static constexpr int kBoxes = S::kBlockN / kTmaBoxElems;
    static constexpr u32 kBoxBytes = kRows * kSwizzleBytes;
    static constexpr u32 kBytes = kBoxes * kBoxBytes;
    // A group's 16-byte chunks of fp32 partial, dealt to a warpgroup's threads: thread t takes
    // chunks t, t + 128, ..., row by row.
    static constexpr int kChunks = kRows * Partial::kChunksPerRow;
    static_assert(kChunks % kWarpgroupThreads == 0, "a group's chunks deal out evenly");
    static constexpr int kChunksPerThread = kChunks / kWarpgroupThreads;

    // Chunk `j` of `thread`: its row in the group and its first column in the tile.
    __device__ __forceinline__ static int chunk_row(int thread, int j) {
        return (thread + j * kWarpgroupThreads) / Partial::kChunksPerRow;
    }
    __device__ __forceinline__ static int chunk_col(int thread, int j) {
        return ((thread + j * kWarpgroupThreads) % Partial::kChunksPerRow) * Partial::kChunkFloats;
    }

    // A chunk's four sums, the final values of row `row` (in the group staged at `out`) and
    // columns from `col` of the tile: the fused epilogue chain applied (the row `tile_row` of
    // C, columns from n0 + col, batch slice z), rounded to 16 bits, staged as half of a 16-byte
    // chunk of a 64-column box row.
    __device__ __forceinline__ static void stage(float4 sum, u32 out, int row, int col,
                                                 const EpilogueArgs& epilogue, int tile_row,
                                                 int n0, int z) {
        EpilogueChain<Cfg>::apply4(epilogue, sum, tile_row, n0 + col, z);
        const int box = col / kTmaBoxElems, in_box = col % kTmaBoxElems;
        constexpr int kElemsPerChunk = 16 / kElemBytes;
        const u32 addr = out + box * kBoxBytes + row * kSwizzleBytes +
                         (((in_box / kElemsPerChunk) ^ row) * 16) +
                         (in_box % kElemsPerChunk) * kElemBytes;
        st_shared_u32x2(addr, TmaStoreEpilogue<Cfg>::pack(sum.x, sum.y),
                        TmaStoreEpilogue<Cfg>::pack(sum.z, sum.w));
    }

    // One thread, after the warpgroup's fence and barrier: TMA-stores the `groups` groups
    // staged one after another from `out`, the i-th being group first + i * step of the rows
    // from row0, and commits them.
    __device__ __forceinline__ static void store(const TensorMap* map_c, const unsigned char* out,
                                                 int groups, int first, int step, int row0,
                                                 int n0, int z) {
        for (int i = 0; i < groups; ++i) {
            const int row = row0 + (first + i * step) * kRows;
#pragma unroll
            for (int box = 0; box < kBoxes; ++box)
                tma_store_3d(map_c, out + i * kBytes + box * kBoxBytes, n0 + box * kTmaBoxElems,
                             row, z);
        }
        bulk_commit_group();
    }
};

}  // namespace hopmm

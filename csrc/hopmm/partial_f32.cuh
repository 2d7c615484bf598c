// A consumer warpgroup's fp32 partial tile in shared memory: how split-K's epilogues stage
// the accumulators of one 64-row wgmma block so that another split (or the TMA reduce) can add
// them. The layout is that of SWIZZLE_128B boxes of 32 floats (one 128-byte swizzle row) by 64
// rows, kBlockN / 32 boxes side by side: the 16-byte chunk q of row r of a box sits at chunk
// q ^ (r % 8), so the eight rows one 64-bit store instruction writes spread over all banks (two
// wavefronts, the minimum for 256 bytes), and a TMA map with boxes of 32 floats x 64 rows reads
// or writes a box as it lies.
#pragma once
#include "tile_config.cuh"

namespace hopmm {

__device__ __forceinline__ void st_shared_f32x2(u32 addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ void st_shared_u32x2(u32 addr, u32 x, u32 y) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(x), "r"(y) : "memory");
}

template <class Cfg>
struct PartialF32 {
    typedef TileShape<Cfg> S;
    static constexpr int kChunkFloats = 4;  // one 16-byte chunk
    static constexpr int kChunksPerRow = S::kBlockN / kChunkFloats;

    // Accumulator register i of thread t holds row 16*(t/32) + (t%32)/4 + 8*((i/2)%2), column
    // 8*(i/4) + 2*(t%4) + i%2; pairs (i, i+1), i even, are adjacent columns.
    __device__ __forceinline__ static int acc_row(int thread, int i) {
        return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((i / 2) % 2);
    }
    __device__ __forceinline__ static int acc_col(int thread, int i) {
        return 8 * (i / 4) + 2 * (thread % 4);
    }

    // Byte offset of the float at (row, col) of the partial.
    __device__ __forceinline__ static u32 offset(int row, int col) {
        const int box = col / S::kF32BoxElems, in_box = col % S::kF32BoxElems;
        return box * S::kF32BoxBytes + row * kSwizzleBytes +
               (((in_box / kChunkFloats) ^ (row % 8)) * 16) + (in_box % kChunkFloats) * 4;
    }

    // The warpgroup's 64 x kBlockN accumulators into the partial at shared address `tile`.
    template <int NREG>
    __device__ __forceinline__ static void stage(const float (&acc)[NREG], u32 tile,
                                                 int thread) {
#pragma unroll
        for (int i = 0; i < NREG; i += 2)
            st_shared_f32x2(tile + offset(acc_row(thread, i), acc_col(thread, i)), acc[i],
                            acc[i + 1]);
    }
};

}  // namespace hopmm

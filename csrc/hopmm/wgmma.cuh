// wgmma (PTX ISA 9.7.15): shared-memory matrix descriptors for 128-byte-swizzled operand
// tiles, and the warpgroup-wide fence / commit / wait / mma_async wrappers.
//
// Operand tiles in shared memory are written by TMA with CU_TENSOR_MAP_SWIZZLE_128B, so each
// 128-byte row holds 64 16-bit elements and the 16-byte chunks of row r are XOR-ed with r % 8.
// Two tile shapes occur (BK = 64, one swizzle atom of K):
//  * K-major (K contiguous in global memory): rows along M (or N), each row = 64 k-values.
//    Canonical layout ((8,m),(T,2k)):((8T,SBO),(1,T)): SBO = 8 rows * 128 B = 1024 B, LBO is
//    unused. Stepping k by 16 advances the start address by 32 bytes inside the atom.
//  * MN-major (M or N contiguous): boxes of 64 MN-values x 64 k-rows (8 KiB each).
//    Canonical layout ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): LBO = stride between 64-wide MN
//    boxes (8 KiB), SBO = 8 k-rows * 128 B = 1024 B. Stepping k by 16 advances 16 rows = 2 KiB.
// All tiles start on 1024-byte boundaries, so the descriptor's base offset is 0.
#pragma once
#include "ptx.cuh"

namespace hopmm {

constexpr int kWarpgroupThreads = 128;  // the four warps that issue one wgmma together
// Bytes per swizzled row (64 16-bit elements), and the K extent of one wgmma instruction.
constexpr int kSwizzleBytes = 128;
constexpr int kWgmmaK = 16;
constexpr u32 kSwizzleAtomBytes = 8 * kSwizzleBytes;        // 8 rows: the XOR pattern period
constexpr u64 kDescSwizzle128B = 1ull << 62;

__device__ __forceinline__ u64 desc_encode(u32 x) { return static_cast<u64>((x & 0x3FFFF) >> 4); }

__device__ __forceinline__ u64 make_smem_desc(u32 start, u32 leading_bytes, u32 stride_bytes) {
    return desc_encode(start) | (desc_encode(leading_bytes) << 16) |
           (desc_encode(stride_bytes) << 32) | kDescSwizzle128B;
}

// Descriptor of a K-major tile: `row0` is the first M/N row used, `kk` the k16 step (0..3).
__device__ __forceinline__ u64 desc_k_major(u32 tile, int row0, int kk) {
    const u32 unused_lbo = 16;
    return make_smem_desc(tile + row0 * kSwizzleBytes + kk * kWgmmaK * 2, unused_lbo,
                          kSwizzleAtomBytes);
}

// Descriptor of an MN-major tile made of 64-wide boxes of `box_rows` k-rows each; `box0` is
// the first box used.
template <int BOX_ROWS>
__device__ __forceinline__ u64 desc_mn_major(u32 tile, int box0, int kk) {
    constexpr u32 box_bytes = BOX_ROWS * kSwizzleBytes;
    return make_smem_desc(tile + box0 * box_bytes + kk * kWgmmaK * kSwizzleBytes, box_bytes,
                          kSwizzleAtomBytes);
}

// Orders earlier register writes (accumulators) before the next mma_async reads them.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit_group() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most N committed wgmma groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int NREG>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[NREG]) {
#pragma unroll
    for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for accumulators of several m64 row blocks.
template <int ROW_BLOCKS, int NREG>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[ROW_BLOCKS][NREG]) {
#pragma unroll
    for (int r = 0; r < ROW_BLOCKS; ++r) wgmma_fence_operands(d[r]);
}

// Operand lists of the mma_async asm statements: the accumulators %0..%(N/2 - 1) first,
// then the two descriptors, scale-d and the two transpose immediates. Each list extends
// the one for the next smaller N.
#define HOPMM_WGMMA_REGS_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HOPMM_WGMMA_OPERANDS_64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define HOPMM_WGMMA_ARGS_64 "%32, %33, p, 1, 1, %35, %36;"
#define HOPMM_WGMMA_SCALE_D_64 "setp.ne.b32 p, %34, 0;"

#define HOPMM_WGMMA_REGS_128 \
    HOPMM_WGMMA_REGS_64 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define HOPMM_WGMMA_OPERANDS_128 \
    HOPMM_WGMMA_OPERANDS_64, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define HOPMM_WGMMA_ARGS_128 "%64, %65, p, 1, 1, %67, %68;"
#define HOPMM_WGMMA_SCALE_D_128 "setp.ne.b32 p, %66, 0;"

// 160: two 64-wide boxes of B and half of a third (tile_config.cuh, kBBoxes).
#define HOPMM_WGMMA_REGS_160 \
    HOPMM_WGMMA_REGS_128 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define HOPMM_WGMMA_OPERANDS_160 \
    HOPMM_WGMMA_OPERANDS_128, \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define HOPMM_WGMMA_ARGS_160 "%80, %81, p, 1, 1, %83, %84;"
#define HOPMM_WGMMA_SCALE_D_160 "setp.ne.b32 p, %82, 0;"

#define HOPMM_WGMMA_REGS_192 \
    HOPMM_WGMMA_REGS_128 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" ", " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define HOPMM_WGMMA_OPERANDS_192 \
    HOPMM_WGMMA_OPERANDS_128, \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define HOPMM_WGMMA_ARGS_192 "%96, %97, p, 1, 1, %99, %100;"
#define HOPMM_WGMMA_SCALE_D_192 "setp.ne.b32 p, %98, 0;"

#define HOPMM_WGMMA_REGS_256 \
    HOPMM_WGMMA_REGS_192 ", " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" ", " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define HOPMM_WGMMA_OPERANDS_256 \
    HOPMM_WGMMA_OPERANDS_192, \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define HOPMM_WGMMA_ARGS_256 "%128, %129, p, 1, 1, %131, %132;"
#define HOPMM_WGMMA_SCALE_D_256 "setp.ne.b32 p, %130, 0;"

// D(64 x N, f32) (+)= A(64 x 16) * B(16 x N); A and B from shared memory through descriptors.
// TRANS_A / TRANS_B: 0 = K-major, 1 = MN-major. scale_d = 0 overwrites D, 1 accumulates.
template <int N, bool BF16, int TRANS_A, int TRANS_B>
struct Wgmma;

#define HOPMM_DEFINE_WGMMA(N, IS_BF16, TYPE)                                                   \
    template <int TRANS_A, int TRANS_B>                                                        \
    struct Wgmma<N, IS_BF16, TRANS_A, TRANS_B> {                                               \
        static constexpr int kAccRegs = N / 2;                                                 \
        __device__ __forceinline__ static void mma(float (&d)[N / 2], u64 desc_a, u64 desc_b,  \
                                                   int scale_d) {                              \
            asm volatile("{\n.reg .pred p;\n" HOPMM_WGMMA_SCALE_D_##N "\n"                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " "    \
                         "{" HOPMM_WGMMA_REGS_##N "}, " HOPMM_WGMMA_ARGS_##N "\n}\n"                     \
                         : HOPMM_WGMMA_OPERANDS_##N                                            \
                         : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B)); \
        }                                                                                      \
    };

HOPMM_DEFINE_WGMMA(64, true, "bf16")
HOPMM_DEFINE_WGMMA(64, false, "f16")
HOPMM_DEFINE_WGMMA(128, true, "bf16")
HOPMM_DEFINE_WGMMA(128, false, "f16")
HOPMM_DEFINE_WGMMA(160, true, "bf16")
HOPMM_DEFINE_WGMMA(160, false, "f16")
HOPMM_DEFINE_WGMMA(192, true, "bf16")
HOPMM_DEFINE_WGMMA(192, false, "f16")
HOPMM_DEFINE_WGMMA(256, true, "bf16")
HOPMM_DEFINE_WGMMA(256, false, "f16")

#undef HOPMM_DEFINE_WGMMA

}  // namespace hopmm

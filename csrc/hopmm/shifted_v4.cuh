// Sixteen bytes that do not start on a 16-byte boundary, from the two aligned vectors around
// them: gemv's loads of rows read where they lie (kernel_gemv.cuh) and the phased A's shift
// of its raw rows into the A tile (producer_tma.cuh).
#pragma once
#include "ptx.cuh"

namespace hopmm {

// Eight 16-bit elements starting `shift` bytes (even, below 16) into `lo`, the rest from `hi`,
// shifted into one by selects and byte permutes (no dynamic register index, so no local
// memory).
__device__ __forceinline__ uint4 shifted_v4(const uint4& lo, const uint4& hi, u32 shift) {
    const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};   // both vectors' words
    u32 by8[6], by4[5];   // shifted by 8 bytes where shift has 8, then by 4 where it has 4
#pragma unroll
    for (int i = 0; i < 6; ++i) by8[i] = shift & 8u ? w[i + 2] : w[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) by4[i] = shift & 4u ? by8[i + 1] : by8[i];
    // The last 2 bytes: the high half of one word and the low half of the next.
    const u32 select = shift & 2u ? 0x5432u : 0x3210u;
    u32 out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out[j]) : "r"(by4[j]), "r"(by4[j + 1]), "r"(select));
    return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace hopmm

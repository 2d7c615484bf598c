// gemv: C[z] (m x n) = A[z] (m x k) @ B[z] (k x n) for outputs of very few rows (decode), as
// one memory stream: every byte of B is read once, with wide non-temporal loads, and used for
// all rows of A at once: CUDA-core FMAs, or from 8 rows mma.sync (below), never TMA or wgmma.
// A (a few rows) is read through L1.
//
// Work: CTA (blockIdx.x) = one column block of kBlockN columns and one group of kMaxRows rows;
// blockIdx.y = one of S = gridDim.y slices of K; blockIdx.z = batch slice. Two inner loops, by
// B's layout:
//  - K-major B (B^T rows contiguous: a torch Linear weight (N, K) passed as w.T): warp w owns
//    kCols columns; its lanes stride over each column's K slice in 16-byte vectors (8
//    elements), kUnroll vectors per column in flight, and add their partial dot products up
//    with an xor butterfly of shuffles (a fixed order).
//  - N-major B (rows of B contiguous): lane l owns 8 adjacent columns (one vector per row of
//    B); the warps of a CTA take turns of kUnroll rows of the K slice, kUnroll vectors in
//    flight per lane, and add their partials up in warp order through shared memory.
// Loads in flight: threads x kUnroll (x kCols) x 16 B per CTA; Little's law on an H100 asks
// for about 3 TB/s x 1 us / 132 SMs ~ 24 KB per SM (the configs hold 32 KB or more per CTA).
//
// FMA bound: each 2-byte element of B costs M fp32 FMAs (plus one conversion), so at 3 TB/s
// the kernel issues 1.5e12 x M FMAs/s = 3 M TFLOP/s of fp32 work: M = 8 needs 24 TFLOP/s, M = 16
// 48 of the ~67 TFLOP/s an H100 SXM's CUDA cores give (132 SMs x 128 FMA/clk x 2 x 1.98 GHz).
// Rows past 16 come in further row groups (grid x), each reading B again (from L2 where they
// run together, see below). Problems of few
// columns and many rows run transposed (C^T = B^T A^T, Config::kTransC: C stored transposed).
//
// Tensor cores (Config::kMma, 8 or 16 rows): the inner loops issue warp-wide
// mma.m16n8k16 (fp32 accumulators) on registers straight from the 16-byte loads, so the FMA
// bound above goes and the loop is bound by B's stream:
//  - K-major B: C^T = B^T A^T, a warp's 16 columns as the mma's rows and C's rows as its 8
//    columns (two mmas of n8 for 16 rows); a warp per 16 columns, kUnroll chunks in flight.
//  - N-major B: C = A B, C's 16 rows as the mma's rows; a warp covers the CTA's 64 columns as
//    eight n8 mmas (lane group g's vector of columns 8g .. 8g + 7 gives mma e column 8g + e),
//    the warps take turns of kUnroll chunks along K and add up in warp order (as above).
// Both read K in chunks of 32 elements, and permute k inside a chunk so that every lane's
// operand registers are halves of its own 16-byte loads: the mma's k slots (2q, 2q + 1) and
// (2q + 8, 2q + 9) of lane quad q hold the chunk's elements 8q + 4h + (0, 1) and
// 8q + 4h + (2, 3) in mma half h. Both operands use one permutation: the sums are the same.
//
// Rows in place (Config::kInPlace): where an operand's rows do not start on 16 bytes (an odd
// pitch or offset), its 16-byte vectors are read as the aligned vector that holds their first
// element and the one after it, shifted together (ld_any_v4), instead of from an aligned copy.
// Only aligned vectors that hold an element the loop uses are read: none leaves the operand's
// allocation, whatever lies past its last row.
//
// Row groups: the row groups of one column block are adjacent in blockIdx.x, so the CTAs that
// read the same columns of B run together and the later ones find them in L2.
//
// Split K (S > 1): each CTA writes its kMaxRows x kBlockN fp32 partial to its own slot of the
// scratch buffer and arrives on its tile's counter (acq_rel); the last of the S to arrive adds
// the S partials up in split order (((p0 + p1) + p2) + ...) and stores the result, then resets
// the counter to 0. The sums are independent of arrival order: bitwise repeatable. No CTA
// waits on another, so the grid may hold any number of CTAs.
#pragma once
#include "ptx.cuh"
#include "tile_config.cuh"
#include "shifted_v4.cuh"

namespace hopmm {

// Elements of one 16-byte vector of 16-bit values.
constexpr int kGemvVec = 8;
constexpr int kWarpLanes = 32;

struct GemvArgs {
    const unsigned short* a;
    const unsigned short* b;
    unsigned short* c;
    u32* scratch;   // counters, then partials (split K only; null otherwise)
    int m, n, k, batch_offset;
    BatchMap a_batch, b_batch;
    int a_ld;       // A's stride (elements) along its non-contiguous axis
    int b_ld;       // B's stride (elements) along its non-contiguous axis
    int c_ld;       // C's row stride (elements)
    int a_batch16, b_batch16, c_batch16;  // batch strides in 16-byte units
};

// ---- loads and conversions ---------------------------------------------------------------

// A 16-byte vector of B, streamed: read-only path, no L1 allocation (B is read exactly once),
// and a 256-byte L2 prefetch, since neighbouring lanes take the rest of the line pair.
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// v with its elements from `valid` on zeroed (0 <= valid <= 8).
__device__ __forceinline__ uint4 keep_first(const uint4& v, int valid) {
    u32 w[kGemvVec / 2] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < kGemvVec / 2; ++j)
        w[j] &= (2 * j < valid ? 0x0000ffffu : 0u) | (2 * j + 1 < valid ? 0xffff0000u : 0u);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A 16-byte vector of A, kept in L1: every warp of the SM reads the same rows of A.
__device__ __forceinline__ uint4 ld_cached_v4(const void* p) {
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned short ld_cached_u16(const unsigned short* p) {
    unsigned short v;
    asm("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// A 16-byte vector at an aligned p: streamed (B, read once: no L1 line) or through L1 (A).
template <bool kStream>
__device__ __forceinline__ uint4 ld_aligned_v4(const void* p) {
    if constexpr (kStream) return ld_stream_v4(p);
    else return ld_cached_v4(p);
}

// Eight 16-bit elements from p, which need only be 2-byte aligned: the aligned vector holding
// the first and, where p is not aligned and the first `valid` elements reach past it, the next
// aligned vector, shifted into one (shifted_v4). Elements from `valid` on are undefined;
// valid >= 1.
template <bool kStream>
__device__ __forceinline__ uint4 ld_any_v4(const unsigned short* p, int valid) {
    const unsigned long long at = reinterpret_cast<unsigned long long>(p);
    const u32 shift = static_cast<u32>(at) & 15u;   // bytes, even
    const uint4* lo_at = reinterpret_cast<const uint4*>(at - shift);
    const uint4 lo = ld_aligned_v4<kStream>(lo_at);
    const uint4 hi =
        shift + 2u * valid > 16u ? ld_aligned_v4<kStream>(lo_at + 1) : make_uint4(0, 0, 0, 0);
    return shifted_v4(lo, hi, shift);
}

// A vector of a row at p whose first `valid` elements are used: an aligned load, or, where
// the kernel reads rows where they lie (Config::kInPlace), one from anywhere.
template <class Config, bool kStream>
__device__ __forceinline__ uint4 ld_row_v4(const unsigned short* p, int valid = kGemvVec) {
    if constexpr (Config::kInPlace) return ld_any_v4<kStream>(p, valid);
    else return ld_aligned_v4<kStream>(p);
}

template <bool kBf16>
__device__ __forceinline__ float to_f32(unsigned short h) {
    if constexpr (kBf16) {
        return __uint_as_float(static_cast<u32>(h) << 16);
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
}

// The two 16-bit floats of a 32-bit word, low element first.
template <bool kBf16>
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
    if constexpr (kBf16) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        lo = to_f32<false>(static_cast<unsigned short>(w & 0xffffu));
        hi = to_f32<false>(static_cast<unsigned short>(w >> 16));
    }
}

template <bool kBf16>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[kGemvVec]) {
    unpack2<kBf16>(v.x, f[0], f[1]);
    unpack2<kBf16>(v.y, f[2], f[3]);
    unpack2<kBf16>(v.z, f[4], f[5]);
    unpack2<kBf16>(v.w, f[6], f[7]);
}

template <bool kBf16>
__device__ __forceinline__ unsigned short to_16bit(float f) {
    const u32 packed = kBf16 ? pack_bf16x2(f, 0.0f) : pack_f16x2(f, 0.0f);
    return static_cast<unsigned short>(packed & 0xffffu);
}

// ---- A, read through L1 ------------------------------------------------------------------

// A's rows of one CTA (row group), in fp32.
template <class Config>
struct GemvA {
    const unsigned short* base;  // A[z][m0][0]
    int ld;
    int rows;                    // rows of this group that exist (<= kMaxRows)

    __device__ __forceinline__ float at(int r, int k) const {
        const long long off = Config::kAKMajor ? static_cast<long long>(r) * ld + k
                                               : static_cast<long long>(k) * ld + r;
        return r < rows ? to_f32<Config::kBf16>(ld_cached_u16(base + off)) : 0.0f;
    }

    // A[r][k .. k + 8), still 16-bit (a quarter of the registers of fp32); k a multiple of 8
    // with k + 8 <= K.
    __device__ __forceinline__ uint4 packed8(int r, int k) const {
        if (r >= rows) return make_uint4(0, 0, 0, 0);
        if constexpr (Config::kAKMajor) {
            return ld_row_v4<Config, false>(base + static_cast<long long>(r) * ld + k, kGemvVec);
        } else {
            u32 w[kGemvVec / 2];
#pragma unroll
            for (int j = 0; j < kGemvVec / 2; ++j) {
                const long long off = static_cast<long long>(k + 2 * j) * ld + r;
                w[j] = ld_cached_u16(base + off) | static_cast<u32>(ld_cached_u16(base + off + ld)) << 16;
            }
            return make_uint4(w[0], w[1], w[2], w[3]);
        }
    }

    // packed8 with the elements at or past k_end zero (k a multiple of 8).
    __device__ __forceinline__ uint4 packed8_upto(int r, int k, int k_end) const {
        if (k + kGemvVec <= k_end) return packed8(r, k);
        if (r >= rows || k >= k_end) return make_uint4(0, 0, 0, 0);
        if constexpr (Config::kAKMajor) {
            // The whole vector lies in the row (its pitch holds whole vectors); the elements
            // past k_end are masked, not loaded one by one.
            const unsigned short* row = base + static_cast<long long>(r) * ld;
            return keep_first(ld_row_v4<Config, false>(row + k, k_end - k), k_end - k);
        } else {
            u32 w[kGemvVec / 2];
#pragma unroll
            for (int j = 0; j < kGemvVec / 2; ++j) {
                const long long off = static_cast<long long>(k + 2 * j) * ld + r;
                const u32 lo = k + 2 * j < k_end ? ld_cached_u16(base + off) : 0u;
                const u32 hi = k + 2 * j + 1 < k_end ? ld_cached_u16(base + off + ld) : 0u;
                w[j] = lo | hi << 16;
            }
            return make_uint4(w[0], w[1], w[2], w[3]);
        }
    }

    __device__ __forceinline__ void vec8(int r, int k, float (&f)[kGemvVec]) const {
        unpack8<Config::kBf16>(packed8(r, k), f);
    }
};

// Element j of a vector of eight 16-bit floats, in fp32.
template <bool kBf16>
__device__ __forceinline__ float element(const uint4& v, int j) {
    const u32 w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    float lo, hi;
    unpack2<kBf16>(w, lo, hi);
    return j % 2 ? hi : lo;
}

// ---- tensor-core helpers (Config::kMma) --------------------------------------------------

constexpr int kMmaChunk = 32;        // elements of K per chunk: a quad of lanes x 8
constexpr int kMmaRows = 16;         // the m of mma.m16n8k16
constexpr int kMmaCols = 8;          // its n
constexpr int kMmaNMajorCols = kMmaCols * kGemvVec;   // N-major: eight n8 mmas per warp

// d += a (16 x 16, row) x b (16 x 8, col), fp32 accumulators; the registers as PTX lays out
// mma.m16n8k16's fragments.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                          u32 b0, u32 b1) {
    if constexpr (kBf16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// Word j of a vector.
__device__ __forceinline__ u32 word(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The 16-bit elements `e` of two vectors as one word: lo's in the low half.
__device__ __forceinline__ u32 pair(const uint4& lo, const uint4& hi, int e) {
    u32 d;
    const u32 select = e % 2 ? 0x7632u : 0x5410u;   // high or low halves of both words
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(word(lo, e / 2)), "r"(word(hi, e / 2)),
        "r"(select));
    return d;
}

// [start, end) of split `s` of `total` elements in S splits of whole `granule`s.
__device__ __forceinline__ void split_range(int total, int granule, int s, int S, int& start,
                                            int& end) {
    const int units = (total + granule - 1) / granule;
    const int per = (units + S - 1) / S;
    start = min(total, s * per * granule);
    end = min(total, (s + 1) * per * granule);
}

// ---- K-major B: a warp per kCols columns, lanes along K -----------------------------------

template <class Config>
__device__ __forceinline__ void gemv_k_major(const GemvArgs& args, const GemvA<Config>& a,
                                             const unsigned short* b, int col0, int k_lo,
                                             int k_hi, float* tile) {
    constexpr int R = Config::kCols, U = Config::kUnroll, M = Config::kMaxRows;
    const int warp = threadIdx.x / kWarpLanes, lane = threadIdx.x % kWarpLanes;
    const unsigned short* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        // Columns past N read column N - 1 (valid memory); they are never stored.
        const int n = min(col0 + warp * R + r, args.n - 1);
        rows[r] = b + static_cast<long long>(n) * args.b_ld;
    }
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;

    // Vectors [v_lo, v_full) lie wholly inside the slice (k_lo is a multiple of 8).
    const int v_lo = k_lo / kGemvVec, v_full = k_hi / kGemvVec;
    auto fma_vector = [&](const uint4 (&bv)[R], int v) {
        float bf[R][kGemvVec];
#pragma unroll
        for (int r = 0; r < R; ++r) unpack8<Config::kBf16>(bv[r], bf[r]);
#pragma unroll
        for (int i = 0; i < M; ++i) {
            float af[kGemvVec];
            a.vec8(i, v * kGemvVec, af);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < kGemvVec; ++j) acc[r][i] = fmaf(bf[r][j], af[j], acc[r][i]);
        }
    };
    int v = v_lo;
    for (; v + U * kWarpLanes <= v_full; v += U * kWarpLanes) {
        uint4 bv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r)
                bv[u][r] =
                    ld_row_v4<Config, true>(rows[r] + (v + u * kWarpLanes + lane) * kGemvVec);
#pragma unroll
        for (int u = 0; u < U; ++u) fma_vector(bv[u], v + u * kWarpLanes + lane);
    }
    for (int w = v + lane; w < v_full; w += kWarpLanes) {
        uint4 bv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) bv[r] = ld_row_v4<Config, true>(rows[r] + w * kGemvVec);
        fma_vector(bv, w);
    }
    // The last split's elements past the last whole vector (K not a multiple of 8): one lane.
    // (A split past the end has k_lo = k_hi = K, beyond v_full's vector start: nothing.)
    if (lane == 0) {
        for (int k = max(v_full * kGemvVec, k_lo); k < k_hi; ++k) {
#pragma unroll
            for (int i = 0; i < M; ++i) {
                const float ak = a.at(i, k);
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[r][i] = fmaf(to_f32<Config::kBf16>(ld_cached_u16(rows[r] + k)), ak,
                                     acc[r][i]);
            }
        }
    }
    // Butterfly: every lane ends with the sum of all 32, added in the same order every run.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) {
#pragma unroll
            for (int d = kWarpLanes / 2; d > 0; d /= 2)
                acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], d);
            if ((r * M + i) % kWarpLanes == lane) tile[i * Config::kBlockN + warp * R + r] = acc[r][i];
        }
}

// ---- N-major B: a lane per 8 columns, warps along K ---------------------------------------

template <class Config>
__device__ __forceinline__ void gemv_n_major(const GemvArgs& args, const GemvA<Config>& a,
                                             const unsigned short* b, int col0, int k_lo,
                                             int k_hi, float* tile) {
    constexpr int U = Config::kUnroll, M = Config::kMaxRows, W = Config::kWarps;
    static_assert(U % kGemvVec == 0, "turns of whole 8-row groups: A is read in vectors");
    const int warp = threadIdx.x / kWarpLanes, lane = threadIdx.x % kWarpLanes;
    // Columns past N read the last vector that starts inside the row; never stored.
    const int n0 = min(col0 + lane * kGemvVec, (args.n - 1) / kGemvVec * kGemvVec);
    const unsigned short* col = b + n0;
    const int valid = min(kGemvVec, args.n - n0);   // columns of the vector that exist
    float acc[M][kGemvVec];
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < kGemvVec; ++j) acc[i][j] = 0.0f;

    auto fma_row = [&](const uint4& bv, const float (&ak)[M]) {
        float bf[kGemvVec];
        unpack8<Config::kBf16>(bv, bf);
#pragma unroll
        for (int i = 0; i < M; ++i)
#pragma unroll
            for (int j = 0; j < kGemvVec; ++j) acc[i][j] = fmaf(bf[j], ak[i], acc[i][j]);
    };
    // Turns of U rows: warp w takes rows [k_lo + (t W + w) U, + U) of turn t.
    int k = k_lo + warp * U;
    for (; k + U <= k_hi; k += W * U) {
        uint4 bv[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            bv[u] = ld_row_v4<Config, true>(col + static_cast<long long>(k + u) * args.b_ld, valid);
#pragma unroll
        for (int g = 0; g < U; g += kGemvVec) {
            uint4 ap[M];  // A[i][k + g .. + 8), unpacked one element at a time
#pragma unroll
            for (int i = 0; i < M; ++i) ap[i] = a.packed8(i, k + g);
#pragma unroll
            for (int j = 0; j < kGemvVec; ++j) {
                float ak[M];
#pragma unroll
                for (int i = 0; i < M; ++i) ak[i] = element<Config::kBf16>(ap[i], j);
                fma_row(bv[g + j], ak);
            }
        }
    }
    // The rows of the slice's last partial turn: this warp's, one at a time.
    for (int kk = k; kk < min(k + U, k_hi); ++kk) {
        float ak[M];
#pragma unroll
        for (int i = 0; i < M; ++i) ak[i] = a.at(i, kk);
        fma_row(ld_row_v4<Config, true>(col + static_cast<long long>(kk) * args.b_ld, valid), ak);
    }
    // Warps add their partials into the tile in warp order.
    for (int w = 0; w < W; ++w) {
        if (warp == w) {
#pragma unroll
            for (int i = 0; i < M; ++i)
#pragma unroll
                for (int j = 0; j < kGemvVec; ++j) {
                    float* t = tile + i * Config::kBlockN + lane * kGemvVec + j;
                    *t = w == 0 ? acc[i][j] : *t + acc[i][j];
                }
        }
        __syncthreads();
    }
}

// ---- K-major B on tensor cores: C^T = B^T A^T, a warp per 16 columns ----------------------

template <class Config>
__device__ __forceinline__ void gemv_k_major_mma(const GemvArgs& args, const GemvA<Config>& a,
                                                 const unsigned short* b, int col0, int k_lo,
                                                 int k_hi, float* tile) {
    constexpr int U = Config::kUnroll, T = Config::kMaxRows / kMmaCols;  // n8 mmas: C's rows
    static_assert(Config::kBlockN == Config::kWarps * kMmaRows, "a warp per 16 columns");
    const int warp = threadIdx.x / kWarpLanes, lane = threadIdx.x % kWarpLanes;
    const int g = lane / 4, q = lane % 4;
    // The lane's two rows of B^T: the warp's columns g and g + 8 (past N: column N - 1,
    // valid memory, never stored), from its quad's 8 elements of each chunk.
    const int col = warp * kMmaRows + g;
    auto b_row = [&](int c) {
        return b + static_cast<long long>(min(col0 + c, args.n - 1)) * args.b_ld + q * kGemvVec;
    };
    const unsigned short* w_lo = b_row(col);
    const unsigned short* w_hi = b_row(col + kMmaCols);
    float acc[T][4];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[t][j] = 0.0f;

    // One chunk: the lane's rows of B^T (w_lo, w_hi) and of A (row 8t + g of the group).
    auto chunk = [&](const uint4& wl, const uint4& wh, const uint4 (&av)[T]) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            mma_16816<Config::kBf16>(acc[t], wl.x, wh.x, wl.y, wh.y, av[t].x, av[t].y);
            mma_16816<Config::kBf16>(acc[t], wl.z, wh.z, wl.w, wh.w, av[t].z, av[t].w);
        }
    };
    int kc = k_lo;   // a multiple of kMmaChunk (the split granule)
    for (; kc + U * kMmaChunk <= k_hi; kc += U * kMmaChunk) {
        uint4 wl[U], wh[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            wl[u] = ld_row_v4<Config, true>(w_lo + kc + u * kMmaChunk);
            wh[u] = ld_row_v4<Config, true>(w_hi + kc + u * kMmaChunk);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            uint4 av[T];
#pragma unroll
            for (int t = 0; t < T; ++t)
                av[t] = a.packed8(t * kMmaCols + g, kc + u * kMmaChunk + q * kGemvVec);
            chunk(wl[u], wh[u], av);
        }
    }
    // The slice's last chunks, one at a time; elements past its end are zero (a vector that
    // starts inside K lies in the row, whose pitch holds whole vectors; it is masked).
    for (; kc < k_hi; kc += kMmaChunk) {
        const int k = kc + q * kGemvVec, valid = max(0, min(kGemvVec, k_hi - k));
        const uint4 none = make_uint4(0, 0, 0, 0);
        const uint4 wl =
            valid > 0 ? keep_first(ld_row_v4<Config, true>(w_lo + kc, valid), valid) : none;
        const uint4 wh =
            valid > 0 ? keep_first(ld_row_v4<Config, true>(w_hi + kc, valid), valid) : none;
        uint4 av[T];
#pragma unroll
        for (int t = 0; t < T; ++t) av[t] = a.packed8_upto(t * kMmaCols + g, k, k_hi);
        chunk(wl, wh, av);
    }
    // Accumulator j of mma t: column g (+ 8 for j >= 2), row 8t + 2q (+ 1 for odd j).
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = t * kMmaCols + 2 * q + j % 2;
            tile[row * Config::kBlockN + col + (j / 2) * kMmaCols] = acc[t][j];
        }
}

// ---- N-major B on tensor cores: C = A B, a warp per 64 columns, warps along K ---------------

template <class Config>
__device__ __forceinline__ void gemv_n_major_mma(const GemvArgs& args, const GemvA<Config>& a,
                                                 const unsigned short* b, int col0, int k_lo,
                                                 int k_hi, float* tile) {
    constexpr int U = Config::kUnroll, W = Config::kWarps;
    static_assert(Config::kBlockN == kMmaNMajorCols, "a warp covers the CTA's columns");
    const int warp = threadIdx.x / kWarpLanes, lane = threadIdx.x % kWarpLanes;
    const int g = lane / 4, q = lane % 4;
    // Lane group g's vector: columns 8g .. 8g + 7 (past N: the last vector that starts inside
    // the row, never stored); quad q's rows: 8q .. 8q + 7 of each chunk.
    const int n0 = min(col0 + g * kGemvVec, (args.n - 1) / kGemvVec * kGemvVec);
    const int valid = min(kGemvVec, args.n - n0);   // columns of the vector that exist
    const unsigned short* lane_b = b + n0 + static_cast<long long>(q * kGemvVec) * args.b_ld;
    float acc[kGemvVec][4];   // [e]: mma e, columns 8s + e of the block (s: its n slot)
#pragma unroll
    for (int e = 0; e < kGemvVec; ++e)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[e][j] = 0.0f;

    // One chunk at kc: bv[j] = row kc + 8q + j of the lane's columns.
    auto chunk = [&](const uint4 (&bv)[kGemvVec], int kc) {
        const int k = kc + q * kGemvVec;
        const uint4 al = a.packed8_upto(g, k, k_hi), ah = a.packed8_upto(g + kMmaCols, k, k_hi);
#pragma unroll
        for (int e = 0; e < kGemvVec; ++e) {
            mma_16816<Config::kBf16>(acc[e], al.x, ah.x, al.y, ah.y, pair(bv[0], bv[1], e),
                                     pair(bv[2], bv[3], e));
            mma_16816<Config::kBf16>(acc[e], al.z, ah.z, al.w, ah.w, pair(bv[4], bv[5], e),
                                     pair(bv[6], bv[7], e));
        }
    };
    // Turns of U chunks: warp w takes chunks [k_lo + (t W + w) U, + U) x 32 of turn t.
    int kc = k_lo + warp * U * kMmaChunk;
    for (; kc + U * kMmaChunk <= k_hi; kc += W * U * kMmaChunk) {
        uint4 bv[U][kGemvVec];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int j = 0; j < kGemvVec; ++j)
                bv[u][j] = ld_row_v4<Config, true>(
                    lane_b + static_cast<long long>(kc + u * kMmaChunk + j) * args.b_ld, valid);
#pragma unroll
        for (int u = 0; u < U; ++u) chunk(bv[u], kc + u * kMmaChunk);
    }
    // This warp's chunks of the slice's last partial turn; rows past its end are zero.
    for (int c = kc; c < min(kc + U * kMmaChunk, k_hi); c += kMmaChunk) {
        uint4 bv[kGemvVec];
#pragma unroll
        for (int j = 0; j < kGemvVec; ++j)
            bv[j] = c + q * kGemvVec + j < k_hi
                        ? ld_row_v4<Config, true>(
                              lane_b + static_cast<long long>(c + j) * args.b_ld, valid)
                        : make_uint4(0, 0, 0, 0);
        chunk(bv, c);
    }
    // Accumulator j of mma e: row g (+ 8 for j >= 2), column 8 (2q + j % 2) + e. Warps add
    // their partials into the tile in warp order.
    for (int w = 0; w < W; ++w) {
        if (warp == w) {
#pragma unroll
            for (int e = 0; e < kGemvVec; ++e)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int row = g + (j / 2) * kMmaCols;
                    if (row >= Config::kMaxRows) continue;
                    float* t = tile + row * Config::kBlockN + (2 * q + j % 2) * kMmaCols + e;
                    *t = w == 0 ? acc[e][j] : *t + acc[e][j];
                }
        }
        __syncthreads();
    }
}

// ---- the tile's store: straight to C, or through the split-K scratch ---------------------

template <class Config>
__device__ __forceinline__ void gemv_store(const GemvArgs& args, const float* tile, int z,
                                          int m0, int rows, int col0) {
    constexpr int kTile = Config::kMaxRows * Config::kBlockN;
    const int S = gridDim.y;
    unsigned short* c = args.c + static_cast<long long>(z) * args.c_batch16 * kGemvVec;
    // kTransC: the kernel computed C^T (rows = the problem's columns), stored transposed.
    auto store = [&](int e, float value) {
        const int i = e / Config::kBlockN, n = col0 + e % Config::kBlockN;
        const long long at = Config::kTransC ? static_cast<long long>(n) * args.c_ld + m0 + i
                                             : static_cast<long long>(m0 + i) * args.c_ld + n;
        if (i < rows && n < args.n) c[at] = to_16bit<Config::kBf16>(value);
    };
    if (S == 1) {
        for (int e = threadIdx.x; e < kTile; e += blockDim.x) store(e, tile[e]);
        return;
    }
    // Config::kCounters counters (zero between launches) lead the scratch; the partials follow.
    const int tile_id = blockIdx.z * gridDim.x + blockIdx.x;
    float* slots = reinterpret_cast<float*>(args.scratch + Config::kCounters) +
                   static_cast<long long>(tile_id) * S * kTile;
    for (int e = threadIdx.x; e < kTile; e += blockDim.x)
        slots[static_cast<long long>(blockIdx.y) * kTile + e] = tile[e];
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        last = atomic_add_acq_rel_gpu(args.scratch + tile_id, 1) == static_cast<u32>(S - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < S; ++s) sum += ld_global_cg_f32(slots + static_cast<long long>(s) * kTile + e);
        store(e, sum);
    }
    if (threadIdx.x == 0) args.scratch[tile_id] = 0;  // for the next launch
}

template <class Config>
__device__ __forceinline__ void gemv(const GemvArgs& args) {
    extern __shared__ __align__(16) float gemv_tile[];
    // Programmatic launch: nothing touches global memory before the previous kernel is done.
    grid_dependency_wait();
    // Row groups fastest: the CTAs that read the same columns of B run side by side.
    const int row_groups = (args.m + Config::kMaxRows - 1) / Config::kMaxRows;
    const int col0 = blockIdx.x / row_groups * Config::kBlockN;
    const int m0 = blockIdx.x % row_groups * Config::kMaxRows;
    const int z = args.batch_offset + blockIdx.z;
    const long long vec = kGemvVec;
    GemvA<Config> a{args.a + static_cast<long long>(args.a_batch(z)) * args.a_batch16 * vec +
                        (Config::kAKMajor ? static_cast<long long>(m0) * args.a_ld : m0),
                    args.a_ld, min(Config::kMaxRows, args.m - m0)};
    const unsigned short* b =
        args.b + static_cast<long long>(args.b_batch(z)) * args.b_batch16 * vec;
    int k_lo, k_hi;
    // K-major slices hold whole vectors; N-major ones whole 8-row groups (A's vectors); the
    // tensor-core loops whole chunks.
    split_range(args.k, Config::kMma ? kMmaChunk : kGemvVec, blockIdx.y, gridDim.y, k_lo, k_hi);
    if constexpr (Config::kMma && Config::kBKMajor) {
        gemv_k_major_mma<Config>(args, a, b, col0, k_lo, k_hi, gemv_tile);
        __syncthreads();
    } else if constexpr (Config::kMma) {
        gemv_n_major_mma<Config>(args, a, b, col0, k_lo, k_hi, gemv_tile);
    } else if constexpr (Config::kBKMajor) {
        gemv_k_major<Config>(args, a, b, col0, k_lo, k_hi, gemv_tile);
        __syncthreads();
    } else {
        gemv_n_major<Config>(args, a, b, col0, k_lo, k_hi, gemv_tile);
    }
    gemv_store<Config>(args, gemv_tile, z, m0, a.rows, col0);
}

}  // namespace hopmm

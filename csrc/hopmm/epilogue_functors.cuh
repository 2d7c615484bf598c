// Fused epilogue: activation(alpha * acc + beta * c + bias), applied in fp32 to the accumulator
// values of the output elements a thread holds, before they are rounded to 16 bits (the one
// rounding of the call). The chain is fixed at compile time by the rendered Config
// (kEpilogue, kActivation, kHasBias, kHasC: part of the kernel's name and the cache key); the
// operands of the chain (bias and c pointers, their element strides, alpha and beta) are kernel
// arguments, so one kernel serves every bias and c of the same chain.
//
// Bias and c are read from global memory with element strides (row, column, batch; 0 along a
// broadcast dimension): a bias of shape (N,) has row stride 0, one of shape (M, 1) column
// stride 0, and a c broadcast along rows or batches has stride 0 there, all through one path.
// Elements past the output's last row or column are never read (TMA clips their stores).
//
// Where registers allow, the store loop fetches a box's operands before any of its values is
// computed, and the chain itself has no branch, so the loads of a box are in flight together
// (epilogue_tma_store.cuh; NOTES v0.19).
#pragma once
#include "wgmma.cuh"

namespace hopmm {

// Config::kActivation values (hopmm/epilogue.py's ACTIVATIONS, in the same order).
constexpr int kActivationNone = 0;
constexpr int kActivationRelu = 1;
constexpr int kActivationGelu = 2;      // x * Phi(x), the erf form
constexpr int kActivationGeluTanh = 3;  // the tanh approximation of GELU
constexpr int kActivationSilu = 4;      // x * sigmoid(x)
constexpr int kActivationSigmoid = 5;

// The runtime operands of the chain, as the kernel takes them (zero for a plain kernel).
struct EpilogueArgs {
    const void* bias;
    const void* c;
    int m, n;  // the output's extent: elements past it are not read
    int bias_row_stride, bias_col_stride;
    int c_row_stride, c_col_stride, c_batch_stride;
    float alpha, beta;
    // Where a kernel stores its output rows itself (Config::kRowStore; m and n above are then
    // its extent): the base address, and the row and batch strides in elements.
    void* out;
    int out_row_stride, out_batch_stride;
};

template <class Cfg>
struct EpilogueChain {
    static constexpr bool kEnabled = Cfg::kEpilogue;

    // A 16-bit element's bits as fp32 (exact).
    __device__ __forceinline__ static float widen(u32 bits) {
        if (Cfg::kBf16) return __uint_as_float((bits & 0xffffu) << 16);
        float value;
        asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }"
            : "=f"(value) : "r"(bits));
        return value;
    }

    // One operand's pairs (columns col0 + SPACING * g, col0 + SPACING * g + 1 for g < PAIRS)
    // of one row, whose element at column col0 is at `p`; `row_in`: the row lies inside the
    // output. Row-contiguous and 4-byte aligned (the usual bias and residual): one 32-bit load
    // a pair at a fixed offset from `p`; a column broadcast (stride 0, a bias of shape (M, 1)):
    // one load; otherwise one 16-bit load an element. Read through the read-only cache, since
    // neighbouring threads and tiles read the same bias lines. The loads are predicated, not
    // branched around, so that a row's loads are in flight together (NOTES v0.19).
    template <int PAIRS, int SPACING>
    __device__ __forceinline__ static void load_row(const unsigned short* p, int col0, int n,
                                                    bool row_in, int col_stride,
                                                    u32 (&out)[PAIRS]) {
        const bool pair_loads =
            col_stride == 1 && (reinterpret_cast<unsigned long long>(p) & 3) == 0;
        if (pair_loads && row_in && col0 + SPACING * (PAIRS - 1) + 1 < n) {
            // Every pair inside the output (all but the edge tiles): the loads alone, no test
            // a pair. The tests and the element loads beside them were most of the work of a
            // bias epilogue (NOTES v0.25).
#pragma unroll
            for (int g = 0; g < PAIRS; ++g)
                out[g] = __ldg(reinterpret_cast<const u32*>(p + SPACING * g));
        } else if (pair_loads) {
#pragma unroll
            for (int g = 0; g < PAIRS; ++g) {
                const int col = col0 + SPACING * g;
                u32 bits = 0;
                if (row_in && col + 1 < n)
                    bits = __ldg(reinterpret_cast<const u32*>(p + SPACING * g));
                else if (row_in && col < n)
                    bits = __ldg(p + SPACING * g);
                out[g] = bits;
            }
        } else if (col_stride == 0) {
            const u32 value = row_in ? __ldg(p) : 0u;
#pragma unroll
            for (int g = 0; g < PAIRS; ++g) out[g] = value | (value << 16);
        } else {
#pragma unroll
            for (int g = 0; g < PAIRS; ++g) {
                const int col = col0 + SPACING * g;
                const unsigned short* q = p + static_cast<long long>(SPACING * g) * col_stride;
                const u32 lo = row_in && col < n ? __ldg(q) : 0u;
                const u32 hi = row_in && col + 1 < n ? __ldg(q + col_stride) : 0u;
                out[g] = lo | (hi << 16);
            }
        }
    }

    // The operands of the pairs at columns col0 + SPACING * g (g < PAIRS) of row `row`, batch
    // slice z: c's in c[g], bias's in bias[g] (left alone where the chain has none).
    template <int PAIRS, int SPACING>
    __device__ __forceinline__ static void fetch_row(const EpilogueArgs& e, int row, int col0,
                                                     int z, u32 (&c)[PAIRS],
                                                     u32 (&bias)[PAIRS]) {
        if constexpr (kEnabled) {
            const bool row_in = row < e.m;
            if constexpr (Cfg::kHasC)
                load_row<PAIRS, SPACING>(
                    reinterpret_cast<const unsigned short*>(e.c) +
                        static_cast<long long>(z) * e.c_batch_stride +
                        static_cast<long long>(row) * e.c_row_stride +
                        static_cast<long long>(col0) * e.c_col_stride,
                    col0, e.n, row_in, e.c_col_stride, c);
            if constexpr (Cfg::kHasBias)
                load_row<PAIRS, SPACING>(
                    reinterpret_cast<const unsigned short*>(e.bias) +
                        static_cast<long long>(row) * e.bias_row_stride +
                        static_cast<long long>(col0) * e.bias_col_stride,
                    col0, e.n, row_in, e.bias_col_stride, bias);
        }
    }

    // 1 / (1 + 2^(x * kLog2eScale)) without a branch (kLog2eScale = -log2(e): the logistic
    // function of x): MUFU.EX2's approximation and a fast division are far inside the 16-bit
    // rounding that follows, and precise expf / division carry slow-path branches that keep the
    // compiler from interleaving elements (NOTES v0.19). 2^x = inf for large x gives 0.
    __device__ __forceinline__ static float logistic_of_exponent(float log2_of_exp) {
        return __fdividef(1.0f, 1.0f + ex2_approx(log2_of_exp));
    }

    __device__ __forceinline__ static float logistic(float x) {
        constexpr float kMinusLog2e = -1.4426950408889634f;
        return logistic_of_exponent(kMinusLog2e * x);
    }

    // GELU's x * Phi(x) without a branch (erff's argument-range branches serialize the
    // epilogue, NOTES v0.19). Phi(x) = 1 - q for x >= 0 and q for x < 0, q = erfc(|x| / sqrt 2)
    // / 2 = t 2^(P(t) - x^2 log2(e) / 2), t = 1 / (1 + |x| / (2 sqrt 2)), with P a degree-5
    // polynomial fitted (minimax, |x| <= 9) to the exact erfc: GELU's relative error stays
    // below 1.2e-5 there and 4e-5 down to x = -13 (below that 2^x flushes to 0), the negative
    // tail included, far inside a 16-bit rounding, in 11 FP32 instructions and 2 MUFU an
    // element (NOTES v0.25).
    __device__ __forceinline__ static float gelu_erf(float x) {
        constexpr float kHalfRsqrt2 = 0.35355339059327373f;
        constexpr float kMinusHalfLog2e = -0.72134752044448170f;
        const float t = __fdividef(1.0f, fmaf(fabsf(x), kHalfRsqrt2, 1.0f));
        float p = 0.327913457f;  // P(t) by Horner, highest power first
        p = fmaf(p, t, -1.01582458f);
        p = fmaf(p, t, 0.6749487f);
        p = fmaf(p, t, 0.373143413f);
        p = fmaf(p, t, 1.46685295f);
        p = fmaf(p, t, -2.82702332f);
        const float q = t * ex2_approx(fmaf(x * kMinusHalfLog2e, x, p));
        return x * (x >= 0.0f ? 1.0f - q : q);
    }

    __device__ __forceinline__ static float activate(float x) {
        // GELU's tanh approximation: 0.5 (1 + tanh(u)) = logistic(2u), u = sqrt(2 / pi) (x +
        // 0.044715 x^3), so its exponent in base 2 is x (kTanhLinear + kTanhCubic x^2).
        constexpr float kTanhLinear = -2.0f * 0.7978845608028654f * 1.4426950408889634f;
        constexpr float kTanhCubic = kTanhLinear * 0.044715f;
        if constexpr (Cfg::kActivation == kActivationRelu) return fmaxf(x, 0.0f);
        if constexpr (Cfg::kActivation == kActivationGelu) return gelu_erf(x);
        if constexpr (Cfg::kActivation == kActivationGeluTanh)
            return x * logistic_of_exponent(x * fmaf(kTanhCubic, x * x, kTanhLinear));
        if constexpr (Cfg::kActivation == kActivationSilu) return x * logistic(x);
        if constexpr (Cfg::kActivation == kActivationSigmoid) return logistic(x);
        return x;
    }

    // The chain on the accumulator pair (x, y) with its fetched operands (the 16-bit bits of
    // c and bias at both columns, the first in the low half). Elements outside the output get
    // some finite value: their stores are clipped.
    __device__ __forceinline__ static void apply2(const EpilogueArgs& e, float& x, float& y,
                                                  u32 c_bits, u32 bias_bits) {
        if constexpr (kEnabled) {
            float vx = e.alpha * x, vy = e.alpha * y;
            if constexpr (Cfg::kHasC) {
                vx = fmaf(e.beta, widen(c_bits), vx);
                vy = fmaf(e.beta, widen(c_bits >> 16), vy);
            }
            if constexpr (Cfg::kHasBias) {
                vx += widen(bias_bits);
                vy += widen(bias_bits >> 16);
            }
            x = activate(vx);
            y = activate(vy);
        }
    }

    // At the start of a tile's main loop: asks this SM's L1 for the bias elements of rows
    // row0 .. row0 + ROWS - 1, columns n0 .. n0 + COLS - 1, where they lie along one run of
    // memory (a row bias of shape (N,), a column bias of shape (M, 1)): the epilogue's bias
    // loads then hit L1. Timed alone it moved nothing while each load still sat behind its
    // edge tests; without them its worth is not yet measured (NOTES v0.25). `thread` of the
    // warpgroup's kWarpgroupThreads.
    template <int ROWS, int COLS>
    __device__ __forceinline__ static void prefetch_bias(const EpilogueArgs& e, int row0, int n0,
                                                         int thread) {
        if constexpr (kEnabled && Cfg::kHasBias) {
            constexpr int kLineElems = kL2LineBytes / 2;  // 16-bit elements of a line
            const bool along_row = e.bias_row_stride == 0;
            const int first = along_row ? n0 : row0;
            const int count = along_row ? min(COLS, e.n - n0) : min(ROWS, e.m - row0);
            const int stride = along_row ? e.bias_col_stride : e.bias_row_stride;
            if (stride != 1 || (!along_row && e.bias_col_stride != 0) || count <= 0) return;
            // Elements 0, kLineElems, 2 kLineElems, ... and the last: every line of the run.
            const int at = thread * kLineElems;
            if (at - kLineElems < count - 1)
                prefetch_global_l1(reinterpret_cast<const unsigned short*>(e.bias) + first +
                                   min(at, count - 1));
        }
    }

    // At the start of a tile's main loop: asks L2 for the lines of c that rows row0 ..
    // row0 + ROWS - 1, columns n0 .. n0 + COLS - 1 of batch slice z will read in the epilogue,
    // so those loads hit L2 instead of waiting on DRAM when the main loop is done
    // (NOTES v0.19). `thread` of the warpgroup's kWarpgroupThreads. Only a c whose rows are
    // contiguous (the usual residual); other layouts are read as they are.
    template <int ROWS, int COLS>
    __device__ __forceinline__ static void prefetch_c(const EpilogueArgs& e, int row0, int n0,
                                                      int z, int thread) {
        if constexpr (kEnabled && Cfg::kHasC) {
            constexpr int kLineElems = kL2LineBytes / 2;  // 16-bit elements of a line
            constexpr int kLinesPerRow = (COLS + kLineElems - 1) / kLineElems;
            if (e.c_col_stride != 1) return;
            const unsigned short* c = reinterpret_cast<const unsigned short*>(e.c);
            for (int i = thread; i < ROWS * kLinesPerRow; i += kWarpgroupThreads) {
                const int row = row0 + i / kLinesPerRow;
                const int col = n0 + (i % kLinesPerRow) * kLineElems;
                if (row < e.m && col < e.n)
                    prefetch_global_l2(c + static_cast<long long>(z) * e.c_batch_stride +
                                       static_cast<long long>(row) * e.c_row_stride + col);
            }
        }
    }

    // The chain on the pair at (row, col), (row, col + 1) of batch slice z, its operands
    // loaded here, one by one behind branches: the fewest registers live, for the kernels
    // that have none to spare (the loads are not in flight together).
    __device__ __forceinline__ static void apply2_at(const EpilogueArgs& e, float& x, float& y,
                                                     int row, int col, int z) {
        if constexpr (kEnabled) {
            u32 c = 0u, bias = 0u;
            if (row < e.m) {
                if constexpr (Cfg::kHasC)
                    c = load_pair(reinterpret_cast<const unsigned short*>(e.c) +
                                      static_cast<long long>(z) * e.c_batch_stride +
                                      static_cast<long long>(row) * e.c_row_stride +
                                      static_cast<long long>(col) * e.c_col_stride,
                                  col, e.n, e.c_col_stride);
                if constexpr (Cfg::kHasBias)
                    bias = load_pair(reinterpret_cast<const unsigned short*>(e.bias) +
                                         static_cast<long long>(row) * e.bias_row_stride +
                                         static_cast<long long>(col) * e.bias_col_stride,
                                     col, e.n, e.bias_col_stride);
            }
            apply2(e, x, y, c, bias);
        }
    }

    // Elements (col, col + 1) of a row inside the output, the first at p.
    __device__ __forceinline__ static u32 load_pair(const unsigned short* p, int col, int n,
                                                    int col_stride) {
        if (col + 1 < n) {
            if (col_stride == 1 && (reinterpret_cast<unsigned long long>(p) & 3) == 0)
                return __ldg(reinterpret_cast<const u32*>(p));
            return static_cast<u32>(__ldg(p)) | (static_cast<u32>(__ldg(p + col_stride)) << 16);
        }
        return col < n ? static_cast<u32>(__ldg(p)) : 0u;
    }

    // Four consecutive columns col .. col + 3 of one row (the split-K reductions' chunks).
    __device__ __forceinline__ static void apply4(const EpilogueArgs& e, float4& v, int row,
                                                  int col, int z) {
        u32 c[2] = {0u, 0u}, bias[2] = {0u, 0u};
        fetch_row<2, 2>(e, row, col, z, c, bias);
        apply2(e, v.x, v.y, c[0], bias[0]);
        apply2(e, v.z, v.w, c[1], bias[1]);
    }
};

}  // namespace hopmm

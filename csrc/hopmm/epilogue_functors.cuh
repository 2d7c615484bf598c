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
};

template <class Cfg>
struct EpilogueChain {
    static constexpr bool kEnabled = Cfg::kEpilogue;

    // One 16-bit element of bias or c (the operands' dtype), as fp32; read through the
    // read-only cache, since neighbouring threads and tiles read the same bias lines.
    __device__ __forceinline__ static float load(const void* base, long long index) {
        return widen(__ldg(reinterpret_cast<const unsigned short*>(base) + index));
    }

    // A 16-bit element's bits as fp32 (exact).
    __device__ __forceinline__ static float widen(unsigned short bits) {
        if (Cfg::kBf16) return __uint_as_float(static_cast<u32>(bits) << 16);
        float value;
        asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(value) : "h"(bits));
        return value;
    }

    // Elements `index` and `index + col_stride` (two adjacent output columns): one 32-bit
    // load where they are adjacent and 4-byte aligned, one load for a row bias (stride 0).
    // The caller guarantees both lie inside the output.
    __device__ __forceinline__ static float2 load2(const void* base, long long index,
                                                   int col_stride) {
        const unsigned short* p = reinterpret_cast<const unsigned short*>(base) + index;
        if (col_stride == 0) {
            const float v = load(base, index);
            return make_float2(v, v);
        }
        if (col_stride == 1 && (reinterpret_cast<unsigned long long>(p) & 3) == 0) {
            const u32 bits = __ldg(reinterpret_cast<const u32*>(p));
            return make_float2(widen(static_cast<unsigned short>(bits & 0xffff)),
                               widen(static_cast<unsigned short>(bits >> 16)));
        }
        return make_float2(load(base, index), load(base, index + col_stride));
    }

    __device__ __forceinline__ static float activate(float x) {
        // sqrt(2 / pi) and the cubic coefficient of GELU's tanh approximation.
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        constexpr float kGeluCubic = 0.044715f;
        constexpr float kRsqrt2 = 0.7071067811865476f;
        if constexpr (Cfg::kActivation == kActivationRelu) return fmaxf(x, 0.0f);
        if constexpr (Cfg::kActivation == kActivationGelu)
            return 0.5f * x * (1.0f + erff(x * kRsqrt2));
        if constexpr (Cfg::kActivation == kActivationGeluTanh)
            return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
        if constexpr (Cfg::kActivation == kActivationSilu) return x / (1.0f + expf(-x));
        if constexpr (Cfg::kActivation == kActivationSigmoid) return 1.0f / (1.0f + expf(-x));
        return x;
    }

    // The chain for the element (row, col) of batch slice z, whose accumulator is `acc`.
    __device__ __forceinline__ static float apply(const EpilogueArgs& e, float acc, int row,
                                                  int col, int z) {
        if constexpr (!kEnabled) {
            return acc;
        } else {
            float v = e.alpha * acc;
            const bool inside = row < e.m && col < e.n;
            if constexpr (Cfg::kHasC) {
                if (inside) {
                    const long long index =
                        static_cast<long long>(z) * e.c_batch_stride +
                        static_cast<long long>(row) * e.c_row_stride +
                        static_cast<long long>(col) * e.c_col_stride;
                    v = fmaf(e.beta, load(e.c, index), v);
                }
            }
            if constexpr (Cfg::kHasBias) {
                if (inside) {
                    const long long index = static_cast<long long>(row) * e.bias_row_stride +
                                            static_cast<long long>(col) * e.bias_col_stride;
                    v += load(e.bias, index);
                }
            }
            return activate(v);
        }
    }

    // Two adjacent columns col, col + 1 of one row (an accumulator register pair): bias and
    // c read by pairs (load2) where both columns lie inside the output, else one by one.
    __device__ __forceinline__ static void apply2(const EpilogueArgs& e, float& x, float& y,
                                                  int row, int col, int z) {
        if constexpr (kEnabled) {
            if (!(row < e.m && col + 1 < e.n)) {  // an edge: each element on its own
                x = apply(e, x, row, col, z);
                y = apply(e, y, row, col + 1, z);
                return;
            }
            float vx = e.alpha * x, vy = e.alpha * y;
            if constexpr (Cfg::kHasC) {
                const float2 c = load2(e.c,
                                       static_cast<long long>(z) * e.c_batch_stride +
                                           static_cast<long long>(row) * e.c_row_stride +
                                           static_cast<long long>(col) * e.c_col_stride,
                                       e.c_col_stride);
                vx = fmaf(e.beta, c.x, vx);
                vy = fmaf(e.beta, c.y, vy);
            }
            if constexpr (Cfg::kHasBias) {
                const float2 b = load2(e.bias,
                                       static_cast<long long>(row) * e.bias_row_stride +
                                           static_cast<long long>(col) * e.bias_col_stride,
                                       e.bias_col_stride);
                vx += b.x;
                vy += b.y;
            }
            x = activate(vx);
            y = activate(vy);
        }
    }

    // Four consecutive columns col .. col + 3 of one row (the split-K reductions' chunks).
    __device__ __forceinline__ static void apply4(const EpilogueArgs& e, float4& v, int row,
                                                  int col, int z) {
        apply2(e, v.x, v.y, row, col, z);
        apply2(e, v.z, v.w, row, col + 2, z);
    }
};

}  // namespace hopmm

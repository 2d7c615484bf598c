// A probe, not part of hopmm (bench/NOTES.md v0.37; driver: skinny_in_place.py).
// C (M x N, N <= 128) = A (M x K, K-major, rows starting on any 2-byte boundary) @ B. A is read
// where it lies: cp.async stages each row's 64-element k-block as the 9 aligned 16-byte
// vectors that cover it (a row's shift is the same for all its k-blocks) in a ring of S
// stages, and the consumer warps shift pairs of staged vectors into mma.sync A fragments,
// k permuted inside 32-element chunks as gemv's tensor-core loops do. B comes as an aligned
// copy, transposed and permuted the same way, through the same ring (ldmatrix). The work is
// (128-row block, k-block) units in row-block order, an equal run of them per CTA of the grid
// (one wave); a CTA adds its partial of each row block into an fp32 workspace with atomics
// (not bitwise repeatable), and to_16bit rounds the workspace into C.
#include "kernel_gemv.cuh"
using namespace hopmm;

constexpr int KB = 64;
constexpr int AVECS = KB / 8 + 1;          // aligned vectors covering a row's k-block
constexpr int APITCH = AVECS * 8;          // elements (144 B)
constexpr int BPITCH = KB + 8;             // elements (144 B): conflict-free ldmatrix rows

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
}

template <int NT, int R, int W, int S, bool kBf16>
__device__ __forceinline__ void skinny(const unsigned short* __restrict__ A, long long lda,
                                       const unsigned short* __restrict__ Bp, int kp,
                                       float* ws, int M, int N, int K) {
    constexpr int ROWS = W * R * 16;
    constexpr int A_STAGE = ROWS * APITCH, B_STAGE = NT * BPITCH;   // elements
    extern __shared__ __align__(128) unsigned short smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int total_kb = (K + KB - 1) / KB;
    const long long units = static_cast<long long>((M + ROWS - 1) / ROWS) * total_kb;
    // Work units (row block, k-block) in row-block order, an equal share per CTA.
    const long long u0 = units * blockIdx.x / gridDim.x, u1 = units * (blockIdx.x + 1) / gridDim.x;
    const int nunits = static_cast<int>(u1 - u0);
    if (nunits <= 0) return;

    auto a_stage = [&](int s) { return smem + s * (A_STAGE + B_STAGE); };
    auto b_stage = [&](int s) { return smem + s * (A_STAGE + B_STAGE) + A_STAGE; };

    auto load_stage = [&](long long u, int s) {
        const int rb = static_cast<int>(u / total_kb), kb = static_cast<int>(u % total_kb);
        unsigned short* as = a_stage(s);
        for (int i = threadIdx.x; i < ROWS * AVECS; i += W * 32) {
            const int r = i / AVECS, v = i % AVECS;
            const int row = min(rb * ROWS + r, M - 1);
            const unsigned short* rp = A + static_cast<long long>(row) * lda;
            const unsigned long long at = reinterpret_cast<unsigned long long>(rp + kb * KB);
            const unsigned long long base = (at & ~15ull) + 16ull * v;
            const unsigned long long end = reinterpret_cast<unsigned long long>(rp + K);
            cp_async16(smem_addr(as + r * APITCH + v * 8), reinterpret_cast<const void*>(base),
                       base < end ? 16 : 0);
        }
        unsigned short* bs = b_stage(s);
        for (int i = threadIdx.x; i < NT * 8; i += W * 32) {
            const int n = i / 8, v = i % 8;
            cp_async16(smem_addr(bs + n * BPITCH + v * 8),
                       Bp + static_cast<long long>(n) * kp + kb * KB + v * 8, 16);
        }
    };

    int lrow[R][2];
    u32 lshift[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) lrow[r][hf] = warp * R * 16 + 16 * r + g + 8 * hf;
    auto set_shifts = [&](int rb) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = min(rb * ROWS + lrow[r][hf], M - 1);
                lshift[r][hf] = static_cast<u32>(reinterpret_cast<unsigned long long>(
                                    A + static_cast<long long>(row) * lda)) & 15u;
            }
    };
    float acc[R][NT / 8][4];
    auto clear = [&] {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < NT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.0f;
    };
    auto flush = [&](int rb) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < NT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = rb * ROWS + warp * R * 16 + 16 * r + g + (e >= 2 ? 8 : 0);
                    const int col = 8 * j + 2 * q + (e & 1);
                    if (row < M && col < N)
                        atomicAdd(ws + static_cast<long long>(row) * N + col, acc[r][j][e]);
                }
    };
    clear();
    int rb_cur = static_cast<int>(u0 / total_kb);
    set_shifts(rb_cur);

#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < nunits) load_stage(u0 + s, s);
        asm volatile("cp.async.commit_group;");
    }
    for (int i = 0; i < nunits; ++i) {
        const long long u = u0 + i;
        const int s = i % S;
        const int rb = static_cast<int>(u / total_kb), kb = static_cast<int>(u % total_kb);
        if (rb != rb_cur) {
            flush(rb_cur);
            clear();
            rb_cur = rb;
            set_shifts(rb);
        }
        asm volatile("cp.async.wait_group %0;" :: "n"(S - 2) : "memory");
        __syncthreads();
        if (i + S - 1 < nunits) load_stage(u + S - 1, (i + S - 1) % S);
        asm volatile("cp.async.commit_group;");
        const unsigned short* as = a_stage(s);
        const unsigned short* bs = b_stage(s);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int k = kb * KB + 32 * c + 8 * q;
            const int valid = K - k;
            uint4 av[R][2];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const uint4* rowv = reinterpret_cast<const uint4*>(as + lrow[r][hf] * APITCH);
                    const uint4 v = shifted_v4(rowv[4 * c + q], rowv[4 * c + q + 1], lshift[r][hf]);
                    av[r][hf] = valid >= 8 ? v : valid > 0 ? keep_first(v, valid) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int p = 0; p < NT / 16; ++p) {
                    const int mi = lane / 8, rr = lane % 8;
                    const int n = 16 * p + (mi / 2) * 8 + rr;
                    const int kk = 32 * c + 16 * h + (mi % 2) * 8;
                    u32 b0, b1, b2, b3;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                 : "r"(smem_addr(bs + n * BPITCH + kk)));
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const u32 a0 = word(av[r][0], 2 * h), a1 = word(av[r][1], 2 * h);
                        const u32 a2 = word(av[r][0], 2 * h + 1), a3 = word(av[r][1], 2 * h + 1);
                        mma_16816<kBf16>(acc[r][2 * p], a0, a1, a2, a3, b0, b1);
                        mma_16816<kBf16>(acc[r][2 * p + 1], a0, a1, a2, a3, b2, b3);
                    }
                }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    flush(rb_cur);
}

#define SKINNY(NAME, NT, R, W, S, BF)                                                          \
    extern "C" __global__ void __launch_bounds__(W * 32, 1)                                   \
    NAME(const unsigned short* A, long long lda, const unsigned short* Bp, int kp, float* ws, \
         int M, int N, int K) {                                                               \
        skinny<NT, R, W, S, BF>(A, lda, Bp, kp, ws, M, N, K);                                 \
    }
SKINNY(rk_bf16_32, 32, 2, 4, 4, true)
SKINNY(rk_bf16_64, 64, 2, 4, 4, true)
SKINNY(rk_bf16_128, 128, 2, 4, 3, true)
SKINNY(rk_f16_32, 32, 2, 4, 4, false)
SKINNY(rk_f16_64, 64, 2, 4, 4, false)
SKINNY(rk_f16_128, 128, 2, 4, 3, false)

extern "C" __global__ void to_16bit(const float* ws, unsigned short* c, long long count, int bf16) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const u32 packed = bf16 ? pack_bf16x2(ws[i], 0.0f) : pack_f16x2(ws[i], 0.0f);
        c[i] = static_cast<unsigned short>(packed & 0xffffu);
    }
}

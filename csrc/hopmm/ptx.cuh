// One-instruction PTX wrappers for sm_90a: mbarriers, TMA, fences, named barriers,
// setmaxnreg. Each wrapper is one instruction (or one polling loop) so that a reader of a
// kernel sees exactly which hardware operation happens where.
#pragma once

namespace hopmm {

typedef unsigned int u32;
typedef unsigned long long u64;

// A CUtensorMap is a 128-byte opaque object, 64-byte aligned; it is passed to the kernel by
// value as a `const __grid_constant__` parameter so TMA can read it from parameter space.
struct alignas(64) TensorMap {
    u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

// An operand whose row pitch is not a multiple of 16 bytes (a K-major A's m rows, an N-major
// B's k rows), which one map cannot describe, as kPhases maps: map j holds rows j, j + 8,
// j + 16, ... (eight rows' pitch is a multiple of 16 bytes for any pitch), from the 16-byte
// boundary at or before row j (producer_tma.cuh).
constexpr int kPhases = 8;
struct PhasedTensorMaps {
    TensorMap phase[kPhases];
};

// The first (or only) map of a map parameter, as the skeletons take it.
__device__ __forceinline__ const TensorMap* first_map(const TensorMap& map) { return &map; }
__device__ __forceinline__ const TensorMap* first_map(const PhasedTensorMaps& maps) {
    return maps.phase;
}

// A map parameter that carries only a base address, in its first 8 bytes (launch.py's
// ADDRESS_SLOT): the output of a kernel that stores its rows without TMA (kRowStore).
__device__ __forceinline__ void* address_in_map_slot(const TensorMap* map) {
    return reinterpret_cast<void*>(map->opaque[0]);
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// Loads from shared memory by 32-bit shared-window address (fewer registers than generic
// pointers where they are scarce).
__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ unsigned short ld_shared_u16(u32 addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ void st_shared_v4(u32 addr, u32 x, u32 y, u32 z, u32 w) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

// ---- mbarrier (PTX ISA 9.7.13.15) -------------------------------------------------------

__device__ __forceinline__ void mbar_init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals));
}

__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Adds `bytes` to the barrier's transaction count, then arrives once.
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// Blocks until the phase with the given parity has completed. try_wait may time out and
// return false, hence the loop.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "HOPMM_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra HOPMM_WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

// Makes mbarrier.init visible to the async proxy (TMA complete_tx) before first use.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// ---- programmatic dependent launch (PTX ISA: griddepcontrol) -----------------------------

// Waits until the grids this one depends on have completed and their memory operations are
// visible. Returns at once when the kernel was launched without a programmatic dependency.
__device__ __forceinline__ void grid_dependency_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Asks L2 for the 128-byte line holding `address` (PTX ISA 9.7.9.15); nothing waits for it.
constexpr int kL2LineBytes = 128;
__device__ __forceinline__ void prefetch_global_l2(const void* address) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<u64>(address)));
}

// The same into this SM's L1 (and L2): a later ld.global.nc of the line hits L1.
__device__ __forceinline__ void prefetch_global_l1(const void* address) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(reinterpret_cast<u64>(address)));
}

// 2^x, MUFU.EX2's approximation (relative error about 2^-22; results below the smallest
// normal flush to 0).
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- Global memory between CTAs: ordered accesses, L2-only loads, polling -----------------
// (PTX ISA 9.7.9.7 ld/st with .acquire/.release, 9.7.13.5 atom; the split-K and gemv
// reductions hand partial sums from CTA to CTA through these.)

__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_gpu(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_gpu(u32* p, u32 v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 atomic_add_acq_rel_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ u32 atomic_add_release_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

__device__ __forceinline__ u32 atomic_add_relaxed_gpu(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Floats from global memory cached in L2 only (never a stale L1 line): one, two, four.
__device__ __forceinline__ float ld_global_cg_f32(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void ld_global_cg_f32x2(const float* p, float& x, float& y) {
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(x), "=f"(y) : "l"(p) : "memory");
}

__device__ __forceinline__ float4 ld_global_cg_f32x4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}

// The sleep between two polls of a flag another CTA sets: doubling up to kMaxSleepNs, small
// enough that a hand-off stays well under the time of one bulk reduce.
struct Backoff {
    static constexpr unsigned kMaxSleepNs = 256;
    unsigned sleep_ns = 8;
    __device__ __forceinline__ void sleep() {
        __nanosleep(sleep_ns);
        sleep_ns = sleep_ns < kMaxSleepNs ? 2 * sleep_ns : kMaxSleepNs;
    }
};

// ---- TMA (PTX ISA 9.7.9.25) --------------------------------------------------------------

__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// Loads one 3-D box (inner, outer, batch coordinates in elements) into shared memory; the
// bytes are counted against `bar`'s transaction count. Out-of-bounds elements are zero-filled.
__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap* map, u64* bar, int c0,
                                            int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];"
        ::"r"(smem_addr(dst)), "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)),
          "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Stores one 3-D box from shared memory; out-of-bounds elements are clipped.
__device__ __forceinline__ void tma_store_3d(const TensorMap* map, const void* src, int c0,
                                             int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
        ::"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

__device__ __forceinline__ void bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until all of this thread's bulk groups are complete (writes visible).
__device__ __forceinline__ void bulk_wait_group_0() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Waits until at most PENDING of this thread's most recent bulk groups have not finished
// reading shared memory (older groups have: their source buffers may be rewritten).
template <int PENDING>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(PENDING) : "memory");
}

// ---- fences and barriers -----------------------------------------------------------------

// Orders this thread's generic-proxy shared-memory writes (st.shared, stmatrix) before later
// async-proxy reads of them (TMA store, wgmma). Every writing thread must execute it.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier `id` over `threads` threads (a multiple of 32). Id 0 is __syncthreads'.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation between warpgroups (PTX ISA 9.7.19.5) -------------------------

template <u32 REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: 24..256, step 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}

template <u32 REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg: 24..256, step 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}

// ---- conversions and stmatrix ------------------------------------------------------------

// Packs two f32 into one 32-bit register of two 16-bit floats (lo = first element).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four 8x8 b16 matrices: lanes 8q..8q+7 give the row addresses of matrix q.
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared::cta.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// The same, each 8x8 matrix stored transposed: row i of the stored matrix is column i of the
// fragment (a transposed store's staging, epilogue_tma_store.cuh).
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

}  // namespace hopmm

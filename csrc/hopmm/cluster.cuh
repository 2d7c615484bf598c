// One-instruction PTX wrappers for thread-block clusters (sm_90a): the CTA's place in its
// cluster, the cluster-wide barrier, remote mbarrier arrives and TMA multicast loads.
#pragma once
#include "ptx.cuh"

namespace hopmm {

// ---- the CTA's place in the cluster (PTX ISA 10.12 special registers) --------------------

// Rank of this CTA in its cluster: bit `rank` of a multicast ctaMask addresses it.
__device__ __forceinline__ u32 cluster_ctarank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// CTAs in this CTA's cluster (the cluster shape given at launch, or __cluster_dims__).
__device__ __forceinline__ u32 cluster_nctarank() {
    u32 count;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(count));
    return count;
}

// Index of this CTA's cluster along x, and the number of clusters along x in the grid.
__device__ __forceinline__ int cluster_id_x() {
    u32 id;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(id));
    return static_cast<int>(id);
}

__device__ __forceinline__ int cluster_count_x() {
    u32 count;
    asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(count));
    return static_cast<int>(count);
}

// ---- cluster barrier (PTX ISA 9.7.13.4) --------------------------------------------------

// The two halves of the cluster barrier, which every thread of every CTA of the cluster
// executes in turn. The arrive releases this thread's earlier memory operations (mbarrier
// inits, remote arrives, shared-memory writes and remote reads) and the wait, which returns
// once every thread of the cluster has arrived, acquires the peers'. Work placed between the
// two overlaps the wait. Not `.aligned`: warps may reach them diverged (the producer's elected
// thread).
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}

// An arrive that releases nothing, for threads whose earlier memory operations no peer reads
// after the barrier: `.release` costs a GPU-wide MEMBAR (MEMBAR.ALL.GPU in the SASS).
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

// Every thread of every CTA of the cluster meets here.
__device__ __forceinline__ void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// ---- distributed shared memory and remote mbarriers --------------------------------------

// The shared::cluster address of CTA `rank`'s copy of the variable at `local` (shared::cta).
__device__ __forceinline__ u32 mapa_shared(u32 local, u32 rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
}

// Arrives once on an mbarrier of any CTA of the cluster (a shared::cluster address from
// mapa_shared). Relaxed: a consumer releases a stage that only wgmma (the async proxy) read,
// and wgmma.wait_group already completed those reads; there is no generic-proxy access for a
// release to order, and `.release.cluster` costs a GPU-wide MEMBAR before every arrive.
__device__ __forceinline__ void mbar_arrive_cluster(u32 cluster_bar) {
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];"
                 ::"r"(cluster_bar) : "memory");
}

// Four floats from shared memory of any CTA of the cluster (a shared::cluster address from
// mapa_shared; this CTA's own included).
__device__ __forceinline__ float4 ld_shared_cluster_f32x4(u32 cluster_addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_addr) : "memory");
    return v;
}

// ---- TMA multicast (PTX ISA 9.7.9.25.5.3) ------------------------------------------------

// Like tma_load_3d, but the box lands at the same CTA-relative offset `dst` in every CTA
// whose bit is set in `cta_mask`, and each of those CTAs' mbarrier at the offset of `bar`
// receives the complete-tx of the bytes written into it.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const TensorMap* map, u64* bar,
                                                      int c0, int c1, int c2,
                                                      unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;"
        ::"r"(smem_addr(dst)), "l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)),
          "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
        : "memory");
}

}  // namespace hopmm

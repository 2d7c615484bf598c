// Split-K reduction pieces (seed 001): the PTX wrappers for the bulk tensor reduce and the
// per-tile semaphore, and the epilogue that combines the partial sums of one output tile in a
// fixed order, so results are bitwise identical from run to run.
//
// Each consumer warpgroup owns 64 rows of the tile and has its own semaphore, so the two
// consumers of a CTA never wait for each other. For a (tile, consumer) reduced by S splits:
//   split 0        stages its fp32 partial, waits for semaphore == 0, TMA-stores it to the
//                  workspace, waits for the store to complete, releases the semaphore to 1;
//   split s < S-1  the same, but with cp.reduce.async.bulk .add (workspace += partial), after
//                  waiting for semaphore == s;
//   split S-1      waits for semaphore == S-1, reads the workspace (the ordered sum of splits
//                  0..S-2) into registers, adds its own accumulators, resets the semaphore to
//                  0 (no memset before the next launch) and stores the 16-bit result through
//                  the ordinary stmatrix + TMA-store epilogue.
// The fp32 additions therefore happen in the order ((p0 + p1) + p2) + ... + p(S-1) for every
// element, whatever the timing. (Each bulk-reduce element update is an atomic RN add of the
// incoming value to the workspace value; the order of those updates is fixed by the semaphore.)
//
// Memory ordering of the hand-off (global memory, written by the async proxy):
//   writer:  bulk store/reduce -> cp.async.bulk.commit_group -> cp.async.bulk.wait_group 0
//            (the writes are complete, not only the shared-memory source read) ->
//            fence.proxy.async.global (async-proxy writes before the generic release) ->
//            st.release.gpu semaphore
//   reader:  ld.acquire.gpu semaphore (one thread, polled with __nanosleep backoff) ->
//            fence.proxy.async.global (before its own async-proxy reduce) or a named barrier
//            (before the warpgroup's generic loads of the workspace, which bypass L1).
#pragma once
#include "epilogue_tma_store.cuh"
#include "partial_f32.cuh"

namespace hopmm {

// ---- PTX wrappers ------------------------------------------------------------------------

// workspace[box] += smem box, element by element (fp32 add, type from the tensor map).
__device__ __forceinline__ void tma_reduce_add_3d(const TensorMap* map, const void* src, int c0,
                                                  int c1, int c2) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3, %4}], [%1];"
        ::"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Orders this thread's global-memory accesses between the generic and the async proxy.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Polls until *sem == value (acquire, gpu scope), backing off between polls (ptx.cuh).
__device__ __forceinline__ void semaphore_wait(const u32* sem, u32 value) {
    Backoff backoff;
    while (ld_acquire_gpu(sem) != value) backoff.sleep();
}

// ---- epilogue ----------------------------------------------------------------------------

// Where a split's partial goes: the fp32 workspace (batch slot, padded rows, padded columns;
// described by map_w with boxes of 32 floats x 64 rows) and the semaphores of one launch
// (one per tile and consumer, zero between launches).
struct SplitKWorkspace {
    const TensorMap* map;
    const float* data;
    u32* semaphores;
    int row_pitch;     // floats per workspace row: tiles_n * kBlockN
    int slot_rows;     // rows per batch slot: tiles_m * kBlockM
};

template <class Cfg>
struct SplitKEpilogue {
    typedef TileShape<Cfg> S;
    typedef TmaStoreEpilogue<Cfg> Store;
    typedef PartialF32<Cfg> Partial;
    static_assert(Cfg::kSplitK, "the fp32 staging tile is sized by Cfg::kSplitK");
    static_assert(!Cfg::kOverlapStore, "one tile per CTA: the staging tile is written once");

    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store(float (&blocks)[ROW_BLOCKS][NREG],
                                                 const TensorMap* map_c,
                                                 const SharedStorage<Cfg>& smem,
                                                 const SplitKWorkspace& ws, int consumer,
                                                 int thread, int row0, int n0, int z) {
        static_assert(ROW_BLOCKS == 1, "split-K consumers share each tile, 64 rows each");
        float (&acc)[NREG] = blocks[0];
        const int splits = gridDim.y, split = blockIdx.y;
        if (splits == 1) {  // the plain kernel: no workspace, no semaphore
            Store::store(blocks, map_c, smem, consumer, thread, row0, n0, z);
            return;
        }
        const u32 barrier = kBarrierEpilogueBase + consumer;
        u32* sem = ws.semaphores + (blockIdx.z * gridDim.x + blockIdx.x) * S::kConsumers + consumer;
        // The workspace has the output's (padded) coordinates inside slot blockIdx.z (the
        // launch's batch index), so row0 / n0 address it directly.
        if (split < splits - 1) {
            unsigned char* tile = smem.c_tile(consumer);
            Partial::stage(acc, smem_addr(tile), thread);
            // Seed 004: every writing thread fences its generic writes for the async proxy,
            // unconditionally, before the barrier.
            fence_proxy_async_smem();
            named_barrier_sync(barrier, kWarpgroupThreads);
            if (thread == 0) {
                semaphore_wait(sem, split);
                fence_proxy_async_global();
#pragma unroll
                for (int box = 0; box < S::kBlockN / S::kF32BoxElems; ++box) {
                    const int col = n0 + box * S::kF32BoxElems;
                    if (split == 0)
                        tma_store_3d(ws.map, tile + box * S::kF32BoxBytes, col, row0, blockIdx.z);
                    else
                        tma_reduce_add_3d(ws.map, tile + box * S::kF32BoxBytes, col, row0,
                                          blockIdx.z);
                }
                bulk_commit_group();
                bulk_wait_group_0();  // the writes are done (not only the smem read: no .read)
                fence_proxy_async_global();
                st_release_gpu(sem, split + 1);
            }
        } else {
            if (thread == 0) semaphore_wait(sem, split);
            named_barrier_sync(barrier, kWarpgroupThreads);  // the acquire, for all 128 threads
            const float* base = ws.data + static_cast<size_t>(blockIdx.z) * ws.slot_rows * ws.row_pitch;
#pragma unroll
            for (int i = 0; i < NREG; i += 2) {
                float x, y;
                ld_global_cg_f32x2(base + static_cast<size_t>(row0 + Partial::acc_row(thread, i)) *
                                              ws.row_pitch + n0 + Partial::acc_col(thread, i),
                                   x, y);
                // workspace (splits 0..S-2 in order) + this split: the last addition.
                acc[i] = x + acc[i];
                acc[i + 1] = y + acc[i + 1];
            }
            // Every split of this (tile, consumer) has passed; the next launch finds 0.
            if (thread == 0) st_relaxed_gpu(sem, 0);
            Store::store(blocks, map_c, smem, consumer, thread, row0, n0, z);
        }
    }

    __device__ __forceinline__ static void finish(int thread) { Store::finish(thread); }
};

}  // namespace hopmm

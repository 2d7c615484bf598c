// Split-K reduced in parallel through an fp32 workspace (seed 001's ordered reduction, without
// the serial chain of hand-offs): for few output tiles and a long K, as many splits as there
// are SMs to fill. For a (tile, consumer) computed by S splits, each split's consumer:
//   1. stages its 64 x kBlockN fp32 partial (PartialF32) and TMA-stores it into its own slot
//      of the workspace (slot = batch slot * S + split), waits for the store to complete and
//      arrives on the tile's counter (release);
//   2. waits until all S splits have arrived (acquire): every partial is in the workspace;
//   3. reduces its share of the 64 rows, the 8-row groups g = split, split + S, ...
//      (ReducedGroups): each element the sum of the S partials in split order
//      ((p0 + p1) + p2) + ..., read from L2, converted to 16 bits and staged in the consumer's
//      epilogue memory (free again once its partial's store has completed);
//   4. TMA-stores its groups and departs from the counter; the last of the S departures
//      resets it to 0 for the next launch.
// The additions are those of split_k and split_k_cluster in the same order, so the three give
// bitwise the same result for a split count, identical from run to run.
//
// Waiting on other CTAs cannot deadlock: the host keeps tiles x splits x batch at most the SM
// count, one CTA per SM, so every CTA of the grid is resident at once on an idle GPU; SMs that
// other work holds are released when that work ends, which does not wait on this grid. A CTA
// waits only for CTAs of its own tile, none of which waits for anything it holds.
//
// Memory ordering, as in split_k_reduce.cuh: the partial's bulk store completes
// (cp.async.bulk.wait_group 0), fence.proxy.async.global orders it before the generic release
// (atom.release.gpu); the reader acquires (ld.acquire.gpu, one thread), then a named barrier
// hands the acquire to the warpgroup, whose loads (ld.global.cg) bypass L1.
#pragma once
#include "partial_f32.cuh"
#include "reduced_groups.cuh"
#include "split_k_reduce.cuh"

namespace hopmm {

// Polls until *counter >= value (acquire, gpu scope), backing off between polls (ptx.cuh).
__device__ __forceinline__ void counter_wait_at_least(const u32* counter, u32 value) {
    Backoff backoff;
    while (ld_acquire_gpu(counter) < value) backoff.sleep();
}

template <class Cfg>
struct SplitKParallelEpilogue {
    typedef TileShape<Cfg> S;
    typedef PartialF32<Cfg> Partial;
    static_assert(Cfg::kSplitK, "the fp32 partial is sized by Cfg::kSplitK");
    static_assert(!Cfg::kOverlapStore, "one tile per CTA: the partial is written once");
    typedef ReducedGroups<Cfg> Groups;
    static constexpr int kChunksPerThread = Groups::kChunksPerThread;

    // The groups a consumer may own (all of them with one split) are staged where its
    // partial was: that memory is free once the partial's store has completed.
    static_assert(Groups::kCount * Groups::kBytes <= S::kCBytesPerConsumer,
                  "the 16-bit groups fit in the consumer's epilogue memory");
    // 16-byte loads a thread keeps in flight (64 registers), dealt over its chunks: the
    // partials of one batch are loaded before any is added.
    static constexpr int kLoadsInFlight = 16;
    static constexpr int kLoadBatch = kLoadsInFlight / kChunksPerThread;
    static_assert(kLoadBatch >= 1, "at least one partial per batch");

    // Group `group` of the rows from `row0`: the sum over the `splits` workspace slots from
    // `slot0` in split order, staged at `out` (Groups::stage). A warp reads 512 contiguous
    // bytes of one row of a partial.
    __device__ __forceinline__ static void reduce_group(const SplitKWorkspace& ws, int slot0,
                                                        int splits, int row0, int n0, int group,
                                                        u32 out, int thread,
                                                        const EpilogueArgs& epilogue, int z) {
        const size_t slot_floats = static_cast<size_t>(ws.slot_rows) * ws.row_pitch;
        const float* base[kChunksPerThread];
        float4 sum[kChunksPerThread];
#pragma unroll
        for (int j = 0; j < kChunksPerThread; ++j) {
            const int row = group * Groups::kRows + Groups::chunk_row(thread, j);
            base[j] = ws.data + slot0 * slot_floats + static_cast<size_t>(row0 + row) * ws.row_pitch +
                      n0 + Groups::chunk_col(thread, j);
        }
        for (int s0 = 0; s0 < splits; s0 += kLoadBatch) {
            float4 p[kChunksPerThread][kLoadBatch];
#pragma unroll
            for (int j = 0; j < kChunksPerThread; ++j)  // every load of the batch in flight
#pragma unroll
                for (int b = 0; b < kLoadBatch; ++b)
                    if (s0 + b < splits) p[j][b] = ld_global_cg_f32x4(base[j] + (s0 + b) * slot_floats);
#pragma unroll
            for (int j = 0; j < kChunksPerThread; ++j) {
#pragma unroll
                for (int b = 0; b < kLoadBatch; ++b) {
                    if (s0 + b >= splits) continue;
                    if (s0 + b == 0) {
                        sum[j] = p[j][b];
                    } else {
                        sum[j].x += p[j][b].x;
                        sum[j].y += p[j][b].y;
                        sum[j].z += p[j][b].z;
                        sum[j].w += p[j][b].w;
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < kChunksPerThread; ++j) {
            // The fused epilogue chain on the tile's final values, before the rounding.
            const int row = Groups::chunk_row(thread, j);  // in the group
            Groups::stage(sum[j], out, row, Groups::chunk_col(thread, j), epilogue,
                          row0 + group * Groups::kRows + row, n0, z);
        }
    }

    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store(float (&blocks)[ROW_BLOCKS][NREG],
                                                 const TensorMap* map_c,
                                                 const SharedStorage<Cfg>& smem,
                                                 const SplitKWorkspace& ws, int consumer,
                                                 int thread, int row0, int n0, int z) {
        static_assert(ROW_BLOCKS == 1, "split-K consumers own 64 rows each");
        const int splits = gridDim.y, split = blockIdx.y;
        const u32 barrier = kBarrierEpilogueBase + consumer;
        u32* counter =
            ws.semaphores + (blockIdx.z * gridDim.x + blockIdx.x) * S::kConsumers + consumer;
        const int slot0 = blockIdx.z * splits;  // the workspace slot of split 0 of this batch slot
        unsigned char* tile = smem.c_tile(consumer);

        // 1. This split's partial into its slot, then the arrival.
        Partial::stage(blocks[0], smem_addr(tile), thread);
        // Seed 004: every writing thread fences its generic writes for the async proxy,
        // unconditionally, before the barrier.
        fence_proxy_async_smem();
        named_barrier_sync(barrier, kWarpgroupThreads);
        if (thread == 0) {
#pragma unroll
            for (int box = 0; box < S::kBlockN / S::kF32BoxElems; ++box)
                tma_store_3d(ws.map, tile + box * S::kF32BoxBytes, n0 + box * S::kF32BoxElems,
                             row0, slot0 + split);
            bulk_commit_group();
            bulk_wait_group_0();  // the writes are done (and the staging memory read)
            fence_proxy_async_global();
            atomic_add_release_gpu(counter, 1);
            // 2. Every split's partial is in the workspace.
            counter_wait_at_least(counter, splits);
        }
        named_barrier_sync(barrier, kWarpgroupThreads);  // the acquire, for all 128 threads

        // 3. This split's groups, staged where the partial was.
        int groups = 0;
        for (int g = split; g < Groups::kCount; g += splits, ++groups)
            reduce_group(ws, slot0, splits, row0, n0, g, smem_addr(tile + groups * Groups::kBytes),
                         thread, smem.epilogue, z);

        // 4. Seed 004 again, then one thread stores the groups and departs.
        fence_proxy_async_smem();
        named_barrier_sync(barrier, kWarpgroupThreads);
        if (thread == 0) {
            Groups::store(map_c, tile, groups, split, splits, row0, n0, z);
            // The workspace reads of this consumer are done (their values are staged): the
            // last of the S departures leaves the counter at zero for the next launch.
            if (atomic_add_relaxed_gpu(counter, 1) == 2 * static_cast<u32>(splits) - 1)
                st_relaxed_gpu(counter, 0);
        }
    }

    __device__ __forceinline__ static void finish(int thread) {
        if (thread == 0) bulk_wait_group_0();
    }
};

}  // namespace hopmm

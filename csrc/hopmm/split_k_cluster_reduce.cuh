// Split-K reduced inside a thread-block cluster (seed 001's ordered reduction, without a
// workspace or a semaphore): the `splits` CTAs that share an output tile form one cluster
// (shape 1 x splits x 1 over a grid of splits rows, given at launch, so that cluster rank =
// blockIdx.y = split; store() traps on any other shape), which the hardware schedules all at
// once, so they may wait for one another. Each consumer warpgroup:
//   1. stages its 64 x kBlockN fp32 partial in its own CTA's shared memory (PartialF32);
//   2. cluster barrier: every split's partial is written and visible cluster-wide;
//   3. reduces its share of its 64 rows, the 8-row groups g = rank, rank + splits, ...
//      (ReducedGroups): reads each group from every split's partial through distributed
//      shared memory, adds the partials in split order ((p0 + p1) + p2) + ..., converts to 16
//      bits and stages the rows in the CTA's operand ring (which every main loop of the CTA
//      has finished with: they all came to the barrier of step 2);
//   4. arrives on the cluster barrier (its reads of the peers are done), TMA-stores its groups
//      and, in finish(), waits on that barrier:
//      no CTA exits while a peer may still read its shared memory.
// The fp32 additions are the serial split-K epilogue's, in the same order, so results are
// bitwise those of split_k with as many splits, and identical from run to run. The reduction
// is spread over the splits' SMs, each reading (splits - 1) / splits of a partial from its
// peers, instead of a chain of hand-offs through L2 (bench/NOTES.md v0.12).
#pragma once
#include "partial_f32.cuh"
#include "reduced_groups.cuh"

namespace hopmm {

// The most CTAs in a portable cluster: the most splits this epilogue reduces.
constexpr int kMaxClusterSplits = 8;

template <class Cfg>
struct SplitKClusterEpilogue {
    typedef TileShape<Cfg> S;
    typedef PartialF32<Cfg> Partial;
    static_assert(Cfg::kSplitK, "the fp32 partial is sized by Cfg::kSplitK");
    static_assert(!Cfg::kOverlapStore, "one tile per CTA: the partial is written once");
    typedef ReducedGroups<Cfg> Groups;

    // A consumer stages at most all of its groups (one split: it owns them all).
    static constexpr u32 kOutBytesPerConsumer = Groups::kCount * Groups::kBytes;
    static_assert(S::kConsumers * kOutBytesPerConsumer <= S::kStages * S::kStageBytes,
                  "the 16-bit result is staged in the operand ring");

    // Group `group` of the consumer's rows: the sum over the splits' partials (each at the
    // shared::cta address `partial` of its CTA), in split order, staged at `out`
    // (Groups::stage). A warp reads one row's 512 bytes of a partial and writes its 256 bytes
    // of result. The fused epilogue chain is applied to each sum (rows from `row0`, columns
    // from `n0`, batch slice z) before it is rounded: these are the tile's final values.
    __device__ __forceinline__ static void reduce_group(u32 partial, u32 out, int group,
                                                        int splits, int thread,
                                                        const EpilogueArgs& epilogue, int row0,
                                                        int n0, int z) {
#pragma unroll
        for (int j = 0; j < Groups::kChunksPerThread; ++j) {
            const int row = Groups::chunk_row(thread, j), col = Groups::chunk_col(thread, j);
            const u32 local = partial + Partial::offset(group * Groups::kRows + row, col);
            float4 p[kMaxClusterSplits];
#pragma unroll
            for (int s = 0; s < kMaxClusterSplits; ++s)  // all loads in flight at once
                if (s < splits) p[s] = ld_shared_cluster_f32x4(mapa_shared(local, s));
            float4 sum = p[0];
#pragma unroll
            for (int s = 1; s < kMaxClusterSplits; ++s) {
                if (s < splits) {
                    sum.x += p[s].x;
                    sum.y += p[s].y;
                    sum.z += p[s].z;
                    sum.w += p[s].w;
                }
            }
            Groups::stage(sum, out, row, col, epilogue, row0 + group * Groups::kRows + row, n0,
                          z);
        }
    }

    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store(float (&blocks)[ROW_BLOCKS][NREG],
                                                 const TensorMap* map_c,
                                                 const SharedStorage<Cfg>& smem, int consumer,
                                                 int thread, int row0, int n0, int z) {
        static_assert(ROW_BLOCKS == 1, "split-K consumers share each tile, 64 rows each");
        const int splits = static_cast<int>(cluster_nctarank());
        const int rank = static_cast<int>(cluster_ctarank());
        // The host launches clusters of 1 x gridDim.y x 1, at most kMaxClusterSplits
        // (SplitKClusterSchedule): the cluster is exactly the splits of this tile, and the rank
        // is the split whose k-slice this CTA computed. Anything else would reduce wrong.
        if (splits > kMaxClusterSplits || splits != static_cast<int>(gridDim.y) ||
            rank != static_cast<int>(blockIdx.y))
            __trap();
        const u32 partial = smem_addr(smem.c_tile(consumer));
        Partial::stage(blocks[0], partial, thread);
        cluster_arrive();
        cluster_wait();  // every split's partial is in place

        unsigned char* out = smem.a_tile(0) + consumer * kOutBytesPerConsumer;
        int groups = 0;
        for (int g = rank; g < Groups::kCount; g += splits, ++groups)
            reduce_group(partial, smem_addr(out + groups * Groups::kBytes), g, splits, thread,
                         smem.epilogue, row0, n0, z);
        // Done reading the peers' partials (their values are in this CTA's staging boxes, so
        // the loads have completed): nothing to release. finish() waits.
        cluster_arrive_relaxed();

        // Seed 004: every writing thread fences, unconditionally, before the barrier.
        fence_proxy_async_smem();
        named_barrier_sync(kBarrierEpilogueBase + consumer, kWarpgroupThreads);
        if (thread == 0) Groups::store(map_c, out, groups, rank, splits, row0, n0, z);
    }

    // Before a consumer's threads exit: the stores are complete, and every peer is done
    // reading this CTA's partials.
    __device__ __forceinline__ static void finish(int thread) {
        if (thread == 0) bulk_wait_group_0();
        cluster_wait();
    }

    // The producer warpgroup's part: every thread of the cluster takes part in both barriers.
    // The producer wrote nothing a peer reads (its TMA loads land in this CTA only).
    __device__ __forceinline__ static void producer_join() {
        cluster_arrive_relaxed();
        cluster_wait();
        cluster_arrive_relaxed();
        cluster_wait();
    }
};

}  // namespace hopmm

// Kernel skeleton: the persistent warp-specialized kernel (kernel_persistent.cuh) in
// thread-block clusters of kClusterSize CTAs along x (the entry point carries
// __cluster_dims__). The CTAs of a cluster compute vertically adjacent output tiles that share
// one B tile: CTA `rank` of the cluster takes M tile kClusterSize * pair_m + rank. B is the
// operand worth sharing: with 128 x 256 tiles it is the larger one (256 rows against A's
// 128), so multicasting it halves the bigger part of the L2 -> SM traffic.
//
// The cluster walks groups of kClusterSize tiles ("pairs" for a cluster of two) in the grouped
// raster's order, pair p = cluster id, + number of clusters, ...; both CTAs iterate over the
// same pairs, so they run the same number of k-blocks through the same stage ring (their
// barriers are coupled through the multicast). A CTA whose tile lies past the last M tile (an
// odd number of M tiles) still loads and takes part in every barrier, but stores nothing.
//
// Cluster lifetime: the mbarriers are initialised and published cluster-wide (fence in
// setup_shared_storage, then a cluster barrier) before any peer may arrive on them or
// multicast into this CTA, and no CTA exits before the peers are done with its shared
// memory (a second cluster barrier at the end).
#pragma once
#include "kernel_persistent.cuh"

namespace hopmm {

// The raster over pairs: ceil(tiles_m / kClusterSize) rows of pairs by tiles_n columns, and a
// raster group of `group` M tiles is group / kClusterSize rows of pairs (rounded up), so the
// wave footprint in L2 matches the unclustered kernel's.
template <int CLUSTER>
__device__ __forceinline__ GroupedRaster cluster_raster(GroupedRaster tiles) {
    return GroupedRaster{(tiles.tiles_m + CLUSTER - 1) / CLUSTER, tiles.tiles_n,
                         (tiles.group + CLUSTER - 1) / CLUSTER, tiles.m, tiles.n};
}

// The tiles one CTA of a cluster computes: the cluster walks pairs p = first(), first() +
// stride(), ... below `end`; this CTA takes M tile kClusterSize * pair_m + rank of each, and
// stores it only where that tile lies in C (an odd number of M tiles leaves the last CTA of the
// last pair row without a tile of its own).
template <int CLUSTER>
struct ClusterTileWalk {
    GroupedRaster pairs;  // cluster_raster() of the tile raster
    int batch_offset;
    int end;              // pairs of every batch slice of the launch
    int rank;
    int tiles_m;
    __device__ __forceinline__ int first() const { return cluster_id_x(); }
    __device__ __forceinline__ int stride() const { return cluster_count_x(); }
    __device__ __forceinline__ TileCoord coord(int p) const {
        TileCoord c = pairs.batched(p, batch_offset);
        c.m_tile = c.m_tile * CLUSTER + rank;
        return c;
    }
    __device__ __forceinline__ bool stores(const TileCoord& c) const { return c.m_tile < tiles_m; }
};

// What the cluster skeletons share: shared memory and barriers published cluster-wide, the
// producer's walk over this CTA's tiles of the pairs, setmaxnreg, and the final cluster barrier.
// `consumer_side(smem, consumer, thread, num_k_blocks, walk)` is the skeleton's own part, run by
// each consumer warpgroup (it ends with Epilogue::finish).
template <class Cfg, class Producer, class ConsumerSide>
__device__ __forceinline__ void run_persistent_cluster(const TensorMap* map_a,
                                                       const TensorMap* map_b,
                                                       const TensorMap* map_c, int k,
                                                       int batch_offset, int batch_count,
                                                       BatchMap batch_a, BatchMap batch_b,
                                                       GroupedRaster raster,
                                                       const ConsumerSide& consumer_side,
    const EpilogueArgs& epilogue) {
    typedef TileShape<Cfg> S;
    static_assert(Cfg::kOverlapStore, "a persistent kernel overlaps its stores");
    static_assert(S::kClusterSize > 1, "a cluster kernel");
    extern __shared__ unsigned char smem_raw[];
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const SharedStorage<Cfg> smem = setup_shared_storage<Cfg>(smem_raw, map_a, map_b, map_c, epilogue);
    // Peers arrive on this CTA's empty barriers and multicast into its full barriers: their
    // initialisation (fence.mbarrier_init.release.cluster) must be visible cluster-wide first.
    cluster_sync();

    const int rank = static_cast<int>(cluster_ctarank());
    const GroupedRaster pairs = cluster_raster<S::kClusterSize>(raster);
    const ClusterTileWalk<S::kClusterSize> walk{pairs, batch_offset,
                                                pairs.per_slice() * batch_count, rank,
                                                raster.tiles_m};
    const int num_k_blocks = S::k_blocks(k);

    if (warpgroup == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (thread == 0) {
            int ring = 0;
            for (int p = walk.first(); p < walk.end; p += walk.stride()) {
                const TileCoord c = walk.coord(p);
                Producer::load_tile(map_a, map_b, smem, rank, c.m_tile * S::kBlockM,
                                    c.n_tile * S::kBlockN, batch_a(c.z), batch_b(c.z),
                                    num_k_blocks, ring);
            }
        }
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        consumer_side(smem, warpgroup - 1, thread, num_k_blocks, walk);
    }
    // A peer may still arrive on this CTA's empty barriers (its consumers' last releases)
    // after this CTA's own work is done: stay until every thread of the cluster got here.
    cluster_sync();
}

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void persistent_cluster_gemm(const TensorMap* map_a,
                                                        const TensorMap* map_b,
                                                        const TensorMap* map_c, int k,
                                                        int batch_offset, int batch_count,
                                                        BatchMap batch_a, BatchMap batch_b,
                                                        GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    run_persistent_cluster<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const ClusterTileWalk<S::kClusterSize>& walk) {
            persistent_consumer<Cfg, Consumer, Epilogue>(smem, map_c, consumer, thread,
                                                         num_k_blocks, walk);
        }, epilogue);
}

}  // namespace hopmm

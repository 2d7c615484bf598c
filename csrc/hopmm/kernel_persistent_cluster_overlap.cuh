// Kernel skeleton: the cluster kernel (kernel_persistent_cluster.cuh: pairs of CTAs on vertically
// adjacent tiles, B multicast) with the consumers of kernel_persistent_overlap.cuh (two
// accumulator sets, each tile's epilogue under the next tile's first k-block). Both CTAs of a
// cluster walk the same pairs, so they still run the same k-blocks through their coupled stage
// rings; a CTA without a tile of its own in a pair computes it and skips only the store.
#pragma once
#include "kernel_persistent_cluster.cuh"
#include "kernel_persistent_overlap.cuh"

namespace hopmm {

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void persistent_cluster_overlap_gemm(const TensorMap* map_a,
                                                                const TensorMap* map_b,
                                                                const TensorMap* map_c, int k,
                                                                int batch_offset,
                                                                int batch_count,
                                                                BatchMap batch_a,
                                                                BatchMap batch_b,
                                                                GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    run_persistent_cluster<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const ClusterTileWalk<S::kClusterSize>& walk) {
            overlapped_consumer<Cfg, Consumer, Epilogue>(smem, map_c, consumer, thread,
                                                         num_k_blocks, walk);
        }, epilogue);
}

}  // namespace hopmm

// Kernel skeleton: split-K in thread-block clusters. Grid (tiles, splits, batch) as the
// split_k skeleton's (kernel_split_k.cuh), launched in clusters of 1 x splits x 1: the splits
// of one output tile are one cluster, and the epilogue (split_k_cluster_reduce.cuh) adds their
// partials through distributed shared memory. Nothing waits across clusters, so the grid may
// hold any number of tiles; it holds no workspace and no semaphore either.
#pragma once
#include "kernel_warp_specialized.cuh"
#include "split_k_cluster_reduce.cuh"

namespace hopmm {

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void split_k_cluster_gemm(const TensorMap* map_a,
                                                     const TensorMap* map_b,
                                                     const TensorMap* map_c, int k,
                                                     int batch_offset,
                                                     int /*batch_count: gridDim.z*/,
                                                     BatchMap batch_a, BatchMap batch_b,
                                                     GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    run_one_tile<Cfg, Producer, Consumer>(
        map_a, map_b, map_c, batch_offset, batch_a, batch_b, raster, epilogue,
        [&] { return k_slice(S::k_blocks(k), gridDim.y, blockIdx.y); }, [] {},
        [] { Epilogue::producer_join(); }, store_through<Cfg, Consumer, Epilogue>(map_c));
}

}  // namespace hopmm

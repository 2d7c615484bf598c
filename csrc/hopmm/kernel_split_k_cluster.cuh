// Kernel skeleton: split-K in thread-block clusters. Grid (tiles, splits, batch) as the
// split_k skeleton's (kernel_split_k.cuh), launched in clusters of 1 x splits x 1: the splits
// of one output tile are one cluster, and the epilogue (split_k_cluster_reduce.cuh) adds their
// partials through distributed shared memory. Nothing waits across clusters, so the grid may
// hold any number of tiles; it holds no workspace and no semaphore either.
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"
#include "k_slice.cuh"
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
    extern __shared__ unsigned char smem_raw[];
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const SharedStorage<Cfg> smem = setup_shared_storage<Cfg>(smem_raw, map_a, map_b, map_c, epilogue);

    const TileCoord tile = raster.block_tile(batch_offset);
    const int m0 = tile.m_tile * S::kBlockM, n0 = tile.n_tile * S::kBlockN, z = tile.z;
    const KSlice slice = k_slice(S::k_blocks(k), gridDim.y, blockIdx.y);
    int ring = 0;

    if (warpgroup == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (thread == 0) {
            Producer::load_tile(map_a, map_b, smem, m0, n0, raster.m - m0, raster.n - n0,
                                batch_a(z), batch_b(z), slice.count, ring, slice.first);
            grid_launch_dependents();  // the last load is issued
        }
        Epilogue::producer_join();
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        const int consumer = warpgroup - 1;
        Consumer consumer_state;
        prefetch_epilogue_operands(smem, thread, m0 + consumer * S::kWgmmaM, n0, z);
        consumer_state.mainloop(smem, consumer, slice.count, ring, thread == 0);
        Epilogue::store(consumer_state.acc, map_c, smem, consumer, thread,
                        m0 + consumer * S::kWgmmaM, n0, z);
        Epilogue::finish(thread);
    }
}

}  // namespace hopmm

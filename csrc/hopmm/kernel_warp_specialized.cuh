// Kernel skeleton: warp-specialized, one output tile per CTA, tiles visited in the raster's
// order (blockIdx.x is the linear tile index, blockIdx.z the batch). Warpgroup 0 is the producer
// (setmaxnreg.dec), warpgroups 1..kConsumers are consumers (setmaxnreg.inc); the slots
// Producer / Consumer / Epilogue are filled by the schedule that renders the kernel.
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"

namespace hopmm {

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void warp_specialized_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                                      const TensorMap* map_c, int k,
                                                      int batch_offset, int /*batch_count: gridDim.z*/,
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
    const int num_k_blocks = S::k_blocks(k);
    int ring = 0;

    if (warpgroup == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (thread == 0) {
            Producer::load_tile(map_a, map_b, smem, m0, n0, raster.m - m0, raster.n - n0,
                                batch_a(z), batch_b(z), num_k_blocks, ring);
            grid_launch_dependents();  // the last load is issued
        }
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        const int consumer = warpgroup - 1;
        Consumer consumer_state;
        prefetch_epilogue_operands(smem, thread, m0 + consumer * S::kWgmmaM, n0, z);
        consumer_state.mainloop(smem, consumer, num_k_blocks, ring, thread == 0);
        Epilogue::store(consumer_state.acc, map_c, smem, consumer, thread,
                        m0 + consumer * S::kWgmmaM, n0, z);
        Epilogue::finish(thread);
    }
}

}  // namespace hopmm

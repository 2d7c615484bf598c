// Kernel skeleton: split-K, warp-specialized, one (tile, k-slice) per CTA. Grid (tiles, splits,
// batch): blockIdx.x is the linear tile index (the raster's order), blockIdx.y the split,
// blockIdx.z the batch slot of this launch. Split s multiplies the k-blocks k_slice gives it
// (k_slice.cuh). The partials are combined by SplitKEpilogue in split order
// (split_k_reduce.cuh); with gridDim.y == 1 this is the plain one-tile-per-CTA kernel.
//
// Co-residency (why waiting on another CTA cannot deadlock): split s waits only for split
// s - 1 of the same tile and batch slot, which has the same blockIdx.x and .z and a smaller
// blockIdx.y, hence a smaller linear block index. (1) The host caps tiles * splits * batch at
// the SM count and the kernel takes one CTA per SM (__launch_bounds__(.., 1) and more than half
// of the SM's shared memory), so on an otherwise idle GPU every CTA of the grid is resident at
// once and each predecessor is running. (2) When other work holds SMs (another stream), CTAs
// are dispatched in increasing linear index order, so a resident waiter's predecessor was
// dispatched earlier: it is resident or finished, never queued behind the waiter. A waiter
// never holds anything its predecessor needs (no shared resource but the SM it sits on).
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"
#include "k_slice.cuh"
#include "split_k_reduce.cuh"

namespace hopmm {

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void split_k_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                             const TensorMap* map_c, const TensorMap* map_w,
                                             const float* workspace, u32* semaphores, int k,
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
    const KSlice slice = k_slice(S::k_blocks(k), gridDim.y, blockIdx.y);
    int ring = 0;

    if (warpgroup == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if (thread == 0) {
            if (gridDim.y > 1) tma_prefetch_map(map_w);
            Producer::load_tile(map_a, map_b, smem, m0, n0, raster.m - m0, raster.n - n0,
                                batch_a(z), batch_b(z), slice.count, ring, slice.first);
            grid_launch_dependents();  // the last load is issued
        }
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        const int consumer = warpgroup - 1;
        Consumer consumer_state;
        prefetch_epilogue_operands(smem, thread, m0 + consumer * S::kWgmmaM, n0, z);
        consumer_state.mainloop(smem, consumer, slice.count, ring, thread == 0);
        const SplitKWorkspace ws{map_w, workspace, semaphores, raster.tiles_n * S::kBlockN,
                                 raster.tiles_m * S::kBlockM};
        Epilogue::store(consumer_state.acc, map_c, smem, ws, consumer, thread,
                        m0 + consumer * S::kWgmmaM, n0, z);
        Epilogue::finish(thread);
    }
}

}  // namespace hopmm

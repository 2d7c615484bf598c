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
#include "kernel_warp_specialized.cuh"
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
    run_one_tile<Cfg, Producer, Consumer>(
        map_a, map_b, map_c, batch_offset, batch_a, batch_b, raster, epilogue,
        [&] { return k_slice(S::k_blocks(k), gridDim.y, blockIdx.y); },
        [&] { if (gridDim.y > 1) tma_prefetch_map(map_w); }, [] {},
        [&](Consumer& state, const SharedStorage<Cfg>& smem, int consumer, int thread, int row0,
            int n0, int z) {
            const SplitKWorkspace ws{map_w, workspace, semaphores, raster.tiles_n * S::kBlockN,
                                     raster.tiles_m * S::kBlockM};
            Epilogue::store(state.acc, map_c, smem, ws, consumer, thread, row0, n0, z);
            Epilogue::finish(thread);
        });
}

}  // namespace hopmm

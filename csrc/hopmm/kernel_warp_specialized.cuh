// Kernel skeleton: warp-specialized, one output tile per CTA, tiles visited in the raster's
// order (blockIdx.x is the linear tile index, blockIdx.z the batch). Warpgroup 0 is the producer
// (setmaxnreg.dec), warpgroups 1..kConsumers are consumers (setmaxnreg.inc); the slots
// Producer / Consumer / Epilogue are filled by the schedule that renders the kernel.
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"
#include "k_slice.cuh"

namespace hopmm {

// What the one-tile skeletons share (this one; split-K's, whose CTAs take a slice of the
// tile's k-blocks each): the CTA's tile and k-blocks (`slice_of()`), the producer's loads and
// the consumers' main loop. `before_loads()` runs on the producer's elected thread before its
// loads, `producer_done()` on the whole producer warpgroup after them, and `store(state, smem,
// consumer, thread, row0, n0, z)` is each consumer's epilogue, Epilogue::finish included.
template <class Cfg, class Producer, class Consumer, class SliceOf, class BeforeLoads,
          class ProducerDone, class Store>
__device__ __forceinline__ void run_one_tile(const TensorMap* map_a, const TensorMap* map_b,
                                             const TensorMap* map_c, int batch_offset,
                                             BatchMap batch_a, BatchMap batch_b,
                                             GroupedRaster raster, const EpilogueArgs& epilogue,
                                             const SliceOf& slice_of,
                                             const BeforeLoads& before_loads,
                                             const ProducerDone& producer_done,
                                             const Store& store) {
    typedef TileShape<Cfg> S;
    extern __shared__ unsigned char smem_raw[];
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const SharedStorage<Cfg> smem = setup_shared_storage<Cfg>(smem_raw, map_a, map_b, map_c, epilogue);

    const TileCoord tile = raster.block_tile(batch_offset);
    const int m0 = tile.m_tile * S::kBlockM, n0 = tile.n_tile * S::kBlockN, z = tile.z;
    const KSlice slice = slice_of();
    int ring = 0;

    if (warpgroup == 0) {
        setmaxnreg_dec<kProducerRegs>();
        if constexpr (S::kPhased) {   // warps 2-3 shift phased raw stages into the tiles
            if (is_fixup_thread<Cfg>(thread))
                PhasedFixup<Cfg>::run(smem, fixup_index<Cfg>(thread), slice.count);
        }
        if (thread == 0) {
            before_loads();
            Producer::load_tile(map_a, map_b, smem, m0, n0, raster.m - m0, raster.n - n0,
                                batch_a(z), batch_b(z), slice.count, ring, slice.first);
        }
        producer_done();
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        const int consumer = warpgroup - 1;
        Consumer consumer_state;
        prefetch_epilogue_operands(smem, thread, m0 + consumer * S::kWgmmaM, n0, z);
        consumer_state.mainloop(smem, consumer, slice.count, ring, thread == 0);
        store(consumer_state, smem, consumer, thread, m0 + consumer * S::kWgmmaM, n0, z);
    }
}

// run_one_tile's `store` for epilogues that write the tile through map_c alone (no split-K
// workspace).
template <class Cfg, class Consumer, class Epilogue>
__device__ __forceinline__ auto store_through(const TensorMap* map_c) {
    return [map_c](Consumer& state, const SharedStorage<Cfg>& smem, int consumer, int thread,
                   int row0, int n0, int z) {
        Epilogue::store(state.acc, map_c, smem, consumer, thread, row0, n0, z);
        Epilogue::finish(thread);
    };
}

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void warp_specialized_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                                      const TensorMap* map_c, int k,
                                                      int batch_offset, int /*batch_count: gridDim.z*/,
                                                      BatchMap batch_a, BatchMap batch_b,
                                                      GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    run_one_tile<Cfg, Producer, Consumer>(
        map_a, map_b, map_c, batch_offset, batch_a, batch_b, raster, epilogue,
        [&] { return KSlice{0, S::k_blocks(k)}; }, [] {}, [] {},
        store_through<Cfg, Consumer, Epilogue>(map_c));
}

}  // namespace hopmm

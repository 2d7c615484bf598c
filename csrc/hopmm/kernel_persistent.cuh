// Kernel skeleton: persistent and warp-specialized (seed 003). At most one CTA per SM walks
// the output tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... (batch slice after batch slice,
// each slice in the raster's order). The producer warpgroup runs its own tile x k-block loop
// and is limited only by free stages, so the next tile's loads overlap this tile's epilogue;
// the consumer warpgroups run theirs over the same tile sequence. The stage ring and its
// mbarrier phases carry across tiles.
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"

namespace hopmm {

// The tiles one CTA of a persistent grid computes: t = first(), first() + stride(), ... below
// `end`; coord(t) is the tile, stores(c) whether it lies in C. The producer and the consumers
// walk the same sequence (kernel_persistent_cluster.cuh has the walk of a CTA in a cluster).
struct CtaTileWalk {
    GroupedRaster raster;
    int batch_offset;
    int end;  // tiles of every batch slice of the launch
    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int stride() const { return gridDim.x; }
    __device__ __forceinline__ TileCoord coord(int t) const {
        return raster.batched(t, batch_offset);
    }
    __device__ __forceinline__ bool stores(const TileCoord&) const { return true; }
};

// The producer warpgroup of a persistent kernel: one thread loads the CTA's tiles in order
// through the stage ring, limited only by free stages (map_b2: a second B, kernel_dual_b.cuh).
template <class Cfg, class Producer>
__device__ __forceinline__ void persistent_producer(const TensorMap* map_a, const TensorMap* map_b,
                                                    const SharedStorage<Cfg>& smem, int thread,
                                                    int num_k_blocks, BatchMap batch_a,
                                                    BatchMap batch_b, const CtaTileWalk& walk,
                                                    const TensorMap* map_b2 = nullptr) {
    typedef TileShape<Cfg> S;
    setmaxnreg_dec<kProducerRegs>();
    if constexpr (S::kPhased) {   // warps 2-3 shift phased raw stages into the tiles
        if (is_fixup_thread<Cfg>(thread)) {
            int tiles = 0;
            for (int t = walk.first(); t < walk.end; t += walk.stride()) ++tiles;
            PhasedFixup<Cfg>::run(smem, fixup_index<Cfg>(thread), tiles * num_k_blocks);
            return;
        }
    }
    if (thread != 0) return;
    int ring = 0;
    for (int t = walk.first(); t < walk.end; t += walk.stride()) {
        const TileCoord c = walk.coord(t);
        const int m0 = c.m_tile * S::kBlockM, n0 = c.n_tile * S::kBlockN;
        Producer::load_tile(map_a, map_b, smem, m0, n0, walk.raster.m - m0, walk.raster.n - n0,
                            batch_a(c.z), batch_b(c.z), num_k_blocks, ring, 0, map_b2);
    }
}

// What every persistent skeleton shares: the shared-memory setup, the producer warpgroup's tile
// walk, and setmaxnreg.inc for the consumers. `consumer_side(smem, consumer, thread,
// num_k_blocks, walk)` is the skeleton's own part, run by each consumer warpgroup (it ends with
// Epilogue::finish). `map_b2`: the second B of a stage of two (kernel_dual_b.cuh).
template <class Cfg, class Producer, class ConsumerSide>
__device__ __forceinline__ void run_persistent(const TensorMap* map_a, const TensorMap* map_b,
                                               const TensorMap* map_c, int k, int batch_offset,
                                               int batch_count, BatchMap batch_a,
                                               BatchMap batch_b, GroupedRaster raster,
                                               const ConsumerSide& consumer_side,
    const EpilogueArgs& epilogue, const TensorMap* map_b2 = nullptr) {
    typedef TileShape<Cfg> S;
    static_assert(Cfg::kOverlapStore, "a persistent kernel overlaps its stores");
    extern __shared__ unsigned char smem_raw[];
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const SharedStorage<Cfg> smem = setup_shared_storage<Cfg>(smem_raw, map_a, map_b, map_c, epilogue);

    const CtaTileWalk walk{raster, batch_offset, raster.per_slice() * batch_count};
    const int num_k_blocks = S::k_blocks(k);

    if (warpgroup == 0) {
        persistent_producer<Cfg, Producer>(map_a, map_b, smem, thread, num_k_blocks, batch_a,
                                           batch_b, walk, map_b2);
    } else {
        setmaxnreg_inc<S::kConsumerRegs>();
        consumer_side(smem, warpgroup - 1, thread, num_k_blocks, walk);
    }
}

// A consumer warpgroup's side of the single-accumulator-set persistent kernels, over any tile
// walk: each tile's main loop, then its epilogue; ends with Epilogue::finish.
template <class Cfg, class Consumer, class Epilogue, class Walk>
__device__ __forceinline__ void persistent_consumer(const SharedStorage<Cfg>& smem,
                                                    const TensorMap* map_c, int consumer,
                                                    int thread, int num_k_blocks,
                                                    const Walk& walk) {
    typedef TileShape<Cfg> S;
    Consumer consumer_state;
    int ring = 0;
    for (int t = walk.first(); t < walk.end; t += walk.stride()) {
        const TileCoord c = walk.coord(t);
        const int row0 = c.m_tile * S::kBlockM + consumer * S::kWgmmaM;
        if (walk.stores(c))
            prefetch_epilogue_operands(smem, thread, row0, c.n_tile * S::kBlockN, c.z);
        consumer_state.mainloop(smem, consumer, num_k_blocks, ring, thread == 0);
        // A tile below the last row of C (a cluster's spare CTA) is computed, not stored: the
        // branch is uniform over the CTA, and the epilogue's barriers are per consumer.
        if (walk.stores(c))
            Epilogue::store(consumer_state.acc, map_c, smem, consumer, thread, row0,
                            c.n_tile * S::kBlockN, c.z);
    }
    Epilogue::finish(thread);
}

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void persistent_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                                const TensorMap* map_c, int k, int batch_offset,
                                                int batch_count, BatchMap batch_a,
                                                BatchMap batch_b, GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    run_persistent<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const CtaTileWalk& walk) {
            persistent_consumer<Cfg, Consumer, Epilogue>(smem, map_c, consumer, thread,
                                                         num_k_blocks, walk);
        }, epilogue);
}

}  // namespace hopmm

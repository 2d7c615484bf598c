// Kernel skeleton: the persistent kernel (kernel_persistent.cuh) with two accumulator sets
// per consumer, so that a tile's epilogue runs while the tensor cores already work on the next
// tile. The consumers alternate between the sets tile by tile; at the start of each tile they
// issue its first k-block into one set, then wait for the previous tile's last k-block (one
// wgmma group behind) and store the previous tile from the other set while that first k-block
// executes. In the single-set kernel the tensor cores idle from the last wgmma of a tile until
// its epilogue is done (measured on an H100: this kernel ran 8192 x 8192 x 1024, 16 k-blocks a
// tile, 9 % faster, and 8192³ 2 %).
//
// Two sets of kRowBlocks x kAccRegs registers must fit a consumer's kConsumerRegs beside the
// addressing and the epilogue: 2 x 96 for 64 x 192 per consumer, not 2 x 128 (64 x 256).
// The producer side and the stage ring are those of kernel_persistent.cuh; the consumers'
// side (overlapped_consumer) takes any tile walk, so that kernel_persistent_cluster_overlap.cuh
// runs it in clusters.
#pragma once
#include "kernel_persistent.cuh"

namespace hopmm {

// Registers a consumer thread keeps beside its two accumulator sets (addressing, the
// epilogue's conversions). Too few for the L2 prefetch of c the single-set kernels make
// (epilogue_tma_store.cuh): it spilled here.
constexpr int kConsumerWorkingRegs = 40;

template <class Cfg, class Consumer, class Epilogue, class Walk>
struct OverlappedTiles {
    typedef TileShape<Cfg> S;
    const SharedStorage<Cfg>& smem;
    const TensorMap* map_c;
    const Walk& walk;
    int consumer;
    int thread;
    int num_k_blocks;

    // Called after the wgmma wait that covers `done`: skipping it (a tile below the last row
    // of C, uniform over the CTA) leaves no wgmma path around a wait.
    __device__ __forceinline__ void store(Consumer& done, const TileCoord& c) const {
        if (!walk.stores(c)) return;
        Epilogue::store(done.acc, map_c, smem, consumer, thread,
                        c.m_tile * S::kBlockM + consumer * S::kWgmmaM, c.n_tile * S::kBlockN,
                        c.z);
    }

    // The k-blocks of one tile into `cur`; when `prev` holds a finished tile (`has_prev`, at
    // `prev_c`), its epilogue runs after cur's first k-block is issued. `prev_stage` is the
    // stage of the last issued k-block, released once a later wait shows its group complete
    // (-1: none).
    __device__ __forceinline__ void tile(Consumer& cur, Consumer& prev, bool has_prev,
                                         TileCoord prev_c, int& ring, int& prev_stage) const {
        const int row0 = S::consumer_row0(consumer);
        const bool leader = thread == 0;
        // First k-block: once it is issued, only it may still be in flight, so the previous
        // tile's last group is complete and its accumulators can be stored meanwhile.
        int s = Consumer::wait_full(smem, ring++);
        cur.issue(smem, s, row0, true);
        wgmma_wait_group<1>();
        cur.settle();
        if (leader && prev_stage >= 0) release_stage(smem, prev_stage);
        prev_stage = s;
        if (has_prev) {
            prev.settle();
            store(prev, prev_c);
        }
        for (int kb = 1; kb < num_k_blocks; ++kb) {
            s = Consumer::wait_full(smem, ring++);
            cur.issue(smem, s, row0, false);
            wgmma_wait_group<1>();
            cur.settle();
            if (leader) release_stage(smem, prev_stage);
            prev_stage = s;
        }
    }

    // After the last tile: drain its group and store it.
    __device__ __forceinline__ void finish(Consumer& last, const TileCoord& c,
                                           int prev_stage) const {
        wgmma_wait_group<0>();
        last.settle();
        if (thread == 0 && prev_stage >= 0) release_stage(smem, prev_stage);
        store(last, c);
    }
};

// A consumer warpgroup's side of the overlapped kernels: the tiles of `walk` in pairs, alternating
// between two accumulator sets; ends with Epilogue::finish.
template <class Cfg, class Consumer, class Epilogue, class Walk>
__device__ __forceinline__ void overlapped_consumer(const SharedStorage<Cfg>& smem,
                                                    const TensorMap* map_c, int consumer,
                                                    int thread, int num_k_blocks,
                                                    const Walk& walk) {
    typedef TileShape<Cfg> S;
    static_assert(Cfg::kAccumulatorSets == 2, "the schedule renders its two sets");
    static_assert(2 * S::kRowBlocks * Consumer::kAccRegs + kConsumerWorkingRegs <=
                      (int)S::kConsumerRegs,
                  "two accumulator sets must fit a consumer's registers");
    int ring = 0;
    const OverlappedTiles<Cfg, Consumer, Epilogue, Walk> tiles{smem, map_c, walk, consumer,
                                                               thread, num_k_blocks};
    // The two sets by name, so that every accumulator index stays a compile-time constant:
    // the loop body handles a pair of tiles, `even` then `odd`.
    Consumer even, odd;
    // Every path that issued a wgmma reaches one of the two finish() calls (wait_group 0)
    // inside this block: a path around them made ptxas inject a warpgroup.wait and serialize
    // every wgmma of the kernel (C7517 / C7514).
    const int first = walk.first(), stride = walk.stride();
    if (first < walk.end) {
        int prev_stage = -1;
        TileCoord last = walk.coord(first);
        bool odd_holds_last = false;
        for (int t = first; t < walk.end; t += 2 * stride) {
            tiles.tile(even, odd, t != first, last, ring, prev_stage);
            last = walk.coord(t);
            odd_holds_last = false;
            if (t + stride >= walk.end) break;
            tiles.tile(odd, even, true, last, ring, prev_stage);
            last = walk.coord(t + stride);
            odd_holds_last = true;
        }
        if (odd_holds_last)
            tiles.finish(odd, last, prev_stage);
        else
            tiles.finish(even, last, prev_stage);
    }
    Epilogue::finish(thread);
}

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void persistent_overlap_gemm(const TensorMap* map_a,
                                                        const TensorMap* map_b,
                                                        const TensorMap* map_c, int k,
                                                        int batch_offset, int batch_count,
                                                        BatchMap batch_a, BatchMap batch_b,
                                                        GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    run_persistent<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const CtaTileWalk& walk) {
            overlapped_consumer<Cfg, Consumer, Epilogue>(smem, map_c, consumer, thread,
                                                         num_k_blocks, walk);
        }, epilogue);
}

}  // namespace hopmm

// Kernel skeleton: persistent ping-pong (seed 003). As in kernel_persistent.cuh, at most one
// CTA per SM walks the output tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... and the
// producer warpgroup loads them in that order through the one stage ring. But each consumer
// warpgroup computes whole tiles of its own: consumer 0 the CTA's 1st, 3rd, 5th... tile,
// consumer 1 its 2nd, 4th, ..., and the two take turns on the tensor cores
// (consumer_turns.cuh), so one consumer's epilogue overlaps the other's main loop.
//
// The ring counts k-blocks of the CTA's tile sequence, so tile j occupies ring positions
// j * num_k_blocks ... (j + 1) * num_k_blocks - 1 for both the producer and its consumer; a
// consumer skips the other's positions by advancing its ring past them. Because a consumer
// waits for its turn before its first full-barrier wait, every earlier position has been
// filled by then, so a stage's barrier is never more than one phase away from the parity
// waited for. Each stage has one reader, whose single arrive releases it.
#pragma once
#include "consumer_turns.cuh"
#include "kernel_persistent.cuh"

namespace hopmm {

// A whole tile's accumulators live in one warpgroup: 128 x 128 fp32 is 128 registers per
// thread of the consumers' kConsumerRegs; 128 x 256 would not fit.
constexpr int kMaxAccumulatorRegs = 128;

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void pingpong_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                              const TensorMap* map_c, int k, int batch_offset,
                                              int batch_count, BatchMap batch_a,
                                              BatchMap batch_b, GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    static_assert(S::kConsumers == 2 && !S::kConsumersShareTile,
                  "ping-pong: two consumers, each computing whole tiles");
    static_assert(S::kRowBlocks * Consumer::kAccRegs <= kMaxAccumulatorRegs,
                  "a consumer's accumulators must fit its registers");
    run_persistent<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const CtaTileWalk& walk) {
            TensorCoreTurns::hand_first_turn(consumer, walk.first() < walk.end);
            const int ctas = walk.stride();
            Consumer consumer_state;
            int ring = consumer * num_k_blocks;  // consumer 1 starts at the CTA's second tile
            for (int t = walk.first() + consumer * ctas; t < walk.end; t += 2 * ctas) {
                const TileCoord c = walk.coord(t);
                const TensorCoreTurns turns(consumer, t + ctas < walk.end);
                prefetch_epilogue_operands(smem, thread, c.m_tile * S::kBlockM,
                                           c.n_tile * S::kBlockN, c.z);
                consumer_state.mainloop(smem, consumer, num_k_blocks, ring, thread == 0, turns);
                ring += num_k_blocks;  // the other consumer's next tile
                Epilogue::store(consumer_state.acc, map_c, smem, consumer, thread,
                                c.m_tile * S::kBlockM, c.n_tile * S::kBlockN, c.z);
            }
            Epilogue::finish(thread);
        }, epilogue);
}

}  // namespace hopmm

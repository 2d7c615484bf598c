// Kernel skeleton: two products that share A, C0 = A @ B0 and C1 = A @ B1 (seed 000; an MLP's
// gate and up projections), in the persistent kernel (kernel_persistent.cuh). Each stage holds
// the A tile and both B tiles of one k-block, loaded once (kBOperands = 2), side by side; each
// consumer keeps two accumulator sets in one register array and issues, per k16 step, one
// wgmma twice as wide as a B tile that reads both tiles and writes both sets, all of a
// k-block's wgmmas in one commit group, and a single flush before its epilogue. The epilogue either
// stores both sets, each through the fused chain, into C0 and C1 (kDualStore =
// kDualStorePair), or stores silu(set 0) * set 1, computed in fp32 and rounded once, into
// C0 (kDualStoreSwiglu).
#pragma once
#include "kernel_persistent.cuh"

namespace hopmm {

// Config::kDualStore values (hopmm/schedules.py's SharedASchedule.dual_store).
constexpr int kDualStorePair = 0;
constexpr int kDualStoreSwiglu = 1;

template <class Cfg>
struct DualBWgmmaConsumer {
    typedef TileShape<Cfg> S;
    typedef WgmmaConsumer<Cfg> Single;
    static_assert(S::kBOperands == 2, "a stage holds both B tiles");
    static_assert(S::kConsumerRows == S::kWgmmaM,
                  "each consumer owns 64 rows (of a shared tile, or a 64-row tile alone): two "
                  "64 x N sets");
    static constexpr int kAccRegs = Single::kAccRegs;
    // A stage's two B tiles lie side by side (SharedStorage::b_tile) in the layout of one tile
    // twice as wide (K-major: 8-row atoms 1024 bytes apart; MN-major: 64-wide boxes one box
    // apart), so one m64 wgmma of twice the width reads both and A once per k16 step; its
    // accumulator's first kAccRegs registers are product 0's columns, the rest product 1's.
    static_assert(2 * S::kBlockN <= 256, "both B tiles within one wgmma's N extent");
    typedef Wgmma<2 * S::kBlockN, Cfg::kBf16, Cfg::kTransA, Cfg::kTransB> PairMma;
    static_assert(PairMma::kAccRegs == 2 * kAccRegs, "one set per product, back to back");

    // Both products' sets: [product * kAccRegs + register].
    float acc[2 * kAccRegs];

    // Product p's set, in the shape TmaStoreEpilogue::store takes ([row block][register]).
    __device__ __forceinline__ float (&set(int p))[1][kAccRegs] {
        return *reinterpret_cast<float(*)[1][kAccRegs]>(acc + p * kAccRegs);
    }

    __device__ __forceinline__ void mainloop(const SharedStorage<Cfg>& smem, int consumer,
                                             int num_k_blocks, int& ring, bool leader) {
        wgmma_k_blocks<Cfg>(*this, smem, consumer, num_k_blocks, ring, leader, NoTurns());
    }

    // One k-block from stage s: per k16 step one wgmma over both B tiles, as one committed
    // group.
    __device__ __forceinline__ void issue(const SharedStorage<Cfg>& smem, int s, int row0,
                                          bool first_of_tile) {
        const u32 a_tile = smem_addr(smem.a_tile(s));
        const u32 b_tiles = smem_addr(smem.b_tile(s, 0));
        settle();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Single::kKSteps; ++kk)
            PairMma::mma(acc, Single::desc_a(a_tile, row0, kk), Single::desc_b(b_tiles, kk),
                         !first_of_tile || kk != 0);
        wgmma_commit_group();
    }

    __device__ __forceinline__ void settle() { wgmma_fence_operands(acc); }

    // Product 0's set = silu(set 0) * set 1, in fp32 (after the flush).
    __device__ __forceinline__ void swiglu() {
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i) {
            const float gate = acc[i];
            acc[i] = gate * EpilogueChain<Cfg>::logistic(gate) * acc[kAccRegs + i];
        }
    }
};

// map_c2: C1's map (kDualStorePair; unused by kDualStoreSwiglu). The fused chain, where the
// config has one, applies to both products.
template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void dual_b_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                            const TensorMap* map_c, const TensorMap* map_b2,
                                            const TensorMap* map_c2, int k, int batch_offset,
                                            int batch_count, BatchMap batch_a, BatchMap batch_b,
                                            GroupedRaster raster,
                                            const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    static_assert(Cfg::kDualStore == kDualStorePair || Cfg::kDualStore == kDualStoreSwiglu,
                  "a pair of outputs, or swiglu's one");
    static_assert(Cfg::kDualStore == kDualStorePair || !Cfg::kEpilogue,
                  "swiglu's epilogue is its own");
    run_persistent<Cfg, Producer>(
        map_a, map_b, map_c, k, batch_offset, batch_count, batch_a, batch_b, raster,
        [&](const SharedStorage<Cfg>& smem, int consumer, int thread, int num_k_blocks,
            const CtaTileWalk& walk) {
            Consumer state;
            int ring = 0;
            for (int t = walk.first(); t < walk.end; t += walk.stride()) {
                const TileCoord c = walk.coord(t);
                const int row0 = c.m_tile * S::kBlockM + consumer * S::kWgmmaM;
                const int n0 = c.n_tile * S::kBlockN;
                state.mainloop(smem, consumer, num_k_blocks, ring, thread == 0);
                if constexpr (Cfg::kDualStore == kDualStoreSwiglu) {
                    state.swiglu();
                    Epilogue::store(state.set(0), map_c, smem, consumer, thread, row0, n0, c.z);
                } else {
                    Epilogue::store(state.set(0), map_c, smem, consumer, thread, row0, n0, c.z);
                    Epilogue::store(state.set(1), map_c2, smem, consumer, thread, row0, n0, c.z);
                }
            }
            Epilogue::finish(thread);
        },
        epilogue, map_b2);
}

}  // namespace hopmm

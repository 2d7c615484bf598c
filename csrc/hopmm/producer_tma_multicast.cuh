// Slot `producer` for clusters of CTAs that work on vertically adjacent output tiles (same
// N columns, consecutive M rows), so they read the same B tile. Each CTA's elected producer
// thread loads its own A tile, and one 1/kClusterSize slice of the shared B tile, which TMA
// multicasts into every CTA of the cluster: each B byte leaves L2 once per cluster.
//
// Barrier accounting (per stage s of CTA r):
//  * full[s] (count 1): CTA r's producer arrives once with expect_tx of everything that lands
//    in CTA r's shared memory: its A tile and the *whole* B tile (its own slice plus the
//    slices multicast by the peers). A peer's complete_tx may reach full[s] before that
//    expect_tx: the tx-count goes negative, but the phase cannot complete without the arrive.
//  * empty[s] (count kConsumers * kClusterSize): the producer multicasts into every CTA's
//    stage s, so it must wait until the consumers of all CTAs released it; every consumer
//    arrives on every CTA's empty[s] (release_stage in tile_config.cuh).
#pragma once
#include "producer_tma.cuh"

namespace hopmm {

template <class Cfg>
struct MulticastTmaProducer {
    typedef TileShape<Cfg> S;
    typedef TmaProducer<Cfg> Unicast;
    static constexpr int kSliceRows = S::kBlockN / S::kClusterSize;   // B rows one CTA loads
    static constexpr u32 kSliceBytes = kSliceRows * S::kBlockK * kElemBytes;
    static constexpr unsigned short kAllCtas = (1u << S::kClusterSize) - 1;  // ctaMask
    static_assert(S::kClusterSize > 1, "multicast needs a cluster");
    static_assert(kSliceRows % kTmaBoxElems == 0, "a slice is whole 64-row MN-major boxes");
    static_assert(kSliceBytes % kSmemAlign == 0, "each slice starts on a swizzle-atom boundary");

    // Slice `rank` of a B stage tile: rows row0 .. row0 + kSliceRows of the tile, placed where
    // a single load of the whole tile would have put them. MN-major: kSliceRows / 64 boxes of
    // 64 N x 64 K, consecutive; K-major: one box of 64 K x kSliceRows rows (the B tensor
    // map's box is kSliceRows rows, see schedules.PersistentClusterSchedule.box_rows). Both
    // layouts are row-stacked in 1024-byte swizzle atoms, so the slices compose the tile.
    __device__ __forceinline__ static void multicast_b_slice(unsigned char* tile,
                                                             const TensorMap* map, u64* bar,
                                                             int rank, int n0, int k0, int z) {
        unsigned char* slice = tile + rank * kSliceBytes;
        const int row0 = n0 + rank * kSliceRows;
        if (Cfg::kTransB) {
#pragma unroll
            for (int i = 0; i < kSliceRows / kTmaBoxElems; ++i)
                tma_load_3d_multicast(slice + i * Unicast::kMnBoxBytes, map, bar,
                                      row0 + i * kTmaBoxElems, k0, z, kAllCtas);
        } else {
            tma_load_3d_multicast(slice, map, bar, k0, row0, z, kAllCtas);
        }
    }

    // The same contract as TmaProducer::load_tile, plus this CTA's rank in the cluster.
    // m0 is this CTA's own tile row (it may lie wholly outside A: TMA then zero-fills it,
    // and the CTA still loads its B slice for the peer).
    __device__ __forceinline__ static void load_tile(const TensorMap* map_a, const TensorMap* map_b,
                                                     const SharedStorage<Cfg>& smem, int rank,
                                                     int m0, int n0, int za, int zb,
                                                     int num_k_blocks, int& ring) {
        for (int kb = 0; kb < num_k_blocks; ++kb, ++ring) {
            const int s = ring % S::kStages;
            const u32 phase = (ring / S::kStages) & 1;
            // Parity 1 on a fresh barrier names the phase before phase 0: the first pass
            // over the ring does not wait.
            mbar_wait(smem.empty_bar(s), phase ^ 1);
            mbar_arrive_expect_tx(smem.full_bar(s), S::kStageBytes);
            const int k0 = kb * S::kBlockK;
            Unicast::template load_operand<Cfg::kTransA, S::kBlockM>(smem.a_tile(s), map_a,
                                                                     smem.full_bar(s), m0, k0, za);
            multicast_b_slice(smem.b_tile(s), map_b, smem.full_bar(s), rank, n0, k0, zb);
        }
    }
};

}  // namespace hopmm

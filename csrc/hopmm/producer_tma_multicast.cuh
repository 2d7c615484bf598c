// Slot `producer` for clusters of CTAs that work on vertically adjacent output tiles (same
// N columns, consecutive M rows), so they read the same B tile. Each CTA's elected producer
// thread loads its own A tile, and a 1/kClusterSize share of the shared B tile, which TMA
// multicasts into every CTA of the cluster: each B byte leaves L2 once per cluster.
//
// Barrier accounting (per stage s of CTA r):
//  * full[s] (count 1): CTA r's producer arrives once with expect_tx of everything that lands
//    in CTA r's shared memory: its A tile and the *whole* B tile (its own share plus the
//    shares multicast by the peers). A peer's complete_tx may reach full[s] before that
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
    static constexpr unsigned short kAllCtas = (1u << S::kClusterSize) - 1;  // ctaMask
    static_assert(S::kClusterSize > 1, "multicast needs a cluster");
    // MN-major B: the tile's 64-wide boxes are dealt out round-robin, starting one CTA further
    // on every k-block: box i of k-block kb goes to CTA (i + kb) % kClusterSize. Where the
    // boxes do not divide evenly (192 wide: 3 boxes for 2 CTAs) the odd one alternates, so
    // every CTA issues the same number of TMA loads on average.
    static constexpr int kMnBoxes = S::kBlockN / kTmaBoxElems;
    // Where the cluster has more CTAs than the tile has boxes, each CTA instead loads a
    // 1/kClusterSize slice of the k rows of every box (the B tensor map's box is that many
    // rows deep, see schedules.PersistentClusterSchedule.mn_box_k_rows).
    static constexpr bool kSliceBoxesByK = kMnBoxes < S::kClusterSize;
    static constexpr int kBoxSliceK = S::kBlockK / S::kClusterSize;
    static constexpr u32 kBoxSliceBytes = kBoxSliceK * kSwizzleBytes;
    static_assert(!kSliceBoxesByK || kBoxSliceBytes % kSmemAlign == 0,
                  "each k slice of a box is whole 1024-byte swizzle atoms (8 rows of 128 bytes)");
    // K-major B: CTA r loads rows r * kSliceRows ... of the tile, one box (the B tensor map's
    // box is kSliceRows rows, see schedules.PersistentClusterSchedule.box_rows).
    static constexpr int kSliceRows = S::kBlockN / S::kClusterSize;
    static constexpr u32 kSliceBytes = kSliceRows * S::kBlockK * kElemBytes;
    static_assert(S::kBlockN % S::kClusterSize == 0 && kSliceBytes % kSmemAlign == 0,
                  "each K-major slice is whole 1024-byte swizzle atoms (8 rows of 128 bytes)");

    // This CTA's share of a B stage tile, placed where a single load of the whole tile would
    // have put it: both layouts are row-stacked in 1024-byte swizzle atoms, so the shares
    // compose the tile.
    __device__ __forceinline__ static void multicast_b_share(unsigned char* tile,
                                                             const TensorMap* map, u64* bar,
                                                             int rank, int kb, int n0, int z) {
        const int k0 = kb * S::kBlockK;
        if (Cfg::kTransB && kSliceBoxesByK) {
#pragma unroll
            for (int i = 0; i < kMnBoxes; ++i)
                tma_load_3d_multicast(tile + i * S::kBBoxBytes + rank * kBoxSliceBytes, map, bar,
                                      n0 + i * kTmaBoxElems, k0 + rank * kBoxSliceK, z, kAllCtas);
        } else if (Cfg::kTransB) {
#pragma unroll
            for (int i = 0; i < kMnBoxes; ++i)
                if ((i + kb) % S::kClusterSize == rank)
                    tma_load_3d_multicast(tile + i * S::kBBoxBytes, map, bar,
                                          n0 + i * kTmaBoxElems, k0, z, kAllCtas);
        } else {
            tma_load_3d_multicast(tile + rank * kSliceBytes, map, bar, k0,
                                  n0 + rank * kSliceRows, z, kAllCtas);
        }
    }

    // The same contract as TmaProducer::load_tile, plus this CTA's rank in the cluster.
    // m0 is this CTA's own tile row (it may lie wholly outside A: TMA then zero-fills it,
    // and the CTA still loads its B share for the peer).
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
            multicast_b_share(smem.b_tile(s), map_b, smem.full_bar(s), rank, kb, n0, zb);
        }
    }
};

}  // namespace hopmm

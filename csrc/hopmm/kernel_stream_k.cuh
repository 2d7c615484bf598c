// Kernel skeleton: stream-K in lanes. For few output tiles over a long K, whole tiles leave SMs
// idle (84 tiles on 132 SMs) and even split counts leave a part wave; here every CTA of the
// grid multiplies the same number of k-blocks (to within one), cut out of a stream of tiles
// without regard for tile edges, and the pieces of a tile cut apart are added up in order.
//
// Lanes. The tiles are cut into lanes of consecutive raster positions: with raster groups of
// one M-tile a lane is one row of tiles (tiles_n of them), with groups of all M-tiles one
// column (tiles_m); a single row of tiles is always one lane. Each lane's tiles (over the
// launch's batch slices, slice after slice) form a stream of k-blocks, tile by tile, which
// the lane's gridDim.x / lanes CTAs divide evenly:
// CTA i of a lane multiplies k-blocks [i * U / C, (i + 1) * U / C) of its U (C CTAs a lane).
// Every lane is cut the same way, so the tiles at one position of every lane are multiplied
// at the same k-blocks at about the same time and read the operand they share (B, where lanes
// are rows of tiles; A, where they are columns) from DRAM once; the lane's own operand panel
// is read again, tile after tile, from L2. (L2 itself serves such CTAs more slowly than one
// wave of whole tiles, whose requests for a line come at once: NOTES v0.32.)
//
// Pieces. A CTA's k-blocks fall into segments, one per tile they touch. Only a CTA's first
// segment can start inside a tile; that piece (a contributor) stores its fp32 accumulators to
// the CTA's workspace slot and sets the slot's flag (release). The segment that starts at a
// tile's first k-block (its owner) adds the pieces of the CTAs after it in the lane that
// start inside the same tile, in k order, waiting on each flag (acquire), resets the flags
// and stores the tile through the epilogue slot, fused chain included. The order of the
// additions is fixed by the grid, so results repeat bit for bit.
//
// Co-residency (why the owner's wait cannot deadlock): an owner waits only for CTAs with a
// larger index whose first segment (which waits for nothing) is the piece it needs. The host
// launches at most one CTA per SM (__launch_bounds__(.., 1), more than half the SM's shared
// memory), and CTAs are dispatched in index order, so each contributor is resident or will
// be as soon as any SM frees, and no CTA holds anything a contributor needs.
#pragma once
#include "tile_config.cuh"
#include "tile_raster.cuh"
#include "consumer_wgmma.cuh"
#include "epilogue_tma_store.cuh"

namespace hopmm {

// One segment of a CTA's k-blocks: tile `tile` of the launch, k-blocks first .. first + count.
struct StreamKSegment {
    TileCoord tile;
    int first;
    int count;
};

// The k-block stream of a lane and this CTA's share of it (see above).
struct StreamKWalk {
    GroupedRaster raster;
    int batch_offset;
    int lane_tiles;   // tiles of one lane in one batch slice (consecutive raster positions)
    int lane;         // which lane
    int ctas;         // CTAs a lane
    int rank;         // this CTA's place in its lane
    long long units;  // k-blocks of the lane's stream
    int k_blocks;     // of one tile

    __device__ __forceinline__ StreamKWalk(const GroupedRaster& r, int offset, int batch_count,
                                           int num_k_blocks)
        : raster(r), batch_offset(offset), k_blocks(num_k_blocks) {
        // Groups of one M-tile walk rows of tiles; groups of every M-tile walk columns. One
        // row of tiles is one lane whatever the group: a lane per tile would cap the CTAs at
        // a multiple of the tiles.
        lane_tiles = r.group >= r.tiles_m && r.tiles_m > 1 ? r.tiles_m : r.tiles_n;
        const int lanes = r.per_slice() / lane_tiles;
        ctas = gridDim.x / lanes;
        lane = blockIdx.x / ctas;
        rank = blockIdx.x % ctas;
        units = static_cast<long long>(lane_tiles) * batch_count * num_k_blocks;
    }

    // First k-block of the lane's stream that CTA `r` of the lane multiplies.
    __device__ __forceinline__ long long begin(int r) const { return units * r / ctas; }
    __device__ __forceinline__ long long end() const { return begin(rank + 1); }

    // The segment that starts at stream position u (below end()).
    __device__ __forceinline__ StreamKSegment segment(long long u) const {
        const int s = static_cast<int>(u / k_blocks);  // the tile's place in the lane's stream
        const int first = static_cast<int>(u - static_cast<long long>(s) * k_blocks);
        const long long tile_end = static_cast<long long>(s + 1) * k_blocks;
        const long long stop = tile_end < end() ? tile_end : end();
        StreamKSegment seg;
        seg.tile.z = batch_offset + s / lane_tiles;
        raster.tile(lane * lane_tiles + s % lane_tiles, seg.tile.m_tile, seg.tile.n_tile);
        seg.first = first;
        seg.count = static_cast<int>(stop - u);
        return seg;
    }
};

// The producer warpgroup: one thread loads every segment's k-blocks in order.
template <class Cfg, class Producer>
__device__ __forceinline__ void stream_k_producer(const TensorMap* map_a, const TensorMap* map_b,
                                                  const SharedStorage<Cfg>& smem, int thread,
                                                  BatchMap batch_a, BatchMap batch_b,
                                                  const StreamKWalk& walk) {
    typedef TileShape<Cfg> S;
    setmaxnreg_dec<kProducerRegs>();
    if (thread != 0) return;
    int ring = 0;
    for (long long u = walk.begin(walk.rank); u < walk.end();) {
        const StreamKSegment seg = walk.segment(u);
        const int m0 = seg.tile.m_tile * S::kBlockM, n0 = seg.tile.n_tile * S::kBlockN;
        Producer::load_tile(map_a, map_b, smem, m0, n0, walk.raster.m - m0, walk.raster.n - n0,
                            batch_a(seg.tile.z), batch_b(seg.tile.z), seg.count, ring, seg.first);
        u += seg.count;
    }
}

// A consumer warpgroup's fp32 piece of a tile in the workspace: slot (CTA, consumer) holds its
// accumulator registers in the order the threads hold them, four at a time, so that a warp's
// 16-byte accesses cover 512 contiguous bytes; writer and reader are threads of the same
// place in their warpgroups, so no tile layout is needed.
template <class Cfg>
struct StreamKPieces {
    typedef TileShape<Cfg> S;
    static constexpr int kRegs = S::kRowBlocks * WgmmaConsumer<Cfg>::kAccRegs;
    static_assert(WgmmaConsumer<Cfg>::kAccRegs % 4 == 0, "accumulators four at a time");
    static constexpr int kSlotFloats = kRegs * kWarpgroupThreads;

    float* workspace;
    u32* flags;  // one per slot, zero between launches

    __device__ __forceinline__ float* slot(int cta, int consumer) const {
        return workspace + static_cast<size_t>(cta * S::kConsumers + consumer) * kSlotFloats;
    }
    __device__ __forceinline__ u32* flag(int cta, int consumer) const {
        return flags + cta * S::kConsumers + consumer;
    }

    // A contributor: its piece to its slot, then the flag, released for the owner.
    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ void publish(const float (&acc)[ROW_BLOCKS][NREG], int consumer,
                                            int thread) const {
        float4* out = reinterpret_cast<float4*>(slot(blockIdx.x, consumer)) + thread;
#pragma unroll
        for (int r = 0; r < ROW_BLOCKS; ++r)
#pragma unroll
            for (int i = 0; i < NREG; i += 4)
                out[(r * NREG + i) / 4 * kWarpgroupThreads] =
                    make_float4(acc[r][i], acc[r][i + 1], acc[r][i + 2], acc[r][i + 3]);
        __threadfence();  // each thread's stores, before the barrier that precedes the flag
        named_barrier_sync(kBarrierEpilogueBase + consumer, kWarpgroupThreads);
        if (thread == 0) st_release_gpu(flag(blockIdx.x, consumer), 1);
    }

    // An owner: the piece of CTA `cta` of the grid (a later CTA of this lane) added to its
    // accumulators once that CTA's flag is up; the flag is left at zero for the next launch.
    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ void add(float (&acc)[ROW_BLOCKS][NREG], int cta, int consumer,
                                        int thread) const {
        if (thread == 0) {
            Backoff backoff;
            while (ld_acquire_gpu(flag(cta, consumer)) == 0) backoff.sleep();
            st_relaxed_gpu(flag(cta, consumer), 0);
        }
        named_barrier_sync(kBarrierEpilogueBase + consumer, kWarpgroupThreads);  // the acquire
        const float* in = slot(cta, consumer) + 4 * thread;
#pragma unroll
        for (int r = 0; r < ROW_BLOCKS; ++r)
#pragma unroll
            for (int i = 0; i < NREG; i += 4) {
                // L2, not L1: the piece was written by another SM.
                const float4 v = ld_global_cg_f32x4(in + (r * NREG + i) / 4 * 4 * kWarpgroupThreads);
                acc[r][i] += v.x;
                acc[r][i + 1] += v.y;
                acc[r][i + 2] += v.z;
                acc[r][i + 3] += v.w;
            }
    }
};

template <class Cfg, class Producer, class Consumer, class Epilogue>
__device__ __forceinline__ void stream_k_gemm(const TensorMap* map_a, const TensorMap* map_b,
                                              const TensorMap* map_c, float* workspace,
                                              u32* flags, int k, int batch_offset,
                                              int batch_count, BatchMap batch_a,
                                              BatchMap batch_b, GroupedRaster raster,
    const EpilogueArgs& epilogue = EpilogueArgs()) {
    typedef TileShape<Cfg> S;
    static_assert(Cfg::kOverlapStore, "a CTA's stores stay in flight into its next segment");
    extern __shared__ unsigned char smem_raw[];
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const SharedStorage<Cfg> smem = setup_shared_storage<Cfg>(smem_raw, map_a, map_b, map_c, epilogue);
    const StreamKWalk walk(raster, batch_offset, batch_count, S::k_blocks(k));

    if (warpgroup == 0) {
        stream_k_producer<Cfg, Producer>(map_a, map_b, smem, thread, batch_a, batch_b, walk);
        return;
    }
    setmaxnreg_inc<S::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    const StreamKPieces<Cfg> pieces{workspace, flags};
    Consumer state;
    int ring = 0;
    for (long long u = walk.begin(walk.rank); u < walk.end();) {
        const StreamKSegment seg = walk.segment(u);
        u += seg.count;
        const int row0 = seg.tile.m_tile * S::kBlockM + consumer * S::kWgmmaM;
        const int n0 = seg.tile.n_tile * S::kBlockN;
        if (seg.first == 0) prefetch_epilogue_operands(smem, thread, row0, n0, seg.tile.z);
        state.mainloop(smem, consumer, seg.count, ring, thread == 0);
        if (seg.first > 0) {
            pieces.publish(state.acc, consumer, thread);
            continue;
        }
        // The owner: the later CTAs of the lane whose first k-block lies inside this tile.
        const long long tile_end = u - seg.count + walk.k_blocks;
        for (int r = walk.rank + 1; r < walk.ctas && walk.begin(r) < tile_end; ++r)
            pieces.add(state.acc, blockIdx.x + (r - walk.rank), consumer, thread);
        Epilogue::store(state.acc, map_c, smem, consumer, thread, row0, n0, seg.tile.z);
    }
    Epilogue::finish(thread);
}

}  // namespace hopmm

// Slot `epilogue`: accumulators -> 16-bit -> stmatrix into a 128B-swizzled staging tile ->
// TMA store. Each consumer warpgroup stores its own rows (64 of a shared tile, or a whole
// tile of its own) from its own staging tile, synchronising only its 128 threads on its own
// named barrier.
//
// Seed 004: the fence.proxy.async that hands the staged tile from the generic proxy
// (stmatrix) to the async proxy (TMA) is executed by every writing thread, unconditionally,
// before the barrier; only the store itself is issued by one thread.
#pragma once
#include "tile_config.cuh"

namespace hopmm {

template <class Cfg>
struct TmaStoreEpilogue {
    typedef TileShape<Cfg> S;
    static constexpr int kColGroups = S::kBlockN / 8;  // 8-column groups of the accumulator

    __device__ __forceinline__ static u32 pack(float lo, float hi) {
        return Cfg::kBf16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
    }

    // Writes the warpgroup's 64 x kBlockN accumulator tile to shared memory in the layout of a
    // SWIZZLE_128B box of 64 columns x 64 rows, box after box along N. Accumulator register i
    // of thread t holds row 16*(t/32) + (t%32)/4 + 8*((i/2)%2), column 8*(i/4) + 2*(t%4) + i%2,
    // so registers (4j, 4j+1) and (4j+2, 4j+3) are the stmatrix fragments of the 8x8 blocks
    // (rows 0-7, group j) and (rows 8-15, group j) of the warp's 16-row slice.
    template <int NREG>
    __device__ __forceinline__ static void stage(const float (&acc)[NREG], u32 tile, int thread) {
        const int warp = thread / 32, lane = thread % 32;
        const int matrix = lane / 8;  // which of the four 8x8 blocks this lane addresses
        const int row = 16 * warp + (matrix % 2) * 8 + lane % 8;
#pragma unroll
        for (int j = 0; j < kColGroups; j += 2) {
            const int group = j + matrix / 2;
            const int box = group / 8, chunk = group % 8;
            const u32 addr = tile + box * S::kCBoxBytes + row * kSwizzleBytes +
                             ((chunk ^ (row % 8)) * 16);
            stmatrix_x4(addr, pack(acc[4 * j], acc[4 * j + 1]), pack(acc[4 * j + 2], acc[4 * j + 3]),
                        pack(acc[4 * j + 4], acc[4 * j + 5]), pack(acc[4 * j + 6], acc[4 * j + 7]));
        }
    }

    // All of a consumer's 64-row blocks, each staged as above, one block after the other.
    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void stage(const float (&acc)[ROW_BLOCKS][NREG], u32 tile,
                                                 int thread) {
#pragma unroll
        for (int r = 0; r < ROW_BLOCKS; ++r) stage(acc[r], tile + r * S::kCRowBlockBytes, thread);
    }

    // The store is left in flight (finish() waits for it). With Cfg::kOverlapStore (persistent
    // kernels) the next tile's main loop runs meanwhile, and before the staging tile is written
    // again the previous store must have finished reading it.
    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store(const float (&acc)[ROW_BLOCKS][NREG],
                                                 const TensorMap* map_c,
                                                 const SharedStorage<Cfg>& smem, int consumer,
                                                 int thread, int row0, int n0, int z) {
        const u32 barrier = kBarrierEpilogueBase + consumer;
        if (Cfg::kOverlapStore) {
            if (thread == 0) bulk_wait_group_read_0();
            named_barrier_sync(barrier, kWarpgroupThreads);
        }
        const u32 tile = smem_addr(smem.c_tile(consumer));
        stage(acc, tile, thread);
        fence_proxy_async_smem();
        named_barrier_sync(barrier, kWarpgroupThreads);
        if (thread == 0) {
#pragma unroll
            for (int r = 0; r < ROW_BLOCKS; ++r) {
                const unsigned char* block = smem.c_tile(consumer) + r * S::kCRowBlockBytes;
#pragma unroll
                for (int box = 0; box < S::kBlockN / kTmaBoxElems; ++box)
                    tma_store_3d(map_c, block + box * S::kCBoxBytes, n0 + box * kTmaBoxElems,
                                 row0 + r * S::kWgmmaM, z);
            }
            bulk_commit_group();
        }
    }

    // Before the CTA exits: shared memory must stay valid until the last store has read it,
    // and the grid's writes must be complete when the kernel ends.
    __device__ __forceinline__ static void finish(int thread) {
        if (thread == 0) bulk_wait_group_0();
    }
};

}  // namespace hopmm

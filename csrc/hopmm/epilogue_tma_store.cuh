// Slot `epilogue`: accumulators -> 16-bit -> stmatrix into 128B-swizzled staging boxes ->
// TMA store. Each consumer warpgroup stores its own rows (64 of a shared tile, or a whole
// tile of its own) box by box (64 rows x 64 columns) through a ring of kCBuffers staging
// boxes of its own, synchronising only its 128 threads on its own named barrier.
//
// The ring is what lets the epilogue stay small (seed 002): two boxes per consumer leave
// room for one more operand stage of a 128 x 256 tile than a whole staged tile would, and the
// store of one box overlaps the staging of the next. A box is rewritten only after the store
// that read it has finished reading (bulk wait_group.read).
//
// Row store (Config::kRowStore): an output whose rows are not 16-byte aligned cannot take a
// TMA store (it writes whole 16-byte chunks). Such a kernel stages each box the same way, and
// then its warpgroup copies the box to the output itself (store_box_rows), clipped at the
// output's edge: the result needs no aligned buffer and no copy out (NOTES v0.24).
//
// Transposed store (Config::kTransC): the kernel computes C^T = B^T A^T (its rows are the
// output's columns) and stages each 64 x 64 accumulator box transposed (stmatrix .trans), so
// the box in shared memory is a box of the output as it lies and one TMA store writes it. It
// is plain: no epilogue chain, no row store.
//
// Seed 004: the fence.proxy.async that hands a staged box from the generic proxy (stmatrix)
// to the async proxy (TMA) is executed by every writing thread, unconditionally, before the
// barrier; only the store itself is issued by one thread.
#pragma once
#include "tile_config.cuh"
#include "epilogue_functors.cuh"

namespace hopmm {

// At the start of a tile's main loop, by each consumer thread: the L2 prefetch of the c rows
// its consumer will store and the L1 prefetch of their bias (epilogue_functors.cuh); nothing
// in a kernel without them.
template <class Cfg>
__device__ __forceinline__ void prefetch_epilogue_operands(const SharedStorage<Cfg>& smem,
                                                           int thread, int row0, int n0, int z) {
    typedef TileShape<Cfg> S;
    EpilogueChain<Cfg>::template prefetch_c<S::kConsumerRows, S::kBlockN>(smem.epilogue, row0,
                                                                          n0, z, thread);
    EpilogueChain<Cfg>::template prefetch_bias<S::kConsumerRows, S::kBlockN>(smem.epilogue,
                                                                             row0, n0, thread);
}

template <class Cfg>
struct TmaStoreEpilogue {
    typedef TileShape<Cfg> S;
    static constexpr int kBoxesPerRowBlock = S::kBlockN / S::kCBoxElems;
    static constexpr int kGroupsPerBox = S::kCBoxElems / 8;  // 8-column groups of the accumulator
    // Groups of one row whose epilogue operands are fetched together: a whole box where the
    // accumulators leave a consumer kFetchBoxRegs registers or more, else one pair at a time
    // (the operands of a whole box spilled in the tighter kernels; NOTES v0.19).
    static constexpr int kFetchBoxRegs = 96;
    static constexpr int kFreeRegs = static_cast<int>(S::kConsumerRegs) -
                                     Cfg::kAccumulatorSets * S::kRowBlocks * S::kBlockN / 2;
    static constexpr int kGroupsPerFetch = kFreeRegs >= kFetchBoxRegs ? kGroupsPerBox : 1;
    static_assert((kGroupsPerFetch > 1) == Cfg::kEpilogueFetchesBoxes,
                  "the schedule (epilogue_fetches_boxes) and the kernel agree on the fetch");

    // The 16-byte chunk `chunk` of row `row` of the staging box at `box`, swizzled over its
    // rows' bytes as the store map is (SWIZZLE_128B; SWIZZLE_64B for a half box's 64-byte
    // rows): a chunk's index is XOR-ed with the row's place in its 8 rows (128-byte rows), or
    // with its pair of rows' place in 4 pairs (64-byte rows).
    __device__ __forceinline__ static u32 box_chunk(u32 box, int row, int chunk) {
        if constexpr (S::kCBoxRowBytes == kSwizzleBytes)
            return box + row * kSwizzleBytes + ((chunk ^ (row % 8)) * 16);
        else
            return box + row * S::kCBoxRowBytes + ((chunk ^ ((row / 2) % 4)) * 16);
    }

    __device__ __forceinline__ static u32 pack(float lo, float hi) {
        return Cfg::kBf16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
    }

    // The packed pair of accumulator registers (i, i + 1), i even (adjacent columns of one
    // row), through the fused epilogue chain with its fetched operands.
    template <int NREG>
    __device__ __forceinline__ static u32 pair(const float (&acc)[NREG], int i,
                                               const EpilogueArgs& epilogue, u32 c_bits,
                                               u32 bias_bits) {
        float x = acc[i], y = acc[i + 1];
        EpilogueChain<Cfg>::apply2(epilogue, x, y, c_bits, bias_bits);
        return pack(x, y);
    }

    // The pair of registers (4 j + 2 h, 4 j + 2 h + 1) (group j, row frag_row + 8 h) through
    // the chain, its operands loaded one by one (EpilogueChain::apply2_at).
    template <int NREG>
    __device__ __forceinline__ static u32 fetched_pair(const float (&acc)[NREG], int j, int h,
                                                       const EpilogueArgs& epilogue,
                                                       int frag_row, int frag_col, int z) {
        float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
        EpilogueChain<Cfg>::apply2_at(epilogue, x, y, frag_row + 8 * h, frag_col + 8 * j, z);
        return pack(x, y);
    }

    // Writes columns kCBoxElems * BOX ... of the warpgroup's 64-row accumulator block (a box
    // of kCBoxElems) to the staging box at `box_addr`, in the layout of a swizzled box of
    // kCBoxElems columns x 64 rows (box_chunk). Accumulator register i of thread t holds row
    // 16*(t/32) + (t%32)/4 + 8*((i/2)%2), column 8*(i/4) + 2*(t%4) + i%2, so registers
    // (4j, 4j+1) and (4j+2, 4j+3) are the stmatrix fragments of the 8x8 blocks (rows 0-7,
    // group j) and (rows 8-15, group j) of the warp's 16-row slice.
    //
    // The fused epilogue chain (epilogue_functors.cuh) is applied to each value on its way,
    // in fp32; `row0` / `n0` / `z` place the block in the output. With kGroupsPerFetch > 1 the
    // operands of a whole row of the box are fetched first, so their loads are in flight
    // together. A plain kernel's chain is the identity and fetches nothing.
    template <int BOX, int NREG>
    __device__ __forceinline__ static void stage_box(const float (&acc)[NREG], u32 box_addr,
                                                     int thread, const EpilogueArgs& epilogue,
                                                     int row0, int n0, int z) {
        const int warp = thread / 32, lane = thread % 32;
        if constexpr (Cfg::kTransC) {
            stage_box_transposed<BOX>(acc, box_addr, warp, lane);
            return;
        }
        // Register i of this thread: row row0 + frag_row + 8 * ((i / 2) % 2), column
        // n0 + 8 * (i / 4) + frag_col + i % 2 (the layout above).
        const int frag_row = row0 + 16 * warp + lane / 4, frag_col = n0 + 2 * (lane % 4);
        const int matrix = lane / 8;  // which of the four 8x8 blocks this lane addresses
        const int row = 16 * warp + (matrix % 2) * 8 + lane % 8;
        const int chunk_of_pair = matrix / 2;  // the lane's group of the pair (j, j + 1)
        if constexpr (kGroupsPerFetch == 1) {
            // Each pair fetched as it is used: the fewest registers.
#pragma unroll
            for (int g = 0; g < kGroupsPerBox; g += 2) {
                const int j = BOX * kGroupsPerBox + g;  // 8-column group of the accumulator
                const int chunk = g + chunk_of_pair;    // 16-byte chunk of the box row
                const u32 addr = box_chunk(box_addr, row, chunk);
                stmatrix_x4(addr, fetched_pair(acc, j, 0, epilogue, frag_row, frag_col, z),
                            fetched_pair(acc, j, 1, epilogue, frag_row, frag_col, z),
                            fetched_pair(acc, j + 1, 0, epilogue, frag_row, frag_col, z),
                            fetched_pair(acc, j + 1, 1, epilogue, frag_row, frag_col, z));
            }
        } else {
            // A whole box's operands, both of the thread's rows, fetched before any is used:
            // one wait on their loads a box, not one a row (NOTES v0.25).
            const int j0 = BOX * kGroupsPerBox;  // first 8-column group of the accumulator
            u32 packed[kGroupsPerBox][2];  // [g][h]: group j0 + g, row frag_row + 8 h
            u32 c[2][kGroupsPerBox], bias[2][kGroupsPerBox];
#pragma unroll
            for (int h = 0; h < 2; ++h)
                EpilogueChain<Cfg>::template fetch_row<kGroupsPerBox, 8>(
                    epilogue, frag_row + 8 * h, frag_col + 8 * j0, z, c[h], bias[h]);
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int g = 0; g < kGroupsPerBox; ++g)
                    packed[g][h] = pair(acc, 4 * (j0 + g) + 2 * h, epilogue, c[h][g], bias[h][g]);
#pragma unroll
            for (int g = 0; g < kGroupsPerBox; g += 2) {
                const int chunk = g + chunk_of_pair;  // 16-byte chunk of the box row
                const u32 addr = box_chunk(box_addr, row, chunk);
                stmatrix_x4(addr, packed[g][0], packed[g][1], packed[g + 1][0], packed[g + 1][1]);
            }
        }
    }

    // stage_box for a transposed store: the 8x8 block of the warp's rows 8 h .. 8 h + 7 and
    // the box's columns 8 j' .. 8 j' + 7 goes, transposed, to box rows 8 j' .. 8 j' + 7 (the
    // output's rows) and 16-byte chunk 2 warp + h of them (the output's columns): lane l
    // addresses row l % 8 of block l / 8 = (j' - g) * 2 + h, as in stage_box.
    template <int BOX, int NREG>
    __device__ __forceinline__ static void stage_box_transposed(const float (&acc)[NREG],
                                                                u32 box_addr, int warp,
                                                                int lane) {
        static_assert(!Cfg::kEpilogue && !Cfg::kRowStore && !S::kHalfBox,
                      "a transposed store is plain, of whole boxes, and goes through TMA");
        const int matrix = lane / 8;
        const int chunk = 2 * warp + matrix % 2;
#pragma unroll
        for (int g = 0; g < kGroupsPerBox; g += 2) {
            const int j = BOX * kGroupsPerBox + g;  // 8-column group of the accumulator
            const int row = 8 * (g + matrix / 2) + lane % 8;
            const u32 addr = box_chunk(box_addr, row, chunk);
            stmatrix_x4_trans(addr, pack(acc[4 * j], acc[4 * j + 1]),
                              pack(acc[4 * j + 2], acc[4 * j + 3]),
                              pack(acc[4 * j + 4], acc[4 * j + 5]),
                              pack(acc[4 * j + 6], acc[4 * j + 7]));
        }
    }

    // Row store. Where every row starts on 4 bytes (an even row stride), each thread copies
    // 16-byte chunks of the box rows in the widest stores their addresses allow (a warp: 4
    // rows of 128 bytes an instruction). Where rows start on 2 bytes every other row (an odd
    // stride), each warp copies whole box rows instead: one 32-bit store a lane where the row
    // starts on 4 bytes, else two 16-bit stores a lane (elements lane and lane + 32), so that
    // each instruction writes contiguous bytes; chunks stored element by element there wrote
    // each 32-byte sector eight times. Each way ran the other's case 1.2-2x slower (NOTES
    // v0.24).
    static constexpr int kChunksPerBoxRow = S::kCBoxRowBytes / 16;
    static constexpr int kBoxRowsPerPass = kWarpgroupThreads / kChunksPerBoxRow;
    static constexpr int kElemsPerChunk = 16 / kElemBytes;
    static constexpr int kWarps = kWarpgroupThreads / 32;
    // Box rows a warp has in flight at once: one where the accumulators leave few registers
    // (as for the fetch of a box's epilogue operands).
    static constexpr int kRowStoreUnroll = kGroupsPerFetch > 1 ? 4 : 1;

    // Element x of box row r, in its 16-byte chunk x / 8 (box_chunk).
    __device__ __forceinline__ static u32 box_elem(u32 box, int r, int x) {
        return box_chunk(box, r, x / 8) + (x % 8) * kElemBytes;
    }

    // `count` (up to 8) elements of the 16 bytes `v` to p (4-byte aligned), in the widest
    // stores p allows.
    __device__ __forceinline__ static void store_chunk(unsigned short* p, const uint4& v,
                                                       int count) {
        const u64 address = reinterpret_cast<u64>(p);
        if (count >= kElemsPerChunk) {
            if ((address & 15) == 0) {
                *reinterpret_cast<uint4*>(p) = v;
            } else if ((address & 7) == 0) {
                reinterpret_cast<uint2*>(p)[0] = make_uint2(v.x, v.y);
                reinterpret_cast<uint2*>(p)[1] = make_uint2(v.z, v.w);
            } else {
                u32* q = reinterpret_cast<u32*>(p);
                q[0] = v.x; q[1] = v.y; q[2] = v.z; q[3] = v.w;
            }
            return;
        }
        const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < kElemsPerChunk; ++i)
            if (i < count) p[i] = static_cast<unsigned short>(words[i / 2] >> (16 * (i % 2)));
    }

    // Rows that all start on 4 bytes: thread t copies chunk t % 8 of box rows t / 8, t / 8 +
    // 16, ... (a quarter-warp reads one row's 8 chunks, in 8 distinct bank groups).
    __device__ __forceinline__ static void store_box_chunks(u32 box, const EpilogueArgs& e,
                                                            unsigned short* out, int thread,
                                                            int rows, int cols) {
        const int chunk = thread % kChunksPerBoxRow;
        const int x = chunk * kElemsPerChunk;
        if (x >= cols) return;
        const int first = thread / kChunksPerBoxRow;
        unsigned short* p = out + static_cast<long long>(first) * e.out_row_stride + x;
        const long long step = static_cast<long long>(kBoxRowsPerPass) * e.out_row_stride;
#pragma unroll 1
        for (int r = first; r < rows; r += kBoxRowsPerPass, p += step)
            store_chunk(p, ld_shared_v4(box_elem(box, r, x)), cols - x);
    }

    // Rows that start on 2 bytes every other row: warp w copies box rows w, w + 4, ...
    __device__ __forceinline__ static void store_box_warp_rows(u32 box, const EpilogueArgs& e,
                                                               unsigned short* out, int thread,
                                                               int rows, int cols) {
        const int warp = thread / 32, lane = thread % 32;
#pragma unroll kRowStoreUnroll
        for (int r = warp; r < rows; r += kWarps) {
            unsigned short* p = out + static_cast<long long>(r) * e.out_row_stride;
            if ((reinterpret_cast<u64>(p) & 3) == 0) {  // uniform over the warp
                const int x = 2 * lane;
                if (x + 1 < cols)
                    *reinterpret_cast<u32*>(p + x) = ld_shared_u32(box_elem(box, r, x));
                else if (x < cols)
                    p[x] = ld_shared_u16(box_elem(box, r, x));
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int x = lane + 32 * h;
                    if (x < cols) p[x] = ld_shared_u16(box_elem(box, r, x));
                }
            }
        }
    }

    // The staged box at `box` to the output rows row0 .. row0 + 63, columns col0 .. col0 + 63
    // of batch slice z, clipped at the output's edge.
    __device__ __forceinline__ static void store_box_rows(u32 box, const EpilogueArgs& e,
                                                          int thread,
                                                          int row0, int col0, int z) {
        const int cols = min(e.n - col0, S::kCBoxElems);  // of each row, inside the output
        const int rows = min(e.m - row0, S::kWgmmaM);
        if (cols <= 0) return;
        unsigned short* out = static_cast<unsigned short*>(e.out) +
                              static_cast<long long>(z) * e.out_batch_stride +
                              static_cast<long long>(row0) * e.out_row_stride + col0;
        // col0 is a multiple of 32 elements: a row's start and its box's share alignment.
        const bool rows_on_4_bytes = (reinterpret_cast<u64>(e.out) & 3) == 0 &&
                                     ((e.out_row_stride | e.out_batch_stride) & 1) == 0;
        if (rows_on_4_bytes)
            store_box_chunks(box, e, out, thread, rows, cols);
        else
            store_box_warp_rows(box, e, out, thread, rows, cols);
    }

    // Whole rows. Box by box, the 32-byte sectors at each box's two ends are written in two
    // parts, apart in time (and at a tile's ends by another SM), which DRAM takes at a third of
    // its rate: rows of 64 elements a warp ran at 0.69 TB/s in a store probe, rows of 192 at
    // 1.15-1.24, whole rows of 30 KB at 2.4, 16-byte chunks on rows that start on 16 bytes at
    // 2.5 (NOTES v0.30). Where a consumer's whole row block is staged at once, rows that do not
    // start on 16 bytes go out after its last box, each warp one whole row at a time, 32
    // contiguous elements an instruction.
    static constexpr bool kRowBlockStaged = S::kCBuffers >= kBoxesPerRowBlock;

    __device__ __forceinline__ static bool rows_on_16_bytes(const EpilogueArgs& e) {
        return (reinterpret_cast<u64>(e.out) & 15) == 0 &&
               ((e.out_row_stride | e.out_batch_stride) & (kElemsPerChunk - 1)) == 0;
    }

    // The staged boxes of row block R (columns n0 .. n0 + kBlockN - 1) to the output rows
    // row0 .. row0 + 63 of batch slice z, whole rows, clipped at the output's edge.
    template <int R>
    __device__ __forceinline__ static void store_row_block_rows(const SharedStorage<Cfg>& smem,
                                                                int consumer, int thread,
                                                                int row0, int n0, int z) {
        const EpilogueArgs& e = smem.epilogue;
        const int cols = min(e.n - n0, S::kBlockN);
        const int rows = min(e.m - row0, S::kWgmmaM);
        if (cols <= 0) return;
        unsigned short* out = static_cast<unsigned short*>(e.out) +
                              static_cast<long long>(z) * e.out_batch_stride +
                              static_cast<long long>(row0) * e.out_row_stride + n0;
        u32 boxes[kBoxesPerRowBlock];
#pragma unroll
        for (int b = 0; b < kBoxesPerRowBlock; ++b)
            boxes[b] = smem_addr(smem.c_buffer(consumer, (R * kBoxesPerRowBlock + b) %
                                                             S::kCBuffers));
        const int warp = thread / 32, lane = thread % 32;
#pragma unroll 1
        for (int r = warp; r < rows; r += kWarps) {
            unsigned short* p = out + static_cast<long long>(r) * e.out_row_stride;
#pragma unroll
            for (int b = 0; b < kBoxesPerRowBlock; ++b) {
#pragma unroll
                for (int h = 0; h < S::kCBoxElems / 32; ++h) {
                    const int x = lane + 32 * h;   // of box b
                    if (b * S::kCBoxElems + x < cols)
                        p[b * S::kCBoxElems + x] = ld_shared_u16(box_elem(boxes[b], r, x));
                }
            }
        }
    }

    // Box BOX of row block R and every later one, each through the next staging box of the
    // ring (the I-th box of the tile goes through staging box I % kCBuffers).
    template <int R, int BOX, int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store_boxes(const float (&acc)[ROW_BLOCKS][NREG],
                                                       const TensorMap* map_c,
                                                       const SharedStorage<Cfg>& smem,
                                                       int consumer, int thread, int row0,
                                                       int n0, int z) {
        if constexpr (R < ROW_BLOCKS) {
            constexpr int kIndex = R * kBoxesPerRowBlock + BOX;
            constexpr int kBuffer = kIndex % S::kCBuffers;
            const u32 barrier = kBarrierEpilogueBase + consumer;
            if constexpr (kIndex >= S::kCBuffers) {
                // The store kCBuffers boxes back read this staging box: it must be done reading
                // (a row store's reads are the warpgroup's own, done before the barrier).
                if (!Cfg::kRowStore && thread == 0) bulk_wait_group_read<S::kCBuffers - 1>();
                named_barrier_sync(barrier, kWarpgroupThreads);
            }
            unsigned char* box = smem.c_buffer(consumer, kBuffer);
            stage_box<BOX>(acc[R], smem_addr(box), thread, smem.epilogue, row0 + R * S::kWgmmaM,
                           n0, z);
            // (A row store reads the box with ordinary loads; the fence costs it next to
            // nothing and keeps one sequence for both.)
            fence_proxy_async_smem();
            named_barrier_sync(barrier, kWarpgroupThreads);
            if constexpr (Cfg::kRowStore) {
                if (!kRowBlockStaged || rows_on_16_bytes(smem.epilogue))
                    store_box_rows(smem_addr(box), smem.epilogue, thread,
                                   row0 + R * S::kWgmmaM, n0 + BOX * S::kCBoxElems, z);
                else if (BOX + 1 == kBoxesPerRowBlock)
                    store_row_block_rows<R>(smem, consumer, thread, row0 + R * S::kWgmmaM, n0,
                                            z);
            } else if (thread == 0) {
                // Transposed, the box's rows are the kernel's columns, and its columns the
                // kernel's rows.
                if constexpr (Cfg::kTransC)
                    tma_store_3d(map_c, box, row0 + R * S::kWgmmaM, n0 + BOX * kTmaBoxElems, z);
                else
                    tma_store_3d(map_c, box, n0 + BOX * S::kCBoxElems, row0 + R * S::kWgmmaM, z);
                bulk_commit_group();
            }
            constexpr bool kLastOfRow = BOX + 1 == kBoxesPerRowBlock;
            store_boxes<kLastOfRow ? R + 1 : R, kLastOfRow ? 0 : BOX + 1>(
                acc, map_c, smem, consumer, thread, row0, n0, z);
        }
    }

    // The stores are left in flight (finish() waits for them). With Cfg::kOverlapStore
    // (persistent kernels) the next tile's main loop runs meanwhile; the previous tile's stores
    // had that whole main loop to finish reading the staging boxes, so the wait for them at
    // the start of this epilogue costs nothing in the steady state.
    template <int ROW_BLOCKS, int NREG>
    __device__ __forceinline__ static void store(const float (&acc)[ROW_BLOCKS][NREG],
                                                 const TensorMap* map_c,
                                                 const SharedStorage<Cfg>& smem, int consumer,
                                                 int thread, int row0, int n0, int z) {
        static_assert(ROW_BLOCKS * kBoxesPerRowBlock >= S::kCBuffers,
                      "no more staging boxes than the consumer's part of the tile has");
        if (Cfg::kOverlapStore) {
            if (!Cfg::kRowStore && thread == 0) bulk_wait_group_read<0>();
            named_barrier_sync(kBarrierEpilogueBase + consumer, kWarpgroupThreads);
        }
        store_boxes<0, 0>(acc, map_c, smem, consumer, thread, row0, n0, z);
    }

    // Before the CTA exits: shared memory must stay valid until the last store has read it,
    // and the grid's writes must be complete when the kernel ends.
    __device__ __forceinline__ static void finish(int thread) {
        if (!Cfg::kRowStore && thread == 0) bulk_wait_group_0();
    }
};

}  // namespace hopmm

// Compile-time description of one kernel instance and the shared-memory plan derived from it.
// The Python renderer defines a `struct Config` with the fields read here; everything else is
// derived, so the Python side and the kernel can never disagree about byte counts.
#pragma once
#include "wgmma.cuh"
#include "cluster.cuh"
#include "epilogue_functors.cuh"

namespace hopmm {

constexpr int kElemBytes = 2;        // fp16 / bf16 operands and output
constexpr int kTmaBoxElems = 64;     // one 128-byte swizzle row of 16-bit elements
constexpr u32 kSmemAlign = 1024;     // 128B-swizzle pattern period: tiles start on it

// Register split between the producer warpgroup and the consumer warpgroups (setmaxnreg):
// the producer keeps kProducerRegs, the consumers share the rest of the SM's 65,536 registers
// in steps of 8. Two consumers: 128 * 40 + 256 * 232 = 64,512; three: 128 * 40 + 384 * 152
// = 63,488 (a 64 x 192 accumulator is 96 of them).
constexpr u32 kRegisterFile = 65536;
constexpr u32 kProducerRegs = 40;
constexpr u32 kMaxRegsPerThread = 256;
constexpr u32 kSetmaxnregStep = 8;
__host__ __device__ constexpr u32 consumer_regs(int consumers) {
    const u32 share = (kRegisterFile - kWarpgroupThreads * kProducerRegs) /
                      (consumers * kWarpgroupThreads) / kSetmaxnregStep * kSetmaxnregStep;
    return share < kMaxRegsPerThread ? share : kMaxRegsPerThread;
}

// Named barrier ids (0 belongs to __syncthreads; the hardware has 16).
constexpr u32 kMaxConsumers = 3;  // consumer warpgroups of a CTA: up to a 192-row tile
constexpr u32 kBarrierEpilogueBase = 1;   // + consumer index
// Ping-pong: consumer c waits on kBarrierTurnBase + c for its turn on the tensor cores.
constexpr u32 kBarrierTurnBase = kBarrierEpilogueBase + kMaxConsumers;  // + consumer index
constexpr u32 kNamedBarriers = 16;
static_assert(kBarrierTurnBase + kMaxConsumers <= kNamedBarriers, "named barrier ids run out");

template <class Cfg>
struct TileShape {
    static constexpr int kBlockM = Cfg::kBlockM;
    static constexpr int kBlockN = Cfg::kBlockN;
    static constexpr int kBlockK = Cfg::kBlockK;
    static constexpr int kStages = Cfg::kStages;
    static constexpr int kConsumers = Cfg::kConsumers;
    static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
    // CTAs per thread-block cluster. In a cluster every CTA's producer writes into every
    // stage of every CTA (multicast), so a stage is free again only once the consumers of all
    // CTAs released it: each consumer arrives on the empty barrier of each CTA.
    static constexpr int kClusterSize = Cfg::kClusterSize;
    static constexpr int kWgmmaM = 64;
    // Rows of an output tile one consumer warpgroup computes and stores: a 64-row share when
    // the consumers split each tile (cooperative), the whole tile when each consumer takes
    // tiles of its own (ping-pong).
    static constexpr int kConsumerRows = Cfg::kConsumerRows;
    static constexpr bool kConsumersShareTile = kConsumerRows < kBlockM;
    static constexpr int kRowBlocks = kConsumerRows / kWgmmaM;  // m64 wgmmas per k16 step
    // Consumer warpgroups that read each stage, each arriving once on its empty barrier.
    static constexpr int kStageReaders = kConsumersShareTile ? kConsumers : 1;
    static constexpr u32 kEmptyArrivals = kStageReaders * kClusterSize;
    static_assert(kConsumers <= (int)kMaxConsumers, "named barrier ids are planned for three");
    static constexpr u32 kConsumerRegs = consumer_regs(kConsumers);
    static_assert(kConsumerRows % kWgmmaM == 0, "a consumer's rows are whole m64 wgmma blocks");
    static_assert(kConsumersShareTile ? kBlockM == kConsumers * kConsumerRows
                                      : kConsumerRows == kBlockM,
                  "the consumers split a tile's rows evenly, or each owns whole tiles");
    static_assert(kBlockK == kTmaBoxElems, "one 128-byte swizzle atom of K per stage");
    static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 160 || kBlockN == 192 ||
                      kBlockN == 256,
                  "N tile: a wgmma N extent wgmma.cuh instantiates");
    // A tile as wide as an odd number of 32 columns (160: the width that fills a wave where
    // 64-wide steps leave a quarter of the SMs idle) loads B in whole 64-wide boxes, the last
    // one half used, and stages C in boxes of 32 columns (kCBoxElems).
    static constexpr bool kHalfBox = kBlockN % kTmaBoxElems != 0;
    static_assert(kBlockN % (kTmaBoxElems / 2) == 0, "N tile: whole 32-column halves of a box");
    // A stage is released only after the next k-block's wgmma group is committed, so one
    // stage would deadlock.
    static_assert(kStages >= 2, "at least two pipeline stages");

    // K-blocks of a k-long reduction (the last one zero-filled past k by TMA).
    __device__ __forceinline__ static int k_blocks(int k) { return (k + kBlockK - 1) / kBlockK; }

    static constexpr u32 kABytes = kBlockM * kBlockK * kElemBytes;
    static constexpr int kBBoxes = (kBlockN + kTmaBoxElems - 1) / kTmaBoxElems;
    static constexpr u32 kBBoxBytes = kTmaBoxElems * kBlockK * kElemBytes;
    static constexpr u32 kBBytes = kBBoxes * kBBoxBytes;
    // B tiles a stage holds: 1, or 2 where two products share A (kernel_dual_b.cuh); each is
    // read against the same A tile.
    static constexpr int kBOperands = Cfg::kBOperands;
    static_assert(kBOperands == 1 || kBOperands == 2, "one B tile per stage, or two");
    static_assert(kBOperands == 1 || kClusterSize == 1, "clusters multicast a single B tile");
    static constexpr u32 kStageBytes = kABytes + kBOperands * kBBytes;   // raw: kARawOffset
    // Rows of a K-major A tile that TMA loads per stage: all kBlockM, or fewer where the
    // problem has fewer rows (decode: M <= 16). The rows past them keep whatever the stage
    // held; each wgmma output row depends on its own A row only, so those rows of C are
    // garbage that the store clips (they lie past M). Whole 8-row swizzle atoms.
    static constexpr int kARows = Cfg::kARows;
    static_assert(kARows % 8 == 0 && kARows > 0 && kARows <= kBlockM,
                  "A loads whole 8-row swizzle atoms of the tile");
    static_assert(kARows == kBlockM || !Cfg::kTransA,
                  "an M-major A tile is loaded in 64-row boxes: trimming is for K-major A");
    static_assert(kARows == kBlockM || kClusterSize == 1, "clusters load whole A tiles");
    // An operand's stage tile is loaded in TMA boxes, each kBlockK deep: 64 rows of a K-major
    // tile (A: all kARows where fewer) or 64 columns of an MN-major one, stacked in the order
    // of their rows, so that a tile's loads can leave out the boxes wholly past M or N
    // (TmaProducer::load_tile). TMA counts a box's zero-filled part as loaded bytes.
    static constexpr int kABoxRows = kARows < kTmaBoxElems ? kARows : kTmaBoxElems;
    static_assert(kARows % kABoxRows == 0, "A's loaded rows are whole boxes");
    static constexpr int kABoxes = kARows / kABoxRows;
    static constexpr u32 kABoxBytes = kABoxRows * kBlockK * kElemBytes;
    // An operand whose rows are not 16-byte aligned (Cfg::kAPitchMod8: a K-major A's row pitch
    // mod 8 elements, Cfg::kBPitchMod8: an N-major B's, whose rows are k rows; 0 where they
    // are) comes through kPhases maps of every eighth row (PhasedTensorMaps). TMA starts a box
    // only on a 16-byte boundary of a row, so each phase's rows arrive shifted by that phase's
    // lead (the elements between the boundary and the row's start, TmaProducer::phase_lead):
    // each stage has a raw buffer per such operand, in which every 64-row block of its tile (A:
    // 64 m rows of the K-block; B: the K-block's 64 k rows of 64 columns) is one box of
    // kPhaseRows rows per phase, each row kRawRowElems long (64 elements and room for the
    // lead), and the producer warpgroup's other warps copy it, shifted back and in row order,
    // into the stage's tile (PhasedFixup). Rows of the raw buffer are unswizzled; the tile is
    // what wgmma reads. Either tile is whole 64-row blocks of 128-byte rows, swizzled alike.
    static constexpr bool kPhasedA = Cfg::kAPitchMod8 != 0;
    static constexpr bool kPhasedB = Cfg::kBPitchMod8 != 0;
    static constexpr bool kPhased = kPhasedA || kPhasedB;
    static constexpr int kPhaseRows = kTmaBoxElems / kPhases;
    static constexpr int kRawRowElems = kTmaBoxElems + kPhases;
    static constexpr u32 kRawRowBytes = kRawRowElems * kElemBytes;
    static constexpr u32 kRawBoxBytes = kPhaseRows * kRawRowBytes;
    static constexpr u32 kRawBlockBytes = kPhases * kRawBoxBytes;   // of a 64-row block
    static constexpr int kARawBlocks = kPhasedA ? kBlockM / kTmaBoxElems : 0;
    static constexpr int kBRawBlocks = kPhasedB ? kBlockN / kTmaBoxElems : 0;
    static constexpr u32 kARawBytes = kARawBlocks * kRawBlockBytes;
    static constexpr u32 kBRawBytes = kBRawBlocks * kRawBlockBytes;
    static constexpr u32 kTmaSmemAlign = 128;   // an unswizzled box's shared-memory start
    static_assert(kRawBoxBytes % kTmaSmemAlign == 0, "raw boxes start where TMA writes");
    static_assert(Cfg::kAPitchMod8 >= 0 && Cfg::kAPitchMod8 < kPhases &&
                  Cfg::kBPitchMod8 >= 0 && Cfg::kBPitchMod8 < kPhases, "a pitch mod 8");
    static_assert(!kPhasedA || (!Cfg::kTransA && kARows == kBlockM),
                  "phased A: whole K-major A tiles");
    static_assert(!kPhasedB || Cfg::kTransB, "phased B: N-major B tiles");
    static_assert(!kPhased || (kClusterSize == 1 && kBOperands == 1),
                  "phased operands: one B, no multicast");
    // The producer warpgroup's threads that shift raw stages into the tiles, one per 16-byte
    // chunk of a row and phase (PhasedFixup): its last two warps (warp 0's first thread
    // issues the loads); each arrives on the stage's full barrier.
    static constexpr int kFixupThreads = kPhased ? (kSwizzleBytes / 16) * kPhases : 0;
    static_assert(kFixupThreads <= kWarpgroupThreads - 32, "warp 0 issues the loads");
    static_assert(!(kHalfBox && (kPhasedB || kClusterSize > 1 || Cfg::kSplitK ||
                                 Cfg::kTransC)),
                  "a half box of B or C: one CTA's tile, B through one map, a plain store");
    // Epilogue staging (epilogue_tma_store.cuh): per consumer a ring of kCBuffers boxes of 64
    // rows x kCBoxElems columns, between 1 and the consumer's whole part of the tile
    // (kCBoxesPerConsumer).
    static constexpr int kCBoxElems = kHalfBox ? kTmaBoxElems / 2 : kTmaBoxElems;
    static constexpr u32 kCBoxRowBytes = kCBoxElems * kElemBytes;  // and the box's swizzle span
    static constexpr u32 kCBoxBytes = kWgmmaM * kCBoxRowBytes;
    static constexpr int kCBoxesPerConsumer = kRowBlocks * (kBlockN / kCBoxElems);
    static constexpr int kCBuffers = Cfg::kCBuffers;
    static_assert(kCBuffers >= 1 && kCBuffers <= kCBoxesPerConsumer,
                  "a staging ring of at least one box and at most the consumer's tile");
    static constexpr u32 kC16BytesPerConsumer = kCBuffers * kCBoxBytes;
    // Split-K (Cfg::kSplitK) stages an fp32 partial in the same place: kBlockN / 32 boxes of
    // 64 rows x 32 floats (128 bytes, one swizzle row). A consumer either stages the partial
    // (splits before the last) or the 16-bit result (the last split), never both, so the two
    // share memory with no barrier between them.
    static constexpr int kF32BoxElems = kSwizzleBytes / 4;
    static constexpr u32 kF32BoxBytes = kWgmmaM * kSwizzleBytes;
    static constexpr u32 kF32BytesPerConsumer = (kBlockN / kF32BoxElems) * kF32BoxBytes;
    static_assert(!Cfg::kSplitK || kRowBlocks == 1, "split-K consumers share each tile");
    static constexpr u32 kCBytesPerConsumer =
        Cfg::kSplitK && kF32BytesPerConsumer > kC16BytesPerConsumer ? kF32BytesPerConsumer
                                                                    : kC16BytesPerConsumer;

    static constexpr u32 kAOffset = 0;
    static constexpr u32 kBOffset = kAOffset + kStages * kABytes;
    static constexpr u32 kARawOffset = kBOffset + kStages * kBOperands * kBBytes;
    static constexpr u32 kBRawOffset = kARawOffset + kStages * kARawBytes;
    static constexpr u32 kCOffset = kBRawOffset + kStages * kBRawBytes;
    static constexpr u32 kBarrierOffset = kCOffset + kConsumers * kCBytesPerConsumer;
    // full and empty per stage, and the phased operands' raw-buffer barrier.
    static constexpr int kBarriersPerStage = kPhased ? 3 : 2;
    static constexpr u32 kBarrierBytes = kBarriersPerStage * kStages * sizeof(u64);
    // The dynamic allocation is padded so the base can be rounded up to kSmemAlign.
    static constexpr u32 kSmemBytes = kBarrierOffset + kBarrierBytes + kSmemAlign;
    static_assert(kABytes % kSmemAlign == 0 && kBBytes % kSmemAlign == 0 &&
                  kARawBytes % kSmemAlign == 0 && kBRawBytes % kSmemAlign == 0,
                  "tiles stay aligned");
    static_assert(kSmemBytes == Cfg::kSmemBytesExpected,
                  "the Python shared-memory plan (schedules.py) disagrees with this one");

    // First row of the A tile (and of the output tile) that `consumer` computes.
    __device__ __forceinline__ static int consumer_row0(int consumer) {
        return kConsumersShareTile ? consumer * kConsumerRows : 0;
    }
};

// Views of the one dynamic shared-memory allocation.
template <class Cfg>
struct SharedStorage {
    typedef TileShape<Cfg> S;
    unsigned char* base;
    // The fused epilogue's runtime operands (epilogue_functors.cuh), carried with the storage
    // every epilogue already receives; all zero and never read in a plain kernel.
    EpilogueArgs epilogue;

    __device__ __forceinline__ unsigned char* a_tile(int s) const { return base + S::kAOffset + s * S::kABytes; }
    // B tile `operand` (< kBOperands) of stage s.
    __device__ __forceinline__ unsigned char* b_tile(int s, int operand = 0) const {
        return base + S::kBOffset + (s * S::kBOperands + operand) * S::kBBytes;
    }
    // A consumer's epilogue memory: its staging ring (or split-K's fp32 partial).
    __device__ __forceinline__ unsigned char* c_tile(int consumer) const {
        return base + S::kCOffset + consumer * S::kCBytesPerConsumer;
    }
    __device__ __forceinline__ unsigned char* c_buffer(int consumer, int i) const {
        return c_tile(consumer) + i * S::kCBoxBytes;
    }
    __device__ __forceinline__ u64* full_bar(int s) const {
        return reinterpret_cast<u64*>(base + S::kBarrierOffset) + s;
    }
    __device__ __forceinline__ u64* empty_bar(int s) const {
        return reinterpret_cast<u64*>(base + S::kBarrierOffset) + S::kStages + s;
    }
    // The phased operands' raw buffers of stage s and the barrier their loads complete on.
    __device__ __forceinline__ unsigned char* a_raw(int s) const {
        return base + S::kARawOffset + s * S::kARawBytes;
    }
    __device__ __forceinline__ unsigned char* b_raw(int s) const {
        return base + S::kBRawOffset + s * S::kBRawBytes;
    }
    __device__ __forceinline__ u64* raw_bar(int s) const {
        return reinterpret_cast<u64*>(base + S::kBarrierOffset) + 2 * S::kStages + s;
    }
};

// A consumer is done reading stage s: it tells the producer(s) that refill it. In a cluster
// that is every CTA's producer, each of which waits on its own CTA's empty barrier.
template <class Cfg>
__device__ __forceinline__ void release_stage(const SharedStorage<Cfg>& smem, int s) {
    typedef TileShape<Cfg> S;
    if constexpr (S::kClusterSize == 1) {
        mbar_arrive(smem.empty_bar(s));
    } else {
        const u32 local = smem_addr(smem.empty_bar(s));
#pragma unroll
        for (int rank = 0; rank < S::kClusterSize; ++rank)
            mbar_arrive_cluster(mapa_shared(local, rank));
    }
}

// Rounds the dynamic shared memory up to kSmemAlign, initialises the stage barriers and
// prefetches the tensor maps (thread 0), then synchronises the CTA: every skeleton's prologue.
// Launched with programmatic stream serialization (launch.py), the kernel may start while the
// previous kernel of the stream still runs: this prologue touches only shared memory and the
// kernel's parameters, and grid_dependency_wait() at its end holds every global-memory access
// (TMA loads and stores, split-K's workspace) until that kernel's writes are visible. No
// kernel issues griddepcontrol.launch_dependents, so the next kernel is scheduled as this one's
// CTAs exit: issued from the prologue, that trigger cost long kernels 2-5 % on an H100
// (bench/NOTES.md v0.7); after the producer's last load, grids of 68-107 CTAs over long main
// loops up to 5.8 us a call on an H200, and before gemv's store 1 x 8192 x 8192 2 us (v0.64).
template <class Cfg>
__device__ __forceinline__ SharedStorage<Cfg> setup_shared_storage(unsigned char* smem_raw,
                                                                   const TensorMap* map_a,
                                                                   const TensorMap* map_b,
                                                                   const TensorMap* map_c,
                                                                   const EpilogueArgs& epilogue) {
    typedef TileShape<Cfg> S;
    SharedStorage<Cfg> smem;
    smem.epilogue = epilogue;
    smem.base = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<unsigned long long>(smem_raw) + kSmemAlign - 1) & ~(u64)(kSmemAlign - 1));
    if (threadIdx.x == 0) {
        for (int s = 0; s < S::kStages; ++s) {
            // The producer's expect_tx arrive, and the phased operands' shifting threads.
            mbar_init(smem.full_bar(s), 1 + S::kFixupThreads);
            mbar_init(smem.empty_bar(s), S::kEmptyArrivals);  // each reader of each CTA
            if constexpr (S::kPhased) mbar_init(smem.raw_bar(s), 1);
        }
        fence_barrier_init();
        tma_prefetch_map(map_a);
        tma_prefetch_map(map_b);
        if constexpr (!Cfg::kRowStore) tma_prefetch_map(map_c);  // else an address only
    }
    __syncthreads();
    grid_dependency_wait();
    return smem;
}

// Which batch slice of an operand an output batch index z reads: (z / div) % mod. This covers
// a full batch (1, B), a broadcast operand (1, 1) and broadcasting over leading or trailing
// batch dimensions.
struct BatchMap {
    int div;
    int mod;
    __device__ __forceinline__ int operator()(int z) const { return (z / div) % mod; }
};

}  // namespace hopmm

"""Schedules: which snippets fill which slot of which kernel skeleton, for which tile config.

A Schedule is pure description: rendering, the shared-memory plan and the launch geometry
are all computable without a GPU, which is what the CPU test tier checks for every config.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from . import epilogue as epilogue_mod
from . import render
from .epilogue import EpilogueSpec
from .layout import PHASES
from .problem import KERNEL_DTYPES, Problem

WARPGROUP_THREADS = 128
ELEM_BYTES = 2           # fp16 / bf16
TMA_BOX_ELEMS = 64       # one 128-byte swizzle row of 16-bit elements
SMEM_ALIGN = 1024        # the kernel rounds its dynamic smem base up to this
MBARRIER_BYTES = 8
WGMMA_M = 64
BLOCK_M = 2 * WGMMA_M     # two consumer warpgroups of 64 rows each
# Tall tiles: three consumer warpgroups. Their registers (tile_config.cuh's split: 152 a
# consumer) hold one 64 x 192 accumulator set, not two, and shared memory four stages of
# 192 x 192 only beside a one-box epilogue ring.
TALL_BLOCK_M = 3 * WGMMA_M
# The narrowest tile width: one 64-wide box of B, for products of at most that many columns
# (heuristics.NARROW_BLOCK_N), where a 128-wide tile would compute as many columns again that
# no store writes and leave fewer stages.
NARROW_BLOCK_N = 64
# The one width that is not a whole number of 64-wide boxes: B loads a last box half used and
# C is staged and stored in 32-column boxes (KernelConfig.half_box). Where 64-wide steps leave
# a wave a quarter idle (1984 x 1152: 96 tiles of 128 x 192 on 132 SMs, 128 of 128 x 160), it
# fills it; cuBLAS's width on such products (NOTES v0.65, v0.66). 128-row tiles of the
# persistent and overlap kernels only: the skeletons that share B in clusters, split K, pair
# outputs or store C transposed say no.
HALF_BOX_BLOCK_N = 160
WGMMA_NS = (64, 128, 160, 192, 256)  # the N extents csrc/hopmm/wgmma.cuh instantiates
# A stage is released only after the next k-block's wgmma group is committed (wait_group 1),
# so a ring of one stage would deadlock: two is a correctness floor, not only a speed one.
MIN_STAGES = 2
# The register split of the wgmma kernels (tile_config.cuh consumer_regs): the producer
# warpgroup keeps PRODUCER_REGS a thread, the consumers share the rest of the register file in
# setmaxnreg steps, at most MAX_REGS_PER_THREAD each.
REGISTER_FILE = 65536
PRODUCER_REGS = 40
MAX_REGS_PER_THREAD = 256
SETMAXNREG_STEP = 8
# A consumer fetches a whole box's epilogue operands at once where its accumulators leave it
# this many registers, else one pair at a time (epilogue_tma_store.cuh, NOTES v0.19).
EPILOGUE_BOX_FETCH_REGS = 96
# Rows of one 128-byte swizzle atom: TMA boxes of K-major tiles hold whole atoms.
SWIZZLE_ATOM_ROWS = 8
CLUSTER_PAIR = 2          # CTAs per thread-block cluster of the cluster schedule
CLUSTER_QUAD = 4          # ... and of its four-CTA variant
# The epilogue stages each consumer's part of the output tile box by box (64 rows x 64
# columns, one TMA store each) through a ring of staging boxes (epilogue_tma_store.cuh);
# tiles whose width is not a multiple of 64 (160) in boxes of half as many columns.
C_BOX_BYTES = WGMMA_M * TMA_BOX_ELEMS * ELEM_BYTES
# Two staging boxes per consumer at the least, so that one box's store overlaps the staging
# of the next. Stages come first: the ring gets at least this many boxes and then whatever
# the deepest operand ring leaves, up to the consumer's whole part of the tile.
MIN_C_BUFFERS = 2
# ... unless a ring of two leaves fewer than DEEP_STAGES stages and a ring of one box leaves
# more: then the stage wins. 192 x 192 tiles (48 KB a stage): 3 stages and the whole tile ran
# 8-10 % slower than 4 stages and one box in clusters (H100, bench/NOTES.md v0.10). On an H100
# every 128-row tile gets at least DEEP_STAGES stages beside two boxes.
DEEP_STAGES = 4


@dataclass(frozen=True)
class KernelConfig:
    dtype: str
    block_n: int
    stages: int
    trans_a: bool   # A is M-major (a transposed view)
    trans_b: bool   # B is N-major (row-major B)
    block_m: int = BLOCK_M
    block_k: int = TMA_BOX_ELEMS
    consumers: int = 2
    c_buffers: int = MIN_C_BUFFERS  # staging boxes per consumer in the epilogue's ring
    # Rows of a K-major A tile loaded per stage (None: all block_m). Fewer where the problem
    # has fewer rows: TMA then moves no zero-filled rows (tile_config.cuh, kARows).
    a_rows: int | None = None
    # The fused epilogue chain (None: a plain kernel, its name and source as without one).
    epilogue: EpilogueSpec | None = None
    # Whether the epilogue stores the output's rows itself (element stores from the staged
    # boxes) instead of through TMA: for outputs whose rows are not 16-byte aligned, which TMA
    # cannot store (epilogue_tma_store.cuh). Only configs whose schedule says `row_store_fits`.
    row_store: bool = False
    # A K-major A whose row pitch is not a multiple of 16 bytes, read in place: that pitch mod
    # PHASES elements (1-7), which places each phase map's rows (producer_tma.cuh); 0: A
    # through one map. Only for schedules that say `phased_ok`.
    a_pitch_mod8: int = 0
    # The same for an N-major B whose row pitch (between its k rows) is not a multiple of 16
    # bytes.
    b_pitch_mod8: int = 0
    # Whether the kernel computes C^T = B^T A^T and stores it transposed (its rows are the
    # output's columns; transposed_problem): a plain product through TMA stores, on the
    # schedules that say `transposed_store_ok`. trans_a and trans_b describe the kernel's
    # operands, B^T and A^T.
    trans_c: bool = False

    def __post_init__(self):
        if self.dtype not in KERNEL_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.block_n not in WGMMA_NS:
            raise ValueError(f"block_n must be one of {WGMMA_NS}, got {self.block_n}")
        if self.block_m != self.consumers * WGMMA_M:
            raise ValueError("each consumer warpgroup owns 64 rows of the tile")
        if self.block_k != TMA_BOX_ELEMS:
            raise ValueError("block_k is one 128-byte swizzle atom (64 elements)")
        if self.stages < MIN_STAGES:
            raise ValueError(f"at least {MIN_STAGES} pipeline stages, got {self.stages}")
        if self.c_buffers < 1:
            raise ValueError(f"at least one epilogue staging box, got {self.c_buffers}")
        if self.a_rows is not None:
            if self.trans_a:
                raise ValueError("a_rows trims K-major A tiles only")
            if not (0 < self.a_rows < self.block_m and self.a_rows % SWIZZLE_ATOM_ROWS == 0):
                raise ValueError(f"a_rows must be a multiple of {SWIZZLE_ATOM_ROWS} below "
                                 f"block_m = {self.block_m}, got {self.a_rows}")
        for name in ("a_pitch_mod8", "b_pitch_mod8"):
            value = getattr(self, name)
            if not (type(value) is int and 0 <= value < PHASES):
                raise ValueError(f"{name} must be an int in 0..{PHASES - 1}, got {value!r}")
        if self.a_pitch_mod8 and (self.trans_a or self.a_rows is not None):
            raise ValueError("a_pitch_mod8 (phased A): whole K-major A tiles (no a_rows)")
        if self.b_pitch_mod8 and not self.trans_b:
            raise ValueError("b_pitch_mod8 (phased B): an N-major B")
        if (self.trans_c and not self.transposable) or (self.b_pitch_mod8
                                                        and not self.b_phases_ok):
            raise ValueError(f"block_n = {self.block_n} (half a box of B and C): no trans_c "
                             f"or b_pitch_mod8")
        if self.trans_c and (self.epilogue is not None or self.row_store or is_phased(self)):
            raise ValueError("trans_c: a plain product stored through TMA (no epilogue, "
                             "row_store or phase maps)")

    @property
    def half_box(self) -> bool:
        """Whether the tile's width is not a whole number of 64-wide boxes (160): B's last box
        is half read and C goes out in boxes of 32 columns (tile_config.cuh kHalfBox)."""
        return self.block_n % TMA_BOX_ELEMS != 0

    @property
    def b_phases_ok(self) -> bool:
        """Whether B may be read through phase maps (b_pitch_mod8): an N-major B in whole
        boxes (a half box of B comes through one map)."""
        return self.trans_b and not self.half_box

    @property
    def transposable(self) -> bool:
        """Whether the tile may store its result transposed (trans_c): whole boxes of C (a
        half box is staged only as it lies)."""
        return not self.half_box

    @property
    def a_load_rows(self) -> int:
        """Rows of the A tile TMA loads per stage."""
        return self.block_m if self.a_rows is None else self.a_rows

    @property
    def tag(self) -> str:
        layout = ("T" if self.trans_a else "N") + ("N" if self.trans_b else "T")
        dt = "bf16" if self.dtype == "bfloat16" else "f16"
        trim = "" if self.a_rows is None else f"_a{self.a_rows}"
        fused = "" if self.epilogue is None else self.epilogue.tag
        rows = "_rs" if self.row_store else ""
        phased = ((f"_ap{self.a_pitch_mod8}" if self.a_pitch_mod8 else "")
                  + (f"_bp{self.b_pitch_mod8}" if self.b_pitch_mod8 else ""))
        transposed = "_ct" if self.trans_c else ""
        return (f"{dt}_{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}"
                f"_c{self.c_buffers}{trim}{fused}{rows}{phased}{transposed}_{layout}")


def c_box_cols(cfg: KernelConfig) -> int:
    """Columns of the epilogue's staging and TMA store box (tile_config.cuh kCBoxElems): 64,
    or 32 where the tile's width is not a multiple of 64."""
    return TMA_BOX_ELEMS // 2 if cfg.half_box else TMA_BOX_ELEMS


def c_box_bytes(cfg: KernelConfig) -> int:
    """Bytes of one staging box: 64 rows of c_box_cols (C_BOX_BYTES, or half of it)."""
    return C_BOX_BYTES * c_box_cols(cfg) // TMA_BOX_ELEMS


def b_tile_cols(cfg: KernelConfig) -> int:
    """Columns of B a stage holds (tile_config.cuh kBBoxes): whole 64-wide boxes, the last
    one half used where the tile's width is not a multiple of 64."""
    return -(-cfg.block_n // TMA_BOX_ELEMS) * TMA_BOX_ELEMS


def raw_bytes(cfg: KernelConfig) -> int:
    """The phased operands' raw buffers of one stage (tile_config.cuh kARawBytes, kBRawBytes):
    each row of a phased tile (A: block_m rows of the K-block; B: block_k k rows of block_n
    columns) with PHASES elements of room for its lead; 0 where neither is phased."""
    raw_row = (TMA_BOX_ELEMS + PHASES) * ELEM_BYTES
    return raw_row * (cfg.block_m * bool(cfg.a_pitch_mod8)
                      + cfg.block_n // TMA_BOX_ELEMS * cfg.block_k * bool(cfg.b_pitch_mod8))


def transposed_problem(problem: Problem) -> Problem:
    """The transpose of `problem`, C^T = B^T A^T: rows and columns swapped; its A is B^T,
    K-major where B is, and its B is A^T, K-major where A is."""
    return Problem(m=problem.n, n=problem.m, k=problem.k, batch=problem.batch,
                   dtype=problem.dtype, a_major="k" if problem.b_major == "k" else "m",
                   b_major="k" if problem.a_major == "k" else "n")


def kernel_problem(problem: Problem, cfg) -> Problem:
    """The problem a kernel at `cfg` (a KernelConfig or GemvConfig) computes: `problem`, or its
    transpose where the config says trans_c. Every schedule's methods take that problem."""
    return transposed_problem(problem) if cfg.trans_c else problem


def is_phased(cfg: KernelConfig) -> bool:
    """Whether `cfg` reads an operand through phase maps."""
    return bool(cfg.a_pitch_mod8 or cfg.b_pitch_mod8)


# The fewest stages a phased config is offered with (heuristics, the kernels tier): with
# fewer, a stage's loads could not overlap the other stages' wgmmas and its shift
# (predicted), and some two-stage kernels of both operands phased spill registers.
PHASED_MIN_STAGES = 3


def map_type(pitch_mod8: int) -> str:
    """The kernel parameter type of an operand's map: one map, or PHASES of an operand read
    through phase maps (pitch_mod8 > 0)."""
    return "hopmm::PhasedTensorMaps" if pitch_mod8 else "hopmm::TensorMap"


def stage_barriers(cfg: KernelConfig) -> int:
    """mbarriers per stage: full and empty, and the phased operands' raw-buffer barrier."""
    return 3 if is_phased(cfg) else 2


class WarpSpecializedSchedule:
    """One 128 x N output tile per CTA; warpgroup 0 loads with TMA (setmaxnreg.dec), two
    consumer warpgroups share the tile (cooperative), run the wgmma pipeline and store
    through stmatrix + TMA."""

    name = "warp_specialized"
    reads_row_tails = False   # TMA reads no byte past a row (GemvSchedule's does)
    skeleton = "kernel_warp_specialized.cuh"
    slots = {
        "SKELETON": "hopmm::warp_specialized_gemm",
        "PRODUCER": "hopmm::TmaProducer",
        "CONSUMER": "hopmm::WgmmaConsumer",
        "EPILOGUE": "hopmm::TmaStoreEpilogue",
    }
    # Whether a CTA's TMA store stays in flight while the CTA goes on to its next tile.
    overlap_store = False
    # Accumulator sets a consumer holds (2: one tile's epilogue overlaps the next's main loop);
    # the epilogue fetches its operands in smaller parts when registers are that tight.
    accumulator_sets = 1
    # 192 runs level with 256 per tile (4 stages against 3, bench/NOTES.md v0.5) and gives the
    # heuristic a third width against wave quantization.
    block_ns = (128, 192, 256)
    # Widths this schedule also offers as TALL_BLOCK_M-row tiles (three consumer warpgroups).
    tall_block_ns: tuple = ()
    # Widths this schedule also offers as WGMMA_M-row tiles (one consumer warpgroup).
    short_block_ns: tuple = ()
    # CTAs per thread-block cluster (1: no cluster).
    cluster_size = 1
    # The most operand stages worth having (None: as many as fit).
    stage_cap = None
    # Whether the k-blocks of a tile are divided among CTAs (grid y) and reduced in order.
    split_k = False
    # What a Choice's `splits` counts here, as autotune labels it ("k": K splits a tile;
    # "ctas": the grid's CTAs); "" where it is always 1.
    splits_label = ""
    # Kernel parameters after the three operand maps (kernel_entry.cu.in) and the arguments the
    # skeleton gets for them; KernelLaunch passes the extra maps and `pointers` raw device
    # pointers, in that order, before the integers.
    extra_params = ""
    extra_args = ""
    pointers = 0
    # Whether split-K partials go through an fp32 workspace in global memory (and semaphores).
    workspace = False
    # Whether the kernel takes a tensor map of that workspace (before its pointers), or only
    # the pointers.
    workspace_map = True
    # Rows of the output's TMA store box (its columns: TMA_BOX_ELEMS).
    c_box_rows = WGMMA_M
    # Whether the kernel runs in clusters shaped at launch (1 x splits x 1: split_k_cluster),
    # rather than none or the __cluster_dims__ of cluster_size.
    cluster_at_launch = False
    # Whether the epilogue stores accumulator fragments (stmatrix) rather than rows it added
    # up from fp32 partials (st.shared: the parallel and cluster split-K reductions).
    fragment_epilogue = True
    # B tiles per stage: 2 where two products share A (SharedASchedule).
    b_operands = 1
    # Whether the kernel can store its output rows itself (KernelConfig.row_store): the
    # epilogues of whole tiles (TmaStoreEpilogue) with one output.
    row_store_ok = True
    # Whether the kernel can read an operand through phase maps (KernelConfig.a_pitch_mod8,
    # b_pitch_mod8): its producer warpgroup's spare warps shift the raw stages
    # (kernel_persistent.cuh, kernel_warp_specialized.cuh's run_one_tile) where its producer
    # loads single-CTA tiles of one B.
    phased_ok = False
    # Whether the kernel can compute the transposed product and store it transposed
    # (KernelConfig.trans_c): the persistent kernels, whose epilogue is TmaStoreEpilogue's.
    transposed_store_ok = False

    @classmethod
    def snippets(cls) -> list[str]:
        return ["ptx.cuh", "wgmma.cuh", "tile_config.cuh", "producer_tma.cuh",
                "consumer_wgmma.cuh", "epilogue_tma_store.cuh", "tile_raster.cuh", cls.skeleton]

    # -- shared-memory plan (mirrors TileShape in tile_config.cuh; the kernel static_asserts
    #    that both agree) --
    @classmethod
    def stage_bytes(cls, cfg: KernelConfig) -> int:
        """A stage's operand tiles, and the phased operands' raw buffers (raw_bytes)."""
        return ((cfg.block_m + cls.b_operands * b_tile_cols(cfg)) * cfg.block_k * ELEM_BYTES
                + raw_bytes(cfg))

    @classmethod
    def stage_load_bytes(cls, cfg: KernelConfig) -> int:
        """Bytes TMA brings into one stage: the A rows it loads and the B tile(s)."""
        return (cfg.a_load_rows + cls.b_operands * b_tile_cols(cfg)) * cfg.block_k * ELEM_BYTES

    @classmethod
    def c_boxes(cls, cfg: KernelConfig) -> int:
        """Staging boxes of one consumer's whole part of the output tile."""
        return cls.consumer_rows(cfg) // WGMMA_M * (cfg.block_n // c_box_cols(cfg))

    @classmethod
    def epilogue_bytes(cls, cfg: KernelConfig) -> int:
        return cfg.consumers * cfg.c_buffers * c_box_bytes(cfg)

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        """How the epilogue's shared memory is laid out (hopmm.explain)."""
        whole = cls.c_boxes(cfg)
        ring = ("the whole tile" if cfg.c_buffers == whole
                else f"a ring of {cfg.c_buffers} of its {whole} 64x{c_box_cols(cfg)} boxes")
        return (f"separate epilogue staging, {ring} per consumer"
                + (", stores overlap the next tile" if cls.overlap_store else ""))

    @classmethod
    def smem_bytes(cls, cfg: KernelConfig) -> int:
        barriers = stage_barriers(cfg) * cfg.stages * MBARRIER_BYTES
        return cfg.stages * cls.stage_bytes(cfg) + cls.epilogue_bytes(cfg) + barriers + SMEM_ALIGN

    @classmethod
    def max_stages(cls, cfg: KernelConfig, smem_limit: int) -> int:
        fixed = cls.epilogue_bytes(cfg) + SMEM_ALIGN
        per_stage = cls.stage_bytes(cfg) + stage_barriers(cfg) * MBARRIER_BYTES
        return (smem_limit - fixed) // per_stage

    @classmethod
    def phased_config(cls, cfg: KernelConfig, a_pitch_mod8: int, b_pitch_mod8: int,
                      smem_limit: int) -> KernelConfig:
        """`cfg` reading A, B or both through phase maps (a_pitch_mod8, b_pitch_mod8; 0: not
        that one) with the most stages, at most its own, that fit beside their raw buffers
        (raw_bytes), from an epilogue ring of its own size down to one box (at least
        MIN_STAGES, which may not fit: callers check). A phased A loads whole tiles (no
        a_rows)."""
        best = None
        for c_buffers in range(cfg.c_buffers, 0, -1):
            phased = replace(cfg, a_pitch_mod8=a_pitch_mod8, b_pitch_mod8=b_pitch_mod8,
                             c_buffers=c_buffers, a_rows=None if a_pitch_mod8 else cfg.a_rows)
            stages = max(MIN_STAGES, min(cfg.stages, cls.max_stages(phased, smem_limit)))
            if best is None or stages > best.stages:
                best = replace(phased, stages=stages)
        return best

    @classmethod
    def tile_shapes(cls) -> list[tuple[int, int]]:
        """(block_m, block_n) of every output tile this schedule computes."""
        return ([(BLOCK_M, n) for n in cls.block_ns]
                + [(TALL_BLOCK_M, n) for n in cls.tall_block_ns]
                + [(WGMMA_M, n) for n in cls.short_block_ns])

    @classmethod
    def check(cls, cfg: KernelConfig) -> None:
        """ValueError for a config this schedule cannot render."""
        if (cfg.block_m, cfg.block_n) not in cls.tile_shapes():
            shapes = ", ".join(f"{m}x{n}" for m, n in cls.tile_shapes())
            raise ValueError(f"{cls.name}: the tile must be one of {shapes}, got "
                             f"{cfg.block_m}x{cfg.block_n}")
        if cfg.row_store and not cls.row_store_fits(cfg):
            raise ValueError(f"{cls.name}: no row_store for {cfg.tag} (its epilogue stores "
                             f"through TMA only, or has no registers for both)")
        if cfg.c_buffers > cls.c_boxes(cfg):
            raise ValueError(f"{cls.name}: at most {cls.c_boxes(cfg)} epilogue staging boxes "
                             f"per consumer (its part of the tile), got {cfg.c_buffers}")
        if is_phased(cfg) and not cls.phased_ok:
            raise ValueError(f"{cls.name}: reads each operand through one map (no "
                             f"a_pitch_mod8 or b_pitch_mod8)")
        if cfg.trans_c and not cls.transposed_store_ok:
            raise ValueError(f"{cls.name}: stores its output as computed (no trans_c)")

    @classmethod
    def row_store_fits(cls, cfg: KernelConfig) -> bool:
        """Whether `cfg` can store its output by rows (KernelConfig.row_store): where the
        schedule offers it, and in a kernel of two accumulator sets only where they leave
        registers to spare (two 64 x 192 sets spilled with it, NOTES v0.24; the heuristic
        moves such calls to the single-set kernel, heuristics.row_store_choice)."""
        return cls.row_store_ok and (cls.accumulator_sets == 1
                                     or cls.epilogue_fetches_boxes(cfg))

    @staticmethod
    def box_rows(cfg: KernelConfig) -> tuple[int, int]:
        """Rows (M for A, N for B) of one TMA box of a K-major A and a K-major B: 64 (A: the
        rows it loads where fewer), so that a tile's loads can leave out the boxes wholly past
        the problem's edge (producer_tma.cuh). (MN-major operands are read in 64 x 64
        boxes.)"""
        return min(TMA_BOX_ELEMS, cfg.a_load_rows), TMA_BOX_ELEMS

    @classmethod
    def mn_box_k_rows(cls, cfg: KernelConfig) -> int:
        """k rows of one TMA box of an MN-major B (its columns: 64 of N): a whole k-block."""
        return cfg.block_k

    @staticmethod
    def consumer_rows(cfg: KernelConfig) -> int:
        """Rows of an output tile one consumer warpgroup computes: the consumers split each
        tile."""
        return cfg.block_m // cfg.consumers

    @classmethod
    def epilogue_fetches_boxes(cls, cfg: KernelConfig) -> bool:
        """Whether this kernel's epilogue loads a whole box of bias / c at once (else one pair
        at a time, waiting on each load: a fused epilogue that reads them runs slower)."""
        share = ((REGISTER_FILE - WARPGROUP_THREADS * PRODUCER_REGS)
                 // (cfg.consumers * WARPGROUP_THREADS) // SETMAXNREG_STEP * SETMAXNREG_STEP)
        accumulators = (cls.accumulator_sets * (cls.consumer_rows(cfg) // WGMMA_M)
                        * cfg.block_n // 2)
        return min(share, MAX_REGS_PER_THREAD) - accumulators >= EPILOGUE_BOX_FETCH_REGS

    @classmethod
    def consumer_roles(cls, cfg: KernelConfig) -> str:
        """How the consumer warpgroups divide the work (hopmm.explain shows it)."""
        tile = f"{cfg.block_m}x{cfg.block_n} tile" + (" of C^T" if cfg.trans_c else "")
        if cfg.consumers == 1:
            return f"1 warpgroup computes each {tile}"
        return f"{cfg.consumers} warpgroups share each {tile}, {cls.consumer_rows(cfg)} rows each"

    @staticmethod
    def threads(cfg: KernelConfig) -> int:
        return (1 + cfg.consumers) * WARPGROUP_THREADS

    @staticmethod
    def k_blocks(problem: Problem, cfg: KernelConfig) -> int:
        """k-blocks of one output tile's main loop (all of K; split-K divides them)."""
        return -(-problem.k // cfg.block_k)

    kernel_problem = staticmethod(kernel_problem)

    @staticmethod
    def tiles(problem: Problem, cfg: KernelConfig) -> tuple[int, int]:
        """(M tiles, N tiles) of one batch slice."""
        return -(-problem.m // cfg.block_m), -(-problem.n // cfg.block_n)

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        """One CTA per tile: x is the linear tile index (ordered by the raster), z the batch."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (tiles_m * tiles_n, 1, batch_count)

    @classmethod
    def resident_ctas(cls, device) -> int:
        """The CTAs of this kernel that run at once on `device` (grid's `sm_count`): one per
        SM."""
        return device.sm_count

    @classmethod
    def check_grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                   raster_group: int, splits: int) -> None:
        """ValueError for a launch the kernel cannot run (grid checks its own bounds; stream_k
        has more)."""

    @classmethod
    def launch_cluster(cls, splits: int = 1) -> tuple[int, int, int]:
        """The cluster shape given at launch; (1, 1, 1) for none (or one fixed by
        __cluster_dims__, which the cluster_size schedules carry)."""
        return (1, splits, 1) if cls.cluster_at_launch else (1, 1, 1)

    @classmethod
    def kernel_name(cls, cfg: KernelConfig) -> str:
        return f"hopmm_{cls.name}_{cfg.tag}"

    @classmethod
    def render(cls, cfg: KernelConfig) -> render.RenderedKernel:
        cls.check(cfg)
        fields = {
            "kBlockM": cfg.block_m, "kBlockN": cfg.block_n, "kBlockK": cfg.block_k,
            "kStages": cfg.stages, "kConsumers": cfg.consumers,
            "kConsumerRows": cls.consumer_rows(cfg),
            "kBf16": cfg.dtype == "bfloat16", "kTransA": int(cfg.trans_a),
            "kTransB": int(cfg.trans_b), "kOverlapStore": cls.overlap_store,
            "kAccumulatorSets": cls.accumulator_sets,
            "kEpilogueFetchesBoxes": cls.epilogue_fetches_boxes(cfg),
            "kClusterSize": cls.cluster_size, "kSplitK": cls.split_k,
            "kCBuffers": cfg.c_buffers, "kARows": cfg.a_load_rows,
            "kBOperands": cls.b_operands, "kRowStore": cfg.row_store,
            "kAPitchMod8": cfg.a_pitch_mod8, "kBPitchMod8": cfg.b_pitch_mod8,
            "kTransC": cfg.trans_c, "kSmemBytesExpected": cls.smem_bytes(cfg),
            **EpilogueSpec.config_fields(cfg.epilogue),
            **cls.own_config_fields(),
        }
        fused = cfg.epilogue is not None
        return render.render_kernel(cls.kernel_name(cfg), cls.snippets(), fields,
                                    dict(cls.slots, THREADS=str(cls.threads(cfg)),
                                         MAP_A_TYPE=map_type(cfg.a_pitch_mod8),
                                         MAP_B_TYPE=map_type(cfg.b_pitch_mod8),
                                         EXTRA_PARAMS=cls.extra_params,
                                         EXTRA_ARGS=cls.extra_args,
                                         EPILOGUE_PARAMS=epilogue_mod.POINTER_PARAMS * fused,
                                         EPILOGUE_SCALARS=epilogue_mod.SCALAR_PARAMS * fused,
                                         ROW_STORE_SCALARS=(epilogue_mod.ROW_STORE_PARAMS
                                                            * cfg.row_store),
                                         EPILOGUE_ARGS=epilogue_mod.call_args(fused,
                                                                              cfg.row_store)))

    @classmethod
    def own_config_fields(cls) -> dict:
        """Config fields only this schedule's skeleton reads."""
        return {}

    @classmethod
    def launch_pointers(cls, cfg: KernelConfig) -> int:
        """Raw device pointers the kernel takes after its maps: the schedule's own, then a
        fused epilogue's bias and c."""
        return cls.pointers + (epilogue_mod.POINTERS if cfg.epilogue is not None else 0)

    @classmethod
    def deepest(cls, dtype: str, block_n: int, trans_a: bool, trans_b: bool,
                smem_limit: int, block_m: int = BLOCK_M) -> KernelConfig | None:
        """The config with as many stages as fit in `smem_limit` next to an epilogue ring of
        MIN_C_BUFFERS boxes per consumer (or of one box, where a ring of two leaves fewer than
        DEEP_STAGES stages and one box leaves more; at most stage_cap), and then the largest
        ring that still fits (at most the consumer's whole part of the tile); None if fewer
        than MIN_STAGES fit."""
        probe = KernelConfig(dtype=dtype, block_n=block_n, stages=MIN_STAGES, trans_a=trans_a,
                             trans_b=trans_b, block_m=block_m, consumers=block_m // WGMMA_M)
        probe = replace(probe, c_buffers=min(MIN_C_BUFFERS, cls.c_boxes(probe)))
        stages = cls.max_stages(probe, smem_limit)
        one_box = replace(probe, c_buffers=1)
        one_box_stages = cls.max_stages(one_box, smem_limit)
        if stages < DEEP_STAGES and one_box_stages > stages:
            probe, stages = one_box, one_box_stages
        if cls.stage_cap is not None:
            stages = min(stages, cls.stage_cap)
        if stages < MIN_STAGES:
            return None
        cfg = replace(probe, stages=stages)
        for c_buffers in range(cls.c_boxes(cfg), cfg.c_buffers, -1):
            if cls.smem_bytes(replace(cfg, c_buffers=c_buffers)) <= smem_limit:
                return replace(cfg, c_buffers=c_buffers)
        return cfg

    @classmethod
    def configs(cls, smem_limit: int) -> list[KernelConfig]:
        """Every config this schedule can be asked for: each tile shape, dtype and layout, with
        the deepest pipeline that fits."""
        out = []
        for (block_m, block_n), dtype, ta, tb in itertools.product(
                cls.tile_shapes(), KERNEL_DTYPES, (False, True), (False, True)):
            cfg = cls.deepest(dtype, block_n, ta, tb, smem_limit, block_m)
            if cfg is not None:
                out.append(cfg)
        return out


class PersistentSchedule(WarpSpecializedSchedule):
    """The same slots in a persistent skeleton: at most one CTA per SM walks the tiles, the
    producer runs ahead into the next tile while the consumers store this one, and the stage
    ring carries across tiles (seed 003)."""

    name = "persistent"
    skeleton = "kernel_persistent.cuh"
    slots = dict(WarpSpecializedSchedule.slots, SKELETON="hopmm::persistent_gemm")
    phased_ok = True
    # This kernel and the overlap kernel; the skeletons built on it say no (the heuristic
    # offers the transpose on these two only, heuristics._transposed_choice).
    transposed_store_ok = True
    overlap_store = True
    block_ns = (NARROW_BLOCK_N, 128, HALF_BOX_BLOCK_N, 192, 256)
    # 64-row tiles: where the 128-row tiles leave SMs idle in their last (or only) wave, twice
    # as many tiles of half the area can fill more of them (heuristics.SHORT_TILE_MIN_GAIN).
    # The 64 x 64 tile is autotuned only: the heuristic rates only tiles with a speed in
    # heuristics.TILE_SPEED (_fastest_tile, _main_configs), and it has none yet (NOTES v0.57).
    short_block_ns = (NARROW_BLOCK_N,) + WarpSpecializedSchedule.block_ns

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (min(sm_count, tiles_m * tiles_n * batch_count), 1, 1)


class PersistentClusterSchedule(PersistentSchedule):
    """The persistent kernel in thread-block clusters of two CTAs that compute vertically
    adjacent tiles (M tiles 2i and 2i + 1 of one N column) and so share their B tile: each CTA
    loads its own A tile and half of B, and TMA multicasts that half into both CTAs. B is the
    operand shared because it is the larger one of a 128 x 256 tile: per k-block a CTA then
    pulls 128 + 128 rows from L2 instead of 128 + 256 (a third less; sharing A across adjacent
    N tiles would save a sixth). With 128 x 128 tiles the saving is a quarter either way.
    Tiles 2i, 2i + 1 are neighbours in the grouped raster, which the cluster walks pair by
    pair."""

    name = "persistent_cluster"
    transposed_store_ok = False
    phased_ok = False   # the multicast producer loads each operand in one map
    skeleton = "kernel_persistent_cluster.cuh"
    cluster_size = CLUSTER_PAIR
    # N-major B: the CTAs deal the tile's 64-wide boxes out round-robin (192: two and one);
    # K-major B: each loads block_n / 2 rows, whole 8-row swizzle atoms for every width.
    block_ns = (128, 192, 256)
    # 192 x 192: per k-block a CTA requests 192 + 96 box rows for 192 x 192 outputs, against
    # 128 + 96 for 128 x 192: 14 % fewer per output element, which counts where rows are not
    # whole cache lines (bench/NOTES.md v0.10: 3000³ bf16 0.98-1.01 x cuBLAS against 0.88-0.97
    # on 128 x 192 tiles, H100).
    tall_block_ns = (192,)
    short_block_ns = ()   # a cluster's pair covers 128-row tiles
    slots = dict(PersistentSchedule.slots, SKELETON="hopmm::persistent_cluster_gemm",
                 PRODUCER="hopmm::MulticastTmaProducer",
                 KERNEL_ATTRIBUTES=f"__cluster_dims__({CLUSTER_PAIR}, 1, 1) ")

    @classmethod
    def snippets(cls) -> list[str]:
        return super().snippets() + ["producer_tma_multicast.cuh"]

    @classmethod
    def box_rows(cls, cfg: KernelConfig) -> tuple[int, int]:
        """A K-major A box is 64 rows, as the unclustered kernels'; a K-major B box is one
        CTA's 1/cluster_size slice of the shared B tile."""
        return TMA_BOX_ELEMS, cfg.block_n // cls.cluster_size

    @classmethod
    def mn_box_k_rows(cls, cfg: KernelConfig) -> int:
        """An MN-major B tile of fewer 64-wide boxes than the cluster has CTAs is loaded in k
        slices, one per CTA, of every box (producer_tma_multicast.cuh); otherwise whole boxes
        are dealt out."""
        if cfg.block_n // TMA_BOX_ELEMS < cls.cluster_size:
            return cfg.block_k // cls.cluster_size
        return cfg.block_k

    @classmethod
    def resident_ctas(cls, device) -> int:
        """The CTAs of whole clusters that run at once: a cluster lies inside one GPC, so where
        GPCs differ in size fewer than the SM count (device.cluster_capacity)."""
        clusters = device.clusters_at_once(cls.cluster_size)
        if clusters is None:
            clusters = device.sm_count // cls.cluster_size
        return clusters * cls.cluster_size

    @classmethod
    def pairs(cls, problem: Problem, cfg: KernelConfig, batch_count: int) -> int:
        """Tile groups the clusters walk: ceil(M tiles / cluster_size) x N tiles per slice."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return -(-tiles_m // cls.cluster_size) * tiles_n * batch_count

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        """One cluster per cluster_size of the `sm_count` resident CTAs (resident_ctas; at most
        one per group of tiles); x is a multiple of the cluster size, as __cluster_dims__
        requires."""
        clusters = min(max(1, sm_count // cls.cluster_size),
                       cls.pairs(problem, cfg, batch_count))
        return (clusters * cls.cluster_size, 1, 1)

    @classmethod
    def cta_tiles(cls, cta: int, clusters: int, tiles_m: int, tiles_n: int, group: int,
                  batch_count: int) -> list[tuple[int, int, int]]:
        """(batch, M tile, N tile) of every tile CTA `cta` (blockIdx.x) of a grid of `clusters`
        clusters computes, in order, including a tile past the last M tile (computed, never
        stored): kernel_persistent_cluster.cuh's walk, for the tests."""
        from .layout import grouped_raster

        cluster, rank = divmod(cta, cls.cluster_size)
        pairs_m = -(-tiles_m // cls.cluster_size)
        pair_group = -(-group // cls.cluster_size)
        per_slice = pairs_m * tiles_n
        out = []
        for p in range(cluster, per_slice * batch_count, clusters):
            pair_m, n_tile = grouped_raster(p % per_slice, pairs_m, tiles_n, pair_group)
            out.append((p // per_slice, pair_m * cls.cluster_size + rank, n_tile))
        return out


class PersistentClusterQuadSchedule(PersistentClusterSchedule):
    """The cluster kernel in clusters of four CTAs on vertically adjacent tiles: each loads its
    A tile and a quarter of the shared B tile. For tall products of few columns, whose tiles
    (64-row ones among them) each read all of a narrow B: per k-block a 64 x 192 tile then
    pulls 64 + 48 rows from L2 instead of 64 + 192, the L2 -> SM traffic that bounds such
    products where B's rows are not whole cache lines (each box row then spans two): the
    heuristic takes it there (heuristics.UNALIGNED_B_QUAD_SCHEDULE). On whole-line rows it ran
    no faster than the persistent kernel's tiles, with 120 of an H100's 132 SMs in clusters
    of four (bench/NOTES.md v0.39)."""

    name = "persistent_cluster4"
    cluster_size = CLUSTER_QUAD
    tall_block_ns = ()
    short_block_ns = PersistentClusterSchedule.block_ns
    slots = dict(PersistentClusterSchedule.slots,
                 KERNEL_ATTRIBUTES=f"__cluster_dims__({CLUSTER_QUAD}, 1, 1) ")


class PersistentOverlapSchedule(PersistentSchedule):
    """The persistent kernel with two accumulator sets per consumer: each tile's epilogue
    runs while the tensor cores work on the next tile's first k-block
    (kernel_persistent_overlap.cuh). Two sets of a 64 x N accumulator tile must fit a
    consumer's registers, so 128, 160 and 192 wide only."""

    name = "persistent_overlap"
    skeleton = "kernel_persistent_overlap.cuh"
    slots = dict(PersistentSchedule.slots, SKELETON="hopmm::persistent_overlap_gemm")
    accumulator_sets = 2
    block_ns = (128, HALF_BOX_BLOCK_N, 192)
    short_block_ns = (128, 192)   # two 64 x 256 sets would take all of a lone consumer's 256


class PersistentClusterOverlapSchedule(PersistentClusterSchedule):
    """Clusters of two CTAs sharing their B tiles (persistent_cluster) whose consumers keep two
    accumulator sets (persistent_overlap): B leaves L2 once per pair, and each tile's epilogue
    runs under the next tile's first k-block (kernel_persistent_cluster_overlap.cuh). 128 and
    192 wide, persistent_overlap's widths of whole boxes."""

    name = "persistent_cluster_overlap"
    skeleton = "kernel_persistent_cluster_overlap.cuh"
    slots = dict(PersistentClusterSchedule.slots,
                 SKELETON="hopmm::persistent_cluster_overlap_gemm")
    accumulator_sets = PersistentOverlapSchedule.accumulator_sets
    block_ns = (128, 192)
    tall_block_ns = ()  # two 64 x 192 sets do not fit a consumer's share of three


class PingPongSchedule(PersistentSchedule):
    """Persistent, but each consumer warpgroup computes whole 128 x 128 tiles of its own
    (consumer 0 the CTA's 1st, 3rd, ... tile, consumer 1 its 2nd, 4th, ...), and named
    barriers make the two take turns on the tensor cores, so one consumer's epilogue overlaps
    the other's main loop (seed 003; FlashAttention-3 / CUTLASS ping-pong)."""

    name = "pingpong"
    transposed_store_ok = False
    skeleton = "kernel_pingpong.cuh"
    slots = dict(PersistentSchedule.slots, SKELETON="hopmm::pingpong_gemm")
    # A whole tile's fp32 accumulators in one warpgroup: 128 registers per thread at 128 x 128;
    # 128 x 256 would need 256, more than setmaxnreg gives a consumer (232).
    block_ns = (128,)
    short_block_ns = ()
    # 6 stages (which fit beside a ring of 2 staging boxes) ran 7-10 % slower than 5 on 8192³,
    # 4096³ and 8192 x 8192 x 1024 (H100, bench/NOTES.md v0.6).
    stage_cap = 5

    @staticmethod
    def consumer_rows(cfg: KernelConfig) -> int:
        return cfg.block_m

    @classmethod
    def consumer_roles(cls, cfg: KernelConfig) -> str:
        return (f"{cfg.consumers} warpgroups take alternate {cfg.block_m}x{cfg.block_n} tiles "
                f"and turns on the tensor cores (ping-pong)")

    @classmethod
    def check(cls, cfg: KernelConfig) -> None:
        if cfg.block_n not in cls.block_ns:
            raise ValueError(f"{cls.name}: block_n must be one of {cls.block_ns} (a consumer "
                             f"holds a whole tile's accumulators), got {cfg.block_n}")
        super().check(cfg)


F32_BYTES = 4
# Boxes of the fp32 workspace map: 32 floats (one 128-byte swizzle row) x 64 rows (one
# consumer warpgroup's rows).
WORKSPACE_BOX = (128 // F32_BYTES, WGMMA_M)


class SplitKSchedule(WarpSpecializedSchedule):
    """One (tile, k-slice) per CTA: the k-blocks of each output tile are divided among
    `splits` CTAs (grid y), whose fp32 partials are combined in split order through a per-tile
    semaphore with TMA store / bulk tensor reduce-add into an fp32 workspace (seed 001); the
    last split adds the workspace to its accumulators and stores the 16-bit result. For
    problems with few output tiles and a long K. `splits` = 1 is the plain kernel."""

    name = "split_k"
    skeleton = "kernel_split_k.cuh"
    slots = dict(WarpSpecializedSchedule.slots, SKELETON="hopmm::split_k_gemm",
                 EPILOGUE="hopmm::SplitKEpilogue")
    split_k = True
    phased_ok = True
    splits_label = "k"
    workspace = True
    row_store_ok = False   # the last split's store and the reductions' go through TMA
    # Few tiles is the point of split-K: 128-wide tiles, and the fp32 partial (128 x 128 x 4 =
    # 64 KB) still leaves 5 stages next to the operand ring; 64-wide ones for products of at
    # most 64 columns (8 stages).
    block_ns = (NARROW_BLOCK_N, 128)
    extra_params = ("\n               const __grid_constant__ hopmm::TensorMap map_w,"
                    "\n               const float* workspace, unsigned* semaphores,")
    extra_args = " &map_w, workspace, semaphores,"
    pointers = 2

    # The snippet that combines the partials.
    reduce_snippet = "split_k_reduce.cuh"

    @classmethod
    def snippets(cls) -> list[str]:
        return super().snippets() + [cls.reduce_snippet]

    @classmethod
    def epilogue_bytes(cls, cfg: KernelConfig) -> int:
        # Per consumer the larger of the 16-bit staging ring and the fp32 partial: a consumer
        # stages one or the other (the last split the result, the others their partial), so
        # they share memory and need no barrier between them (TileShape::kCBytesPerConsumer).
        f32_partial = cls.consumer_rows(cfg) * cfg.block_n * F32_BYTES
        return cfg.consumers * max(cfg.c_buffers * c_box_bytes(cfg), f32_partial)

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return (f"the fp32 partial ({cfg.block_m}x{cfg.block_n}x{F32_BYTES} B) is staged in the "
                f"epilogue's memory, which the 16-bit staging of the last split shares; "
                f"operand stages not reused ({cfg.stages} stages fit beside it)")

    @classmethod
    def max_splits(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                   sm_count: int) -> int:
        """The most splits the co-residency bound allows (tiles * splits * batch <= SMs, see
        kernel_split_k.cuh) and that leave every split at least one k-block; at least 1."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        by_sms = sm_count // (tiles_m * tiles_n * batch_count)
        return max(1, min(by_sms, cls.k_blocks(problem, cfg)))

    # What bounds the split count (max_splits), for grid's error.
    split_bound = "the co-residency bound (tiles x splits x batch <= SMs) and a k-block per split"

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        top = cls.max_splits(problem, cfg, batch_count, sm_count)
        if not 1 <= splits <= top:
            raise ValueError(f"{splits} splits: at most {top} here, by {cls.split_bound}")
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (tiles_m * tiles_n, splits, batch_count)

    @classmethod
    def workspace_shape(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                        splits: int) -> tuple[int, int, int]:
        """(slots, rows, columns) of the fp32 workspace of one launch: the output padded to
        whole tiles, per batch slot; a single tile when splits == 1 (never touched then, but
        the kernel takes a valid map)."""
        if splits == 1:
            return (1, cfg.block_m, cfg.block_n)
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (batch_count, tiles_m * cfg.block_m, tiles_n * cfg.block_n)

    @classmethod
    def semaphore_count(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                        splits: int = 1) -> int:
        """One semaphore per (batch slot, tile, consumer warpgroup)."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return batch_count * tiles_m * tiles_n * cfg.consumers


# The most CTAs of a portable cluster (8 on Hopper without the non-portable opt-in).
MAX_CLUSTER_SPLITS = 8
# Rows of one reduced group and TMA store box of the cluster reduction: one 128-byte swizzle
# period of 16-bit rows (split_k_cluster_reduce.cuh).
CLUSTER_REDUCE_GROUP_ROWS = 8


class SplitKClusterSchedule(SplitKSchedule):
    """Split-K whose `splits` CTAs of an output tile form one thread-block cluster (1 x splits
    x 1, given at launch), which adds their fp32 partials through distributed shared memory,
    in split order, each CTA reducing and storing its share of the tile's rows
    (split_k_cluster_reduce.cuh). The same sums as split_k, bitwise, without its fp32
    workspace, semaphores and serial hand-offs; co-scheduled by the hardware, so the grid may
    hold more CTAs than SMs. At most MAX_CLUSTER_SPLITS splits."""

    name = "split_k_cluster"
    skeleton = "kernel_split_k_cluster.cuh"
    slots = dict(WarpSpecializedSchedule.slots, SKELETON="hopmm::split_k_cluster_gemm",
                 EPILOGUE="hopmm::SplitKClusterEpilogue")
    workspace = False
    phased_ok = False   # its producer warpgroup joins the cluster's reduction
    cluster_at_launch = True
    extra_params = ""
    extra_args = ""
    pointers = 0
    c_box_rows = CLUSTER_REDUCE_GROUP_ROWS
    fragment_epilogue = False
    reduce_snippet = "split_k_cluster_reduce.cuh"
    split_bound = f"a cluster of at most {MAX_CLUSTER_SPLITS} CTAs and a k-block per split"

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return (f"the fp32 partial ({cfg.block_m}x{cfg.block_n}x{F32_BYTES} B), which the "
                f"cluster's CTAs read through distributed shared memory, and the 16-bit staging "
                f"of a plain store share the epilogue's memory; each CTA stages its reduced "
                f"rows in the operand stages, free once the main loops are done ({cfg.stages} "
                f"stages fit)")

    @classmethod
    def max_splits(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                   sm_count: int) -> int:
        """The most CTAs of a portable cluster, at most one split per k-block; at least 1."""
        return max(1, min(MAX_CLUSTER_SPLITS, cls.k_blocks(problem, cfg)))


# A-tile rows split_k_parallel's 64-row tiles may load instead of all 64: a problem of at most
# that many rows moves no zero-filled rows through TMA (tile_config.cuh, kARows), which on an
# H100 let 64 CTAs stream B at 40+ GB/s each instead of 27 (bench/NOTES.md v0.17).
TRIMMED_A_ROWS = (16, 32)


class SplitKParallelSchedule(SplitKSchedule):
    """Split-K for few output tiles and a long K, with as many splits as the SMs allow: every
    split TMA-stores its fp32 partial into its own workspace slot and arrives on the tile's
    counter; once all have arrived, each split adds up its share of the tile's rows over all
    the partials, in split order, and stores them (split_k_parallel_reduce.cuh). The same sums
    as split_k and split_k_cluster, bitwise, with one hand-off instead of a chain and no
    cluster-size bound. Tiles of 64 rows (one consumer warpgroup) for problems of few rows
    (those of few_row_widths), whose K-major A tiles may load only the TRIMMED_A_ROWS step that
    covers them."""

    name = "split_k_parallel"
    # The 64-row tile widths for problems of at most 64 rows. Not 192: there B's stream sets
    # the pace, and on 88 such products read through phase maps its fewer, wider tiles ran
    # 0.96 x the 128- and 256-wide ones (bench/NOTES.md v0.47).
    few_row_widths = (128, 256)
    slots = dict(SplitKSchedule.slots, EPILOGUE="hopmm::SplitKParallelEpilogue")
    reduce_snippet = "split_k_parallel_reduce.cuh"
    c_box_rows = CLUSTER_REDUCE_GROUP_ROWS
    fragment_epilogue = False
    split_bound = "the co-residency bound (tiles x splits x batch <= SMs) and a k-block per split"

    @classmethod
    def tile_shapes(cls) -> list[tuple[int, int]]:
        return [(WGMMA_M, 128), (WGMMA_M, 192), (WGMMA_M, 256), (BLOCK_M, 128)]

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return (f"the fp32 partial ({cfg.consumers * WGMMA_M}x{cfg.block_n}x{F32_BYTES} B) is "
                f"staged in the epilogue's memory and stored to the split's workspace slot; "
                f"the 16-bit rows it then reduces are staged there too; {cfg.stages} stages fit "
                f"beside it")

    @classmethod
    def workspace_shape(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                        splits: int) -> tuple[int, int, int]:
        """(slots, rows, columns): one slot of the output padded to whole tiles per batch slot
        and split (even with one split: the reduction reads the partials from there)."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (batch_count * splits, tiles_m * cfg.block_m, tiles_n * cfg.block_n)

    @classmethod
    def trimmed_config(cls, cfg: KernelConfig, rows: int) -> KernelConfig:
        """`cfg` loading only the TRIMMED_A_ROWS step that covers `rows` rows of its A tiles,
        where it can (64-row tiles of few_row_widths, a K-major A); else `cfg` itself."""
        if cfg.block_m != WGMMA_M or cfg.trans_a or cfg.block_n not in cls.few_row_widths:
            return cfg
        steps = [r for r in TRIMMED_A_ROWS if r >= rows]
        return replace(cfg, a_rows=steps[0]) if steps else cfg

    @classmethod
    def configs(cls, smem_limit: int) -> list[KernelConfig]:
        base = super().configs(smem_limit)
        # In TRIMMED_A_ROWS order, not a set's: the kernels tier's cases (report.kernel_matrix,
        # whose phase-map variants follow this order) and their ids are the same in every run.
        trimmed = dict.fromkeys(cls.trimmed_config(cfg, rows) for cfg in base
                                for rows in TRIMMED_A_ROWS)
        return base + [cfg for cfg in trimmed if cfg not in base]


class StreamKSchedule(PersistentSchedule):
    """Stream-K in lanes (kernel_stream_k.cuh): for few tiles over a long K, every CTA of the
    grid multiplies the same number of k-blocks of a lane's stream of tiles, and the owner of a
    tile cut apart adds the other pieces (fp32, through a workspace slot per CTA) in k order
    before its epilogue. A lane is a row of tiles (raster groups of one M-tile) or a column
    (groups of every M-tile); the lanes are cut alike, so the tiles at one position of every
    lane run the same k-blocks at about the same time and read their common operand from DRAM
    once. The grid's CTA count is the choice's `splits`, a multiple of the lanes."""

    name = "stream_k"
    transposed_store_ok = False
    phased_ok = False   # its producer and its workers' walk are its own
    skeleton = "kernel_stream_k.cuh"
    slots = dict(PersistentSchedule.slots, SKELETON="hopmm::stream_k_gemm")
    block_ns = (NARROW_BLOCK_N,) + WarpSpecializedSchedule.block_ns
    short_block_ns = ()
    splits_label = "ctas"
    workspace = True
    workspace_map = False
    extra_params = "\n               float* workspace, unsigned* flags,"
    extra_args = " workspace, flags,"
    pointers = 2

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return (super().smem_note(cfg) + "; the pieces of tiles cut apart go through an fp32 "
                "workspace slot per CTA, not shared memory")

    @classmethod
    def lanes_are_columns(cls, problem: Problem, cfg: KernelConfig, raster_group: int) -> bool:
        """Whether the lanes are columns of tiles (raster groups that hold every M-tile of
        more than one) rather than rows (kernel_stream_k.cuh)."""
        tiles_m = cls.tiles(problem, cfg)[0]
        return raster_group >= tiles_m > 1

    @classmethod
    def lane_tiles(cls, problem: Problem, cfg: KernelConfig, raster_group: int) -> int:
        """Tiles of one lane in one batch slice."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return tiles_m if cls.lanes_are_columns(problem, cfg, raster_group) else tiles_n

    @classmethod
    def lanes(cls, problem: Problem, cfg: KernelConfig, raster_group: int) -> int:
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return tiles_m * tiles_n // cls.lane_tiles(problem, cfg, raster_group)

    @classmethod
    def lane_k_blocks(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                      raster_group: int) -> int:
        """k-blocks of one lane's stream: its tiles over the launch's batch slices."""
        return (cls.lane_tiles(problem, cfg, raster_group) * batch_count
                * cls.k_blocks(problem, cfg))

    @classmethod
    def most_ctas(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                  raster_group: int, sm_count: int) -> int:
        """The most CTAs check_grid allows on `sm_count` SMs: as many a lane as there are SMs
        for each (at most one a k-block); 0 where the lanes outnumber the SMs."""
        lanes = cls.lanes(problem, cfg, raster_group)
        per_lane = min(sm_count // lanes,
                       cls.lane_k_blocks(problem, cfg, batch_count, raster_group))
        return lanes * per_lane

    @classmethod
    def check_grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                   raster_group: int, ctas: int) -> None:
        """ValueError unless `ctas` is a whole number of CTAs for each lane, each with at
        least one k-block (so that every piece an owner waits for exists)."""
        lanes = cls.lanes(problem, cfg, raster_group)
        units = cls.lane_k_blocks(problem, cfg, batch_count, raster_group)
        if ctas < lanes or ctas % lanes or ctas // lanes > units:
            raise ValueError(f"stream_k: {ctas} CTAs for {lanes} lanes of {units} k-blocks "
                             f"each; a multiple of the lanes, at most one CTA a k-block")

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        """`splits` CTAs (at most one per SM: an owner waits for later CTAs)."""
        if not 1 <= splits <= sm_count:
            raise ValueError(f"stream_k: {splits} CTAs on {sm_count} SMs")
        return (splits, 1, 1)

    @classmethod
    def workspace_shape(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                        splits: int) -> tuple[int, int, int]:
        """(slots, rows, columns): a tile's fp32 piece per CTA."""
        return (splits, cfg.block_m, cfg.block_n)

    @classmethod
    def semaphore_count(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                        splits: int = 1) -> int:
        """A flag per (CTA, consumer warpgroup)."""
        return splits * cfg.consumers


SCHEDULES = {s.name: s for s in (WarpSpecializedSchedule, PersistentSchedule,
                                 PersistentOverlapSchedule, PersistentClusterSchedule,
                                 PersistentClusterQuadSchedule,
                                 PersistentClusterOverlapSchedule, PingPongSchedule,
                                 SplitKSchedule, SplitKClusterSchedule, SplitKParallelSchedule,
                                 StreamKSchedule)}


# ---- two products that share A in one kernel (kernel_dual_b.cuh) ---------------------------

class SharedASchedule(PersistentSchedule):
    """C0 = A @ B0 and C1 = A @ B1 in one persistent kernel (seed 000): each stage holds the A
    tile and both B tiles of a k-block side by side, each consumer issues per k16 step one
    64 x 256 wgmma that reads both B tiles (A once) into two 64 x 128 accumulator sets (128 of
    its 232 registers), a k-block's wgmmas in one commit group, flushes once, and stores each
    set through the fused chain into its own output. A is read from L2 once for both
    products. Computes hopmm.matmul_shared_a, not hopmm.matmul."""

    name = "shared_a"
    transposed_store_ok = False
    phased_ok = False   # a stage of two B tiles
    skeleton = "kernel_dual_b.cuh"
    slots = dict(PersistentSchedule.slots, SKELETON="hopmm::dual_b_gemm",
                 CONSUMER="hopmm::DualBWgmmaConsumer")
    b_operands = 2
    row_store_ok = False   # its outputs are whole 16-byte rows (shared_a._one_kernel)
    accumulator_sets = 2
    # Two 64 x 192 sets (192 registers) leave a consumer too few for its epilogue.
    block_ns = (128,)
    # One consumer on a 64-row tile, for products of few rows (heuristics.dual_b_choice).
    short_block_ns = (128,)
    # Outputs: C0 and C1 (kDualStorePair), or one (kDualStoreSwiglu).
    outputs = 2
    dual_store = 0
    extra_params = ("\n               const __grid_constant__ hopmm::TensorMap map_b2,"
                    "\n               const __grid_constant__ hopmm::TensorMap map_c2,")
    extra_args = " &map_b2, &map_c2,"

    @classmethod
    def own_config_fields(cls) -> dict:
        return {"kDualStore": cls.dual_store}

    @classmethod
    def check(cls, cfg: KernelConfig) -> None:
        # The kernel has one chain's operands: a bias or c would go to both products.
        if cfg.epilogue is not None and (cfg.epilogue.bias or cfg.epilogue.c):
            raise ValueError(f"{cls.name}: the fused chain of both products takes an "
                             f"activation only (a bias or c would be added to both)")
        super().check(cfg)

    @classmethod
    def consumer_roles(cls, cfg: KernelConfig) -> str:
        if cfg.consumers == 1:
            return (f"1 warpgroup computes each {cfg.block_m}x{cfg.block_n} tile of both "
                    f"products, one accumulator set per B")
        return (f"{cfg.consumers} warpgroups share each {cfg.block_m}x{cfg.block_n} tile of "
                f"both products, {cls.consumer_rows(cfg)} rows each, one accumulator set per B")

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return f"a stage holds the A tile and both B tiles; {super().smem_note(cfg)}"


class SwigluSchedule(SharedASchedule):
    """The shared-A kernel storing one output, silu(A @ B0) * (A @ B1), computed in fp32 from
    the two accumulator sets and rounded once (hopmm.swiglu)."""

    name = "swiglu"
    outputs = 1
    dual_store = 1
    extra_params = "\n               const __grid_constant__ hopmm::TensorMap map_b2,"
    extra_args = " &map_b2, nullptr,"

    @classmethod
    def check(cls, cfg: KernelConfig) -> None:
        if cfg.epilogue is not None:
            raise ValueError("swiglu: the product silu(gate) * up is its only epilogue")
        super().check(cfg)


# Not hopmm.matmul's schedules: they compute matmul_shared_a and swiglu (hopmm/shared_a.py).
DUAL_B_SCHEDULES = {s.name: s for s in (SharedASchedule, SwigluSchedule)}

# ---- gemv: a memory stream of B for outputs of very few rows (kernel_gemv.cuh) ----------------

WARP_THREADS = 32
# Elements of one 16-byte vector load of 16-bit values: a K-major lane's step along K, an
# N-major lane's columns.
GEMV_VEC = 8
# Rows of C one gemv CTA computes (its fp32 accumulators per column); more rows take further
# row groups, each streaming B again. 16 keeps a lane's accumulators (16 x 8 N-major) in
# registers and the FMA work within the CUDA cores' rate at copy bandwidth (kernel_gemv.cuh);
# CTAs of 32 and 64 rows on tensor cores ran slower than row groups of 16 (NOTES v0.27).
GEMV_MAX_ROWS = (1, 2, 4, 8, 16)
# Counters leading the split-K scratch buffer (workspace.gemv_scratch), one per (batch slot,
# CTA tile) of a split launch: splitting is for launches of few tiles, far below this.
GEMV_COUNTERS = 4096
# Row groups from which the tensor-core loops (mma.m16n8k16) replace the FMA loops: from 8 rows
# the FMAs bind (kernel_gemv.cuh; NOTES v0.18: 16 rows at a third of the copy bandwidth).
GEMV_MMA_ROWS = (8, 16)
# M-major A with N-major B gathers A element by element: 16 rows of it spill the CUDA-core
# loops' registers (ptxas), so those loops take that layout in groups of 8 rows.
GEMV_TN_MAX_ROWS = 8
# The tensor-core loops' unit of K (kMmaChunk: a quad of lanes x 8 elements), their K-major
# columns per warp (the mma's 16 rows) and their N-major columns per CTA (eight n8 mmas).
GEMV_MMA_CHUNK = 32
GEMV_MMA_WARP_COLS = 16
GEMV_MMA_N_MAJOR_COLS = 64
# Rows of N-major B a CUDA-core gemv CTA has in flight (warps x unroll): 32 KB at its 256
# columns.
GEMV_N_MAJOR_CTA_ROWS = 64
COUNTER_BYTES = 4  # one u32
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (gemv's K splits)


@dataclass(frozen=True)
class GemvConfig:
    """The tunables of one gemv kernel: rows of C per CTA (max_rows, a power of two up to 16),
    warps per CTA, columns per warp (K-major B; N-major: a lane owns 8 columns) and loads in
    flight per lane and column (unroll: vectors along K of a K-major column, rows of N-major
    B, a multiple of 8). The K split is a launch parameter (Choice.splits). With trans_c the
    kernel computes C^T = B^T A^T (a problem of few columns and many rows): its A is the
    problem's B^T, its B the problem's A^T, and it stores C transposed; trans_a and trans_b
    then describe the kernel's operands (GemvSchedule.kernel_problem). With mma (8 or 16
    rows) the inner loops run on tensor cores: a K-major warp owns 16 columns, an N-major CTA
    64, cols is 1, and unroll counts 32-element chunks of K in flight. With in_place the
    kernel reads rows that start on any 2-byte boundary where they lie (two aligned vectors
    shifted into one) instead of from aligned copies."""
    dtype: str
    trans_a: bool   # the kernel's A is M-major
    trans_b: bool   # the kernel's B is N-major
    max_rows: int
    warps: int = 8
    cols: int = 4
    unroll: int = 2
    trans_c: bool = False
    mma: bool = False
    in_place: bool = False

    def __post_init__(self):
        if self.dtype not in KERNEL_DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.max_rows not in GEMV_MAX_ROWS:
            raise ValueError(f"max_rows must be one of {GEMV_MAX_ROWS}, got {self.max_rows}")
        if not 1 <= self.warps <= 32:
            raise ValueError(f"1 to 32 warps per CTA, got {self.warps}")
        if self.mma:
            if self.max_rows not in GEMV_MMA_ROWS:
                raise ValueError(f"tensor-core gemv: max_rows one of {GEMV_MMA_ROWS}, got "
                                 f"{self.max_rows}")
            if self.cols != 1 or self.unroll < 1:
                raise ValueError("tensor-core gemv: cols = 1 and a positive unroll (chunks)")
        elif self.trans_b:
            if self.cols != 1:
                raise ValueError("N-major B: each lane owns one vector of columns (cols = 1)")
            if self.unroll < GEMV_VEC or self.unroll % GEMV_VEC:
                raise ValueError(f"N-major B: unroll is whole groups of {GEMV_VEC} rows (A is "
                                 f"read in vectors), got {self.unroll}")
        elif self.cols < 1 or self.unroll < 1:
            raise ValueError("K-major B: cols and unroll must be positive")

    @property
    def row_store(self) -> bool:
        """Whether the kernel stores a result of rows at any element boundary (every gemv
        stores element by element; a call reading rows in place takes its result the same way,
        where the tile schedules' KernelConfig.row_store is a config of its own)."""
        return self.in_place

    @property
    def block_n(self) -> int:
        """Columns of C one CTA computes."""
        if self.mma:
            return GEMV_MMA_N_MAJOR_COLS if self.trans_b else self.warps * GEMV_MMA_WARP_COLS
        if self.trans_b:
            return WARP_THREADS * GEMV_VEC
        return self.warps * self.cols

    @property
    def threads(self) -> int:
        return self.warps * WARP_THREADS

    @property
    def inflight_bytes(self) -> int:
        """Bytes of B one CTA has in flight: a 16-byte vector per lane, unroll x cols; on tensor
        cores, unroll chunks of B's 32 x block_n elements per warp (K-major: its columns)."""
        if self.mma:
            warp_cols = GEMV_MMA_N_MAJOR_COLS if self.trans_b else GEMV_MMA_WARP_COLS
            return self.warps * self.unroll * GEMV_MMA_CHUNK * warp_cols * ELEM_BYTES
        return self.threads * self.unroll * self.cols * GEMV_VEC * ELEM_BYTES

    @property
    def tag(self) -> str:
        layout = ("T" if self.trans_a else "N") + ("N" if self.trans_b else "T")
        dt = "bf16" if self.dtype == "bfloat16" else "f16"
        swap = "_ct" if self.trans_c else ""
        tc = "_tc" if self.mma else ""
        any_rows = "_ip" if self.in_place else ""
        return (f"{dt}_m{self.max_rows}_w{self.warps}_c{self.cols}_u{self.unroll}{swap}{tc}"
                f"{any_rows}_{layout}")

    def narrow(self) -> "GemvConfig | None":
        """The tensor-core K-major config of half the warps with twice the chunks in flight
        each: the same bytes in flight a CTA over half the columns, so twice the column
        blocks; None for the other loops, and where A is M-major: twice the CTAs then gather
        A's elements one by one twice as often (0.84 x on 14 few-column products run as C^T,
        NOTES v0.36)."""
        if not self.mma or self.trans_b or self.trans_a or self.warps % 2:
            return None
        return replace(self, warps=self.warps // 2, unroll=self.unroll * 2)

    @classmethod
    def default(cls, dtype: str, trans_a: bool, trans_b: bool, rows: int,
                trans_c: bool = False, mma: bool = True,
                in_place: bool = False) -> "GemvConfig":
        """The config for `rows` rows of C: the next max_rows step, and per layout the shape
        that keeps 32 KB or more of B in flight per CTA (warps x 32 lanes x 16 B x unroll
        (x cols)): N-major B's warps and unroll timed against others on one row (NOTES
        v0.36), the rest predictions to be swept on the GPU (bench/gemv_tune.py). From
        GEMV_MMA_ROWS[0] rows on, the tensor-core loops (32 KB in flight per CTA), unless
        `mma` is False."""
        top = GEMV_TN_MAX_ROWS if trans_a and trans_b and not mma else GEMV_MAX_ROWS[-1]
        max_rows = next(r for r in GEMV_MAX_ROWS if r >= min(rows, top))
        if mma and max_rows in GEMV_MMA_ROWS:
            return cls(dtype, trans_a, trans_b, max_rows, warps=8, cols=1,
                       unroll=1 if trans_b else 4, trans_c=trans_c, mma=True,
                       in_place=in_place)
        if trans_b:
            # Turns of 16 rows of B on 4 warps rather than 8 rows on 8: the same 32 KB in
            # flight (so the same K split), half the warps' partial sums to add through shared
            # memory at the end; 0.4-4.7 % faster on one row (NOTES v0.36). A lane's 16 rows
            # of C x 8 columns of accumulators leave no registers for 16 vectors of B.
            unroll = 2 * GEMV_VEC if max_rows < GEMV_MAX_ROWS[-1] else GEMV_VEC
            return cls(dtype, trans_a, trans_b, max_rows, warps=GEMV_N_MAJOR_CTA_ROWS // unroll,
                       cols=1, unroll=unroll, trans_c=trans_c, in_place=in_place)
        # 4 x 2 vectors in flight per lane: 16 rows still fit (232 registers, no spills).
        return cls(dtype, trans_a, trans_b, max_rows, warps=8, cols=4, unroll=2,
                   trans_c=trans_c, in_place=in_place)


class GemvSchedule:
    """C = A @ B as one stream of B for outputs of very few rows (decode): CUDA-core fp32 FMAs
    (or, from 8 rows, mma.m16n8k16 on tensor cores), 16-byte non-temporal loads of B, A read
    through L1, K split across CTAs where N alone gives too few and the partials added up in
    split order by the last CTA of each tile (kernel_gemv.cuh). Not a TMA/wgmma tile schedule:
    no tensor maps, its own kernel signature (gemv_entry.cu.in) and launch (GemvLaunch)."""

    name = "gemv"
    row_store_ok = False   # odd rows go through an aligned buffer (no row-store config)
    skeleton = "kernel_gemv.cuh"
    # Rows are read in whole 16-byte vectors, masked past K: an aligned copy's row tails are
    # zeroed for it (launch.zero_row_tails).
    reads_row_tails = True
    entry = "gemv_entry.cu.in"
    # The attributes the tile schedules' callers read (api.explain, heuristics).
    split_k = True
    workspace = False
    cluster_size = 1
    streaming = True

    @classmethod
    def snippets(cls) -> list[str]:
        return ["ptx.cuh", "tile_config.cuh", cls.skeleton]

    @staticmethod
    def threads(cfg: GemvConfig) -> int:
        return cfg.threads

    @staticmethod
    def smem_bytes(cfg: GemvConfig) -> int:
        """The CTA's fp32 tile of C (max_rows x block_n), where its warps' sums meet."""
        return cfg.max_rows * cfg.block_n * F32_BYTES

    @classmethod
    def smem_note(cls, cfg: GemvConfig) -> str:
        return (f"the CTA's {cfg.max_rows}x{cfg.block_n} fp32 tile of C; B streamed through "
                f"registers")

    @staticmethod
    def consumer_roles(cfg: GemvConfig) -> str:
        if cfg.mma:
            if cfg.trans_b:
                return (f"{cfg.warps} warps take turns of {cfg.unroll} 32-row chunks of N-major "
                        f"B, eight n8 mma.m16n8k16 each; partials added in warp order")
            return (f"{cfg.warps} warps of {GEMV_MMA_WARP_COLS} columns each on mma.m16n8k16 "
                    f"(C^T = B^T A^T), {cfg.unroll} 32-element chunks of K-major B in flight")
        if cfg.trans_b:
            return (f"{cfg.warps} warps take turns of {cfg.unroll} rows of N-major B, each lane "
                    f"{GEMV_VEC} columns; partials added in warp order")
        return (f"{cfg.warps} warps of {cfg.cols} columns each, lanes along K-major B, "
                f"{cfg.unroll} vectors per column in flight; shuffle reduction")

    kernel_problem = staticmethod(kernel_problem)

    @classmethod
    def tiles(cls, problem: Problem, cfg: GemvConfig) -> tuple[int, int]:
        """(row groups, column blocks) of one batch slice (every method here takes the problem
        the kernel computes: with trans_c the transposed one, kernel_problem)."""
        return -(-problem.m // cfg.max_rows), -(-problem.n // cfg.block_n)

    @classmethod
    def max_splits(cls, problem: Problem, cfg: GemvConfig, batch_count: int) -> int:
        """One vector (8-row group, tensor-core chunk) of K per split at the least, and a
        counter per tile of the launch (GEMV_COUNTERS); at least 1."""
        row_groups, col_blocks = cls.tiles(problem, cfg)
        if row_groups * col_blocks * batch_count > GEMV_COUNTERS:
            return 1
        granule = GEMV_MMA_CHUNK if cfg.mma else GEMV_VEC   # kernel_gemv.cuh's split_range
        return max(1, min(MAX_GRID_Y, -(-problem.k // granule)))

    @classmethod
    def grid(cls, problem: Problem, cfg: GemvConfig, batch_count: int, sm_count: int = 0,
             splits: int = 1) -> tuple[int, int, int]:
        top = cls.max_splits(problem, cfg, batch_count)
        if not 1 <= splits <= top:
            raise ValueError(f"gemv: {splits} splits, at most {top} here (a vector of K, or a "
                             f"{GEMV_MMA_CHUNK}-element chunk on tensor cores, per split, "
                             f"{GEMV_COUNTERS} tile counters, {MAX_GRID_Y} in grid y)")
        row_groups, col_blocks = cls.tiles(problem, cfg)
        return (row_groups * col_blocks, splits, batch_count)

    @staticmethod
    def launch_cluster(splits: int = 1) -> tuple[int, int, int]:
        return (1, 1, 1)

    @staticmethod
    def resident_ctas(device) -> int:
        """As the tile schedules' (grid's `sm_count`, which gemv's grid does not need)."""
        return device.sm_count

    @classmethod
    def scratch_bytes(cls, problem: Problem, cfg: GemvConfig, batch_count: int,
                      splits: int) -> int:
        """Bytes of split-K scratch one launch needs: the counters, then one fp32 tile per
        (tile, split); none unsplit."""
        if splits == 1:
            return 0
        row_groups, col_blocks = cls.tiles(problem, cfg)
        tiles = row_groups * col_blocks * batch_count
        return GEMV_COUNTERS * COUNTER_BYTES + tiles * splits * cfg.max_rows * cfg.block_n * F32_BYTES

    @classmethod
    def kernel_name(cls, cfg: GemvConfig) -> str:
        return f"hopmm_{cls.name}_{cfg.tag}"

    @classmethod
    def check(cls, cfg) -> None:
        if not isinstance(cfg, GemvConfig):
            raise ValueError(f"gemv takes a GemvConfig, got {type(cfg).__name__}")

    @classmethod
    def render(cls, cfg: GemvConfig) -> render.RenderedKernel:
        cls.check(cfg)
        fields = {
            "kBf16": cfg.dtype == "bfloat16", "kAKMajor": not cfg.trans_a,
            "kBKMajor": not cfg.trans_b, "kMaxRows": cfg.max_rows, "kWarps": cfg.warps,
            "kCols": cfg.cols, "kUnroll": cfg.unroll, "kBlockN": cfg.block_n,
            "kCounters": GEMV_COUNTERS, "kTransC": cfg.trans_c, "kMma": cfg.mma,
            "kInPlace": cfg.in_place,
        }
        return render.render_kernel(cls.kernel_name(cfg), cls.snippets(), fields,
                                    {"THREADS": str(cfg.threads)}, entry=cls.entry)

    @classmethod
    def configs(cls, smem_limit: int = 0) -> list[GemvConfig]:
        """The default config of every row step, dtype and layout, on tensor cores and off
        them, with the transposed store and without, reading aligned rows or rows in place:
        every config the heuristic picks."""
        steps = [(rows, trans_c) for rows in GEMV_MAX_ROWS for trans_c in (False, True)]
        defaults = [GemvConfig.default(dtype, ta, tb, rows, trans_c, mma, in_place)
                    for (rows, trans_c), dtype, ta, tb, mma, in_place
                    in itertools.product(steps, KERNEL_DTYPES, (False, True), (False, True),
                                         (True, False), (False, True))]
        narrow = [n for cfg in defaults if (n := cfg.narrow()) is not None]
        return list(dict.fromkeys(defaults + narrow))


# Schedules that are not TMA/wgmma tile schedules (SCHEDULES holds those); use_schedule
# accepts every name of ALL_SCHEDULES.
STREAMING_SCHEDULES = {GemvSchedule.name: GemvSchedule}
ALL_SCHEDULES = {**SCHEDULES, **STREAMING_SCHEDULES, **DUAL_B_SCHEDULES}

"""Schedules: which snippets fill which slot of which kernel skeleton, for which tile config.

A Schedule is pure description: rendering, the shared-memory plan and the launch geometry
are all computable without a GPU, which is what the CPU test tier checks for every config.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from . import render
from .problem import KERNEL_DTYPES, Problem

WARPGROUP_THREADS = 128
ELEM_BYTES = 2           # fp16 / bf16
TMA_BOX_ELEMS = 64       # one 128-byte swizzle row of 16-bit elements
SMEM_ALIGN = 1024        # the kernel rounds its dynamic smem base up to this
MBARRIER_BYTES = 8
WGMMA_M = 64
BLOCK_M = 2 * WGMMA_M     # two consumer warpgroups of 64 rows each
WGMMA_NS = (64, 128, 256)  # the N extents csrc/hopmm/wgmma.cuh instantiates
# A stage is released only after the next k-block's wgmma group is committed (wait_group 1),
# so a ring of one stage would deadlock: two is a correctness floor, not only a speed one.
MIN_STAGES = 2


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

    @property
    def tag(self) -> str:
        layout = ("T" if self.trans_a else "N") + ("N" if self.trans_b else "T")
        dt = "bf16" if self.dtype == "bfloat16" else "f16"
        return f"{dt}_{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}_{layout}"


class WarpSpecializedSchedule:
    """One 128 x N output tile per CTA; warpgroup 0 loads with TMA (setmaxnreg.dec), two
    consumer warpgroups share the tile (cooperative), run the wgmma pipeline and store
    through stmatrix + TMA."""

    name = "warp_specialized"
    skeleton = "kernel_warp_specialized.cuh"
    slots = {
        "SKELETON": "hopmm::warp_specialized_gemm",
        "PRODUCER": "hopmm::TmaProducer",
        "CONSUMER": "hopmm::WgmmaConsumer",
        "EPILOGUE": "hopmm::TmaStoreEpilogue",
    }
    # Whether a CTA's TMA store stays in flight while the CTA goes on to its next tile.
    overlap_store = False
    # Whether the k-blocks of a tile are divided among CTAs (grid y) and reduced in order.
    split_k = False
    block_ns = (128, 256)
    # Kernel parameters after the three operand maps (kernel_entry.cu.in) and the arguments the
    # skeleton gets for them; KernelLaunch passes `extra_maps` more maps and `pointers` raw
    # device pointers, in that order, before the integers.
    extra_params = ""
    extra_args = ""
    extra_maps = 0
    pointers = 0

    @classmethod
    def snippets(cls) -> list[str]:
        return ["ptx.cuh", "wgmma.cuh", "tile_config.cuh", "producer_tma.cuh",
                "consumer_wgmma.cuh", "epilogue_tma_store.cuh", "tile_raster.cuh", cls.skeleton]

    # -- shared-memory plan (mirrors TileShape in tile_config.cuh; the kernel static_asserts
    #    that both agree) --
    @staticmethod
    def stage_bytes(cfg: KernelConfig) -> int:
        return (cfg.block_m + cfg.block_n) * cfg.block_k * ELEM_BYTES

    @staticmethod
    def epilogue_bytes(cfg: KernelConfig) -> int:
        return cfg.block_m * cfg.block_n * ELEM_BYTES

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        """How the epilogue's shared memory is laid out (hopmm.explain)."""
        return ("separate epilogue tile" + (", stores overlap the next tile"
                                            if cls.overlap_store else ""))

    @classmethod
    def smem_bytes(cls, cfg: KernelConfig) -> int:
        barriers = 2 * cfg.stages * MBARRIER_BYTES
        return cfg.stages * cls.stage_bytes(cfg) + cls.epilogue_bytes(cfg) + barriers + SMEM_ALIGN

    @classmethod
    def max_stages(cls, cfg: KernelConfig, smem_limit: int) -> int:
        fixed = cls.epilogue_bytes(cfg) + SMEM_ALIGN
        per_stage = cls.stage_bytes(cfg) + 2 * MBARRIER_BYTES
        return (smem_limit - fixed) // per_stage

    @staticmethod
    def threads(cfg: KernelConfig) -> int:
        return (1 + cfg.consumers) * WARPGROUP_THREADS

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
    def kernel_name(cls, cfg: KernelConfig) -> str:
        return f"hopmm_{cls.name}_{cfg.tag}"

    @classmethod
    def render(cls, cfg: KernelConfig) -> render.RenderedKernel:
        fields = {
            "kBlockM": cfg.block_m, "kBlockN": cfg.block_n, "kBlockK": cfg.block_k,
            "kStages": cfg.stages, "kConsumers": cfg.consumers,
            "kBf16": cfg.dtype == "bfloat16", "kTransA": int(cfg.trans_a),
            "kTransB": int(cfg.trans_b), "kOverlapStore": cls.overlap_store,
            "kSplitK": cls.split_k, "kSmemBytesExpected": cls.smem_bytes(cfg),
        }
        return render.render_kernel(cls.kernel_name(cfg), cls.snippets(), fields,
                                    dict(cls.slots, THREADS=str(cls.threads(cfg)),
                                         EXTRA_PARAMS=cls.extra_params,
                                         EXTRA_ARGS=cls.extra_args))

    @classmethod
    def deepest(cls, dtype: str, block_n: int, trans_a: bool, trans_b: bool,
                smem_limit: int) -> KernelConfig | None:
        """The config with as many stages as fit in `smem_limit`, or None if fewer than
        MIN_STAGES fit."""
        probe = KernelConfig(dtype=dtype, block_n=block_n, stages=MIN_STAGES, trans_a=trans_a,
                             trans_b=trans_b)
        stages = cls.max_stages(probe, smem_limit)
        return replace(probe, stages=stages) if stages >= MIN_STAGES else None

    @classmethod
    def configs(cls, smem_limit: int) -> list[KernelConfig]:
        """Every config this schedule can be asked for: each tile width, dtype and layout, with
        the deepest pipeline that fits."""
        out = []
        for block_n, dtype, ta, tb in itertools.product(cls.block_ns, KERNEL_DTYPES,
                                                        (False, True), (False, True)):
            cfg = cls.deepest(dtype, block_n, ta, tb, smem_limit)
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
    overlap_store = True

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return (min(sm_count, tiles_m * tiles_n * batch_count), 1, 1)


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
    # Few tiles is the point of split-K: 128-wide tiles, and the fp32 partial (128 x 128 x 4 =
    # 64 KB) still leaves 5 stages next to the operand ring.
    block_ns = (128,)
    extra_params = ("\n               const __grid_constant__ hopmm::TensorMap map_w,"
                    "\n               const float* workspace, unsigned* semaphores,")
    extra_args = " &map_w, workspace, semaphores,"
    extra_maps = 1
    pointers = 2

    @classmethod
    def snippets(cls) -> list[str]:
        return super().snippets() + ["split_k_reduce.cuh"]

    @staticmethod
    def epilogue_bytes(cfg: KernelConfig) -> int:
        # Per consumer the larger of the 16-bit result tile and the fp32 partial: a consumer
        # stages one or the other (the last split the result, the others their partial), so
        # they share memory and need no barrier between them (TileShape::kCBytesPerConsumer).
        return max(cfg.block_m * cfg.block_n * ELEM_BYTES, cfg.block_m * cfg.block_n * F32_BYTES)

    @classmethod
    def smem_note(cls, cfg: KernelConfig) -> str:
        return (f"the fp32 partial ({cfg.block_m}x{cfg.block_n}x{F32_BYTES} B) is staged in the "
                f"epilogue tile's memory, which the 16-bit result tile of the last split shares; "
                f"operand stages not reused ({cfg.stages} stages fit beside it)")

    @staticmethod
    def k_blocks(problem: Problem, cfg: KernelConfig) -> int:
        return -(-problem.k // cfg.block_k)

    @classmethod
    def max_splits(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
                   sm_count: int) -> int:
        """The most splits the co-residency bound allows (tiles * splits * batch <= SMs, see
        kernel_split_k.cuh) and that leave every split at least one k-block; at least 1."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        by_sms = sm_count // (tiles_m * tiles_n * batch_count)
        return max(1, min(by_sms, cls.k_blocks(problem, cfg)))

    @classmethod
    def grid(cls, problem: Problem, cfg: KernelConfig, batch_count: int,
             sm_count: int, splits: int = 1) -> tuple[int, int, int]:
        if not 1 <= splits <= cls.max_splits(problem, cfg, batch_count, sm_count):
            raise ValueError(f"{splits} splits break the co-residency bound or leave a split "
                             f"without k-blocks (at most "
                             f"{cls.max_splits(problem, cfg, batch_count, sm_count)})")
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
    def semaphore_count(cls, problem: Problem, cfg: KernelConfig, batch_count: int) -> int:
        """One semaphore per (batch slot, tile, consumer warpgroup)."""
        tiles_m, tiles_n = cls.tiles(problem, cfg)
        return batch_count * tiles_m * tiles_n * cfg.consumers


SCHEDULES = {s.name: s for s in (WarpSpecializedSchedule, PersistentSchedule, SplitKSchedule)}

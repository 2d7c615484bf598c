"""Problem -> (schedule, config): a pure function of the problem and the device description,
so it is tested without a GPU."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .device import DeviceInfo
from .problem import Problem
from .schedules import BLOCK_M, MIN_STAGES, SCHEDULES, KernelConfig, PersistentSchedule

# M-tiles per raster group. A wave of 132 CTAs then covers 16 x ~8 tiles of 128 x 256: 2048
# rows of A and 2048 columns of B, whose k-slices stay in the 50 MB L2 while the wave runs.
RASTER_GROUP_M = 16


@dataclass(frozen=True)
class Choice:
    schedule: type
    config: KernelConfig
    reason: str
    raster_group: int = 1   # M-tiles per group of the tile order (see tile_raster.cuh)


def _tiles(problem: Problem, block_m: int, block_n: int) -> int:
    return -(-problem.m // block_m) * -(-problem.n // block_n) * problem.batch


@functools.lru_cache(maxsize=4096)
def choose(problem: Problem, device: DeviceInfo, schedule: str | None = None) -> Choice:
    # The persistent schedule measured at least as fast as one-tile-per-CTA on every shape
    # tried (bench/NOTES.md, v0.3), most where tiles are short (small k).
    sched = SCHEDULES[schedule or PersistentSchedule.name]
    # A 256-wide tile halves the B traffic per flop of a 128-wide one, but only pays while
    # there are enough tiles to give every SM work; with fewer, the narrower tile keeps more
    # SMs busy.
    wide_tiles = _tiles(problem, BLOCK_M, 256)
    if problem.n > 128 and wide_tiles >= device.sm_count:
        block_n = 256
        why = f"{wide_tiles} tiles of 128x256 fill {device.sm_count} SMs"
    else:
        block_n = 128
        why = (f"only {wide_tiles} tiles of 128x256 for {device.sm_count} SMs"
               if problem.n > 128 else f"n = {problem.n} fits a 128-wide tile")
    if block_n not in sched.block_ns:  # ping-pong: a consumer holds a whole 128 x 128 tile
        block_n = max(sched.block_ns)
        why = f"the {sched.name} schedule's tiles are {BLOCK_M}x{block_n}"
    # The narrower tile is the fallback when the wide one leaves too few stages.
    for width in sorted({block_n, 128}, reverse=True):
        cfg = sched.deepest(problem.dtype, width, problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin)
        if cfg is not None:
            break
        why = f"a {BLOCK_M}x{width} tile leaves fewer than {MIN_STAGES} stages"
    else:
        raise RuntimeError(f"{device.name}: {device.smem_per_block_optin} B of shared memory "
                           f"per block is too little for a {BLOCK_M}x128 tile")
    stages = cfg.stages
    group = min(RASTER_GROUP_M, -(-problem.m // BLOCK_M))
    return Choice(sched, cfg, f"{why}; {stages} stages fit in {device.smem_per_block_optin} B "
                              f"of shared memory; tiles in groups of {group} M-tiles", group)

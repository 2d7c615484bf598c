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


# Relative main-loop speed of one SM per tile width: a narrower tile reads more of A and B
# per flop. From autotune tables on an H100 (bench/NOTES.md, v0.5): 128-wide tiles ran 0.88 -
# 0.92 x the 256-wide ones where both filled the SMs equally; 192 lies between.
TILE_WIDTH_SPEED = {256: 1.0, 192: 0.96, 128: 0.90}


def _tiles(problem: Problem, block_m: int, block_n: int) -> int:
    return -(-problem.m // block_m) * -(-problem.n // block_n) * problem.batch


def _relative_time(problem: Problem, device: DeviceInfo, block_n: int) -> float:
    """Waves of tiles (the last one counts whole: its idle SMs still cost time) x the time of
    one tile of this width."""
    waves = -(-_tiles(problem, BLOCK_M, block_n) // device.sm_count)
    return waves * block_n / TILE_WIDTH_SPEED[block_n]


@functools.lru_cache(maxsize=4096)
def choose(problem: Problem, device: DeviceInfo, schedule: str | None = None) -> Choice:
    # The persistent schedule measured at least as fast as one-tile-per-CTA on every shape
    # tried (bench/NOTES.md, v0.3), most where tiles are short (small k).
    sched = SCHEDULES[schedule or PersistentSchedule.name]
    # Widest first, so that a tie goes to the tile that reads less per flop.
    widths = sorted((w for w in sched.block_ns if w in TILE_WIDTH_SPEED), reverse=True)
    ranked = sorted(widths, key=lambda w: _relative_time(problem, device, w))
    why = ""
    for width in ranked:
        cfg = sched.deepest(problem.dtype, width, problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin)
        if cfg is not None:
            break
        why += f"a {BLOCK_M}x{width} tile leaves fewer than {MIN_STAGES} stages; "
    else:
        raise RuntimeError(f"{device.name}: {device.smem_per_block_optin} B of shared memory "
                           f"per block is too little for any {BLOCK_M}-row tile")
    tiles = _tiles(problem, BLOCK_M, cfg.block_n)
    waves = tiles / device.sm_count
    why += (f"{tiles} tiles of {BLOCK_M}x{cfg.block_n} = {waves:.2f} waves of {device.sm_count} "
            + (f"SMs (the fewest tile-times of widths {'/'.join(map(str, widths))})"
               if len(widths) > 1 else f"SMs (the only tile width of the {sched.name} schedule)"))
    group = min(RASTER_GROUP_M, -(-problem.m // BLOCK_M))
    return Choice(sched, cfg, f"{why}; {cfg.stages} stages fit in "
                              f"{device.smem_per_block_optin} B of shared memory; tiles in "
                              f"groups of {group} M-tiles", group)

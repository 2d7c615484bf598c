"""The CPU report of `python -m hopmm`: every registered schedule x config rendered,
compiled for sm_90a and checked (registers, shared memory, spills, SASS contents). The
compiles and SASS listings run in parallel processes first (NVRTC holds the GIL), filling
the kernel cache that the checks then read."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from . import compile as compiler
from . import sass
from .device import DeviceInfo
from .layout import PHASES
from .schedules import DUAL_B_SCHEDULES, PHASED_MIN_STAGES, SCHEDULES

# A cluster kernel meets its peers twice: after the mbarrier init and before exit.
CLUSTER_BARRIERS = 2
# A kernel whose cluster is shaped at launch (split_k_cluster) meets its peers twice too: once
# its partials are staged, and once they are read, before exit.
LAUNCH_CLUSTER_BARRIERS = 2
# (trans_a, trans_b) of the operand layouts, in the order kernel_matrix cycles through them.
LAYOUTS = ((False, False), (False, True), (True, False), (True, True))


@dataclass(frozen=True)
class KernelCheck:
    name: str
    registers: int
    smem_bytes: int
    spill_bytes: int
    sass: sass.SassSummary | None
    problems: tuple

    @property
    def ok(self) -> bool:
        return not self.problems and (self.sass is None or self.sass.ok)


def kernel_matrix(device: DeviceInfo) -> list[tuple[type, object]]:
    """Every registered (schedule, config) that fits the device's shared memory: matmul's
    and the shared-A kernels', and each config of a schedule that can read operands through
    phase maps (KernelConfig.a_pitch_mod8, b_pitch_mod8) once more with them, where at least
    PHASED_MIN_STAGES stages fit: in turn A alone, B alone and both, as its layout allows,
    and the pitch classes 1-7 in turn (each is a constant of the same code); and each tile of
    a schedule that can store its output transposed (KernelConfig.trans_c) once so, in both
    dtypes, the tiles taking the layouts in turn (the transposed epilogue is the same code
    whatever the operands' layout)."""
    limit = device.smem_per_block_optin
    cases = [(schedule, cfg)
             for schedule in (*SCHEDULES.values(), *DUAL_B_SCHEDULES.values())
             for cfg in schedule.configs(limit)]
    phased = []
    for i, (schedule, cfg) in enumerate((s, c) for s, c in cases
                                        if getattr(s, "phased_ok", False)):
        b_ok = cfg.b_phases_ok
        can = [which for which, ok in (("a", not cfg.trans_a), ("b", b_ok),
                                       ("ab", not cfg.trans_a and b_ok)) if ok]
        if not can:
            continue
        which = can[i % len(can)]
        a_pitch = 1 + i % (PHASES - 1) if "a" in which else 0
        b_pitch = 1 + (i + 3) % (PHASES - 1) if "b" in which else 0
        cfg = schedule.phased_config(cfg, a_pitch, b_pitch, limit)
        if cfg.stages >= PHASED_MIN_STAGES:
            phased.append((schedule, cfg))
    transposed, tiles = [], []
    for schedule, cfg in cases:
        if (not getattr(schedule, "transposed_store_ok", False) or cfg.epilogue is not None
                or not cfg.transposable):
            continue
        tile = (schedule, cfg.block_m, cfg.block_n)
        if tile not in tiles:
            tiles.append(tile)
        if (cfg.trans_a, cfg.trans_b) == LAYOUTS[tiles.index(tile) % len(LAYOUTS)]:
            transposed.append((schedule, replace(cfg, trans_c=True)))
    return cases + phased + transposed


def default_workers() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _fill_cache(case) -> None:
    """One pool task: compile the kernel into the cache and keep its SASS listing there. A
    failure is left to the caller's own compile, which raises it where it is checked."""
    schedule, cfg = case
    try:
        kernel = compiler.compile_schedule(schedule, cfg)
        tool = sass.find_cuobjdump()
        if tool:
            sass.cached_listing(kernel.cubin_path, tool)
    except Exception:   # noqa: BLE001 -- reported by the caller's compile of the same kernel
        pass


def _in_cache(case, tool: str | None) -> bool:
    """Whether the kernel and (with cuobjdump) its SASS listing are in the cache already."""
    schedule, cfg = case
    cubin = compiler.cached_cubin(schedule.render(cfg))
    return cubin is not None and (tool is None or sass.listing_path(cubin).exists())


def fill_cache(cases, workers: int | None = None) -> None:
    """Compiles `cases` ((schedule, config) pairs) that are not in the kernel cache yet into
    it with their SASS listings, `workers` processes at once (default_workers()). Spawned,
    not forked: the caller may hold a CUDA context, which a forked child must not inherit."""
    tool = sass.find_cuobjdump()
    cases = [case for case in cases if not _in_cache(case, tool)]
    workers = min(workers or default_workers(), len(cases))
    if workers <= 1:
        for case in cases:
            _fill_cache(case)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_fill_cache, cases))


def check_all(device: DeviceInfo, workers: int | None = None) -> list[KernelCheck]:
    tool = sass.find_cuobjdump()
    cases = kernel_matrix(device)
    fill_cache(cases, workers)
    out = []
    for schedule, cfg in cases:
        kernel = compiler.compile_schedule(schedule, cfg)
        smem = schedule.smem_bytes(cfg)
        summary = sass.cached_summary(kernel.cubin_path, tool) if tool else None
        r = kernel.report
        problems = r.problems(smem, device.smem_per_block_optin)
        problems += cluster_problems(schedule, summary) if summary else []
        out.append(KernelCheck(kernel.name, r.registers, smem, r.spill_stores + r.spill_loads,
                               summary, tuple(problems)))
    return out


def cluster_problems(schedule, summary: sass.SassSummary) -> list[str]:
    """A cluster kernel must multicast its TMA loads, arrive on its peers' mbarriers and meet
    its peers at cluster barriers (after the barrier init and before exit); a kernel in a
    cluster shaped at launch must meet its peers at its cluster barriers (every warpgroup: at
    least an arrive and a wait for each) and neither multicast nor arrive on a peer's
    mbarrier; a kernel without a cluster must do none of it."""
    c = summary.counts
    if schedule.cluster_at_launch:
        used = [name for name in ("tma_multicast", "remote_arrive") if c[name]]
        out = ([f"multicast or remote arrives in a split-K cluster: {', '.join(used)}"]
               if used else [])
        if c["cluster_barrier"] < 2 * LAUNCH_CLUSTER_BARRIERS:
            out.append(f"{c['cluster_barrier']} cluster barrier instructions: expected an arrive "
                       f"and a wait for each of {LAUNCH_CLUSTER_BARRIERS} cluster barriers")
        return out
    if schedule.cluster_size == 1:
        used = [name for name in ("tma_multicast", "cluster_barrier", "remote_arrive") if c[name]]
        return [f"cluster instructions without a cluster: {', '.join(used)}"] if used else []
    out = []
    if not c["tma_multicast"]:
        out.append("no multicast TMA load (UTMALDG.MULTICAST) in a cluster kernel")
    if not c["remote_arrive"]:
        out.append("no arrive on a peer CTA's mbarrier in a cluster kernel")
    if c["cluster_barrier"] < 2 * CLUSTER_BARRIERS:
        out.append(f"{c['cluster_barrier']} cluster barrier instructions: expected an arrive and a "
                   f"wait for each of {CLUSTER_BARRIERS} cluster barriers (init, exit)")
    return out


def format_checks(checks: list[KernelCheck]) -> str:
    head = f"{'kernel':<48} {'regs':>4} {'smem B':>7} {'spill':>5}  {'arch':<7} HGMMA UTMALDG UTMASTG  ok"
    rows = [head, "-" * len(head)]
    for c in checks:
        s = c.sass
        sass_cols = (f"{s.arch:<7} {s.counts['hgmma']:>5} {s.counts['tma_load']:>7} "
                     f"{s.counts['tma_store']:>7}" if s else f"{'(no cuobjdump)':<31}")
        rows.append(f"{c.name:<48} {c.registers:>4} {c.smem_bytes:>7} {c.spill_bytes:>5}  "
                    f"{sass_cols}  {'yes' if c.ok else 'NO: ' + '; '.join(c.problems)}")
    return "\n".join(rows)

"""Autotuning: time candidate configs on the GPU and keep the winners in an on-disk table
that `matmul` consults before the heuristic.

The table is one JSON file in the kernel cache directory (HOPMM_CACHE_DIR). Writers take an
exclusive lock, re-read the file, merge their entries and replace it atomically, so several
processes can tune at once without losing each other's results; readers never see a partial
file and pick up other processes' entries when the file changes. A table that is not this
user's, that others can write, or that does not parse is reported once (CacheWarning), never
used, and replaced by the next write; where the cache cannot be written, results are kept in
memory for this process.
"""
from __future__ import annotations

import fcntl
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import compile as compiler
from . import device as device_mod
from . import fastpath, kernel_cache, launch, layout, operands
from .device import DeviceInfo
from . import heuristics
from .heuristics import GEMV_MAX_M, SPLIT_K_MAX_SPLITS, Choice, label, split_configs
from .layout import MAX_GRID_Z
from .problem import KERNEL_DTYPES, Problem
from .schedules import (BLOCK_M, MIN_STAGES, SCHEDULES, GemvSchedule, SplitKParallelSchedule,
                        StreamKSchedule, transposed_problem)
from .timing import interleaved_medians, sustained_medians

TABLE_NAME = "autotune-v3.json"  # v2: entries carry a split count; v3: epilogue staging rings
# The heuristic's groups (heuristics.RASTER_GROUPS).
RASTER_GROUPS = heuristics.RASTER_GROUPS
# The fastest candidates in the interleaved timings are timed again alone
# (timing.sustained_medians) where a problem runs at the power limit (at least 2 x 2048³
# flops, as bench.py's sustained rounds), and the fastest of them alone wins.
SUSTAINED_FINALISTS = 3
SUSTAINED_MIN_FLOPS = 2 * 2048**3
# Split counts tried for the split-K schedule (those within its co-residency bound).
SPLIT_COUNTS = (2, 4, 8, 16)
# ... and for split_k_parallel, which takes any count the bound allows (and the bound itself).
PARALLEL_SPLIT_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# ... and for gemv (problems of at most GEMV_MAX_M rows or columns): these multiples of the
# heuristic's count, and 1. Its config is the heuristic's (GemvConfig.default): an entry
# records its rows and width (block_m, block_n) and stages 0, and is taken only where they
# still match.
GEMV_SPLIT_FACTORS = (0.5, 1, 2)


@dataclass(frozen=True)
class TunedEntry:
    schedule: str
    block_n: int
    stages: int
    raster_group: int
    tflops: float
    when: str
    splits: int = 1   # split_k only; tables written before split-K have no such field
    block_m: int = BLOCK_M   # tables written before 192-row tiles have no such field
    trans_c: bool = False    # computed as C^T (KernelConfig.trans_c); older tables: none


def table_path() -> Path:
    return compiler.cache_dir(create=False) / TABLE_NAME


def problem_key(problem: Problem, device: DeviceInfo) -> str:
    return (f"{device.name}|sm{device.sm_count}|{problem.dtype}|{problem.layout}|"
            f"{problem.m}x{problem.n}x{problem.k}|b{problem.batch}"
            + ("" if problem.b_pitch_aligned else "|b-pitch-unaligned"))


def choice_from(entry: TunedEntry, problem: Problem, device: DeviceInfo) -> Choice:
    """The entry as a Choice; ValueError for an entry this version cannot run as written (a
    table is shared across versions and may have been edited by hand)."""
    if entry.schedule == GemvSchedule.name:
        return _gemv_choice_from(entry, problem, device)
    sched = SCHEDULES.get(entry.schedule)
    if sched is None:
        raise ValueError(f"unknown schedule {entry.schedule!r}")
    if (entry.block_m, entry.block_n) not in sched.tile_shapes():
        raise ValueError(f"tile {entry.block_m!r}x{entry.block_n!r} not one of "
                         f"{sched.tile_shapes()}")
    if type(entry.raster_group) is not int or entry.raster_group < 1:
        raise ValueError(f"raster_group {entry.raster_group!r} is not a positive int")
    if type(entry.trans_c) is not bool or (entry.trans_c and not sched.transposed_store_ok):
        raise ValueError(f"trans_c {entry.trans_c!r} invalid for schedule {entry.schedule!r}")
    problem = transposed_problem(problem) if entry.trans_c else problem   # the kernel's
    deepest = sched.deepest(problem.dtype, entry.block_n, problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin, entry.block_m)
    if deepest is None or type(entry.stages) is not int or not (
            MIN_STAGES <= entry.stages <= deepest.stages):
        raise ValueError(f"stages {entry.stages!r} do not fit this device's shared memory")
    cfg = replace(deepest, stages=entry.stages, trans_c=entry.trans_c)
    splits = entry.splits
    if type(splits) is not int or splits < 1 or (splits > 1 and not sched.splits_label):
        raise ValueError(f"splits {splits!r} invalid for schedule {entry.schedule!r}")
    # The launch's own checks: a split count within its bound, stream_k's CTAs for its lanes.
    batch_count = min(problem.batch, MAX_GRID_Z)
    sched.grid(problem, cfg, batch_count, sched.resident_ctas(device), splits)
    sched.check_grid(problem, cfg, batch_count, entry.raster_group, splits)
    return Choice(sched, cfg, f"autotuned {entry.when}: {entry.tflops} TFLOP/s "
                              f"({table_path()})"
                  + (f"; split_k with {splits} splits" if sched.split_k else "")
                  + ("; computed as C^T = B^T A^T and stored transposed" if cfg.trans_c
                     else ""),
                  entry.raster_group, splits)


def _gemv_choice_from(entry: TunedEntry, problem: Problem, device: DeviceInfo) -> Choice:
    base = heuristics.choose(problem, device, GemvSchedule.name)
    cfg = base.config
    if (entry.block_m, entry.block_n) != (cfg.max_rows, cfg.block_n):
        raise ValueError(f"gemv {entry.block_m!r}x{entry.block_n!r} is not this version's "
                         f"config for the problem ({cfg.max_rows}x{cfg.block_n})")
    bound = GemvSchedule.max_splits(GemvSchedule.kernel_problem(problem, cfg), cfg,
                                    min(problem.batch, MAX_GRID_Z))
    if type(entry.splits) is not int or not 1 <= entry.splits <= bound:
        raise ValueError(f"splits {entry.splits!r} invalid for gemv here (1..{bound})")
    return Choice(GemvSchedule, cfg, f"autotuned {entry.when}: {entry.tflops} TFLOP/s "
                                     f"({table_path()}); gemv with {entry.splits} K splits",
                  1, entry.splits)


def gemv_candidates(problem: Problem, device: DeviceInfo) -> list[Choice]:
    """gemv at the heuristic's config with GEMV_SPLIT_FACTORS of its split count (and 1),
    for problems of at most GEMV_MAX_M rows or columns; none otherwise."""
    if min(problem.m, problem.n) > GEMV_MAX_M:
        return []
    base = heuristics.choose(problem, device, GemvSchedule.name)
    bound = GemvSchedule.max_splits(GemvSchedule.kernel_problem(problem, base.config),
                                    base.config, min(problem.batch, MAX_GRID_Z))
    counts = {1} | {min(bound, max(1, round(base.splits * f))) for f in GEMV_SPLIT_FACTORS}
    return [Choice(GemvSchedule, base.config, "autotune candidate", 1, s) for s in sorted(counts)]


class _Table:
    """The parsed table, reloaded when the file changes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._path = None
        self._stamp = None
        self._entries: dict = {}
        self.in_memory: dict = {}   # results that could not be written (unwritable cache)

    def entries(self) -> dict:
        path = table_path()
        try:
            st = path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # os.replace makes a new inode
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if path != self._path or stamp != self._stamp:
                merged = dict(_read(path) if stamp else {}, **self.in_memory)
                self._entries = {k: v for k, v in merged.items() if v is not None}
                self._path, self._stamp = path, stamp
            return self._entries

    def keep_in_memory(self, new: dict) -> None:
        with self._lock:
            self.in_memory.update(new)
            self._stamp = self._path = None   # merged in at the next lookup


_table = _Table()


def _read(path: Path) -> dict:
    """The table's entries; {} (warned once per state of the file) for a missing, foreign,
    unsafe or corrupt table."""
    try:
        raw = json.loads(kernel_cache.read_trusted(path).decode())
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ValueError("expected an object of objects")
        return {k: TunedEntry(**v) for k, v in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as exc:   # UnicodeDecodeError is a ValueError
        try:
            st = path.stat()
            state = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            state = None
        kernel_cache.warn_once(("table", str(path), state),
                               f"hopmm: ignoring unreadable autotune table {path}: {exc}; "
                               f"the next autotune result replaces it")
        return {}


def lookup(problem: Problem, device: DeviceInfo, epilogue: bool = False,
           epilogue_reads: bool = False) -> Choice | None:
    """The autotuned choice for `problem`, None where there is none or it cannot serve the
    call well (`epilogue`: the call fuses an epilogue, which gemv and a transposed kernel do
    not take; `epilogue_reads`: one that reads bias or c, which a winner timed without it may
    read one pair at a time (Schedule.epilogue_fetches_boxes): heuristics.choose decides such
    calls)."""
    entry = _table.entries().get(problem_key(problem, device))
    if entry is None:
        return None
    try:
        choice = choice_from(entry, problem, device)
    except (TypeError, ValueError) as exc:
        print(f"hopmm: ignoring autotune entry {entry}: {exc!r}", file=sys.stderr)
        return None
    if epilogue and (choice.schedule is GemvSchedule or choice.config.trans_c):
        return None
    if epilogue_reads and not choice.schedule.epilogue_fetches_boxes(choice.config):
        return None
    return choice


def record(new: dict) -> None:
    """Merges {problem_key: TunedEntry} into the table under an exclusive lock; a key whose
    entry is None is removed (the heuristic's own choice won)."""
    path = compiler.cache_dir(create=True) / TABLE_NAME
    try:
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged = _read(path)
            merged.update(new)
            text = json.dumps({k: asdict(v) for k, v in sorted(merged.items())
                               if v is not None}, indent=1)
            compiler.atomic_write(path, text.encode())
    except OSError as exc:
        kernel_cache.report_unwritable(path.parent, exc)
        _table.keep_in_memory(new)


def candidates(problem: Problem, device: DeviceInfo) -> list[Choice]:
    """Every schedule x tile shape x raster group that fits, with the deepest pipeline, and
    the heuristic's choice. (A cluster schedule walks its groups of M tiles pair by pair: same
    groups, same meaning.)"""
    out = []
    for sched in SCHEDULES.values():
        if sched is StreamKSchedule:
            out.extend(replace(c, reason="autotune candidate")
                       for c in heuristics.stream_k_choices(problem, device))
            continue
        configs = (split_configs(sched, problem, device) if sched is SplitKParallelSchedule
                   else _tile_configs(sched, problem, device))
        for cfg in configs:
            tiles_m = -(-problem.m // cfg.block_m)
            groups = _raster_groups(problem, cfg)
            if not sched.split_k:
                out.extend(Choice(sched, cfg, "autotune candidate", g) for g in groups)
                continue
            # Split-K gives idle SMs slices of K: with a tile for every SM there are none
            # (but split_k_parallel's 64-row tiles, for problems of few rows, also run unsplit).
            batch_count = min(problem.batch, MAX_GRID_Z)
            short = cfg.block_m < BLOCK_M
            tiles = tiles_m * -(-problem.n // cfg.block_n) * batch_count
            if tiles >= device.sm_count and not short:
                continue
            bound = sched.max_splits(problem, cfg, batch_count, device.sm_count)
            if sched is SplitKParallelSchedule:
                counts = {min(s, bound) for s in PARALLEL_SPLIT_COUNTS + (bound,)}
            else:
                counts = {min(s, bound) for s in SPLIT_COUNTS if s <= SPLIT_K_MAX_SPLITS}
            for splits in sorted(counts if short else counts - {1}):
                out.extend(Choice(sched, cfg, "autotune candidate", g, splits) for g in groups)
    out += transposed_candidates(problem, device)
    out += gemv_candidates(problem, device)
    # The heuristic's own choice, whose split count or group may be none of those above: a
    # table entry then never holds a config slower than what matmul runs untuned.
    try:
        own = heuristics.choose(problem, device)
    except RuntimeError:   # no tile of the heuristic's fits this device: nothing to add
        return out
    if label(own) not in {label(c) for c in out}:
        out.append(replace(own, reason="autotune candidate"))
    return out


def _tile_configs(sched, problem: Problem, device: DeviceInfo) -> list:
    """`sched`'s deepest config of each of its tile shapes that fits, in `problem`'s layout."""
    configs = (sched.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                             device.smem_per_block_optin, block_m)
               for block_m, block_n in sched.tile_shapes())
    return [cfg for cfg in configs if cfg is not None]


def _raster_groups(problem: Problem, cfg) -> list[int]:
    """RASTER_GROUPS, each at most the problem's M-tiles."""
    tiles_m = -(-problem.m // cfg.block_m)
    return sorted({min(g, tiles_m) for g in RASTER_GROUPS})


def transposed_candidates(problem: Problem, device: DeviceInfo) -> list[Choice]:
    """Each tile shape x raster group of the schedules that store transposed
    (KernelConfig.trans_c; the tiles that may: KernelConfig.transposable) on the transpose of
    `problem`, with the deepest pipeline; none where B's lines are not whole 128-byte lines
    (the heuristic never transposes those)."""
    if not problem.b_pitch_aligned:
        return []
    flipped = transposed_problem(problem)
    return [Choice(sched, replace(cfg, trans_c=True), "autotune candidate", g)
            for sched in SCHEDULES.values() if sched.transposed_store_ok
            for cfg in _tile_configs(sched, flipped, device) if cfg.transposable
            for g in _raster_groups(flipped, cfg)]


def _validate_shapes(shapes, dtype) -> list[tuple[int, int, int]]:
    if str(dtype) not in KERNEL_DTYPES:
        raise ValueError(f"autotune: dtype must be one of {KERNEL_DTYPES}, got {dtype!r}")
    out = []
    for shape in shapes:
        if (not isinstance(shape, (tuple, list)) or len(shape) != 3
                or not all(type(x) is int and x > 0 for x in shape)):
            raise ValueError(f"autotune: each shape is (m, n, k) of positive ints, got {shape!r}")
        out.append(tuple(shape))
    if not out:
        raise ValueError("autotune: no shapes given")
    return out


def autotune(shapes, dtype="bfloat16", *, warmup_s: float = 0.3, rounds: int = 5,
             input_sets: int = 2, progress=None) -> list[dict]:
    """Times every candidate for each (m, n, k) of `shapes` (row-major A and B) and stores the
    fastest correct one (after each shape, so an interruption keeps what was tuned); on
    problems at the power limit the fastest of SUSTAINED_FINALISTS run again alone
    (sustained_finalists). Returns one row per shape: the winner, every correct candidate's
    TFLOP/s and, where they ran, the finalists' TFLOP/s alone ("sustained_tflops")."""
    # Looked up per call, not bound at import: the caller may have redirected stderr since.
    progress = sys.stderr if progress is None else progress
    import cupy

    shapes = _validate_shapes(shapes, dtype)
    device = device_mod.query(cupy.cuda.Device().id)
    rows = []
    for m, n, k in shapes:
        # Operands as the kernel reads them (aligned copies where rows are not 16-byte
        # multiples) and an aligned result buffer, one of each per rotating input set.
        sets, call = [], None
        for _ in range(input_sets):
            a = cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype)
            b = cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype)
            call = operands.kernel_operands(a, b, layout.matmul_shapes(a.shape, b.shape))
            c3 = launch.padded_empty(1, m, n, layout.padded(n, a.itemsize), dtype)
            sets.append((call.a3, call.b3, c3))
        a3, b3, c3 = sets[0]
        ref = cupy.matmul(a3[0].astype(cupy.float32), b3[0].astype(cupy.float32))
        timed = {}
        for i, choice in enumerate(candidates(call.problem, device)):
            name = label(choice)
            launches = launch.build_launches(choice, call.problem, a3, call.a_map, b3,
                                             call.b_map, c3)
            c3.fill(cupy.nan)
            launch.launch_all(launches, a3.data.ptr, b3.data.ptr, c3.data.ptr)
            got = c3[0].astype(cupy.float32)
            err = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
            if not err < tolerance(dtype):  # also catches NaN: never record a wrong config
                print(f"[autotune] {m}x{n}x{k} {name}: WRONG (rel err {err:.2e}), skipped",
                      file=progress)
                continue
            timed[name] = (choice, launches)
            print(f"[autotune] {m}x{n}x{k} {dtype}: compiled and checked {i + 1} candidates",
                  file=progress, end="\r")
        if not timed:
            raise RuntimeError(f"autotune: no candidate computed {m}x{n}x{k} {dtype} correctly")
        launchers = {name: _launcher(ls) for name, (_, ls) in timed.items()}
        medians = interleaved_medians(launchers, sets, rounds, warmup_s)
        flops = 2.0 * m * n * k
        tflops = {name: flops / t / 1e12 for name, t in medians.items()}
        row = {"shape": (m, n, k), "dtype": dtype, "tflops": tflops}
        finalists = sustained_finalists(medians, flops)
        if finalists:
            alone = sustained_medians({f: launchers[f] for f in finalists}, sets, medians)
            row["sustained_tflops"] = {f: flops / t / 1e12 for f, t in alone.items()}
        ranked = row.get("sustained_tflops", tflops)
        best = max(ranked, key=ranked.get)
        choice = timed[best][0]
        cfg = choice.config
        gemv = choice.schedule is GemvSchedule   # its rows and width; no stages
        # A table entry names one kernel: where the heuristic's choice with a tail (two
        # kernels) won, the entry is removed and the heuristic decides.
        record({problem_key(call.problem, device): None if choice.tail else TunedEntry(
            choice.schedule.name, cfg.block_n, 0 if gemv else cfg.stages,
            choice.raster_group, round(ranked[best], 1), time.strftime("%Y-%m-%d"),
            choice.splits, cfg.max_rows if gemv else cfg.block_m,
            not gemv and cfg.trans_c)})
        fastpath.clear()  # remembered launches were built from the old choices
        how = f"alone, of {len(finalists)} finalists" if finalists else "interleaved"
        print(f"[autotune] {m}x{n}x{k} {dtype}: best {best} {ranked[best]:.1f} TFLOP/s ({how}) "
              f"of {len(tflops)} candidates", file=progress)
        rows.append(dict(row, best=best))
    return rows


def sustained_finalists(medians: dict, flops: float) -> list:
    """The SUSTAINED_FINALISTS fastest names of `medians` (seconds per call) to time again
    alone, where the problem has SUSTAINED_MIN_FLOPS and there is a choice; else none."""
    if flops < SUSTAINED_MIN_FLOPS or len(medians) < 2:
        return []
    return sorted(medians, key=medians.get)[:SUSTAINED_FINALISTS]


def _launcher(launches):
    return lambda a3, b3, c3: launch.launch_all(launches, a3.data.ptr, b3.data.ptr, c3.data.ptr)


def tolerance(dtype) -> float:
    """‖out − ref‖ / ‖ref‖ a correct fp32-accumulating kernel stays under."""
    return 1e-2 if str(dtype) == "bfloat16" else 2e-3

"""Autotuning: time candidate configs on the GPU and keep the winners in an on-disk table
that `matmul` consults before the heuristic.

The table is one JSON file in the kernel cache directory (HOPMM_CACHE_DIR). Writers take an
exclusive lock, re-read the file, merge their entries and replace it atomically, so several
processes can tune at once without losing each other's results; readers never see a partial
file and pick up other processes' entries when the file changes.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import compile as compiler
from .device import DeviceInfo
from .heuristics import MIN_STAGES, Choice
from .problem import Problem
from .schedules import SCHEDULES, KernelConfig

TABLE_NAME = "autotune-v1.json"
RASTER_GROUPS = (8, 16, 32)


@dataclass(frozen=True)
class TunedEntry:
    schedule: str
    block_n: int
    stages: int
    raster_group: int
    tflops: float
    when: str


def table_path() -> Path:
    return compiler.cache_dir() / TABLE_NAME


def problem_key(problem: Problem, device: DeviceInfo) -> str:
    return (f"{device.name}|sm{device.sm_count}|{problem.dtype}|{problem.layout}|"
            f"{problem.m}x{problem.n}x{problem.k}|b{problem.batch}")


def choice_from(entry: TunedEntry, problem: Problem) -> Choice:
    sched = SCHEDULES[entry.schedule]
    cfg = KernelConfig(dtype=problem.dtype, block_n=entry.block_n, stages=entry.stages,
                       trans_a=problem.a_major == "m", trans_b=problem.b_major == "n")
    return Choice(sched, cfg, f"autotuned {entry.when}: {entry.tflops:.1f} TFLOP/s "
                              f"({table_path()})", entry.raster_group)


class _Table:
    """The parsed table, reloaded when the file changes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._path = None
        self._stamp = None
        self._entries: dict = {}

    def entries(self) -> dict:
        path = table_path()
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if path != self._path or stamp != self._stamp:
                self._entries = _read(path) if stamp else {}
                self._path, self._stamp = path, stamp
            return self._entries


_table = _Table()


def _read(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
        return {k: TunedEntry(**v) for k, v in raw.items()}
    except (OSError, ValueError, TypeError) as exc:
        print(f"hopmm: ignoring unreadable autotune table {path}: {exc}", file=sys.stderr)
        return {}


def lookup(problem: Problem, device: DeviceInfo) -> Choice | None:
    entry = _table.entries().get(problem_key(problem, device))
    if entry is None:
        return None
    try:
        return choice_from(entry, problem)
    except (KeyError, ValueError) as exc:  # written by a version with other schedules
        print(f"hopmm: ignoring autotune entry {entry}: {exc!r}", file=sys.stderr)
        return None


def record(new: dict) -> None:
    """Merges {problem_key: TunedEntry} into the table under an exclusive lock."""
    path = table_path()
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = _read(path) if path.exists() else {}
        merged.update(new)
        text = json.dumps({k: asdict(v) for k, v in sorted(merged.items())}, indent=1)
        compiler._atomic_write(path, text.encode())


def candidates(problem: Problem, device: DeviceInfo) -> list[Choice]:
    """Every schedule x tile width x raster group that fits, with the deepest pipeline."""
    tiles_m = -(-problem.m // 128)
    groups = sorted({min(g, tiles_m) for g in RASTER_GROUPS})
    out = []
    for sched in SCHEDULES.values():
        for block_n in sched.block_ns:
            cfg = KernelConfig(dtype=problem.dtype, block_n=block_n, stages=1,
                               trans_a=problem.a_major == "m", trans_b=problem.b_major == "n")
            stages = sched.max_stages(cfg, device.smem_per_block_optin)
            if stages < MIN_STAGES:
                continue
            cfg = KernelConfig(dtype=cfg.dtype, block_n=block_n, stages=stages,
                               trans_a=cfg.trans_a, trans_b=cfg.trans_b)
            for group in groups:
                out.append(Choice(sched, cfg, "autotune candidate", group))
    return out


def label(choice: Choice) -> str:
    c = choice.config
    return f"{choice.schedule.name} {c.block_m}x{c.block_n} s{c.stages} g{choice.raster_group}"


def api_tolerance(dtype: str) -> float:
    """‖out − ref‖ / ‖ref‖ a correct fp32-accumulating kernel stays under."""
    return 1e-2 if str(dtype) == "bfloat16" else 2e-3


def autotune(shapes, dtype="bfloat16", *, warmup_s: float = 0.3, rounds: int = 5,
             input_sets: int = 2, progress=sys.stderr) -> list[dict]:
    """Times every candidate for each (m, n, k) of `shapes` (row-major A and B) and stores the
    fastest correct one. Returns one row per shape: the winner and every candidate's TFLOP/s."""
    import cupy

    from . import api, fastpath, launch
    from .device import query
    from .layout import matmul_shapes
    from .timing import interleaved_medians

    device = query(cupy.cuda.Device().id)
    rows, new = [], {}
    for m, n, k in shapes:
        sets = [(cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype),
                 cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype),
                 cupy.empty((m, n), dtype=dtype)) for _ in range(input_sets)]
        a, b, _ = sets[0]
        call = api._kernel_call(a, b, matmul_shapes(a.shape, b.shape))
        ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
        tol = api_tolerance(dtype)
        timed = {}
        for i, choice in enumerate(candidates(call.problem, device)):
            name = label(choice)
            launches = launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                             call.b_map, sets[0][2].reshape(1, m, n))
            out = sets[0][2]
            out.fill(cupy.nan)
            launch.launch_all(launches, a.data.ptr, b.data.ptr, out.data.ptr)
            err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
            if not err < tol:  # also catches NaN: never record a config that is wrong
                print(f"[autotune] {m}x{n}x{k} {name}: WRONG (rel err {err:.2e}), skipped",
                      file=progress)
                continue
            timed[name] = (choice, launches)
            print(f"[autotune] {m}x{n}x{k} {dtype}: compiled and checked {i + 1} candidates",
                  file=progress, end="\r")
        medians = interleaved_medians(
            {name: (lambda ls: lambda a, b, c: launch.launch_all(ls, a.data.ptr, b.data.ptr,
                                                                 c.data.ptr))(ls)
             for name, (_, ls) in timed.items()}, sets, rounds, warmup_s)
        flops = 2.0 * m * n * k
        tflops = {name: flops / t / 1e12 for name, t in medians.items()}
        best = max(tflops, key=tflops.get)
        choice = timed[best][0]
        new[problem_key(call.problem, device)] = TunedEntry(
            choice.schedule.name, choice.config.block_n, choice.config.stages,
            choice.raster_group, round(tflops[best], 1), time.strftime("%Y-%m-%d"))
        print(f"[autotune] {m}x{n}x{k} {dtype}: best {best} {tflops[best]:.1f} TFLOP/s of "
              f"{len(tflops)} candidates", file=progress)
        rows.append({"shape": (m, n, k), "dtype": dtype, "best": best, "tflops": tflops})
    record(new)
    fastpath.clear()  # remembered launches were built from the old choices
    return rows


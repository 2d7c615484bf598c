#!/usr/bin/env python3
"""hopmm's reliability checks on the GPU machine, from one script.

    python bench/reliability.py [--quick] [--soak-s S] [--threads-s T] [--items a,b,...]
                                [--sanitizer PATH] [--json FILE]

Items, in order (--items picks some; each prints a line per check as it finishes, and a
table of all of them comes LAST):

  warm       every kernel of every schedule (gemv's too) compiled into the cache the later
             items use (HOPMM_CACHE_DIR, else the user's cache), in parallel processes; the
             compile count and time.
  sanitize   compute-sanitizer memcheck, racecheck, synccheck and initcheck on every schedule
             (forced) over edge shapes: tile edges, 1 row, 1 column, K below one k-block, K no
             multiple of the split, a batch, odd row pitches, transposes, a fused epilogue
             (bias, c and an activation) at tile edges; gemv over its own decode edge
             shapes (GEMV_SHAPES). Each (tool,
             schedule) is one run of bench/reliability_driver.py under the tool, the results
             checked against a host product; memcheck takes every edge shape, the slower
             tools a few. memcheck, racecheck and synccheck instrument hopmm's kernels only
             (--kernel-name kns=hopmm); initcheck every kernel.
  processes  8 processes on an empty cache compiling the same kernels at once: every
             result correct, each kernel compiled at most once per process (and, through the
             cache's entry locks, once among them), every cache entry verifies afterwards.
  threads    16 threads, each on its own CuPy stream, calling random shapes for --threads-s
             seconds, every result checked against cupy.matmul.
  autotune   autotune in two processes at once on one cache directory: both finish, and the
             table holds every shape either tuned, each entry usable.
  soak       every kernel loaded first (compiled by `warm` where it ran before), then random
             calls (shapes, dtypes, layouts, batches, forced schedules) for --soak-s
             seconds; host RSS and the GPU memory pool sampled after a warm-up and at the end
             must stay within RSS_TOLERANCE_MB / POOL_TOLERANCE_MB; every SOAK_CHECK_EVERY-th
             result checked; hopmm's cache sizes printed against their bounds.

Default runtime about 6 minutes on an H100 machine (--quick: about 2). Exit status 1 if any
check failed; a check that cannot run (no compute-sanitizer) is listed as skipped.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DRIVER = BENCH_DIR / "reliability_driver.py"
# This checkout's hopmm (its child processes get the same through PYTHONPATH), and the driver.
sys.path[:0] = [str(REPO), str(BENCH_DIR)]
from reliability_driver import ODD_PITCH_PAD, TOLERANCE, Case  # noqa: E402

ITEMS = ("warm", "sanitize", "processes", "threads", "autotune", "soak")
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
SANITIZER_NAME = "compute-sanitizer"
# Exit status the sanitizer gives when it found errors: distinct from the driver's own 1
# (a wrong product), so the line says which one failed.
SANITIZER_ERROR_EXIT = 86
# Runs side by side: the GPU has room for several small instrumented processes, and the
# sanitizer's host work is what takes the time.
SANITIZER_PARALLEL = 6
SANITIZER_TIMEOUT_S = 300
SANITIZER_PRINT_LIMIT = 20    # errors printed per run: the first ones say what is wrong
# Kernels whose names hold this substring are instrumented, the others (CuPy's, cuBLAS's) run
# plainly. Not under initcheck: it must see the kernels that write hopmm's operands, or it
# would take every read of them for a read of uninitialised memory.
HOPMM_KERNELS = "kns=hopmm"
HOPMM_KERNEL_PREFIX = "hopmm_"   # every kernel hopmm renders is named so
FILTERED_TOOLS = ("memcheck", "racecheck", "synccheck")
# The sanitizer's own lines start with this; its error reports hold one of these words.
SANITIZER_PREFIX = "========="
SANITIZER_ERROR_WORDS = ("Invalid", "Error", "Race", "Hazard", "Uninitialized", "Barrier")

# Edge shapes (see reliability_driver.Case for the notation). One 128 x 256 tile exactly and
# one element past it on every side; a single row; a single column; K below one 64-wide
# k-block; K of 14 k-blocks less 47 (no split count divides it); a batch of 3 with edges
# inside; odd row pitches (aligned copies); both operands transposed; a main loop long enough
# for the 64-row tiles, of few rows (the 64 x 128 tile) and of one round of them.
EDGE_SHAPES = {
    "tile": "128x256x128",
    "tile_edge": "129x257x130",
    "one_row": "1x264x192",
    "one_col": "200x1x192",
    "short_k": "136x144x40",
    "k_split": "96x192x849",
    "batch": "100x72x136:b3",
    "odd_pitch": "120x200x328:pitch",
    "transposed": "192x200x264:ta:tb:fp16",
    "fused": "129x257x130:fused",   # bias, c and an activation in the epilogue, at tile edges
    "few_rows": "40x300x1100",
    "short_tiles": "300x700x1100",
}
# gemv's own edge shapes (decode: at most 16 rows, or few columns run transposed): one row;
# 16 rows (the tensor-core loops) with K = 777 (a part chunk) and N a part column block;
# 9 rows over K-major B with K = 2049; few columns (C^T = B^T A^T) with K below one chunk;
# a batch; odd row pitches. Every tool takes all of them (each run is short).
GEMV_SHAPES = ("1x264x192", "16x1000x777", "9x517x2049:tb", "300x8x5:ta", "7x72x136:b3",
               "12x200x328:pitch")
# The slower tools take the shapes most likely to find their kind of error.
TOOL_SHAPES = {
    "memcheck": tuple(EDGE_SHAPES),
    "racecheck": ("tile_edge", "k_split", "short_tiles"),
    "synccheck": ("tile_edge", "one_row", "batch", "few_rows"),
    "initcheck": ("odd_pitch", "short_k", "one_col"),
}
# Tools whose runs take one shape each, every run with its own SANITIZER_TIMEOUT_S: under
# initcheck every poll of the serial split-K's semaphore is instrumented, and three shapes in
# one run outlasted the timeout (NOTES v0.19).
SHAPE_BY_SHAPE_TOOLS = ("initcheck",)
QUICK_TOOL_SHAPES = {
    "memcheck": ("tile_edge", "one_row", "k_split", "odd_pitch", "fused", "few_rows"),
    "racecheck": ("tile_edge",),
    "synccheck": ("tile_edge",),
    "initcheck": ("odd_pitch",),
}

# initcheck does not count TMA bulk stores as writes, so it reports the split-K kernels'
# reads of their fp32 workspace, which only TMA stores write, as reads of uninitialised
# memory. That those reads follow the writes is shown by
# tests/test_gpu_split_k.py::test_workspace_is_written_before_it_is_read (a NaN-filled
# workspace before each call).
WORKSPACE_SCHEDULES = ("split_k", "split_k_parallel")
# Under initcheck every poll of those kernels' semaphores is instrumented: of the three
# initcheck shapes, two ran past SANITIZER_TIMEOUT_S on each (NOTES v0.19, v0.24). There
# initcheck can show only the blind spot above, so one shape runs.
WORKSPACE_INITCHECK_SHAPES = ("odd_pitch",)
UNINITIALISED_READ = "Uninitialized __global__ memory read"
KNOWN_BLIND_SPOT = ("initcheck does not see TMA stores into the split-K workspace "
                    "(test_workspace_is_written_before_it_is_read checks the order)")


# The same blind spot on results: memory a kernel wrote only by TMA stores, and nothing else
# before, is reported as uninitialised when CuPy reads it (the driver's checks); on memory the
# pool had handed out and something else had written before, it is not. Shown on the plain
# persistent kernel into unpooled memory (NOTES v0.24); that every element of a result is
# written is shown by the GPU tests' NaN-poisoned outputs instead.
KNOWN_TMA_RESULT = ("initcheck does not see TMA stores into fresh memory: the reports are "
                    "other kernels' reads of a result hopmm stored by TMA (NaN-poisoned "
                    "GPU tests check it is wholly written)")
# gemv reading rows where they lie (GemvConfig.in_place) loads the aligned 16-byte vectors that
# hold a row's elements, so also the bytes around the row inside those vectors (an odd pitch's
# padding, the pool's bytes after the last row), which it shifts away unused; initcheck reports
# those bytes when nothing wrote them. memcheck shows no read leaves an allocation, and the
# NaN-padded K-tail GPU tests show none reaches a result (NOTES v0.27).
KNOWN_IN_PLACE_READS = ("gemv's in-place vector loads read the bytes around a row within its "
                        "aligned 16-byte vectors and discard them (memcheck: in bounds)")
# A report's kernel: the line after the report, "=========     at <function>+<offset>".
_REPORT_AT = re.compile(r"^=========\s+at\s+(\S+?)(\+0x[0-9a-f]+)?\s*$")


def known_blind_spot(tool: str, schedule: str, detail: str) -> bool:
    """Whether a failed sanitizer run is the workspace's blind spot above and nothing else."""
    return (tool == "initcheck" and schedule in WORKSPACE_SCHEDULES
            and UNINITIALISED_READ in detail and "Invalid" not in detail)


def reads_of_tma_results_only(tool: str, output: str) -> bool:
    """Whether every error an initcheck run printed is an uninitialised read by a kernel
    that is not hopmm's (KNOWN_TMA_RESULT), and there was at least one."""
    if tool != "initcheck":
        return False
    lines = output.splitlines()
    reports = [i for i, line in enumerate(lines) if line.startswith(SANITIZER_PREFIX)
               and any(word in line for word in SANITIZER_ERROR_WORDS)
               and "ERROR SUMMARY" not in line]
    if not reports:
        return False
    for i in reports:
        if UNINITIALISED_READ not in lines[i] or i + 1 >= len(lines):
            return False
        at = _REPORT_AT.match(lines[i + 1])
        if at is None or at.group(1).startswith(HOPMM_KERNEL_PREFIX):
            return False
    return True


PROCESSES = 8
# Two kernels (the heuristic's choices for these shapes): a plain GEMM and a split-K one.
PROCESS_SHAPES = ("1024x1024x1024", "64x1024x8192")
THREADS = 16
DEFAULT_THREADS_S = 60      # a minute of threaded calls, the length the reliability record names
DEFAULT_SOAK_S = 100
QUICK_THREADS_S = 10
QUICK_SOAK_S = 25
# Autotune: one shape both processes tune and one each; few enough tiles that no split-K
# kernel is a candidate (3072 x 2048 makes at least 132 tiles of every size), so the
# candidates are the non-split kernels the warm item compiled.
AUTOTUNE_SHARED = "3072x2048x1024"
AUTOTUNE_OWN = ("3072x2048x2048", "3072x2048x512")
# Random calls: dimensions log-uniform in [1, RANDOM_MAX_DIM]; a batch of 2-4 one call in
# RANDOM_BATCH_ONE_IN.
RANDOM_MAX_DIM = 2048
RANDOM_BATCH_ONE_IN = 6
# Shares of calls with a transposed operand, odd row pitches (aligned copies) and float16:
# every path is drawn often, the common one (bfloat16, row-major) most.
RANDOM_TRANSPOSED_SHARE = 0.25
RANDOM_ODD_PITCH_SHARE = 0.1
RANDOM_FP16_SHARE = 0.3
# Soak: the first SOAK_WARMUP_FRACTION of the time fills the caches (kernels, recipes,
# workspaces) before the first memory sample; every SOAK_CHECK_EVERY-th result is checked.
SOAK_WARMUP_FRACTION = 0.25
SOAK_CHECK_EVERY = 10
SOAK_SCHEDULE_STRETCH = 50     # calls between changes of the forced schedule
SOAK_HEURISTIC_WEIGHT = 3      # the heuristic's choice counts as this many schedules
SOAK_REPEATED_SHAPES = 64
SOAK_REPEAT_SHARE = 0.7
# Calls that carry a fused epilogue (one of SOAK_CHAINS, with alpha), checked against the
# unfused fp32 computation like the plain ones.
SOAK_FUSED_SHARE = 0.3
# The fused chains a soak call draws, (activation, bias, c): every activation and operand
# appears, in few enough chains that the soak can load each of their kernels before it measures
# (load_every_kernel; all 24 chains times the row store made ~500 first loads inside the
# measured window and grew host memory by 234 MB, NOTES v0.24).
SOAK_CHAINS = (("relu", True, False), ("gelu", False, True), ("silu", True, True),
               (None, False, True), ("gelu_tanh", True, False), ("sigmoid", False, True))
# Growth from the first sample to the last that still counts as flat: the recipe cache may
# fill up to its bound in between (a few KB a recipe on the host), the workspaces grow to
# the largest split-K problem drawn (a few MB on the GPU).
RSS_TOLERANCE_MB = 96
POOL_TOLERANCE_MB = 256
SOAK_BAD_SHOWN = 5             # failed checks named in the soak's line
SEED = 20


@dataclass
class Result:
    item: str
    name: str
    status: str       # "ok", "FAIL", "skip" or "known" (a tool's blind spot, named in detail)
    detail: str
    seconds: float = 0.0


def line(r: Result) -> str:
    return f"[{r.item}] {r.name}: {r.status} ({r.seconds:.1f} s) {r.detail}"


def emit(results: list, r: Result) -> Result:
    results.append(r)
    print(line(r), flush=True)
    return r


def summary_table(results: list) -> str:
    """Per item: checks, ok, failed, skipped and the first failure's name; then a total."""
    rows = [("item", "checks", "ok", "failed", "skipped", "known", "seconds", "first failure")]

    def counts(rs):
        return tuple(str(sum(r.status == s for r in rs)) for s in ("ok", "FAIL", "skip", "known"))

    for item in dict.fromkeys(r.item for r in results):
        rs = [r for r in results if r.item == item]
        failed = [r for r in rs if r.status == "FAIL"]
        rows.append((item, str(len(rs))) + counts(rs)
                    + (f"{sum(r.seconds for r in rs):.0f}", failed[0].name if failed else "-"))
    rows.append(("total", str(len(results))) + counts(results)
                + (f"{sum(r.seconds for r in results):.0f}", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    fmt = lambda row: " | ".join(c.ljust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([fmt(rows[0]), "-+-".join("-" * w for w in widths)]
                     + [fmt(row) for row in rows[1:]])


# -- arguments ------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer sanitizer shapes, short thread and soak runs")
    parser.add_argument("--soak-s", type=float, default=None,
                        help=f"soak length (default {DEFAULT_SOAK_S}, quick {QUICK_SOAK_S})")
    parser.add_argument("--threads-s", type=float, default=None,
                        help=f"threads run length (default {DEFAULT_THREADS_S}, "
                             f"quick {QUICK_THREADS_S})")
    parser.add_argument("--items", default=",".join(ITEMS),
                        help=f"comma-separated subset of {','.join(ITEMS)}")
    parser.add_argument("--sanitizer", default=None, help="path of compute-sanitizer")
    parser.add_argument("--tools", default=None,
                        help=f"sanitize with these tools only (comma-separated; {','.join(TOOLS)})")
    parser.add_argument("--schedules", default=None,
                        help="sanitize these schedules only (comma-separated; default all)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.soak_s is None:
        args.soak_s = QUICK_SOAK_S if args.quick else DEFAULT_SOAK_S
    if args.threads_s is None:
        args.threads_s = QUICK_THREADS_S if args.quick else DEFAULT_THREADS_S
    if args.soak_s < 0 or args.threads_s < 0:
        parser.error("--soak-s and --threads-s must not be negative")
    items = [i.strip() for i in args.items.split(",") if i.strip()]
    unknown = [i for i in items if i not in ITEMS]
    if unknown:
        parser.error(f"unknown items {unknown}; known: {', '.join(ITEMS)}")
    args.items = items
    args.tools = _subset(parser, "--tools", args.tools, TOOLS)
    args.schedules = _subset(parser, "--schedules", args.schedules, sanitized_schedules())
    return args


def sanitized_schedules() -> list:
    """Every schedule the sanitizers run: the tile schedules, gemv and the shared-A ones."""
    from hopmm.schedules import DUAL_B_SCHEDULES, SCHEDULES, STREAMING_SCHEDULES

    return [*SCHEDULES, *STREAMING_SCHEDULES, *DUAL_B_SCHEDULES]


def _subset(parser, flag: str, value, known) -> list | None:
    """The comma-separated names of `value`, each one of `known` (None: all of them)."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in names if v not in known]
    if unknown or not names:
        parser.error(f"{flag}: unknown or no names {unknown}; known: {', '.join(known)}")
    return names


# -- child processes ------------------------------------------------------------------------

def child_env(cache_dir: str | None = None) -> dict:
    """The environment of a driver process: hopmm importable from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if cache_dir is not None:
        env["HOPMM_CACHE_DIR"] = cache_dir
    return env


def driver_command(shapes, schedule: str | None = None, autotune: bool = False) -> list:
    cmd = [sys.executable, str(DRIVER)]
    if schedule is not None:
        cmd += ["--schedule", schedule]
    if autotune:
        cmd.append("--autotune")
    return cmd + list(shapes)


def run_together(commands: list, env: dict) -> list:
    """Starts every command at once and waits for all: [(exit status, output)]. Outputs go
    to files, so no process stalls on a full pipe while another is waited for."""
    with tempfile.TemporaryDirectory(prefix="hopmm-reliability-out-") as logs:
        files = [open(os.path.join(logs, f"{i}.log"), "w+") for i in range(len(commands))]
        try:
            procs = [subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                      env=env) for cmd, f in zip(commands, files)]
            codes = [p.wait() for p in procs]
            outputs = []
            for f in files:
                f.seek(0)
                outputs.append(f.read())
            return list(zip(codes, outputs))
        finally:
            for f in files:
                f.close()


def driver_summary(output: str) -> dict | None:
    """The JSON summary line a driver prints last, or None."""
    for text in reversed(output.strip().splitlines()):
        if text.startswith("{"):
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


# -- warm ------------------------------------------------------------------------------------

def _compile_one(schedule_name: str, config) -> int:
    """Compiles one kernel into the cache (a pool worker); 1 if it was compiled now, 0 if it
    was cached."""
    from hopmm import compile as compiler
    from hopmm import launch
    from hopmm.schedules import ALL_SCHEDULES

    before = compiler.compile_count
    launch.compiled(ALL_SCHEDULES[schedule_name], config)
    return compiler.compile_count - before


def warm(args, results: list) -> None:
    import multiprocessing

    from hopmm.device import H100_SXM, gpu_available, query
    from hopmm.schedules import ALL_SCHEDULES

    smem = query(0).smem_per_block_optin if gpu_available() else H100_SXM.smem_per_block_optin
    jobs = [(s.name, cfg) for s in ALL_SCHEDULES.values() for cfg in s.configs(smem)]
    start = time.time()
    workers = max(1, (os.cpu_count() or 2) - 2)
    try:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            compiles = sum(pool.starmap(_compile_one, jobs, chunksize=1))
        emit(results, Result("warm", "compile every kernel", "ok",
                             f"{len(jobs)} kernels, {compiles} compiled now, the rest cached "
                             f"({workers} processes)", time.time() - start))
    except Exception as exc:
        emit(results, Result("warm", "compile every kernel", "FAIL",
                             f"{type(exc).__name__}: {exc}", time.time() - start))


# -- sanitize --------------------------------------------------------------------------------

def find_sanitizer(explicit: str | None = None) -> tuple[str | None, list]:
    """(path of compute-sanitizer or None, the places looked at)."""
    places = []
    if explicit:
        places.append(explicit)
        return (explicit if os.access(explicit, os.X_OK) else None), places
    places.append("PATH")
    found = shutil.which(SANITIZER_NAME)
    if found:
        return found, places
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    candidates = [os.path.join(r, "bin", SANITIZER_NAME) for r in roots if r]
    candidates += [os.path.join(r, "compute-sanitizer", SANITIZER_NAME) for r in roots if r]
    for site in {os.path.dirname(os.path.dirname(p)) for p in sys.path if p.endswith("packages")
                 } | {p for p in sys.path if p.endswith("packages")}:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "**", SANITIZER_NAME),
                                       recursive=True))
    for path in candidates:
        places.append(path)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, places
    return None, places


def sanitizer_command(sanitizer: str, tool: str, schedule: str, shapes) -> list:
    """The command that runs the driver on `schedule` over `shapes` under `tool`."""
    only_hopmm = ["--kernel-name", HOPMM_KERNELS] if tool in FILTERED_TOOLS else []
    # API errors are not kernel errors: CuPy and the driver probe (a cluster-capacity query
    # on a device that lacks it, a pointer attribute) and handle the failures themselves.
    return [sanitizer, "--tool", tool, "--error-exitcode", str(SANITIZER_ERROR_EXIT),
            "--report-api-errors", "no", *only_hopmm,
            "--print-limit", str(SANITIZER_PRINT_LIMIT), *driver_command(shapes, schedule)]


def sanitizer_plan(schedules, quick: bool, tools=TOOLS) -> list:
    """[(tool, schedule, [shape specs])] of every sanitizer run (one run per shape for the
    SHAPE_BY_SHAPE_TOOLS)."""
    table = QUICK_TOOL_SHAPES if quick else TOOL_SHAPES
    plan = []
    for tool in tools:
        for schedule in schedules:
            names = (WORKSPACE_INITCHECK_SHAPES
                     if tool == "initcheck" and schedule in WORKSPACE_SCHEDULES
                     else table[tool])
            shapes = (list(GEMV_SHAPES) if schedule == "gemv"
                      else [EDGE_SHAPES[s] for s in names])
            runs = [[spec] for spec in shapes] if tool in SHAPE_BY_SHAPE_TOOLS else [shapes]
            plan += [(tool, schedule, run) for run in runs]
    return plan


def products_right(output: str) -> bool:
    """Whether the driver's summary in `output` says every product was right."""
    driver = driver_summary(output)
    return driver is not None and not driver["failures"]


def known_reason(tool: str, schedule: str, rc, output: str, detail: str) -> str | None:
    """Which of initcheck's known blind spots a failed run shows and nothing else (the
    workspace's, KNOWN_BLIND_SPOT, a TMA-stored result's, KNOWN_TMA_RESULT, or gemv's discarded
    in-place bytes, KNOWN_IN_PLACE_READS); None for a real failure."""
    if known_blind_spot(tool, schedule, detail):
        return KNOWN_BLIND_SPOT
    if (tool == "initcheck" and schedule == "gemv" and rc == SANITIZER_ERROR_EXIT
            and UNINITIALISED_READ in detail and "Invalid" not in detail
            and products_right(output)):
        return KNOWN_IN_PLACE_READS
    if (rc == SANITIZER_ERROR_EXIT and reads_of_tma_results_only(tool, output)
            and products_right(output)):
        return KNOWN_TMA_RESULT
    return None


def judge_sanitizer_run(rc: int, output: str) -> tuple[str, str]:
    """(status, detail) of one sanitizer run from its exit status and output."""
    summary = next((t.strip() for t in reversed(output.splitlines())
                    if "ERROR SUMMARY" in t), None)
    driver = driver_summary(output)
    if rc == SANITIZER_ERROR_EXIT:
        first = next((t.strip() for t in output.splitlines()
                      if t.startswith(SANITIZER_PREFIX)
                      and any(word in t for word in SANITIZER_ERROR_WORDS)), "")
        return "FAIL", f"{summary or 'errors'}; {first}"[:300]
    if rc != 0 or driver is None:
        tail = " | ".join(output.strip().splitlines()[-3:])
        return "FAIL", f"exit {rc}: {tail}"[:300]
    if driver["failures"]:
        return "FAIL", f"{driver['failures']} of {driver['cases']} products wrong"
    return "ok", f"{summary or 'no errors'}; {driver['cases']} shapes correct"


def sanitize(args, results: list) -> None:
    sanitizer, places = find_sanitizer(args.sanitizer)
    if sanitizer is None:
        emit(results, Result("sanitize", SANITIZER_NAME, "skip",
                             "not found (looked on " + ", ".join(places[:6])
                             + (", ..." if len(places) > 6 else "") + "): install the CUDA "
                             "toolkit's compute-sanitizer or pass --sanitizer PATH"))
        return
    plan = sanitizer_plan(args.schedules or sanitized_schedules(), args.quick,
                          args.tools or TOOLS)

    def run(job):
        tool, schedule, shapes = job
        start = time.time()
        rc, output = None, ""
        try:
            done = subprocess.run(sanitizer_command(sanitizer, tool, schedule, shapes),
                                  capture_output=True, text=True, env=child_env(),
                                  timeout=SANITIZER_TIMEOUT_S)
            rc, output = done.returncode, done.stdout + done.stderr
            status, detail = judge_sanitizer_run(rc, output)
        except subprocess.TimeoutExpired:
            status, detail = "FAIL", f"timed out after {SANITIZER_TIMEOUT_S} s"
        known = known_reason(tool, schedule, rc, output, detail) if status == "FAIL" else None
        if known is not None:
            status, detail = "known", f"{known}; {detail}"
        # A run of one shape (SHAPE_BY_SHAPE_TOOLS) is named by it.
        name = f"{tool} {schedule}" + (f" {shapes[0]}" if len(shapes) == 1 else "")
        return Result("sanitize", name, status, f"{len(shapes)} shapes: {detail}",
                      time.time() - start)

    with ThreadPoolExecutor(SANITIZER_PARALLEL) as pool:
        for r in pool.map(run, plan):
            emit(results, r)


# -- processes -------------------------------------------------------------------------------

def verify_cache(directory: Path) -> list:
    """Problems of the cache at `directory`: entries that do not verify, files left half
    written."""
    from hopmm import compile as compiler
    from hopmm import kernel_cache

    problems = [f"{p.name} left over" for p in directory.glob("*.tmp")]
    for manifest in directory.glob("*" + kernel_cache.MANIFEST_SUFFIX):
        stem = manifest.with_name(manifest.name[:-len(kernel_cache.MANIFEST_SUFFIX)])
        try:
            kernel_cache.read_entry(stem, compiler.ENTRY_PARTS)
        except kernel_cache.DamagedEntry as exc:
            problems.append(f"{stem.name}: {exc}")
    return problems


def processes(args, results: list) -> None:
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="hopmm-reliability-") as cache:
        done = run_together([driver_command(PROCESS_SHAPES)] * PROCESSES, child_env(cache))
        summaries = [driver_summary(output) for _, output in done]
        problems = [f"process {i}: exit {rc}: {output.strip().splitlines()[-1:]}"
                    for i, ((rc, output), s) in enumerate(zip(done, summaries))
                    if rc or s is None]
        good = [s for s in summaries if s is not None]
        problems += [f"a process compiled {s['compiles']} times for {s['kernels']} kernels"
                     for s in good if s["compiles"] > s["kernels"]]
        problems += verify_cache(Path(cache))
        compiles = [s["compiles"] for s in good]
        kernels = max((s["kernels"] for s in good), default=0)
        detail = (f"{PROCESSES} processes, {kernels} kernels each, compiles per process "
                  f"{compiles} (total {sum(compiles)})")
        if not problems and sum(compiles) > kernels:
            detail += "; some kernels compiled in more than one process"
    emit(results, Result("processes", f"{PROCESSES} processes, empty cache",
                         "FAIL" if problems else "ok",
                         "; ".join(problems[:3]) or detail, time.time() - start))


# -- random calls ----------------------------------------------------------------------------

def random_case(rng: random.Random, max_dim: int = RANDOM_MAX_DIM) -> Case:
    def dim():
        return max(1, int(round(max_dim ** rng.random())))

    return Case(dim(), dim(), dim(),
                batch=rng.randint(2, 4) if rng.randrange(RANDOM_BATCH_ONE_IN) == 0 else 0,
                trans_a=rng.random() < RANDOM_TRANSPOSED_SHARE,
                trans_b=rng.random() < RANDOM_TRANSPOSED_SHARE,
                odd_pitch=rng.random() < RANDOM_ODD_PITCH_SHARE,
                dtype="float16" if rng.random() < RANDOM_FP16_SHARE else "bfloat16")


def device_operands(case: Case, generator):
    """Operands of `case` drawn by `generator` (a cupy RandomState: one per thread) on the
    current stream."""
    import cupy

    def make(rows, cols, transposed):
        lead = (case.batch,) if case.batch else ()
        stored = (cols, rows) if transposed else (rows, cols)
        pad = ODD_PITCH_PAD if case.odd_pitch else 0
        x = generator.standard_normal(lead + (stored[0], stored[1] + pad),
                                      dtype=cupy.float32).astype(case.dtype)[..., :stored[1]]
        return x.swapaxes(-1, -2) if transposed else x

    return make(case.m, case.k, case.trans_a), make(case.k, case.n, case.trans_b)


def fused_keywords(rng: random.Random, case: Case, generator) -> dict:
    """Random epilogue keywords for `case`'s product: one of SOAK_CHAINS (its activation, a
    bias of shape (N,), c of the result's shape with beta), and alpha."""
    import cupy

    def operand(shape):
        return generator.standard_normal(shape, dtype=cupy.float32).astype(case.dtype)

    out_shape = ((case.batch,) if case.batch else ()) + (case.m, case.n)
    activation, bias, c = rng.choice(SOAK_CHAINS)
    kw = {"activation": activation, "alpha": rng.choice((0.5, 1.0, 2.0))}
    if bias:
        kw["bias"] = operand((case.n,))
    if c:
        kw["c"], kw["beta"] = operand(out_shape), rng.choice((1.0, -0.5))
    return kw


def chain_spec(keywords) -> str:
    """A fused call's chain as a suffix of its case's spec ("" for a plain call)."""
    if not keywords:
        return ""
    parts = [keywords.get("activation") or "identity", f"alpha={keywords['alpha']}"]
    parts += ["bias"] * ("bias" in keywords)
    parts += [f"c beta={keywords['beta']}"] * ("c" in keywords)
    return " [" + ", ".join(parts) + "]"


def device_rel_err(got, a, b, keywords=None) -> float:
    """The relative error of `got` against the fp32 product of a and b, through the fused
    chain of `keywords` (matmul's epilogue keywords) where given."""
    import cupy

    from hopmm import epilogue

    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    if keywords:
        kw = dict(keywords)
        for name in ("bias", "c"):
            if name in kw:
                kw[name] = kw[name].astype(cupy.float32)
        ref = epilogue.reference(cupy, ref, **kw)
    if got.shape != ref.shape:
        return float("inf")
    # Against the reference as the result's dtype holds it: an element that dtype cannot hold
    # (sigmoid(-60) is 0 in float16) is its rounding, not an error of hopmm's (NOTES v0.25).
    ref = ref.astype(got.dtype).astype(cupy.float32)
    diff = got.astype(cupy.float32) - ref
    if not bool(cupy.isfinite(diff).all()):
        return float("inf")
    denom = float(cupy.linalg.norm(ref)) or 1.0
    return float(cupy.linalg.norm(diff)) / denom


def threads(args, results: list) -> None:
    import cupy

    import hopmm

    start = time.time()
    deadline = start + args.threads_s
    stats = {"calls": 0, "wrong": [], "errors": []}
    lock = threading.Lock()

    def worker(index: int):
        rng = random.Random(SEED * THREADS + index)
        with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True) as stream:
            generator = cupy.random.RandomState(SEED * THREADS + index)
            while time.time() < deadline:
                case = random_case(rng)
                try:
                    a, b = device_operands(case, generator)
                    err = device_rel_err(hopmm.matmul(a, b), a, b)
                    stream.synchronize()
                except Exception as exc:
                    with lock:
                        stats["errors"].append(f"{case.spec()}: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    stats["calls"] += 1
                    if not err < TOLERANCE[case.dtype]:
                        stats["wrong"].append(f"{case.spec()} rel err {err:.2e}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    bad = stats["wrong"] + stats["errors"]
    emit(results, Result("threads", f"{THREADS} threads, own streams",
                         "FAIL" if bad or not stats["calls"] else "ok",
                         f"{stats['calls']} calls checked in {args.threads_s:.0f} s"
                         + (f"; {len(bad)} bad, first: {bad[0]}" if bad else ""),
                         time.time() - start))


# -- autotune --------------------------------------------------------------------------------

def copy_kernels(source: Path, target: Path) -> int:
    """Copies the verified kernel entries of `source` into `target` (not its table)."""
    from hopmm import compile as compiler
    from hopmm import kernel_cache

    copied = 0
    for manifest in source.glob("*" + kernel_cache.MANIFEST_SUFFIX):
        stem = manifest.with_name(manifest.name[:-len(kernel_cache.MANIFEST_SUFFIX)])
        try:
            entry = kernel_cache.read_entry(stem, compiler.ENTRY_PARTS)
        except kernel_cache.DamagedEntry:
            continue
        if entry is not None:
            kernel_cache.write_entry(target / stem.name, entry)
            copied += 1
    return copied


def autotune(args, results: list) -> None:
    from hopmm import compile as compiler
    from hopmm import kernel_cache, tuning

    start = time.time()
    with tempfile.TemporaryDirectory(prefix="hopmm-reliability-") as cache:
        # The kernels the warm item compiled: this item is about the table, not compiling.
        copied = copy_kernels(compiler.cache_dir(), Path(cache))
        done = run_together([driver_command([AUTOTUNE_SHARED, own], autotune=True)
                             for own in AUTOTUNE_OWN], child_env(cache))
        problems = [f"process {i}: exit {rc}: {output.strip().splitlines()[-2:]}"
                    for i, (rc, output) in enumerate(done) if rc]
        table = Path(cache) / tuning.TABLE_NAME
        try:
            raw = json.loads(kernel_cache.read_trusted(table).decode())
            entries = {k: tuning.TunedEntry(**v) for k, v in raw.items()}
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"table unreadable: {exc}")
            entries = {}
        wanted = {AUTOTUNE_SHARED, *AUTOTUNE_OWN}
        found = {key.split("|")[4] for key in entries}
        if entries and found != wanted:
            problems.append(f"table holds {sorted(found)}, expected {sorted(wanted)}")
        problems += [p for p in verify_cache(Path(cache)) if "left over" in p]
    emit(results, Result("autotune", "2 processes, one table", "FAIL" if problems else "ok",
                         "; ".join(problems[:3]) or f"{len(entries)} entries intact "
                         f"({copied} cached kernels copied in)", time.time() - start))


# -- soak ------------------------------------------------------------------------------------

def host_rss_mb() -> float:
    """Resident set size now (from /proc where there is one, else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pool_used_mb() -> float:
    import cupy

    return cupy.get_default_memory_pool().used_bytes() / 2**20


def soak_kernels(smem: int) -> list:
    """(schedule, config) of every kernel the soak's calls can run: each registered config,
    and for matmul's tile schedules each with the soak's fused chains (SOAK_CHAINS) and with
    a row store where it fits."""
    from dataclasses import replace

    from hopmm.epilogue import EpilogueSpec
    from hopmm.schedules import ALL_SCHEDULES, SCHEDULES

    specs = [None] + [EpilogueSpec(*chain) for chain in SOAK_CHAINS]
    cases = []
    for name, schedule in ALL_SCHEDULES.items():
        for cfg in schedule.configs(smem):
            if name not in SCHEDULES:
                cases.append((schedule, cfg))
                continue
            for spec in specs:
                for row_store in (False, True):
                    variant = replace(cfg, epilogue=spec, row_store=row_store)
                    if not row_store or schedule.row_store_fits(variant):
                        cases.append((schedule, variant))
    return cases


def load_every_kernel() -> int:
    """Compiles (in parallel processes, into the cache) and loads on this device every kernel
    the soak can run (soak_kernels) and the row-copy kernel: the soak's memory samples then see
    no kernel's first load (a few hundred KB of host memory each, bounded by that set) and its
    calls no compile. Returns how many."""
    import cupy

    from hopmm import launch, report, row_copy
    from hopmm.device import query

    device_id = cupy.cuda.Device().id
    cases = soak_kernels(query(device_id).smem_per_block_optin)
    report.fill_cache(cases)
    for schedule, cfg in cases:
        launch._checked_kernel(schedule, cfg, device_id)
    row_copy.loaded(device_id)
    return len(cases) + 1


def soak(args, results: list) -> None:
    import cupy

    import hopmm
    from hopmm import caches
    from hopmm.schedules import SCHEDULES

    began = time.time()
    loaded = load_every_kernel()
    # Progress as it goes: a run cut short by a time limit still shows where it was.
    print(f"[soak] {loaded} kernels compiled and loaded in {time.time() - began:.0f} s; "
          f"host RSS {host_rss_mb():.0f} MB", flush=True)
    rng = random.Random(SEED)
    generator = cupy.random.RandomState(SEED)
    # Mostly the heuristic's own choice; a forced schedule for a stretch of calls at a time
    # (forcing one clears the recipes of repeat calls, which the soak must also exercise).
    schedules = [None] * SOAK_HEURISTIC_WEIGHT + sorted(SCHEDULES)
    # Most calls repeat one of a pool of shapes (the fast path); the rest are new shapes.
    repeated = [random_case(rng) for _ in range(SOAK_REPEATED_SHAPES)]
    start = time.time()
    warm_until = start + args.soak_s * SOAK_WARMUP_FRACTION
    deadline = start + args.soak_s
    calls, checked, bad, first_sample = 0, 0, [], None
    try:
        while time.time() < deadline:
            a = b = out = keywords = None   # nothing of the last call alive when sampled
            if first_sample is None and time.time() >= warm_until:
                cupy.cuda.Device().synchronize()
                first_sample = (host_rss_mb(), pool_used_mb())
                print(f"[soak] first sample after {calls} calls: host RSS "
                      f"{first_sample[0]:.0f} MB, GPU pool {first_sample[1]:.0f} MB", flush=True)
            if calls % SOAK_SCHEDULE_STRETCH == 0:
                hopmm.use_schedule(rng.choice(schedules))
            case = rng.choice(repeated) if rng.random() < SOAK_REPEAT_SHARE else random_case(rng)
            try:
                a, b = device_operands(case, generator)
                if rng.random() < SOAK_FUSED_SHARE:
                    keywords = fused_keywords(rng, case, generator)
                    out = hopmm.matmul(a, b, **keywords)
                else:
                    out = hopmm.matmul(a, b)
                if calls % SOAK_CHECK_EVERY == 0:
                    err = device_rel_err(out, a, b, keywords)
                    checked += 1
                    if not err < TOLERANCE[case.dtype]:
                        bad.append(f"{case.spec()}{chain_spec(keywords)} rel err {err:.2e}")
            except Exception as exc:
                bad.append(f"{case.spec()}: {type(exc).__name__}: {exc}")
            calls += 1
    finally:
        hopmm.use_schedule(None)
    cupy.cuda.Device().synchronize()
    last = (host_rss_mb(), pool_used_mb())
    first_sample = first_sample or last
    growth = (last[0] - first_sample[0], last[1] - first_sample[1])
    sizes, bounds = caches.sizes(), caches.bounds()
    over = [f"{name} {n} > {bounds[name]}" for name, n in sizes.items()
            if name in bounds and bounds[name] and n > bounds[name]]
    flat = growth[0] <= RSS_TOLERANCE_MB and growth[1] <= POOL_TOLERANCE_MB
    detail = (f"{calls} calls, {checked} checked, {loaded} kernels loaded first; host RSS "
              f"{first_sample[0]:.0f} -> "
              f"{last[0]:.0f} MB (tolerance +{RSS_TOLERANCE_MB}), GPU pool "
              f"{first_sample[1]:.0f} -> {last[1]:.0f} MB (tolerance +{POOL_TOLERANCE_MB}); "
              f"caches {sizes}")
    if bad:
        detail = f"{len(bad)} bad: {'; '.join(bad[:SOAK_BAD_SHOWN])}; " + detail
    emit(results, Result("soak", f"{args.soak_s:.0f} s of random calls",
                         "FAIL" if bad or over or not flat or not calls else "ok",
                         ("; ".join(over) + "; " if over else "") + detail,
                         time.time() - start))


STEPS = {"warm": warm, "sanitize": sanitize, "processes": processes, "threads": threads,
         "autotune": autotune, "soak": soak}


def main(argv=None) -> int:
    args = parse_args(argv)
    results: list = []
    for item in args.items:
        print(f"== {item}", flush=True)
        try:
            STEPS[item](args, results)
        except Exception as exc:   # one broken item must not hide the others' results
            emit(results, Result(item, "item", "FAIL", f"{type(exc).__name__}: {exc}"))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    print("\n== summary")
    print(summary_table(results))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

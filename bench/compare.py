#!/usr/bin/env python3
"""Forced hopmm kernels against cuBLAS on one shape, timed two ways: interleaved in short
timings (as bench.py's main columns) and each alone for a sustained run (as its sust/best);
and, with --bursts, a third: short bursts after the GPU has idled.

    python bench/compare.py 6144x6144x6144 hopmm persistent/128x256/16 persistent_overlap/128x192/4
                            [--dtype bf16] [--rounds 24] [--sustained-seconds 0.6] [--bursts 12]

A kernel is schedule/BMxBN/group: a schedule of hopmm.schedules.SCHEDULES, one of its tiles
and the raster group (M-tiles per group); `hopmm` is hopmm.matmul's own choice. Each forced
kernel runs at the deepest stage count that fits. Every kernel is checked against
cupy.matmul into a NaN-poisoned result first, and is then timed beside cupy.matmul and
torch.matmul (where torch imports) on rotating input sets larger than the L2. At the power
limit the timings differ (bench/NOTES.md v0.14); the table shows each relative to the
faster cuBLAS of the same timing.

A burst is BURST_S of back-to-back calls, timed after BURST_WARM_S of untimed ones, each
contestant's after the GPU has idled for --burst-idle seconds (rounds in random orders): the
regime of work that comes in bursts. NVML reads the top clock and no limiter in the middle
of such bursts, yet a faster limit on power still acts there: on an H100 the same calls ran
10-15 % faster on inputs of zeros than on normal ones (bench/NOTES.md v0.16).

During the runs alone NVML is read every POWER_READING_S: the medians of the power draw and
SM clock, the energy per call from NVML's energy counter (GFLOP/J), and the share of the
readings at which each clock limiter (power cap, thermal, power brake...) was active. Where
the power cap holds the clock, a kernel's rate alone is its work per joule. The counter is
too coarse to rank kernels by (cupy.matmul and torch.matmul, one kernel, read up to 10 %
apart over 1 s, bench/NOTES.md v0.15): the rates are the measure, GFLOP/J a cross-check.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
from bench import (CUBLAS_CONTESTANTS, CUPY_DTYPE_NAMES, DTYPE_ALIASES, ELEMENT_BYTES,  # noqa: E402
                   NVML_CLOCK_LIMITERS, REL_ERR_LIMITS)

DEFAULT_ROUNDS = 24           # interleaved rounds, each contestant ~20 ms
DEFAULT_SUSTAINED_S = 0.6     # seconds alone per sustained round
WARMUP_S = 5.0                # heat-up before timing: the power limit is the regime measured
POWER_READING_S = 0.02        # launches enqueued between two NVML readings during a run alone
BURST_S = 0.01                # timed calls of one burst
BURST_WARM_S = 0.002          # untimed calls before them, while the clock comes up from idle
DEFAULT_BURST_IDLE_S = 0.5    # the GPU idles this long before each burst
DEFAULT_PATH = "hopmm"        # as a kernel: hopmm.matmul's own choice (autotune table or heuristic)


# The kernels read A and B in place and store C in place, which TMA allows where every row
# starts on a 16-byte boundary (hopmm.matmul copies other operands first).
ROW_ALIGN_BYTES = 16


def parse_shape(text: str) -> tuple[int, int, int]:
    """bench.parse_shape, where K and N give rows of whole 16-byte units."""
    m, n, k = bench.parse_shape(text)
    if (k * ELEMENT_BYTES) % ROW_ALIGN_BYTES or (n * ELEMENT_BYTES) % ROW_ALIGN_BYTES:
        raise ValueError(f"shape {text!r}: K and N must be multiples of "
                         f"{ROW_ALIGN_BYTES // ELEMENT_BYTES}, so the kernels read A and B "
                         f"and store C in place")
    return m, n, k


class KernelSpec(NamedTuple):
    schedule: str
    tile: tuple[int, int]
    group: int

    @property
    def label(self) -> str:
        return f"{self.schedule}/{self.tile[0]}x{self.tile[1]}/{self.group}"


def parse_kernel(text: str) -> KernelSpec | str:
    """schedule/BMxBN/group, checked against the schedule's tiles, or DEFAULT_PATH."""
    from hopmm.heuristics import SPLIT_K_SCHEDULES
    from hopmm.schedules import SCHEDULES

    if text.strip() == DEFAULT_PATH:
        return DEFAULT_PATH
    split_k_names = {s.name for s in SPLIT_K_SCHEDULES}
    parts = text.strip().split("/")
    if len(parts) != 3:
        raise ValueError(f"kernel {text!r}: expected schedule/BMxBN/group, e.g. "
                         f"persistent/128x256/16")
    name, tile_text, group_text = parts
    if name not in SCHEDULES:
        raise ValueError(f"kernel {text!r}: unknown schedule {name!r}; known: {sorted(SCHEDULES)}")
    try:
        tile = tuple(int(x) for x in tile_text.lower().split("x"))
        group = int(group_text)
    except ValueError:
        raise ValueError(f"kernel {text!r}: the tile is BMxBN and the group an integer") from None
    if name in split_k_names:
        raise ValueError(f"kernel {text!r}: split-K schedules also need a split count; "
                         f"bench.py and hopmm.autotune time them")
    shapes = SCHEDULES[name].tile_shapes()
    if tile not in shapes:
        raise ValueError(f"kernel {text!r}: {name} computes tiles "
                         f"{', '.join(f'{m}x{n}' for m, n in shapes)}")
    if group < 1:
        raise ValueError(f"kernel {text!r}: the raster group is at least 1")
    return KernelSpec(name, tile, group)


def ratios(seconds: dict) -> dict:
    """{name: the faster cuBLAS's seconds / name's} (> 1: faster than cuBLAS)."""
    best = min(seconds[c] for c in CUBLAS_CONTESTANTS if c in seconds)
    return {name: best / t for name, t in seconds.items()}


class AloneRun(NamedTuple):
    """One contestant alone for a sustained run."""
    seconds: float          # per call
    joules: float | None    # per call, from NVML's energy counter
    readings: list          # NVML readings taken while it ran (sm_mhz, power_w, limiters)


def limiter_shares(readings: list) -> dict:
    """{limiter name: share of the readings at which it held the clock}, named limiters only."""
    masks = [r["limiters"] for r in readings if r.get("limiters") is not None]
    if not masks:
        return {}
    return {name: sum(1 for m in masks if m & bit) / len(masks)
            for bit, name in NVML_CLOCK_LIMITERS.items() if any(m & bit for m in masks)}


def summarize_alone(runs: list, flops: float | None = None) -> dict:
    """Medians over a contestant's runs alone: seconds per call, W, MHz, GFLOP/J (given the
    flops of a call and runs with energy readings), and the share of readings each limiter
    was active."""
    readings = [r for run in runs for r in run.readings]

    def median_of(key):
        values = [r[key] for r in readings if r.get(key) is not None]
        return statistics.median(values) if values else None

    joules = [run.joules for run in runs if run.joules]
    return {"seconds": statistics.median(run.seconds for run in runs),
            "power_w": median_of("power_w"), "sm_mhz": median_of("sm_mhz"),
            "gflop_per_j": flops / statistics.median(joules) * 1e-9 if joules and flops else None,
            "limiters": limiter_shares(readings)}


def _limiters_cell(shares: dict) -> str:
    """'power cap 100%' or '-'."""
    return ", ".join(f"{name} {share:.0%}" for name, share in shares.items()) or "-"


def format_table(title: str, interleaved: dict, alone: dict) -> str:
    """Seconds per call of each contestant, both ways, with their ratios to cuBLAS, and what
    NVML read during its runs alone (`alone`: summarize_alone's dicts)."""
    head = (f"{'contestant':<36}{'us':>9}{'x best':>8}{'alone us':>10}{'x best':>8}"
            f"{'W':>6}{'MHz':>6}{'GFLOP/J':>9}  clock limited by")
    lines = [title, head, "-" * len(head)]
    r_il = ratios(interleaved)
    r_alone = ratios({name: a["seconds"] for name, a in alone.items()})
    for name in interleaved:
        a = alone[name]
        lines.append(f"{name:<36}{interleaved[name] * 1e6:>9.1f}{r_il[name]:>8.3f}"
                     f"{a['seconds'] * 1e6:>10.1f}{r_alone[name]:>8.3f}"
                     f"{bench._fmt(a['power_w'], '.0f'):>6}{bench._fmt(a['sm_mhz'], '.0f'):>6}"
                     f"{bench._fmt(a['gflop_per_j'], '.0f'):>9}  {_limiters_cell(a['limiters'])}")
    return "\n".join(lines)


def kernel_contestant(spec: KernelSpec, sets, device):
    """A launcher of the forced kernel over the input sets (A, B, C)."""
    from hopmm import launch, layout, operands
    from hopmm.heuristics import Choice
    from hopmm.schedules import SCHEDULES

    a, b, c = sets[0]
    # the operands as the tile kernels read them (aligned copies where TMA cannot)
    call = operands.kernel_operands(a, b, layout.matmul_shapes(a.shape, b.shape))
    sched, p = SCHEDULES[spec.schedule], call.problem
    cfg = sched.deepest(p.dtype, spec.tile[1], p.trans_a, p.trans_b,
                        device.smem_per_block_optin, spec.tile[0])
    if cfg is None:
        raise ValueError(f"{spec.label}: no stage count fits {device.smem_per_block_optin} B")
    choice = Choice(sched, cfg, "forced by bench/compare.py", spec.group)
    launches = launch.build_launches(choice, p, call.a3, call.a_map, call.b3, call.b_map,
                                     c.reshape((1,) + c.shape))

    def run(a, b, c):
        launch.launch_all(launches, a.data.ptr, b.data.ptr, c.data.ptr)

    return run


def default_contestant():
    """hopmm.matmul, as a user calls it."""
    import hopmm

    def run(a, b, c):
        hopmm.matmul(a, b, out=c)

    return run


def relative_error(run, sets) -> float:
    """run's result on the first input set, written over a NaN-poisoned C, against
    cupy.matmul in fp32 (NaN where a tile was not written)."""
    import cupy

    a, b, c = sets[0]
    c[...] = bench.poisoned(cupy, c.shape, c.dtype)
    run(a, b, c)
    return bench.rel_error(cupy, c, cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32)))


def run_alone(fn, inputs, launches: int, chunk: int, gpu, first: int = 0) -> AloneRun:
    """`launches` back-to-back calls timed by CUDA events, cycling through `inputs` from index
    `first`. Where `gpu` is not None, NVML is read after every `chunk` calls, once the GPU has
    run the chunk before: one chunk stays queued, so the GPU never idles, and the readings
    follow its progress."""
    import cupy

    energy0 = gpu.energy_j() if gpu else None
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    readings, previous = [], None
    start.record()
    for i in range(launches):
        fn(*inputs[(first + i) % len(inputs)])
        if gpu and (i + 1) % chunk == 0:
            done = cupy.cuda.Event()
            done.record()
            if previous is not None:
                previous.synchronize()
                readings.append({**gpu.read(), "limiters": gpu.clock_limiters()})
            previous = done
    stop.record()
    stop.synchronize()
    energy1 = gpu.energy_j() if gpu else None
    seconds = cupy.cuda.get_elapsed_time(start, stop) / 1e3 / launches
    joules = (energy1 - energy0) / launches if energy0 is not None and energy1 is not None else None
    return AloneRun(seconds, joules, readings)


def run_burst(fn, inputs, warm: int, launches: int, idle_s: float, gpu) -> AloneRun:
    """After `idle_s` of an idle GPU, `warm` untimed calls, then run_alone's `launches` timed
    calls, the input sets' rotation going on; NVML is read once, when the GPU has run about
    half of them (the rest already queued, so it does not idle)."""
    time.sleep(idle_s)
    for i in range(warm):
        fn(*inputs[i % len(inputs)])
    return run_alone(fn, inputs, launches, max(1, launches // 2), gpu, first=warm)


def burst_summaries(contestants: dict, inputs, per_call: dict, idle_s: float, gpu,
                    rounds: int) -> dict:
    """{name: summarize_alone(...)} over `rounds` bursts of each contestant, every round in a
    new random order (hopmm.timing.round_orders)."""
    from hopmm.timing import round_orders

    runs = {name: [] for name in contestants}
    for order in round_orders(list(contestants), rounds):
        for name in order:
            warm = max(1, round(BURST_WARM_S / per_call[name]))
            launches = max(len(inputs), round(BURST_S / per_call[name]))
            runs[name].append(run_burst(contestants[name], inputs, warm, launches, idle_s, gpu))
    return {name: summarize_alone(rs) for name, rs in runs.items()}


def format_bursts(title: str, bursts: dict) -> str:
    """Seconds per call of each contestant in bursts, its ratio to cuBLAS, and the NVML reading
    in the bursts' middle (`bursts`: burst_summaries' dicts)."""
    head = f"{'contestant':<36}{'us':>9}{'x best':>8}{'W':>6}{'MHz':>6}  clock limited by"
    lines = [title, head, "-" * len(head)]
    r = ratios({name: b["seconds"] for name, b in bursts.items()})
    for name, b in bursts.items():
        lines.append(f"{name:<36}{b['seconds'] * 1e6:>9.1f}{r[name]:>8.3f}"
                     f"{bench._fmt(b['power_w'], '.0f'):>6}{bench._fmt(b['sm_mhz'], '.0f'):>6}"
                     f"  {_limiters_cell(b['limiters'])}")
    return "\n".join(lines)


def alone_summaries(contestants: dict, inputs, per_call: dict, seconds: float, gpu,
                    flops: float, rounds: int) -> dict:
    """{name: summarize_alone(...)}: each contestant alone for about `seconds` per round, the
    rounds rotated (hopmm.timing.sustained_runs)."""
    from hopmm.timing import sustained_runs

    def run(name, launches):
        chunk = max(1, round(POWER_READING_S / per_call[name]))
        return run_alone(contestants[name], inputs, launches, chunk, gpu)

    runs = sustained_runs({name: per_call[name] for name in contestants}, seconds, rounds, run,
                          min_launches=len(inputs))
    return {name: summarize_alone(rs, flops) for name, rs in runs.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", type=bench.arg_type(parse_shape),
                   help="MxNxK (A is MxK, B is KxN, row-major)")
    p.add_argument("kernels", nargs="+", type=bench.arg_type(parse_kernel),
                   help="schedule/BMxBN/group")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_ALIASES))
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--sustained-seconds", type=float, default=DEFAULT_SUSTAINED_S)
    p.add_argument("--bursts", type=int, default=0,
                   help="bursts per contestant after the GPU idles (0: none)")
    p.add_argument("--burst-idle", type=float, default=DEFAULT_BURST_IDLE_S,
                   help="seconds the GPU idles before each burst")
    args = p.parse_args(argv)
    if args.bursts < 0 or args.burst_idle < 0:
        p.error("--bursts and --burst-idle are at least 0")

    from hopmm.device import query
    from hopmm.timing import SUSTAINED_ROUNDS, interleaved_medians

    dtype = DTYPE_ALIASES[args.dtype]
    ctx = bench.Context(use_torch=True)
    ctx.cupy.random.seed(bench.SEED)
    m, n, k = args.shape
    sets = bench.make_inputs(ctx, m, n, k, dtype)
    contestants = {"cupy": lambda a, b, c: ctx.cupy.matmul(a, b, out=c)}
    if ctx.torch is not None:
        views = {id(x): bench.to_torch(ctx.torch, x) for s in sets for x in s}
        contestants["torch"] = lambda a, b, c: ctx.torch.matmul(views[id(a)], views[id(b)],
                                                                out=views[id(c)])
    device = query(ctx.cupy.cuda.Device().id)
    failed = []
    for spec in args.kernels:
        if spec == DEFAULT_PATH:
            label, run = DEFAULT_PATH, default_contestant()
        else:
            label, run = spec.label, kernel_contestant(spec, sets, device)
        err = relative_error(run, sets)
        if not err <= REL_ERR_LIMITS[dtype]:  # NaN too: an unwritten tile
            failed.append(f"{label}: rel err {err:.2e}")
            continue
        contestants[label] = run
    interleaved = interleaved_medians(contestants, sets, args.rounds, WARMUP_S)
    alone = alone_summaries(contestants, sets, interleaved, args.sustained_seconds,
                            ctx.gpu_state, 2.0 * m * n * k, SUSTAINED_ROUNDS)
    title = (f"=== {m}x{n}x{k} {CUPY_DTYPE_NAMES[dtype]}: {args.rounds} interleaved rounds, "
             f"then each alone for {args.sustained_seconds} s x {SUSTAINED_ROUNDS} rotated "
             f"rounds")
    print(format_table(title, interleaved, alone))
    if args.bursts > 0:
        bursts = burst_summaries(contestants, sets, interleaved, args.burst_idle,
                                 ctx.gpu_state, args.bursts)
        print(format_bursts(f"--- {args.bursts} bursts of {BURST_S * 1e3:g} ms each (after "
                            f"{BURST_WARM_S * 1e3:g} ms untimed), the GPU idle "
                            f"{args.burst_idle} s before each, random orders", bursts))
    if ctx.gpu_state_note:
        print(f"note: NVML not read: {ctx.gpu_state_note}")
    for line in failed:
        print(f"WRONG, not timed: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Times every autotune candidate (schedule x tile width x raster group, and the heuristic's
own choice) on each shape and prints them side by side: the data the heuristic's choices
are checked against.

    python bench/autotune_table.py [--shapes 3000x3000x3000,...] [--dtype bf16]
    python bench/autotune_table.py --from-sweep SWEEP.json [--below 0.97] [--budget-s T]

With --from-sweep, the shapes are those of a bench/sweep.py result that ran on hopmm's
kernels at less than --below x the best cuBLAS, each in its own dtype (row-major operands,
as the sweep draws them); each line then also names the heuristic's pick (hopmm.explain's
choice for the shape, untuned) and its speed as a fraction of the fastest candidate's: where
that fraction is near 1 the choice is right and the kernels are what is slow.

The winners are also stored in the autotune table of HOPMM_CACHE_DIR, as hopmm.autotune does.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import CUPY_DTYPE_NAMES, DTYPE_ALIASES, parse_shapes  # noqa: E402

DEFAULT_SHAPES = ("3000x3000x3000,2048x2048x2048,4096x4096x4096,8192x8192x8192,"
                  "8192x8192x1024,4096x14336x4096")
DEFAULT_BELOW = 0.97
TOP = 4   # candidates printed per shape in the --from-sweep lines


def sweep_shapes(rows: list, below: float) -> list[tuple[tuple[int, int, int], str, float]]:
    """((m, n, k), dtype alias, the best cuBLAS TFLOP/s the sweep measured) of a sweep's rows
    that ran on hopmm's kernels, with rows whose pitches TMA reads in place (no aligned copies:
    autotune times aligned operands), at less than `below` x the best cuBLAS; slowest first."""
    picked = [r for r in rows
              if r.get("ok") and r.get("rows_aligned")
              and (r.get("plan") or {}).get("path") == "kernel"
              and r.get("hopmm_vs_best", below) < below]
    picked.sort(key=lambda r: r["hopmm_vs_best"])
    return [((r["m"], r["n"], r["k"]), DTYPE_ALIASES[r["dtype"]], best_cublas_tflops(r))
            for r in picked]


def best_cublas_tflops(row: dict) -> float:
    """The faster of cupy.matmul and torch.matmul in a sweep row, in TFLOP/s."""
    return max(v for name, v in row["tflops"].items() if name != "hopmm" and v)


def pick_line(shape: tuple, dtype: str, pick: str, tflops: dict, cublas: float) -> str:
    """One shape's line: the heuristic's pick against the fastest candidate, the fastest
    against the sweep's best cuBLAS, and the top."""
    m, n, k = shape
    best = max(tflops, key=tflops.get)
    got = tflops.get(pick)
    share = "untimed" if got is None else f"{got / tflops[best]:.3f} of the best"
    top = sorted(tflops.items(), key=lambda kv: -kv[1])[:TOP]
    return (f"{m}x{n}x{k} {dtype}: pick {pick} "
            f"{'-' if got is None else f'{got:.1f}'} TFLOP/s, {share}; best {best} "
            f"{tflops[best]:.1f} ({tflops[best] / cublas:.2f} x the sweep's cuBLAS {cublas:.1f}); "
            f"top " + "; ".join(f"{name} {tf:.1f}" for name, tf in top))


def row_major_problem(shape: tuple, dtype_name: str):
    """The Problem hopmm's kernels see for row-major operands of `shape` (as autotune and the
    sweep make them)."""
    import cupy

    from hopmm import layout, operands

    m, n, k = shape
    a = cupy.empty((m, k), dtype=dtype_name)
    b = cupy.empty((k, n), dtype=dtype_name)
    return operands.kernel_operands(a, b, layout.matmul_shapes(a.shape, b.shape)).problem


def heuristic_label(shape: tuple, dtype_name: str) -> str:
    """tuning.label of the heuristic's choice for row-major operands of `shape`."""
    import cupy

    from hopmm import heuristics, tuning
    from hopmm.device import query

    problem = row_major_problem(shape, dtype_name)
    return tuning.label(heuristics.choose(problem, query(cupy.cuda.Device().id)))


def precompile(shapes: list) -> None:
    """Compiles every autotune candidate of `shapes` into the kernel cache, one process per CPU
    (autotune itself compiles one kernel at a time, which on an empty cache takes longer than
    the timings)."""
    import cupy

    from hopmm import report, tuning
    from hopmm.device import query

    device = query(cupy.cuda.Device().id)
    cases = set()
    for shape, dtype, _ in shapes:
        problem = row_major_problem(shape, CUPY_DTYPE_NAMES[dtype])
        cases.update((c.schedule, c.config) for c in tuning.candidates(problem, device)
                     if not getattr(c.schedule, "streaming", False))
    began = time.time()
    report.fill_cache(sorted(cases, key=lambda case: (case[0].name, case[1].tag)))
    print(f"{len(cases)} candidate kernels compiled in {time.time() - began:.0f} s", flush=True)


def from_sweep(args) -> int:
    import hopmm

    rows = json.loads(Path(args.from_sweep).read_text())["rows"]
    shapes = sweep_shapes(rows, args.below)
    print(f"=== {len(shapes)} shapes of {args.from_sweep} below {args.below} x best cuBLAS: "
          f"every candidate timed alone on aligned operands (TFLOP/s, median of {args.rounds} "
          f"interleaved rounds)")
    precompile(shapes)
    out, start = [], time.time()
    for shape, dtype, cublas in shapes:
        if args.budget_s and time.time() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(shapes) - len(out)} shapes left")
            break
        name = CUPY_DTYPE_NAMES[dtype]
        pick = heuristic_label(shape, name)
        (row,) = hopmm.autotune([shape], name, warmup_s=0.05, rounds=args.rounds,
                                input_sets=2, progress=io.StringIO())
        print(pick_line(shape, dtype, pick, row["tflops"], cublas), flush=True)
        out.append(dict(shape=list(shape), dtype=dtype, pick=pick, tflops=row["tflops"],
                        cublas_tflops=cublas))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_ALIASES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--from-sweep", default=None, metavar="JSON",
                   help="time the slow kernel-path shapes of this bench/sweep.py result")
    p.add_argument("--below", type=float, default=DEFAULT_BELOW,
                   help=f"with --from-sweep: hopmm / best cuBLAS under this (default "
                        f"{DEFAULT_BELOW})")
    p.add_argument("--budget-s", type=float, default=None,
                   help="with --from-sweep: start no shape after this many seconds")
    p.add_argument("--json", default=None, help="with --from-sweep: also write the timings")
    args = p.parse_args(argv)
    if args.from_sweep:
        return from_sweep(args)

    import hopmm

    dtype = CUPY_DTYPE_NAMES[DTYPE_ALIASES[args.dtype]]
    rows = hopmm.autotune(parse_shapes(args.shapes), dtype, rounds=args.rounds)
    print(f"=== autotune candidates, {dtype}, TFLOP/s (median of {args.rounds} interleaved rounds)")
    for row in rows:
        m, n, k = row["shape"]
        ranked = sorted(row["tflops"].items(), key=lambda kv: -kv[1])
        print(f"{m}x{n}x{k}: " + "; ".join(f"{name} {tf:.0f}" for name, tf in ranked))
        alone = sorted(row.get("sustained_tflops", {}).items(), key=lambda kv: -kv[1])
        if alone:  # the finalists, each alone for a sustained run: the winner is the first
            print("  alone: " + "; ".join(f"{name} {tf:.0f}" for name, tf in alone))
    return 0


if __name__ == "__main__":
    sys.exit(main())

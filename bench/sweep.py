#!/usr/bin/env python3
"""Sweep hopmm.matmul against cuBLAS over shapes drawn from a seeded generator.

    python bench/sweep.py [--seed S] [--count N] [--start I] [--dtypes bf16,fp16]
                          [--max-gflop G] [--budget-s T] [--warmup-s W] [--rounds R]
                          [--out DIR] [--no-torch]
    python bench/sweep.py --dry-run [--seed S] [--count N] ...   # the shapes only, no GPU
    python bench/sweep.py --from-json a.json [b.json ...] [--out DIR]  # re-print, re-chart

Shapes (bench/sweep_shapes.py): M, N and K log-uniform, each shape at least 2 GFLOP and at
most --max-gflop; even indices rounded to multiples of 64; the dtype cycles every two
indices.  Shape i depends on the seed and i only, so a sweep may be split into slices
(--start/--count, e.g. 0/100 and 100/100 under a per-command time limit) and the slices
merged with --from-json.  Each shape gets a class (decode, short_k, few_tiles, narrow_n,
odd, large, other: the first that fits) and a floor: max(2MNK / 800 TFLOP/s, bytes of A, B
and C / 3.0 TB/s).

Timing is bench/bench.py's (its run_shape): hopmm.matmul is checked against cupy.matmul
first (that first call compiles any kernel not cached yet: its wall clock is recorded apart
as first_call_s, and the warm-up keeps it out of every timing); then hopmm.matmul,
cupy.matmul and torch.matmul (where torch has CUDA; on the same memory through DLPack) run
interleaved round by round in every order, on rotating input sets larger than twice the L2,
each timing ~30 ms of back-to-back launches between CUDA events; medians over the rounds.
The first shape warms the GPU up for a few seconds, later ones briefly: the sweep keeps it
busy.  hopmm.explain gives each shape's path and schedule.

--budget-s stops before a shape that would likely end past the budget (the longest shape so
far as the estimate); the results are written after every shape, so a killed run keeps them.

Output in --out (default bench/results): sweep-<date>-<device>-seed<S>-<first>-<last>.json
and .png (two panels against problem size, per class: hopmm / best cuBLAS and hopmm's
fraction of the floor).  Printed: a line per shape as it runs, the table of shapes, then the
summary LAST: per class and per size (count, geomean and min of hopmm / best cuBLAS,
geomean fraction of the floor), the targets, the shapes routed to cupy.matmul, the shapes
slower than 0.97 x cuBLAS and any that failed.  Exit status 1 when a shape failed its check.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import sweep_report  # noqa: E402
import sweep_shapes  # noqa: E402
from sweep_shapes import Shape  # noqa: E402

DEFAULT_SEED = 1
DEFAULT_COUNT = 200
DEFAULT_OUT = bench.DEFAULT_OUT
# Per shape: a short warm-up (the sweep keeps the GPU busy; the first shape warms up longer
# so the clocks settle under load) and one round in each of the 3! orders of the contestants.
# 200 shapes then take about 4-5 minutes on an H100 with every kernel cached.
WARMUP_S = 0.25
FIRST_WARMUP_S = 3.0
ROUNDS = 6
SCRIPT = "bench/sweep.py"


# ------------------------------------------------------------------ arguments
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Sweep hopmm.matmul against cuBLAS over drawn shapes.")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"generator seed (default {DEFAULT_SEED})")
    p.add_argument("--count", type=int, default=DEFAULT_COUNT,
                   help=f"shapes to run (default {DEFAULT_COUNT})")
    p.add_argument("--start", type=int, default=0, help="index of the first shape (default 0)")
    p.add_argument("--dtypes", type=bench.arg_type(bench.parse_dtypes),
                   default=bench.parse_dtypes(bench.DEFAULT_DTYPES),
                   help="comma-separated, cycled over the shapes: bf16, fp16 (default both)")
    p.add_argument("--max-gflop", type=float, default=sweep_shapes.DEFAULT_MAX_GFLOP,
                   help=f"largest problem drawn, in GFLOP (default {sweep_shapes.DEFAULT_MAX_GFLOP:g})")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop before a shape that would end past this many seconds (default: none)")
    p.add_argument("--warmup-s", type=float, default=WARMUP_S,
                   help=f"warm-up seconds per shape (default {WARMUP_S}; the first shape "
                        f"{FIRST_WARMUP_S})")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed rounds per shape (default {ROUNDS})")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out even if it imports")
    p.add_argument("--dry-run", action="store_true",
                   help="draw and classify the shapes and print them; no GPU needed")
    p.add_argument("--from-json", nargs="+", type=Path, metavar="JSON",
                   help="re-print and re-chart saved sweep results (merged, by seed and index)")
    args = p.parse_args(argv)
    if args.count < 1 or args.start < 0:
        p.error("--count must be >= 1 and --start >= 0")
    if args.rounds < 1 or args.warmup_s < 0:
        p.error("--rounds must be >= 1 and --warmup-s >= 0")
    if args.budget_s is not None and args.budget_s <= 0:
        p.error("--budget-s must be positive")
    if args.max_gflop < 2 * sweep_shapes.MIN_GFLOP:
        p.error(f"--max-gflop must be at least {2 * sweep_shapes.MIN_GFLOP:g} "
                f"(shapes are at least {sweep_shapes.MIN_GFLOP:g} GFLOP)")
    if args.from_json and args.dry_run:
        p.error("--from-json and --dry-run do not go together")
    return args


# ------------------------------------------------------------------ rows
def shape_fields(shape: Shape, seed: int, row: dict) -> dict:
    """What the sweep adds to bench.run_shape's row: where the shape comes from, its class,
    its floor and each contestant's fraction of it, and hopmm's plan."""
    return {"seed": seed, "index": shape.index, "class": shape.shape_class,
            "rounded": shape.rounded,
            "rows_aligned": sweep_shapes.rows_aligned(shape.n, shape.k),
            "gflop": shape.flops / 1e9, "floor_us": shape.floor_s * 1e6,
            "floor_fraction": sweep_report.floor_fractions(row.get("median_us"), shape.floor_s),
            "plan": sweep_report.parse_explain(row.get("explain"))}


def format_dry_run(shapes: list[Shape]) -> str:
    header = ("#", "shape", "dtype", "class", "GFLOP", "floor us", "bound by", "rounded",
              "rows 16 B")
    body = []
    for s in shapes:
        compute_s = s.flops / (sweep_shapes.FLOOR_TFLOPS * 1e12)
        body.append((str(s.index), s.label, s.dtype, s.shape_class, f"{s.flops / 1e9:.1f}",
                     f"{s.floor_s * 1e6:.1f}", "flops" if compute_s >= s.floor_s else "bytes",
                     "yes" if s.rounded else "no",
                     "yes" if sweep_shapes.rows_aligned(s.n, s.k) else "no"))
    counts = {c: sum(s.shape_class == c for s in shapes) for c in sweep_shapes.CLASSES}
    lines = sweep_report.align_table(header, body, left=4)
    lines += ["", "classes: " + ", ".join(f"{c} {n}" for c, n in counts.items())]
    return "\n".join(lines)


# ------------------------------------------------------------------ modes
def from_json(args) -> int:
    loaded = [bench.load_json(path) for path in args.from_json]
    meta, rows = sweep_report.merge_results(loaded)
    out = Path(args.out)
    if len(args.from_json) > 1:
        stem = out / f"{args.from_json[0].stem}-merged"
        print(f"wrote {bench.write_json(stem.with_suffix('.json'), meta, rows)}")
    else:
        stem = out / args.from_json[0].stem
    png = sweep_report.draw_chart(rows, stem.with_suffix(".png"), _chart_title(meta, rows))
    if png:
        print(f"wrote {png}")
    print(sweep_report.format_shape_table(rows))
    print(sweep_report.format_summary(rows, sweep_report.describe(rows)), flush=True)
    return 0


def _chart_title(meta: dict, rows: list[dict]) -> str:
    parts = [meta.get("device") or "", (meta.get("date") or "")[:10], sweep_report.describe(rows)]
    return "hopmm sweep  " + "  ".join(p for p in parts if p)


def _progress(row: dict, done: int, total: int, seconds: float) -> str:
    ratio, floor = row.get("hopmm_vs_best"), (row.get("floor_fraction") or {}).get("hopmm")
    status = "ok" if row["ok"] else row["error"]
    return (f"[sweep {done}/{total}] #{row['index']} {row['shape']} {row['dtype']} {row['class']}: "
            f"hopmm/best {sweep_report.fmt(ratio, '.3f')}, floor {sweep_report.fmt(floor, '.2f')}, "
            f"{sweep_report.schedule_cell(row)}; {status} ({seconds:.1f} s)")


def run_sweep(args, argv) -> int:
    started = time.perf_counter()
    shapes = sweep_shapes.draw_shapes(args.seed, args.start, args.count, args.dtypes, args.max_gflop)
    ctx = bench.Context(use_torch=not args.no_torch)
    ctx.cupy.random.seed(bench.SEED)
    meta = bench.device_metadata(ctx, bench.command_line(sys.argv[1:] if argv is None else argv,
                                                         SCRIPT))
    meta["sweep"] = {"seed": args.seed, "start": args.start, "count": args.count,
                     "dtypes": args.dtypes, "max_gflop": args.max_gflop,
                     "budget_s": args.budget_s, "warmup_s": args.warmup_s,
                     "first_warmup_s": FIRST_WARMUP_S, "rounds": args.rounds,
                     "target_timing_s": bench.TARGET_TIMING_S,
                     "floor": {"tflops": sweep_shapes.FLOOR_TFLOPS, "tbps": sweep_shapes.FLOOR_TBPS},
                     "classes": sweep_shapes.CLASSES}
    if ctx.torch_note:
        print(f"note: torch contestant skipped: {ctx.torch_note}")
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M%S")
    last = args.start + args.count - 1
    stem = (Path(args.out) / f"sweep-{stamp}-{bench.device_slug(meta['device'])}"
                             f"-seed{args.seed}-{args.start}-{last}")
    json_path = stem.with_suffix(".json")

    rows, longest = [], 0.0
    for shape in shapes:
        elapsed = time.perf_counter() - started
        if args.budget_s is not None and elapsed + longest > args.budget_s:
            meta["stopped_early"] = {"before_index": shape.index, "elapsed_s": elapsed,
                                     "budget_s": args.budget_s}
            print(f"note: budget of {args.budget_s:g} s: stopped after {len(rows)} of "
                  f"{len(shapes)} shapes ({elapsed:.0f} s); go on with --start {shape.index}")
            break
        t0 = time.perf_counter()
        warmup = FIRST_WARMUP_S if not rows else args.warmup_s
        dims = (shape.m, shape.n, shape.k)
        try:
            row = bench.run_shape(ctx, dims, shape.dtype, warmup, args.rounds, host_costs=False)
        except Exception as e:  # e.g. out of memory: record it, go on, fail at the end
            row = bench.error_row(dims, shape.dtype, f"{type(e).__name__}: {e}")
        ctx.cupy.get_default_memory_pool().free_all_blocks()
        row.update(shape_fields(shape, args.seed, row))
        row["seconds"] = time.perf_counter() - t0
        longest = max(longest, row["seconds"])
        rows.append(row)
        print(_progress(row, len(rows), len(shapes), row["seconds"]), flush=True)
        bench.write_json(json_path, meta, rows)  # after every shape: a killed run keeps its results

    meta["elapsed_s"] = time.perf_counter() - started
    print(f"wrote {bench.write_json(json_path, meta, rows)}")
    png = sweep_report.draw_chart(rows, stem.with_suffix(".png"), _chart_title(meta, rows))
    if png:
        print(f"wrote {png}")
    print(sweep_report.format_shape_table(rows))
    header = sweep_report.describe(rows)
    if "stopped_early" in meta:
        header += f" (budget: stopped before #{meta['stopped_early']['before_index']})"
    print(sweep_report.format_summary(rows, header), flush=True)
    return 1 if any(not r["ok"] for r in rows) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return from_json(args)
    if args.dry_run:
        shapes = sweep_shapes.draw_shapes(args.seed, args.start, args.count, args.dtypes,
                                          args.max_gflop)
        print(format_dry_run(shapes))
        return 0
    return run_sweep(args, argv)


if __name__ == "__main__":
    sys.exit(main())

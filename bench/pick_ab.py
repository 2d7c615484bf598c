#!/usr/bin/env python3
"""A heuristic change, measured against the rule it replaces: which sweep shapes it moves, and
each moved shape's new pick timed against its old one.

    python bench/pick_ab.py --seeds 11,13,17 --old "ONE_ROUND_SHORT_MAX_K_BLOCKS=0" --list \\
        [--dram-tbps 4.81]
    python bench/pick_ab.py --seeds 11,13,17 --old "STORE_BOUND_SHORT_MIN_N=1000000000" \\
        [--layout NN|NT|TN] [--draw sweep|decode] [--budget-s 300] [--json OUT.json]

Each seed draws 200 shapes: the sweep's (bench/sweep.py), or with `--draw decode` products of
1-16 rows (sweep_shapes.draw_decode_shape), which the sweep's 2 GFLOP floor leaves out, or
with `--draw columns` those of 1-16 columns (the decode draw with M and N swapped), or with
`--draw narrow` those of 8-64 columns in steps of 8, M and K 1024-32768.
The change is written as the heuristics constants that undo it (`--old`, NAME=VALUE pairs
split by ';', each VALUE a Python literal): the current code's pick is "new", the pick under
those constants "old". `--list` prints the moved shapes only (no GPU: the choices of an H100
as it reports its cluster capacity, device.H100_SXM_CLUSTERS, or with `--dram-tbps` of such a
device with that DRAM peak, e.g. an H200's 4.81); otherwise each is timed on
the GPU (row-major operands, as bench/sweep.py draws them, or with `--layout` B given as the
transposed view of an N x K weight (NT) or A as that of a K x M array (TN); both picks
forced, interleaved with cupy.matmul and, where installed, torch.matmul, medians; the result
NaN-poisoned and checked before the timings), and the summary gives the geometric mean of new
over old and the count below 0.97 x the faster cuBLAS either way (bench/NOTES.md v0.38).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
from dataclasses import replace
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_shapes  # noqa: E402
from bench import CUPY_DTYPE_NAMES, DTYPE_ALIASES  # noqa: E402

from hopmm import heuristics, layout, operands, tuning  # noqa: E402
from hopmm.device import H100_SXM_CLUSTERS  # noqa: E402
from hopmm.problem import LINE_BYTES, Problem  # noqa: E402

BELOW = 0.97           # the share issue 18 counts: hopmm under this x the faster cuBLAS
ROUNDS = 4
WARMUP_S = 0.2
INPUT_SETS = 2         # rotated, so that no timing reads its operands from L2 alone
# Relative error of either pick against the fp32 product above which a row is marked failed
# (the tile kernels' own bound in the GPU tests is far below it).
MAX_REL_ERR = 2e-2


def parse_patches(text: str) -> dict:
    """{NAME: value} from 'NAME=VALUE;NAME=VALUE': each NAME an upper-case constant of
    hopmm.heuristics, each VALUE a Python literal. ValueError naming what is wrong."""
    patches = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"--old: {part!r} is not NAME=VALUE")
        if not name.isupper() or not hasattr(heuristics, name):
            raise ValueError(f"--old: {name!r} is not a constant of hopmm.heuristics")
        try:
            patches[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--old: the value of {name} ({value.strip()!r}) is not a "
                             f"Python literal") from None
    if not patches:
        raise ValueError("--old: no NAME=VALUE given")
    return patches


@contextlib.contextmanager
def patched(patches: dict):
    """hopmm.heuristics with `patches` set (the remembered choices cleared on the way in and
    out)."""
    saved = {name: getattr(heuristics, name) for name in patches}
    remembered = (heuristics.choose, heuristics.gemv_in_place_choice,
                  heuristics.phased_choice)
    for f in remembered:
        f.cache_clear()
    try:
        for name, value in patches.items():
            setattr(heuristics, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(heuristics, name, value)
        for f in remembered:
            f.cache_clear()


# Operand layouts: the contiguous axis of A's and of B's memory ("cols": row-major; "rows": a
# transposed view), as operands.problem_of names them.
LAYOUTS = {"NN": ("cols", "cols"), "NT": ("cols", "rows"), "TN": ("rows", "cols")}


def row_major_problem(m: int, n: int, k: int, dtype: str) -> Problem:
    """The Problem of row-major A (M x K) and B (K x N), as bench/sweep.py passes them (and
    operands.kernel_operands would make of them: B's pitch is its row)."""
    return layout_problem(m, n, k, dtype, "NN")


def layout_problem(m: int, n: int, k: int, dtype: str, name: str) -> Problem:
    """The Problem of A and B in layout `name` (LAYOUTS) as operands.kernel_operands would
    make of them: B's line pitch is its row (N-major) or its weight's row (K-major)."""
    a_axis, b_axis = LAYOUTS[name]
    b_pitch = (n if b_axis == "cols" else k) * sweep_shapes.ELEMENT_BYTES
    return operands.problem_of(layout.matmul_shapes((m, k), (k, n)), dtype, a_axis, b_axis,
                               b_pitch % LINE_BYTES == 0)


def layout_aligned(m: int, n: int, k: int, name: str) -> bool:
    """Whether TMA reads both operands of layout `name` and the row-major result in place."""
    a_axis, b_axis = LAYOUTS[name]
    a_line = k if a_axis == "cols" else m
    b_line = n if b_axis == "cols" else k
    return all((x * sweep_shapes.ELEMENT_BYTES) % sweep_shapes.ROW_ALIGN_BYTES == 0
               for x in (a_line, b_line, n))


# The shapes a seed draws: the sweep's (bench/sweep.py), decode products of 1-16 rows
# (sweep_shapes.draw_decode_shape), those of 1-16 columns (draw_columns_shapes), of 8-64
# columns (draw_narrow_shapes), of 17-64 rows or columns at any width (draw_few_rows_shapes) or
# of 65-320 (draw_mid_rows_shapes), 200 of each.
DRAWS = {"sweep": sweep_shapes.draw_shapes, "decode": sweep_shapes.draw_decode_shapes,
         "columns": sweep_shapes.draw_columns_shapes, "narrow": sweep_shapes.draw_narrow_shapes,
         "few_rows": sweep_shapes.draw_few_rows_shapes,
         "mid_rows": sweep_shapes.draw_mid_rows_shapes}
SHAPES_PER_SEED = 200


def moved_shapes(seeds, patches: dict, device, layout_name: str = "NN",
                 draw: str = "sweep") -> list[dict]:
    """The shapes of the draws `draw` (DRAWS) of `seeds` (rows TMA reads in place, in layout
    `layout_name`) whose pick differs under `patches`: [{shape, dtype, new, old}] with the
    picks' tuning labels."""
    problems = []
    for seed in seeds:
        for s in DRAWS[draw](seed, 0, SHAPES_PER_SEED, ("bfloat16", "float16")):
            if layout_aligned(s.m, s.n, s.k, layout_name):
                problems.append(layout_problem(s.m, s.n, s.k, s.dtype, layout_name))
    heuristics.choose.cache_clear()
    new = [heuristics.choose(p, device) for p in problems]
    with patched(patches):
        old = [heuristics.choose(p, device) for p in problems]
    moved, seen = [], set()
    for p, a, b in zip(problems, new, old):
        key = (p.m, p.n, p.k, p.dtype)
        if tuning.label(a) != tuning.label(b) and key not in seen:
            seen.add(key)
            moved.append(dict(shape=[p.m, p.n, p.k], dtype=DTYPE_ALIASES[p.dtype],
                              new=tuning.label(a), old=tuning.label(b)))
    return moved


def row_line(row: dict) -> str:
    """A timed row in one line: new over old, each against the faster cuBLAS, the two picks,
    and a failed check."""
    tf = row["tflops"]
    return (f"{'x'.join(map(str, row['shape']))} {row['dtype']}: new / old "
            f"{tf['new'] / tf['old']:.3f}, x cuBLAS {tf['new'] / row['cublas_tflops']:.3f} "
            f"(old {tf['old'] / row['cublas_tflops']:.3f}); {row['new']} (old {row['old']})"
            + ("" if row["ok"] else f"; FAILED the check: {row['rel_err']}"))


def summarize(rows: list[dict]) -> dict:
    """Geomean of new / old over the timed rows, and how many ran below BELOW x cuBLAS."""
    timed = [r for r in rows if r.get("ok")]
    if not timed:
        return dict(timed=0)
    ratios = [r["tflops"]["new"] / r["tflops"]["old"] for r in timed]
    return dict(timed=len(timed),
                geomean_new_over_old=math.exp(sum(map(math.log, ratios)) / len(ratios)),
                min=min(ratios), max=max(ratios),
                below_new=sum(r["tflops"]["new"] / r["cublas_tflops"] < BELOW for r in timed),
                below_old=sum(r["tflops"]["old"] / r["cublas_tflops"] < BELOW for r in timed))


def _operand(cupy, rows: int, cols: int, axis: str, dtype):
    """A rows x cols operand whose contiguous axis is `axis` ("cols": row-major; "rows": the
    transposed view of a cols x rows array)."""
    shape = (rows, cols) if axis == "cols" else (cols, rows)
    x = cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)
    return x if axis == "cols" else x.T


def time_shape(entry: dict, patches: dict, device, layout_name: str = "NN") -> dict:
    """One moved shape on the GPU, its operands in layout `layout_name`: both picks forced,
    against cupy.matmul (and torch.matmul)."""
    import cupy

    from hopmm import launch

    m, n, k = entry["shape"]
    dtype = CUPY_DTYPE_NAMES[entry["dtype"]]
    a_axis, b_axis = LAYOUTS[layout_name]
    sets = [(_operand(cupy, m, k, a_axis, dtype), _operand(cupy, k, n, b_axis, dtype))
            for _ in range(INPUT_SETS)]
    shapes = layout.matmul_shapes(sets[0][0].shape, sets[0][1].shape)
    calls = [operands.kernel_operands(a, b, shapes) for a, b in sets]
    problem = calls[0].problem
    heuristics.choose.cache_clear()
    choices = {"new": heuristics.choose(problem, device)}
    with patched(patches):
        choices["old"] = heuristics.choose(problem, device)
    c = cupy.empty((m, n), dtype=dtype)
    c3 = c.reshape(1, m, n)
    ref = cupy.matmul(sets[0][0].astype(cupy.float32), sets[0][1].astype(cupy.float32))
    contestants, errors = {}, {}
    for name, choice in choices.items():
        launches = [launch.build_launches(choice, problem, cl.a3, cl.a_map, cl.b3, cl.b_map, c3)
                    for cl in calls]

        def run(i, launches=launches):
            launch.launch_all(launches[i], calls[i].a3.data.ptr, calls[i].b3.data.ptr,
                              c3.data.ptr)

        c.fill(cupy.nan)
        run(0)
        got = c.astype(cupy.float32)
        errors[name] = (float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
                        if not bool(cupy.isnan(got).any()) else float("nan"))
        contestants[name] = run
    del ref
    return dict(entry, **timed_beside_cublas(contestants, sets, 2 * m * n * k, errors, out=c))


def timed_beside_cublas(contestants: dict, sets: list, flop: int, errors: dict,
                        out=None, warmup_s: float = WARMUP_S) -> dict:
    """`contestants` ({name: run(i) on input set i of `sets`}) timed with cupy.matmul and, where
    installed, torch.matmul on the same sets (into `out`, else new arrays), interleaved,
    medians: {tflops, cublas_tflops (the faster), rel_err: `errors`, ok: every error below
    MAX_REL_ERR}."""
    import cupy

    from hopmm.timing import interleaved_medians

    contestants = dict(contestants, cupy=lambda i: cupy.matmul(*sets[i], out=out))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tsets = [(torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in sets]
        tout = None if out is None else torch.from_dlpack(out)
        contestants["torch"] = lambda i: torch.matmul(*tsets[i], out=tout)
    seconds = interleaved_medians(contestants, [(i,) for i in range(len(sets))], ROUNDS,
                                  warmup_s)
    tflops = {name: flop / s / 1e12 for name, s in seconds.items()}
    cublas = max(v for name, v in tflops.items() if name in ("cupy", "torch"))
    ok = all(e < MAX_REL_ERR for e in errors.values())   # NaN fails too
    return dict(tflops=tflops, cublas_tflops=cublas, rel_err=errors, ok=ok)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", required=True, help="sweep seeds, e.g. 11,13,17")
    p.add_argument("--old", required=True, help="NAME=VALUE;... : the constants that undo "
                                                "the change")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="NN",
                   help="NN: row-major A and B; NT: B as w.T; TN: A as a.T")
    p.add_argument("--draw", choices=sorted(DRAWS), default="sweep",
                   help="sweep: the sweep's shapes; decode: 1-16 rows, N and K 1024-32768; "
                        "columns: 1-16 columns, M and K 1024-32768; narrow: 8-64 columns "
                        "in steps of 8, M and K 1024-32768")
    p.add_argument("--list", action="store_true", help="print the moved shapes only (no GPU)")
    p.add_argument("--dram-tbps", type=float, default=None,
                   help="with --list: the DRAM peak of the device the choices are made for")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no shape after this many seconds")
    p.add_argument("--json", default=None, help="also write the rows and summary here")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        patches = parse_patches(args.old)
    except ValueError as e:
        p.error(str(e))
    if args.dram_tbps is not None and not args.list:
        p.error("--dram-tbps is for --list: on the GPU the device reports its own")
    device = (H100_SXM_CLUSTERS if args.dram_tbps is None
              else replace(H100_SXM_CLUSTERS, dram_tbps=args.dram_tbps))
    if not args.list:
        import cupy

        from hopmm.device import query

        device = query(cupy.cuda.Device().id)
    moved = moved_shapes(seeds, patches, device, args.layout, args.draw)
    print(f"{len(moved)} {args.draw} shapes of seeds {args.seeds} ({args.layout}) move under --old "
          f"{args.old!r}")
    if args.list:
        for e in moved:
            print(f"{'x'.join(map(str, e['shape']))} {e['dtype']}: {e['old']} -> {e['new']}")
        return 0
    rows, start = [], time.time()
    for e in moved:
        if args.budget_s and time.time() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {len(moved) - len(rows)} shapes left")
            break
        try:
            row = time_shape(e, patches, device, args.layout)
        except Exception as exc:   # reported in its row and left out of the summary
            rows.append(dict(e, ok=False, error=f"{type(exc).__name__}: {exc}"))
            print(f"{'x'.join(map(str, e['shape']))} {e['dtype']}: not timed: "
                  f"{rows[-1]['error']}", flush=True)
            continue
        rows.append(row)
        print(row_line(row), flush=True)
    summary = summarize(rows)
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(old=args.old, seeds=seeds,
                                                   layout=args.layout, draw=args.draw,
                                                   rows=rows,
                                                   summary=summary), indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

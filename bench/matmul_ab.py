#!/usr/bin/env python3
"""A heuristic change measured through hopmm.matmul itself, on operands whose rows lie at any
alignment: every path a user's call takes (gemv reading rows in place, aligned copies, the row
store, a route to cupy.matmul) is part of what is compared.

    python bench/matmul_ab.py --seeds 1713,1714 --draw columns --layout NN \\
        --old "GEMV_M_MAJOR_A_ROW_COST=0" [--budget-s 120] [--json OUT.json]

bench/pick_ab.py forces both picks on operands that TMA reads in place, so it leaves out the
products whose rows are not 16-byte multiples (and what the call does around the kernel). Here
each drawn product (pick_ab's draws and layouts, rows as drawn) is called twice, under the
current constants ("new") and under `--old` (pick_ab's NAME=VALUE pairs), each call's
remembered recipe kept; products whose path, schedule or kernel (hopmm.explain) differ are
checked against a float32 product and timed: both recipes interleaved with cupy.matmul and,
where installed, torch.matmul, medians (bench/NOTES.md v0.59). GPU only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pick_ab  # noqa: E402

WARMUP_S = 0.1   # pick_ab's rounds and the rest of its timing (timed_beside_cublas)
INPUT_SETS = 2
# explain's lines that name what a call runs on (the layout line names the copies it reads).
PLAN_LINES = ("path:", "layout:", "schedule:", "kernel:")


def plan_line(a, b) -> str:
    """What hopmm.matmul(a, b) runs on, as hopmm.explain names it (one line)."""
    import hopmm

    lines = hopmm.explain(a, b).splitlines()
    return " | ".join(line for line in lines if line.startswith(PLAN_LINES))


@contextlib.contextmanager
def rule(patches: dict):
    """The heuristics under `patches` (none: the current rule), with every remembered choice and
    recipe dropped on the way in and out, so that each call is planned afresh."""
    from hopmm import fastpath

    fastpath.clear()
    try:
        with pick_ab.patched(patches):
            yield
    finally:
        fastpath.clear()


def planned(sets: list, patches: dict):
    """(the remembered recipe of hopmm.matmul on `sets`' operands, its plan line) under
    `patches`; the recipe is None where the call is never remembered."""
    import hopmm
    from hopmm import fastpath

    with rule(patches):
        for a, b in sets:   # the first call plans and remembers; the others repeat it
            hopmm.matmul(a, b)
        a, b = sets[0]
        return fastpath.lookup(fastpath.key(a, b, None)), plan_line(a, b)


def time_product(shape, dtype: str, layout_name: str, patches: dict) -> dict | None:
    """One drawn product under both rules: None where both run it alike, else its timings."""
    import cupy

    m, n, k = shape
    a_axis, b_axis = pick_ab.LAYOUTS[layout_name]
    sets = [(pick_ab._operand(cupy, m, k, a_axis, dtype),
             pick_ab._operand(cupy, k, n, b_axis, dtype)) for _ in range(INPUT_SETS)]
    plans = {"new": planned(sets, {}), "old": planned(sets, patches)}
    if plans["new"][1] == plans["old"][1]:
        return None
    ref = cupy.matmul(sets[0][0].astype(cupy.float32), sets[0][1].astype(cupy.float32))
    contestants, errors = {}, {}
    for name, (recipe, _) in plans.items():
        if recipe is None:
            raise RuntimeError(f"{m}x{n}x{k}: the {name} rule's call was not remembered")
        got = recipe.run(*sets[0], None).astype(cupy.float32)
        errors[name] = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
        contestants[name] = lambda i, r=recipe: r.run(*sets[i], None)
    del ref
    return dict(shape=[m, n, k], dtype=pick_ab.DTYPE_ALIASES[dtype], layout=layout_name,
                new=plans["new"][1], old=plans["old"][1],
                **pick_ab.timed_beside_cublas(contestants, sets, 2 * m * n * k, errors,
                                              warmup_s=WARMUP_S))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", required=True, help="draw seeds, e.g. 1713,1714")
    p.add_argument("--old", required=True, help="NAME=VALUE;... : the constants that undo "
                                                "the change")
    p.add_argument("--layout", choices=sorted(pick_ab.LAYOUTS), default="NN")
    p.add_argument("--draw", choices=sorted(pick_ab.DRAWS), default="sweep")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no product after this many seconds")
    p.add_argument("--json", default=None, help="also write the rows and summary here")
    args = p.parse_args(argv)
    patches = pick_ab.parse_patches(args.old)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, began = [], time.time()
    for seed in seeds:
        for s in pick_ab.DRAWS[args.draw](seed, 0, pick_ab.SHAPES_PER_SEED,
                                          ("bfloat16", "float16")):
            if args.budget_s and time.time() - began > args.budget_s:
                break
            try:
                row = time_product((s.m, s.n, s.k), s.dtype, args.layout, patches)
            except Exception as exc:   # reported in its row and left out of the summary
                row = dict(shape=[s.m, s.n, s.k], dtype=pick_ab.DTYPE_ALIASES[s.dtype],
                           ok=False, error=f"{type(exc).__name__}: {exc}")
                rows.append(row)
                print(f"{s.m}x{s.n}x{s.k} {row['dtype']}: not timed: {row['error']}",
                      flush=True)
                continue
            if row is not None:
                rows.append(row)
                print(pick_ab.row_line(row), flush=True)
    summary = pick_ab.summarize(rows)
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(old=args.old, seeds=seeds,
                                                   layout=args.layout, draw=args.draw,
                                                   rows=rows, summary=summary), indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

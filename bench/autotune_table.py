#!/usr/bin/env python3
"""Times every autotune candidate (schedule x tile width x raster group) on each shape and
prints them side by side: the data the heuristic's choices are checked against.

    python bench/autotune_table.py [--shapes 3000x3000x3000,...] [--dtype bf16]

The winners are also stored in the autotune table of HOPMM_CACHE_DIR, as hopmm.autotune does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import CUPY_DTYPE_NAMES, DTYPE_ALIASES, parse_shapes  # noqa: E402

DEFAULT_SHAPES = ("3000x3000x3000,2048x2048x2048,4096x4096x4096,8192x8192x8192,"
                  "8192x8192x1024,4096x14336x4096")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_ALIASES))
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

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

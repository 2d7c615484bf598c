#!/usr/bin/env python3
"""Redraw the PNG chart from a saved benchmark JSON (no GPU needed).

    python bench/chart.py bench/results/bench-....json [-o chart.png]
"""
import argparse
import importlib.util
import sys
from pathlib import Path


def load_bench():
    """bench/ is not a package: load bench.py from next to this file."""
    spec = importlib.util.spec_from_file_location("hopmm_bench", Path(__file__).with_name("bench.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Redraw a hopmm benchmark chart from its JSON.")
    p.add_argument("json", type=Path, help="a bench-*.json written by bench/bench.py")
    p.add_argument("-o", "--output", type=Path, help="PNG path (default: the JSON path with .png)")
    args = p.parse_args(argv)
    bench = load_bench()
    metadata, rows = bench.load_json(args.json)
    png = bench.draw_chart(rows, args.output or args.json.with_suffix(".png"), bench.chart_title(metadata))
    if png is None:
        return 1
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The heuristic's time models against the sweeps' measurements: for each timed sweep shape
whose recorded kernel is the pick the heuristic makes today, the measured median over the
model's estimate of that pick (heuristics.estimate_us), grouped by device, schedule, tile and
waves. A group far from 1 is a model whose absolute scale misleads the choices that weigh it
against another model (bench/NOTES.md v0.53).

    python bench/model_audit.py [SWEEP.json ...] [--min-rows 8] [--json OUT.json]
    python bench/model_audit.py --candidates TABLE.json ... --dram-tbps 4.81

Without files it reads bench/results/sweep-*.json. No GPU: each shape's problem is rebuilt as
the sweep passed it (row-major A and B); shapes whose rows TMA could not read in place, that
went through copies or to cupy.matmul, or that split off a wave tail are left out, as are those
whose pick has changed since the sweep ran (counted apart).

With --candidates, the files are `bench/autotune_table.py --json` tables instead: every timed
candidate (each shape's pick and its rivals, not only the picks) against its model, grouped by
schedule and tile, on an H100 as it reports its cluster capacity with the DRAM peak of the
device the table was timed on (the tables do not record it). Candidates no model times, and
labels today's candidates no longer hold, are left out.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pick_ab  # noqa: E402
from sweep_report import geomean  # noqa: E402
from bench import CUPY_DTYPE_NAMES  # noqa: E402

from hopmm import heuristics  # noqa: E402
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS, dram_peak_tbps  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# DRAM peaks of devices whose sweeps predate the metadata's `dram_tbps`: as they report their
# memory clock and bus width (hopmm.device.dram_peak_tbps).
KNOWN_DRAM_TBPS = {"NVIDIA H200": dram_peak_tbps(3_201_000, 6016),
                   "NVIDIA H100 80GB HBM3": H100_SXM.dram_tbps}
# Waves of tiles (tiles / SMs) a row is grouped by: below one, one to two, two to four, more.
WAVE_EDGES = (1, 2, 4)


def device_of(meta: dict):
    """The DeviceInfo the heuristic chose for on the sweep's device: an H100 as it reports its
    cluster capacity, with the sweep's DRAM peak and SM count."""
    dram = meta.get("dram_tbps") or KNOWN_DRAM_TBPS.get(meta.get("device"))
    return replace(H100_SXM_CLUSTERS, name=meta.get("device") or H100_SXM_CLUSTERS.name,
                   sm_count=int(meta.get("sm_count") or H100_SXM_CLUSTERS.sm_count),
                   dram_tbps=dram)


def waves_label(tiles: int, sm_count: int) -> str:
    waves = tiles / sm_count
    for lo, hi in zip((0,) + WAVE_EDGES, WAVE_EDGES):
        if waves < hi:
            return f"{lo}-{hi}" if lo else f"<{hi}"
    return f"{WAVE_EDGES[-1]}+"


def audit_rows(path: Path) -> tuple[list[dict], int]:
    """(rows, changed): each usable row of the sweep at `path` with its group and the ratio
    measured / model; `changed`: rows left out because today's pick is another kernel."""
    data = json.loads(path.read_text())
    device = device_of(data.get("metadata", {}))
    rows, changed = [], 0
    for r in data.get("rows", []):
        plan = r.get("plan") or {}
        if not r.get("ok") or not r.get("rows_aligned") or plan.get("path") != "kernel" \
                or "copies" in plan.get("layout", ""):
            continue
        problem = pick_ab.row_major_problem(r["m"], r["n"], r["k"],
                                            CUPY_DTYPE_NAMES[r["dtype"]])
        choice = heuristics.choose(problem, device)
        if choice.tail is not None:
            continue
        if choice.schedule.kernel_name(choice.config) != plan.get("kernel"):
            changed += 1
            continue
        model = heuristics.estimate_us(choice, problem, device)
        if model is None:
            continue
        cfg = choice.config
        tiles = choice.schedule.tiles(problem, cfg)
        rows.append(dict(device=device.name, schedule=choice.schedule.name,
                         tile=f"{cfg.max_rows}x{cfg.block_n}" if not hasattr(cfg, "block_m")
                         else f"{cfg.block_m}x{cfg.block_n}",
                         waves=waves_label(tiles[0] * tiles[1] * problem.batch,
                                           device.sm_count),
                         shape=r["shape"], dtype=r["dtype"], model_us=model,
                         measured_us=r["median_us"]["hopmm"],
                         ratio=r["median_us"]["hopmm"] / model))
    return rows, changed


def candidate_rows(path: Path, device) -> list[dict]:
    """Each timed candidate of the autotune table at `path` whose label is one of today's
    candidates (tuning.candidates) and that a model times: its group and measured / model."""
    from hopmm import tuning

    rows = []
    for r in json.loads(path.read_text()):
        m, n, k = r["shape"]
        problem = pick_ab.row_major_problem(m, n, k, CUPY_DTYPE_NAMES[r["dtype"]])
        choices = {tuning.label(c): c for c in tuning.candidates(problem, device)}
        for label, tflops in r["tflops"].items():
            choice = choices.get(label)
            if choice is None or not tflops:
                continue
            try:
                model = heuristics.estimate_us(choice, problem, device)
            except KeyError:   # a tile the models do not rate (the 64 x 64 tile)
                continue
            if model is None:
                continue
            measured = 2 * m * n * k * problem.batch / (tflops * 1e6)
            cfg = choice.config
            rows.append(dict(device=device.name, schedule=choice.schedule.name,
                             tile=f"{cfg.block_m}x{cfg.block_n}", label=label,
                             shape=f"{m}x{n}x{k}", dtype=r["dtype"], model_us=model,
                             measured_us=measured, ratio=measured / model))
    return rows


def summarize(rows: list[dict], keys: tuple, min_rows: int) -> list[dict]:
    """Per group of `keys` with at least `min_rows` rows: the count, the geometric mean and
    the 10th / 90th percentiles of measured / model."""
    groups = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r["ratio"])
    out = []
    for key in sorted(groups):
        ratios = sorted(groups[key])
        if len(ratios) < min_rows:
            continue
        out.append(dict(zip(keys, key), rows=len(ratios),
                        geomean=geomean(ratios),
                        p10=ratios[len(ratios) // 10], p90=ratios[9 * len(ratios) // 10]))
    return out


def format_table(groups: list[dict], keys: tuple) -> str:
    head = [*keys, "rows", "measured/model", "p10", "p90"]
    lines = [" | ".join(head)]
    for g in groups:
        lines.append(" | ".join([*(str(g[k]) for k in keys), str(g["rows"]),
                                 f"{g['geomean']:.3f}", f"{g['p10']:.2f}", f"{g['p90']:.2f}"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="sweep JSON files (default: bench/results/sweep-*)")
    p.add_argument("--min-rows", type=int, default=8, help="smallest group shown")
    p.add_argument("--json", default=None, help="also write the rows and groups here")
    p.add_argument("--candidates", action="store_true",
                   help="the files are autotune tables (bench/autotune_table.py --json)")
    p.add_argument("--dram-tbps", type=float, default=None,
                   help="with --candidates: the DRAM peak of the device that timed them")
    args = p.parse_args(argv)
    if args.candidates:
        if not args.files:
            p.error("--candidates needs the autotune tables to read")
        device = replace(H100_SXM_CLUSTERS, dram_tbps=args.dram_tbps or H100_SXM.dram_tbps)
        rows = [r for f in args.files for r in candidate_rows(Path(f), device)]
        groups = summarize(rows, ("schedule", "tile"), args.min_rows)
        print(f"{len(rows)} timed candidates of {len(args.files)} tables")
        print(format_table(groups, ("schedule", "tile")))
        if args.json:
            Path(args.json).write_text(json.dumps(dict(rows=rows, groups=groups), indent=1))
        return 0
    paths = [Path(f) for f in args.files] or sorted(RESULTS.glob("sweep-*.json"))
    if not paths:
        p.error("no sweep results to read")
    rows, changed = [], 0
    for path in paths:
        got, moved = audit_rows(path)
        rows += got
        changed += moved
    print(f"{len(rows)} rows of {len(paths)} sweeps ({changed} left out: today's pick is "
          f"another kernel)")
    by_schedule = summarize(rows, ("device", "schedule"), 1)
    detail = summarize(rows, ("device", "schedule", "tile", "waves"), args.min_rows)
    print(format_table(by_schedule, ("device", "schedule")))
    print()
    print(format_table(detail, ("device", "schedule", "tile", "waves")))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, by_schedule=by_schedule,
                                                   detail=detail), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

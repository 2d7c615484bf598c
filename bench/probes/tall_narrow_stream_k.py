#!/usr/bin/env python3
"""A probe, not part of hopmm: tall products of few columns (or wide ones of few rows), the
heuristic's pick (through hopmm.matmul) against stream-K on the 128 x 64 tile (or the tiles
given) in each lane direction, with as many CTAs as the SMs allow, with each one's model where
the heuristic rates that tile, and cuBLAS beside (bench/NOTES.md v0.62, v0.63).

    python bench/probes/tall_narrow_stream_k.py OUT.json [--tiles 64x128,128x256] MxNxKxDTYPE ...

DTYPE is bf16 or fp16; 64-row tiles (one consumer warpgroup) are offered to stream-K here only.

Row-major operands, three input sets, interleaved rounds, medians; every contestant's result is
checked against an fp32 cupy.matmul first.
"""
import sys

import cupy

import hopmm
from hopmm import heuristics
from hopmm.device import query
from hopmm.schedules import BLOCK_M, NARROW_BLOCK_N, StreamKSchedule
from hopmm.timing import interleaved_medians

from contestants import (cublas_contestants, cupy_dtype, drop_wrong, kernel_calls, launch_run,
                         report)

INPUT_SETS = 3
ROUNDS = 5
WARMUP_S = 0.2
MAX_REL_ERR = 2e-2


def stream_k_choices(problem, device, tiles) -> list:
    """Stream-K on each tile in each lane direction, as many CTAs a lane as the SMs allow."""
    out = []
    for block_m, block_n in tiles:
        cfg = StreamKSchedule.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                                      device.smem_per_block_optin, block_m)
        if cfg is None:
            continue
        for group in sorted({1, StreamKSchedule.tiles(problem, cfg)[0]}):
            ctas = StreamKSchedule.most_ctas(problem, cfg, problem.batch, group,
                                             device.sm_count)
            if ctas:
                out.append(heuristics.Choice(StreamKSchedule, cfg, "probe", group, ctas))
    return out


def stream_k_runs(a, b, c, device, tiles) -> dict:
    """{name: (run(i), model us or None)} for each stream-K choice on `tiles`."""
    calls = kernel_calls(a, b)
    problem = calls[0].problem
    out = {}
    for choice in stream_k_choices(problem, device, tiles):
        cfg = choice.config
        lanes = StreamKSchedule.lanes(problem, cfg, choice.raster_group)
        try:
            model = heuristics._choice_us(choice, problem, device)
        except (KeyError, ValueError):   # a tile the heuristic has no speed for
            model = None
        name = f"stream_k {cfg.block_m}x{cfg.block_n} {lanes} lanes {choice.splits} CTAs"
        out[name] = (launch_run(choice, calls, c), model)
    return out, problem


def probe(m, n, k, dtype, device, tiles) -> dict:
    a = [cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype)
         for _ in range(INPUT_SETS)]
    b = [cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype)
         for _ in range(INPUT_SETS)]
    c = cupy.empty((m, n), dtype)
    streams, problem = stream_k_runs(a, b, c, device, tiles)
    pick = heuristics.choose(problem, device)
    contestants = {"pick": lambda i: hopmm.matmul(a[i], b[i], out=c)}
    contestants.update({name: run for name, (run, _) in streams.items()})
    errors = drop_wrong(contestants, a[0], b[0], c, MAX_REL_ERR)
    contestants.update(cublas_contestants(a, b))
    seconds = interleaved_medians(contestants, [(i,) for i in range(INPUT_SETS)], ROUNDS,
                                  WARMUP_S)
    return dict(shape=[m, n, k], dtype=str(dtype), pick=heuristics.label(pick),
                pick_model_us=heuristics._choice_us(pick, problem, device),
                models_us={name: us for name, (_, us) in streams.items()},
                us={name: s * 1e6 for name, s in seconds.items()}, errors=errors)


def main(argv) -> int:
    out_path, shapes = argv[0], argv[1:]
    tiles = [(BLOCK_M, NARROW_BLOCK_N)]
    if shapes[:1] == ["--tiles"]:
        tiles = [tuple(int(x) for x in t.split("x")) for t in shapes[1].split(",")]
        shapes = shapes[2:]
    # The schedule offers only 128-row tiles; the kernel takes one consumer warpgroup as well.
    StreamKSchedule.short_block_ns = tuple(n for m, n in tiles if m < BLOCK_M)
    device = query(cupy.cuda.Device().id)
    rows = []
    for text in shapes:
        m, n, k, dt = text.split("x")
        row = probe(int(m), int(n), int(k), cupy_dtype(dt), device, tiles)
        report(f"{text} pick [{row['pick']}]", row, rows, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

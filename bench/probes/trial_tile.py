#!/usr/bin/env python3
"""A probe, not part of hopmm: the 128 x 160 tile (schedules.HALF_BOX_BLOCK_N) forced on the
persistent and overlap kernels, against the heuristic's pick (through hopmm.matmul) and cuBLAS,
on products where 64-wide steps of tile width leave part of a wave idle (bench/NOTES.md v0.65:
cuBLAS ran 128x160 tiles on five of seven such losers of seed 257; v0.66: what this measured
before the heuristic offered the tile).

    python bench/probes/trial_tile.py OUT.json [--groups 1,4,16] MxNxKxDTYPE ...
    python bench/probes/trial_tile.py OUT.json --draw SEED COUNT

With --draw, COUNT products of the sweep's generator (bench/sweep_shapes.py) whose rows TMA
reads in place and whose 128 x 160 grid has more tiles than a 128 x 192 one but no more waves
(the products the tile is for).
DTYPE is bf16 or fp16. Row-major A, B both N-major (as drawn) and K-major (the transposed view
of an N x K weight), three input sets, interleaved rounds, medians; every contestant's result
is checked against an fp32 cupy.matmul first.
"""
import sys
from pathlib import Path

import cupy

import hopmm
from hopmm import heuristics
from hopmm.device import query
from hopmm.schedules import SCHEDULES
from hopmm.timing import interleaved_medians

from contestants import (cublas_contestants, cupy_dtype, drop_wrong, kernel_calls, launch_run,
                         report)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INPUT_SETS = 3
ROUNDS = 5
WARMUP_S = 0.2
MAX_REL_ERR = 2e-2
TRIAL = (128, 160)
KERNELS = ("persistent", "persistent_overlap")
DEFAULT_GROUPS = (1, 4, 16)
ROW_ALIGN_ELEMS = 8   # 16-byte rows of 16-bit elements


def trial_runs(calls, c, device, groups) -> dict:
    """{name: run(i)} of the trial tile on each kernel and raster group, on the input sets'
    kernel operands `calls` (kernel_calls)."""
    problem = calls[0].problem
    out = {}
    for name in KERNELS:
        sched = SCHEDULES[name]
        cfg = sched.deepest(problem.dtype, TRIAL[1], problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin, TRIAL[0])
        for group in groups:
            choice = heuristics.Choice(sched, cfg, "probe", group, 1)
            out[f"{name} 128x160 g{group}"] = launch_run(choice, calls, c)
    return out


def probe(m, n, k, dtype, device, groups, k_major_b=False) -> dict:
    a = [cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype)
         for _ in range(INPUT_SETS)]
    b = [cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype)
         for _ in range(INPUT_SETS)]
    if k_major_b:   # the transposed view of an N x K weight
        b = [cupy.ascontiguousarray(x.T).T for x in b]
    c = cupy.empty((m, n), dtype)
    calls = kernel_calls(a, b)
    contestants = {"pick": lambda i: hopmm.matmul(a[i], b[i], out=c)}
    contestants.update(trial_runs(calls, c, device, groups))
    errors = drop_wrong(contestants, a[0], b[0], c, MAX_REL_ERR)
    contestants.update(cublas_contestants(a, b))
    seconds = interleaved_medians(contestants, [(i,) for i in range(INPUT_SETS)], ROUNDS,
                                  WARMUP_S)
    problem = calls[0].problem
    return dict(shape=[m, n, k], dtype=str(dtype), b="k-major" if k_major_b else "n-major",
                pick=heuristics.label(heuristics.choose(problem, device)),
                us={name: s * 1e6 for name, s in seconds.items()}, errors=errors)


def drawn(seed: int, count: int, device) -> list[str]:
    """Products of the sweep's generator whose trial grid fills more of its last wave."""
    import sweep_shapes

    out, i = [], 0
    while len(out) < count and i < 100 * count:
        s = sweep_shapes.draw_shape(seed, i, ("bfloat16", "float16"))
        i += 1
        tiles = -(-s.m // TRIAL[0]) * -(-s.n // TRIAL[1])
        wide = -(-s.m // TRIAL[0]) * -(-s.n // 192)
        # rows TMA reads in place (the pick through hopmm.matmul makes no copies the trial
        # tile's launches do not), and the trial grid no more waves than the 192-wide one
        aligned = s.k % ROW_ALIGN_ELEMS == 0 and s.n % ROW_ALIGN_ELEMS == 0
        if aligned and wide < tiles <= -(-wide // device.sm_count) * device.sm_count:
            out.append(f"{s.m}x{s.n}x{s.k}x{'bf16' if s.dtype == 'bfloat16' else 'fp16'}")
    return out


def main(argv) -> int:
    out_path, args = argv[0], argv[1:]
    groups = DEFAULT_GROUPS
    if args[:1] == ["--groups"]:
        groups = tuple(int(g) for g in args[1].split(","))
        args = args[2:]
    device = query(cupy.cuda.Device().id)
    if args[:1] == ["--draw"]:
        args = drawn(int(args[1]), int(args[2]), device)
    rows = []
    for text in args:
        m, n, k, dt = text.split("x")
        for k_major_b in (False, True):
            row = probe(int(m), int(n), int(k), cupy_dtype(dt), device, groups,
                        k_major_b)
            report(f"{text} B {row['b']} pick [{row['pick']}]", row, rows, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

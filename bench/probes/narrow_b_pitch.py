#!/usr/bin/env python3
"""A probe, not part of hopmm: tall products of few columns on the persistent kernel's 128 x 64
tile, with B (row-major, K x N) and C at their own row pitch or as views of wider rows, against
cuBLAS: which operand's pitch slows the narrow tile (bench/NOTES.md v0.60).

    python bench/probes/narrow_b_pitch.py OUT.json [MxNxK ...]

Each variant "B<p>C<q>" reads B from rows p elements apart and writes C to rows q apart (the
product's own N where p or q is N); only the kernel is timed (the views are made once), bf16,
two input sets, interleaved rounds, medians.
"""
import sys

import cupy

from hopmm.device import query
from hopmm.heuristics import Choice
from hopmm.schedules import BLOCK_M, NARROW_BLOCK_N, PersistentSchedule
from hopmm.timing import interleaved_medians

from contestants import cublas_contestants, kernel_calls, launch_run, report

DEFAULT_SHAPES = ("29504x24x896 17664x24x1984 11200x24x3264 26816x24x3840 24320x24x1856 "
                  "25088x40x1024 15616x40x2560 19200x56x1536 18240x56x2816 25984x48x896 "
                  "24896x48x1792 10816x32x1984 32192x64x832 11840x24x5376").split()
DTYPE = "bfloat16"
INPUT_SETS = 2
ROUNDS = 4
WARMUP_S = 0.1
MAX_REL_ERR = 2e-2
SECTOR_ELEMS = 16          # 32 bytes of 16-bit elements
LINE_ELEMS = 64            # 128 bytes


def rand(shape):
    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(DTYPE)


def pitches(n: int) -> list[int]:
    """B's row pitches to try: its own, whole sectors, one line and two."""
    return sorted({n, -(-n // SECTOR_ELEMS) * SECTOR_ELEMS, LINE_ELEMS, 2 * LINE_ELEMS})


def narrow_run(a, bs, c, device):
    """A function of the input set's index running the narrow tile on (a[i], bs[i]) into c."""
    calls = kernel_calls(a, bs)
    problem = calls[0].problem
    cfg = PersistentSchedule.deepest(problem.dtype, NARROW_BLOCK_N, problem.trans_a,
                                     problem.trans_b, device.smem_per_block_optin, BLOCK_M)
    return launch_run(Choice(PersistentSchedule, cfg, "probe", 1), calls, c)


def probe(m: int, n: int, k: int, device) -> dict:
    a = [rand((m, k)) for _ in range(INPUT_SETS)]
    b_rows = {p: [rand((k, p))[:, :n] for _ in range(INPUT_SETS)] for p in pitches(n)}
    c_rows = {q: cupy.empty((m, q), dtype=DTYPE)[:, :n] for q in {n, LINE_ELEMS}}
    contestants, errors = {}, {}
    for p, bs in b_rows.items():
        for q, c in c_rows.items():
            if p != n and q != n:
                continue
            name = f"B{p}C{q}"
            run = narrow_run(a, bs, c, device)
            c.fill(cupy.nan)
            run(0)
            ref = cupy.matmul(a[0].astype(cupy.float32), bs[0].astype(cupy.float32))
            err = float(cupy.linalg.norm(c.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
            if not err < MAX_REL_ERR:   # NaN fails too
                errors[name] = err
                continue
            contestants[name] = run
    b_own, c_own = b_rows[n], c_rows[n]
    contestants.update(cublas_contestants(a, b_own, out=c_own))
    seconds = interleaved_medians(contestants, [(i,) for i in range(INPUT_SETS)], ROUNDS,
                                  WARMUP_S)
    return dict(shape=[m, n, k], us={name: s * 1e6 for name, s in seconds.items()},
                errors=errors)


def main(argv) -> int:
    out_path, shapes = argv[0], argv[1:] or DEFAULT_SHAPES
    device = query(cupy.cuda.Device().id)
    rows = []
    for text in shapes:
        m, n, k = map(int, text.split("x"))
        report(text, probe(m, n, k, device), rows, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A probe, not part of hopmm: products of K below one k-block whose rows are not 16-byte
aligned, which write C at 1.2-1.6 TB/s (bench/NOTES.md v0.63). Where does the time go: the
aligned copies of a and b, the row store of C, or the memory system's taking rows that start
off a sector?

    python bench/probes/short_k_store.py OUT.json [MxNxKxDTYPE ...]

Contestants, each timed through hopmm.matmul (or cuBLAS) into a preallocated `out`:
  own        a, b and out contiguous, as a user holds them (a and b are copied: rows off 16 B)
  ab_padded  a and b views of rows padded to whole lines (read in place), out contiguous
  c_padded   as ab_padded, and out a view of rows padded to whole lines (TMA stores)
  fill       out.fill(0): the output's bytes written by a plain CuPy kernel
  cupy, torch  cuBLAS on the contiguous operands
Two input sets, interleaved rounds, medians; every product is checked against cupy.matmul in
fp32 with the output poisoned first.
"""
import sys

import cupy

import hopmm
from hopmm.timing import interleaved_medians

from contestants import cublas_contestants, report

DEFAULT_SHAPES = ("16186x2274x28xfloat16 4711x19828x34xbfloat16 14534x4900x30xbfloat16 "
                  "14134x2668x28xfloat16 23580x2988x20xbfloat16 2377x27993x19xfloat16 "
                  "16192x2272x32xfloat16 14528x4928x32xbfloat16").split()
INPUT_SETS = 2
ROUNDS = 5
WARMUP_S = 0.1
MAX_REL_ERR = 2e-2
LINE_ELEMS = 64            # 128 bytes of 16-bit elements


def _padded(cols: int) -> int:
    return -(-cols // LINE_ELEMS) * LINE_ELEMS


def _rand(shape, dtype):
    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)


def probe(m: int, n: int, k: int, dtype: str) -> dict:
    a = [_rand((m, k), dtype) for _ in range(INPUT_SETS)]
    b = [_rand((k, n), dtype) for _ in range(INPUT_SETS)]
    a_pad = [cupy.empty((m, _padded(k)), dtype)[:, :k] for _ in range(INPUT_SETS)]
    b_pad = [cupy.empty((k, _padded(n)), dtype)[:, :n] for _ in range(INPUT_SETS)]
    for dst, src in zip(a_pad + b_pad, a + b):
        dst[...] = src
    out = cupy.empty((m, n), dtype)
    out_pad = cupy.empty((m, _padded(n)), dtype)[:, :n]
    variants = {"own": (a, b, out), "ab_padded": (a_pad, b_pad, out),
                "c_padded": (a_pad, b_pad, out_pad)}
    contestants, errors = {}, {}
    ref = cupy.matmul(a[0].astype(cupy.float32), b[0].astype(cupy.float32))
    for name, (x, y, c) in variants.items():
        c.fill(cupy.nan)
        hopmm.matmul(x[0], y[0], out=c)
        err = float(cupy.linalg.norm(c.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
        if not err < MAX_REL_ERR:   # NaN fails too
            errors[name] = err
            continue
        contestants[name] = (lambda i, x=x, y=y, c=c: hopmm.matmul(x[i], y[i], out=c))
    contestants["fill"] = lambda i: out.fill(0)
    contestants.update(cublas_contestants(a, b, out=out))
    seconds = interleaved_medians(contestants, [(i,) for i in range(INPUT_SETS)], ROUNDS,
                                  WARMUP_S)
    us = {name: s * 1e6 for name, s in seconds.items()}
    c_bytes = m * n * out.itemsize
    return dict(shape=[m, n, k], dtype=dtype, us=us, errors=errors,
                c_tbps={name: c_bytes / t / 1e6 for name, t in us.items()},
                plan=str(hopmm.explain(a[0], b[0])).splitlines()[:6])


def main(argv) -> int:
    out_path, shapes = argv[0], argv[1:] or DEFAULT_SHAPES
    rows = []
    for text in shapes:
        m, n, k, dtype = text.split("x")
        row = probe(int(m), int(n), int(k), dtype)
        report(text, row, rows, out_path)
        print("   C TB/s: " + " ".join(f"{name} {v:.2f}" for name, v in row["c_tbps"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A probe, not part of hopmm: the fixed cost of a call against its streaming rate, on tall
products of 64 columns that take less than a wave of tiles (bench/NOTES.md v0.62). For each M
it times hopmm.matmul, also replayed from a CUDA graph of GRAPH_CALLS calls (no host path
between the calls), and cupy.matmul (CuPy refuses cuBLAS calls in a capture) over a range of K,
and fits time = fixed + bytes / rate per contestant and M.

    python bench/probes/fixed_cost.py OUT.json [M ...]

bf16; as many input sets as the benchmark rotates (beyond L2), interleaved rounds, medians;
every result is checked against cupy.matmul.
"""
import json
import sys
from pathlib import Path

import cupy
import numpy as np

import hopmm
from hopmm.timing import interleaved_medians

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import input_set_count  # noqa: E402

DEFAULT_MS = (2656, 5312, 10624)
N = 64
KS = (256, 512, 1024, 2048, 3904, 7808, 15616)
GRAPH_CALLS = 20
ROUNDS = 5
WARMUP_S = 0.1
MAX_REL_ERR = 2e-2


def _bf16():
    try:
        return cupy.dtype("bfloat16")
    except TypeError:  # known by name only once ml_dtypes registered it
        import ml_dtypes
        return cupy.dtype(ml_dtypes.bfloat16)


def graph_of(fn, inputs, stream):
    """A CUDA graph of GRAPH_CALLS calls of fn(a, b, out), the input sets in turn; None where
    the call cannot be captured."""
    try:
        with stream:
            stream.begin_capture()
            for i in range(GRAPH_CALLS):
                fn(*inputs[i % len(inputs)])
            return stream.end_capture()
    except Exception as exc:  # noqa: BLE001 - a probe reports what it could not capture
        try:
            stream.end_capture()
        except Exception:  # noqa: BLE001
            pass
        print(f"  capture failed: {type(exc).__name__}: {exc}")
        return None


def main(argv):
    out_path = argv[1]
    ms = [int(x) for x in argv[2:] if not x.startswith("--")] or DEFAULT_MS
    dtype = _bf16()
    rows = []
    stream = cupy.cuda.Stream(non_blocking=True)
    l2_bytes = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
    for m in ms:
        for k in KS:
            rng = cupy.random.default_rng(m + k)
            inputs = [(rng.standard_normal((m, k), dtype=cupy.float32).astype(dtype),
                       rng.standard_normal((k, N), dtype=cupy.float32).astype(dtype),
                       cupy.empty((m, N), dtype))
                      for _ in range(input_set_count(m, N, k, l2_bytes))]
            a, b, c = inputs[0]
            ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
            c.fill(cupy.nan)
            hopmm.matmul(a, b, out=c)
            err = float(cupy.linalg.norm(c.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
            assert err < MAX_REL_ERR, (m, k, err)
            contestants = {"hopmm": lambda a, b, c: hopmm.matmul(a, b, out=c),
                           "cupy": lambda a, b, c: cupy.matmul(a, b)}
            graph = graph_of(contestants["hopmm"], inputs, stream)
            if graph is not None:
                contestants["hopmm_graph"] = lambda a, b, c, g=graph: g.launch(stream)
            with stream:
                seconds = interleaved_medians(contestants, inputs, ROUNDS, WARMUP_S)
            per_call = {name: s * 1e6 / (GRAPH_CALLS if name.endswith("_graph") else 1)
                        for name, s in seconds.items()}
            mbytes = (m * k + k * N + m * N) * 2 / 1e6
            rows.append(dict(m=m, n=N, k=k, mbytes=mbytes, us=per_call))
            print(f"{m}x{N}x{k} {mbytes:7.1f} MB  " + "  ".join(
                f"{name} {t:7.2f}" for name, t in per_call.items()), flush=True)
    fits = {}
    for m in ms:
        sub = [r for r in rows if r["m"] == m]
        x = np.array([[1.0, r["mbytes"]] for r in sub])
        for name in sub[0]["us"]:
            y = np.array([r["us"].get(name, np.nan) for r in sub])
            if np.isnan(y).any():
                continue
            (fixed, per_mb), *_ = np.linalg.lstsq(x, y, rcond=None)
            fits[f"{m} {name}"] = dict(fixed_us=fixed, tbps=1 / per_mb)
            print(f"M {m} {name:12s} fixed {fixed:5.2f} us  rate {1 / per_mb:5.2f} TB/s")
    with open(out_path, "w") as f:
        json.dump(dict(rows=rows, fits=fits), f, indent=1)


if __name__ == "__main__":
    main(sys.argv)

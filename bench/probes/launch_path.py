#!/usr/bin/env python3
"""A probe, not part of hopmm: where a short call's fixed cost lies (bench/NOTES.md v0.62: tall
products of 64 columns cost ~6 us a call besides their stream, cuBLAS ~2; a CUDA graph of the
same calls saves 0.4-2.7 us a call). The same plan is timed

  api          hopmm.matmul(a, b, out=c)
  launches     its launches alone (launch.launch_all, as the API's cached plan makes them)
  plain        the same launches without programmatic dependent launch
  api_graph    a CUDA graph of GRAPH_CALLS API calls, replayed (per call)
  plain_graph  a CUDA graph of GRAPH_CALLS plain launches, replayed (per call)
  cupy, torch  cuBLAS

    python bench/probes/launch_path.py OUT.json [MxNxK ...]

bf16, two input sets, interleaved rounds, medians; every contestant's result is checked
against cupy.matmul in fp32 with the output poisoned first.
"""
import os
import sys

import cupy

import hopmm
from hopmm import heuristics, launch
from hopmm.device import query
from hopmm.timing import interleaved_medians

from contestants import cublas_contestants, drop_wrong, kernel_calls, launch_run, report
from fixed_cost import GRAPH_CALLS, graph_of

DEFAULT_SHAPES = ("10624x64x3904 5312x64x4864 10624x64x64 5312x64x64 4160x128x4736 "
                  "11328x128x2624 2048x2048x2048 1024x1024x1024").split()
DTYPE = "bfloat16"
INPUT_SETS = 2
ROUNDS = 5
WARMUP_S = 0.1
MAX_REL_ERR = 2e-2


def _rand(shape):
    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(DTYPE)


def _launch_runs(a, b, c, programmatic: bool):
    """A function of the input set's index launching the heuristic's plan for (a[i], b[i])
    into c, with or without programmatic dependent launch (read when launches are built)."""
    calls = kernel_calls(a, b)
    choice = heuristics.choose(calls[0].problem, query(cupy.cuda.Device().id))
    saved = os.environ.get(launch.PDL_ENV)
    os.environ[launch.PDL_ENV] = "1" if programmatic else "0"
    try:
        return launch_run(choice, calls, c)
    finally:
        if saved is None:
            del os.environ[launch.PDL_ENV]
        else:
            os.environ[launch.PDL_ENV] = saved


def probe(m: int, n: int, k: int, stream) -> dict:
    a = [_rand((m, k)) for _ in range(INPUT_SETS)]
    b = [_rand((k, n)) for _ in range(INPUT_SETS)]
    c = cupy.empty((m, n), DTYPE)
    runs = {"api": lambda i: hopmm.matmul(a[i], b[i], out=c),
            "launches": _launch_runs(a, b, c, programmatic=True),
            "plain": _launch_runs(a, b, c, programmatic=False)}
    errors = drop_wrong(runs, a[0], b[0], c, MAX_REL_ERR)
    sets = [(i,) for i in range(INPUT_SETS)]
    # Captured on a side stream (the legacy stream cannot capture), replayed on the current
    # one, where every contestant is timed (torch's current stream is the same).
    graphs = {f"{name}_graph": graph_of(runs[name], sets, stream) for name in ("api", "plain")
              if name in runs}
    contestants = dict(runs)
    contestants.update({name: (lambda i, g=g: g.launch())
                        for name, g in graphs.items() if g is not None})
    contestants.update(cublas_contestants(a, b, out=c))
    seconds = interleaved_medians(contestants, sets, ROUNDS, WARMUP_S)
    us = {name: s * 1e6 / (GRAPH_CALLS if name.endswith("_graph") else 1)
          for name, s in seconds.items()}
    return dict(shape=[m, n, k], us=us, errors=errors,
                plan=str(hopmm.explain(a[0], b[0])).splitlines()[4:7])


def main(argv) -> int:
    out_path, shapes = argv[0], argv[1:] or DEFAULT_SHAPES
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for text in shapes:
        m, n, k = map(int, text.split("x"))
        report(text, probe(m, n, k, stream), rows, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

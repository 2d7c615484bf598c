#!/usr/bin/env python3
"""A probe, not part of hopmm: where programmatic dependent launch pays and where it costs, on
back-to-back calls of one plan (bench/NOTES.md v0.64: 10624 x 64 x 3904 ran 29.5 us a call
with it, 25.2 without). For each product the heuristic's plan is launched with and without it
(launch_path.py's "launches" and "plain"), beside cuBLAS.

    python bench/probes/pdl_grid.py OUT.json [--trigger-at-exit] [MxNxK ...]

--trigger-at-exit renders the kernels without any call of griddepcontrol.launch_dependents
(before v0.64 each tile kernel's producer issued it after its last load, and gemv before its
store; since, none does, and the option changes nothing), so the next kernel is scheduled as
the CTAs exit (run it in a process of its own: kernels are compiled once a process).
"""
import re
import sys

import cupy

import hopmm
from hopmm import render
from hopmm.timing import interleaved_medians

from contestants import cublas_contestants, drop_wrong, report
from launch_path import INPUT_SETS, MAX_REL_ERR, ROUNDS, WARMUP_S, _launch_runs, _rand

DEFAULT_SHAPES = [f"{m}x{n}x{k}" for n, ms in ((16, (4224, 10624, 16896)),
                                                (64, (4224, 7424, 10624, 16896, 33792)),
                                                (128, (4224, 10624, 16896, 33792)),
                                                (256, (2112, 5312, 8448)))
                  for m in ms for k in (704, 3904, 12288)] + [
    "2048x2048x2048", "4096x4096x4096", "8192x8192x1024"]


def probe(m: int, n: int, k: int) -> dict:
    a = [_rand((m, k)) for _ in range(INPUT_SETS)]
    b = [_rand((k, n)) for _ in range(INPUT_SETS)]
    c = cupy.empty((m, n), a[0].dtype)
    runs = {"pdl": _launch_runs(a, b, c, programmatic=True),
            "plain": _launch_runs(a, b, c, programmatic=False)}
    errors = drop_wrong(runs, a[0], b[0], c, MAX_REL_ERR)
    contestants = dict(runs)
    contestants.update(cublas_contestants(a, b, out=c))
    seconds = interleaved_medians(contestants, [(i,) for i in range(INPUT_SETS)], ROUNDS,
                                  WARMUP_S)
    plan = {line.split(": ", 1)[0]: line.split(": ", 1)[1]
            for line in str(hopmm.explain(a[0], b[0])).splitlines() if ": " in line}
    return dict(shape=[m, n, k], us={name: s * 1e6 for name, s in seconds.items()},
                errors=errors, kernel=plan.get("kernel"), grid=plan.get("grid", "")[:40])


TRIGGER = re.compile(r"\bgrid_launch_dependents\(\);")


def trigger_at_exit() -> None:
    """Every snippet read from now on without a call of the trigger."""
    read = render.read_snippet
    render.read_snippet = lambda name: TRIGGER.sub("", read(name))


def main(argv) -> int:
    if "--trigger-at-exit" in argv:
        argv = [x for x in argv if x != "--trigger-at-exit"]
        trigger_at_exit()
    out_path, shapes = argv[0], argv[1:] or DEFAULT_SHAPES
    rows = []
    for text in shapes:
        m, n, k = map(int, text.split("x"))
        row = probe(m, n, k)
        report(f"{text} {row['kernel']} {row['grid']}", row, rows, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Host cost of a cached hopmm.matmul call with cupy operands and with torch operands (the
same memory through DLPack), beside torch.matmul's, on a small problem where the host's
cost dominates.

    python bench/torch_host_cost.py [--m M --n N --k K] [--calls C] [--dtype bf16|fp16]

Prints, per contestant, the microseconds the host takes to issue one call (a batch of
--calls calls timed on the host clock, best of ROUNDS rounds, the contestants interleaved
round by round so that a host that slows down or speeds up mid-run moves them all alike; the
GPU synchronised between batches only). Issue 19's target for torch operands is 12 us, like a
plain call, for plain and fused calls (here bias + relu, and a residual added in place) alike;
the last two rows read a weight and bias that are Parameters, under no_grad, as a model's are.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The best of many short batches: the host's cost without scheduler noise, and no batch long
# enough to fill the launch queue (the GPU's time would then set the pace).
ROUNDS = 40


def issue_us(fns: list, calls: int, sync) -> list[float]:
    """Microseconds per call of each of `fns`: the best of ROUNDS batches of `calls` calls,
    the functions taking turns batch by batch."""
    for fn in fns:
        fn()   # compiled, loaded and remembered before the timing
    sync()
    best = [float("inf")] * len(fns)
    for _ in range(ROUNDS):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], time.perf_counter() - start)
            sync()
    return [x / calls * 1e6 for x in best]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=256)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    args = p.parse_args(argv)
    import torch

    import hopmm
    from hopmm import interop

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    a = torch.randn(args.m, args.k, device="cuda").to(dtype)
    b = torch.randn(args.k, args.n, device="cuda").to(dtype)
    out = torch.empty(args.m, args.n, device="cuda", dtype=dtype)
    import cupy

    bias = torch.randn(args.n, device="cuda").to(dtype)
    ca, cb, cout, cbias = (interop.tensor_to_cupy(x, torch, cupy) for x in (a, b, out, bias))
    F = torch.nn.functional
    sync = torch.cuda.synchronize
    rows = [("hopmm, cupy operands", lambda: hopmm.matmul(ca, cb)),
            ("hopmm, cupy operands, out=", lambda: hopmm.matmul(ca, cb, out=cout)),
            ("hopmm, torch operands", lambda: hopmm.matmul(a, b)),
            ("hopmm, torch operands, out=", lambda: hopmm.matmul(a, b, out=out)),
            ("torch.matmul", lambda: torch.matmul(a, b)),
            ("torch.matmul, out=", lambda: torch.matmul(a, b, out=out)),
            ("hopmm bias+relu, cupy", lambda: hopmm.matmul(ca, cb, bias=cbias,
                                                           activation="relu")),
            ("hopmm bias+relu, torch", lambda: hopmm.matmul(a, b, bias=bias, activation="relu")),
            ("torch relu(addmm)", lambda: F.relu(torch.addmm(bias, a, b))),
            ("hopmm out += a @ b, torch", lambda: hopmm.matmul(a, b, c=out, beta=1.0, out=out)),
            ("torch out.addmm_(a, b)", lambda: out.addmm_(a, b))]
    # A model's weight and bias are Parameters (they require grad): read under no_grad, each
    # call of both contestants entering it.
    wp, bp = torch.nn.Parameter(b.clone()), torch.nn.Parameter(bias.clone())
    no_grad = torch.no_grad()

    def under_no_grad(fn):
        def call():
            with no_grad:
                return fn()
        return call

    rows += [("hopmm bias+relu, Parameters", under_no_grad(
                 lambda: hopmm.matmul(a, wp, bias=bp, activation="relu"))),
             ("torch relu(addmm), Parameters", under_no_grad(
                 lambda: F.relu(torch.addmm(bp, a, wp))))]
    print(f"{args.m} x {args.n} x {args.k} {args.dtype}, {args.calls} calls per round, "
          f"best of {ROUNDS}")
    for (name, _), us in zip(rows, issue_us([fn for _, fn in rows], args.calls, sync)):
        print(f"{name:30s} {us:7.1f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

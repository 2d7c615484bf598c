#!/usr/bin/env python3
"""Fuzz hopmm.matmul against cupy.matmul on the GPU, over seeded cases (tests/fuzz_cases.py).

    python bench/fuzz.py [--seed S] [--count N] [--start I] [--max-dim D] [--budget-s T]
                         [--no-torch] [--show N]

Each case is drawn from (seed, index) alone: shapes (0-sized and 1-D included), dtypes,
transposes, slices, negative strides, offsets, broadcast batches, `out=` forms and bad
operands; and torch-operand cases (every other one on a non-default torch stream; skipped
without CUDA torch or with --no-torch: case i is the same case on every machine). Operands hold fresh standard-normal values; a float `out` is
poisoned with NaN.

Per case, cupy.matmul runs first on the same arguments; `out` (when there is one) is then
restored from its snapshot and hopmm.matmul runs. They agree when
- both raise, with the same exception type (a subclass counts as its builtin base), and
  hopmm left `out` exactly as it was;
- both return: hopmm's result has cupy's shape and dtype, is `out` when one was given, holds
  no NaN, and is within the foundation's tolerance (tests/forced.py's TOL, relative Frobenius
  error) of an fp32 product of the operands taken before either call;
- or cupy takes a 2-D `out` of the result's size in another shape, which numpy and hopmm
  refuse with a ValueError (counted as "cupy lax", never a mismatch);
- or cupy cannot compute it (CuPy 14 has no batched bfloat16 matmul) and hopmm's result
  passes the checks above against the fp32 product ("cupy cannot").
Torch cases must give a torch tensor (`out` itself when given) within the same tolerance.

Prints one line per category as soon as its cases are done (and for the rest at the end),
then a table and the first --show mismatches. Exit status 1 on any mismatch. --budget-s stops
drawing new cases once that many seconds have passed (the summary covers those run).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
import fuzz_cases  # noqa: E402
from forced import TOL as KERNEL_TOL  # noqa: E402

# Relative Frobenius error allowed per operand dtype: the foundation's for half precision;
# float32 operands go to cupy.matmul itself (only summation order may differ).
TOL = {**KERNEL_TOL, "float32": 1e-5}
OUTCOMES = ("same result", "same error", "cupy lax", "cupy cannot", "mismatch", "skipped")
# CuPy 14's batched matmul has no bfloat16 path: it raises this TypeError where hopmm computes
# the product. Such cases are checked against the fp32 product alone ("cupy cannot").
CUPY_NO_BF16_BATCH = "data type 'E' not understood"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--start", type=int, default=0, help="index of the first case")
    p.add_argument("--max-dim", type=int, default=600, help="largest m, n or k drawn")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="stop drawing cases after this many seconds")
    p.add_argument("--no-torch", action="store_true", help="leave torch-operand cases out")
    p.add_argument("--show", type=int, default=20, help="mismatches printed in full")
    return p.parse_args(argv)


class GpuMaker(fuzz_cases.ArrayMaker):
    """Buffers of fresh standard-normal values (zeros for integer dtypes) on the GPU."""

    def __init__(self):
        import cupy
        import ml_dtypes
        import numpy

        def flat(n, dtype):
            dt = numpy.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else numpy.dtype(dtype)
            if dt.kind != "f":
                return cupy.zeros(n, dt)
            return cupy.random.standard_normal(n, dtype=cupy.float32).astype(dt)

        super().__init__(flat, cupy, numpy)


def _is_array(x, cupy) -> bool:
    return isinstance(x, cupy.ndarray)


def _floating(x) -> bool:
    """A floating-point array: bfloat16 (ml_dtypes, dtype kind 'V') included."""
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"


def _fp32_reference(a, b, cupy):
    """The product in fp32 of two valid cupy operands, or None where there is none."""
    if not (_is_array(a, cupy) and _is_array(b, cupy)) or a.ndim == 0 or b.ndim == 0:
        return None
    if not (_floating(a) and _floating(b)):
        return None
    try:
        return cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    except ValueError:
        return None


def _rel_err(got32, ref, cupy) -> float:
    """Relative Frobenius error of a non-empty fp32 result against the fp32 reference."""
    denom = float(cupy.linalg.norm(ref))
    return float(cupy.linalg.norm(got32 - ref)) / (denom or 1.0)


def _tolerance(a, b) -> float:
    return max(TOL.get(a.dtype.name, TOL["float32"]), TOL.get(b.dtype.name, TOL["float32"]))


def _same_bytes(x, snapshot, cupy) -> bool:
    return bool((cupy.ascontiguousarray(x).view(cupy.uint8).ravel()
                 == snapshot.view(cupy.uint8).ravel()).all())


def _call(fn, a, b, out):
    try:
        return (fn(a, b) if out is None else fn(a, b, out=out)), None
    except Exception as exc:   # every exception is an outcome to compare
        return None, exc


def run_cupy_case(c: fuzz_cases.Case, maker: GpuMaker, hopmm) -> tuple[str, str]:
    """(outcome, detail) of one case with cupy operands."""
    cupy = maker.cupy
    a, b, out = fuzz_cases.build(c, maker)
    out_is_array = _is_array(out, cupy)
    if out_is_array and out.dtype.kind == "f" and c.out != "alias_a":
        out[...] = cupy.nan
    ref32 = _fp32_reference(a, b, cupy)
    snapshot = out.copy() if out_is_array else None
    expected, cupy_exc = _call(cupy.matmul, a, b, out)
    if out_is_array:
        out[...] = snapshot   # (out may be a itself: a is restored too)
    got, hopmm_exc = _call(hopmm.matmul, a, b, out)
    cupy.cuda.get_current_stream().synchronize()
    if _cupy_cannot(cupy_exc, ref32) and hopmm_exc is None:
        return _cannot_outcome(_compare_results(c, a, b, out, got, _like(ref32, a, cupy),
                                                ref32, cupy))
    if cupy_exc is not None or hopmm_exc is not None:
        if cupy_exc is None and fuzz_cases.cupy_lax(c) and isinstance(hopmm_exc, ValueError):
            return "cupy lax", ""
        kinds = (fuzz_cases.error_kind(cupy_exc) if cupy_exc else "returned",
                 fuzz_cases.error_kind(hopmm_exc) if hopmm_exc else "returned")
        if kinds[0] != kinds[1]:
            return "mismatch", (f"cupy {kinds[0]}: {cupy_exc}; hopmm {kinds[1]}: "
                                f"{hopmm_exc}")
        if out_is_array and not _same_bytes(out, snapshot, cupy):
            return "mismatch", f"hopmm raised {kinds[1]} ({hopmm_exc}) and changed out"
        return "same error", kinds[0]
    return _compare_results(c, a, b, out, got, expected, ref32, cupy)


def _cupy_cannot(exc, ref32) -> bool:
    return (isinstance(exc, TypeError) and CUPY_NO_BF16_BATCH in str(exc)
            and ref32 is not None)


def _like(ref32, a, cupy):
    """What cupy.matmul would have returned: the product's shape in the operands' dtype."""
    return cupy.empty(ref32.shape, a.dtype)


def _cannot_outcome(result: tuple[str, str]) -> tuple[str, str]:
    return ("cupy cannot", "") if result[0] == "same result" else result


def _compare_results(c, a, b, out, got, expected, ref32, cupy) -> tuple[str, str]:
    if not _is_array(got, cupy):
        return "mismatch", f"hopmm returned {type(got).__name__}"
    if out is not None and got is not out:
        return "mismatch", "hopmm did not return out"
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return "mismatch", (f"hopmm {got.shape} {got.dtype}, cupy {expected.shape} "
                            f"{expected.dtype}")
    if ref32 is None or got.size == 0:
        return "same result", ""
    got32 = got.astype(cupy.float32)
    if bool(cupy.isnan(got32).any()):
        return "mismatch", "NaN in hopmm's result (an element left unwritten?)"
    err = _rel_err(got32, ref32, cupy)
    if err >= _tolerance(a, b):
        return "mismatch", f"relative error {err:.2e} >= {_tolerance(a, b):.0e}"
    return "same result", ""


def run_torch_case(c: fuzz_cases.Case, maker: GpuMaker, hopmm, torch,
                   stream) -> tuple[str, str]:
    """(outcome, detail) of a torch-operand case, on `stream` (None: the current one)."""
    from hopmm import interop

    cupy = maker.cupy
    a, b, out = fuzz_cases.build(c, maker)
    if out is not None:
        out[...] = cupy.nan
    ref32 = _fp32_reference(a, b, cupy)
    expected, cupy_exc = _call(cupy.matmul, a, b, None)
    cannot = _cupy_cannot(cupy_exc, ref32)
    if cannot:
        expected = _like(ref32, a, cupy)
    elif cupy_exc is not None:
        raise cupy_exc
    ta, tb = (interop.cupy_to_tensor(x, torch, cupy) for x in (a, b))
    tout = None if out is None else interop.cupy_to_tensor(out, torch, cupy)
    torch.cuda.synchronize()
    if stream is None:
        got, exc = _call(hopmm.matmul, ta, tb, tout)
    else:
        with torch.cuda.stream(stream):
            got, exc = _call(hopmm.matmul, ta, tb, tout)
        stream.synchronize()
    if exc is not None:
        return "mismatch", f"hopmm raised {type(exc).__name__}: {exc}"
    if not isinstance(got, torch.Tensor) or (tout is not None and got is not tout):
        return "mismatch", f"hopmm returned {type(got).__name__}, not the torch result"
    result = _compare_results(c, a, b, out, interop.tensor_to_cupy(got, torch, cupy) if
                              tout is None else out, expected, ref32, cupy)
    return _cannot_outcome(result) if cannot else result


def _torch_or_none(no_torch: bool):
    if no_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy

    import hopmm

    torch = _torch_or_none(args.no_torch)
    maker = GpuMaker()
    cupy.random.seed(args.seed)
    stream = torch.cuda.Stream() if torch is not None else None
    tally = defaultdict(Counter)   # category -> Counter of outcomes
    details = []
    started = time.monotonic()
    ran = 0
    print(f"fuzz: seed {args.seed}, cases {args.start}..{args.start + args.count - 1}, "
          f"max dim {args.max_dim}, torch {'yes' if torch is not None else 'no'}", flush=True)
    for i in range(args.start, args.start + args.count):
        if time.monotonic() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent after {ran} cases", flush=True)
            break
        c = fuzz_cases.case(args.seed, i, args.max_dim)
        if c.torch and torch is None:
            tally[c.category]["skipped"] += 1
            continue
        try:
            if c.torch:
                outcome, detail = run_torch_case(c, maker, hopmm, torch,
                                                 stream if i % 2 else None)
            else:
                outcome, detail = run_cupy_case(c, maker, hopmm)
        except Exception as exc:   # the harness itself failed on this case: a mismatch
            outcome, detail = "mismatch", f"harness: {type(exc).__name__}: {exc}"
        tally[c.category][outcome] += 1
        if outcome == "mismatch":
            details.append((c, detail))
        ran += 1
    for category in fuzz_cases.CATEGORIES:
        if tally[category]:
            counts = ", ".join(f"{tally[category][o]} {o}" for o in OUTCOMES
                               if tally[category][o])
            print(f"{category}: {sum(tally[category].values())} cases: {counts}")
    print_table(tally)
    for c, detail in details[:args.show]:
        print(f"MISMATCH case {c.index} ({c.category}): {detail}\n    {c}")
    print(f"{ran} cases in {time.monotonic() - started:.0f} s, {len(details)} mismatches")
    return 1 if details else 0


def print_table(tally) -> None:
    header = ("category", "cases") + OUTCOMES
    rows = [(cat, sum(t.values())) + tuple(t[o] for o in OUTCOMES)
            for cat, t in ((cat, tally[cat]) for cat in fuzz_cases.CATEGORIES) if t]
    total = Counter()
    for t in tally.values():
        total.update(t)
    rows.append(("total", sum(total.values())) + tuple(total[o] for o in OUTCOMES))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(v).rjust(w) if j else str(v).ljust(w)
                        for j, (v, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    sys.exit(main())

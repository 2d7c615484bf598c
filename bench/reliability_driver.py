"""The small program bench/reliability.py runs in its child processes (alone, under
compute-sanitizer, several at once on one cache): products of the given shapes through
hopmm.matmul, each called CALLS times (a first call, then repeats through the remembered
launches) and checked against a float32 product computed on the host, or autotune runs.

    python bench/reliability_driver.py [--schedule NAME] [--autotune] SHAPE [SHAPE ...]

A SHAPE is MxNxK followed by any of ":b<batch>", ":ta" (A stored transposed), ":tb",
":pitch" (operands are views with an odd row pitch), ":fp16" (else bfloat16), ":fused"
(through the fused epilogue: FUSED_ACTIVATION(FUSED_ALPHA * a @ b + FUSED_BETA * c + bias),
bias of shape (N,), c of the result's shape, against the same chain on the host). With a
shared-A schedule forced (shared_a, swiglu), each case is that function's call on a second B
of B's shape (N rounded up to whole 16-byte rows, which its kernel stores), ":fused" applying
FUSED_ACTIVATION to shared_a's products (swiglu's gating is its only epilogue: its ":fused"
cases run as the others). The last line printed is a JSON summary: cases
checked, failures, the compiles this process ran and the kernels it holds. Exit status 1 if
any product was wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

# Extra elements at the end of each row of an operand made with ":pitch": an odd count, so
# the view's row pitch is no multiple of 16 bytes and hopmm must handle the unaligned rows.
ODD_PITCH_PAD = 3
# ‖hopmm − ref‖ / ‖ref‖ a correct fp32-accumulating kernel stays under (tests/forced.py).
TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3}
SEED = 20
# Calls of each product: the first plans it, the second repeats it (fastpath).
CALLS = 2
# The chain a ":fused" case applies: every operand of the epilogue read (bias and c), scalars
# that are not 1, and an activation the host computes exactly.
FUSED_ALPHA, FUSED_BETA, FUSED_ACTIVATION = 0.5, 2.0, "relu"


@dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    batch: int = 0            # 0: plain matrices; else a leading batch dimension
    trans_a: bool = False
    trans_b: bool = False
    odd_pitch: bool = False
    dtype: str = "bfloat16"
    fused: bool = False

    @classmethod
    def parse(cls, spec: str) -> "Case":
        dims, *flags = spec.split(":")
        m, n, k = (int(x) for x in dims.lower().split("x"))
        fields = {}
        for flag in flags:
            if flag.startswith("b") and flag[1:].isdigit():
                fields["batch"] = int(flag[1:])
            elif flag in ("ta", "tb"):
                fields["trans_" + flag[1]] = True
            elif flag == "pitch":
                fields["odd_pitch"] = True
            elif flag == "fp16":
                fields["dtype"] = "float16"
            elif flag == "fused":
                fields["fused"] = True
            else:
                raise ValueError(f"unknown flag {flag!r} in shape {spec!r}")
        return cls(m, n, k, **fields)

    def spec(self) -> str:
        flags = ([f"b{self.batch}"] if self.batch else []) + (["ta"] if self.trans_a else []) \
            + (["tb"] if self.trans_b else []) + (["pitch"] if self.odd_pitch else []) \
            + (["fp16"] if self.dtype == "float16" else []) + (["fused"] if self.fused else [])
        return ":".join([f"{self.m}x{self.n}x{self.k}", *flags])


def operand(rng, rows: int, cols: int, batch: int, transposed: bool, odd_pitch: bool,
            dtype: str):
    """A (batch..., rows, cols) operand on the GPU, stored transposed or with an odd row
    pitch as asked; made on the host so that no random-number kernel runs on the device."""
    import cupy

    lead = (batch,) if batch else ()
    stored = (cols, rows) if transposed else (rows, cols)
    pad = ODD_PITCH_PAD if odd_pitch else 0
    host = rng.standard_normal(lead + (stored[0], stored[1] + pad)).astype("float32")
    x = cupy.asarray(host).astype(dtype)[..., :stored[1]]
    return x.swapaxes(-1, -2) if transposed else x


def reference(a, b, bias=None, c=None):
    """The product of float32 host arrays a and b, through the ":fused" chain where bias and c
    are given."""
    import numpy

    ref = numpy.matmul(a, b)
    if bias is None:
        return ref
    return host_activation(FUSED_ALPHA * ref + FUSED_BETA * c + bias)


def host_activation(x):
    """FUSED_ACTIVATION on a float32 host array."""
    import numpy

    return {"relu": lambda v: numpy.maximum(v, 0.0)}[FUSED_ACTIVATION](x)


def rel_err(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ of float32 host arrays; inf where out has the wrong shape or a
    non-finite value."""
    import numpy

    if out.shape != ref.shape or not numpy.isfinite(out).all():
        return float("inf")
    denom = float(numpy.linalg.norm(ref)) or 1.0
    return float(numpy.linalg.norm(out - ref)) / denom


def ran_schedule(a, b) -> str | None:
    """The schedule hopmm.explain says the product of a and b runs on (None: no kernel)."""
    import hopmm

    prefix = "schedule: "
    return next((line[len(prefix):] for line in hopmm.explain(a, b).splitlines()
                 if line.startswith(prefix)), None)


# Elements of a 16-byte row: the shared-A kernels store only such rows (hopmm/shared_a.py).
ROW_ALIGN_ELEMS = 8


def check_shared_a(case: Case, rng, schedule: str) -> float:
    """The relative error of hopmm.swiglu or hopmm.matmul_shared_a (both products) on the
    forced one-kernel path; ValueError where that path was not taken."""
    import numpy

    import hopmm
    from hopmm import api, shared_a
    from hopmm.schedules import DUAL_B_SCHEDULES

    n = case.n + (-case.n) % ROW_ALIGN_ELEMS
    a = operand(rng, case.m, case.k, case.batch, case.trans_a, case.odd_pitch, case.dtype)
    b0, b1 = (operand(rng, case.k, n, case.batch, case.trans_b, case.odd_pitch, case.dtype)
              for _ in range(2))
    activation = FUSED_ACTIVATION if case.fused and schedule == "shared_a" else None
    plans = [api.plan(a, b, activation=activation) for b in (b0, b1)]
    checked = shared_a._Checked(plans, activation, [None, None])
    if not shared_a._one_kernel(DUAL_B_SCHEDULES[schedule], a, b0, b1, checked, 0):
        raise ValueError(f"{schedule}'s one-kernel path does not take this case")
    host_a, host_b0, host_b1 = (x.astype("float32").get() for x in (a, b0, b1))
    p0, p1 = numpy.matmul(host_a, host_b0), numpy.matmul(host_a, host_b1)
    if schedule == "swiglu":
        got = hopmm.swiglu(a, b0, b1).astype("float32").get()
        return rel_err(got, p0 / (1 + numpy.exp(-p0)) * p1)
    got = numpy.stack([y.astype("float32").get()
                       for y in hopmm.matmul_shared_a(a, [b0, b1], activation=activation)])
    ref = numpy.stack([p0, p1])
    return rel_err(got, host_activation(ref) if activation else ref)


def check(case: Case, rng, schedule: str | None) -> float:
    """The relative error of hopmm's product; ValueError where a forced schedule did not
    run."""
    import hopmm
    from hopmm.schedules import DUAL_B_SCHEDULES

    if schedule in DUAL_B_SCHEDULES:
        return check_shared_a(case, rng, schedule)
    a = operand(rng, case.m, case.k, case.batch, case.trans_a, case.odd_pitch, case.dtype)
    b = operand(rng, case.k, case.n, case.batch, case.trans_b, case.odd_pitch, case.dtype)
    if schedule is not None and ran_schedule(a, b) != schedule:
        raise ValueError(f"ran on {ran_schedule(a, b)}, not the forced {schedule}")
    def host(x):   # float32 on the host (bfloat16 converted on the device)
        return x.astype("float32").get()

    # Twice: the first call plans and copies through cudaMemcpy2D, the second repeats through
    # the remembered launches (and the row-copy kernel, where operands or result are copied).
    if not case.fused:
        ref = reference(host(a), host(b))
        return max(rel_err(host(hopmm.matmul(a, b)), ref) for _ in range(CALLS))
    bias = operand(rng, 1, case.n, 0, False, False, case.dtype)[0]
    c = operand(rng, case.m, case.n, case.batch, False, False, case.dtype)
    ref = reference(host(a), host(b), host(bias), host(c))
    return max(rel_err(host(hopmm.matmul(a, b, bias=bias, c=c, alpha=FUSED_ALPHA,
                                         beta=FUSED_BETA, activation=FUSED_ACTIVATION)), ref)
               for _ in range(CALLS))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default=None, help="force this schedule")
    parser.add_argument("--autotune", action="store_true",
                        help="autotune the shapes (row-major, bfloat16) instead")
    parser.add_argument("shapes", nargs="+")
    args = parser.parse_args(argv)
    cases = [Case.parse(s) for s in args.shapes]

    import numpy

    import hopmm
    from hopmm import compile as compiler

    failures = 0
    if args.autotune:
        rows = hopmm.autotune([(c.m, c.n, c.k) for c in cases], warmup_s=0.05, rounds=2,
                              input_sets=1)
        print(f"autotuned {len(rows)} shapes: {[r['best'] for r in rows]}")
    else:
        os.environ.setdefault("HOPMM_STRICT", "1")   # a fallback to cupy.matmul is a failure
        hopmm.use_schedule(args.schedule)
        rng = numpy.random.default_rng(SEED)
        for case in cases:
            try:
                err = check(case, rng, args.schedule)
            except Exception as exc:   # reported and counted: the summary must come out
                print(f"{case.spec()}: ERROR {type(exc).__name__}: {exc}")
                failures += 1
                continue
            ok = err < TOLERANCE[case.dtype]
            failures += not ok
            print(f"{case.spec()}: {'ok' if ok else 'WRONG'} rel err {err:.2e}")
    print(json.dumps({"cases": len(cases), "failures": failures,
                      "compiles": compiler.compile_count, "kernels": len(compiler._compiled)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

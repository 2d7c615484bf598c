"""Fused epilogues against the unfused ways of computing them (issue 19's targets), on the GPU:

    python3 bench/fused.py [--rounds 7] [--dtypes bf16,fp16] [--quick] [--no-torch]
        [--cases 'swiglu,shared_a x2']

Cases: bias + relu and bias + gelu (hopmm.matmul(bias=, activation=) against torch's
`relu(addmm(bias, a, b))` and `F.gelu(F.linear(a, w, bias))`, and against cupy.matmul followed
by CuPy elementwise work), alpha/beta with c (against torch's `addmm(c, a, b, beta=, alpha=)`
and CuPy), hopmm.swiglu (against torch's `F.silu(a @ g) * (a @ u)`) and matmul_shared_a with
two Bs (against two torch.matmul calls), each both composed (hopmm's default) and on its
one-kernel schedule ("1-kernel": use_schedule's choice for the call). Contestants run interleaved round by round in a fresh order each round, on rotating
input sets that exceed L2 (hopmm.timing, bench.py's input-set rule); the table gives median
microseconds and the speedup of hopmm over each baseline, and comes last. Each result is
checked against an fp32 reference before timing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402

BIAS_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 14336, 4096)]
C_SHAPES = [(4096, 4096, 4096), (8192, 8192, 1024)]
QUICK_SHAPES = [(4096, 4096, 4096)]
SWIGLU_SHAPES = [(4096, 14336, 4096), (16, 14336, 4096)]
SHARED_A_SHAPES = [(4096, 14336, 4096), (256, 14336, 4096)]
# Cases of two Bs (their input sets hold a, b and a second B in place of bias).
DUAL_CASES = ("swiglu", "shared_a x2")
ROUNDS = 7
WARMUP_S = 0.5
ALPHA, BETA = 0.5, 2.0
# Relative Frobenius error allowed against the fp32 reference (bf16 / fp16 outputs).
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}


def _inputs(cp, torch, m, n, k, dt, sets, dual=False):
    """Input sets (a, b, bias, c, and their torch views); with `dual`, a second B (k x n) in
    place of bias."""
    out = []
    # Weights scaled by 1/sqrt(k), as a layer's initialisation does: products of O(1), so
    # swiglu's gate * up stays inside fp16's range (unscaled, its tail overflows to inf).
    w_scale = k ** -0.5
    for _ in range(sets):
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(dt)
        b = (cp.random.standard_normal((k, n), dtype=cp.float32) * w_scale).astype(dt)
        bias = cp.random.standard_normal((k, n) if dual else (n,), dtype=cp.float32)
        bias = (bias * w_scale if dual else bias).astype(dt)
        c = cp.random.standard_normal((m, n), dtype=cp.float32).astype(dt)
        to_t = (lambda x: bench.to_torch(torch, x)) if torch else (lambda x: None)
        # torch's F.linear takes the weight as (n, k): the transposed view of b, no copy.
        out.append((a, b, bias, c, to_t(a), to_t(b), to_t(b.T), to_t(bias), to_t(c)))
    return out


def _cases(cp, torch):
    """{case: (hopmm fn, {baseline: fn}, reference fn)}; every fn takes one input set."""
    import hopmm
    from hopmm import epilogue

    F = torch.nn.functional if torch else None

    def gelu_cp(x):
        from cupyx.scipy.special import erf
        return 0.5 * x * (1 + erf(x * 0.7071067811865476))

    def ref(activation, with_c):
        def run(a, b, bias, c, *_):
            acc = cp.matmul(a.astype(cp.float32), b.astype(cp.float32))
            if with_c:
                return epilogue.reference(cp, acc, alpha=ALPHA, beta=BETA, c=c)
            return epilogue.reference(cp, acc, bias=bias, activation=activation)
        return run

    cases = {
        "bias+relu": (
            lambda a, b, bias, c, *_: hopmm.matmul(a, b, bias=bias, activation="relu"),
            {"torch relu(addmm)": lambda *s: torch.relu(torch.addmm(s[7], s[4], s[5])),
             "cupy matmul+ew": lambda a, b, bias, c, *_: cp.maximum(cp.matmul(a, b) + bias, 0)},
            ref("relu", False)),
        "bias+gelu": (
            lambda a, b, bias, c, *_: hopmm.matmul(a, b, bias=bias, activation="gelu"),
            {"torch gelu(linear)": lambda *s: F.gelu(F.linear(s[4], s[6], s[7])),
             "cupy matmul+ew": lambda a, b, bias, c, *_: gelu_cp(cp.matmul(a, b) + bias)},
            ref("gelu", False)),
        "alpha*ab+beta*c": (
            lambda a, b, bias, c, *_: hopmm.matmul(a, b, c=c, alpha=ALPHA, beta=BETA),
            {"torch addmm(c)": lambda *s: torch.addmm(s[8], s[4], s[5], beta=BETA, alpha=ALPHA),
             "cupy matmul+ew": lambda a, b, bias, c, *_: ALPHA * cp.matmul(a, b) + BETA * c},
            ref(None, True)),
    }
    from hopmm import api

    def one_kernel(name, fn):
        """fn with schedule `name` forced for its call (use_schedule without its clearing of
        remembered matmul launches, which the shared-A schedules do not use)."""
        def run(*s):
            before, api._schedule_override = api._schedule_override, name
            try:
                return fn(*s)
            finally:
                api._schedule_override = before
        return run

    def swiglu_ref(a, g, u, *_):
        f32 = [cp.matmul(a.astype(cp.float32), w.astype(cp.float32)) for w in (g, u)]
        return epilogue.activate(cp, f32[0], "silu") * f32[1]

    def pair_ref(a, b0, b1, *_):
        return cp.stack([cp.matmul(a.astype(cp.float32), w.astype(cp.float32))
                         for w in (b0, b1)])

    def swiglu(a, g, u, *_):
        return hopmm.swiglu(a, g, u)

    def pair(a, b0, b1, *_):
        return hopmm.matmul_shared_a(a, [b0, b1])

    cases["swiglu"] = (
        swiglu,
        {"hopmm 1-kernel": one_kernel("swiglu", swiglu),
         "torch silu(a@g)*(a@u)": lambda *s: F.silu(s[4] @ s[5]) * (s[4] @ s[7])},
        swiglu_ref)
    cases["shared_a x2"] = (
        pair,
        {"hopmm 1-kernel": one_kernel("shared_a", pair),
         "torch 2 x matmul": lambda *s: (torch.matmul(s[4], s[5]), torch.matmul(s[4], s[7]))},
        pair_ref)
    if torch is None:  # keep the CuPy baselines only
        for _, baselines, _ in cases.values():
            for name in [n for n in baselines if n.startswith("torch")]:
                del baselines[name]
    return cases


def _as_cupy(cp, torch, got):
    """A result as one cupy array (torch tensors through DLPack, lists stacked)."""
    if isinstance(got, (list, tuple)):
        return cp.stack([_as_cupy(cp, torch, x) for x in got])
    if torch is not None and isinstance(got, torch.Tensor):
        return cp.from_dlpack(got.float())
    return got


def _rel_err(cp, got, ref) -> float:
    return float(cp.linalg.norm(got.astype(cp.float32) - ref) / cp.linalg.norm(ref))


def run(args) -> list[dict]:
    import cupy as cp

    from hopmm import timing

    ctx = bench.Context(use_torch=not args.no_torch)
    torch = ctx.torch
    rows = []
    plan = [("bias+relu", s) for s in (QUICK_SHAPES if args.quick else BIAS_SHAPES)] + \
           [("bias+gelu", s) for s in (QUICK_SHAPES if args.quick else BIAS_SHAPES)] + \
           [("alpha*ab+beta*c", s) for s in (QUICK_SHAPES if args.quick else C_SHAPES)] + \
           [("swiglu", s) for s in SWIGLU_SHAPES[:1 if args.quick else None]] + \
           [("shared_a x2", s) for s in SHARED_A_SHAPES[:1 if args.quick else None]]
    if args.cases:
        plan = [(case, shape) for case, shape in plan if case in args.cases]
    for dtype in args.dtypes:
        dt = ctx.cupy_dtype(dtype)
        for case, (m, n, k) in plan:
            sets = bench.input_set_count(m, n, k, ctx.l2_bytes)
            inputs = _inputs(cp, torch, m, n, k, dt, sets, dual=case in DUAL_CASES)
            fused, baselines, reference = _cases(cp, torch)[case]
            ref = reference(*inputs[0])
            err = _rel_err(cp, _as_cupy(cp, torch, fused(*inputs[0])), ref)
            ok = err < TOLERANCE[dtype]
            for name, fn in baselines.items():
                got = _as_cupy(cp, torch, fn(*inputs[0]))
                base_err = _rel_err(cp, got, ref)
                if name.startswith("hopmm"):   # hopmm's other path: as checked as the first
                    ok = ok and base_err < TOLERANCE[dtype]
                if not base_err < 4 * TOLERANCE[dtype]:
                    print(f"warning: {name} {case} {m}x{n}x{k} {dtype}: rel err {base_err:.2e}")
            contestants = {"hopmm": fused, **baselines}
            medians = timing.interleaved_medians(contestants, inputs, args.rounds, WARMUP_S)
            row = {"case": case, "shape": f"{m}x{n}x{k}", "dtype": dtype,
                   "hopmm_us": medians["hopmm"] * 1e6, "rel_err": err, "ok": ok}
            for name in baselines:
                row[name] = medians[name] * 1e6
            rows.append(row)
            print(_row_line(row), flush=True)
    return rows


def _row_line(row: dict) -> str:
    base = [k for k in row if k not in ("case", "shape", "dtype", "hopmm_us", "rel_err", "ok")]
    cells = "  ".join(f"{b} {row[b]:8.1f} us ({row[b] / row['hopmm_us']:.2f}x)" for b in base)
    flag = "" if row["ok"] else "  WRONG"
    return (f"{row['case']:<16} {row['shape']:<18} {row['dtype']:<9} hopmm {row['hopmm_us']:8.1f} us"
            f"  {cells}  err {row['rel_err']:.1e}{flag}")


def format_table(rows: list[dict]) -> str:
    """The results as a markdown table: microseconds, and hopmm's speedup over each baseline
    (its time / hopmm's time)."""
    lines = ["| case | shape | dtype | hopmm us | baseline | baseline us | speedup |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        for name in [k for k in row if k not in ("case", "shape", "dtype", "hopmm_us",
                                                   "rel_err", "ok")]:
            lines.append(f"| {row['case']} | {row['shape']} | {row['dtype']} | "
                         f"{row['hopmm_us']:.1f}{'' if row['ok'] else ' WRONG'} | {name} | "
                         f"{row[name]:.1f} | {row[name] / row['hopmm_us']:.2f}x |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bf16", "fp16"])
    p.add_argument("--quick", action="store_true", help="4096^3 only")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--cases", type=lambda s: s.split(","), default=None,
                   help="only these cases, e.g. 'swiglu,shared_a x2' (default: all)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = run(args)
    print()
    print(format_table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

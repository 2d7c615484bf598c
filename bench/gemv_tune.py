#!/usr/bin/env python3
"""Decode shapes on the gemv schedule: each gemv variant (warps / columns / unroll / K
splits), the current choice of the heuristic, split_k_parallel (the choice before gemv) and
cupy.matmul / torch.matmul, timed interleaved (hopmm.timing: a new random order every round,
medians over the rounds) on rotating input sets larger than the L2; the copy bandwidth is
measured in the same run (a device-to-device copy, bytes read + written per second).

    python bench/gemv_tune.py [--dtype bf16] [--rounds 7] [--layouts k,n] [--quick]
                              [--json PATH] [--no-torch]

Per case it prints each contestant's time, GB/s (bytes of A, B and C once) and fraction of the
copy bandwidth, and its speed relative to the faster cuBLAS; a table of the cases comes last:
the best gemv variant, the heuristic's choice and split_k_parallel, each as a fraction of the
copy bandwidth and x best cuBLAS. The issue's target: >= 0.95 of the copy bandwidth and >=
1.05 x cuBLAS. Runtime on an H100: under 3 minutes, of which the first run compiles the
variants (cached afterwards).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

# (M, N, K): the decode shapes and a Llama-sized MLP / attention projection.
SHAPES = [(1, 8192, 8192), (2, 8192, 8192), (4, 8192, 8192), (8, 8192, 8192),
          (16, 8192, 8192), (16, 28672, 8192), (1, 4096, 4096), (4, 14336, 4096),
          (16, 14336, 4096)]
QUICK_SHAPES = [(1, 8192, 8192), (16, 8192, 8192), (16, 14336, 4096)]
# Variants beside the heuristic's config (GemvConfig.default): fields replaced, per B layout,
# for the CUDA-core loops and for the tensor-core loops (GemvConfig.mma; their "fma" variant
# is the CUDA-core loops' default at the same rows).
K_MAJOR_VARIANTS = [dict(unroll=1), dict(unroll=4), dict(cols=2, unroll=4), dict(cols=8, unroll=1),
                    dict(warps=4)]
N_MAJOR_VARIANTS = [dict(unroll=16), dict(warps=4), dict(warps=16)]
MMA_K_MAJOR_VARIANTS = [dict(unroll=2), dict(unroll=8), dict(warps=4),
                        dict(mma=False, cols=4, unroll=2)]
MMA_N_MAJOR_VARIANTS = [dict(unroll=2), dict(unroll=4), dict(warps=4), dict(warps=16),
                        dict(mma=False, cols=1, unroll=8)]


def variant_fields(cfg, b_major: str) -> list:
    """The variants of `cfg` to time (field replacements)."""
    if cfg.mma:
        return MMA_K_MAJOR_VARIANTS if b_major == "k" else MMA_N_MAJOR_VARIANTS
    return K_MAJOR_VARIANTS if b_major == "k" else N_MAJOR_VARIANTS
# Split counts tried beside the heuristic's: these multiples of it (and 1).
SPLIT_FACTORS = (0.5, 2)
COPY_BYTES = 512 * 2**20      # the copy-bandwidth probe: well past the L2
WARMUP_S = 0.3
DEFAULT_ROUNDS = 7
COMPILE_THREADS = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=sorted(bench.CUPY_DTYPE_NAMES))
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--layouts", default="k,n", help="B layouts: k (a weight as w.T), n")
    p.add_argument("--quick", action="store_true", help=f"only {QUICK_SHAPES}")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--no-torch", action="store_true")
    return p.parse_args(argv)


def copy_bandwidth(cp) -> float:
    """Bytes moved (read + written) per second by a device-to-device copy, median of rounds."""
    from hopmm import timing

    src = cp.empty(COPY_BYTES, dtype=cp.uint8)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream().ptr

    def copy():
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, COPY_BYTES,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream)
    t = timing.interleaved_medians({"copy": copy}, [()], DEFAULT_ROUNDS, WARMUP_S)["copy"]
    return 2 * COPY_BYTES / t


def operands(cp, dt, m, n, k, b_major, sets):
    """Rotating (A, B, C) sets: A row-major, B N-major or K-major (a transposed (N, K))."""
    out = []
    for _ in range(sets):
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(dt)
        b = (cp.random.standard_normal((k, n), dtype=cp.float32).astype(dt) if b_major == "n"
             else cp.random.standard_normal((n, k), dtype=cp.float32).astype(dt).T)
        out.append((a, b, cp.empty((m, n), dtype=dt)))
    return out


def kernel_runner(choice, a, b, c):
    """fn(a, b, c) launching `choice` directly on operands shaped like a, b, c (read in
    place: every size here is a multiple of 8)."""
    from hopmm import api, launch, layout

    shapes = layout.matmul_shapes(a.shape, b.shape)
    call = api._kernel_call(a, b, shapes)
    assert not call.copies, "the tuning shapes are read in place"
    launches = launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, c.reshape(1, *c.shape))
    return lambda a, b, c: launch.launch_all(launches, a.data.ptr, b.data.ptr, c.data.ptr)


def contestants_for(ctx, dev, sets, b_major):
    """{name: fn(a, b, c)}: gemv variants, the choice, split_k_parallel, cuBLAS twice."""
    from hopmm import api, heuristics, layout
    from hopmm.launch import KernelResourceError

    a, b, c = sets[0]
    problem = api._kernel_call(a, b, layout.matmul_shapes(a.shape, b.shape)).problem
    base = heuristics.choose(problem, dev, "gemv")
    variants = {}
    splits = sorted({base.splits, 1} | {max(1, round(base.splits * f)) for f in SPLIT_FACTORS})
    for s in splits:
        variants[f"gemv {base.config.tag} k{s}"] = dataclasses.replace(base, splits=s)
    for fields in variant_fields(base.config, b_major):
        try:
            cfg = dataclasses.replace(base.config, **fields)
        except ValueError:
            continue
        variants[f"gemv {cfg.tag} k{base.splits}"] = dataclasses.replace(base, config=cfg)
    out, notes = {}, []
    for name, choice in variants.items():
        try:
            out[name] = kernel_runner(choice, a, b, c)
        except (KernelResourceError, ValueError) as exc:   # a variant that spills or exceeds
            notes.append(f"{name}: skipped ({exc})")
    rival = heuristics.choose(problem, dev, epilogue=True)   # the choice gemv competes with
    out[f"{rival.schedule.name} k{rival.splits}"] = kernel_runner(rival, a, b, c)
    ctx.hopmm.use_schedule(None)
    out["choice"] = lambda a, b, c: ctx.hopmm.matmul(a, b, out=c)
    out["cupy"] = lambda a, b, c: ctx.cupy.matmul(a, b, out=c)
    if ctx.torch is not None:
        views = {id(x): bench.to_torch(ctx.torch, x) for s in sets for x in s}
        def as_torch(x):   # the rotating sets' views, or a view of a check's fresh C
            return views[id(x)] if id(x) in views else bench.to_torch(ctx.torch, x)

        out["torch"] = lambda a, b, c: ctx.torch.matmul(as_torch(a), as_torch(b),
                                                        out=as_torch(c))
    return out, notes, base


def precompile(dev, dt_name, layouts, shapes):
    """Compiles every variant's kernel in parallel threads (NVRTC), so timing starts warm."""
    from hopmm import compile as compiler
    from hopmm import heuristics
    from hopmm.problem import Problem
    from hopmm.schedules import GemvSchedule

    cfgs = set()
    for (m, n, k), b_major in ((s, l) for s in shapes for l in layouts):
        base = heuristics.choose(Problem(m, n, k, 1, dt_name, b_major=b_major), dev, "gemv").config
        cfgs.add(base)
        for fields in variant_fields(base, b_major):
            try:
                cfgs.add(dataclasses.replace(base, **fields))
            except ValueError:
                pass
    cfgs = sorted(cfgs, key=lambda cfg: cfg.tag)
    build = lambda cfg: compiler.compile_kernel(GemvSchedule.render(cfg))  # noqa: E731
    build(cfgs[0])   # loads NVRTC once before the threads share it
    with ThreadPoolExecutor(COMPILE_THREADS) as pool:
        list(pool.map(build, cfgs[1:]))


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = bench.Context(use_torch=not args.no_torch)
    cp = ctx.cupy
    from hopmm import timing
    from hopmm.device import query

    dev = query(cp.cuda.Device().id)
    dt = ctx.cupy_dtype(args.dtype)
    layouts = [x.strip() for x in args.layouts.split(",")]
    shapes = QUICK_SHAPES if args.quick else SHAPES
    precompile(dev, dt.name, layouts, shapes)
    copy_bw = copy_bandwidth(cp)
    print(f"device {dev.name}; copy bandwidth {copy_bw / 1e12:.3f} TB/s (device-to-device, "
          f"read + write); dtype {args.dtype}; {args.rounds} interleaved rounds")
    rows = []
    for (m, n, k) in shapes:
        for b_major in layouts:
            nbytes = (m * k + k * n + m * n) * dt.itemsize
            sets = operands(cp, dt, m, n, k, b_major,
                            bench.input_set_count(m, n, k, ctx.l2_bytes))
            contestants, notes, base = contestants_for(ctx, dev, sets, b_major)
            ref = cp.matmul(sets[0][0].astype(cp.float32), sets[0][1].astype(cp.float32))
            for name, fn in contestants.items():   # each checked once into a poisoned C
                c = bench.poisoned(cp, (m, n), dt)
                fn(sets[0][0], sets[0][1], c)
                err = bench.rel_error(cp, c, ref)
                if not err < bench.REL_ERR_LIMITS[args.dtype]:
                    notes.append(f"{name}: WRONG RESULT (rel err {err:.3g})")
            medians = timing.interleaved_medians(contestants, sets, args.rounds, WARMUP_S)
            cublas = min(medians[x] for x in ("cupy", "torch") if x in medians)
            label = f"{m}x{n}x{k} B {b_major}-major"
            print(f"\n== {label}: {nbytes / 1e6:.1f} MB, floor {nbytes / copy_bw * 1e6:.1f} us "
                  f"at the copy bandwidth; heuristic's gemv: {base.config.tag} k{base.splits}")
            for name, t in sorted(medians.items(), key=lambda kv: kv[1]):
                print(f"  {name:42s} {t * 1e6:8.1f} us {nbytes / t / 1e9:8.0f} GB/s "
                      f"{nbytes / t / copy_bw:6.3f} of copy  x{cublas / t:5.2f} cuBLAS")
            for note in notes:
                print(f"  note: {note}")
            gemv = {x: t for x, t in medians.items() if x.startswith("gemv")}
            best = min(gemv, key=gemv.get)
            rival = next(x for x in medians if x.startswith("split_k") or
                         not (x.startswith("gemv") or x in ("choice", "cupy", "torch")))
            rows.append(dict(shape=label, bytes=nbytes, copy_bw=copy_bw, best_gemv=best,
                             times_us={x: t * 1e6 for x, t in medians.items()},
                             best_gemv_of_copy=nbytes / gemv[best] / copy_bw,
                             choice_of_copy=nbytes / medians["choice"] / copy_bw,
                             rival=rival, rival_of_copy=nbytes / medians[rival] / copy_bw,
                             best_gemv_x_cublas=cublas / gemv[best],
                             choice_x_cublas=cublas / medians["choice"],
                             rival_x_cublas=cublas / medians[rival], notes=notes))
    print(f"\n=== gemv tuning, {dev.name}, {args.dtype}: fraction of the copy bandwidth "
          f"({copy_bw / 1e12:.3f} TB/s) / x best cuBLAS (target >= 0.95 / >= 1.05)")
    print(f"{'shape':32s} {'best gemv variant':34s} {'best':>12s} {'choice':>12s} "
          f"{'rival':>12s}")
    for r in rows:
        print(f"{r['shape']:32s} {r['best_gemv']:34s} "
              f"{r['best_gemv_of_copy']:5.3f}/{r['best_gemv_x_cublas']:4.2f}  "
              f"{r['choice_of_copy']:5.3f}/{r['choice_x_cublas']:4.2f}  "
              f"{r['rival_of_copy']:5.3f}/{r['rival_x_cublas']:4.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=dev.name, dtype=args.dtype,
                                                   rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

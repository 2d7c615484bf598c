#!/usr/bin/env python3
"""A probe, not part of hopmm: the in-place skinny kernel of skinny_in_place.cu against cuBLAS
(bench/NOTES.md v0.37).

    python bench/probes/skinny_in_place.py OUT.json SHAPES.txt    (lines "MxNxK bf16|fp16")

Each problem is C (M x N) = A (M x K) @ B (K x N) with row-major operands: A's rows of K
elements start on 2-byte boundaries wherever K is odd, and the kernel reads them where they
lie; N must be at most 128. B's permuted, padded copy is made once per input set, outside the
timing (a real call would make it every time: 2 x N x K bytes). The kernel's time includes
zeroing the fp32 workspace and the conversion to 16 bits. Its sums are added with atomics, so
its results are not bitwise repeatable: a speed probe only.
"""
import json
import os
import sys
import time

import cupy
import numpy as np
import torch

from hopmm.timing import interleaved_medians

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.abspath(os.path.join(HERE, "..", "..", "csrc", "hopmm"))
K_BLOCK = 64          # the kernel's KB
ROWS_PER_CTA = 128    # 4 warps x 2 m16 tiles
CTAS_PER_SM = 2       # what its shared memory allows
STAGES = {32: 4, 64: 4, 128: 3}   # the kernel's ring depth by column tile
PITCH = 72            # elements per staged row (144 bytes)
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def perm_index(kp: int) -> np.ndarray:
    """Position k' of B's permuted copy holds B's row perm_index(kp)[k']: inside each chunk of
    32, mma k-slot s of step h takes element 8 (s % 8 // 2) + 4 h + s % 2 + 2 (s // 8), the
    element the A operand's lanes hold in that slot (gemv's permutation)."""
    k = np.arange(kp)
    blk, rem = k // 32 * 32, k % 32
    h, s = rem // 16, rem % 16
    return blk + 8 * ((s % 8) // 2) + 4 * h + (s % 2) + 2 * (s // 8)


def permuted_b(b, nt: int, kp: int):
    """B^T (nt x kp), rows past N and columns past K zero, k permuted by perm_index."""
    k, n = b.shape
    perm = perm_index(kp)
    bt = cupy.zeros((nt, kp), dtype=b.dtype)
    bt[:n] = b.T[:, cupy.asarray(np.minimum(perm, k - 1))]
    past = np.nonzero(perm >= k)[0]
    if past.size:
        bt[:, cupy.asarray(past)] = 0
    return bt


def main():
    out, shapes_file = sys.argv[1], sys.argv[2]
    budget_s = float(os.environ.get("BUDGET_S", "1e9"))
    src = open(os.path.join(HERE, "skinny_in_place.cu")).read()
    mod = cupy.RawModule(code=src, options=("-std=c++17", "-arch=sm_90a", f"-I{INCLUDE}"))
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    lines = [l.split() for l in open(shapes_file) if l.strip() and not l.startswith("#")]
    results, t0 = [], time.time()
    for shape, dt in lines:
        if time.time() - t0 > budget_s:
            print("budget reached")
            break
        m, n, k = map(int, shape.split("x"))
        if n > max(STAGES):
            print(f"{shape}: skipped, the kernel covers at most {max(STAGES)} columns")
            continue
        dtype, bf16 = DTYPES[dt], dt == "bf16"
        sets = [(cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype),
                 cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype))
                for _ in range(2)]
        nt = 32 if n <= 32 else 64 if n <= 64 else 128
        kp = -(-k // K_BLOCK) * K_BLOCK
        bts = [permuted_b(b, nt, kp) for _, b in sets]
        ws = cupy.zeros((m, n), dtype=cupy.float32)
        c = cupy.empty((m, n), dtype=dtype)
        name = f"rk_{'bf16' if bf16 else 'f16'}_{nt}"
        fn, convert = mod.get_function(name), mod.get_function("to_16bit")
        smem = STAGES[nt] * (ROWS_PER_CTA + nt) * PITCH * 2
        fn.max_dynamic_shared_size_bytes = smem
        units = -(-m // ROWS_PER_CTA) * (kp // K_BLOCK)
        grid = min(CTAS_PER_SM * sms, units)

        def ours(i):
            ws.fill(0)
            fn((grid,), (128,), (sets[i][0], np.int64(k), bts[i], np.int32(kp), ws, np.int32(m),
                                 np.int32(n), np.int32(k)), shared_mem=smem)
            convert((2 * sms,), (256,), (ws, c, np.int64(m * n), np.int32(bf16)))

        c.fill(cupy.nan)
        ours(0)
        ref = cupy.matmul(sets[0][0].astype(cupy.float32), sets[0][1].astype(cupy.float32))
        err = float(cupy.linalg.norm(c.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
        del ref
        tsets = [(torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in sets]
        med = interleaved_medians({name: ours,
                                   "cupy": lambda i: cupy.matmul(*sets[i]),
                                   "torch": lambda i: torch.matmul(*tsets[i])},
                                  [(0,), (1,)], rounds=4, warmup_s=0.1)
        us = {key: v * 1e6 for key, v in med.items()}
        moved = 2 * (m * k + k * n + m * n)
        best = min(us["cupy"], us["torch"])
        print(f"{shape} {dt} cuBLAS {best:.1f} us {moved / best / 1e6:.2f} TB/s | {name} "
              f"{grid} CTAs {us[name]:.1f} us {moved / us[name] / 1e6:.2f} TB/s "
              f"x{best / us[name]:.2f} err {err:.1e}", flush=True)
        results.append(dict(shape=shape, dtype=dt, us=us, err=err, kernel=name, ctas=grid))
        json.dump(results, open(out, "w"), indent=1)
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()

"""`python -m hopmm`: on a Hopper GPU, hopmm vs cupy.matmul side by side for a default shape
list; without one, every registered kernel compiled for sm_90a and checked."""
from __future__ import annotations

import argparse
import sys

from . import device as device_mod

DEFAULT_SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048),
                  (1024, 1024, 1024), (4096, 28672, 8192), (512, 512, 16384), (1000, 1023, 4097))
INPUT_SETS = 3
ROUNDS = 7
WARMUP_S = 0.5


def gpu_table(shapes, dtypes) -> int:
    import cupy

    import hopmm

    from .timing import interleaved_medians
    from .tuning import tolerance

    dev = device_mod.query(cupy.cuda.Device().id)
    print(f"device: {dev.name}, {dev.sm_count} SMs")
    print(f"{'M x N x K':<22} {'dtype':<9} {'hopmm us':>9} {'cupy us':>9} {'hopmm TF/s':>10} "
          f"{'cupy TF/s':>9} {'ratio':>6} {'rel err':>9}")
    worst = 0.0
    for m, n, k in shapes:
        for dtype in dtypes:
            inputs = [(cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(dtype),
                       cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(dtype))
                      for _ in range(INPUT_SETS)]
            a, b = inputs[0]
            ref = cupy.matmul(a, b).astype(cupy.float32)
            got = cupy.full((m, n), cupy.nan, dtype=dtype)
            hopmm.matmul(a, b, out=got)
            err = float(cupy.linalg.norm(got.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
            worst = max(worst, err / tolerance(cupy.dtype(dtype).name)) if err == err else float("inf")
            t = interleaved_medians({"hopmm": hopmm.matmul, "cupy": cupy.matmul}, inputs,
                                    ROUNDS, WARMUP_S)
            flops = 2.0 * m * n * k
            print(f"{f'{m}x{n}x{k}':<22} {cupy.dtype(dtype).name:<9} {t['hopmm'] * 1e6:>9.1f} "
                  f"{t['cupy'] * 1e6:>9.1f} {flops / t['hopmm'] / 1e12:>10.1f} "
                  f"{flops / t['cupy'] / 1e12:>9.1f} {t['cupy'] / t['hopmm']:>6.2f} {err:>9.2e}",
                  flush=True)
    return 0 if worst < 1 else 1


def cpu_report() -> int:
    from .report import check_all, format_checks

    dev = device_mod.H100_SXM
    print(f"no Hopper GPU here: compiling every registered kernel for sm_90a "
          f"(shared-memory limit of {dev.name}: {dev.smem_per_block_optin} B)")
    checks = check_all(dev)
    print(format_checks(checks))
    return 0 if all(c.ok for c in checks) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hopmm", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="the compile report even on a GPU")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    args = parser.parse_args(argv)
    if not args.cpu and device_mod.gpu_available():
        import cupy

        if device_mod.query(cupy.cuda.Device().id).is_hopper:
            return gpu_table(DEFAULT_SHAPES, args.dtypes.split(","))
        print("the GPU here is not a Hopper (sm_90): showing the compile report instead")
    return cpu_report()


if __name__ == "__main__":
    sys.exit(main())

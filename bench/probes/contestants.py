"""What the probes share (not part of hopmm): the cuBLAS side, cupy.matmul and, where torch
imports, torch.matmul on the same input sets, each a function of the input set's index, to time
beside the probe's own contestants (bench/NOTES.md: cuBLAS in the same run); a choice's own
launches as such a contestant; the check of the probe's own contestants; the line and JSON
each product's timings go to; and the cupy dtype of a probe's bf16 / fp16 argument."""
import json
import sys
from pathlib import Path

import cupy

from hopmm import launch, layout, operands

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import CUPY_DTYPE_NAMES  # noqa: E402


def cupy_dtype(alias: str):
    """The cupy dtype of a probe's dtype argument (bf16 or fp16)."""
    name = CUPY_DTYPE_NAMES[alias]
    try:
        return cupy.dtype(name)
    except TypeError:  # known by name only once ml_dtypes registered it
        import ml_dtypes
        return cupy.dtype(getattr(ml_dtypes, name))


def cublas_contestants(a, b, out=None) -> dict:
    """{"cupy": run(i), "torch": run(i)} over the input sets a[i], b[i]; cupy.matmul writes
    into `out` where given; no "torch" where it does not import."""
    contestants = {"cupy": lambda i: cupy.matmul(a[i], b[i], out=out)}
    try:
        import torch
    except ImportError:
        return contestants
    pairs = [(torch.from_dlpack(x), torch.from_dlpack(y)) for x, y in zip(a, b)]
    contestants["torch"] = lambda i: torch.matmul(*pairs[i])
    return contestants


def kernel_calls(a, b) -> list:
    """The kernel's operands of each input set (a[i], b[i]): aligned copies where needed, and
    the problem as the kernel reads it (calls[0].problem)."""
    shapes = layout.matmul_shapes(a[0].shape, b[0].shape)
    return [operands.kernel_operands(x, y, shapes) for x, y in zip(a, b)]


def launch_run(choice, calls, c):
    """run(i): `choice`'s launches (built now) on input set i's operands (`calls`, from
    kernel_calls) into c."""
    runs = [launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                  call.b_map, c[None]) for call in calls]

    def run(i):
        launch.launch_all(runs[i], calls[i].a3.data.ptr, calls[i].b3.data.ptr, c.data.ptr)
    return run


def drop_wrong(runs: dict, a0, b0, c, max_rel_err: float) -> dict:
    """Runs each of `runs` (name: run(i) writing a[i] @ b[i] into c) on input set 0 into c
    poisoned with NaN first, against cupy.matmul of a0 and b0 in fp32; removes from `runs`
    those off by max_rel_err or more (or NaN) and returns {name: relative error} of them."""
    ref = cupy.matmul(a0.astype(cupy.float32), b0.astype(cupy.float32))
    errors = {}
    for name, run in list(runs.items()):
        c.fill(cupy.nan)
        run(0)
        err = float(cupy.linalg.norm(c.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
        if not err < max_rel_err:   # NaN fails too
            errors[name] = err
            del runs[name]
    return errors


def report(label: str, row: dict, rows: list, out_path: str) -> None:
    """Prints `label` and row["us"] fastest first (and row["errors"], the contestants that
    failed their check), appends `row` to `rows` and rewrites `out_path` with them all."""
    rows.append(row)
    ranked = sorted(row["us"].items(), key=lambda kv: kv[1])
    print(f"{label}: " + " ".join(f"{name} {us:.1f}" for name, us in ranked)
          + (f" ERRORS {row['errors']}" if row["errors"] else ""), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)

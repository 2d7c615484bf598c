"""hopmm.matmul: cupy.matmul's semantics, computed by hopmm's Hopper kernels where they
apply and by cupy.matmul elsewhere (visibly: `explain`, and `HOPMM_STRICT=1` makes it an
error)."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields

from . import device as device_mod
from . import fastpath, heuristics, launch, layout, operands, tuning
from .problem import KERNEL_DTYPES

STRICT_ENV = "HOPMM_STRICT"
SCHEDULE_ENV = "HOPMM_SCHEDULE"

# A schedule forced by the user (use_schedule or HOPMM_SCHEDULE, read at import), else the
# heuristic's choice.
_schedule_override = None


class FallbackError(RuntimeError):
    """Raised under HOPMM_STRICT=1 when a call would fall back to cupy.matmul."""


@dataclass
class Plan:
    path: str                       # "kernel", "cupy.matmul", "empty" or "zeros"
    reason: str
    shapes: layout.MatmulShapes
    dtype: object


@dataclass
class KernelCall(operands.KernelOperands):
    """Operands as the kernel reads them, the problem they make, and the choice made for it."""
    choice: heuristics.Choice = field(kw_only=True)  # after the operands' defaulted fields


def use_schedule(name: str | None) -> None:
    """Run every kernel call on schedule `name` (None: let the heuristic choose)."""
    global _schedule_override
    from .schedules import SCHEDULES

    if name is not None and name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r} (from use_schedule or {SCHEDULE_ENV}); "
                         f"known: {sorted(SCHEDULES)}")
    _schedule_override = name
    fastpath.clear()  # remembered launches were built for the previous choice


if os.environ.get(SCHEDULE_ENV):
    use_schedule(os.environ[SCHEDULE_ENV])


def _is_cupy_array(x) -> bool:
    import cupy

    return isinstance(x, cupy.ndarray)


def _check_types(a, b, out) -> None:
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, (int, float, complex)):
            raise ValueError(f"hopmm.matmul: scalar operand {name} is not allowed, use '*' instead")
        if not _is_cupy_array(x):
            raise TypeError(f"hopmm.matmul: operand {name} must be a cupy.ndarray, got "
                            f"{type(x).__module__}.{type(x).__qualname__} (use cupy.asarray "
                            f"to move it to the GPU)")
    if out is not None and not _is_cupy_array(out):
        raise TypeError(f"hopmm.matmul: out must be a cupy.ndarray, got {type(out).__qualname__}")
    devices = {x.device.id for x in (a, b, out) if x is not None}
    if len(devices) > 1:
        raise ValueError(f"hopmm.matmul: operands are on different devices {sorted(devices)}")


def plan(a, b, out=None) -> Plan:
    """Validates a call as cupy.matmul would and decides how it runs (no GPU work)."""
    import cupy
    import numpy

    _check_types(a, b, out)
    shapes = layout.matmul_shapes(a.shape, b.shape)
    try:
        dtype = cupy.result_type(a.dtype, b.dtype)
    except TypeError as exc:  # e.g. bfloat16 with float16: NumPy knows no common type
        raise TypeError(f"hopmm.matmul: no common dtype for {a.dtype} and {b.dtype}") from exc
    if out is not None:
        if out.shape != shapes.out_shape:
            raise ValueError(f"hopmm.matmul: out has shape {out.shape}, the result has shape "
                             f"{shapes.out_shape}")
        if not numpy.can_cast(dtype, out.dtype, casting="same_kind"):
            raise TypeError(f"hopmm.matmul: cannot cast the result dtype {dtype} to out's "
                            f"dtype {out.dtype} (casting='same_kind')")
    if 0 in (shapes.m, shapes.n, shapes.batch):
        return Plan("empty", "the result has no elements", shapes, dtype)
    if shapes.k == 0:
        return Plan("zeros", "k = 0: every element is an empty sum", shapes, dtype)

    dev = device_mod.query(a.device.id)
    reason = (_unsupported_reason(a, b, out, dev) or _too_large_reason(shapes)
              or _copy_route_reason(a, b, out, shapes))
    if reason:
        return Plan("cupy.matmul", reason, shapes, dtype)
    return Plan("kernel", f"{a.dtype.name} on {dev.name} (sm_90)", shapes, dtype)


def _unsupported_reason(a, b, out, dev: device_mod.DeviceInfo) -> str | None:
    if a.dtype != b.dtype or a.dtype.name not in KERNEL_DTYPES:
        return (f"dtypes {a.dtype.name} @ {b.dtype.name}: hopmm's kernels take float16 or "
                f"bfloat16 operands of one dtype")
    if out is not None and out.dtype != a.dtype:
        return f"out dtype {out.dtype.name} differs from the operands' {a.dtype.name}"
    if not dev.is_hopper:
        cc = "%d.%d" % dev.compute_capability
        return f"{dev.name} is compute capability {cc}; hopmm's kernels need Hopper (9.0)"
    return None


def _copy_route_reason(a, b, out, shapes: layout.MatmulShapes) -> str | None:
    """heuristics.copy_route_reason for the aligned copies this call would make, unless a
    schedule is forced or HOPMM_STRICT asks for hopmm's kernels."""
    if _schedule_override or os.environ.get(STRICT_ENV, "") not in ("", "0"):
        return None
    copied = 0
    for x, is_vector, axis in ((a, shapes.a_is_vector, 0), (b, shapes.b_is_vector, 1)):
        x2 = _as_matrix_stack(x, is_vector, axis)
        if layout.tma_major(x2.shape[-2:], x2.strides[-2:], x.itemsize, x.data.ptr) is None:
            copied += x.nbytes
    # The result goes through an aligned buffer where _run_kernel cannot store it directly.
    n_bytes = shapes.n * a.itemsize
    if out is None:
        direct = n_bytes % layout.TMA_ALIGN == 0
    else:
        direct = out.flags.c_contiguous and layout.store_ok(
            (shapes.m, shapes.n), (n_bytes, a.itemsize), a.itemsize, out.data.ptr)
    if not direct:
        copied += shapes.batch * shapes.m * n_bytes
    return heuristics.copy_route_reason(shapes.m, shapes.n, shapes.k, shapes.batch, copied)


def _too_large_reason(shapes: layout.MatmulShapes) -> str | None:
    for name in ("m", "n", "k", "batch"):
        if getattr(shapes, name) > layout.MAX_EXTENT:
            return f"{name} = {getattr(shapes, name)} exceeds the kernels' 32-bit arguments"
    return None


# Looked up in this module when a call is remembered, so that tests can count its uses.
_batch_view = operands.batch_view
_as_matrix_stack = operands.as_matrix_stack


def matmul(a, b, out=None):
    """Matrix product with the semantics of cupy.matmul (and numpy.matmul)."""
    result, k = fastpath.repeat(a, b, out)
    if result is not None:
        return result
    import cupy

    p = plan(a, b, out)
    if p.path == "cupy.matmul":
        if os.environ.get(STRICT_ENV, "") not in ("", "0"):
            raise FallbackError(f"hopmm.matmul would fall back to cupy.matmul: {p.reason} "
                                f"(unset {STRICT_ENV} to allow it)")
        return cupy.matmul(a, b, out=out)
    with a.device:  # the result lives with the operands, wherever the current device is
        result = out if out is not None else cupy.empty(p.shapes.out_shape, dtype=p.dtype)
        if p.path == "zeros":
            result.fill(0)
        elif p.path == "kernel":
            _run_kernel(p, a, b, result, out is not None, k)
    return result


def _kernel_call(a, b, shapes: layout.MatmulShapes) -> KernelCall:
    """The operands as the kernel reads them (operands.kernel_operands) and the schedule,
    decided on exactly those."""
    ops = operands.kernel_operands(a, b, shapes)
    dev = device_mod.query(a.device.id)
    # A forced schedule wins, then an autotuned winner for this exact problem, then the
    # heuristic.
    choice = ((None if _schedule_override else tuning.lookup(ops.problem, dev))
              or heuristics.choose(ops.problem, dev, _schedule_override))
    return KernelCall(**{f.name: getattr(ops, f.name) for f in fields(ops)}, choice=choice)


def _run_kernel(p: Plan, a, b, result, user_out: bool, recipe_key) -> None:
    s = p.shapes
    chosen_at = fastpath.generation
    call = _kernel_call(a, b, s)
    overlapping = user_out and (_overlap(result, a) or _overlap(result, b))
    direct = (result.flags.c_contiguous
              and layout.store_ok((s.m, s.n), (s.n * result.itemsize, result.itemsize),
                                  result.itemsize, result.data.ptr)
              and not overlapping)
    c_buffer = None if direct else (s.batch, s.m, s.n, layout.padded(s.n, result.itemsize))
    if direct:
        c3 = result.reshape(s.batch, s.m, s.n)
    else:  # an aligned buffer, then one copy into the result (strided, overlapping, odd n)
        c3 = launch.padded_empty(*c_buffer, result.dtype)
    launches = launch.build_launches(call.choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, c3)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, c3.data.ptr)
    if not direct:
        launch.copy_rows(result, c3.reshape(s.out_shape))
    # Remember the launches when a later call can repeat them on its own base addresses:
    # operands read in place or through an aligned copy of a view of the caller's array (the
    # recipe makes the copy again), and a store that is not into an overlapping out.
    copies = {name: fastpath.OperandCopy.of(
                  x, call.views[name], x3, functools.partial(
                      _batch_view, is_vector=is_vector, axis=axis, batch_shape=s.batch_shape))
              for name, x, x3, is_vector, axis in (("a", a, call.a3, s.a_is_vector, 0),
                                                   ("b", b, call.b3, s.b_is_vector, 1))
              if name in call.copies}
    if recipe_key is not None and not overlapping and None not in copies.values():
        fastpath.remember(recipe_key, fastpath.make_recipe(
            s.out_shape, result.dtype, launches, a, b, result if user_out else None,
            copies.get("a"), copies.get("b"), c_buffer), chosen_at)


def _overlap(x, y) -> bool:
    """Whether two arrays' byte ranges intersect (also for views that CuPy wraps as separate
    allocations, e.g. from DLPack, which cupy.may_share_memory reports as disjoint)."""
    return layout.overlaps(layout.byte_bounds(x.data.ptr, x.shape, x.strides, x.itemsize),
                           layout.byte_bounds(y.data.ptr, y.shape, y.strides, y.itemsize))


def explain(a, b, out=None) -> str:
    """Which path `matmul(a, b, out)` takes, with which schedule and config, and why."""
    p = plan(a, b, out)
    s = p.shapes
    lines = [f"path: {p.path}", f"why: {p.reason}",
             f"shape: batch {s.batch_shape} x ({s.m} x {s.k}) @ ({s.k} x {s.n}) -> "
             f"{s.out_shape} {p.dtype}"]
    if p.path == "kernel":
        with a.device:
            call = _kernel_call(a, b, p.shapes)
        dev = device_mod.query(a.device.id)
        c, prob = call.choice, call.problem
        grid = c.schedule.grid(prob, c.config, min(prob.batch, layout.MAX_GRID_Z), dev.sm_count,
                               c.splits)
        lines += [f"layout: {prob.layout} (A {prob.a_major}-major, B {prob.b_major}-major)"
                  + (f"; aligned copies of {', '.join(call.copies)}" if call.copies else ""),
                  f"schedule: {c.schedule.name}",
                  f"consumers: {c.schedule.consumer_roles(c.config)}",
                  f"kernel: {c.schedule.kernel_name(c.config)}",
                  f"grid: {grid}, "
                  f"{c.schedule.threads(c.config)} threads, {c.schedule.smem_bytes(c.config)} B "
                  f"shared memory ({c.schedule.smem_note(c.config)})"
                  + (f", {c.splits} splits along K" if c.schedule.split_k else ""),
                  f"heuristic: {c.reason}"]
        if c.schedule.cluster_size > 1:
            lines.insert(-1, f"cluster: {c.schedule.cluster_size} CTAs on adjacent M tiles; "
                             f"each loads its A tile and 1/{c.schedule.cluster_size} of the "
                             f"shared B tile, multicast to all of them")
        elif (shape := c.schedule.launch_cluster(c.splits)) != (1, 1, 1):
            lines.insert(-1, f"cluster: {shape} at launch, the "
                             f"{c.splits} splits of one tile; each adds its share of the tile's "
                             f"rows from every split's partial through distributed shared "
                             f"memory")
    return "\n".join(lines)

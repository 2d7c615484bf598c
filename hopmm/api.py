"""hopmm.matmul: cupy.matmul's semantics, computed by hopmm's Hopper kernels where they
apply and by cupy.matmul elsewhere (visibly: `explain`, and `HOPMM_STRICT=1` makes it an
error)."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field, fields

from . import device as device_mod
from . import epilogue as epilogue_mod
from . import fastpath, heuristics, interop, launch, layout, operands, tuning, validation
from .problem import KERNEL_DTYPES, Problem
from .schedules import DUAL_B_SCHEDULES, GemvSchedule

GEMV = GemvSchedule.name

STRICT_ENV = fastpath.STRICT_ENV
SCHEDULE_ENV = "HOPMM_SCHEDULE"

# A schedule forced by the user (use_schedule or HOPMM_SCHEDULE, read at import), else the
# heuristic's choice. A shared-A schedule (matmul_shared_a, swiglu) is forced for those calls
# only; matmul keeps the heuristic's choice (_matmul_override).
_schedule_override = None


class FallbackError(RuntimeError):
    """Raised under HOPMM_STRICT=1 when a call would fall back to cupy.matmul."""


@dataclass
class Plan:
    path: str                       # "kernel", "cupy.matmul", "empty" or "zeros"
    reason: str
    shapes: layout.MatmulShapes
    dtype: object
    # The call's fused epilogue (validated keywords), or None for a plain product.
    epilogue: epilogue_mod.FusedEpilogue | None = None


@dataclass
class KernelCall(operands.KernelOperands):
    """Operands as the kernel reads them, the problem they make, and the choice made for it."""
    choice: heuristics.Choice = field(kw_only=True)  # after the operands' defaulted fields


def _matmul_override() -> str | None:
    """The schedule forced on matmul's kernel calls, if any."""
    return None if _schedule_override in DUAL_B_SCHEDULES else _schedule_override


def use_schedule(name: str | None) -> None:
    """Run every kernel call on schedule `name` (None: let the heuristic choose). The
    shared-A schedules, `shared_a` and `swiglu`, are forced on matmul_shared_a and swiglu
    calls only."""
    global _schedule_override
    from .schedules import ALL_SCHEDULES

    if name is not None and name not in ALL_SCHEDULES:
        raise ValueError(f"unknown schedule {name!r} (from use_schedule or {SCHEDULE_ENV}); "
                         f"known: {sorted(ALL_SCHEDULES)}")
    _schedule_override = name
    fastpath.clear()  # remembered launches were built for the previous choice


if os.environ.get(SCHEDULE_ENV):
    use_schedule(os.environ[SCHEDULE_ENV])


def _check_devices(a, b, out) -> None:
    devices = {x.device.id for x in (a, b, out) if x is not None}
    if len(devices) > 1:
        raise ValueError(f"hopmm.matmul: operands are on different devices {sorted(devices)}")


def _is_plain(bias, activation, alpha, beta, c) -> bool:
    """Whether a call uses none of the epilogue keywords (cupy.matmul's semantics)."""
    return (bias is None and c is None and activation is None and alpha == 1.0
            and beta == 0.0 and isinstance(alpha, (int, float)) and isinstance(beta, (int, float)))


@interop.accepts_torch
def plan(a, b, out=None, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None) -> Plan:
    """Validates a call as cupy.matmul would, and its epilogue keywords, and decides how it
    runs (no GPU work)."""
    plain = _is_plain(bias, activation, alpha, beta, c)
    p = _plan(a, b, out, plain)
    if plain:
        return p
    p.epilogue = epilogue_mod.resolve(p.shapes, p.dtype, a.device.id, bias=bias,
                                      activation=activation, alpha=alpha, beta=beta, c=c)
    if p.path == "kernel":
        reason = p.epilogue.kernel_reason()
        if reason:
            p.path, p.reason = "cupy.matmul", reason
    return p


def _plan(a, b, out, plain: bool = True) -> Plan:
    checked = validation.check(a, b, out)
    shapes, dtype = checked.shapes, checked.dtype
    _check_devices(a, b, out)
    if 0 in (shapes.m, shapes.n, shapes.batch):
        return Plan("empty", "the result has no elements", shapes, dtype)
    if shapes.k == 0:
        return Plan("zeros", "k = 0: every element is an empty sum", shapes, dtype)

    dev = device_mod.query(a.device.id)
    reason = (_unsupported_reason(a, b, out, dev) or _too_large_reason(shapes)
              or _copy_route_reason(a, b, out, shapes, dev, plain))
    if reason:
        return Plan("cupy.matmul", reason, shapes, dtype)
    return Plan("kernel", f"{a.dtype.name} on {dev.name} (sm_90{_dram_note(dev)})", shapes,
                dtype)


def _dram_note(dev: device_mod.DeviceInfo) -> str:
    """The device's DRAM peak where it scales the time models' memory rates (dram_scale)."""
    scale = heuristics.dram_scale(dev)
    if scale == 1.0:
        return ""
    return f", DRAM peak {dev.dram_tbps:.2f} TB/s: the models' DRAM rates x {scale:.2f}"


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


def cupy_matmul_takes(dtype_name: str, batch_shape: tuple) -> bool:
    """Whether cupy.matmul computes such a call: CuPy 14's batched path has no bfloat16 (it
    raises TypeError "data type 'E' not understood"), so such calls never route there."""
    return not (dtype_name == "bfloat16" and len(batch_shape) > 0)


def _copy_route_reason(a, b, out, shapes: layout.MatmulShapes, dev: device_mod.DeviceInfo,
                       plain: bool) -> str | None:
    """heuristics.copy_route_reason for the aligned copies this call would make, unless a
    schedule is forced, HOPMM_STRICT asks for hopmm's kernels, or (a `plain` call, no
    epilogue) gemv reads the operands where they lie."""
    if _matmul_override() or fastpath.strict():
        return None
    if not cupy_matmul_takes(a.dtype.name, shapes.batch_shape):
        return None
    copied = _unaligned_operand_bytes(a, b, shapes)
    if copied:
        copied -= _phased_bytes(a, b, shapes, dev)
    # The result goes through an aligned buffer where _run_kernel can store it neither through
    # TMA nor by rows (a split-K kernel, which stores through TMA only, may still copy it).
    if _output_store(out, shapes, a.itemsize) == "copy":
        copied += shapes.batch * shapes.m * shapes.n * a.itemsize
    if copied == 0:
        return None
    reason = heuristics.copy_route_reason(_copied_problem(a, b, shapes), dev, copied,
                                          _row_alignment(a, b, shapes))
    if reason and plain and _in_place_gemv(a, b, shapes, dev) is not None:
        return None
    return reason


def _phased_bytes(a, b, shapes: layout.MatmulShapes, dev: device_mod.DeviceInfo) -> int:
    """The bytes of the operands the call's kernel would read in place through phase maps
    (heuristics.phased_choice) instead of from aligned copies; else 0."""
    a_pitch = operands.view_pitch_mod8(a, shapes.a_is_vector, 0, shapes.batch_shape)
    b_pitch = operands.view_pitch_mod8(b, shapes.b_is_vector, 1, shapes.batch_shape)
    if not (a_pitch or b_pitch):
        return 0
    problem = _copied_problem(a, b, shapes)
    choice = heuristics.phaseable(heuristics.choose(problem, dev))
    phased = heuristics.phased_choice(choice, a_pitch, b_pitch, problem, dev,
                                      _row_alignment(a, b, shapes))
    if phased is None:
        return 0
    cfg = phased.config
    return a.nbytes * bool(cfg.a_pitch_mod8) + b.nbytes * bool(cfg.b_pitch_mod8)


def _copied_problem(a, b, shapes: layout.MatmulShapes) -> Problem:
    """The problem hopmm's kernels would run on the aligned copies: each operand keeps the axis
    it runs along (row-major where it has no unit stride)."""
    axes = []
    for x, is_vector, axis in ((a, shapes.a_is_vector, 0), (b, shapes.b_is_vector, 1)):
        x2 = _as_matrix_stack(x, is_vector, axis)
        axes.append(layout.element_major(x2.shape[-2:], x2.strides[-2:], x.itemsize) or "cols")
    return operands.problem_of(shapes, a.dtype.name, *axes)


def _row_alignment(a, b, shapes: layout.MatmulShapes) -> int:
    """The largest power of two up to 8 bytes (the model's largest) that divides the operands'
    base addresses and pitches and the result's row pitch: the alignment cuBLAS reads and
    writes rows at."""
    align = math.gcd(max(heuristics.CUBLAS_UNALIGNED_TBPS), shapes.n * a.itemsize)
    for x in (a, b):
        # Strides of one element (the rows' own) and of axes of extent 1 are never pitches.
        pitches = [s for e, s in zip(x.shape, x.strides) if e > 1 and abs(s) != x.itemsize]
        align = math.gcd(align, x.data.ptr, *pitches)
    return align


def _unaligned_operand_bytes(a, b, shapes: layout.MatmulShapes) -> int:
    """Bytes of the operands TMA cannot read in place (rows not on 16 bytes): what the tile
    kernels' aligned copies would read."""
    copied = 0
    for x, is_vector, axis in ((a, shapes.a_is_vector, 0), (b, shapes.b_is_vector, 1)):
        x2 = _as_matrix_stack(x, is_vector, axis)
        if layout.tma_major(x2.shape[-2:], x2.strides[-2:], x.itemsize, x.data.ptr) is None:
            copied += x.nbytes
    return copied


def _in_place_gemv(a, b, shapes: layout.MatmulShapes, dev: device_mod.DeviceInfo,
                   forced: bool = False) -> KernelCall | None:
    """The call on gemv reading the operands where they lie (heuristics.gemv_in_place_choice),
    where some operand's rows are not 16-byte aligned and gemv takes it; else None."""
    copied = _unaligned_operand_bytes(a, b, shapes)
    if copied == 0:
        return None
    ops = operands.in_place_operands(a, b, shapes)
    if ops is None:
        return None
    choice = heuristics.gemv_in_place_choice(ops.problem, dev, copied, forced)
    if choice is None:
        return None
    return KernelCall(**{f.name: getattr(ops, f.name) for f in fields(ops)}, choice=choice)


def _output_store(result, shapes: layout.MatmulShapes, itemsize: int,
                  overlapping: bool = False) -> str:
    """How a kernel can write the (batch, m, n) result (None: a new C-contiguous array):
    "tma" (TMA stores in place), "rows" (in place by a row-store kernel: rows not 16-byte
    aligned) or "copy" (an aligned buffer, then a copy into the result: an out that overlaps
    the operands or whose layout neither can write)."""
    if overlapping:
        return "copy"
    shape3 = (shapes.batch, shapes.m, shapes.n)
    if result is None or result.flags.c_contiguous:
        strides3 = (shapes.m * shapes.n * itemsize, shapes.n * itemsize, itemsize)
        address = 0 if result is None else result.data.ptr
        if layout.store_ok(shape3[1:], strides3[1:], itemsize, address):
            return "tma"
    elif result.ndim == 2:
        strides3 = (0,) + tuple(result.strides)
    else:
        return "copy"
    return "rows" if layout.row_store_strides(shape3, strides3, itemsize) is not None else "copy"


def _stored_call(a, b, shapes: layout.MatmulShapes, spec, result, itemsize: int,
                 overlapping: bool) -> tuple[KernelCall, str]:
    """_kernel_call for a call into `result` (None: a new array) and how its kernel writes the
    result: _output_store's answer, "copy" where it was "rows" but the choice cannot store
    rows (split-K, gemv, a forced overlap kernel)."""
    store = _output_store(result, shapes, itemsize, overlapping)
    call = _kernel_call(a, b, shapes, spec, row_store=store == "rows")
    if store == "rows" and not getattr(call.choice.config, "row_store", False):
        store = "copy"
    return call, store


# How the kernel writes the result, by _stored_call's answer (explain's "output:" line).
STORE_NOTES = {"tma": "TMA stores into the result",
               "rows": "the epilogue stores the rows itself (they are not 16-byte aligned, "
                       "which TMA stores need)",
               "copy": "through an aligned buffer, then copied into the result"}


def _too_large_reason(shapes: layout.MatmulShapes) -> str | None:
    for name in ("m", "n", "k", "batch"):
        if getattr(shapes, name) > layout.MAX_EXTENT:
            return f"{name} = {getattr(shapes, name)} exceeds the kernels' 32-bit arguments"
    return None


# Looked up in this module when a call is remembered, so that tests can count its uses.
_batch_view = operands.batch_view
_as_matrix_stack = operands.as_matrix_stack


# matmul's defaults of alpha and beta, compared by identity: a plain call's check of its
# keywords stays a few identity tests on the cached path (an explicit alpha=1.0 takes the
# epilogue path, which finds nothing to fuse and runs the plain product).
_ALPHA_DEFAULT = 1.0
_BETA_DEFAULT = 0.0


def matmul(a, b, out=None, *, bias=None, activation=None, alpha=_ALPHA_DEFAULT,
           beta=_BETA_DEFAULT, c=None):
    """Matrix product with the semantics of cupy.matmul (and numpy.matmul); CUDA torch
    tensors in give torch tensors out (hopmm/interop.py). With the
    keywords, `activation(alpha * (a @ b) + beta * c + bias)` computed in fp32 (float64 for
    float64 operands) and rounded once: `bias` of shape (N,) or (M, 1), `c` broadcastable to
    the result (`out` may be `c` itself; with beta = 0, c is not read), `activation` one of
    None, "relu", "gelu" (erf), "gelu_tanh", "silu", "sigmoid". Nothing is written to `out`
    when a call raises."""
    if not (bias is None and c is None and activation is None and alpha is _ALPHA_DEFAULT
            and beta is _BETA_DEFAULT):
        # A torch tensor A goes to interop first: the cupy fast path would only decline it.
        if interop.is_tensor(a):
            return interop.fused_tensors(matmul, a, b, out, bias, activation, alpha, beta, c)
        return _fused_matmul(a, b, out, dict(bias=bias, activation=activation, alpha=alpha,
                                             beta=beta, c=c))
    result, k = fastpath.repeat(a, b, out)
    if result is not None:
        return result
    # The fast path declines anything but cupy arrays (k is None): torch tensors are taken
    # here, after it, so that a plain cupy call pays nothing for them.
    if k is None and interop.has_tensor((a, b, out)):
        return interop.matmul_tensors(matmul, a, b, out)
    import cupy

    chosen_at = fastpath.generation
    p = plan(a, b, out)
    if p.path == "cupy.matmul":
        if fastpath.strict():
            raise FallbackError(f"hopmm.matmul would fall back to cupy.matmul: {p.reason} "
                                f"(unset {STRICT_ENV} to allow it)")
        result = cupy.matmul(a, b, out=out)
        if k is not None:
            fastpath.remember(k, fastpath.route_recipe(a, b, out), chosen_at)
        return result
    with a.device:  # the result lives with the operands, wherever the current device is
        result = out if out is not None else cupy.empty(p.shapes.out_shape, dtype=p.dtype)
        if p.path == "zeros":
            result.fill(0)
        elif p.path == "kernel":
            _run_kernel(p, a, b, result, out is not None, k)
    return result


def _fused_matmul(a, b, out, keywords: dict):
    """matmul with epilogue keywords (A not a torch tensor): a repeat of an earlier call
    through its remembered launches, else validated in full (nothing launched before every
    check has passed), then run on hopmm's kernels or computed with CuPy in fp32."""
    import cupy

    result, k = fastpath.repeat_fused(a, b, out, keywords)
    if result is not None:
        return result
    if k is None and interop.has_tensor((a, b, out, keywords["bias"], keywords["c"])):
        return interop.fused_tensors(matmul, a, b, out, **keywords)
    p = plan(a, b, out, **keywords)
    ep = p.epilogue
    # No epilogue: keywords equal to the defaults but not them (alpha=1, beta=0.0 made
    # elsewhere); or nothing to fuse: c with beta = 0 only.
    if ep is None or (ep.spec == epilogue_mod.PLAIN and ep.alpha == 1.0):
        return matmul(a, b, out)
    if p.path == "cupy.matmul" and fastpath.strict():
        raise FallbackError(f"hopmm.matmul would fall back to cupy.matmul: {p.reason} "
                            f"(unset {STRICT_ENV} to allow it)")
    if p.path != "kernel":
        return _fused_cupy(p, a, b, out)
    with a.device:
        result = out if out is not None else cupy.empty(p.shapes.out_shape, dtype=p.dtype)
        _run_kernel(p, a, b, result, out is not None, k)
    return result


def _fused_cupy(p: Plan, a, b, out):
    """The epilogue on CuPy's product of fp32 (float64 for float64) copies of the operands,
    then one cast: the path of every call hopmm's kernels do not take."""
    import cupy

    s, ep = p.shapes, p.epilogue
    compute = cupy.float64 if p.dtype == cupy.float64 else cupy.float32
    with a.device:
        acc = cupy.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False))
        acc = acc.reshape(s.batch_shape + (s.m, s.n))  # vectors' missing axes of one back
        y = epilogue_mod.reference(cupy, acc, bias=ep.bias, activation=ep.spec.activation,
                                   alpha=ep.alpha, beta=ep.beta,
                                   c=None if ep.c is None else ep.c3)
        y = y.reshape(s.out_shape)
        if out is None:
            return y.astype(p.dtype)
        out[...] = y
        return out


def _kernel_call(a, b, shapes: layout.MatmulShapes, spec=None,
                 row_store: bool = False) -> KernelCall:
    """The operands as the kernel reads them (operands.kernel_operands) and the schedule,
    decided on exactly those; `spec`, a fused epilogue's, goes into the chosen config (it
    does not change the choice, except that gemv takes no epilogue); `row_store`: the
    result's rows are not 16-byte aligned, and the choice stores them itself where it can
    (heuristics.row_store_choice)."""
    dev = device_mod.query(a.device.id)
    fused = spec is not None
    forced = _matmul_override()
    # Operands whose rows TMA cannot read: gemv may take them where they lie (no epilogue).
    if not fused and forced in (None, GEMV):
        in_place = _in_place_gemv(a, b, shapes, dev, forced is not None)
        if in_place is not None:
            return in_place
    ops = operands.kernel_operands(a, b, shapes, phased=True)
    # A forced schedule wins, then an autotuned winner for this exact problem, then the
    # heuristic.
    reads = fused and (spec.bias or spec.c)
    tuned = None if forced else tuning.lookup(ops.problem, dev, epilogue=fused,
                                              epilogue_reads=reads)
    # Untuned, a narrow product's B of rows shorter than a sector may be read from a line copy.
    if not (forced or tuned or "b" in ops.copies or ops.b_pitch_mod8):
        reason = heuristics.narrow_b_copy_reason(ops.problem, operands.b_line_pitch(ops), dev)
        if reason:
            ops = operands.with_line_copy(ops, reason)
            tuned = tuning.lookup(ops.problem, dev, epilogue=fused, epilogue_reads=reads)
    choice = tuned or heuristics.choose(ops.problem, dev, forced, epilogue=fused,
                                        epilogue_reads=reads)
    if fused:
        choice = heuristics.with_epilogue(choice, spec)
    if row_store:
        choice = heuristics.row_store_choice(choice, ops.problem, dev,
                                             forced=forced is not None) or choice
    if ops.a_pitch_mod8 or ops.b_pitch_mod8:   # left where they lie: phase maps, or copies
        phased = heuristics.phased_choice(heuristics.phaseable(choice), ops.a_pitch_mod8,
                                          ops.b_pitch_mod8, ops.problem, dev,
                                          _row_alignment(a, b, shapes),
                                          keep_tile=forced is not None or tuned is not None)
        ops = operands.with_copied(ops, "" if phased is None else
                                   heuristics.phased_operands(phased.config))
        choice = choice if phased is None else phased
    return KernelCall(**{f.name: getattr(ops, f.name) for f in fields(ops)}, choice=choice)


def _run_kernel(p: Plan, a, b, result, user_out: bool, recipe_key) -> None:
    s = p.shapes
    chosen_at = fastpath.generation
    ep = p.epilogue
    overlapping = user_out and _overlaps_operands(result, a, b)
    call, store = _stored_call(a, b, s, None if ep is None else ep.spec, result,
                               result.itemsize, overlapping)
    epilogue_ptrs = ()
    repeatable = True
    if ep is not None:
        # Each CTA reads the bias and c elements of its own tile before storing it, so out may
        # be c itself; out overlapping them otherwise is read from a copy made first.
        repeatable = not (user_out and ep.overlaps(result))
        ep = ep.readable(result if user_out else None)
        repeatable = repeatable and not ep.c_copied
        epilogue_ptrs = ep.pointers()
    direct = store != "copy"
    c_buffer = None if direct else (s.batch, s.m, s.n, layout.padded(s.n, result.itemsize))
    if direct:  # the result itself (a 2-D out of any row stride for a row store)
        c3 = result.reshape(s.batch, s.m, s.n) if result.flags.c_contiguous else result[None]
    else:  # an aligned buffer, then one copy into the result (strided, overlapping, odd n)
        c3 = launch.padded_empty(*c_buffer, result.dtype)
    launches = launch.build_launches(call.choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, c3, ep)
    zero_tails = call.choice.schedule.reads_row_tails
    if zero_tails:
        for name in call.copies:
            launch.zero_row_tails(call.a3 if name == "a" else call.b3)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, c3.data.ptr,
                      *epilogue_ptrs)
    if not direct:
        launch.copy_rows(result, c3.reshape(s.out_shape))
    # Remember the launches when a later call can repeat them on its own base addresses:
    # operands read in place or through an aligned copy of a view of the caller's array (the
    # recipe makes the copy again), and a store that is not into an overlapping out.
    copies = {name: fastpath.OperandCopy.of(
                  x, call.views[name], x3, functools.partial(
                      _batch_view, is_vector=is_vector, axis=axis, batch_shape=s.batch_shape),
                  zero_tails)
              for name, x, x3, is_vector, axis in (("a", a, call.a3, s.a_is_vector, 0),
                                                   ("b", b, call.b3, s.b_is_vector, 1))
              if name in call.copies}
    if (recipe_key is not None and not overlapping and repeatable
            and None not in copies.values()):
        fastpath.remember(recipe_key, fastpath.make_recipe(
            s.out_shape, result.dtype, launches, a, b, result if user_out else None, result,
            copies.get("a"), copies.get("b"), c_buffer, ep), chosen_at)


def _overlaps_operands(out, a, b) -> bool:
    """Whether a caller's out shares memory with A or B (its result then goes through an
    aligned buffer, and the call is not remembered)."""
    return _overlap(out, a) or _overlap(out, b)


def _overlap(x, y) -> bool:
    """Whether two arrays' byte ranges intersect (also for views that CuPy wraps as separate
    allocations, e.g. from DLPack, which cupy.may_share_memory reports as disjoint)."""
    return layout.overlaps(layout.byte_bounds(x.data.ptr, x.shape, x.strides, x.itemsize),
                           layout.byte_bounds(y.data.ptr, y.shape, y.strides, y.itemsize))


def _grid(choice: heuristics.Choice, problem, dev: device_mod.DeviceInfo) -> tuple:
    """The grid of `choice`'s kernel on `problem` (the first launch of a long batch)."""
    sched = choice.schedule
    return sched.grid(sched.kernel_problem(problem, choice.config), choice.config,
                      min(problem.batch, layout.MAX_GRID_Z), sched.resident_ctas(dev),
                      choice.splits)


def _tail_line(tail: heuristics.Tail, problem, dev: device_mod.DeviceInfo) -> str:
    """explain's line for the second kernel of a choice with a tail."""
    t = tail.choice
    part = "rows" if tail.axis == "m" else "columns"
    grid = _grid(t, tail.problems(problem)[1], dev)
    return (f"tail: {part} {tail.start}-{getattr(problem, tail.axis) - 1}, launched after the "
            f"kernel above: {t.schedule.kernel_name(t.config)}, grid {grid}"
            + (f", {t.splits} splits along K" if t.schedule.split_k else "")
            + f"; {t.reason}")


@interop.accepts_torch
def explain(a, b, out=None, *, bias=None, activation=None, alpha=1.0, beta=0.0,
            c=None) -> str:
    """Which path `matmul(a, b, out, ...)` takes, with which schedule and config, and
    why; with epilogue keywords also the fused chain and where it runs."""
    p = plan(a, b, out, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c)
    s = p.shapes
    lines = [f"path: {p.path}", f"why: {p.reason}",
             f"shape: batch {s.batch_shape} x ({s.m} x {s.k}) @ ({s.k} x {s.n}) -> "
             f"{s.out_shape} {p.dtype}"]
    ep = p.epilogue
    if ep is not None:
        where = ("fused into the kernel: applied in fp32 to the accumulators before the one "
                 "rounding" if p.path == "kernel" else
                 "computed with CuPy on an fp32 product (float64 for float64), then one cast")
        operands = ", ".join(
            [f"alpha = {ep.alpha}"] + ([f"beta = {ep.beta}"] if ep.c is not None else [])
            + ([f"bias {tuple(ep.bias.shape)}"] if ep.bias is not None else [])
            + ([f"c {tuple(ep.c.shape)}" + ("" if ep.c_in_place else
                                              ", read from a contiguous copy")]
               if ep.c is not None else []))
        lines.append(f"epilogue: {ep.spec.describe()} ({operands}); {where}")
    if p.path == "kernel":
        overlapping = out is not None and _overlaps_operands(out, a, b)
        with a.device:
            call, store = _stored_call(a, b, p.shapes, None if ep is None else ep.spec, out,
                                       a.itemsize, overlapping)
        dev = device_mod.query(a.device.id)
        c, prob = call.choice, call.problem
        grid = _grid(c, c.tail.problems(prob)[0] if c.tail else prob, dev)
        lines += [f"layout: {prob.layout} (A {prob.a_major}-major, B {prob.b_major}-major)"
                  + (f"; aligned copies of {', '.join(call.copies)}" if call.copies else "")
                  + (f" ({call.b_copy_reason})" if call.b_copy_reason else ""),
                  f"output: {STORE_NOTES[store]}",
                  f"schedule: {c.schedule.name}",
                  f"consumers: {c.schedule.consumer_roles(c.config)}",
                  f"kernel: {c.schedule.kernel_name(c.config)}",
                  f"grid: {grid}, "
                  f"{c.schedule.threads(c.config)} threads, {c.schedule.smem_bytes(c.config)} B "
                  f"shared memory ({c.schedule.smem_note(c.config)})"
                  + (f", {c.splits} splits along K" if c.schedule.split_k else ""),
                  f"heuristic: {c.reason}"]
        if c.tail:
            lines.append(_tail_line(c.tail, prob, dev))
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

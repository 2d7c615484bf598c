"""Several products of one A: `matmul_shared_a(a, bs)` = [a @ b for b in bs], and
`swiglu(a, w_gate, w_up)` = silu(a @ w_gate) * (a @ w_up), an LLM MLP's gate and up
projections.

Two paths compute them:
- composed: one hopmm.matmul per B, its activation and bias fused; swiglu's two plain
  products (so that rows as few as decode's may take the gemv kernel, which has no
  epilogue), then silu(gate) * up of the two 16-bit results in one elementwise pass, in fp32.
- one kernel (the `shared_a` and `swiglu` schedules, kernel_dual_b.cuh): each A tile loaded
  once per k-block for two Bs, one wgmma per B in one commit group, one flush before the
  epilogue; swiglu's silu(gate) * up applied to the fp32 accumulators before its one
  rounding; 64-row tiles for products of at most 64 rows. It reads two Bs of one shape and
  layout, with neither bias nor an output that needs an aligned copy; other calls are
  composed. A call that read its operands in place is remembered and repeats its launches.
`use_schedule` naming a shared-A schedule forces the one kernel; else heuristics.dual_b_pays
decides by both paths' time models.

Every argument is validated, for every B, before anything is launched.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace

from . import api, device as device_mod, epilogue as epilogue_mod, fastpath, heuristics
from . import interop, launch, layout, operands
from .schedules import SharedASchedule, SwigluSchedule


@dataclass
class _Checked:
    """A validated call: each product's plan (api.Plan), the activation and the biases, and
    each product's plan key (_plan_key; None where not remembered)."""
    plans: list
    activation: str | None
    biases: list
    keys: list | None = None


def _sequence(fname: str, name: str, value) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fname}: {name} must be a list or tuple of arrays, got "
                        f"{type(value).__qualname__}")
    return list(value)


# Plans of recent products, by what validating and planning one depends on: the operands'
# fastpath key with the bias and activation (fastpath.fused_key), a forced schedule and
# HOPMM_STRICT. A repeated call skips api.plan, a matmul call's whole host path per B. Kept
# without their epilogue (which holds the bias array); a plan of an older choice (before
# autotune or fastpath.clear) is made again.
MAX_PLANS = 256
_plans = fastpath.Remembered(MAX_PLANS)
# Launches of recent one-kernel calls that read A and both Bs in place, by the schedule and
# both products' plan keys: a repeat allocates its results and launches, where building the
# tensor maps and launches again cost the host ~200 us a call (NOTES v0.48).
_dual_launches = fastpath.Remembered(MAX_PLANS)
# Keys (_dual_key) of recent calls whose products _one_kernel composed: a repeat does not ask
# it again, whose checks and model cost a composed call's host ~12 us (NOTES v0.49).
_composed = fastpath.Remembered(MAX_PLANS)
# Torch calls of the one kernel that repeat from the tensors' pointers on torch's current
# stream, without DLPack, which cost ~100 us of a 120 us call at decode sizes (NOTES v0.48):
# _torch_dual_key -> (launches, epilogue pointers, the results' shape).
_torch_dual = fastpath.Remembered(MAX_PLANS)


def _plan_key(a, b, bias, activation):
    """The key of one product's plan; None for a call that is not remembered."""
    k = fastpath.fused_key(a, b, None, dict(bias=bias, activation=activation, alpha=1.0,
                                            beta=0.0, c=None))
    if k is None:
        return None
    return k, api._schedule_override, fastpath.strict()


def _check(fname: str, a, bs: list, names: list, biases: list, activation) -> _Checked:
    """api.plan of every product, or its remembered plan (ValueError / TypeError naming the
    argument)."""
    plans, keys = [], []
    prev = None   # the previous B where its plan is remembered and it has no bias
    for b, name, bias in zip(bs, names, biases):
        if prev is not None and bias is None and _same_key_layout(b, prev):
            k, p = keys[-1], plans[-1]   # its key, so its plan: a fused key's work saved
        else:
            k = _plan_key(a, b, bias, activation)
            p = _plans.get(k)
            if p is None:
                try:
                    p = replace(api.plan(a, b, bias=bias, activation=activation),
                                epilogue=None)
                except (TypeError, ValueError, AttributeError) as exc:
                    raise type(exc)(f"{fname}: {name}: {exc}") from exc
                _plans.put(k, p)
        plans.append(p)
        keys.append(k)
        prev = b if k is not None and bias is None else None
    return _Checked(plans, activation, biases, keys)


def _same_key_layout(b, prev) -> bool:
    """Whether B `b` has the plan key of `prev`, a B whose key was made (a cupy array on the
    current device): what fastpath.fused_key reads of a B, its type, shape, strides, dtype,
    16-byte alignment and device, is the same."""
    if (type(b) is not type(prev) or b.shape != prev.shape or b.strides != prev.strides
            or b.dtype != prev.dtype):
        return False
    data, prev_data = b.data, prev.data
    return (data.device_id == prev_data.device_id
            and (data.ptr % layout.TMA_ALIGN == 0) == (prev_data.ptr % layout.TMA_ALIGN == 0))


def _torch_dual_key(schedule, a, b0, b1, activation):
    """What the remembered launches of a one-kernel call of torch operands depend on: each B's
    interop._tensor_key with A (shapes, strides, dtypes, alignment, the current device), the
    schedule, the activation, a forced schedule and HOPMM_STRICT. None where such a call is
    not repeated from its pointers."""
    if not (activation is None or type(activation) is str):
        return None
    k0 = interop._tensor_key(a, b0, None)
    k1 = None if k0 is None else interop._tensor_key(a, b1, None)
    if k1 is None:
        return None
    return schedule.name, k0, k1, activation, api._schedule_override, fastpath.strict()


def _torch_dual_repeat(schedule, a, b0, b1, activation) -> list | None:
    """The results (torch tensors) of a torch call through the one kernel's remembered
    launches, on the current torch stream; None where the call takes the full path."""
    k = _torch_dual_key(schedule, a, b0, b1, activation)
    entry = _torch_dual.get(k)
    if entry is None:
        return None
    launches, epilogue_ptrs, out_shape = entry
    torch = sys.modules["torch"]
    device = k[1][interop.TENSOR_KEY_DEVICE]
    results = [interop._empty(torch, out_shape, a.dtype, device)
               for _ in range(schedule.outputs)]
    launch.launch_all(launches, a.data_ptr(), b0.data_ptr(), results[0].data_ptr(),
                      b1.data_ptr(), *[r.data_ptr() for r in results[1:]], *epilogue_ptrs,
                      stream=interop._raw_stream(torch, device))
    return results


def _remember_torch_dual(schedule, tensors: tuple, arrays: tuple, activation, result) -> None:
    """After a torch call ran through DLPack views (`arrays` of `tensors`: A, B0, B1): where
    its one-kernel launches were remembered for the views, remember them for the tensors."""
    entry = _dual_launches.get((schedule.name,
                                *[_plan_key(arrays[0], b, None, activation)
                                  for b in arrays[1:]]))
    if entry is None:
        return
    k = _torch_dual_key(schedule, *tensors, activation)
    if k is not None:
        _torch_dual.put(k, (*entry, result.shape))


def _pair_operands(a, bs, *, bias=None, activation=None):
    """(a, b0, b1, activation) of a matmul_shared_a call the one kernel may repeat (two Bs, no
    bias); None for other calls."""
    if bias is not None or not isinstance(bs, (list, tuple)) or len(bs) != 2:
        return None
    return a, bs[0], bs[1], activation


def _pair_torch_repeat(*args, **kwargs):
    try:
        pair = _pair_operands(*args, **kwargs)
    except TypeError:   # a wrong call: the full path says what is wrong with it
        return None
    return None if pair is None else _torch_dual_repeat(SharedASchedule, *pair)


def _pair_torch_remember(args, kwargs, cupy_args, cupy_kwargs, result) -> None:
    pair = _pair_operands(*args, **kwargs)
    if pair is not None:
        _remember_torch_dual(SharedASchedule, pair[:3],
                             _pair_operands(*cupy_args, **cupy_kwargs)[:3], pair[3], result[0])


@interop.accepts_torch(repeat=_pair_torch_repeat, remember=_pair_torch_remember)
def matmul_shared_a(a, bs, *, bias=None, activation=None) -> list:
    """[activation(a @ b + bias_i) for b, bias_i in zip(bs, bias)]: several products of one
    `a` (cupy arrays, or CUDA torch tensors for torch results). `bs`: a list or tuple of
    operands as hopmm.matmul takes them; `bias`: None, or a sequence with one bias (or None)
    per B, each of shape (N,) or (M, 1); `activation`: as hopmm.matmul's, for every product.
    Each result is computed in fp32 and rounded once, as hopmm.matmul's."""
    fname = "hopmm.matmul_shared_a"
    bs = _sequence(fname, "bs", bs)
    if not bs:
        raise ValueError(f"{fname}: bs is empty; give at least one B")
    if bias is None:
        biases = [None] * len(bs)
    else:
        biases = _sequence(fname, "bias", bias)
        if len(biases) != len(bs):
            raise ValueError(f"{fname}: bias has {len(biases)} entries for {len(bs)} Bs; give "
                             f"one per B (None where a product has none)")
    names = [f"bs[{i}]" for i in range(len(bs))]
    checked = _check(fname, a, bs, names, biases, activation)
    out = [None] * len(bs)
    # Pairs of Bs of one shape and layout go through the shared-A kernel where it is forced
    # or its model pays (_one_kernel).
    i = 0
    while i < len(bs):
        pair = (_one_kernel_results(SharedASchedule, a, bs[i], bs[i + 1], checked, i)
                if i + 1 < len(bs) else None)
        if pair is not None:
            out[i], out[i + 1] = pair
            i += 2
            continue
        out[i] = api.matmul(a, bs[i], bias=biases[i], activation=activation)
        i += 1
    return out


def _swiglu_operands(a, w_gate, w_up):
    return a, w_gate, w_up


def _swiglu_torch_repeat(*args, **kwargs):
    try:
        operands_ = _swiglu_operands(*args, **kwargs)
    except TypeError:   # a wrong call: the full path says what is wrong with it
        return None
    results = _torch_dual_repeat(SwigluSchedule, *operands_, None)
    return None if results is None else results[0]


def _swiglu_torch_remember(args, kwargs, cupy_args, cupy_kwargs, result) -> None:
    _remember_torch_dual(SwigluSchedule, _swiglu_operands(*args, **kwargs),
                         _swiglu_operands(*cupy_args, **cupy_kwargs), None, result)


@interop.accepts_torch(repeat=_swiglu_torch_repeat, remember=_swiglu_torch_remember)
def swiglu(a, w_gate, w_up):
    """silu(a @ w_gate) * (a @ w_up), silu(x) = x * sigmoid(x): the gated unit of an LLM MLP
    (cupy arrays, or CUDA torch tensors for a torch result). `w_gate` and `w_up` have one
    shape; both products follow hopmm.matmul's rules (batches, vectors, any layout)."""
    fname = "hopmm.swiglu"
    checked = _check(fname, a, [w_gate, w_up], ["w_gate", "w_up"], [None, None], None)
    if getattr(w_gate, "shape", None) != getattr(w_up, "shape", None):
        raise ValueError(f"{fname}: w_gate has shape {w_gate.shape} and w_up {w_up.shape}; "
                         f"the gate and up projections must have one shape")
    results = _one_kernel_results(SwigluSchedule, a, w_gate, w_up, checked, 0)
    if results is not None:
        return results[0]
    gate = api.matmul(a, w_gate)
    up = api.matmul(a, w_up)
    with gate.device:
        if gate.dtype.itemsize == 2:   # float16, bfloat16: one pass, in fp32
            return _gated_product()(gate, up)
        import cupy

        return gate / (1 + cupy.exp(-gate)) * up


# swiglu's composed gating of two 16-bit products: silu(gate) * up formed in fp32 and rounded
# once (CuPy's float16 and bfloat16 convert to and from float).
GATED_PRODUCT = "float g = (float)gate; y = (T)(g / (1.0f + expf(-g)) * (float)up)"


@functools.lru_cache(maxsize=None)
def _gated_product():
    """silu(gate) * up of two 16-bit arrays in one elementwise pass (GATED_PRODUCT)."""
    import cupy

    return cupy.ElementwiseKernel("T gate, T up", "T y", GATED_PRODUCT, "hopmm_gated_product")


def _one_kernel(schedule, a, b0, b1, checked: _Checked, first: int) -> bool:
    """Whether products `first` and `first + 1` run on the shared-A `schedule`: where
    `use_schedule` names it, or names nothing and heuristics.dual_b_pays; and where both are on
    hopmm's kernels, with Bs of one shape, dtype and strides, no bias, and an output the
    kernel stores in place."""
    p0, p1 = checked.plans[first], checked.plans[first + 1]
    if api._schedule_override not in (None, schedule.name):
        return False
    if p0.path != "kernel" or p1.path != "kernel":
        return False
    if checked.biases[first] is not None or checked.biases[first + 1] is not None:
        return False
    if (b0.shape, b0.strides, b0.dtype) != (b1.shape, b1.strides, b1.dtype):
        return False
    # Of two Bs of one shape and strides, TMA reads both in place or neither (then both are
    # copied into aligned buffers of one layout): the kernel reads them through one map.
    if (b0.data.ptr % layout.TMA_ALIGN == 0) != (b1.data.ptr % layout.TMA_ALIGN == 0):
        return False
    if (p0.shapes.n * a.itemsize) % layout.TMA_ALIGN:
        return False
    if api._schedule_override is None:
        problem = operands.problem_of(p0.shapes, a.dtype.name, "cols", "cols")
        return heuristics.dual_b_pays(schedule, problem, device_mod.query(a.device.id))[0]
    return True


def _one_kernel_results(schedule, a, b0, b1, checked: _Checked, first: int) -> list | None:
    """Products `first` and `first + 1` on the one kernel `schedule` (its results), or None
    where they are composed. Launches remembered for the call's key are repeated, and a key
    remembered as composed is composed, without asking _one_kernel again: the key holds
    everything its answer depends on."""
    key = _dual_key(schedule, checked, first)
    remembered = _dual_launches.get(key)
    if remembered is None:
        if _composed.get(key) is not None:
            return None
        if not _one_kernel(schedule, a, b0, b1, checked, first):
            _composed.put(key, True)
            return None
    return _run_dual(schedule, a, b0, b1, checked.plans[first], checked.activation,
                     key=key, remembered=remembered)


def _dual_key(schedule, checked: _Checked, first: int):
    """The key of the remembered launches of products `first` and `first + 1` on the one
    kernel `schedule`; None where either product's plan is not remembered."""
    k0, k1 = checked.keys[first], checked.keys[first + 1]
    if k0 is None or k1 is None:
        return None
    return schedule.name, k0, k1


def _run_dual(schedule, a, b0, b1, p: api.Plan, activation, results=None, key=None,
              remembered=None) -> list:
    """Both products in one launch of `schedule` (SharedASchedule: two results;
    SwigluSchedule: one), into new arrays (or `results`, C-contiguous arrays of the output's
    shape and dtype: the GPU tests' poisoned buffers). The launches of a call that reads A
    and both Bs in place are remembered under `key` (_dual_key); `remembered`: those of an
    earlier call, repeated."""
    import cupy

    s = p.shapes
    if remembered is not None:
        # The key holds A's device, the current one: the results are made there.
        launches, epilogue_ptrs = remembered
        if results is None:
            results = [cupy.empty(s.out_shape, dtype=p.dtype) for _ in range(schedule.outputs)]
        launch.launch_all(launches, a.data.ptr, b0.data.ptr, results[0].data.ptr,
                          b1.data.ptr, *[r.data.ptr for r in results[1:]], *epilogue_ptrs)
        return results
    chosen_at = fastpath.generation
    with a.device:
        ops = operands.kernel_operands(a, b0, s)
        b_view, _ = operands.operand3d(operands.as_matrix_stack(b1, s.b_is_vector, 1),
                                       s.batch_shape)
        b13, _ = launch.prepare_operand(b_view)
        if b13.strides != ops.b3.strides:  # _one_kernel admits only Bs read alike
            raise RuntimeError(f"{schedule.name}: the two Bs are laid out differently "
                               f"({ops.b3.strides} and {b13.strides} bytes)")
        dev = device_mod.query(a.device.id)
        choice = heuristics.dual_b_choice(schedule, ops.problem, dev)
        ep = None
        if activation is not None:
            ep = epilogue_mod.resolve(s, p.dtype, a.device.id, bias=None,
                                      activation=activation, alpha=1.0, beta=0.0, c=None)
            choice = replace(choice, config=replace(choice.config, epilogue=ep.spec))
        if results is None:
            results = [cupy.empty(s.out_shape, dtype=p.dtype)
                       for _ in range(schedule.outputs)]
        c3s = [r.reshape(s.batch, s.m, s.n) for r in results]
        launches = launch.build_launches(choice, ops.problem, ops.a3, ops.a_map, ops.b3,
                                         ops.b_map, c3s[0], ep)
        extra = [b13.data.ptr] + [c3.data.ptr for c3 in c3s[1:]]
        epilogue_ptrs = ep.pointers() if ep is not None else ()
        launch.launch_all(launches, ops.a3.data.ptr, ops.b3.data.ptr, c3s[0].data.ptr,
                          *extra, *epilogue_ptrs)
    # The launches repeat on any A and Bs of this key read where they lie, as these were;
    # an activation-only chain's bias and c pointers are null (SharedASchedule.check).
    in_place = (ops.a3.data.ptr == a.data.ptr and ops.b3.data.ptr == b0.data.ptr
                and b13.data.ptr == b1.data.ptr and not ops.copies)
    if in_place and not any(epilogue_ptrs) and fastpath.generation == chosen_at:
        _dual_launches.put(key, (launches, epilogue_ptrs))
    return results


__all__ = ["matmul_shared_a", "swiglu"]

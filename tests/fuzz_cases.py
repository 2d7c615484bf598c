"""Seeded fuzz cases for hopmm.matmul against cupy.matmul, as plain data.

A case is drawn from (seed, index) alone, so any slice of a run can be replayed. Operands are
OperandSpecs (shape, dtype, and how the view lies in memory: transposed, stepped, negative
steps, an element offset that breaks 16-byte alignment, a batch broadcast with stride 0) or the
name of a bad operand (a Python number, a numpy array, a list, ...); `out` is the name of an
out form. `build` turns a case into arrays through an ArrayMaker, so the same cases run on host
memory in CPU tests (validation and planning) and on the GPU in bench/fuzz.py (results).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
KERNEL_DTYPES = ("float16", "bfloat16")
# Extents around hopmm's tile edges (64-row and 128-row tiles, 64-wide k-blocks) and the
# 16-byte TMA granularity (8 half-precision elements).
EDGE_EXTENTS = (1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 191, 256, 257)

# (None is not among them: cupy.matmul(None, x) crashes the process in CuPy 14's typed core
# routine; hopmm refuses it with a TypeError, tests/test_api_cpu.py checks.)
BAD_OPERANDS = ("py_float", "py_int", "py_complex", "py_bool", "np_scalar", "np_array", "list",
                "zero_d")
VALID_OUTS = ("fresh", "strided", "transposed", "alias_a", "castable_dtype")
BAD_OUTS = ("wrong_shape", "same_size", "uncastable", "numpy", "list")
# Out forms cupy.matmul takes on its 2-D path but numpy (and hopmm) refuse: an out of the
# result's size in another shape. bench/fuzz.py counts them apart, never as mismatches.
CUPY_LAX_OUTS = ("same_size",)

CATEGORIES = ("plain", "vector", "batched", "empty", "layout", "out", "bad_out",
              "bad_operand", "bad_shape", "dtype", "torch")


@dataclass(frozen=True)
class OperandSpec:
    shape: tuple
    dtype: str
    transposed: bool = False   # stored with its last two axes swapped (a .T / .mT view)
    steps: tuple = ()          # slicing step per stored axis (negative: reversed); () all 1
    offset: int = 0            # elements before the view's first element in its buffer
    expand: tuple = ()         # batch axes stored with extent 1, broadcast with stride 0

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Case:
    index: int
    category: str
    a: OperandSpec | str       # a str names a bad operand (BAD_OPERANDS)
    b: OperandSpec | str
    out: str | None = None     # an out form (VALID_OUTS, BAD_OUTS) or None
    torch: bool = False        # operands (and out) passed as torch tensors


def _extent(rng: random.Random, max_dim: int, low: int = 1) -> int:
    if rng.random() < 0.4:
        choices = [e for e in EDGE_EXTENTS if low <= e <= max_dim]
        if choices:
            return rng.choice(choices)
    return rng.randint(low, max_dim)


def _layout(rng: random.Random, spec: OperandSpec, negative: bool) -> OperandSpec:
    """spec laid out at random: transposed, stepped, offset, batch-broadcast."""
    ndim = len(spec.shape)
    transposed = ndim >= 2 and rng.random() < 0.5
    steps = ()
    if rng.random() < 0.4:
        pool = (1, 2, 3, -1, -2) if negative else (1, 2, 3)
        steps = tuple(rng.choice(pool) for _ in range(ndim))
    offset = rng.choice((0, 0, 1, 3, 8)) if rng.random() < 0.4 else 0
    expand = ()
    if ndim >= 3 and rng.random() < 0.3:
        expand = tuple(i for i in range(ndim - 2) if rng.random() < 0.5)
    return OperandSpec(spec.shape, spec.dtype, transposed, steps, offset, expand)


def _pair(m, k, n, dtype, batch_a=(), batch_b=(), a_dtype=None, b_dtype=None):
    return (OperandSpec(tuple(batch_a) + (m, k), a_dtype or dtype),
            OperandSpec(tuple(batch_b) + (k, n), b_dtype or dtype))


def _batches(rng: random.Random) -> tuple[tuple, tuple]:
    """Batch shapes that broadcast together (1s, fewer dims on one side)."""
    full = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
    a = tuple(1 if rng.random() < 0.3 else d for d in full)
    b = tuple(1 if rng.random() < 0.3 else d for d in full)
    return a[rng.randint(0, len(a)):] if rng.random() < 0.3 else a, b


def case(seed: int, index: int, max_dim: int = 300) -> Case:
    """Case `index` of the run seeded `seed`; extents up to max_dim (batches up to 4 each).
    Categories take turns; a runner without CUDA torch skips the "torch" ones, so case i is
    the same case everywhere."""
    rng = random.Random(f"hopmm-fuzz/{seed}/{index}")
    category = CATEGORIES[index % len(CATEGORIES)]
    dtype = rng.choice(KERNEL_DTYPES if rng.random() < 0.85 else FLOAT_DTYPES)
    m, k, n = (_extent(rng, max_dim) for _ in range(3))
    a, b = _pair(m, k, n, dtype)
    out = None
    if category == "vector":
        which = rng.choice(("a", "b", "ab"))
        a = OperandSpec((k,), dtype) if "a" in which else a
        b = OperandSpec((k,), dtype) if "b" in which else b
        if rng.random() < 0.3:
            a = OperandSpec((rng.randint(1, 3),) + a.shape, dtype) if a.shape[1:] else a
    elif category == "batched":
        a, b = _pair(m, k, n, dtype, *_batches(rng))
    elif category == "empty":
        dims = {"m": m, "k": k, "n": n}
        dims[rng.choice(("m", "k", "n", "batch"))] = 0
        batch = (0,) if "batch" in dims else ()
        a, b = _pair(dims["m"], dims["k"], dims["n"], dtype, batch, batch[:rng.randint(0, 1)])
        out = rng.choice((None, "fresh"))
    elif category == "layout":
        if rng.random() < 0.4:
            a, b = _pair(m, k, n, dtype, *_batches(rng))
        a, b = _layout(rng, a, True), _layout(rng, b, True)
    elif category == "out":
        out = rng.choice(VALID_OUTS)
        if out == "alias_a":    # out is a itself: a square in its last two axes
            a, b = _pair(m, n, n, dtype)
        if out == "castable_dtype":
            dtype = rng.choice(KERNEL_DTYPES)
            a, b = _pair(m, k, n, dtype)
        if out != "alias_a" and rng.random() < 0.5:
            a, b = _layout(rng, a, True), _layout(rng, b, True)
    elif category == "bad_out":
        out = rng.choice(BAD_OUTS)
        if rng.random() < 0.3:
            a, b = _pair(m, k, n, dtype, *_batches(rng))
    elif category == "bad_operand":
        bad = rng.choice(BAD_OPERANDS)
        a, b = (bad, b) if rng.random() < 0.5 else (a, bad)
        out = rng.choice((None, None, "fresh"))
    elif category == "bad_shape":
        kind = rng.choice(("k", "batch", "zero_d"))
        if kind == "k":
            b = OperandSpec((k + rng.randint(1, 5), n), dtype)
        elif kind == "batch":
            a, b = _pair(m, k, n, dtype, (2, 3), (3, 3))
        else:
            zero_d = OperandSpec((), dtype)
            a, b = (zero_d, b) if rng.random() < 0.5 else (a, zero_d)
        out = rng.choice((None, "fresh"))
    elif category == "dtype":
        pair = rng.choice((("float16", "float32"), ("bfloat16", "float32"),
                           ("float16", "bfloat16"), ("float32", "float32")))
        a, b = _pair(m, k, n, dtype, a_dtype=pair[0], b_dtype=pair[1])
        out = rng.choice((None, "fresh"))
    elif category == "torch":
        kind = rng.choice(("plain", "layout", "batched", "out", "vector"))
        if kind == "batched":
            a, b = _pair(m, k, n, dtype, *_batches(rng))
        if kind == "layout":   # (torch has no negative strides)
            a, b = _layout(rng, a, False), _layout(rng, b, False)
        if kind == "vector":
            a = OperandSpec((k,), dtype)
        out = "fresh" if kind == "out" else None
    return Case(index, category, a, b, out, torch=category == "torch")


def cases(seed: int, count: int, max_dim: int = 300, start: int = 0, torch: bool = True):
    """Cases start .. start + count - 1 (without the "torch" ones where torch is False)."""
    return [c for c in (case(seed, i, max_dim) for i in range(start, start + count))
            if torch or not c.torch]


# -- building ---------------------------------------------------------------------------------

class ArrayMaker:
    """How a runner makes arrays: `flat(n, dtype)` a 1-D buffer of n elements of the array
    library under test (cupy on the GPU or on host memory), `numpy` and `cupy` the modules."""

    def __init__(self, flat, cupy, numpy):
        self.flat, self.cupy, self.numpy = flat, cupy, numpy


def stored_shape(spec: OperandSpec) -> tuple:
    """The shape of the buffer's view before stepping, transposing and broadcasting."""
    shape = list(spec.shape)
    for axis in spec.expand:
        shape[axis] = 1
    if spec.transposed:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    steps = spec.steps or (1,) * len(shape)
    return tuple(s * abs(step) for s, step in zip(shape, steps))


def operand(spec: OperandSpec, maker: ArrayMaker):
    base_shape = stored_shape(spec)
    flat = maker.flat(spec.offset + math.prod(base_shape), spec.dtype)
    x = flat[spec.offset:].reshape(base_shape)
    if spec.steps:
        x = x[tuple(slice(None, None, step) for step in spec.steps)]
    if spec.transposed:
        x = x.swapaxes(-1, -2)
    if spec.expand:
        x = maker.cupy.broadcast_to(x, spec.shape)
    assert x.shape == spec.shape, (x.shape, spec)
    return x


def bad_operand(name: str, maker: ArrayMaker, dtype: str = "float16"):
    np = maker.numpy
    return {"py_float": 2.0, "py_int": 3, "py_complex": 1j, "py_bool": True,
            "np_scalar": np.float16(2), "np_array": np.ones((4, 4), np.float16),
            "list": [[1.0] * 4] * 4,
            "zero_d": operand(OperandSpec((), dtype), maker)}[name]


def result_shape(a, b, numpy):
    """numpy.matmul's result shape for arrays a and b (its signature (n?,k),(k,m?)->(n?,m?)
    and numpy's batch broadcasting), or None where numpy refuses their shapes."""
    if a.ndim == 0 or b.ndim == 0:
        return None
    a2 = (1,) + a.shape if a.ndim == 1 else a.shape
    b2 = b.shape + (1,) if b.ndim == 1 else b.shape
    if a2[-1] != b2[-2]:
        return None
    try:
        batch = numpy.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        return None
    return batch + a2[-2:-1] * (a.ndim > 1) + b2[-1:] * (b.ndim > 1)


def result_dtype(a, b, numpy):
    """numpy's result dtype for a and b, or None where they have no common type."""
    try:
        return numpy.promote_types(a.dtype, b.dtype)
    except TypeError:
        return None


def out_array(form: str, a, b, maker: ArrayMaker):
    """The out of form `form` for operands a, b (cupy arrays), or None without one."""
    np = maker.numpy
    shape = result_shape(a, b, np) or (4, 4)
    dtype = result_dtype(a, b, np) or np.dtype(a.dtype)
    size = math.prod(shape)
    if form == "fresh":
        return operand(OperandSpec(shape, dtype.name), maker)
    if form == "strided":   # every other row of a taller buffer (or reversed for vectors)
        steps = (1,) * (len(shape) - 2) + (2, 1) if len(shape) >= 2 else (-1,) * len(shape)
        return operand(OperandSpec(shape, dtype.name, steps=steps), maker)
    if form == "transposed":
        return operand(OperandSpec(shape, dtype.name, transposed=len(shape) >= 2), maker)
    if form == "alias_a":
        return a
    if form == "castable_dtype":
        return operand(OperandSpec(shape, "float32"), maker)
    if form == "wrong_shape":
        return operand(OperandSpec(shape[:-1] + (shape[-1] + 1,) if shape else (1,),
                                   dtype.name), maker)
    if form == "same_size":   # the same elements in another shape (numpy refuses it)
        return operand(OperandSpec((size,) if len(shape) != 1 else (size, 1), dtype.name),
                       maker)
    if form == "uncastable":
        return operand(OperandSpec(shape, "int32"), maker)
    if form == "numpy":
        return np.zeros(shape, np.float32)
    if form == "list":
        return [[0.0]]
    raise ValueError(f"unknown out form {form!r}")


def build(c: Case, maker: ArrayMaker):
    """(a, b, out) of case c as cupy arrays (bad operands as they are)."""
    dtype = next((x.dtype for x in (c.a, c.b) if isinstance(x, OperandSpec)), "float16")
    a = operand(c.a, maker) if isinstance(c.a, OperandSpec) else bad_operand(c.a, maker, dtype)
    b = operand(c.b, maker) if isinstance(c.b, OperandSpec) else bad_operand(c.b, maker, dtype)
    if c.out is None:
        return a, b, None
    if isinstance(c.a, str) or isinstance(c.b, str):   # an out of a plausible shape
        cupy_ops = [x for x in (a, b) if isinstance(x, maker.cupy.ndarray) and x.ndim == 2]
        ref = cupy_ops[0] if cupy_ops else operand(OperandSpec((4, 4), dtype), maker)
        return a, b, operand(OperandSpec(ref.shape, dtype), maker)
    return a, b, out_array(c.out, a, b, maker)


# -- comparing outcomes -----------------------------------------------------------------------

# The exception classes parity is judged by: a subclass (numpy's DTypePromotionError, a
# UFuncTypeError) counts as its builtin base, as `except TypeError` would see it.
PARITY_EXCEPTIONS = (TypeError, ValueError, AttributeError, IndexError)


def error_kind(exc: BaseException) -> str:
    """The name of the first builtin class of PARITY_EXCEPTIONS that exc is, else its own."""
    for cls in PARITY_EXCEPTIONS:
        if isinstance(exc, cls):
            return cls.__name__
    return type(exc).__name__


def cupy_lax(c: Case) -> bool:
    """Whether cupy.matmul may accept this case where numpy and hopmm refuse it."""
    return c.out in CUPY_LAX_OUTS

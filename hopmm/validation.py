"""hopmm.matmul's argument checks, raising the exception type cupy.matmul raises for the same
bad input.

cupy.matmul (CuPy 14) is a generalized ufunc with a fast call: with no `out`, or with an `out`
when a, b and out are all cupy arrays of one dtype, it calls the typed core routine, which
refuses anything but a cupy array with a TypeError. Otherwise (an `out` and operands that are
not all cupy arrays of out's dtype) the gufunc machinery runs, and its order of checks decides
the exception: it reads each operand's dtype (AttributeError for a Python number or a list),
promotes them (TypeError), requires a cupy `out` (TypeError), checks dimensions and shapes
(ValueError, numpy scalars and 0-d arrays included), out's shape (ValueError) and the cast into
out (TypeError), and only then hands the operands to the core routine (TypeError for a numpy
array). Every check here follows that order; hopmm's own wording names the argument.

One deliberate difference: where cupy.matmul takes a 2-D `out` of the result's size but another
shape (or any shape when k = 0), hopmm refuses it with numpy's ValueError.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import layout


def is_cupy_array(x) -> bool:
    import cupy

    return isinstance(x, cupy.ndarray)


def kind(x) -> str:
    """The type of x as an error message names it."""
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _not_an_array(name: str, x) -> str:
    if isinstance(x, (bool, int, float, complex)):
        return (f"hopmm.matmul: operand {name} is a Python {kind(x)}, not an array (scalar "
                f"operands are not allowed, use '*' instead)")
    foreign = " (mixed torch and cupy operands are refused: pass all of them as one kind)" \
        if type(x).__module__.startswith("torch") else \
        " (use cupy.asarray to move it to the GPU)"
    return f"hopmm.matmul: operand {name} must be a cupy.ndarray, got {kind(x)}{foreign}"


@dataclass(frozen=True)
class Checked:
    shapes: layout.MatmulShapes
    dtype: object   # the result's dtype


def check(a, b, out) -> Checked:
    """Validates a call as cupy.matmul would (see the module's docstring); no GPU work."""
    all_cupy = is_cupy_array(a) and is_cupy_array(b)
    if out is None:
        for name, x in (("a", a), ("b", b)):
            if not is_cupy_array(x):
                raise TypeError(_not_an_array(name, x))
        return _shapes_and_dtype(a, b, None)
    if all_cupy and is_cupy_array(out) and a.dtype == b.dtype == out.dtype:
        return _shapes_and_dtype(a, b, out)   # cupy's fast call: the core routine's checks
    # cupy's gufunc path: dtypes first, then out's type, shapes, out's shape and cast.
    for name, x in (("a", a), ("b", b)):
        if not hasattr(x, "dtype"):
            raise AttributeError(_not_an_array(name, x))
    dtype = result_dtype(a.dtype, b.dtype)
    if not is_cupy_array(out):
        raise TypeError(f"hopmm.matmul: out must be a cupy.ndarray, got {kind(out)}")
    checked = _shapes_and_dtype(a, b, out, dtype)
    for name, x in (("a", a), ("b", b)):
        if not is_cupy_array(x):
            raise TypeError(_not_an_array(name, x))
    return checked


def result_dtype(a_dtype, b_dtype):
    import numpy

    try:
        return numpy.promote_types(a_dtype, b_dtype)
    except TypeError as exc:  # e.g. bfloat16 with float16: NumPy knows no common type
        raise TypeError(f"hopmm.matmul: no common dtype for {a_dtype} and {b_dtype}") from exc


def _shapes_and_dtype(a, b, out, dtype=None) -> Checked:
    import numpy

    shapes = layout.matmul_shapes(a.shape, b.shape)
    if dtype is None:
        dtype = result_dtype(a.dtype, b.dtype)
    if out is not None:
        if out.shape != shapes.out_shape:
            raise ValueError(f"hopmm.matmul: out has shape {out.shape}, the result has shape "
                             f"{shapes.out_shape}")
        if not numpy.can_cast(dtype, out.dtype, casting="same_kind"):
            raise TypeError(f"hopmm.matmul: cannot cast the result dtype {dtype} to out's "
                            f"dtype {out.dtype} (casting='same_kind')")
    return Checked(shapes, dtype)

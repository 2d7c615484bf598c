"""Repeat calls skip the planning: a call whose operands match an earlier call's shapes,
strides, dtypes, 16-byte alignment and device reuses the launches built for it and only
substitutes the new base addresses. Only calls that ran on hopmm's kernels with no operand
copy and a direct store are remembered; anything else takes the full path every time."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from . import launch
from .layout import TMA_ALIGN

MAX_RECIPES = 4096


@dataclass(frozen=True)
class Recipe:
    out_shape: tuple
    dtype: object
    launches: list
    a_span: int   # bytes from each operand's base to one past its last element
    b_span: int

    def run(self, a, b, out):
        """The result, or None when this call must take the full path (out overlaps)."""
        import cupy

        a_ptr, b_ptr = a.data.ptr, b.data.ptr
        if out is None:
            result = cupy.empty(self.out_shape, dtype=self.dtype)
        else:
            o, o_end = out.data.ptr, out.data.ptr + out.nbytes
            if o < a_ptr + self.a_span and a_ptr < o_end or o < b_ptr + self.b_span and b_ptr < o_end:
                return None
            result = out
        launch.launch_all(self.launches, a_ptr, b_ptr, result.data.ptr)
        return result


def span(x) -> int:
    """Bytes from x's base pointer to one past its last element (non-negative strides)."""
    return sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.itemsize if x.size else 0


_recipes: dict = {}
_lock = threading.Lock()


def key(a, b, out):
    """What every decision of a call depends on, or None for calls that are never cached."""
    import cupy

    if type(a) is not cupy.ndarray or type(b) is not cupy.ndarray:
        return None
    device = cupy.cuda.runtime.getDevice()
    if a.data.device_id != device or b.data.device_id != device:
        return None
    ops = (a.shape, a.strides, a.dtype, a.data.ptr % TMA_ALIGN == 0,
           b.shape, b.strides, b.dtype, b.data.ptr % TMA_ALIGN == 0, device)
    if out is None:
        return ops
    if type(out) is not cupy.ndarray or out.data.device_id != device:
        return None
    return ops + (out.shape, out.strides, out.dtype, out.data.ptr % TMA_ALIGN == 0)


def lookup(k):
    return _recipes.get(k)


def remember(k, recipe: Recipe) -> None:
    with _lock:
        if len(_recipes) >= MAX_RECIPES:
            _recipes.clear()  # a workload with this many shapes gains little from the cache
        _recipes[k] = recipe


def clear() -> None:
    with _lock:
        _recipes.clear()

"""Repeat calls skip the planning: a call whose operands match an earlier call's shapes,
strides, dtypes, 16-byte alignment and device reuses the launches built for it and only
substitutes the new base addresses. Calls that ran on hopmm's kernels are remembered with the
aligned copies they made of views of the caller's operands and the aligned result buffer they
stored through, which a repeat makes again; calls that materialised another copy (a broadcast,
a reshape that could not be a view) or stored into an overlapping out take the full path every
time. A call that read its operands in place and stored straight into its result repeats
through one call into the extension (DirectRecipe), the host cost of a repeat kept to a few
Python statements."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

from . import _tensormap, launch, row_copy
from . import device as device_mod
from .layout import TMA_ALIGN, byte_bounds, overlaps

MAX_RECIPES = 4096

# CuPy, bound by the first call rather than at import (hopmm imports without CuPy): an
# `import cupy` statement costs a few hundred ns on every call, a global a few dozen.
_cupy = None


def _bind_cupy():
    global _cupy
    import cupy

    _cupy = cupy
    return cupy


@dataclass(frozen=True)
class OperandCopy:
    """How a call made the aligned copy the kernel read: `view_of(x)` is the (batch, rows,
    cols) view of the caller's operand that it copied (reshapes and indexing only), and
    `padded_shape` the (batch, rows, pitch) buffer it copied into. Where the view is one
    matrix with contiguous rows, `rows_at` is (its offset from x's base pointer, its row
    stride, its row bytes), all in bytes: fixed by x's shape and strides, which the recipe's key
    holds, so a repeat copies from x's pointer without making the view. `zero_tails`: the
    kernel reads row tails (launch.zero_row_tails), which each copy then zeroes."""
    view_of: Callable
    padded_shape: tuple
    rows_at: tuple | None = None
    zero_tails: bool = False

    @classmethod
    def of(cls, x, view, copy, view_of: Callable, zero_tails: bool = False):
        """The recipe of `copy`, made from `view` of `x`; None where the view does not lie in
        x's own memory (a materialised broadcast or reshape: not repeatable as a view)."""
        x_bounds = byte_bounds(x.data.ptr, x.shape, x.strides, x.itemsize)
        view_bounds = byte_bounds(view.data.ptr, view.shape, view.strides, view.itemsize)
        if not overlaps(x_bounds, view_bounds) or copy.data.ptr == view.data.ptr:
            return None
        rows = launch.matrix_rows(view)
        rows_at = None if rows is None else (rows.ptr - x.data.ptr, rows.stride, rows.width)
        return cls(view_of, (copy.shape[0], copy.shape[1], copy.strides[1] // copy.itemsize),
                   rows_at, zero_tails)

    def make(self, x):
        """A new aligned copy of x's view: a (batch, rows, pitch) buffer whose first columns
        hold it (the launches read it through its pointer)."""
        import cupy

        batch, rows, pitch = self.padded_shape
        buf = cupy.empty((batch, rows, pitch), dtype=x.dtype)
        if self.rows_at is not None:
            offset, stride, width = self.rows_at
            if launch.pitched_copy(buf.data.ptr, pitch * x.itemsize, x.data.ptr + offset,
                                   stride, width, rows):
                if self.zero_tails:
                    launch.zero_row_tails(buf[:, :, :width // x.itemsize])
                return buf
        view = self.view_of(x)
        launch.copy_rows(buf[:, :, :view.shape[2]], view)
        if self.zero_tails:
            launch.zero_row_tails(buf[:, :, :view.shape[2]])
        return buf


# Offsets of the parts of a repeat's scratch (ScratchCopies): TMA wants 16-byte aligned bases;
# CuPy's pool hands out 256-byte aligned blocks, kept for every part.
SCRATCH_ALIGN = 256


@dataclass(frozen=True)
class ScratchCopies:
    """How a repeat makes its aligned copies and its result buffer: all in one scratch
    allocation of `nbytes`, the operands' rows copied by one launch of hopmm's row-copy kernel
    (row_copy.py) before the product's launches and the result's by one after, where each
    copy was a cudaMemcpy2DAsync and an allocation of its own. `*_at`: byte offsets into the
    scratch, None where the operand is read in place (the result stored in place);
    `*_src`: the copied rows' byte offsets from the operand's base pointer."""
    nbytes: int
    a_at: int | None
    a_src: int
    b_at: int | None
    b_src: int
    c_at: int | None
    copy_in: object | None    # KernelLaunch (src0, dst0, src1, dst1) of the operands' copies
    copy_out: object | None   # KernelLaunch (src, dst, 0, 0) of the result's

    def run(self, launches: list, a_ptr: int, b_ptr: int, result_ptr: int,
            epilogue_ptrs: tuple) -> None:
        cupy = _cupy or _bind_cupy()
        # Referenced until every launch reading it is queued: CuPy's pool then hands the
        # memory only to work queued after them on this stream.
        scratch = cupy.empty(self.nbytes, dtype=cupy.uint8)
        base = scratch.data.ptr
        stream = cupy.cuda.get_current_stream().ptr
        a_read = a_ptr if self.a_at is None else base + self.a_at
        b_read = b_ptr if self.b_at is None else base + self.b_at
        if self.copy_in is not None:
            pointers = []
            if self.a_at is not None:
                pointers += [a_ptr + self.a_src, a_read]
            if self.b_at is not None:
                pointers += [b_ptr + self.b_src, b_read]
            self.copy_in.launch(stream, *pointers, *[0] * (row_copy.POINTERS - len(pointers)))
        c_ptr = result_ptr if self.c_at is None else base + self.c_at
        launch.launch_all(launches, a_read, b_read, c_ptr, *epilogue_ptrs, stream=stream)
        if self.copy_out is not None:
            self.copy_out.launch(stream, c_ptr, result_ptr, 0, 0)


def scratch_copies(result, a_copy: OperandCopy | None, b_copy: OperandCopy | None,
                   c_buffer: tuple | None) -> ScratchCopies | None:
    """The ScratchCopies of a recipe whose launches read `a_copy` / `b_copy` and store through
    `c_buffer` into `result` (its strides are the key's); None where one of them is not one
    matrix of 16-bit rows (a batch, a view the copy kernel cannot address): such a recipe
    copies as the first call did."""
    cupy = _cupy or _bind_cupy()
    item = result.itemsize
    if item != row_copy.ELEM_BYTES:
        return None
    nbytes = 0

    def take(size: int) -> int:
        nonlocal nbytes
        at = nbytes
        nbytes += -(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN
        return at

    jobs, places = [], {}
    for name, copy in (("a", a_copy), ("b", b_copy)):
        if copy is None:
            places[name] = (None, 0)
            continue
        batch, rows, pitch = copy.padded_shape
        if copy.rows_at is None or batch != 1 or copy.rows_at[1] % item:
            return None
        offset, stride, width = copy.rows_at
        jobs.append(row_copy.RowJob(rows, width // item, stride // item, pitch, pad=True))
        places[name] = (take(rows * pitch * item), offset)
    out_job = c_at = None
    if c_buffer is not None:
        batch, m, n, pitch = c_buffer
        if batch != 1:
            return None
        if result.flags.c_contiguous:
            dst_pitch = n
        else:
            rows = launch.matrix_rows(result)
            if rows is None or (rows.rows, rows.width) != (m, n * item) or rows.stride % item:
                return None
            dst_pitch = rows.stride // item
        out_job = row_copy.RowJob(m, n, pitch, dst_pitch, pad=False)
        c_at = take(m * pitch * item)
    if not jobs and out_job is None:
        return None
    device_id = cupy.cuda.Device().id
    sm_count = device_mod.query(device_id).sm_count
    copy_in = row_copy.launcher(jobs, device_id, sm_count) if jobs else None
    copy_out = (row_copy.launcher([out_job], device_id, sm_count)
                if out_job is not None else None)
    if (jobs and copy_in is None) or (out_job is not None and copy_out is None):
        return None
    return ScratchCopies(nbytes, *places["a"], *places["b"], c_at, copy_in, copy_out)


@dataclass(frozen=True)
class Recipe:
    out_shape: tuple
    dtype: object
    launches: list
    a_bounds: tuple   # byte bounds of each operand, relative to its base pointer
    b_bounds: tuple
    a_copy: OperandCopy | None = None   # the kernel reads an aligned copy of A (of B)
    b_copy: OperandCopy | None = None
    # (batch, m, n, padded n): the kernel stores into an aligned buffer, then one copy
    c_buffer: tuple | None = None
    # Byte bounds of the caller's out relative to its base pointer (fixed: the key holds out's
    # shape and strides); None for a recipe of calls without out, whose key never matches a
    # call with one.
    out_bounds: tuple | None = None
    # The copies and the result buffer through hopmm's row-copy kernel, where it takes them.
    scratch: ScratchCopies | None = None

    def run(self, a, b, out, *epilogue_ptrs):
        """The result, or None when this call must take the full path (out overlaps).
        `epilogue_ptrs`: a fused epilogue's bias and c pointers."""
        cupy = _cupy or _bind_cupy()
        a_ptr, b_ptr = a.data.ptr, b.data.ptr
        if out is None:
            result = cupy.empty(self.out_shape, dtype=self.dtype)
        else:
            o_ptr, (lo, hi) = out.data.ptr, self.out_bounds
            o = (o_ptr + lo, o_ptr + hi)
            if (overlaps(o, (a_ptr + self.a_bounds[0], a_ptr + self.a_bounds[1]))
                    or overlaps(o, (b_ptr + self.b_bounds[0], b_ptr + self.b_bounds[1]))):
                return None
            result = out
        if self.scratch is not None:
            self.scratch.run(self.launches, a_ptr, b_ptr, result.data.ptr, epilogue_ptrs)
            return result
        # The copies stay referenced until the launches are queued after them on this stream.
        a_read = self.a_copy.make(a) if self.a_copy else a
        b_read = self.b_copy.make(b) if self.b_copy else b
        if self.c_buffer is None:
            launch.launch_all(self.launches, a_read.data.ptr, b_read.data.ptr, result.data.ptr,
                              *epilogue_ptrs)
            return result
        batch, m, n, pitch = self.c_buffer
        c3 = cupy.empty((batch, m, pitch), dtype=self.dtype)
        launch.launch_all(self.launches, a_read.data.ptr, b_read.data.ptr, c3.data.ptr,
                          *epilogue_ptrs)
        # One matrix of m rows of n elements (not a vector or a batch): straight from c3.
        rows = launch.matrix_rows(result) if batch == 1 else None
        if (rows is None or (rows.rows, rows.width) != (m, n * c3.itemsize)
                or not launch.pitched_copy(rows.ptr, rows.stride, c3.data.ptr,
                                           pitch * c3.itemsize, rows.width, m)):
            launch.copy_rows(result, c3[:, :, :n].reshape(self.out_shape))
        return result


@dataclass(frozen=True)
class DirectRecipe:
    """A call that read the caller's A and B in place and stored straight into its result,
    through plain launches: its DirectRepeat checks out against A and B and launches them
    all, in one call into the extension."""
    out_shape: tuple
    dtype: object
    repeat: object   # _tensormap.DirectRepeat

    def run(self, a, b, out):
        """The result, or None when this call must take the full path (out overlaps)."""
        cupy = _cupy or _bind_cupy()
        # A new result cannot overlap A or B: the recipe of calls without out has no bounds.
        result = cupy.empty(self.out_shape, dtype=self.dtype) if out is None else out
        if self.repeat.run(cupy.cuda.get_current_stream().ptr, a.data.ptr, b.data.ptr,
                           result.data.ptr):
            return result
        return None


@dataclass(frozen=True)
class FusedDirectRecipe:
    """DirectRecipe of a call with a fused epilogue: its DirectRepeat also takes the bias and
    c pointers, and checks out against them too (out may be c itself)."""
    out_shape: tuple
    dtype: object
    repeat: object   # _tensormap.DirectRepeat with epilogue bounds

    def run(self, a, b, out, bias_ptr: int, c_ptr: int):
        """The result, or None when this call must take the full path (out overlaps)."""
        cupy = _cupy or _bind_cupy()
        result = cupy.empty(self.out_shape, dtype=self.dtype) if out is None else out
        if self.repeat.run_fused(cupy.cuda.get_current_stream().ptr, a.data.ptr, b.data.ptr,
                                 result.data.ptr, bias_ptr, c_ptr):
            return result
        return None


# HOPMM_STRICT=1: a call that would fall back to cupy.matmul raises (api.FallbackError).
STRICT_ENV = "HOPMM_STRICT"


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class RouteRecipe:
    """A plain call that api.plan sent to cupy.matmul (a dtype or device hopmm's kernels do
    not take, or heuristics.copy_route_reason): a repeat calls cupy.matmul straight away,
    since planning such a call costs more host time than a small product takes on the GPU.
    Under HOPMM_STRICT a repeat takes the full path (which raises, or for a call routed for
    its copies' cost runs hopmm's kernels)."""

    def run(self, a, b, out):
        if strict():
            return None
        cupy = _cupy or _bind_cupy()
        return cupy.matmul(a, b, out=out)


ROUTE = RouteRecipe()

# cuBLAS's gemmEx as cupy.matmul calls it for two 16-bit matrices: fp32 compute, the default
# algorithm, host scalars (the library's enum values).
CUDA_R_16F = 2
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N = 0
_GEMM_TYPES = {"float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
# fp32 1 and 0 on the host, and their addresses (read once: numpy's ctypes.data costs ~1.5 us
# a read), made with the first GemmRoute.
_SCALARS = None
_ONE_PTR = _ZERO_PTR = 0


@dataclass(frozen=True)
class GemmRoute:
    """RouteRecipe of a call of two C-contiguous 16-bit matrices into a new result: a repeat
    calls cuBLAS's gemmEx itself, with the arguments cupy.matmul passes under CuPy's default
    compute type (its result bit for bit: tests/test_gpu_heuristic.py), without cupy.matmul's
    host path, which set the pace of routed products of ~30 us on the GPU back to back (NOTES
    v0.47, v0.48).
    The row-major product C = A @ B is cuBLAS's column-major C^T = B^T @ A^T."""
    m: int
    n: int
    k: int
    data_type: int
    dtype: object
    cublas: object   # CuPy's cuBLAS module, bound once (an attribute it imports on access)

    def run(self, a, b, out):
        # Remembered only under keys of calls without out: `out` is None here.
        if strict():
            return None
        cupy = _cupy or _bind_cupy()
        cublas = self.cublas
        result = cupy.empty((self.m, self.n), dtype=self.dtype)
        # The current device's and thread's handle, on the current stream, as cupy.matmul's.
        handle = cupy.cuda.device.get_cublas_handle()
        cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
        cublas.gemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, self.n, self.m, self.k, _ONE_PTR,
                      b.data.ptr, self.data_type, self.n, a.data.ptr, self.data_type, self.k,
                      _ZERO_PTR, result.data.ptr, self.data_type, self.n, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT)
        return result


def route_recipe(a, b, out):
    """The recipe repeating a call api.plan routed to cupy.matmul: a GemmRoute where it is two
    C-contiguous 16-bit matrices of one dtype and no out, else ROUTE."""
    global _SCALARS, _ONE_PTR, _ZERO_PTR
    data_type = _GEMM_TYPES.get(a.dtype.name)
    if (out is not None or data_type is None or a.dtype != b.dtype or a.ndim != 2
            or b.ndim != 2 or not (a.flags.c_contiguous and b.flags.c_contiguous)
            or 0 in a.shape or 0 in b.shape):
        return ROUTE
    if _SCALARS is None:
        import numpy

        _SCALARS = numpy.array([1.0, 0.0], numpy.float32)
        _ONE_PTR = _SCALARS.ctypes.data
        _ZERO_PTR = _ONE_PTR + _SCALARS.itemsize
    cupy = _cupy or _bind_cupy()
    return GemmRoute(a.shape[0], b.shape[1], a.shape[1], data_type, a.dtype, cupy.cuda.cublas)


def relative_bounds(x) -> tuple[int, int]:
    """Byte bounds of x relative to its base pointer."""
    return byte_bounds(0, x.shape, x.strides, x.itemsize)


# The index of c among a fused launch's epilogue pointers (bias, c).
EPILOGUE_C = 1


def make_recipe(out_shape: tuple, dtype, launches: list, a, b, out, result,
                a_copy: OperandCopy | None = None, b_copy: OperandCopy | None = None,
                c_buffer: tuple | None = None, epilogue=None):
    """The recipe repeating a call of operands a, b (and the caller's out, or None) into
    `result` (out, or the array made for it) whose launches read `a_copy`/`b_copy` of them
    and stored through `c_buffer` where not None; `epilogue`: the call's FusedEpilogue (its
    launches also take bias's and c's pointers), or None. A Recipe, or a DirectRecipe
    (FusedDirectRecipe) where the launches read and store in place."""
    a_bounds, b_bounds = relative_bounds(a), relative_bounds(b)
    out_bounds = None if out is None else relative_bounds(out)
    # Split-K's WorkspaceLaunch looks up its stream's workspace in Python: not direct.
    plain = all(isinstance(x, _tensormap.KernelLaunch) for x in launches)
    if plain and a_copy is None and b_copy is None and c_buffer is None:
        if epilogue is None:
            return DirectRecipe(out_shape, dtype, _tensormap.DirectRepeat(
                launches, a_bounds, b_bounds, out_bounds))
        bias, c = epilogue.bias, epilogue.c   # c: None where beta = 0 (not read)
        out_may_be_c = (out is not None and c is not None and out.shape == c.shape
                        and out.strides == c.strides)
        return FusedDirectRecipe(out_shape, dtype, _tensormap.DirectRepeat(
            launches, a_bounds, b_bounds, out_bounds,
            [None if x is None else relative_bounds(x) for x in (bias, c)],
            EPILOGUE_C if out_may_be_c else -1))
    return Recipe(out_shape, dtype, launches, a_bounds, b_bounds, a_copy, b_copy, c_buffer,
                  out_bounds, scratch_copies(result, a_copy, b_copy, c_buffer))


_recipes: dict = {}
_lock = threading.Lock()
# Bumped by clear(): a call that chose its kernel before a clear() (use_schedule, autotune)
# must not remember launches built from that older choice.
generation = 0


def repeat(a, b, out):
    """(result, key): the result of this call from the recipe remembered under its key, None
    where it takes the full path (no recipe, or the recipe declines it), and key(a, b, out).
    The whole host path of a repeat is a few calls."""
    k = key(a, b, out)
    if k is None:
        return None, None
    recipe = _recipes.get(k)
    return (None if recipe is None else recipe.run(a, b, out)), k


def key(a, b, out):
    """The key of a call's recipe: what every decision of the call depends on; None for calls
    that are never remembered (operands that are not cupy arrays on the current device)."""
    cupy = _cupy or _bind_cupy()
    ndarray = cupy.ndarray
    if type(a) is not ndarray or type(b) is not ndarray:
        return None
    device = cupy.cuda.runtime.getDevice()
    a_data, b_data = a.data, b.data
    if a_data.device_id != device or b_data.device_id != device:
        return None
    k = (a.shape, a.strides, a.dtype, a_data.ptr % TMA_ALIGN == 0,
         b.shape, b.strides, b.dtype, b_data.ptr % TMA_ALIGN == 0, device)
    if out is not None:
        if type(out) is not ndarray:
            return None
        out_data = out.data
        if out_data.device_id != device:
            return None
        k += (out.shape, out.strides, out.dtype, out_data.ptr % TMA_ALIGN == 0)
    return k


def _epilogue_operand_key(x, device):
    """What the validation and the launches of a fused call depend on in bias or c; False
    where the call must take the full path (not an array of this device)."""
    if x is None:
        return None
    if type(x) is not _cupy.ndarray or x.data.device_id != device:
        return False
    return (x.shape, x.strides, x.dtype)


def fused_key(a, b, out, keywords: dict):
    """key() for a call with epilogue keywords (matmul's `bias`, `activation`, `alpha`,
    `beta`, `c`): it adds every keyword (values and types; bias's and c's shapes, strides and
    dtypes). None for calls that are never remembered."""
    cupy = _cupy or _bind_cupy()
    ndarray = cupy.ndarray
    if type(a) is not ndarray or type(b) is not ndarray:
        return None
    device = cupy.cuda.runtime.getDevice()
    if a.data.device_id != device or b.data.device_id != device:
        return None
    bias_key = _epilogue_operand_key(keywords["bias"], device)
    c_key = _epilogue_operand_key(keywords["c"], device)
    if bias_key is False or c_key is False:
        return None
    k = ("fused", a.shape, a.strides, a.dtype, a.data.ptr % TMA_ALIGN == 0,
         b.shape, b.strides, b.dtype, b.data.ptr % TMA_ALIGN == 0, device,
         *keywords_key(keywords["activation"], keywords["alpha"], keywords["beta"], bias_key,
                       c_key))
    if out is not None:
        if type(out) is not ndarray or out.data.device_id != device:
            return None
        k += (out.shape, out.strides, out.dtype, out.data.ptr % TMA_ALIGN == 0)
    try:
        hash(k)
    except TypeError:  # an unhashable keyword: the full path says what is wrong with it
        return None
    return k


def keywords_key(activation, alpha, beta, bias_key, c_key) -> tuple:
    """The part of a fused call's key its epilogue keywords make: each scalar keyword's type
    and value, and the keys of bias and c (their shapes, strides and dtypes, or None)."""
    return (type(activation), activation, type(alpha), alpha, type(beta), beta, bias_key,
            c_key)


def repeat_fused(a, b, out, keywords: dict):
    """repeat() for a call with epilogue keywords (fused_key): the launches get bias's and
    c's pointers. A call whose out overlaps bias or c (other than being c) takes the full
    path, which reads copies of them."""
    k = fused_key(a, b, out, keywords)
    if k is None:
        return None, None
    recipe = _recipes.get(k)
    if recipe is None:
        return None, k
    bias, c = keywords["bias"], keywords["c"]
    bias_ptr = 0 if bias is None else bias.data.ptr
    if type(recipe) is FusedDirectRecipe:   # checks out against bias and c itself
        return recipe.run(a, b, out, bias_ptr, 0 if c is None else c.data.ptr), k
    c_read = c if keywords["beta"] != 0 else None  # beta = 0: c is not read
    if out is not None and _overlaps_epilogue(out, bias, c_read):
        return None, None
    return recipe.run(a, b, out, bias_ptr, 0 if c_read is None else c_read.data.ptr), k


def _overlaps_epilogue(out, bias, c) -> bool:
    out_bounds = byte_bounds(out.data.ptr, out.shape, out.strides, out.itemsize)
    same = (c is not None and out.data.ptr == c.data.ptr and out.shape == c.shape
            and out.strides == c.strides)
    return any(x is not None and overlaps(out_bounds, byte_bounds(
        x.data.ptr, x.shape, x.strides, x.itemsize)) for x in (bias, None if same else c))


def lookup(k):
    return _recipes.get(k)


class Remembered:
    """Values kept under keys for later calls, each valid in the `generation` it was kept in
    (one of an older choice, before use_schedule, autotune or clear(), is never returned); at
    most `limit` entries, then all are dropped, as _recipes are. None as a key: not kept."""

    def __init__(self, limit: int):
        self.limit = limit
        self._entries: dict = {}

    def get(self, k):
        entry = None if k is None else self._entries.get(k)
        if entry is None:
            return None
        value, kept_at = entry
        if kept_at != generation:
            self._entries.pop(k, None)
            return None
        return value

    def put(self, k, value) -> None:
        if k is None:
            return
        hash(k)   # an unhashable key raises TypeError here, before anything is dropped
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[k] = (value, generation)

    def values(self) -> list:
        return [value for value, _ in self._entries.values()]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def remember(k, recipe: Recipe, chosen_at: int) -> None:
    with _lock:
        if chosen_at != generation:
            return
        if len(_recipes) >= MAX_RECIPES:
            _recipes.clear()  # a workload with this many shapes gains little from the cache
        _recipes[k] = recipe


def clear() -> None:
    global generation
    with _lock:
        _recipes.clear()
        generation += 1

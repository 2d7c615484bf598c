"""Pure shape and stride logic of a matmul call: cupy.matmul's shape rules, how each operand's
batch maps onto the broadcast batch, and whether TMA can read a matrix where it lies. No GPU
and no CuPy needed: everything here is tested on the CPU."""
from __future__ import annotations

import math
from dataclasses import dataclass

TMA_ALIGN = 16            # bytes: base address and every non-contiguous stride
MAX_GRID_Z = 65535        # CUDA's limit on gridDim.z (the batch dimension of a launch)
# A K-major A or an N-major B whose row pitch is no multiple of 16 bytes is read in place
# through PHASES tensor maps of every eighth row: eight rows of 2-byte elements are a multiple
# of 16 bytes apart for any pitch (KernelConfig.a_pitch_mod8, b_pitch_mod8; ptx.cuh's
# PhasedTensorMaps).
PHASES = 8


@dataclass(frozen=True)
class MatmulShapes:
    batch_shape: tuple
    m: int
    k: int
    n: int
    out_shape: tuple
    a_is_vector: bool   # 1-D a: promoted to (1, k), the m axis removed from the result
    b_is_vector: bool   # 1-D b: promoted to (k, 1), the n axis removed from the result

    @property
    def batch(self) -> int:
        return math.prod(self.batch_shape)


def matmul_shapes(a_shape: tuple, b_shape: tuple) -> MatmulShapes:
    """The shape rules of numpy / cupy.matmul; ValueError with numpy's wording otherwise."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError("matmul: Input operand %d does not have enough dimensions (has 0, "
                         "gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1); "
                         "scalar operands are not allowed, use '*' instead"
                         % (0 if len(a_shape) == 0 else 1))
    a_vec, b_vec = len(a_shape) == 1, len(b_shape) == 1
    a2 = (1,) + tuple(a_shape) if a_vec else tuple(a_shape)
    b2 = tuple(b_shape) + (1,) if b_vec else tuple(b_shape)
    m, k = a2[-2:]
    k2, n = b2[-2:]
    if k != k2:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with "
                         f"gufunc signature (n?,k),(k,m?)->(n?,m?) (size {k2} is different "
                         f"from {k})")
    batch_shape = broadcast_batch(a2[:-2], b2[:-2])
    out_shape = batch_shape + (() if a_vec else (m,)) + (() if b_vec else (n,))
    return MatmulShapes(batch_shape, m, k, n, out_shape, a_vec, b_vec)


def broadcast_batch(a_batch: tuple, b_batch: tuple) -> tuple:
    ndim = max(len(a_batch), len(b_batch))
    a = (1,) * (ndim - len(a_batch)) + tuple(a_batch)
    b = (1,) * (ndim - len(b_batch)) + tuple(b_batch)
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and 1 not in (x, y):
            raise ValueError(f"matmul: operands could not be broadcast together: batch shapes "
                             f"{tuple(a_batch)} and {tuple(b_batch)} differ in dimension {i} "
                             f"({x} vs {y})")
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return tuple(out)


@dataclass(frozen=True)
class BatchMapping:
    """Output batch index z reads operand slice (z // div) % mod of the operand's batch
    dimensions lo..hi-1 collapsed into one (mod slices)."""
    lo: int
    hi: int
    div: int
    mod: int


def batch_mapping(op_batch: tuple, batch_shape: tuple) -> BatchMapping | None:
    """How an operand with batch shape `op_batch` (broadcastable to `batch_shape`) is indexed
    by the flattened output batch index. None when its varying dimensions are not one run
    (then the operand must be broadcast into a copy)."""
    ndim = len(batch_shape)
    op = (1,) * (ndim - len(op_batch)) + tuple(op_batch)
    varying = [i for i, size in enumerate(op) if size > 1]
    if not varying:
        return BatchMapping(0, 0, 1, 1)
    lo, hi = varying[0], varying[-1] + 1
    # Inside the run every output dimension must come from the operand itself.
    if any(op[i] != batch_shape[i] for i in range(lo, hi)):
        return None
    return BatchMapping(lo, hi, math.prod(batch_shape[hi:]), math.prod(op[lo:hi]))


def tma_major(shape2: tuple, strides2: tuple, itemsize: int, address: int) -> str | None:
    """Which axis of a (rows, cols) matrix TMA reads as its contiguous dimension: "cols"
    (row-major), "rows" (column-major), or None when TMA cannot describe it (misaligned base,
    a stride that is negative or not a multiple of 16 bytes)."""
    if address % TMA_ALIGN:
        return None
    return _unit_stride_axis(shape2, strides2, itemsize,
                             lambda stride: stride > 0 and stride % TMA_ALIGN == 0)


def phased_rows_ok(shape3: tuple, strides3: tuple, itemsize: int, address: int) -> bool:
    """Whether a (batch, rows, cols) matrix of unit column stride whose row pitch is not a
    multiple of 16 bytes (one TMA map cannot describe it) can be read through PHASES maps of
    every eighth row (launch.phased_specs): base on 16 bytes, at least PHASES rows (each map
    holds one), and batch slices 16-byte multiples apart."""
    nb, rows, cols = shape3
    sb, sr, sc = strides3
    return (address % TMA_ALIGN == 0 and sc == itemsize and rows >= PHASES and sr > 0
            and sr % itemsize == 0 and sr % TMA_ALIGN != 0
            and (nb == 1 or (sb > 0 and sb % TMA_ALIGN == 0)))


def element_major(shape2: tuple, strides2: tuple, itemsize: int) -> str | None:
    """Which axis of a (rows, cols) matrix is contiguous for a kernel that reads rows at any
    element boundary (gemv in place): "cols", "rows", or None (no unit-stride axis, or a
    negative stride)."""
    return _unit_stride_axis(shape2, strides2, itemsize, lambda stride: stride > 0)


def _unit_stride_axis(shape2: tuple, strides2: tuple, itemsize: int, other_ok) -> str | None:
    """"cols" or "rows": the axis of unit stride whose other axis's stride passes `other_ok`
    ("cols" first); None where neither. A dimension of extent 1 is never stepped over: its
    stride is free."""
    rows, cols = shape2
    row_stride, col_stride = strides2
    if col_stride == itemsize or cols == 1:
        if rows == 1 or other_ok(row_stride):
            return "cols"
    if row_stride == itemsize or rows == 1:
        if cols == 1 or other_ok(col_stride):
            return "rows"
    return None


def store_ok(shape2: tuple, strides2: tuple, itemsize: int, address: int) -> bool:
    """Whether a row-major result can take a TMA store directly. A store writes whole 16-byte
    chunks, so a row whose byte length is not a multiple of 16 would overwrite its neighbours
    (the bytes past its end): such results go through an aligned buffer."""
    rows, cols = shape2
    return (tma_major(shape2, strides2, itemsize, address) == "cols" and strides2[1] == itemsize
            and (cols * itemsize) % TMA_ALIGN == 0)


def row_store_strides(shape3: tuple, strides3: tuple, itemsize: int) -> tuple | None:
    """(row, batch) strides in elements of a (batch, rows, cols) result that a row-store
    kernel (KernelConfig.row_store) can write in place: unit column stride, rows and batch
    slices apart by whole elements within the kernel's 32-bit arguments; None otherwise."""
    batch, rows, cols = shape3
    sb, sr, sc = strides3
    if cols > 1 and sc != itemsize:
        return None
    strides = []
    span = cols * itemsize  # bytes of one row: rows and slices must not overlap
    for stride, extent in ((sr, rows), (sb, batch)):
        if extent == 1:
            strides.append(0)  # never stepped over
        elif stride < span or stride % itemsize or stride // itemsize > MAX_EXTENT:
            return None
        else:
            strides.append(stride // itemsize)
        span = stride * (extent - 1) + span
    return tuple(strides)


def padded(cols: int, itemsize: int, align: int = TMA_ALIGN) -> int:
    """Columns of a row whose byte length is rounded up to `align` bytes (by default the TMA
    alignment)."""
    per = align // itemsize
    return -(-cols // per) * per


def batch_chunks(batch: int) -> list[tuple[int, int]]:
    """(offset, count) launches covering `batch` output slices within gridDim.z's limit."""
    return [(z, min(MAX_GRID_Z, batch - z)) for z in range(0, batch, MAX_GRID_Z)]


def grouped_raster(t: int, tiles_m: int, tiles_n: int, group: int) -> tuple[int, int]:
    """(m_tile, n_tile) of linear tile t: the order of GroupedRaster in tile_raster.cuh.
    Tiles are visited in groups of `group` M-tiles, column by column inside a group."""
    per_group = group * tiles_n
    first_m = (t // per_group) * group
    rows = min(tiles_m - first_m, group)
    in_group = t % per_group
    return first_m + in_group % rows, in_group // rows


def byte_bounds(ptr: int, shape: tuple, strides: tuple, itemsize: int) -> tuple[int, int]:
    """[first, last + 1) byte addresses an array view touches (any sign of strides)."""
    if 0 in shape:
        return ptr, ptr
    lo = ptr + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = ptr + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + itemsize
    return lo, hi


def overlaps(x_bounds: tuple[int, int], y_bounds: tuple[int, int]) -> bool:
    return x_bounds[0] < y_bounds[1] and y_bounds[0] < x_bounds[1]


# Kernel arguments are 32-bit: larger extents go to cupy.matmul.
MAX_EXTENT = 2**31 - 1

"""Compiled kernel + CuPy operands -> tensor maps, grid, dynamic shared memory, launch on
CuPy's current stream."""
from __future__ import annotations

import functools

import numpy as np

from . import compile as compiler
from . import layout, tma
from .heuristics import Choice
from .device import query
from .layout import BatchMapping
from .problem import Problem
from .schedules import TMA_BOX_ELEMS


class KernelResourceError(compiler.ResourceError):
    pass


@functools.lru_cache(maxsize=None)
def compiled(schedule, config) -> compiler.CompiledKernel:
    return compiler.compile_kernel(schedule.render(config))


@functools.lru_cache(maxsize=None)
def _loaded(cubin_path: str, name: str, smem_bytes: int, device_id: int):
    import cupy

    kernel = cupy.RawModule(path=cubin_path).get_function(name)
    kernel.max_dynamic_shared_size_bytes = smem_bytes
    return kernel


def prepare_operand(x3):
    """A (batch, rows, cols) operand as TMA can read it: the array itself when it can, else an
    aligned row-major copy. Returns (array, contiguous axis "rows" | "cols", copied)."""
    import cupy

    nb, rows, cols = x3.shape
    sb, sr, sc = x3.strides
    major = layout.tma_major((rows, cols), (sr, sc), x3.itemsize, x3.data.ptr)
    batch_ok = nb == 1 or (sb > 0 and sb % layout.TMA_ALIGN == 0)
    if major is not None and batch_ok:
        return x3, major, False
    buf = cupy.empty((nb, rows, layout.padded(cols, x3.itemsize)), dtype=x3.dtype)[:, :, :cols]
    buf[...] = x3
    return buf, "cols", True


def _stride(stride: int, extent: int, fallback: int) -> int:
    """A dimension of extent 1 is never stepped over; give TMA any valid stride for it."""
    return stride if extent > 1 else fallback


def matrix_spec(x3, major: str, box_rows: int) -> tma.TensorMapSpec:
    """Tensor map of a (batch, rows, cols) array whose `major` axis is contiguous; the box is
    64 contiguous elements by `box_rows` of the other axis."""
    nb, rows, cols = x3.shape
    sb, sr, sc = x3.strides
    item = x3.itemsize
    if major == "cols":
        inner, outer, outer_stride = cols, rows, sr
    else:
        inner, outer, outer_stride = rows, cols, sc
    free = layout.padded(inner, item) * item
    outer_stride = _stride(outer_stride, outer, free)
    batch_stride = _stride(sb, nb, outer_stride * outer if outer > 1 else free)
    return tma.TensorMapSpec(dtype=x3.dtype.name, address=x3.data.ptr, dims=(inner, outer, nb),
                             strides_bytes=(outer_stride, batch_stride),
                             box=(TMA_BOX_ELEMS, box_rows, 1))


def run(choice: Choice, problem: Problem, a3, a_map: BatchMapping, b3, b_map: BatchMapping,
        c3) -> None:
    """C3 = A3 @ B3 over the broadcast batch. A3/B3 are TMA-readable (prepare_operand) in the
    layout `problem` names; C3 is row-major and TMA-storable (layout.store_ok)."""
    import cupy

    cfg, sched = choice.config, choice.schedule
    kernel_info = compiled(sched, cfg)
    smem = sched.smem_bytes(cfg)
    device = cupy.cuda.Device()
    limit = query(device.id).smem_per_block_optin
    problems = kernel_info.report.problems(smem, limit)
    if problems:
        raise KernelResourceError(f"{kernel_info.name}: " + "; ".join(problems))
    kernel = _loaded(str(kernel_info.cubin_path), kernel_info.name, smem, device.id)

    # A: K-major -> one box of (64 k, block_m rows); M-major -> boxes of (64 m, 64 k).
    spec_a = (matrix_spec(a3, "rows", cfg.block_k) if cfg.trans_a
              else matrix_spec(a3, "cols", cfg.block_m))
    # B: N-major -> boxes of (64 n, 64 k); K-major -> one box of (64 k, block_n rows).
    spec_b = (matrix_spec(b3, "cols", cfg.block_k) if cfg.trans_b
              else matrix_spec(b3, "rows", cfg.block_n))
    spec_c = matrix_spec(c3, "cols", TMA_BOX_ELEMS)
    map_a, map_b, map_c = (tma.as_kernel_arg(tma.encode(s)) for s in (spec_a, spec_b, spec_c))
    gx, gy, _ = sched.grid(problem, cfg)
    for z0, count in layout.batch_chunks(problem.batch):
        kernel((gx, gy, count), (sched.threads(cfg),),
               (map_a, map_b, map_c, np.int32(problem.k), np.int32(z0),
                np.int32(a_map.div), np.int32(a_map.mod), np.int32(b_map.div),
                np.int32(b_map.mod)),
               shared_mem=smem)

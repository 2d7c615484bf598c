"""Compiled kernel + CuPy operands -> tensor maps, grid, dynamic shared memory, launch on
CuPy's current stream."""
from __future__ import annotations

import functools
import os
import threading
from dataclasses import replace
from typing import NamedTuple

from . import compile as compiler
from . import layout, tma, workspace
from .heuristics import Choice
from .device import query
from .layout import PHASES, BatchMapping
from .problem import LINE_BYTES, Problem
from .schedules import (ELEM_BYTES, F32_BYTES, GEMV_VEC, TMA_BOX_ELEMS, WORKSPACE_BOX,
                        c_box_cols)


class KernelResourceError(compiler.ResourceError):
    pass


# Bounded by the kernels hopmm can render (schedules x configs), whatever the shapes.
@functools.lru_cache(maxsize=None)
def compiled(schedule, config) -> compiler.CompiledKernel:
    return compiler.compile_schedule(schedule, config)


class LoadedKernel(NamedTuple):
    module: object   # cupy.cuda.function.Module: keeps the code loaded while `kernel` is used
    kernel: object   # cupy.cuda.function.Function (its `ptr` is the CUfunction)


# Bounded by the kernels hopmm can render x the devices (a module is loaded per device).
# Called under _load_lock only (loaded_kernel): two threads missing the cache at once would
# otherwise each load a module, and the one the cache drops would be unloaded while the
# launches built from it still hold its function.
@functools.lru_cache(maxsize=None)
def _loaded(cubin_path: str, name: str, smem_bytes: int, device_id: int) -> LoadedKernel:
    """The kernel loaded on the current device from the verified bytes compile.py holds for
    `cubin_path` (never from the file, which may have changed since it was verified, or
    never have been written where the cache is read-only)."""
    from cupy.cuda import driver, function

    module = function.Module()
    module.load(compiler.cubin_of(cubin_path))
    kernel = module.get_function(name)
    driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            smem_bytes)
    return LoadedKernel(module, kernel)


_load_lock = threading.Lock()


def loaded_kernel(cubin_path: str, name: str, smem_bytes: int, device_id: int):
    """_loaded, one thread at a time: each kernel is loaded once per device."""
    with _load_lock:
        return _loaded(cubin_path, name, smem_bytes, device_id)


# Programmatic dependent launch: each kernel is launched so that it may be scheduled while the
# previous kernel of its stream finishes, and its CTAs set up (barriers, tensor-map prefetch) on
# the SMs that kernel leaves. Safe for any previous kernel: every hopmm kernel waits for it to
# complete, its writes visible, before touching global memory (tile_config.cuh's prologue).
# HOPMM_PDL=0 launches plainly, as of the next call that is planned.
PDL_ENV = "HOPMM_PDL"


def programmatic_launch() -> bool:
    return os.environ.get(PDL_ENV, "1") != "0"


# cudaMemcpy2D rejects pitches from 2**31 bytes on (cudaDevAttrMaxPitch); CuPy copies those.
MAX_COPY_PITCH = 2**31


def pitched_copy(dst_ptr: int, dst_pitch: int, src_ptr: int, src_pitch: int, width: int,
                 rows: int) -> bool:
    """`rows` rows of `width` bytes, `*_pitch` bytes apart, on the current stream through one
    cudaMemcpy2DAsync (a few us of host time, where CuPy's strided elementwise copy costs
    25-35 us); False, copying nothing, where the runtime cannot take the pitches."""
    import cupy

    # One row: its pitch is never stepped over.
    pitches = (dst_pitch, src_pitch) if rows > 1 else (width, width)
    if not all(width <= p < MAX_COPY_PITCH for p in pitches):
        return False
    if rows and width:
        cupy.cuda.runtime.memcpy2DAsync(dst_ptr, pitches[0], src_ptr, pitches[1], width, rows,
                                        cupy.cuda.runtime.memcpyDeviceToDevice,
                                        cupy.cuda.get_current_stream().ptr)
    return True


class MatrixRows(NamedTuple):
    """Where a matrix's contiguous rows lie, in bytes."""
    ptr: int
    stride: int   # from one row to the next
    rows: int
    width: int    # bytes of one row


def matrix_rows(x) -> MatrixRows | None:
    """The rows of a matrix, or of a batch of one matrix, whose rows are contiguous; None
    otherwise. Read off shape and strides: no view is made."""
    shape, strides = x.shape, x.strides
    if len(shape) == 3 and shape[0] == 1:
        shape, strides = shape[1:], strides[1:]
    if len(shape) != 2 or strides[1] != x.itemsize:
        return None
    return MatrixRows(x.data.ptr, strides[0], shape[0], shape[1] * x.itemsize)


def copy_rows(dst, src) -> None:
    """dst[...] = src for two arrays of one shape and dtype, on the current stream: one
    pitched copy (pitched_copy) where both are matrices, or batches of one, with contiguous
    rows; anything else through CuPy."""
    if dst.shape == src.shape and dst.dtype == src.dtype:
        d, s = matrix_rows(dst), matrix_rows(src)
        if (d is not None and s is not None
                and pitched_copy(d.ptr, d.stride, s.ptr, s.stride, d.width, d.rows)):
            return
    dst[...] = src


# gemv's loads: it reads rows in whole vectors of this many bytes and masks the elements past
# K; its batch strides are passed in these units.
VECTOR_BYTES = GEMV_VEC * ELEM_BYTES


def zero_row_tails(x3) -> None:
    """Zero the bytes from the end of each row of `x3` (a (batch, rows, cols) view of the first
    columns of a dense (batch, rows, pitch) buffer) to the next VECTOR_BYTES boundary: the
    bytes the masked vector loads of a schedule that `reads_row_tails` (gemv) read past a row,
    which are then never uninitialised memory (compute-sanitizer initcheck). One driver call;
    none where rows end on a boundary."""
    import cupy

    from . import _tensormap

    nb, rows, cols = x3.shape
    width = cols * x3.itemsize
    tail = -width % VECTOR_BYTES
    pitch = x3.strides[1]
    # Only an aligned copy's padding: a dense buffer without it (a materialised broadcast read
    # in place) holds the next row, or nothing, there.
    padded = (x3.strides[2] == x3.itemsize and pitch >= width + tail
              and (nb == 1 or x3.strides[0] == rows * pitch))
    if tail and padded and nb * rows:
        _tensormap.zero_rows(x3.data.ptr + width, pitch, tail, nb * rows,
                             cupy.cuda.get_current_stream().ptr)


def padded_empty(batch: int, rows: int, cols: int, pitch: int, dtype):
    """An uninitialised (batch, rows, cols) array whose rows lie `pitch` elements apart."""
    import cupy

    return cupy.empty((batch, rows, pitch), dtype=dtype)[:, :, :cols]


def prepare_operand(x3):
    """A (batch, rows, cols) operand as TMA can read it: the array itself when it can, else an
    aligned row-major copy. Returns (array, its contiguous axis "rows" | "cols")."""
    nb, rows, cols = x3.shape
    sb, sr, sc = x3.strides
    major = layout.tma_major((rows, cols), (sr, sc), x3.itemsize, x3.data.ptr)
    batch_ok = nb == 1 or (sb > 0 and sb % layout.TMA_ALIGN == 0)
    if major is not None and batch_ok:
        return x3, major
    return line_copy(x3), "cols"


def line_copy(x3):
    """A row-major copy of a (batch, rows, cols) operand whose rows are whole cache lines: a
    TMA box row then never spans two (heuristics.UNALIGNED_B_*, NARROW_B_ROW_COST)."""
    nb, rows, cols = x3.shape
    pitch = layout.padded(cols, x3.itemsize, LINE_BYTES)
    buf = padded_empty(nb, rows, cols, pitch, x3.dtype)
    copy_rows(buf, x3)
    return buf


def _stride(stride: int, extent: int, fallback: int) -> int:
    """A dimension of extent 1 is never stepped over; give TMA any valid stride for it."""
    return stride if extent > 1 else fallback


def matrix_spec(x3, major: str, box_rows: int,
                box_cols: int = TMA_BOX_ELEMS) -> tma.TensorMapSpec:
    """Tensor map of a (batch, rows, cols) array whose `major` axis is contiguous; the box is
    `box_cols` (64) contiguous elements by `box_rows` of the other axis, swizzled over its
    rows' bytes (128, or 64 for a half box: the span wgmma and the epilogue's staging
    assume)."""
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
                             box=(box_cols, box_rows, 1), swizzle=box_cols * item)


def phased_specs(x3) -> list[tuple[int, tma.TensorMapSpec]]:
    """The PHASES maps of a row-major (batch, rows, cols) operand (a K-major A, an N-major B,
    whose rows are k rows) whose row pitch is not a multiple of 16 bytes
    (layout.phased_rows_ok), as (byte offset from its base, map): map j holds rows j,
    j + PHASES, ... from the 16-byte boundary at or before row j (TMA starts boxes on 16
    bytes only), so each of its rows begins with the lead of elements before row j, which
    widens its first dimension; elements past a row's end and rows past the last of the phase
    read as zeros. Its boxes are unswizzled rows of a K-block and room for the lead
    (tile_config.cuh kRawRowElems), which the kernel shifts into its tiles."""
    nb, rows, cols = x3.shape
    sb, sr, _ = x3.strides
    item = x3.itemsize
    specs = []
    for j in range(PHASES):
        offset = j * sr // layout.TMA_ALIGN * layout.TMA_ALIGN
        lead = (j * sr - offset) // item
        phase_rows = -(-(rows - j) // PHASES)
        outer_stride = PHASES * sr
        batch_stride = _stride(sb, nb, outer_stride * phase_rows)
        specs.append((offset, tma.TensorMapSpec(
            dtype=x3.dtype.name, address=x3.data.ptr + offset, dims=(cols + lead, phase_rows, nb),
            strides_bytes=(outer_stride, batch_stride),
            box=(TMA_BOX_ELEMS + PHASES, TMA_BOX_ELEMS // PHASES, 1), swizzle=0)))
    return specs


def _phased_templates(x3) -> list:
    """One kernel parameter of phase maps (phased_specs): (byte offset, template) each."""
    return [(offset, _map_template(spec)) for offset, spec in phased_specs(x3)]


# A map template (KernelLaunch) whose parameter carries only the base address, in its first
# 8 bytes: the output of a row-store kernel (KernelConfig.row_store), which no TMA store writes.
ADDRESS_SLOT = None


def row_store_strides(c3) -> tuple[int, int]:
    """(row, batch) strides in elements of a (batch, rows, cols) result a row-store kernel
    writes (layout.row_store_strides); ValueError where it cannot."""
    strides = layout.row_store_strides(c3.shape, c3.strides, c3.itemsize)
    if strides is None:
        raise ValueError(f"a row store cannot write a result of shape {c3.shape} and strides "
                         f"{c3.strides}")
    return strides


def workspace_spec(shape: tuple[int, int, int]) -> tma.TensorMapSpec:
    """Tensor map of split-K's fp32 workspace (slots, rows, columns), row-major and dense; the
    address is filled in at launch (the workspace of the launching stream)."""
    slots, rows, cols = shape
    return tma.TensorMapSpec(dtype="float32", address=0, dims=(cols, rows, slots),
                             strides_bytes=(cols * F32_BYTES, rows * cols * F32_BYTES),
                             box=(WORKSPACE_BOX[0], WORKSPACE_BOX[1], 1))


class WorkspaceLaunch:
    """A split-K launch: a KernelLaunch whose workspace map and pointers are those of the
    launching (device, stream) (workspace.py), looked up on every launch."""

    __slots__ = ("inner", "device_id", "workspace_bytes", "semaphores", "workspace_addresses")

    def __init__(self, inner, device_id: int, workspace_bytes: int, semaphores: int,
                 workspace_map: bool = True):
        self.inner = inner
        self.device_id = device_id
        self.workspace_bytes = workspace_bytes
        self.semaphores = semaphores
        # The workspace's address fills its map (where the kernel takes one), then a pointer.
        self.workspace_addresses = 2 if workspace_map else 1

    def launch(self, stream: int, a_ptr: int, b_ptr: int, c_ptr: int, *epilogue_ptrs) -> None:
        ws = workspace.get(self.device_id, stream, self.workspace_bytes, self.semaphores)
        self.inner.launch(stream, a_ptr, b_ptr, c_ptr,
                          *(ws.data_ptr,) * self.workspace_addresses, ws.semaphores_ptr,
                          *epilogue_ptrs)


def _map_template(spec: tma.TensorMapSpec) -> tuple:
    """A tensor map as KernelLaunch encodes it at each launch: everything but the address,
    which is fixed for every later launch, so it is validated once here."""
    spec.validate()
    return (tma.DATA_TYPES[spec.dtype], spec.dims, spec.strides_bytes, spec.box,
            tma.SWIZZLE[spec.swizzle], spec.l2_promotion, spec.oob_fill)


def _checked_kernel(sched, cfg, device_id: int):
    """(the loaded kernel, its shared memory, device_id) of a schedule's config, compiled and
    checked against the device's limits (KernelResourceError otherwise)."""
    kernel_info = compiled(sched, cfg)
    smem = sched.smem_bytes(cfg)
    problems = kernel_info.report.problems(smem, query(device_id).smem_per_block_optin)
    if problems:
        raise KernelResourceError(f"{kernel_info.name}: " + "; ".join(problems))
    return (loaded_kernel(str(kernel_info.cubin_path), kernel_info.name, smem, device_id),
            smem, device_id)


class SwappedLaunch:
    """A launch of a kernel that computes C^T = B^T A^T (KernelConfig.trans_c): its A is the
    caller's B and its B the caller's A."""

    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner

    def launch(self, stream: int, a_ptr: int, b_ptr: int, c_ptr: int, *rest) -> None:
        self.inner.launch(stream, b_ptr, a_ptr, c_ptr, *rest)


def _transposed_operands(a3, a_map: BatchMapping, b3, b_map: BatchMapping) -> tuple:
    """(A, its batch mapping, B, its batch mapping) of the transposed product C^T = B^T A^T:
    views of B^T and A^T, no copies."""
    return b3.transpose(0, 2, 1), b_map, a3.transpose(0, 2, 1), a_map


class GemvLaunch:
    """A gemv launch (schedules.GemvSchedule): a KernelLaunch of no tensor maps and four
    pointers (A, B, C and the split-K scratch of the launching stream, looked up on every
    launch where the launch splits K)."""

    __slots__ = ("inner", "device_id", "scratch_bytes")

    def __init__(self, inner, device_id: int, scratch_bytes: int):
        self.inner = inner
        self.device_id = device_id
        self.scratch_bytes = scratch_bytes

    def launch(self, stream: int, a_ptr: int, b_ptr: int, c_ptr: int) -> None:
        scratch = (workspace.gemv_scratch(self.device_id, stream, self.scratch_bytes)
                   if self.scratch_bytes else 0)
        self.inner.launch(stream, a_ptr, b_ptr, c_ptr, scratch)


GEMV_POINTERS = 4   # A, B, C, scratch
INT32_MAX = 2**31 - 1


def _gemv_ints(problem: Problem, a3, a_map: BatchMapping, b3, b_map: BatchMapping, c3,
               z0: int) -> tuple:
    """gemv_entry.cu.in's integers: sizes, batch mapping, each operand's stride along its
    non-contiguous axis (elements; 0 where that axis has one index) and batch stride (16-byte
    units; 0 for one slice)."""
    item = a3.itemsize

    def along(x3, axis: int) -> int:
        return x3.strides[axis] // item if x3.shape[axis] > 1 else 0

    def batch16(x3) -> int:
        if x3.shape[0] == 1:
            return 0
        if x3.strides[0] % VECTOR_BYTES:
            raise ValueError(f"gemv: batch stride {x3.strides[0]} B is not a multiple of "
                             f"{VECTOR_BYTES}")
        return x3.strides[0] // VECTOR_BYTES

    a_ld = along(a3, 2) if problem.trans_a else along(a3, 1)
    b_ld = along(b3, 1) if problem.trans_b else along(b3, 2)
    ints = (problem.m, problem.n, problem.k, z0, a_map.div, a_map.mod, b_map.div, b_map.mod,
            a_ld, b_ld, along(c3, 1), batch16(a3), batch16(b3), batch16(c3))
    if not all(0 <= v <= INT32_MAX for v in ints):
        raise ValueError(f"gemv: a size or stride exceeds the kernel's 32-bit arguments: {ints}")
    return ints


def _gemv_launches(choice: Choice, problem: Problem, a3, a_map: BatchMapping, b3,
                   b_map: BatchMapping, c3, epilogue=None) -> list:
    """build_launches for the gemv schedule, `problem` and the operands being the kernel's
    (rows of whole 16-byte vectors, aligned; no epilogue), C row-major."""
    assert epilogue is None, "gemv fuses no epilogue"
    import cupy

    from ._tensormap import KernelLaunch

    cfg, sched = choice.config, choice.schedule
    kernel, smem, device_id = _checked_kernel(sched, cfg, cupy.cuda.Device().id)
    programmatic = programmatic_launch()
    launches = []
    for z0, count in layout.batch_chunks(problem.batch):
        grid = sched.grid(problem, cfg, count, splits=choice.splits)
        inner = KernelLaunch(kernel.kernel.ptr, grid, sched.threads(cfg), smem, [],
                             _gemv_ints(problem, a3, a_map, b3, b_map, c3, z0),
                             pointers=GEMV_POINTERS, programmatic=programmatic)
        launches.append(GemvLaunch(inner, device_id,
                                   sched.scratch_bytes(problem, cfg, count, choice.splits)))
    return launches


def build_launches(choice: Choice, problem: Problem, a3, a_map: BatchMapping, b3,
                   b_map: BatchMapping, c3, epilogue=None) -> list:
    """Launches computing C3 = A3 @ B3 over the broadcast batch (one per chunk of at most
    65535 batches). A3/B3 are TMA-readable (prepare_operand) in the layout `problem` names;
    C3 is row-major and TMA-storable (layout.store_ok), or, for a row-store config, rows of
    any element stride (layout.row_store_strides). Each launch takes the base addresses
    of A3, B3 and C3, so it can be repeated on other arrays of the same shape and strides.
    A config with a fused epilogue (`epilogue`: the call's epilogue.FusedEpilogue) also takes
    its scalars, fixed here, and the bias and c pointers after the addresses at each launch
    (its bias and c strides are part of what a repeat must match)."""
    if choice.tail is not None:
        return _wave_tail_launches(choice, problem, a3, a_map, b3, b_map, c3, epilogue)
    kernel_launches = (_gemv_launches if getattr(choice.schedule, "streaming", False)
                       else _tile_launches)
    if not choice.config.trans_c:
        return kernel_launches(choice, problem, a3, a_map, b3, b_map, c3, epilogue)
    # The kernel computes C^T = B^T A^T: its operands are views of B^T and A^T (no copies),
    # and it stores C transposed.
    kernel_problem = choice.schedule.kernel_problem(problem, choice.config)
    return [SwappedLaunch(x) for x in kernel_launches(
        choice, kernel_problem, *_transposed_operands(a3, a_map, b3, b_map), c3, epilogue)]


def _tile_launches(choice: Choice, problem: Problem, a3, a_map: BatchMapping, b3,
                   b_map: BatchMapping, c3, epilogue) -> list:
    """build_launches for one kernel of output tiles, `problem` being the one it computes."""
    import cupy

    from ._tensormap import KernelLaunch

    cfg, sched = choice.config, choice.schedule
    kernel, smem, device_id = _checked_kernel(sched, cfg, cupy.cuda.Device().id)

    # A: K-major -> one box of (64 k, a_rows rows); M-major -> boxes of (64 m, 64 k).
    # B: N-major -> boxes of (64 n, 64 k, or a cluster CTA's k slice of them); K-major -> one
    # box of (64 k, b_rows rows).
    # The schedule says how many rows a K-major box holds (a cluster loads slices of a tile).
    a_rows, b_rows = sched.box_rows(cfg)
    # An operand whose rows lie off 16 bytes (a K-major A's, an N-major B's k rows): one
    # parameter of PHASES maps.
    if cfg.a_pitch_mod8:
        template_a = _phased_templates(a3)
    else:
        template_a = _map_template(matrix_spec(a3, "rows", cfg.block_k) if cfg.trans_a
                                   else matrix_spec(a3, "cols", a_rows))
    if cfg.b_pitch_mod8:
        template_b = _phased_templates(b3)
    else:
        template_b = _map_template(matrix_spec(b3, "cols", sched.mn_box_k_rows(cfg))
                                   if cfg.trans_b else matrix_spec(b3, "rows", b_rows))
    templates = [template_a, template_b]
    if cfg.row_store:  # C's parameter carries its address only: the kernel stores by rows
        templates.append(ADDRESS_SLOT)
        row_store_ints = (problem.m, problem.n, *row_store_strides(c3))
    else:
        templates.append(_map_template(matrix_spec(c3, "cols", sched.c_box_rows,
                                                   c_box_cols(cfg))))
        row_store_ints = ()
    if sched.b_operands == 2:
        # The second B (and the second C of a pair of outputs) has the shape and strides of
        # the first: the same maps at other addresses, given after C's at each launch.
        templates += [templates[1]] + [templates[2]] * (sched.outputs - 1)
    tiles_m, tiles_n = sched.tiles(problem, cfg)
    sm_count = sched.resident_ctas(query(device_id))
    programmatic = programmatic_launch()
    launches = []
    for z0, count in layout.batch_chunks(problem.batch):
        ints = (problem.k, z0, count, a_map.div, a_map.mod, b_map.div, b_map.mod, tiles_m,
                tiles_n, choice.raster_group, problem.m, problem.n) + row_store_ints
        if cfg.epilogue is not None:
            ints += epilogue.scalars(problem.m, problem.n)
        grid = sched.grid(problem, cfg, count, sm_count, choice.splits)
        sched.check_grid(problem, cfg, count, choice.raster_group, choice.splits)
        if not sched.workspace:
            launches.append(KernelLaunch(kernel.kernel.ptr, grid, sched.threads(cfg), smem,
                                         templates, ints, pointers=sched.launch_pointers(cfg),
                                         programmatic=programmatic,
                                         cluster=sched.launch_cluster(choice.splits)))
            continue
        # Split-K: a fourth map (the fp32 workspace of this chunk's geometry; stream_k has
        # none) and the workspace / semaphore pointers, all of the launching stream's workspace.
        ws_shape = sched.workspace_shape(problem, cfg, count, choice.splits)
        ws_maps = [_map_template(workspace_spec(ws_shape))] if sched.workspace_map else []
        inner = KernelLaunch(kernel.kernel.ptr, grid, sched.threads(cfg), smem,
                             templates + ws_maps, ints,
                             pointers=sched.launch_pointers(cfg), programmatic=programmatic)
        ws_bytes = ws_shape[0] * ws_shape[1] * ws_shape[2] * F32_BYTES
        launches.append(WorkspaceLaunch(inner, device_id, ws_bytes,
                                        sched.semaphore_count(problem, cfg, count,
                                                              choice.splits),
                                        sched.workspace_map))
    return launches


class OffsetLaunch:
    """A launch of a part of the operands (a choice's tail, heuristics.Tail): the base
    addresses it is given (A, B, C, then a fused epilogue's bias and c) move by fixed byte
    offsets to the part's first element."""

    __slots__ = ("inner", "offsets")

    def __init__(self, inner, offsets: tuple):
        self.inner = inner
        self.offsets = offsets

    def launch(self, stream: int, *addresses) -> None:
        moved = tuple(address + offset if address else address   # a null pointer stays null
                      for address, offset in zip(addresses, self.offsets))
        self.inner.launch(stream, *moved, *addresses[len(moved):])


def _epilogue_offsets(epilogue, axis: str, start: int) -> tuple:
    """Byte offsets of a fused epilogue's bias and c (epilogue.FusedEpilogue.pointers) from
    their first element to the element of row (axis "m") or column (axis "n") `start`."""
    if epilogue is None:
        return ()
    bias_row, bias_col = epilogue.bias_strides
    _, c_row, c_col = epilogue.c_strides
    bias_item = 0 if epilogue.bias is None else epilogue.bias.itemsize
    c_item = 0 if epilogue.c3 is None else epilogue.c3.itemsize
    along = axis == "m"
    return (start * (bias_row if along else bias_col) * bias_item,
            start * (c_row if along else c_col) * c_item)


def _wave_tail_launches(choice: Choice, problem: Problem, a3, a_map: BatchMapping, b3,
                        b_map: BatchMapping, c3, epilogue) -> list:
    """build_launches for a choice with a tail: its own launches on the main part of the
    operands (views of their first rows or columns, at the same base addresses), then the
    tail's launches on the rest, as offsets from those base addresses (and from a fused
    epilogue's bias and c)."""
    tail = choice.tail
    main_p, tail_p = tail.problems(problem)
    start = tail.start
    if tail.axis == "m":
        main_views = (a3[:, :start], b3, c3[:, :start])
        tail_views = (a3[:, start:], b3, c3[:, start:])
    else:
        main_views = (a3, b3[:, :, :start], c3[:, :, :start])
        tail_views = (a3, b3[:, :, start:], c3[:, :, start:])
    launches = build_launches(replace(choice, tail=None), main_p, main_views[0], a_map,
                              main_views[1], b_map, main_views[2], epilogue)
    offsets = tuple(part.data.ptr - whole.data.ptr
                    for part, whole in zip(tail_views, (a3, b3, c3)))
    offsets += _epilogue_offsets(epilogue, tail.axis, start)
    tail_launches = build_launches(tail.choice, tail_p, tail_views[0], a_map, tail_views[1],
                                   b_map, tail_views[2], epilogue)
    return launches + [OffsetLaunch(x, offsets) for x in tail_launches]


def launch_all(launches: list, a_ptr: int, b_ptr: int, c_ptr: int, *epilogue_ptrs,
               stream: int | None = None) -> None:
    """Every launch on `stream` (default: the current one); `epilogue_ptrs`: the second B and
    C of the shared-A kernels, then (bias, c) for fused kernels."""
    if stream is None:
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
    for kernel_launch in launches:
        kernel_launch.launch(stream, a_ptr, b_ptr, c_ptr, *epilogue_ptrs)

"""A validated call's operands as the kernel reads them: batch views over the broadcast batch,
aligned copies where TMA cannot read an operand in place (or, for gemv, the operands where they
lie), and the Problem they make. Below api (which adds the schedule choice) and tuning (which
times every choice on them)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import launch, layout
from .problem import LINE_BYTES, Problem
from .schedules import GEMV_VEC


@dataclass
class KernelOperands:
    a3: object
    a_map: layout.BatchMapping
    b3: object
    b_map: layout.BatchMapping
    problem: Problem
    copies: list = field(default_factory=list)  # operands the kernel reads from a copy
    # {"a": ..., "b": ...}: each operand's batch view before any aligned copy was made of it
    views: dict = field(default_factory=dict)
    # A or B read in place through phase maps (KernelConfig.a_pitch_mod8, b_pitch_mod8): its
    # row pitch mod PHASES elements; 0 where it is read through one map (or from a copy).
    a_pitch_mod8: int = 0
    b_pitch_mod8: int = 0
    # Why B, which TMA could read in place, is read from a copy (with_line_copy); "" if not.
    b_copy_reason: str = ""


def as_matrix_stack(x, is_vector: bool, vector_axis: int):
    """A 1-D operand as a matrix: a row (1, k) for a (axis 0), a column (k, 1) for b (axis 1)."""
    if not is_vector:
        return x
    return x.reshape((1,) + x.shape) if vector_axis == 0 else x.reshape(x.shape + (1,))


def batch_view(x, is_vector: bool, axis: int, batch_shape: tuple):
    """The (nb, r, c) operand `kernel_operands` reads before any aligned copy."""
    return operand3d(as_matrix_stack(x, is_vector, axis), batch_shape)[0]


def operand3d(x2, batch_shape: tuple):
    """(batch..., r, c) operand -> ((nb, r, c) array, BatchMapping) over the broadcast batch."""
    import cupy

    r, c = x2.shape[-2:]
    op_batch = x2.shape[:-2]
    mapping = layout.batch_mapping(op_batch, batch_shape)
    if mapping is None:  # varying over non-adjacent batch dims: materialise the broadcast
        full = cupy.broadcast_to(x2, batch_shape + (r, c)).reshape(-1, r, c)
        return full, layout.BatchMapping(0, len(batch_shape), 1, full.shape[0])
    x = x2.reshape((1,) * (len(batch_shape) - len(op_batch)) + x2.shape)
    index = tuple(slice(None) if mapping.lo <= i < mapping.hi else 0
                  for i in range(len(batch_shape)))
    return x[index].reshape(mapping.mod, r, c), mapping


def kernel_operands(a, b, shapes: layout.MatmulShapes, phased: bool = False) -> KernelOperands:
    """Batch views and TMA-readable operands (aligned copies where needed), and the problem
    exactly as the kernel will read them. `phased`: a K-major A or an N-major B whose rows are
    not 16-byte aligned is left where it lies where the phase maps can read it (pitch_mod8),
    not copied."""
    (a_view, a_map), (b_view, b_map) = _batch_views(a, b, shapes)
    a_pitch = pitch_mod8(a_view) if phased else 0
    b_pitch = pitch_mod8(b_view) if phased else 0
    a3, a_axis = (a_view, "cols") if a_pitch else launch.prepare_operand(a_view)
    b3, b_axis = (b_view, "cols") if b_pitch else launch.prepare_operand(b_view)
    # A phased B is described as its aligned copy (whole cache lines a row) would be: the
    # choice is made for the product on that copy, then kept or given the phase maps.
    ops = _operands(a, b, shapes, a3, a_map, a_axis, b3, b_map, b_axis,
                    bool(b_pitch) or line_pitch(b3, b_axis) % LINE_BYTES == 0,
                    {"a": a_view, "b": b_view})
    ops.a_pitch_mod8, ops.b_pitch_mod8 = a_pitch, b_pitch
    return ops


def with_copied(ops: KernelOperands, phased: str) -> KernelOperands:
    """`ops` (operands left in place for the phase maps) with those the choice does not read
    through them (not in `phased`, e.g. "b" or "") read from aligned copies instead: the
    others, their copies and the problem as they are."""
    copied = [name for name in ("a", "b")
              if getattr(ops, f"{name}_pitch_mod8") and name not in phased]
    fresh = {f"{name}3": launch.prepare_operand(ops.views[name])[0] for name in copied}
    pitches = {f"{name}_pitch_mod8": 0 for name in copied}
    return replace(ops, **fresh, **pitches,
                   copies=copied + [n for n in ops.copies if n not in copied])


def line_pitch(x3, axis: str) -> int:
    """Bytes between the consecutive lines of a (batch, rows, cols) operand whose contiguous
    axis is `axis` ("cols" or "rows"): the stride of the other axis."""
    return x3.strides[1] if axis == "cols" else x3.strides[2]


def b_line_pitch(ops: KernelOperands) -> int:
    """line_pitch of B as the kernel reads it (N-major B: its rows run along "cols")."""
    return line_pitch(ops.b3, "cols" if ops.problem.trans_b else "rows")


def with_line_copy(ops: KernelOperands, reason: str) -> KernelOperands:
    """`ops` with B, which TMA reads in place, read from a copy whose rows are whole cache lines
    instead (heuristics.narrow_b_copy_reason gives `reason`)."""
    return replace(ops, b3=launch.line_copy(ops.views["b"]),
                   problem=replace(ops.problem, b_pitch_aligned=True),
                   copies=ops.copies + ["b"], b_copy_reason=reason)


def view_pitch_mod8(x, is_vector: bool, axis: int, batch_shape: tuple) -> int:
    """pitch_mod8 of a call operand's batch view (batch_view) without making it (no GPU work,
    for the plan): 0 where that view would be a new array (a materialised broadcast, or batch
    dimensions that no stride merges), which the call reads through one map or copies."""
    x2 = as_matrix_stack(x, is_vector, axis)
    mapping = layout.batch_mapping(x2.shape[:-2], batch_shape)
    if mapping is None:
        return 0
    lead = len(batch_shape) - (x2.ndim - 2)   # broadcast dimensions in front of x2's own
    dims = [(n, st) for i, (n, st) in enumerate(zip(x2.shape[:-2], x2.strides[:-2]))
            if mapping.lo <= i + lead < mapping.hi and n > 1]
    if any(outer != n * st for (_, outer), (n, st) in zip(dims, dims[1:])):
        return 0   # the batch slices lie at no single stride: the reshape copies
    batch_stride = dims[-1][1] if dims else 0
    return strided_pitch_mod8((mapping.mod, *x2.shape[-2:]), (batch_stride, *x2.strides[-2:]),
                              x2.itemsize, x2.data.ptr)


def pitch_mod8(x3) -> int:
    """The row pitch mod PHASES elements of a (batch, rows, cols) operand that one TMA map
    cannot read and the phase maps can (layout.phased_rows_ok: unit column stride, so a
    K-major A or an N-major B); 0 otherwise."""
    return strided_pitch_mod8(x3.shape, x3.strides, x3.itemsize, x3.data.ptr)


def strided_pitch_mod8(shape3: tuple, strides3: tuple, itemsize: int, address: int) -> int:
    """pitch_mod8 of the (batch, rows, cols) array of that shape, byte strides and base."""
    if layout.tma_major(shape3[1:], strides3[1:], itemsize, address) is not None:
        return 0
    if not layout.phased_rows_ok(shape3, strides3, itemsize, address):
        return 0
    return strides3[1] // itemsize % layout.PHASES


def in_place_operands(a, b, shapes: layout.MatmulShapes) -> KernelOperands | None:
    """The operands where they lie, for gemv reading rows at any element boundary
    (GemvConfig.in_place): None where an operand has no unit-stride axis, or where one of
    several batch slices (of A, B or the row-major result) starts off a 16-byte vector (the
    kernel steps batches in whole vectors)."""
    (a3, a_map), (b3, b_map) = _batch_views(a, b, shapes)
    axes = [layout.element_major(x3.shape[1:], x3.strides[1:], x3.itemsize) for x3 in (a3, b3)]
    if None in axes or not all(_whole_vector_batches(x3.shape[0], x3.strides[0], x3.itemsize)
                               for x3 in (a3, b3)):
        return None
    if not _whole_vector_batches(shapes.batch, shapes.m * shapes.n * a.itemsize, a.itemsize):
        return None
    return _operands(a, b, shapes, a3, a_map, axes[0], b3, b_map, axes[1], False,
                     {"a": a3, "b": b3})


def _batch_views(a, b, shapes: layout.MatmulShapes) -> tuple:
    """((A's (nb, r, c) view, its BatchMapping), (B's, B's)) over the broadcast batch."""
    return (operand3d(as_matrix_stack(a, shapes.a_is_vector, 0), shapes.batch_shape),
            operand3d(as_matrix_stack(b, shapes.b_is_vector, 1), shapes.batch_shape))


def problem_of(shapes: layout.MatmulShapes, dtype: str, a_axis: str, b_axis: str,
               b_pitch_aligned: bool = True) -> Problem:
    """The Problem of a call whose operands run along `a_axis` and `b_axis` ("cols" or
    "rows": their contiguous axes)."""
    return Problem(m=shapes.m, n=shapes.n, k=shapes.k, batch=shapes.batch, dtype=dtype,
                   a_major="k" if a_axis == "cols" else "m",
                   b_major="n" if b_axis == "cols" else "k", b_pitch_aligned=b_pitch_aligned)


def _operands(a, b, shapes: layout.MatmulShapes, a3, a_map, a_axis: str, b3, b_map,
              b_axis: str, b_pitch_aligned: bool, views: dict) -> KernelOperands:
    """KernelOperands of the (nb, r, c) arrays the kernel reads, `a_axis` and `b_axis` their
    contiguous axes ("cols" or "rows")."""
    problem = problem_of(shapes, a.dtype.name, a_axis, b_axis, b_pitch_aligned)
    # Views keep the caller's base pointer; any copy (materialised broadcast, a reshape that
    # could not be a view, an aligned buffer) has its own.
    copies = [name for name, x3, x in (("a", a3, a), ("b", b3, b)) if x3.data.ptr != x.data.ptr]
    return KernelOperands(a3, a_map, b3, b_map, problem, copies, views)


def _whole_vector_batches(count: int, stride: int, itemsize: int) -> bool:
    return count == 1 or (stride > 0 and stride % (GEMV_VEC * itemsize) == 0)

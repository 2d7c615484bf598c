"""GPU tier, hopmm's row-copy kernel (row_copy.py, csrc/hopmm/copy_rows.cuh) and the repeats
that copy through it (fastpath.ScratchCopies): exact copies between any pitches and offsets,
zeros to the end of each row's last 16-byte chunk in aligned rows, not one byte written
outside an unaligned destination's rows; repeated calls with copied operands and results
against cupy.matmul, over poisoned memory, bitwise equal to their first call. Skips without a
Hopper GPU."""

import pytest

from conftest import requires_hopper
from forced import TOL, rand, rel_err

pytestmark = requires_hopper

DTYPES = ["bfloat16", "float16"]


def _launch(jobs_and_arrays):
    """Runs the copy kernel on [(RowJob, source array, destination array)], one launch."""
    import cupy

    from hopmm import row_copy
    from hopmm.device import query

    device = cupy.cuda.Device().id
    copier = row_copy.launcher([job for job, _, _ in jobs_and_arrays], device,
                               query(device).sm_count)
    pointers = [p for _, src, dst in jobs_and_arrays for p in (src.data.ptr, dst.data.ptr)]
    pointers += [0] * (row_copy.POINTERS - len(pointers))
    copier.launch(cupy.cuda.get_current_stream().ptr, *pointers)


@pytest.mark.parametrize("rows,width,offset", [(1, 1, 0), (7, 13, 1), (300, 1023, 3),
                                               (5, 8, 5), (70001, 3, 2), (2, 4097, 7)])
def test_into_aligned_rows_two_jobs(rows, width, offset):
    """Two copies in one launch from rows that start anywhere (an odd pitch, an odd element
    offset) into 128-byte rows over NaN: each row exact, zeros up to its last chunk's end, the
    rest of the padding untouched."""
    import cupy

    from hopmm import row_copy

    pitch = -(-width // 64) * 64   # elements: whole 128-byte lines
    srcs = [rand((rows, width + offset + 1), "bfloat16")[:, offset:offset + width]
            for _ in range(2)]
    dsts = [cupy.full((rows, pitch), cupy.nan, dtype="bfloat16") for _ in range(2)]
    _launch([(row_copy.RowJob(rows, width, s.strides[0] // 2, pitch, pad=True), s, d)
             for s, d in zip(srcs, dsts)])
    tail = -width % 8
    for s, d in zip(srcs, dsts):
        bits = d.view(cupy.uint16)
        assert bool((bits[:, :width] == s.view(cupy.uint16)).all())
        assert bool((bits[:, width:width + tail] == 0).all())
        assert bool(cupy.isnan(d[:, width + tail:]).all())


@pytest.mark.parametrize("rows,width,offset", [(1, 1, 1), (9, 517, 0), (300, 1023, 5),
                                               (4, 16, 3)])
def test_into_unaligned_rows_writes_only_the_rows(rows, width, offset):
    """Out of an aligned buffer into the caller's rows, at any offset and pitch (a result the
    kernels cannot store in place): every element of the rows, and no other, is written,
    also where those rows start on 16 bytes (offset 0, pitch 520: the 3 elements after each
    row belong to the caller)."""
    import cupy

    from hopmm import row_copy

    pitch = -(-width // 64) * 64
    src = rand((rows, pitch), "float16")
    dst_pitch = width + 3
    whole = cupy.full((rows + 1, dst_pitch), cupy.nan, dtype="float16")
    dst = whole.reshape(-1)[offset:offset + rows * dst_pitch].reshape(rows, dst_pitch)
    _launch([(row_copy.RowJob(rows, width, pitch, dst_pitch, pad=False), src, dst)])
    assert bool((dst[:, :width].view(cupy.uint16) == src[:, :width].view(cupy.uint16)).all())
    written = cupy.zeros(whole.size, dtype=bool)
    index = cupy.arange(rows * dst_pitch).reshape(rows, dst_pitch)[:, :width] + offset
    written[index.reshape(-1)] = True
    assert bool(cupy.isnan(whole.reshape(-1)[~written]).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["a_and_b", "a_only", "c_only", "all_three", "out_strided",
                                  "gemv_rows"])
def test_repeats_copy_through_one_scratch(case, dtype):
    """Repeats whose operands need aligned copies make them with the row-copy kernel into
    one scratch buffer; a result of unaligned rows (c_only, out_strided) needs none, since a
    row-store kernel writes it in place, so such a call repeats directly. Each repeat's
    result, over a pool holding NaN and into a NaN-filled out where one is given, matches
    cupy.matmul and is bitwise the first call's (which copied with cudaMemcpy2D) on the same
    operands."""
    import cupy

    import hopmm
    from hopmm import fastpath

    # (m, k, n, how B is given): row-major B has rows as wide as C's, so a B of aligned
    # rows beside a copied C is a transposed array's view, and a copied B beside an aligned C
    # a view of wider rows whose pitch is odd.
    m, k, n, b_kind = {"a_and_b": (300, 1023, 512, "odd_pitch"),
                       "a_only": (256, 1030, 512, "rows"),
                       "c_only": (256, 512, 517, "transposed"),
                       "all_three": (129, 257, 130, "rows"),
                       "out_strided": (200, 200, 72, "rows"),
                       "gemv_rows": (4, 1030, 516, "rows")}[case]

    def make_b():
        if b_kind == "transposed":
            return rand((n, k), dtype).T
        if b_kind == "odd_pitch":
            return rand((k, n + 3), dtype)[:, :n]
        return rand((k, n), dtype)

    fastpath.clear()
    sets = [(rand((m, k), dtype), make_b()) for _ in range(3)]
    outs = None
    if case == "out_strided":   # rows 8 elements longer than the result's: stored aside
        outs = [cupy.empty((m, n + 8), dtype=dtype)[:, :n] for _ in sets]
    first = []
    for i, (a, b) in enumerate(sets):
        cupy.full(m * k + k * n + m * n, cupy.nan, dtype=dtype)   # freed to the pool
        if outs is None:
            first.append(hopmm.matmul(a, b))
        else:
            outs[i].fill(cupy.nan)
            first.append(hopmm.matmul(a, b, out=outs[i]).copy())
        assert rel_err(first[-1], a, b) < TOL[dtype]
    (recipe,) = fastpath._recipes.values()
    if case in ("c_only", "out_strided"):   # operands read in place, the result by rows
        assert type(recipe) is fastpath.DirectRecipe
    else:
        assert type(recipe) is fastpath.Recipe and recipe.scratch is not None
    for _ in range(2):
        for i, (a, b) in enumerate(sets):
            cupy.full(m * k + k * n + m * n, cupy.nan, dtype=dtype)
            if outs is None:
                got = hopmm.matmul(a, b)
            else:
                outs[i].fill(cupy.nan)
                got = hopmm.matmul(a, b, out=outs[i])
                assert got is outs[i]
            assert bool((got.view(cupy.uint16) == first[i].view(cupy.uint16)).all())

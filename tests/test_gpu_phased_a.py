"""GPU: a K-major A whose rows are not 16-byte aligned, read where it lies through eight tensor
maps of every eighth row and shifted into place in shared memory (KernelConfig.a_pitch_mod8),
against an fp32 cupy.matmul: every pitch class, rows and K off the tile, one to many row
blocks, batches, results of unaligned rows, fused epilogues; NaN-poisoned outputs, bitwise
equal to the aligned copy's kernel, and the heuristic's calls that take it."""
import math

import pytest

from conftest import requires_hopper
from forced import TOL, check, check_close, rand, reference

pytestmark = requires_hopper


def unaligned_a(m, k, dtype, pitch, batch=()):
    """An (m x k) A, the first k columns of an (m x pitch) array: rows `pitch` elements apart
    (pitch >= k, and not a multiple of 8: rows off 16 bytes), the base on 16 bytes."""
    return rand(batch + (m, pitch), dtype)[..., :k]


# (schedule, tile): every schedule that reads A so, each of its row counts.
PHASED_KERNELS = [("persistent", 64), ("persistent", 128), ("persistent", (64, 128)),
                  ("persistent", 256), ("persistent_overlap", 192), ("pingpong", 128)]


@pytest.mark.parametrize("schedule,tile", PHASED_KERNELS,
                         ids=[f"{s}-{t if isinstance(t, int) else 'x'.join(map(str, t))}"
                              for s, t in PHASED_KERNELS])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,pitch", [
    (8, 40, 1001, 1005),        # one row a phase; pitch 5 mod 8
    (77, 64, 63, 65),           # K below one k-block, rows off the phases' last; 1 mod 8
    (1000, 130, 1001, 1003),    # several row blocks and N tiles, K off the tile; 3 mod 8
    (259, 200, 130, 130),       # 2 mod 8: phases share 16-byte offsets in pairs
    (513, 96, 300, 300),        # 4 mod 8
    (260, 72, 600, 606),        # 6 mod 8
    (300, 72, 517, 519),        # 7 mod 8
])
def test_phased_a_matches_cupy(schedule, tile, dtype, m, n, k, pitch):
    import cupy

    a = unaligned_a(m, k, dtype, pitch)
    b = rand((k, n), dtype)
    first = check(a, b, schedule, tile, dtype, phased_a=True)
    # Again, and through the aligned copy: the same sums in the same order, bit for bit.
    again = check(a, b, schedule, tile, dtype, phased_a=True)
    assert bool(cupy.array_equal(again.view(cupy.uint16), first.view(cupy.uint16)))
    copied = check(a, b, schedule, tile, dtype)
    assert bool(cupy.array_equal(copied.view(cupy.uint16), first.view(cupy.uint16)))


@pytest.mark.parametrize("tb", [False, True], ids=["B_rowmajor", "B_transposed"])
def test_phased_a_with_either_b_and_batches(tb):
    """A batch of A slices 16-byte multiples apart (rows a multiple of 8), B of either layout."""
    a = unaligned_a(520, 999, "bfloat16", 999, batch=(3,))
    b = (rand((3, 96, 999), "bfloat16").swapaxes(-1, -2) if tb
         else rand((3, 999, 96), "bfloat16"))
    check(a, b, "persistent", 128, "bfloat16", phased_a=True)


@pytest.mark.parametrize("m,n,k,pitch,batch", [
    (26947, 40, 5815, 5815, ()),           # few columns: the 128 x 64 tile, A streamed
    (6777, 105, 3539, 3539, ()),           # the 64 x 128 tile
    (8000, 24, 2001, 2003, (2,)),          # a batch of A slices 16-byte multiples apart
])
def test_the_heuristic_reads_unaligned_a_in_place(heuristic_choice, m, n, k, pitch, batch):
    """hopmm.matmul on an A of rows off 16 bytes: explain names the phase maps (no copy),
    every element of a NaN-poisoned out written, a spare row after it left alone, and repeats
    (the remembered launches) bitwise equal."""
    import cupy

    import hopmm

    a = unaligned_a(m, k, "bfloat16", pitch, batch)
    b = rand(batch + (k, n), "bfloat16")
    buf = cupy.full(math.prod(batch + (m, n)) + n, cupy.nan, dtype=a.dtype)
    out = buf[:buf.size - n].reshape(batch + (m, n))
    text = hopmm.explain(a, b, out)
    assert "eight tensor maps of every eighth row" in text, text
    assert hopmm.matmul(a, b, out=out) is out
    check_close(out, reference(a, b), "bfloat16")
    assert bool(cupy.isnan(buf[buf.size - n:].astype(cupy.float32)).all())
    for _ in range(2):
        again = hopmm.matmul(a, b)
        assert bool(cupy.array_equal(again.view(cupy.uint16), out.view(cupy.uint16)))


def test_phased_a_into_a_result_of_unaligned_rows(heuristic_choice):
    """The result's rows off 16 bytes too: the phased kernel's row store."""
    import cupy

    import hopmm

    m, n, k = 16001, 24, 2001
    a = unaligned_a(m, k, "float16", k)
    b = rand((k, n), "float16")
    buf = cupy.full((m + 1, n + 1), cupy.nan, dtype="float16")
    out = buf[:m, 1:]
    text = hopmm.explain(a, b, out)
    assert "eight tensor maps" in text and "stores the rows itself" in text, text
    hopmm.matmul(a, b, out=out)
    got = out.astype(cupy.float32)
    ref = reference(a, b)
    assert not bool(cupy.isnan(got).any())
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL["float16"]
    assert bool(cupy.isnan(buf[m].astype(cupy.float32)).all())
    assert bool(cupy.isnan(buf[:, 0].astype(cupy.float32)).all())


def test_phased_a_with_a_fused_epilogue(heuristic_choice):
    """bias and gelu fused into the phased kernel (its epilogue is the plain kernels')."""
    import cupy

    import hopmm
    from hopmm import epilogue

    m, n, k = 20000, 40, 3001
    a = unaligned_a(m, k, "bfloat16", k)
    b = rand((k, n), "bfloat16")
    bias = rand((n,), "bfloat16")
    text = hopmm.explain(a, b, bias=bias, activation="gelu")
    assert "eight tensor maps" in text, text
    got = hopmm.matmul(a, b, bias=bias, activation="gelu")
    ref = epilogue.reference(cupy, reference(a, b), bias=bias, activation="gelu")
    check_close(got, ref, "bfloat16")


@pytest.mark.parametrize("case", ["base_off_16_bytes", "batch_stride_off_16_bytes"])
def test_what_the_phase_maps_cannot_read_is_copied(heuristic_choice, case):
    """A base off 16 bytes, or batch slices off 16 bytes: A goes through the aligned copy as
    before, and the result is still right."""
    import hopmm

    m, n, k = 1001, 40, 777
    if case == "base_off_16_bytes":
        a = rand((m, k + 3), "bfloat16")[:, 3:]
        b = rand((k, n), "bfloat16")
    else:
        a = unaligned_a(m, k, "bfloat16", k, batch=(2,))   # 1001 rows of 777: odd
        b = rand((2, k, n), "bfloat16")
    text = hopmm.explain(a, b)
    assert "eight tensor maps" not in text, text
    check_close(hopmm.matmul(a, b), reference(a, b), "bfloat16")

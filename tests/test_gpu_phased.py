"""GPU: a K-major A or an N-major B (or both) whose rows are not 16-byte aligned, read where
they lie through eight tensor maps of every eighth row and shifted into place in shared memory
(KernelConfig.a_pitch_mod8, b_pitch_mod8), against an fp32 cupy.matmul: every pitch class,
rows, columns and K off the tile, one to many row blocks, split-K, batches, results of
unaligned rows, fused epilogues; NaN-poisoned outputs, bitwise equal to the aligned copies'
kernel, and the heuristic's calls that take them."""
import math

import pytest

from conftest import requires_hopper
from forced import TOL, check, check_close, rand, reference

pytestmark = requires_hopper


def unaligned_a(m, k, dtype, pitch, batch=()):
    """An (m x k) A, the first k columns of an (m x pitch) array: rows `pitch` elements apart
    (pitch >= k, and not a multiple of 8: rows off 16 bytes), the base on 16 bytes."""
    return rand(batch + (m, pitch), dtype)[..., :k]


def aligned_b(k, n, dtype):
    """A (k x n) row-major B whose rows lie on 16 bytes (padded to a multiple of 8 elements),
    so that only A goes through the phase maps."""
    return rand((k, -(-n // 8) * 8), dtype)[:, :n]


def unaligned_b(k, n, dtype, pitch, batch=()):
    """A (k x n) row-major B, the first n columns of a (k x pitch) array (pitch not a multiple
    of 8: its k rows off 16 bytes)."""
    return rand(batch + (k, pitch), dtype)[..., :n]


# (schedule, tile, splits): every schedule that reads operands so, each of its tile shapes;
# split-K with as many splits as asked where the problem allows them.
PHASED_KERNELS = [("persistent", 64, 1), ("persistent", 128, 1), ("persistent", (64, 128), 1),
                  ("persistent", 256, 1), ("persistent_overlap", 192, 1), ("pingpong", 128, 1),
                  ("split_k", 128, 3), ("split_k_parallel", (64, 128), 4),
                  ("split_k_parallel", 128, 2)]
KERNEL_IDS = [f"{s}-{t if isinstance(t, int) else 'x'.join(map(str, t))}-k{k}"
              for s, t, k in PHASED_KERNELS]


def check_phased(a, b, schedule, tile, dtype, splits):
    """The phased kernel's result checked, again bitwise equal, and bitwise equal to the same
    kernel on aligned copies (the same sums in the same order)."""
    import cupy

    first = check(a, b, schedule, tile, dtype, phased=True, splits=splits)
    again = check(a, b, schedule, tile, dtype, phased=True, splits=splits)
    assert bool(cupy.array_equal(again.view(cupy.uint16), first.view(cupy.uint16)))
    copied = check(a, b, schedule, tile, dtype, splits=splits)
    assert bool(cupy.array_equal(copied.view(cupy.uint16), first.view(cupy.uint16)))


@pytest.mark.parametrize("schedule,tile,splits", PHASED_KERNELS, ids=KERNEL_IDS)
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
def test_phased_a_matches_cupy(schedule, tile, splits, dtype, m, n, k, pitch):
    check_phased(unaligned_a(m, k, dtype, pitch), aligned_b(k, n, dtype), schedule, tile, dtype,
                 splits)


def offered(schedule, tile, a_pitch, b_pitch) -> bool:
    """Whether the phased config of `schedule`'s `tile` (N-major B) keeps PHASED_MIN_STAGES
    stages on an H100, as any the heuristic offers (schedules.phased_config)."""
    from forced import tile_shape
    from hopmm.device import H100_SXM
    from hopmm.schedules import PHASED_MIN_STAGES, SCHEDULES

    sched, limit = SCHEDULES[schedule], H100_SXM.smem_per_block_optin
    block_m, block_n = tile_shape(tile)
    cfg = sched.deepest("bfloat16", block_n, False, True, limit, block_m)
    return sched.phased_config(cfg, a_pitch, b_pitch, limit).stages >= PHASED_MIN_STAGES


# (m, n, k, B's pitch, A's pitch): B alone phased, then both.
B_CASES = [
    (40, 1001, 8, 1005, 8),       # one k row a phase, one k-block; B pitch 5 mod 8
    (64, 63, 77, 65, 80),         # N below one box, k rows off the phases' last; 1 mod 8
    (130, 1001, 1000, 1003, 1000),   # several column blocks and k-blocks, N off the tile
    (200, 259, 130, 258, 136),    # 2 mod 8: phases share 16-byte offsets in pairs
    (17, 513, 300, 516, 304),     # few rows; 4 mod 8
]
BOTH_CASES = [
    (72, 260, 600, 262, 601),     # 6 mod 8, A's rows 1 mod 8
    (300, 517, 72, 519, 75),      # 7 mod 8, A 3 mod 8
]
B_PARAMS = [pytest.param(kernel, case, id=f"{name}-{'x'.join(map(str, case))}")
            for kernel, name in zip(PHASED_KERNELS, KERNEL_IDS)
            for cases, a_pitch in ((B_CASES, 0), (BOTH_CASES, 1))
            if offered(kernel[0], kernel[1], a_pitch, 1) for case in cases]


@pytest.mark.parametrize("kernel,case", B_PARAMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_phased_b_matches_cupy(kernel, case, dtype):
    schedule, tile, splits = kernel
    m, n, k, pitch, a_pitch = case
    check_phased(unaligned_a(m, k, dtype, a_pitch), unaligned_b(k, n, dtype, pitch), schedule,
                 tile, dtype, splits)


@pytest.mark.parametrize("tb", [False, True], ids=["B_rowmajor", "B_transposed"])
def test_phased_a_with_either_b_and_batches(tb):
    """A batch of A slices 16-byte multiples apart (rows a multiple of 8), B of either layout."""
    a = unaligned_a(520, 999, "bfloat16", 999, batch=(3,))
    b = (rand((3, 96, 999), "bfloat16").swapaxes(-1, -2) if tb
         else rand((3, 999, 96), "bfloat16"))
    check(a, b, "persistent", 128, "bfloat16", phased=True)


@pytest.mark.parametrize("ta", [False, True], ids=["A_rowmajor", "A_transposed"])
def test_phased_b_with_either_a_and_batches(ta):
    """A batch of B slices 16-byte multiples apart (k a multiple of 8), A of either layout."""
    b = unaligned_b(992, 515, "float16", 517, batch=(3,))
    a = (rand((3, 992, 200), "float16").swapaxes(-1, -2) if ta
         else rand((3, 200, 992), "float16"))
    check(a, b, "persistent", 128, "float16", phased=True)
    check(a, b, "split_k", 128, "float16", phased=True, splits=2)


@pytest.mark.parametrize("m,n,k,pitch,batch", [
    (26947, 40, 5815, 5815, ()),           # few columns: the 128 x 64 tile, A streamed
    (6777, 105, 3539, 3539, ()),           # 106 tiles: split over K
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


@pytest.mark.parametrize("m,n,k,b_pitch,a_pitch,copied", [
    (40, 20001, 3000, 20003, 3000, False),     # B alone off 16 bytes
    (33, 14743, 255, 14743, 255, False),       # both, both phased
    (33, 4517, 2219, 4517, 2219, True),        # both: A copied, B phased, split over K
])
def test_the_heuristic_reads_unaligned_b_in_place(heuristic_choice, m, n, k, b_pitch, a_pitch,
                                                  copied):
    """hopmm.matmul on an N-major B of k rows off 16 bytes (the result's rows are too): explain
    names the phase maps (and A's copy where the model copies it), every element of a
    NaN-poisoned out of unaligned rows written, the column after each row left alone, and
    repeats bitwise equal."""
    import cupy

    import hopmm

    a = unaligned_a(m, k, "bfloat16", a_pitch)
    b = unaligned_b(k, n, "bfloat16", b_pitch)
    buf = cupy.full((m, n + 1), cupy.nan, dtype=a.dtype)
    out = buf[:, :n]
    text = hopmm.explain(a, b, out)
    assert "eight tensor maps of every eighth row" in text, text
    assert ("from an aligned copy" in text) == copied, text
    assert hopmm.matmul(a, b, out=out) is out
    check_close(out, reference(a, b), "bfloat16")
    assert bool(cupy.isnan(buf[:, n].astype(cupy.float32)).all())
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

    m, n, k = 20000, 40, 2001
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

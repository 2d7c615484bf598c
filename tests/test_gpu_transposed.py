"""GPU tier: the transposed product (KernelConfig.trans_c: the kernel computes C^T = B^T A^T
and stages its boxes transposed, so they are boxes of C), forced through the launch layer on
every tile of the persistent and overlap kernels and unforced through hopmm.matmul where the
heuristic takes it, against an fp32 cupy.matmul into NaN-poisoned outputs with spare rows:
every layout, tile edges, one row, one column, K below a k-block, several tiles per CTA,
raster groups, batches and broadcasts, bitwise repeats, and the calls it cannot serve (a
fused epilogue, result rows TMA cannot store, operands read through phase maps) on the choice
it displaced. Skips without a Hopper GPU."""
import pytest

from conftest import requires_hopper
from forced import check, check_call, check_close, operands, rand, reference, run

pytestmark = requires_hopper

LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}


def _tiles():
    """Every tile of the two kernels but the half box, which they do not store transposed
    (KernelConfig.half_box; tests/test_half_box_tile_cpu.py)."""
    from hopmm.schedules import HALF_BOX_BLOCK_N, SCHEDULES

    return [(name, tile) for name in ("persistent", "persistent_overlap")
            for tile in SCHEDULES[name].tile_shapes() if tile[1] != HALF_BOX_BLOCK_N]


@pytest.mark.parametrize("schedule,tile", _tiles(), ids=lambda x: str(x))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k,group", [(1, 1, 1, 1),           # one row, one column
                                         (129, 65, 40, 3),       # K below a k-block, edges
                                         (3000, 2000, 200, 5)])  # several tiles per CTA
def test_forced_transposed(schedule, tile, layout, m, n, k, group):
    check(*operands(m, n, k, "bfloat16", *LAYOUTS[layout]), schedule, tile, "bfloat16", group,
          transposed=True)


@pytest.mark.parametrize("schedule,tile", [("persistent", (128, 256)),
                                           ("persistent_overlap", (128, 192)),
                                           ("persistent", (64, 192))], ids=str)
@pytest.mark.parametrize("m,n,k", [(700, 300, 4097),     # one round, long K
                                   (11008, 256, 1000),   # the kernel's rows: few columns of C
                                   (200, 5000, 130)])
def test_forced_transposed_fp16(schedule, tile, m, n, k):
    check(*operands(m, n, k, "float16"), schedule, tile, "float16", group=4, transposed=True)


@pytest.mark.parametrize("schedule,tile", [("persistent", (128, 128)),
                                           ("persistent_overlap", (64, 128))], ids=str)
@pytest.mark.parametrize("a_batch,b_batch", [((3,), (3,)), ((4,), ()), ((), (2,))])
def test_forced_transposed_batched(schedule, tile, a_batch, b_batch):
    a, _ = operands(300, 1, 1000, "float16", batch=a_batch)
    _, b = operands(1, 520, 1000, "float16", batch=b_batch)
    check(a, b, schedule, tile, "float16", group=2, transposed=True)


@pytest.mark.parametrize("schedule,tile", [("persistent", (128, 256)),
                                           ("persistent_overlap", (128, 192))], ids=str)
def test_transposed_is_bitwise_repeatable(schedule, tile):
    import cupy

    a, b = operands(2500, 700, 3000, "bfloat16")
    first, _ = run(a, b, schedule, tile, 8, transposed=True)
    second, _ = run(a, b, schedule, tile, 8, transposed=True)
    assert not bool(cupy.isnan(first.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(first.view(cupy.uint16), second.view(cupy.uint16)))


# Products the heuristic computes transposed on an H100 and on an H200: many rows over a few
# hundred columns, and a near-square product whose transpose has fewer half-empty tiles (the
# model's reasons: tests/test_transposed_cpu.py).
UNFORCED = {
    "rows_few_columns": (11008, 256, 5248),
    "rows_more_columns": (5696, 448, 4224),
    "near_square": (1728, 1856, 7040),
}


@pytest.mark.usefixtures("heuristic_choice")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", UNFORCED, ids=list(UNFORCED))
def test_heuristic_transposes(case, dtype, layout):
    m, n, k = UNFORCED[case]
    check_call(m, n, k, dtype, *LAYOUTS[layout], "stored transposed", "_ct_")


@pytest.mark.usefixtures("heuristic_choice")
def test_transposed_choice_leaves_fused_epilogues_and_unaligned_rows_to_the_one_it_displaced():
    """A fused epilogue keeps the untransposed kernel; so does a result whose rows TMA cannot
    store (its displaced choice stores them itself)."""
    import cupy

    import hopmm
    from hopmm import epilogue

    m, n, k = UNFORCED["rows_few_columns"]
    a, b = operands(m, n, k, "bfloat16")
    bias = cupy.random.standard_normal(n, dtype=cupy.float32).astype(a.dtype)
    text = hopmm.explain(a, b, bias=bias, activation="relu")
    assert "stored transposed" not in text and "fused into the kernel" in text, text
    got = hopmm.matmul(a, b, bias=bias, activation="relu")
    check_close(got, epilogue.reference(cupy, reference(a, b), bias=bias, activation="relu"),
                "bfloat16")
    out = cupy.full((m, n + 1), cupy.nan, dtype=a.dtype)[:, :n]   # rows 514 B apart
    text = hopmm.explain(a, b, out)
    assert "stored transposed" not in text and "stores the rows itself" in text, text
    assert hopmm.matmul(a, b, out=out) is out
    check_close(out, reference(a, b), "bfloat16")


@pytest.mark.usefixtures("heuristic_choice")
def test_rows_off_16_bytes_run_on_the_choice_the_transpose_displaced():
    """A whose rows lie off 16 bytes (a view of every 8192 of 8195 columns): the persistent
    choice the transposed one displaced reads them in place through phase maps."""
    import cupy

    import hopmm

    m, n, k = 8704, 192, 8192
    a = rand((m, k + 3), "bfloat16")[:, :k]
    b = rand((k, n), "bfloat16")
    assert "stored transposed" in hopmm.explain(rand((m, k), "bfloat16"), b)
    text = hopmm.explain(a, b)
    assert "schedule: persistent" in text and "read where they lie" in text, text
    assert "stored transposed" not in text, text
    out = cupy.full((m, n), cupy.nan, dtype=a.dtype)
    hopmm.matmul(a, b, out=out)
    check_close(out, reference(a, b), "bfloat16")

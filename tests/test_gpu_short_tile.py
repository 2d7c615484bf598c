"""GPU tier: the persistent kernels' 64-row tiles (one consumer warpgroup), which the heuristic
takes where 128-row tiles leave SMs idle and for products of at most 64 rows: unforced through
hopmm.matmul (explain names the tile) and forced through the launch layer, against an fp32
cupy.matmul into NaN-poisoned outputs with spare rows: every layout and dtype, tile edges, one
row, one column, K below a k-block, several tiles per CTA, raster groups, batches, unaligned
rows (copied in, stored by rows), a fused epilogue into c, the overlap kernel bitwise the
single-set one, bitwise repeats and new operands through the remembered launches. Skips
without a Hopper GPU."""
import pytest

from conftest import requires_hopper
from forced import (check, check_call, check_close, check_fused_into_c, operands,
                    reference, run)

pytestmark = requires_hopper

LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}

# (m, n, k, schedule, tile the heuristic takes): 64-row tiles fill SMs that 128-row tiles leave
# idle (NOTES v0.33), on the single-set kernel (heuristics.OVERLAP_BLOCK_MS, NOTES v0.36).
UNFORCED = {
    "b_larger_one_round": (640, 2304, 2112, "persistent", "64x192"),
    "a_larger_one_round": (1472, 896, 1472, "persistent", "64x192"),
    "narrowest": (1024, 1024, 1024, "persistent", "64x128"),
    "widest": (320, 5696, 1100, "persistent", "64x256"),
    # at most 64 rows in one wave of 64 x 128 tiles: B's stream sets the pace (NOTES v0.34),
    # too short for a split to pay whatever the device's DRAM (0.6-1.6 x the H100's, v0.52)
    "few_rows": (48, 10240, 4480, "persistent", "64x128"),
    "few_rows_unaligned_a": (17, 8200, 1500, "persistent", "64x128"),
}


@pytest.mark.usefixtures("heuristic_choice")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", UNFORCED, ids=list(UNFORCED))
def test_heuristic_takes_64_row_tiles(case, dtype, layout):
    m, n, k, schedule, tile = UNFORCED[case]
    check_call(m, n, k, dtype, *LAYOUTS[layout], f"tiles of {tile}", f"schedule: {schedule}\n")


@pytest.mark.usefixtures("heuristic_choice")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_64_row_tiles_store_unaligned_rows_themselves(dtype):
    """1030 columns: result rows of 2060 bytes, which TMA cannot store. The 64 x 192 tile goes
    from the overlap kernel to the single-set one, which stores the rows itself."""
    import cupy

    import hopmm

    m, n, k = 1000, 1030, 4096
    a, b = operands(m, n, k, dtype, False, True)   # B K-major: its rows are aligned
    buf = cupy.full((m + 1) * n, cupy.nan, dtype=dtype)
    out = buf[:m * n].reshape(m, n)
    text = hopmm.explain(a, b, out)
    assert "tiles of 64x192" in text and "schedule: persistent\n" in text, text
    assert "stores the rows itself" in text, text
    hopmm.matmul(a, b, out=out)
    check_close(out, reference(a, b), dtype)
    assert bool(cupy.isnan(buf[m * n:].astype(cupy.float32)).all())


def _forced_tiles():
    from hopmm.schedules import SCHEDULES, WGMMA_M

    return [(name, tile) for name in ("persistent", "persistent_overlap")
            for tile in SCHEDULES[name].tile_shapes() if tile[0] == WGMMA_M]


@pytest.mark.parametrize("schedule,tile", _forced_tiles(), ids=lambda x: str(x))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k,group", [(1, 1, 1, 1),           # one row, one column
                                         (65, 129, 40, 3),       # K below a k-block, edges
                                         (64, 256, 64, 1),       # exactly one tile
                                         (300, 700, 4097, 16),   # one round, long K
                                         (2000, 3000, 200, 5)])  # several tiles per CTA
def test_forced_64_row_tiles(schedule, tile, layout, m, n, k, group):
    check(*operands(m, n, k, "bfloat16", *LAYOUTS[layout]), schedule, tile, "bfloat16", group)


@pytest.mark.parametrize("schedule,tile", _forced_tiles(), ids=lambda x: str(x))
@pytest.mark.parametrize("a_batch,b_batch", [((3,), (3,)), ((4,), ())])
def test_forced_64_row_tiles_batched(schedule, tile, a_batch, b_batch):
    a, _ = operands(300, 1, 1000, "float16", batch=a_batch)
    _, b = operands(1, 520, 1000, "float16", batch=b_batch)
    check(a, b, schedule, tile, "float16", group=2)


@pytest.mark.parametrize("block_n", [128, 192])
@pytest.mark.parametrize("m,n,k", [(2000, 3000, 200),    # several tiles per CTA: both sets
                                   (300, 700, 4097)])    # one tile per CTA
def test_overlap_64_row_tiles_are_bitwise_the_single_set_kernel(m, n, k, block_n):
    import cupy

    a, b = operands(m, n, k, "bfloat16")
    overlapped, _ = run(a, b, "persistent_overlap", (64, block_n))
    single, _ = run(a, b, "persistent", (64, block_n))
    assert not bool(cupy.isnan(overlapped.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(overlapped.view(cupy.uint16), single.view(cupy.uint16)))


@pytest.mark.usefixtures("heuristic_choice")
@pytest.mark.parametrize("bias_form", ["columns", "rows"])
def test_64_row_tiles_with_a_fused_epilogue(bias_form):
    """bias, c, alpha, beta and gelu on the 64-row tile (the single-set kernel: the overlap
    kernel would fetch bias and c one pair at a time), the result written into c itself."""
    text = check_fused_into_c(*operands(640, 2304, 2112, "bfloat16"), bias_form)
    assert "tiles of 64x192" in text and "schedule: persistent\n" in text, text
    assert "fused into the kernel" in text, text
    few = check_fused_into_c(*operands(40, 6144, 2048, "float16"), bias_form, "float16")
    assert "tiles of 64x128" in few and "streaming B sets the pace" in few, few

"""GPU tier, persistent_cluster4: clusters of four CTAs on adjacent M tiles, each loading its A
tile and a quarter of the shared B tile (whole 64-wide boxes, or a 16-row k slice of every box
where the tile has fewer boxes than the cluster has CTAs). Bitwise equality with the
unclustered persistent kernel on the same tiles (a misplaced slice, or a stage reused before a
peer released it, changes bits) across M-tile counts that leave one to three CTAs of the last
group past M, K of partial k-blocks, every layout, B rows off cache lines and batches; the
heuristic's pick for a tall product of unaligned B rows through the public path; repeatability.
The general cases run through SCHEDULE_NAMES in test_gpu_matmul.py, fused epilogues through
test_gpu_fused.py, the grid's residency in test_gpu_cluster.py."""
import pytest

import forced
from conftest import requires_hopper
from forced import TOL, operands, rand

pytestmark = requires_hopper

QUAD = "persistent_cluster4"
DTYPES = ["bfloat16", "float16"]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
LAYOUT_IDS = ["NN", "TN", "NT", "TT"]
TILES = [128, 192, 256, (64, 128), (64, 192), (64, 256)]
TILE_IDS = ["128x128", "128x192", "128x256", "64x128", "64x192", "64x256"]


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("HOPMM_STRICT", "1")


def bitwise_equal(a, b, tile, group=16):
    import cupy

    quad, quad_buf = forced.run(a, b, QUAD, tile, group)
    single, single_buf = forced.run(a, b, "persistent", tile, group)
    assert not bool(cupy.isnan(quad.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(quad.view(cupy.uint16), single.view(cupy.uint16)))
    # nothing written outside the result (spare rows below each slice, padding right)
    assert bool(cupy.array_equal(cupy.isnan(quad_buf), cupy.isnan(single_buf)))
    return quad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
# 64-row tiles: 2, 5, 11, 16, 19 M tiles (groups of four missing 2, 3, 1, 0, 1); 128-row: 1, 3,
# 6, 8, 10. N of 152 and 200 are rows of 304 and 400 bytes (off cache lines); K of 4097 and
# 129 end in a partial k-block, whose k slices past K are zero-filled.
@pytest.mark.parametrize("m,n,k", [(100, 152, 700), (300, 520, 4097), (700, 200, 129),
                                   (1000, 152, 1000), (1210, 264, 320)])
def test_bitwise_equal_to_the_persistent_kernel(m, n, k, ta, tb, tile, dtype):
    a, b = operands(m, n, k, dtype, ta, tb)
    got = bitwise_equal(a, b, tile)
    ref = forced.reference(a, b)
    forced.check_close(got.reshape(ref.shape), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [(64, 192), 128], ids=["64x192", "128x128"])
@pytest.mark.parametrize("a_batch,b_batch", [((5,), (5,)), ((3,), ()), ((), (7,))], ids=str)
def test_batches_leave_the_rows_below_each_slice(a_batch, b_batch, tile, dtype):
    """300 rows: 5 M tiles of 64 rows (three CTAs of the second group past M) or 3 of 128 (one)
    in every slice; the spare rows below each slice must stay NaN."""
    a = rand(a_batch + (300, 200), dtype)
    b = rand(b_batch + (200, 152), dtype)
    bitwise_equal(a, b, tile)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3, 16])
def test_raster_groups_over_several_rounds(group, dtype):
    """19 x 3 tiles of 64 x 192 on 30 clusters of four: 15 groups of four M tiles, two and a
    half rounds."""
    bitwise_equal(*operands(1210, 520, 700, dtype), (64, 192), group)


@pytest.mark.parametrize("dtype", DTYPES)
def test_heuristic_pick_for_a_tall_product_of_unaligned_b_rows(dtype):
    """7383 x 152 x 8784 (B rows of 304 bytes): 116 tiles of 64 x 192 in one round of clusters
    of four on a device that reports running 29 or more of them at once."""
    import cupy

    import hopmm
    from hopmm.device import query

    a, b = rand((7383, 8784), dtype), rand((8784, 152), dtype)
    text = hopmm.explain(a, b)
    clusters = query(cupy.cuda.Device().id).clusters_at_once(4)
    if clusters is None or clusters < 29:
        pytest.skip(f"this device runs {clusters} clusters of four at once")
    assert f"schedule: {QUAD}\n" in text and "64x192" in text and "cluster: 4 CTAs" in text
    out = cupy.full((7383, 152), cupy.nan, dtype=dtype)
    hopmm.matmul(a, b, out=out)
    assert forced.rel_err(out, a, b) < TOL[dtype]
    again = hopmm.matmul(a, b)
    assert bool(cupy.array_equal(out.view(cupy.uint16), again.view(cupy.uint16)))

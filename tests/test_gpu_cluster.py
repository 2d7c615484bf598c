"""GPU tier, the cluster schedules: what is specific to clusters of two CTAs sharing a B
tile through TMA multicast. Pairs whose second tile lies past the last M tile (odd M-tile
counts, in every batch slice), one tile, raster groups, every tile shape on every layout,
bitwise equality with the unclustered persistent kernel (same tiles, same k order: a misplaced
multicast slice or a stage reused too early changes bits) and of 192 x 192 tiles (three
consumers) with 128 x 192 ones (each consumer sums the same 64 x 192 block in the same order),
run-to-run repeatability; then persistent_cluster_overlap against persistent_cluster, bit for
bit.
The general cases run on both through SCHEDULE_NAMES in test_gpu_matmul.py."""
import pytest

import forced
from conftest import requires_hopper
from forced import TOL, operands, rand

pytestmark = requires_hopper

DTYPES = ["bfloat16", "float16"]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
LAYOUT_IDS = ["NN", "TN", "NT", "TT"]
CLUSTER = "persistent_cluster"
CLUSTER_OVERLAP = "persistent_cluster_overlap"
TILES = [128, 192, 256, (192, 192)]   # widths of 128-row tiles, and the tall tile
TILE_IDS = ["128x128", "128x192", "128x256", "192x192"]


@pytest.fixture(autouse=True)
def _cluster_schedule(monkeypatch):
    import hopmm

    monkeypatch.setenv("HOPMM_STRICT", "1")
    hopmm.use_schedule(CLUSTER)
    yield
    hopmm.use_schedule(None)


def run(a, b, tile, group=16, schedule=CLUSTER):
    return forced.run(a, b, schedule, tile, group)


def check(a, b, tile, dtype, group=16):
    return forced.check(a, b, CLUSTER, tile, dtype, group)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
# 1, 2, 3, 5, 8, 11 M tiles of 128 rows; 1, 2, 2, 4, 6, 7 of 192
@pytest.mark.parametrize("m", [100, 256, 300, 640, 1000, 1300])
def test_odd_and_even_m_tile_counts(m, ta, tb, tile, dtype):
    check(*operands(m, 520, 200, dtype, ta, tb), tile, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (17, 64, 64), (128, 128, 64), (128, 256, 64),
                                   (100, 17, 1000), (192, 192, 64)])
def test_one_tile(m, n, k, tile, dtype):
    check(*operands(m, n, k, dtype), tile, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", TILES, ids=TILE_IDS)
@pytest.mark.parametrize("a_batch,b_batch", [((5,), (5,)), ((3,), ()), ((), (7,)),
                                             ((2, 3), (2, 3))], ids=str)
def test_batches_with_an_odd_number_of_m_tiles(a_batch, b_batch, tile, dtype):
    """3 M tiles per slice (300 rows of 128-row tiles, 500 of 192-row ones), so the second CTA
    of one pair in every slice computes a tile past the last row; the rows below each slice
    must stay untouched."""
    import cupy

    a = rand(a_batch + (300 if forced.tile_shape(tile)[0] == 128 else 500, 200), dtype)
    b = rand(b_batch + (200, 260), dtype)
    check(a, b, tile, dtype)
    # the public path too (its own buffers, the heuristic's tile width)
    import hopmm

    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = hopmm.matmul(a, b).astype(cupy.float32)
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 3, 5, 16, 32])
@pytest.mark.parametrize("tile", [128, (192, 192)], ids=["128x128", "192x192"])
def test_raster_groups(tile, group, dtype):
    check(*operands(1300, 1100, 200, dtype), tile, dtype, group)   # 11 x 9 tiles, 7 x 6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,tile", [(8192, 4096, 128, 256),   # 512 pairs: ~8 per cluster
                                        (4224, 2048, 256, 128),   # 33 M tiles, many waves
                                        (8320, 8192, 64, 256),    # 65 M tiles, k = one block
                                        (6336, 3000, 3000, (192, 192))])  # 33 M tiles, 4.1 waves
def test_many_pairs_per_cluster(m, n, k, tile, dtype):
    check(*operands(m, n, k, dtype), tile, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_n", [128, 192, 256])
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("m,n,k", [(1000, 1030, 700), (300, 520, 4097), (2, 300, 129)])
def test_bitwise_equal_to_the_persistent_kernel(m, n, k, ta, tb, block_n, dtype):
    """Each output tile is the same wgmma sequence over the same bytes in both kernels: only
    where the bytes come from differs."""
    import cupy

    a, b = operands(m, n, k, dtype, ta, tb)
    cluster, _ = run(a, b, block_n)
    single, _ = run(a, b, block_n, schedule="persistent")
    assert not bool(cupy.isnan(cluster.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(cluster.view(cupy.uint16), single.view(cupy.uint16)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("m,n,k", [(1000, 1030, 700), (3000, 3000, 3000), (300, 520, 4097),
                                   (2, 300, 129)])
def test_tall_tiles_are_bitwise_the_128_row_ones(m, n, k, ta, tb, dtype):
    """A consumer of a 192 x 192 tile sums the same 64 x 192 block over the same k-blocks with
    the same wgmma as a consumer of a 128 x 192 tile; only which CTA and which of three
    consumers does it differs. (3000³: B's rows are not whole cache lines, the heuristic's
    tall-tile case.)"""
    import cupy

    a, b = operands(m, n, k, dtype, ta, tb)
    tall, _ = run(a, b, (192, 192))
    short, _ = run(a, b, 192)
    assert not bool(cupy.isnan(tall.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(tall.view(cupy.uint16), short.view(cupy.uint16)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (4224, 4096, 1024), (300, 4096, 8192),
                                   (3000, 3000, 3000)])   # the heuristic's 192 x 192 tiles
def test_bitwise_repeatable(m, n, k, dtype):
    """Twenty runs, all bit-identical: a stage refilled before both CTAs released it, or a
    multicast racing a consumer, shows up as run-to-run differences."""
    import cupy

    import hopmm

    a, b = operands(m, n, k, dtype)
    first = hopmm.matmul(a, b)
    for _ in range(19):
        again = hopmm.matmul(a, b)
        assert bool(cupy.array_equal(first.view(cupy.uint16), again.view(cupy.uint16)))


@pytest.mark.parametrize("block_n", [128, 192])
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("m,n,k", [(1000, 1030, 700),    # 8 x 6-9 tiles: one pair per cluster
                                   (4224, 4096, 128),    # 33 M tiles: ~6-8 pairs per cluster
                                   (300, 520, 4097),     # 3 M tiles: a CTA without its own
                                   (2, 300, 129)])
def test_cluster_overlap_is_bitwise_the_cluster_kernel(m, n, k, ta, tb, block_n):
    """Two accumulator sets change when a tile is stored, not what is summed or which CTA
    stores it: the same bits as persistent_cluster (a tile stored from the wrong set, before
    its last k-block completed, or by the CTA whose tile lies past C, would differ)."""
    import cupy

    a, b = operands(m, n, k, "bfloat16", ta, tb)
    overlapped, _ = run(a, b, block_n, schedule=CLUSTER_OVERLAP)
    single, _ = run(a, b, block_n)
    assert not bool(cupy.isnan(overlapped.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(overlapped.view(cupy.uint16), single.view(cupy.uint16)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_n", [128, 192])
def test_cluster_overlap_batches_with_an_odd_number_of_m_tiles(block_n, dtype):
    """3 M tiles per slice in 5 slices: the rows below each slice stay untouched."""
    forced.check(rand((5, 300, 200), dtype), rand((5, 200, 260), dtype), CLUSTER_OVERLAP,
                 block_n, dtype)


def test_explain_shows_the_cluster():
    import hopmm

    text = hopmm.explain(rand((4096, 4096), "bfloat16"), rand((4096, 4096), "bfloat16"))
    assert "schedule: persistent_cluster" in text and "cluster: 2 CTAs" in text
    grid = text[text.index("grid: (") + len("grid: ("):]
    assert int(grid[:grid.index(",")]) % 2 == 0


@pytest.mark.parametrize("schedule,tile", [(CLUSTER, t) for t in TILES]
                         + [("persistent_cluster4", t) for t in (128, 256, (64, 192))],
                         ids=lambda v: v if isinstance(v, str)
                         else "x".join(map(str, forced.tile_shape(v))))
def test_every_cluster_of_the_grid_is_resident(schedule, tile):
    """The persistent grid takes as many clusters as the device reports running at once
    (resident_ctas); if the GPCs could not hold them all, the surplus clusters would wait for a
    whole wave (a tail of up to 2x). Asks the driver (cuOccupancyMaxActiveClusters through
    cuda-bindings) for this kernel itself."""
    import cupy

    from hopmm import launch
    from hopmm.device import query
    from hopmm.problem import Problem
    from hopmm.schedules import SCHEDULES

    Cluster = SCHEDULES[schedule]

    try:
        from cuda.bindings import driver
    except ImportError:
        pytest.skip("cuda-bindings not installed")
    dev = query(cupy.cuda.Device().id)
    block_m, block_n = forced.tile_shape(tile)
    cfg = Cluster.deepest("bfloat16", block_n, False, True, dev.smem_per_block_optin, block_m)
    grid = Cluster.grid(Problem(8192, 8192, 8192, 1, "bfloat16"), cfg, 1,
                        Cluster.resident_ctas(dev))
    kernel_info = launch.compiled(Cluster, cfg)
    kernel = launch._loaded(str(kernel_info.cubin_path), kernel_info.name,
                            Cluster.smem_bytes(cfg), cupy.cuda.Device().id)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = Cluster.threads(cfg), 1, 1
    config.sharedMemBytes = Cluster.smem_bytes(cfg)
    config.numAttrs = 0    # the kernel's __cluster_dims__ gives the cluster shape
    err, resident = driver.cuOccupancyMaxActiveClusters(driver.CUfunction(kernel.kernel.ptr),
                                                        config)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    size = Cluster.cluster_size
    print(f"{dev.name}: {resident} clusters of {size} resident at once; the grid has "
          f"{grid[0] // size}")
    assert grid[0] // size <= resident
    # and no fewer than fit: the grid fills the SMs the clusters can hold
    assert grid[0] // size == min(resident, dev.sm_count // size)

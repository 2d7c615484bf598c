"""GPU tier, split-K (the serial split_k, split_k_cluster and split_k_parallel): correctness against
cupy.matmul for explicit split counts (dividing the k-blocks or not, K not a multiple of 64,
K shorter than splits x 64 is refused by the bound), batches and transposed / strided
operands; bitwise identical results run to run, across two streams and between the two
reductions; semaphores back at zero after every kernel. Skips without a Hopper GPU."""
import dataclasses

import numpy as np
import pytest

import forced
from conftest import requires_hopper

pytestmark = requires_hopper

TOL = {"bfloat16": 1e-2, "float16": 2e-3}
BLOCK_M = 128   # schedules.BLOCK_M


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("HOPMM_STRICT", "1")
    yield
    import hopmm

    hopmm.use_schedule(None)


def rand(shape, dtype):
    import cupy

    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)


def ref(a, b):
    import cupy

    return cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))


def rel_err(got, a, b):
    import cupy

    r = ref(a, b)
    got = got.astype(cupy.float32)
    assert got.shape == r.shape
    assert not bool(cupy.isnan(got).any()), "unwritten (NaN-poisoned) output elements"
    return float(cupy.linalg.norm(got - r) / max(float(cupy.linalg.norm(r)), 1e-30))


SPLIT_K = ["split_k", "split_k_cluster", "split_k_parallel"]
CLUSTER_MAX = 8   # schedules.MAX_CLUSTER_SPLITS


def run_split(a, b, splits, schedule="split_k", block_m=None, block_n=None):
    """C = A @ B on the split-K kernel of `schedule` with exactly `splits` splits (output
    poisoned first), on tiles of `block_m` rows, or those the heuristic forces where their
    bound allows `splits` (else 128); with `block_n`, on the schedule's deepest tile of that
    shape whatever the heuristic offers (loading only the A rows a few-row problem has, as
    split_configs does). Returns (C, the choice)."""
    from hopmm import heuristics
    from hopmm.layout import MAX_GRID_Z

    def pick(problem, dev):
        c = heuristics.choose(problem, dev, schedule)
        count = min(problem.batch, MAX_GRID_Z)
        if block_n is not None:
            cfg = c.schedule.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                                     dev.smem_per_block_optin, block_m or BLOCK_M)
            c = dataclasses.replace(c, config=c.schedule.trimmed_config(cfg, problem.m))
        elif block_m is not None or c.schedule.max_splits(problem, c.config, count,
                                                          dev.sm_count) < splits:
            want = block_m or BLOCK_M
            c = dataclasses.replace(c, config=next(
                cfg for cfg in heuristics.split_configs(c.schedule, problem, dev)
                if cfg.block_m == want))
        return dataclasses.replace(c, splits=splits)

    return forced.run_choice(a, b, pick)


def semaphores_zero():
    import cupy

    from hopmm import workspace

    cupy.cuda.get_current_stream().synchronize()
    return all(not bool(ws.semaphores.any()) for ws in workspace._workspaces.values())


# (m, n, k, splits): 16 k-blocks / 4; 65 k-blocks / 2, 7, 16 (uneven); K = 4097 and 1000
# (not multiples of 64); 2 k-blocks / 2 (K = 100 < 2 x 64 + 64); many splits of 1 k-block.
CASES = [(256, 256, 1024, 4), (1000, 1023, 4097, 2), (300, 260, 4097, 7),
         (128, 128, 4097, 16), (200, 136, 1000, 3), (64, 64, 100, 2), (128, 256, 640, 10),
         (512, 512, 16384, 8), (256, 256, 65536, 16), (128, 4096, 16384, 4), (17, 23, 777, 5),
         (1, 8, 64, 1), (130, 70, 1000, 1),
         # split_k_parallel's 64-row tiles (M <= 64), loading 16 rows of A where M <= 16
         (1, 8192, 8192, 2), (4, 1000, 4097, 3), (16, 300, 2000, 9), (17, 129, 999, 6),
         (64, 2048, 4096, 4), (3, 40, 130, 3), (32, 5000, 1000, 2)]


@pytest.mark.parametrize("schedule", SPLIT_K)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,splits", CASES, ids=[f"{m}x{n}x{k}_s{s}" for m, n, k, s in CASES])
def test_split_k_matches_cupy(m, n, k, splits, dtype, schedule):
    if schedule == "split_k_cluster":
        splits = min(splits, CLUSTER_MAX)
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    c, choice = run_split(a, b, splits, schedule)
    assert choice.splits == splits and choice.schedule.name == schedule
    assert rel_err(c, a, b) < TOL[dtype]
    assert semaphores_zero()


# (m, n, k, splits): split_k_parallel's 64-row tiles over several M tiles (problems of more
# than 64 rows whose 64-row tiles all run at once): M not a multiple of 64, uneven splits, K
# not a multiple of 64, one split, N edges of both widths.
MANY_ROW_TILES = [(192, 1000, 3000, 3), (200, 300, 4097, 5), (130, 129, 999, 2),
                  (333, 257, 8192, 1), (1000, 60, 2000, 2), (448, 256, 6000, 4)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,splits", MANY_ROW_TILES,
                         ids=[f"{m}x{n}x{k}_s{s}" for m, n, k, s in MANY_ROW_TILES])
def test_parallel_64_row_tiles_over_many_rows(m, n, k, splits, dtype):
    """The same sums as the 128-row tiles, bitwise (each row's partials in the same order),
    every run."""
    import cupy

    a, b = rand((m, k), dtype), rand((k, n), dtype)
    c, choice = run_split(a, b, splits, "split_k_parallel", block_m=64)
    assert choice.config.block_m == 64 and choice.splits == splits
    assert rel_err(c, a, b) < TOL[dtype]
    assert semaphores_zero()
    bits = c.view(cupy.uint16).copy()
    wide, _ = run_split(a, b, splits, "split_k_parallel", block_m=BLOCK_M)
    assert bool(cupy.array_equal(wide.view(cupy.uint16), bits))
    again, _ = run_split(a, b, splits, "split_k_parallel", block_m=64)
    assert bool(cupy.array_equal(again.view(cupy.uint16), bits))


# (m, n, k, splits): split_k_parallel's 64 x 192 tile, one column of tiles for 129-192
# columns: one row and 30 (A rows zero-filled past M), M and N edges, K not a multiple of 64,
# a split of one k-block, K below one k-block, a second column of tiles, N whose rows are not
# 16-byte aligned (read from an aligned copy), many splits.
WIDE_64_ROW_TILES = [(1, 150, 4097, 3), (30, 192, 2000, 9), (129, 192, 6000, 5),
                     (200, 129, 999, 2), (130, 160, 640, 10), (64, 100, 50, 1),
                     (1000, 193, 3000, 4), (333, 191, 8192, 7), (448, 192, 23936, 16)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,splits", WIDE_64_ROW_TILES,
                         ids=[f"{m}x{n}x{k}_s{s}" for m, n, k, s in WIDE_64_ROW_TILES])
def test_parallel_64x192_tiles(m, n, k, splits, dtype):
    """Right, and the same sums as the 128 x 128 tiles, bitwise (each element's partials in
    the same order), every run."""
    import cupy

    a, b = rand((m, k), dtype), rand((k, n), dtype)
    c, choice = run_split(a, b, splits, "split_k_parallel", block_m=64, block_n=192)
    cfg = choice.config
    assert (cfg.block_m, cfg.block_n, choice.splits) == (64, 192, splits)
    assert rel_err(c, a, b) < TOL[dtype]
    assert semaphores_zero()
    bits = c.view(cupy.uint16).copy()
    square, _ = run_split(a, b, splits, "split_k_parallel", block_m=BLOCK_M, block_n=128)
    assert bool(cupy.array_equal(square.view(cupy.uint16), bits))
    for _ in range(3):
        again, _ = run_split(a, b, splits, "split_k_parallel", block_m=64, block_n=192)
        assert bool(cupy.array_equal(again.view(cupy.uint16), bits))
    assert semaphores_zero()


# Each schedule on its forced tiles, and split_k_parallel's 64-row tiles over several M tiles
# ((schedule, block_m, block_n); None: the heuristic's).
TILED = ([(schedule, None, None) for schedule in SPLIT_K]
         + [("split_k_parallel", 64, None), ("split_k_parallel", 64, 192)])


@pytest.mark.parametrize("schedule,block_m,block_n", TILED)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_split_k_transposed_and_batched(ta, tb, schedule, block_m, block_n):
    dtype = "bfloat16"
    m, n, k, batch = 200, 136, 1500, 3
    a = rand((batch, k, m), dtype).transpose(0, 2, 1) if ta else rand((batch, m, k), dtype)
    b = rand((batch, n, k), dtype).transpose(0, 2, 1) if tb else rand((batch, k, n), dtype)
    c, choice = run_split(a, b, 5, schedule, block_m, block_n)
    assert block_m is None or choice.config.block_m == block_m
    assert block_n is None or choice.config.block_n == block_n
    assert rel_err(c, a, b) < TOL[dtype]
    assert semaphores_zero()


@pytest.mark.parametrize("schedule", SPLIT_K)
def test_split_k_strided_views_and_broadcast(schedule):
    dtype = "float16"
    big_a = rand((300, 2100), dtype)
    a = big_a[10:210, 8:2008]           # strided rows, read in place
    b = rand((2000, 2, 96), dtype)[:, 1, :]   # 2-element row stride
    c, _ = run_split(a, b, 6, schedule)
    assert rel_err(c, a, b) < TOL[dtype]
    a3, b3 = rand((4, 100, 900), dtype), rand((900, 50), dtype)   # B broadcast over the batch
    c, _ = run_split(a3, b3, 3, schedule)
    assert rel_err(c, a3, b3) < TOL[dtype]


# (m, n, k, splits): uneven slices, edges in M and N, K not a multiple of 64, and a grid of
# 256 clusters of 8, more than run at once (the clusters of later waves wait for SMs).
SAME_SUMS = [(1000, 1023, 4097, 2), (300, 260, 4097, 7), (17, 23, 777, 5), (512, 512, 16384, 8),
             (2048, 2048, 4096, 8)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,splits", [(1000, 1023, 4097, 2), (300, 260, 4097, 7),
                                          (17, 23, 777, 5), (256, 256, 65536, 33),
                                          (16, 4096, 8192, 4), (64, 1000, 3000, 16),
                                          (30, 700, 3000, 12)])
def test_parallel_reduction_is_bitwise_the_serial_one(m, n, k, splits, dtype):
    """split_k_parallel adds the same partials in the same order as split_k: the same bits
    (where split_k's tiles and bound allow the split count), every run."""
    import cupy

    from hopmm.device import query

    a, b = rand((m, k), dtype), rand((k, n), dtype)
    parallel, choice = run_split(a, b, splits, "split_k_parallel")
    assert rel_err(parallel, a, b) < TOL[dtype]
    assert semaphores_zero()
    bits = parallel.view(cupy.uint16).copy()
    sm_count = query(cupy.cuda.Device().id).sm_count
    if -(-m // 128) * -(-n // 128) * splits <= sm_count:
        serial, _ = run_split(a, b, splits, "split_k")
        assert bool(cupy.array_equal(serial.view(cupy.uint16), bits))
    for _ in range(5):
        again, _ = run_split(a, b, splits, "split_k_parallel")
        assert bool(cupy.array_equal(again.view(cupy.uint16), bits))
    assert semaphores_zero()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_decode_shapes_through_matmul(m, dtype):
    """The default path on decode shapes (few rows, long N and K), into a poisoned out."""
    import cupy

    import hopmm

    a, b = rand((m, 4096), dtype), rand((4096, 6144), dtype)
    out = cupy.full((m, 6144), cupy.nan, dtype=dtype)
    assert hopmm.matmul(a, b, out=out) is out
    assert rel_err(out, a, b) < TOL[dtype]
    again = hopmm.matmul(a, b)
    assert bool(cupy.array_equal(again.view(cupy.uint16), out.view(cupy.uint16)))
    assert semaphores_zero()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k,splits", SAME_SUMS,
                         ids=[f"{m}x{n}x{k}_s{s}" for m, n, k, s in SAME_SUMS])
def test_cluster_reduction_is_bitwise_the_serial_one(m, n, k, splits, dtype):
    """split_k_cluster adds the same partials in the same order as split_k: the same bits,
    every run."""
    import cupy

    from hopmm.device import query

    a, b = rand((m, k), dtype), rand((k, n), dtype)
    cluster, _ = run_split(a, b, splits, "split_k_cluster")
    assert rel_err(cluster, a, b) < TOL[dtype]
    bits = cluster.view(cupy.uint16).copy()
    # split_k's co-residency bound refuses grids of more CTAs than SMs.
    if -(-m // 128) * -(-n // 128) * splits <= query(cupy.cuda.Device().id).sm_count:
        serial, _ = run_split(a, b, splits, "split_k")
        assert bool(cupy.array_equal(serial.view(cupy.uint16), bits))
    else:
        assert (m, n) == (2048, 2048)
    for _ in range(5):
        again, _ = run_split(a, b, splits, "split_k_cluster")
        assert bool(cupy.array_equal(again.view(cupy.uint16), bits))


def test_cluster_capacity_is_read_from_the_device():
    """cuOccupancyMaxActiveClusters, through the extension: one CTA per SM without a cluster,
    never more SMs than the GPU has, fewer clusters as they grow."""
    import cupy

    from hopmm.device import MAX_PORTABLE_CLUSTER, query

    dev = query(cupy.cuda.Device().id)
    cap = dev.cluster_capacity
    assert len(cap) == MAX_PORTABLE_CLUSTER and cap[0] == dev.sm_count
    assert all(n * cap[n - 1] <= dev.sm_count for n in range(1, len(cap) + 1))
    assert list(cap) == sorted(cap, reverse=True) and cap[-1] >= 1
    assert dev.clusters_at_once(2) == cap[1] and dev.clusters_at_once(9) is None


def test_forced_split_k_cluster_through_matmul_and_explain():
    import cupy

    import hopmm

    hopmm.use_schedule("split_k_cluster")
    a, b = rand((512, 16384), "bfloat16"), rand((16384, 512), "bfloat16")
    text = hopmm.explain(a, b)
    assert "schedule: split_k_cluster" in text and "at launch" in text, text
    out = hopmm.matmul(a, b)
    assert rel_err(out, a, b) < TOL["bfloat16"]
    again = hopmm.matmul(a, b)          # the fast path (DirectRepeat: no workspace)
    assert bool(cupy.array_equal(out.view(cupy.uint16), again.view(cupy.uint16)))


def test_forced_split_k_through_matmul_and_explain():
    import hopmm

    hopmm.use_schedule("split_k")
    a, b = rand((512, 16384), "bfloat16"), rand((16384, 512), "bfloat16")
    text = hopmm.explain(a, b)
    assert "schedule: split_k" in text and "4 splits" in text, text
    out = hopmm.matmul(a, b)
    assert rel_err(out, a, b) < TOL["bfloat16"]
    again = hopmm.matmul(a, b)          # the fast path
    import cupy

    assert bool(cupy.array_equal(out.view(cupy.uint16), again.view(cupy.uint16)))
    assert semaphores_zero()


# (128 x 4096 x 16384, split before, runs unsplit on the persistent kernel's 64-row tiles,
# level with the split: test_short_tile_cpu.py.)
@pytest.mark.parametrize("m,n,k", [(512, 512, 16384), (256, 256, 65536)])
def test_heuristic_picks_split_k_and_is_right(m, n, k):
    import hopmm

    a, b = rand((m, k), "bfloat16"), rand((k, n), "bfloat16")
    assert "schedule: split_k" in hopmm.explain(a, b)
    assert rel_err(hopmm.matmul(a, b), a, b) < TOL["bfloat16"]


@pytest.mark.parametrize("splits", [2, 7, 16])
def test_split_k_bitwise_deterministic(splits):
    """Many repeats (timing varies: the split that finishes first is not always split 0) give
    the same bits."""
    import cupy

    a, b = rand((256, 4096), "bfloat16"), rand((4096, 384), "bfloat16")
    first, _ = run_split(a, b, splits)
    bits = first.view(cupy.uint16).copy()
    for _ in range(20):
        again, _ = run_split(a, b, splits)
        assert bool(cupy.array_equal(again.view(cupy.uint16), bits))
    assert rel_err(first, a, b) < TOL["bfloat16"]


def test_split_k_two_streams_concurrently():
    """Two streams run split-K kernels at the same time, each on its own workspace and
    semaphores: both are right and bitwise equal to a lone run."""
    import cupy

    import hopmm
    from hopmm import workspace

    hopmm.use_schedule("split_k")
    a, b = rand((512, 8192), "bfloat16"), rand((8192, 256), "bfloat16")
    lone = hopmm.matmul(a, b)
    cupy.cuda.get_current_stream().synchronize()
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    outs = {s1: [], s2: []}
    for _ in range(10):
        for s in (s1, s2):
            with s:
                outs[s].append(hopmm.matmul(a, b))
    s1.synchronize()
    s2.synchronize()
    keys = [k for k in workspace._workspaces if k[1] in (s1.ptr, s2.ptr)]
    assert len(keys) == 2
    w1, w2 = (workspace._workspaces[k] for k in keys)
    assert w1.data_ptr != w2.data_ptr and w1.semaphores_ptr != w2.semaphores_ptr
    for s in (s1, s2):
        for r in outs[s]:
            assert bool(cupy.array_equal(r.view(cupy.uint16), lone.view(cupy.uint16)))
    assert semaphores_zero()


def test_split_k_forced_on_huge_batch_uses_one_split():
    """Forced on a batch larger than one grid: the bound leaves 1 split (the plain kernel)."""
    import hopmm

    hopmm.use_schedule("split_k")
    a, b = rand((70000, 8, 64), "float16"), rand((64, 16), "float16")
    out = hopmm.matmul(a, b)
    np.testing.assert_allclose(out.astype("float32").get(), ref(a, b).get(), rtol=2e-2,
                               atol=2e-2)


@pytest.mark.parametrize("schedule", ["split_k", "split_k_parallel"])
def test_workspace_is_written_before_it_is_read(schedule):
    """The fp32 workspace is never initialised: every partial a kernel reads must have been
    stored by a split of the same launch first. With the whole workspace NaN before each call,
    any element read before it was written would turn up as NaN in C. (compute-sanitizer's
    initcheck cannot show this: it does not count TMA's bulk stores as writes.)"""
    import cupy

    from hopmm import workspace

    for m, n, k, splits in [(256, 256, 1024, 4), (300, 260, 4097, 7), (4, 1000, 4097, 3),
                            (128, 4096, 16384, 4)]:
        a, b = rand((m, k), "bfloat16"), rand((k, n), "bfloat16")
        run_split(a, b, splits, schedule)   # allocates (or grows) the workspace
        for ws in workspace._workspaces.values():
            ws.data.view(cupy.float32).fill(cupy.nan)
        c, _ = run_split(a, b, splits, schedule)
        assert rel_err(c, a, b) < TOL["bfloat16"]

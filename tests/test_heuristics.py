"""CPU: the heuristic is a pure function of the problem and the device description."""
import functools
import math
from dataclasses import replace

import pytest

from hopmm import heuristics
from hopmm.device import H100_SXM, DeviceInfo
from hopmm.problem import Problem


def choose(m, n, k, batch=1, dtype="bfloat16", a_major="k", b_major="n", device=H100_SXM,
           b_pitch_aligned=True, schedule=None, epilogue=False):
    return heuristics.choose(Problem(m, n, k, batch, dtype, a_major, b_major, b_pitch_aligned),
                             device, schedule, epilogue)


# The few-row tests below ask for split_k_parallel's own choice, as a call with a fused
# epilogue gets it: without one, problems of at most GEMV_MAX_M rows go to gemv
# (tests/test_gemv_cpu.py).
GEMV_ASIDE = dict(epilogue=True)


def test_large_problem_takes_wide_tiles_and_fits_smem():
    c = choose(8192, 8192, 8192)
    assert c.config.block_n >= 192
    assert c.schedule.smem_bytes(c.config) <= H100_SXM.smem_per_block_optin
    assert c.config.stages >= heuristics.MIN_STAGES


# 4096 x 100 would fit one round of 64 x 128 tiles (test_short_tile_cpu.py): four times the rows.
@pytest.mark.parametrize("m,n,width", [(512, 512, 128), (128, 4096, 128),
                                       (16384, 100, heuristics.NARROW_BLOCK_N)])
def test_few_tiles_take_narrow_tiles(m, n, width):
    assert choose(m, n, 1024).config.block_n == width


@pytest.mark.parametrize("m,n,k,width", [
    (3000, 3000, 3000, 192),    # 288 tiles of 256 (2.2 waves) vs 384 of 192 (2.9 waves)
    (8192, 8192, 8192, 256),    # 15.5 waves of 256 take 16 tile-times, 20.8 of 192 16.4
    (4096, 14336, 4096, 256),   # 13.6 waves of 256 (14 tile-times), 18.2 of 192 (14.8)
    (6144, 6144, 6144, 256),    # 9 tile-times of 256; 12 of 192 take 9.4
    (8192, 8192, 1024, 192),    # 16 of 256 with 16 k-blocks a tile and its epilogue exposed
    (4096, 4096, 4096, 256),    # 3.9 waves of 256; 5.3 of 192
])
def test_tile_width_follows_wave_quantization(m, n, k, width):
    c = choose(m, n, k)
    assert c.config.block_n == width and "waves" in c.reason


def test_layout_sets_transpose_bits():
    c = choose(1024, 1024, 1024, a_major="m", b_major="k")
    assert c.config.trans_a and not c.config.trans_b
    c = choose(1024, 1024, 1024, a_major="k", b_major="n")
    assert not c.config.trans_a and c.config.trans_b


def test_less_shared_memory_means_shallower_or_narrower():
    small = DeviceInfo("small", (9, 0), 132, 160 * 1024)
    c = choose(4096, 4096, 4096, device=small)   # 128 x 256 ranks first, but only 2 stages fit
    assert c.config.block_n < 256 and "128x256 tile leaves only 2 stages" in c.reason
    assert c.config.stages >= 3
    assert c.schedule.smem_bytes(c.config) <= small.smem_per_block_optin
    smaller = DeviceInfo("smaller", (9, 0), 132, 100 * 1024)
    c = choose(4096, 4096, 4096, device=smaller)  # 128 x 256 does not fit at all
    assert c.config.block_n < 256 and "128x256 tile leaves fewer than 2" in c.reason
    assert c.schedule.smem_bytes(c.config) <= smaller.smem_per_block_optin
    medium = DeviceInfo("medium", (9, 0), 132, 180 * 1024)
    # 128 x 192 there: a ring of two staging boxes leaves 3 stages, a ring of one 4 (DEEP_STAGES)
    mid, full = choose(8192, 8192, 1024, device=medium).config, choose(8192, 8192, 1024).config
    assert (mid.block_n, mid.stages, mid.c_buffers) == (192, 4, 1)
    assert (full.block_n, full.stages, full.c_buffers) == (192, 4, 3)


def test_too_little_shared_memory_is_an_error():
    tiny = DeviceInfo("tiny", (9, 0), 132, 48 * 1024)
    with pytest.raises(RuntimeError, match="too little"):
        choose(8192, 8192, 8192, device=tiny)


@pytest.mark.parametrize("field,value", [("m", 0), ("dtype", "float32"), ("a_major", "n"),
                                         ("b_major", "m")])
def test_problem_validates(field, value):
    kwargs = dict(m=8, n=8, k=8, batch=1, dtype="float16")
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        Problem(**kwargs)


def test_raster_groups_m_tiles():
    assert choose(4096, 14336, 4096).raster_group == heuristics.RASTER_GROUP_M  # persistent
    assert choose(100, 28672, 8192).raster_group == 1


@pytest.mark.parametrize("m,n,k", [(2432, 704, 9472), (4480, 256, 2112), (2880, 512, 30400),
                                   (1920, 256, 20864)])
def test_one_round_grids_take_groups_of_four(m, n, k):
    """Every CTA resident at once (tiles x splits <= SMs): groups of 4 M-tiles (v0.23:
    2432 x 704 x 9472 512 against 433 TFLOP/s with 16); a batch that takes the grid past one
    round, or a problem of many waves, takes its group by the wave's footprint."""
    c = choose(m, n, k)
    kernel_m, kernel_n = (n, m) if c.config.trans_c else (m, n)   # the transpose's tiles
    tiles_m = -(-kernel_m // c.config.block_m)
    assert tiles_m * -(-kernel_n // c.config.block_n) * c.splits <= H100_SXM.sm_count
    # (64-row tiles group by the operand of the larger k-block slice: _short_one_round_group)
    one_round = (heuristics.ONE_ROUND_RASTER_GROUP if c.config.block_m == heuristics.BLOCK_M
                 else tiles_m if kernel_n > kernel_m else 1)
    assert c.raster_group == one_round
    assert choose(4096, 14336, 4096).raster_group == heuristics.RASTER_GROUP_M


def test_wave_footprint_counts_the_rows_and_columns_a_wave_covers():
    # Inside one group: 16 rows of tiles, ceil(132 / 16) = 9 columns.
    assert heuristics._wave_footprint(16, 64, 32, 132, (128, 256)) == 16 * 128 + 9 * 256
    # Whole groups of 4 x 32 tiles: every column, and the rows of ceil(132 / 32) = 5 tiles.
    assert heuristics._wave_footprint(4, 64, 32, 132, (128, 256)) == 5 * 128 + 32 * 256
    # Few N-tiles: any group of at most 66 rows covers the same 66 rows and both columns.
    assert (heuristics._wave_footprint(4, 184, 2, 132, (128, 128))
            == heuristics._wave_footprint(32, 184, 2, 132, (128, 128)) == 66 * 128 + 2 * 128)
    # A group is never taller than the problem.
    assert heuristics._wave_footprint(16, 3, 100, 132, (128, 128)) == 3 * 128 + 44 * 128


@pytest.mark.parametrize("m,n,k", [(23488, 256, 24064), (5760, 1728, 16576), (4288, 832, 3200)])
def test_waves_of_whole_groups_take_the_smallest_group(m, n, k):
    """Several waves over few N-tiles: every group covers the same rows and columns in a wave,
    and the smallest ran fastest (v0.26: persistent 128 x 128 at 23488 x 256 x 24064 542
    against 465 TFLOP/s with 16, at 5760 x 1728 x 16576 643 against 532)."""
    c = choose(m, n, k)
    assert c.schedule.cluster_size == 1
    tiles = -(-m // c.config.block_m) * -(-n // c.config.block_n)
    assert tiles > H100_SXM.sm_count
    assert c.raster_group == min(heuristics.RASTER_GROUPS)


def test_a_batch_past_one_round_takes_its_group_by_the_footprint():
    batched = choose(2432, 704, 9472, batch=16)   # 3 N-tiles of 256 a slice
    assert batched.raster_group == min(heuristics.RASTER_GROUPS)


def test_many_n_tiles_keep_groups_of_sixteen_and_clusters_keep_theirs():
    """Many N-tiles: a wave inside one group, whose footprint is smallest at 16 rows of 128 x
    256 tiles (v0.14); the cluster kernels keep RASTER_GROUP_M (v0.26)."""
    for m, n, k in [(8192, 8192, 8192), (4096, 14336, 4096), (2048, 8192, 8192)]:
        assert choose(m, n, k).raster_group == heuristics.RASTER_GROUP_M
    cfg = choose(23488, 256, 24064).config
    problem = Problem(23488, 256, 24064, 1, "bfloat16")
    assert heuristics._raster_group(problem, cfg, H100_SXM, clustered=True) == \
        heuristics.RASTER_GROUP_M


@pytest.mark.parametrize("schedule", [None, "persistent_overlap"])
def test_overlap_schedule_takes_the_common_raster_group(schedule):
    c = choose(8192, 8192, 1024, schedule=schedule)
    assert c.schedule.name == "persistent_overlap"
    assert c.raster_group == heuristics.RASTER_GROUP_M
    assert f"groups of {heuristics.RASTER_GROUP_M} M-tiles" in c.reason
    assert choose(256, 8192, 1024, schedule=schedule).raster_group == 2  # only 2 M tiles


# Sustained runs on an H100 (bench/NOTES.md v0.14, each kernel alone 0.6-1 s, x best cuBLAS):
# 128 x 256 on persistent against 128 x 192 on persistent_overlap (its better group).
@pytest.mark.parametrize("m,n,k,dtype,measured", [
    (6144, 6144, 6144, "bfloat16", (0.996, 0.972)),
    (6144, 6144, 6144, "float16", (0.990, 0.977)),
    (8192, 8192, 8192, "bfloat16", (1.001, 0.988)),
    (8192, 8192, 8192, "float16", (1.006, 0.989)),
    (4096, 28672, 8192, "bfloat16", (0.985, 0.963)),
    (8192, 28672, 4096, "bfloat16", (0.997, 0.981)),
    (8192, 8192, 1024, "bfloat16", (0.966, 0.985)),
    (8192, 8192, 2048, "float16", (1.009, 1.025)),
])
def test_tile_and_overlap_follow_sustained_runs(m, n, k, dtype, measured):
    c = choose(m, n, k, dtype=dtype)
    persistent_256, overlap_192 = measured
    if persistent_256 > overlap_192:   # on the cluster kernel from v0.15 (see below)
        assert c.config.block_n == 256 and c.schedule.name in ("persistent", "persistent_cluster")
    else:
        assert (c.schedule.name, c.config.block_n) == ("persistent_overlap", 192)


def test_schedule_by_name():
    from hopmm.schedules import PersistentSchedule

    c = heuristics.choose(Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n"), H100_SXM,
                          "persistent")
    assert c.schedule is PersistentSchedule
    assert c.schedule.grid(Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n"), c.config, 1,
                           H100_SXM.sm_count) == (H100_SXM.sm_count, 1, 1)


def test_default_schedule_is_persistent_with_overlapped_epilogues_on_192_wide_tiles():
    c = choose(8192, 8192, 1024)   # 192 wide (see the wave test above)
    assert c.schedule.name == "persistent_overlap" and c.config.block_n == 192
    assert "two accumulator sets" in c.reason
    c = choose(4096, 4096, 4096)   # 256 wide: no registers for a second set
    assert c.schedule.name == "persistent" and c.config.block_n == 256
    c = choose(512, 512, 1024)     # 128 wide: measured no faster with two sets
    assert c.schedule.name == "persistent" and c.config.block_n == 128
    # a forced schedule is taken as it is
    assert choose(8192, 8192, 8192, schedule="persistent").schedule.name == "persistent"


# ---- split-K ----------------------------------------------------------------------------

from hopmm.schedules import SplitKSchedule  # noqa: E402

# Few tiles and a long K; 256 x 256 x 65536 and 64 x 2048 x 32768 take split_k_parallel's
# 64-row tiles (below).
TARGETS = [(512, 512, 16384), (128, 4096, 16384)]


@pytest.fixture
def split_models_only(monkeypatch):
    """The split-K models' own choice: no split is weighed against the persistent kernels'
    64-row tiles, which take some of these problems unsplit (test_short_tile_cpu.py)."""
    monkeypatch.setattr(heuristics, "_short_tiles_beat_split", lambda *args: False)
    heuristics.choose.cache_clear()
    yield
    heuristics.choose.cache_clear()


@pytest.mark.usefixtures("split_models_only")
@pytest.mark.parametrize("m,n,k", TARGETS)
def test_few_tiles_and_long_k_take_split_k(m, n, k):
    c = choose(m, n, k)
    assert c.schedule.split_k and c.splits >= 2
    tiles = -(-m // c.config.block_m) * -(-n // c.config.block_n)
    assert tiles * c.splits <= H100_SXM.sm_count
    assert c.splits <= heuristics.SPLIT_K_MAX_SPLITS
    assert f"in {c.splits} splits" in c.reason


def test_split_counts_of_the_target_shapes():
    # split_k's model minima, which are the fastest counts measured on split_k on an H100.
    assert [choose(m, n, k, schedule="split_k").splits for m, n, k in TARGETS] == [4, 2]


@pytest.mark.parametrize("m,n,k,splits", [
    (1000, 1023, 4097, 2), (1024, 1024, 4096, 2), (768, 1024, 4096, 2),   # 64-65 k-blocks
    (640, 1024, 3072, 2),                     # 48 k-blocks
    (512, 1024, 8192, 3),                     # 3 ran 7 % faster than 4, 10 % than 2
    (1024, 1024, 16384, 2),                   # +65 % on 2 splits
    (1024, 1024, 2048, 1), (1024, 512, 2048, 1), (512, 512, 2048, 1),      # 2 x 16 lost
    (1024, 1024, 1024, 1)])                   # 2 splits of 8 k-blocks lost (254 -> 172)
def test_split_counts_measured_on_an_h100(m, n, k, splits):
    """bench/NOTES.md v0.11: split_k's fastest of 1-4 splits, or 1 where splitting lost."""
    p = Problem(m, n, k, 1, "bfloat16")
    cfg = heuristics.split_configs(SplitKSchedule, p, H100_SXM)[0]
    assert heuristics.split_count(p, cfg, H100_SXM) == splits


def test_split_k_model_terms():
    est = functools.partial(heuristics.split_k_estimate_us, sm_count=H100_SXM.sm_count,
                            dram_scale=1.0)
    operands = (256 + 256) * 65536 * 2
    assert est(4, 1024, 9, 32768, operands) < est(4, 1024, 16, 32768, operands) < \
        est(4, 1024, 1, 32768, operands)
    # A and B read from memory bound 128 x 4096 x 16384 (138 MB) whatever the split: 2 splits
    # gain, 4 only add hand-offs.
    big = (128 + 4096) * 16384 * 2
    assert est(32, 256, 2, 32768, big) < est(32, 256, 4, 32768, big)


@pytest.mark.parametrize("m,n,k,batch", [(4096, 4096, 4096, 1), (512, 512, 256, 1),
                                         (1024, 1024, 16384, 8), (300, 260, 200, 1),
                                         (1024, 1024, 2048, 1), (1024, 1024, 1024, 1)])
def test_split_k_only_when_it_pays(m, n, k, batch):
    # Many tiles (or batches), or too few k-blocks per split: no split-K.
    assert choose(m, n, k, batch).schedule is not SplitKSchedule


@pytest.mark.parametrize("m,n,k,batch", [(300, 260, 200, 1), (8192, 8192, 64, 1),
                                         (17, 23, 5, 100000), (64, 64, 40, 1),
                                         (128, 128, 4097, 7), (4096, 4096, 4096, 1)])
def test_forced_split_k_keeps_the_bound(m, n, k, batch):
    p = Problem(m, n, k, batch, "bfloat16")
    c = heuristics.choose(p, H100_SXM, "split_k")
    assert c.schedule is SplitKSchedule and c.splits >= 1
    count = min(batch, 65535)
    tiles = -(-m // 128) * -(-n // 128)
    assert c.splits == 1 or tiles * c.splits * count <= H100_SXM.sm_count
    assert c.splits <= -(-k // 64)
    grid = SplitKSchedule.grid(p, c.config, count, H100_SXM.sm_count, c.splits)
    assert grid == (tiles, c.splits, count)


def test_grid_rejects_splits_beyond_the_bound():
    p = Problem(256, 256, 1024, 1, "bfloat16")
    cfg = heuristics.choose(p, H100_SXM, "split_k").config
    assert SplitKSchedule.max_splits(p, cfg, 1, 132) == 16   # 16 k-blocks, 4 tiles
    with pytest.raises(ValueError, match="co-residency"):
        SplitKSchedule.grid(p, cfg, 1, 132, 17)
    p2 = Problem(256, 256, 65536, 1, "bfloat16")
    assert SplitKSchedule.max_splits(p2, cfg, 1, 132) == 33


# ---- split-K in clusters -------------------------------------------------------------------

from hopmm.device import H100_SXM_CLUSTERS as H100_CLUSTERS  # noqa: E402
from hopmm.schedules import MAX_CLUSTER_SPLITS, SplitKClusterSchedule  # noqa: E402


def test_unknown_cluster_capacity_keeps_off_the_cluster_kernel():
    # H100_SXM reports none: the model cannot tell the cluster kernel's waves.
    assert H100_SXM.clusters_at_once(2) is None
    assert all(choose(m, n, k).schedule is not SplitKClusterSchedule for m, n, k in TARGETS)


@pytest.mark.parametrize("m,n,k,splits", [
    (1024, 1024, 4096, 2), (128, 4096, 16384, 3),
    # v0.17: down to splits of 8 k-blocks (CLUSTER_SPLIT_MIN_K_BLOCKS)
    (1024, 512, 2048, 3), (512, 512, 2048, 4), (1024, 1024, 2048, 2), (300, 1000, 3000, 4),
    (640, 1024, 3072, 2), (200, 2000, 2000, 3), (2048, 512, 2048, 2)])
@pytest.mark.usefixtures("split_models_only")
def test_known_capacity_takes_the_fastest_measured(m, n, k, splits):
    """bench/NOTES.md v0.13 and v0.17: the fastest count measured on split_k_cluster, which
    ran ahead of split_k_parallel and the unsplit kernel on these; on 128 x 4096 x 16384 the
    model puts 2 and 3 splits level and takes 3 (v0.31: 128 x 4096 x 13888 ran 322 TFLOP/s on
    3 against 295 on 2; v0.13 had measured the schedules level on 2)."""
    c = choose(m, n, k, device=H100_CLUSTERS)
    assert (c.schedule, c.splits) == (SplitKClusterSchedule, splits)


# Where split_k_parallel's 64-row tiles in fewer splits ran ahead of the 128-row tiles or
# split_k's chain, x the previous pick on an H200 (NOTES v0.67; v0.29's 128-row picks of
# 512 x 512 x 16384 and 512 x 1024 x 8192, measured on an H100 with its kernels then, now take
# 64 x 128 tiles too; the H100 was not run).
@pytest.mark.parametrize("m,n,k,dtype,tile,splits", [
    (448, 256, 16064, "float16", (64, 128), 9),      # 1.24 x 128 x 128 in 16 splits
    (320, 768, 7168, "bfloat16", (64, 128), 4),      # 1.21 x 128 x 128 in 7
    (192, 1664, 22400, "bfloat16", (64, 128), 3),    # 1.12 x 128 x 128 in 5
    (768, 960, 14976, "bfloat16", (64, 192), 2),     # 1.19 x split_k's 128 x 128 in 2
    (1408, 576, 22208, "float16", (64, 192), 2),     # 1.28 x split_k's 128 x 128 in 2
])
def test_parallel_64_row_tiles_where_they_ran_fastest(m, n, k, dtype, tile, splits):
    c = choose(m, n, k, dtype=dtype, device=replace(H100_CLUSTERS, dram_tbps=4.81))
    assert c.schedule is SplitKParallelSchedule
    assert ((c.config.block_m, c.config.block_n), c.splits) == (tile, splits)


@pytest.mark.parametrize("m,n,k,schedule", [
    (1536, 512, 21824, SplitKSchedule),
    (512, 1728, 5568, SplitKClusterSchedule), (1216, 512, 3008, SplitKClusterSchedule),
    (192, 3776, 4096, SplitKClusterSchedule)])
@pytest.mark.usefixtures("split_models_only")
def test_two_splits_of_long_k_take_the_serial_reduction(m, n, k, schedule):
    """v0.29, two splits (TFLOP/s, split_k_cluster against split_k): 1536 x 512 x 21824 483 /
    512 (171 k-blocks a split); 512 x 1728 x 5568 442 / 404, 1216 x 512 x 3008 293 / 239,
    192 x 3776 x 4096 323 / 273 (23-43 k-blocks a split). (v0.29's 960 x 768 x 31872 and
    448 x 1664 x 17792 now split on split_k_parallel's 64 x 192 tiles: NOTES v0.67.)"""
    c = choose(m, n, k, device=H100_CLUSTERS)
    assert (c.schedule, c.splits) == (schedule, 2)


def test_a_split_of_too_few_k_blocks_is_not_taken():
    # 1024 x 1024 x 1024: 2 splits of 8 k-blocks lost on both split-K schedules
    assert choose(1024, 1024, 1024, device=H100_CLUSTERS).splits == 1
    assert choose(512, 512, 1024, device=H100_CLUSTERS).splits == 1


@pytest.mark.usefixtures("split_models_only")
@pytest.mark.parametrize("m,n,k", [(128, 4096, 16384), (1024, 1024, 4096)])
def test_known_capacity_takes_split_k_in_clusters(m, n, k):
    c = choose(m, n, k, device=H100_CLUSTERS)
    assert c.schedule is SplitKClusterSchedule and 2 <= c.splits <= MAX_CLUSTER_SPLITS
    tiles = -(-m // 128) * -(-n // 128)
    # the count the model picks fits in one wave of the clusters the device holds at once
    assert tiles <= H100_CLUSTERS.clusters_at_once(c.splits)
    assert f"in {c.splits} splits" in c.reason and "distributed shared memory" in c.reason
    assert f"clusters of {c.splits} CTAs" in c.reason


def test_cluster_model_counts_waves_and_no_hand_offs():
    est = functools.partial(heuristics.split_k_estimate_us, sm_count=H100_SXM.sm_count,
                            dram_scale=1.0)
    operands = (512 + 512) * 16384 * 2
    # 16 tiles, 256 k-blocks: 8 splits in one wave of 18 clusters, against 2 waves of 15
    one_wave = est(16, 256, 8, 32768, operands, clusters=18)
    two_waves = est(16, 256, 8, 32768, operands, clusters=15)
    assert two_waves > one_wave
    # 128 CTAs in clusters of 8: main loop 32 x 0.52 = 16.8 us, L2 8.4, DRAM 11.2: the main
    # loop, and one reduction
    kblock = heuristics.split_k_kblock_us(128, 132, 8)
    assert kblock == pytest.approx(heuristics.SPLIT_K_KBLOCK_US
                                   * (1 + heuristics.CLUSTER_KBLOCK_LOAD * 128 / 132))
    assert one_wave == pytest.approx(32 * kblock * heuristics.CLUSTER_KBLOCK_PREMIUM
                                     + heuristics.SPLIT_K_CLUSTER_REDUCE_US)
    # the serial chain pays a hand-off per split instead, at the unclustered k-block time
    serial = heuristics.split_k_kblock_us(128, 132)
    assert serial < kblock
    bound = max(32 * serial, 16 * 256 * 32768 / 16e6, operands / 3e6)
    assert est(16, 256, 8, 32768, operands) == pytest.approx(
        bound + 7 * heuristics.SPLIT_K_HANDOFF_US)


def test_k_blocks_slow_down_as_more_sms_run():
    """bench/NOTES.md v0.26: split_k 0.31 us a k-block with 32 CTAs, 0.37-0.40 with 96-108;
    split_k_cluster in clusters of 3 or more 0.32-0.36 with 24-32 CTAs, more with more
    (0.54-0.63 with 64-95); in clusters of 2 as split_k."""
    kb = heuristics.split_k_kblock_us
    assert kb(32, 132) == pytest.approx(0.31, abs=0.01)
    assert 0.37 <= kb(108, 132) <= 0.40
    assert kb(32, 132, 4) == pytest.approx(0.34, abs=0.01)
    assert kb(108, 132, 3) == pytest.approx(0.49, abs=0.01)
    assert kb(108, 132, 2) == kb(108, 132)
    assert kb(500, 132) == kb(132, 132)   # at most every SM runs


@pytest.mark.parametrize("m,n,k,batch", [(300, 260, 200, 1), (8192, 8192, 64, 1),
                                         (17, 23, 5, 100000), (128, 128, 4097, 7),
                                         (4096, 4096, 4096, 1)])
def test_forced_split_k_cluster_needs_no_co_residency(m, n, k, batch):
    """Forced, without a known capacity: any grid (clusters wait for SMs in waves), at most a
    portable cluster of splits, every split with a k-block."""
    p = Problem(m, n, k, batch, "bfloat16")
    c = heuristics.choose(p, H100_SXM, "split_k_cluster")
    assert c.schedule is SplitKClusterSchedule
    k_blocks = -(-k // 64)
    assert 1 <= c.splits <= min(MAX_CLUSTER_SPLITS, k_blocks)
    assert (c.splits >= 2) == (k_blocks >= 2)
    count = min(batch, 65535)
    tiles = -(-m // 128) * -(-n // 128)
    assert SplitKClusterSchedule.grid(p, c.config, count, 132, c.splits) == (tiles, c.splits,
                                                                              count)
    assert SplitKClusterSchedule.launch_cluster(c.splits) == (1, c.splits, 1)


def test_cluster_grid_rejects_more_splits_than_a_cluster_holds():
    p = Problem(256, 256, 65536, 1, "bfloat16")
    cfg = heuristics.choose(p, H100_SXM, "split_k_cluster").config
    assert SplitKClusterSchedule.max_splits(p, cfg, 1, 132) == MAX_CLUSTER_SPLITS
    with pytest.raises(ValueError, match="at most 8 CTAs"):
        SplitKClusterSchedule.grid(p, cfg, 1, 132, 9)
    short = Problem(256, 256, 100, 1, "bfloat16")   # 2 k-blocks
    assert SplitKClusterSchedule.max_splits(short, cfg, 1, 132) == 2
    # the serial schedule keeps its launch without a cluster shape
    assert SplitKSchedule.launch_cluster(4) == (1, 1, 1)
    assert SplitKClusterSchedule.c_box_rows == 8 and not SplitKClusterSchedule.workspace


def test_split_k_workspace_and_smem_plan():
    p = Problem(1000, 1023, 4097, 3, "bfloat16")
    cfg = heuristics.choose(p, H100_SXM, "split_k").config
    assert SplitKSchedule.workspace_shape(p, cfg, 3, 2) == (3, 1024, 1024)
    assert SplitKSchedule.workspace_shape(p, cfg, 3, 1) == (1, 128, 128)
    assert SplitKSchedule.semaphore_count(p, cfg, 3) == 3 * 64 * 2
    # fp32 partial (64 KB) in place of the 16-bit tile (32 KB): 5 stages of 32 KB fit.
    assert SplitKSchedule.epilogue_bytes(cfg) == 128 * 128 * 4
    assert cfg.stages == 5
    assert SplitKSchedule.smem_bytes(cfg) <= H100_SXM.smem_per_block_optin


def test_unaligned_b_rows_take_clusters_that_share_b():
    """N-major B whose rows are not 128-byte multiples: the cluster kernel, its tile by waves
    of clusters under UNALIGNED_B_TILE_SPEED: 3000³ is 8 x 16 pairs of 192 x 192 tiles = 1.9
    waves of 66 clusters (2 tile-times of 192 x 192 / 1.04), against 12 x 16 pairs of 128 x 192
    = 2.9 waves (3 of 128 x 192) and 12 x 12 pairs of 128 x 256 = 2.2 waves (3 of 128 x 256
    / 1.05)."""
    from hopmm.schedules import (PersistentClusterSchedule, PersistentOverlapSchedule,
                                 PersistentSchedule)

    c = choose(3000, 3000, 3000, b_pitch_aligned=False)
    assert c.schedule is PersistentClusterSchedule
    assert (c.config.block_m, c.config.block_n, c.config.consumers) == (192, 192, 3)
    assert "128 B" in c.reason and "256 tiles of 192x192 = 1.94 waves of 66 clusters of 2" in c.reason
    # 3000 x 5000: 192 x 192 fills 3.3 waves (4 tile-times), 128 x 192 4.9 (5): the shorter tile
    def tile(m, n, k):
        cfg = choose(m, n, k, b_pitch_aligned=False).config
        return cfg.block_m, cfg.block_n

    assert tile(3000, 5000, 3000) == (128, 192)
    # 4096 x 4000: 16 x 16 pairs of 128 x 256 = 3.9 waves (4 tile-times) against 16 x 21 of
    # 128 x 192 = 5.1 (6) and 11 x 21 of 192 x 192 = 3.5 (4, each slower)
    assert tile(4096, 4000, 4096) == (128, 256)
    assert tile(8000, 3000, 3000) == (128, 256)
    assert tile(6000, 3000, 3000) == tile(5000, 5000, 5000) == (192, 192)
    # the cluster schedule forced on such rows ranks its tiles the same way; on aligned rows
    # 192 x 192 has no such edge (TILE_SPEED): at 3000³ its 2 tile-times cover the area of
    # 3 of 128 x 192, which is rated a hair faster
    forced = choose(3000, 3000, 3000, b_pitch_aligned=False, schedule="persistent_cluster")
    assert (forced.config.block_m, forced.config.block_n) == (192, 192)
    aligned = choose(3000, 3000, 3000, schedule="persistent_cluster")
    assert (aligned.config.block_m, aligned.config.block_n) == (128, 192)
    assert c.config.stages >= heuristics.FAST_STAGES
    # aligned rows, K-major B (its box rows run along K, like A's: measured cheap) and a forced
    # schedule all keep the usual choice
    assert choose(3000, 3000, 3000).schedule is PersistentOverlapSchedule
    assert choose(3000, 3000, 3000, b_major="k", b_pitch_aligned=False).schedule is \
        PersistentOverlapSchedule
    assert choose(3000, 3000, 3000, b_pitch_aligned=False,
                  schedule="persistent").schedule is PersistentSchedule
    # few tiles and a long k: split-K still comes first
    assert choose(256, 264, 16384, b_pitch_aligned=False).schedule.split_k


def test_b_pitch_alignment_is_part_of_the_problem():
    from hopmm import tuning

    aligned = Problem(3000, 3000, 3000, 1, "bfloat16")
    unaligned = Problem(3000, 3000, 3000, 1, "bfloat16", b_pitch_aligned=False)
    assert aligned.b_pitch_aligned and aligned != unaligned
    assert tuning.problem_key(aligned, H100_SXM) != tuning.problem_key(unaligned, H100_SXM)
    with pytest.raises(ValueError, match="b_pitch_aligned"):
        Problem(3000, 3000, 3000, 1, "bfloat16", b_pitch_aligned=1)


# The nine aligned shapes measured on the tall cluster tile (bench/NOTES.md v0.11) and the
# shapes of the targets, which keep the persistent kernels.
TALL_ALIGNED = [(2304, 2048, 8192), (2304, 2048, 2048), (3072, 1536, 4096), (1536, 3072, 4096),
                (6144, 2304, 4096), (4608, 3072, 4096), (2560, 5120, 4096), (5632, 4096, 4096),
                (3072, 4608, 2048)]
PERSISTENT_TARGETS = [(8192, 8192, 8192), (6144, 6144, 6144), (4096, 4096, 4096),
                      (4096, 28672, 8192), (4096, 8192, 28672), (4096, 14336, 4096),
                      (8192, 8192, 1024), (2048, 2048, 2048), (512, 512, 512)]


@pytest.mark.parametrize("m,n,k", TALL_ALIGNED)
@pytest.mark.parametrize("a_major,b_major", [("k", "n"), ("m", "k")])
def test_aligned_rows_take_the_tall_cluster_tile_where_its_waves_are_fuller(m, n, k, a_major,
                                                                            b_major):
    from hopmm.schedules import PersistentClusterSchedule

    c = choose(m, n, k, a_major=a_major, b_major=b_major)
    assert c.schedule is PersistentClusterSchedule
    assert (c.config.block_m, c.config.block_n, c.config.consumers) == (192, 192, 3)
    assert c.config.stages >= heuristics.FAST_STAGES and "fewer tile-times" in c.reason


# Short K on an H100 (bench/NOTES.md v0.17, bf16, us): persistent 128 x 256 against
# persistent_overlap 128 x 192 at 4096 x 4096 x 512 33.9 / 36.2, 8192 x 2048 x 640 39.3 / 43.1,
# 2048 x 8192 x 128 15.6 / 16.7; 8192 x 8192 x 256 75.0 on persistent 128 x 192, 82.1 overlapped.
@pytest.mark.parametrize("m,n,k", [(4096, 4096, 512), (8192, 2048, 640), (2048, 8192, 128),
                                   (8192, 8192, 256)])
def test_short_k_tiles_do_not_take_the_overlap_kernel(m, n, k):
    assert -(-k // 64) < heuristics.OVERLAP_MIN_K_BLOCKS
    c = choose(m, n, k)
    assert c.schedule.name == "persistent"
    assert "two accumulator sets" not in c.reason


# 64-row tiles 192 wide stay on the single-set persistent kernel (OVERLAP_BLOCK_MS): one
# consumer warpgroup holding two 64 x 192 sets ran 0.99 x the single-set kernel on the same
# tile (bench/NOTES.md v0.36, 30 problems of the tuning seeds).
@pytest.mark.parametrize("m,n,k", [(320, 4352, 7616), (576, 2112, 1984), (448, 20992, 19008)])
def test_64_row_tiles_stay_off_the_overlap_kernel(m, n, k):
    assert -(-k // 64) >= heuristics.OVERLAP_MIN_K_BLOCKS
    c = choose(m, n, k)
    assert (c.schedule.name, c.config.block_m, c.config.block_n) == ("persistent", 64, 192)
    assert "two accumulator sets" not in c.reason
    assert c.config.block_m not in heuristics.OVERLAP_BLOCK_MS


def test_tall_cluster_tile_reason_counts_its_waves():
    # 12 x 11 tiles of 192 x 192 = 66 pairs: one wave of 66 clusters, against the persistent
    # kernels' best, 36 x 11 tiles of 64 x 192 in three waves of 132 SMs, rated as the overlap
    # kernel would run them (heuristics.OVERLAP_BLOCK_MS):
    # 3 x 12288 / (0.93 x 0.95) against 36864 / 1.0 x (128 + 1) / 128 (its epilogue exposed)
    c = choose(2304, 2048, 8192)
    assert "132 tiles of 192x192 in pairs = 1.00 waves of 66 clusters of 2" in c.reason
    assert "1.12x fewer tile-times than 64x192" in c.reason


@pytest.mark.parametrize("m,n,k", PERSISTENT_TARGETS)
def test_target_shapes_keep_128_row_tiles(m, n, k):
    assert choose(m, n, k).config.block_m == 128


def test_tall_cluster_tile_needs_the_margin(monkeypatch):
    """5632 x 4096: 330 pairs of 192 x 192 take 5 waves of 66 clusters, 704 tiles of 128 x 256
    6 of 132 SMs (the persistent kernels' best tile): 6.7 % fewer tile-times on the tall tile,
    taken at a 3 % margin, not at 8 %; a forced schedule is never replaced."""
    assert choose(5632, 4096, 4096).config.block_m == 192
    monkeypatch.setattr(heuristics, "TALL_CLUSTER_MIN_GAIN", 1.08)
    heuristics.choose.cache_clear()
    c = choose(5632, 4096, 4096)   # 5.3 waves of 128 x 256, paired (CLUSTER_MIN_WAVES)
    assert (c.config.block_m, c.config.block_n) == (128, 256)
    heuristics.choose.cache_clear()
    monkeypatch.undo()
    assert choose(2304, 2048, 8192, schedule="persistent").schedule.name == "persistent"
    heuristics.choose.cache_clear()


# ---- 128 x 256 tiles in clusters of two on long runs (CLUSTER_MIN_WAVES) -------------------

# Measured ahead alone on the cluster kernel (bench/NOTES.md v0.15), and measured behind: at
# most 3.9 waves of tiles.
PAIRED_MEASURED = [(8192, 8192, 8192), (6144, 6144, 6144), (4096, 28672, 8192),
                   (8192, 28672, 4096), (4096, 8192, 28672), (4096, 14336, 4096),
                   (8192, 4096, 4096)]
UNPAIRED_MEASURED = [(4096, 4096, 4096), (4096, 4096, 8192), (2048, 8192, 8192),
                     (2048, 2048, 8192)]


@pytest.mark.parametrize("m,n,k", PAIRED_MEASURED)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_long_runs_of_256_wide_tiles_run_in_clusters(m, n, k, dtype):
    from hopmm.schedules import PersistentClusterSchedule

    c = choose(m, n, k, dtype=dtype)
    assert c.schedule is PersistentClusterSchedule
    assert (c.config.block_m, c.config.block_n, c.config.stages) == (128, 256, 4)
    assert "clusters of 2 CTAs share each B tile" in c.reason
    assert c.raster_group == heuristics.RASTER_GROUP_M


@pytest.mark.parametrize("m,n,k", UNPAIRED_MEASURED)
def test_few_waves_of_256_wide_tiles_stay_unclustered(m, n, k):
    c = choose(m, n, k)
    assert (c.schedule.name, c.config.block_n) == ("persistent", 256)


def test_pairing_needs_long_tiles_and_many_waves(monkeypatch):
    """16384 x 16384 x 2048: 62 waves of 128 x 256 but 32 k-blocks a tile; 8192 x 8192 x 3072:
    15.5 waves of 48. Both pair once the bounds are lowered; forced schedules stay."""
    assert choose(16384, 16384, 2048).schedule.name == "persistent"
    assert choose(8192, 8192, 3072).schedule.name == "persistent"
    monkeypatch.setattr(heuristics, "CLUSTER_MIN_K_BLOCKS", 32)
    heuristics.choose.cache_clear()
    assert choose(16384, 16384, 2048).schedule.name == "persistent_cluster"
    monkeypatch.setattr(heuristics, "CLUSTER_MIN_WAVES", 20.0)
    heuristics.choose.cache_clear()
    assert choose(8192, 8192, 8192).schedule.name == "persistent"   # 15.5 waves
    heuristics.choose.cache_clear()
    monkeypatch.undo()
    assert choose(8192, 8192, 8192, schedule="persistent").schedule.name == "persistent"
    heuristics.choose.cache_clear()


def test_pairing_keeps_the_tile_times():
    """An odd count of M tiles leaves a cluster's spare CTA computing an unstored tile: pairs
    are taken only where that adds no wave. 8320 rows: 65 x 32 tiles of 128 x 256 = 15.8 waves
    of 132 SMs, 33 x 32 pairs = 16 waves of 66 clusters: 16 tile-times either way. 640 rows:
    5 x 132 tiles = 5 waves, 3 x 132 pairs = 6; 1152 rows: 9 x 132 = 9 waves, 5 x 132 pairs 10."""
    assert choose(8320, 8192, 8192).schedule.name == "persistent_cluster"
    assert choose(640, 33792, 8192).schedule.name == "persistent"
    assert choose(1152, 33792, 4096).schedule.name == "persistent"


# ---- split-K reduced in parallel ------------------------------------------------------------

from hopmm.schedules import (PersistentSchedule, SplitKParallelSchedule,  # noqa: E402
                             TRIMMED_A_ROWS)


@pytest.mark.parametrize("device", [H100_SXM, H100_CLUSTERS], ids=["no-capacity", "capacity"])
def test_more_splits_than_a_cluster_holds_run_in_parallel(device):
    """256 x 256 x 65536 (4 tiles of 128 rows): v0.17 measured 34.6-36.8 us on 12-33 splits
    against 44 on split_k_cluster's 8 and 59 on split_k's 9; v0.29 262-270 TFLOP/s on 8-16
    splits of 16 tiles of 64 rows against 251 on 21 splits of the 128-row tiles."""
    c = choose(256, 256, 65536, device=device)
    assert c.schedule is SplitKParallelSchedule and (c.config.block_m, c.config.block_n) == (64, 128)
    assert 8 <= c.splits <= 16
    assert f"in {c.splits} splits" in c.reason and "workspace slot" in c.reason


@pytest.mark.parametrize("m,rows", [(1, 16), (16, 16), (17, 32), (24, 32)])
@pytest.mark.parametrize("device", [H100_SXM, H100_CLUSTERS], ids=["no-capacity", "capacity"])
def test_few_rows_take_64_row_tiles_loading_only_their_rows(m, rows, device):
    c = choose(m, 2048, 16384, device=device, **GEMV_ASIDE)
    assert c.schedule is SplitKParallelSchedule and c.config.block_m == 64
    assert c.config.a_rows == rows
    assert -(-2048 // c.config.block_n) * c.splits <= device.sm_count


@pytest.mark.parametrize("m,n,k", [(64, 8192, 8192), (64, 7872, 7936), (64, 5632, 4480),
                                   (48, 8192, 8192), (24, 8192, 8192), (26, 8205, 11617),
                                   (43, 6733, 20642), (12, 6144, 6144), (64, 4864, 7552),
                                   (1, 4096, 4096)])
def test_products_of_one_wave_that_stream_b_run_unsplit(m, n, k):
    """One wave of unsplit 64 x 128 tiles on the persistent kernel, no reduction: ahead of the
    128-row tiles and of the 64-row tiles split two or three ways where B streams at the DRAM
    rate (NOTES v0.34, x the previous pick: 64 x 8192 x 8192 1.01, 48 / 24 rows 1.02,
    12 x 6144 x 6144 1.02, 64 x 5632 x 4480 1.18, 64 x 4864 x 7552 1.15 over 3 splits,
    32 x 4096 x 4096 1.05), the zero-filled A rows included."""
    c = choose(m, n, k, **GEMV_ASIDE)
    assert c.schedule is heuristics.PersistentSchedule and c.splits == 1
    assert (c.config.block_m, c.config.block_n) == heuristics.FEW_ROWS_TILE
    assert "streaming B sets the pace" in c.reason and "model of unsplit 64x128" in c.reason


@pytest.mark.parametrize("model,kblock,load,dram,fixed,rows", [
    ("_unsplit_wave_us", "UNSPLIT_KBLOCK_US", "UNSPLIT_LOAD", "UNSPLIT_DRAM_TBPS",
     "UNSPLIT_EPILOGUE_US", 128),
    ("_few_rows_us", "FEW_ROWS_KBLOCK_US", "FEW_ROWS_LOAD", "FEW_ROWS_DRAM_TBPS",
     "FEW_ROWS_FIXED_US", 64)])
def test_unsplit_model_terms(model, kblock, load, dram, fixed, rows):
    """The unsplit tiles' models: one wave of 128 x 128 tiles, and few rows on 64 x 128."""
    estimate = getattr(heuristics, model)
    kblock_us, load, dram_tbps, fixed_us = (getattr(heuristics, name)
                                            for name in (kblock, load, dram, fixed))
    # the DRAM term: every byte of A, B and C once, and the fixed cost
    p = Problem(64, 7872, 7936, 1, "bfloat16")
    total = (64 * 7936 + 7936 * 7872 + 64 * 7872) * 2
    assert estimate(p, H100_SXM) == pytest.approx(total / (dram_tbps * 1e6) + fixed_us)
    # the k-blocks, each longer the more SMs the tiles take
    few = Problem(rows, 1024, 65536, 1, "bfloat16")     # 8 tiles
    many = Problem(rows * 8, 1024, 65536, 1, "bfloat16")
    assert estimate(few, H100_SXM) == pytest.approx(
        1024 * kblock_us * (1 + load * 8 / 132) + fixed_us)
    if rows > heuristics.SHORT_TILE_MAX_M:
        assert estimate(many, H100_SXM) > estimate(few, H100_SXM)
    else:
        assert estimate(Problem(rows, 8192, 65536, 1, "bfloat16"), H100_SXM) > estimate(
            few, H100_SXM)


def test_unsplit_wave_model_has_no_estimate_past_one_wave():
    assert heuristics._unsplit_wave_us(Problem(64, 20000, 4096, 1, "bfloat16"), H100_SXM) is None


def test_few_rows_of_an_m_major_a_load_whole_tiles():
    c = choose(8, 2048, 16384, a_major="m", **GEMV_ASIDE)
    assert c.schedule is SplitKParallelSchedule and c.config.block_m == 64
    assert c.config.a_rows is None and c.config.trans_a


@pytest.mark.parametrize("m,n,k,splits", [
    (64, 2560, 13504, 6), (64, 1152, 14720, 8), (64, 2048, 32768, 8), (8, 2048, 16384, 8)])
def test_few_rows_split_to_fill_the_sms(m, n, k, splits):
    """Too few 64 x 128 tiles to stream B at the DRAM rate unsplit: v0.17, the counts within
    2 % of the fastest measured (64 x 2048 x 32768: 52.9 us on 8, 59.8 on 2); v0.34, the split
    1.33 x the unsplit tiles on 64 x 2560 x 13504 (20 tiles), 2.17 x on 64 x 1152 x 14720."""
    c = choose(m, n, k, **GEMV_ASIDE)
    assert (c.schedule, c.config.block_m, c.splits) == (SplitKParallelSchedule, 64, splits)


@pytest.mark.parametrize("m,n,k", [(16, 28672, 8192), (64, 22848, 1024), (64, 19840, 25600)])
def test_few_rows_and_many_tiles_run_unsplit_on_the_persistent_tiles(m, n, k):
    """More 64 x 128 tiles than SMs: no split pays, and the persistent kernels' wider 128-row
    tiles ran faster than the 64-row ones past one wave, whose last wave streams B with too
    few CTAs (v0.34: 64 x 19840 x 25600 0.86 x, 16 x 28672 x 8192 0.99 x on 64 x 128)."""
    c = choose(m, n, k, **GEMV_ASIDE)
    assert c.schedule.name.startswith("persistent") and c.config.block_m == 128
    assert c.splits == 1


@pytest.mark.parametrize("model", [heuristics.PARALLEL_MODEL,
                                   heuristics.FEW_ROWS_PARALLEL_MODEL])
def test_parallel_model_terms(model):
    est = functools.partial(heuristics.parallel_split_estimate_us, dram_scale=1.0, model=model)
    tile = (64, 256)
    ops = (256 + 256) * 65536 * 2 + 256 * 256 * 2
    # the k-blocks of a split, until the DRAM term binds; then each split costs a little
    assert est(1024, 4, tile, ops) > est(1024, 8, tile, ops) > est(1024, 12, tile, ops)
    assert est(1024, 33, tile, ops) > est(1024, 16, tile, ops)
    # zero-filled rows slow each k-block, and so do other SMs at work
    assert est(1024, 4, tile, ops, zero_rows=100) > est(1024, 4, tile, ops)
    handoff = heuristics.parallel_handoff_us(tile, 4, model)
    # two 64 x 128 partials' worth
    assert handoff == pytest.approx(model.handoff_us + 2 * (model.partial_us + 4 * model.add_us))
    assert est(1024, 4, tile, ops, busy=1.0) == pytest.approx(
        1024 / 4 * model.kblock_us[tile] * (1 + model.load) + handoff)
    # a faster DRAM relieves the load of the other SMs by its factor over the H100's
    assert est(1024, 4, tile, ops, busy=1.0, dram_scale=1.5) == pytest.approx(
        1024 / 4 * model.kblock_us[tile] * (1 + model.load / 1.5) + handoff)


def test_the_parallel_hand_off_grows_with_the_partial_tile():
    """A split stores its fp32 partial and adds up its share of the tile's: twice the tile,
    twice those terms (NOTES v0.67)."""
    model = heuristics.PARALLEL_MODEL
    small = heuristics.parallel_handoff_us((64, 128), 6) - model.handoff_us
    assert heuristics.parallel_handoff_us((128, 128), 6) - model.handoff_us == \
        pytest.approx(2 * small)
    assert heuristics.parallel_handoff_us((64, 128), 7) > heuristics.parallel_handoff_us(
        (64, 128), 6)


def test_few_rows_take_their_own_parallel_model():
    """Trimmed 64-row tiles (at most SHORT_TILE_MAX_M rows) keep v0.29's fit, whose picks ran
    ahead of the refit's there (NOTES v0.67)."""
    few = Problem(heuristics.SHORT_TILE_MAX_M, 4096, 8192, 1, "bfloat16")
    more = Problem(heuristics.SHORT_TILE_MAX_M + 1, 4096, 8192, 1, "bfloat16")
    assert heuristics.parallel_model(few) is heuristics.FEW_ROWS_PARALLEL_MODEL
    assert heuristics.parallel_model(more) is heuristics.PARALLEL_MODEL


@pytest.mark.parametrize("m,n,k", [(768, 768, 10688)])
def test_a_faster_dram_moves_chained_splits_to_the_parallel_reduction(m, n, k):
    """Split three or four ways on 128 x 128 tiles: the H100's model puts split_k's chain
    ahead; with an H200's DRAM the other SMs slow split_k_parallel's k-blocks less, and it ran
    1.14-1.17 x split_k there (NOTES v0.65). (v0.67's refit takes split_k_parallel on both for
    576 x 768 x 26816 and 320 x 1344 x 24896; the H100 was not run.)"""
    h100 = choose(m, n, k, device=H100_CLUSTERS)
    h200 = choose(m, n, k, device=replace(H100_CLUSTERS, dram_tbps=4.81))
    assert h100.schedule is SplitKSchedule
    assert h200.schedule is SplitKParallelSchedule
    assert (h200.config.block_m, h200.config.block_n, h200.splits) == \
        (h100.config.block_m, h100.config.block_n, h100.splits)


@pytest.mark.parametrize("m,n,k", [(192, 4288, 21696), (189, 4279, 31326), (448, 256, 16448),
                                   (422, 97, 24547), (320, 256, 27072)])
@pytest.mark.usefixtures("split_models_only")
def test_more_rows_take_64_row_tiles_where_they_fill_more_sms(m, n, k):
    """Problems of more than 64 rows whose 128-row tiles leave SMs idle: twice as many 64-row
    tiles (all at once) where their model beats the unsplit tiles by SPLIT_K_MIN_GAIN (v0.29:
    189 x 4279 x 31326 402 TFLOP/s on 2 splits of 64 x 256 against 345 unsplit; 448 x 256 x
    16448 230-236 against 193-218 on the 128-row tiles)."""
    c = choose(m, n, k, device=H100_CLUSTERS)
    assert c.config.block_m == 64
    # unsplit, the persistent kernel's 64-row tiles take them: no workspace (NOTES v0.67)
    assert c.schedule is (SplitKParallelSchedule if c.splits > 1 else PersistentSchedule)
    tiles = -(-m // 64) * -(-n // c.config.block_n)
    assert tiles * c.splits <= H100_CLUSTERS.sm_count
    assert "64x" in c.reason


@pytest.mark.parametrize("m,n,k,splits", [(1600, 192, 23936, 5), (1920, 192, 17408, 4),
                                          (1856, 192, 25984, 4), (3392, 192, 26944, 2)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_columns_in_steps_of_192_take_64x192_tiles(m, n, k, splits, dtype):
    """One column of 64 x 192 tiles for 129-192 columns, where 128-wide tiles compute a column
    past N and read A twice (v0.47, x the previous pick: 1600 x 192 x 23936 1.11, 1920 x 192 x
    17408 1.10, 1856 x 192 x 25984 1.10). Over more columns, whole steps of 192 or not, the
    64 x 128 tiles in fewer splits ran as fast or faster on an H200 (256 x 576 x 14976: 1.09 x
    64 x 192 in 11 splits; NOTES v0.67), and v0.67's refit takes them there."""
    c = choose(m, n, k, dtype=dtype)
    assert c.schedule is SplitKParallelSchedule
    assert (c.config.block_m, c.config.block_n, c.splits) == (64, 192, splits)
    assert c.config.a_rows is None


@pytest.mark.parametrize("m", [1, 16, 40, heuristics.SHORT_TILE_MAX_M])
@pytest.mark.parametrize("n", [150, 192, 2000, 8192])
def test_few_rows_never_take_64x192_tiles(m, n):
    """Up to SHORT_TILE_MAX_M rows B's stream sets the pace, and the 64 x 192 tile ran behind
    the 128- and 256-wide ones there (v0.47): neither offered nor trimmed."""
    p = Problem(m, n, 16384, 1, "bfloat16")
    widths = {cfg.block_n for cfg in heuristics.split_configs(SplitKParallelSchedule, p,
                                                              H100_SXM)}
    assert widths == set(SplitKParallelSchedule.few_row_widths)
    assert choose(m, n, 16384, **GEMV_ASIDE).config.block_n != 192
    wide = SplitKParallelSchedule.deepest("bfloat16", 192, False, True, 232448, 64)
    assert SplitKParallelSchedule.trimmed_config(wide, m) is wide


def test_zero_filled_rows_of_the_worst_tile():
    """Only the last loaded 64-row box of an edge tile is zero-filled past the edge: boxes
    wholly past it are not loaded (producer_tma.cuh)."""
    p = Problem(100, 3000, 3000, 1, "bfloat16")
    cfg = SplitKParallelSchedule.deepest("bfloat16", 128, False, True, 232448)
    # 100 rows: two boxes, 28 past M; 3000 % 128 = 56 columns: one box, 8 past N
    assert heuristics.zero_filled_rows(p, cfg) == 28 + 8
    assert heuristics.zero_filled_rows(Problem(192, 320, 64, 1, "bfloat16"), cfg) == 0
    assert heuristics.zero_filled_rows(Problem(256, 384, 64, 1, "bfloat16"), cfg) == 0
    short = SplitKParallelSchedule.deepest("bfloat16", 128, False, True, 232448, 64)
    trimmed = SplitKParallelSchedule.trimmed_config(short, 5)
    assert trimmed.a_rows == TRIMMED_A_ROWS[0]
    assert heuristics.zero_filled_rows(Problem(5, 256, 64, 1, "bfloat16"), trimmed) == 11


def test_forced_parallel_takes_any_count_the_bound_allows():
    p = Problem(256, 256, 65536, 1, "bfloat16")
    c = heuristics.choose(p, H100_SXM, "split_k_parallel")
    assert c.schedule is SplitKParallelSchedule and c.splits >= 2
    c = replace(c, config=heuristics.split_configs(SplitKParallelSchedule, p,
                                                     H100_SXM)[0])
    assert c.config.block_m == 128
    assert SplitKParallelSchedule.max_splits(p, c.config, 1, 132) == 33
    with pytest.raises(ValueError, match="co-residency"):
        SplitKParallelSchedule.grid(p, c.config, 1, 132, 34)
    assert SplitKParallelSchedule.workspace_shape(p, c.config, 1, 33) == (33, 256, 256)
    assert SplitKParallelSchedule.workspace_shape(p, c.config, 3, 1) == (3, 256, 256)


def _copied_bytes(m: int, n: int, k: int) -> int:
    """Bytes of the row-major operands whose rows are not 16-byte aligned."""
    return (m * k * 2 if k % 8 else 0) + (k * n * 2 if n % 8 else 0)


# hopmm on its aligned copies against the best cuBLAS, measured on an H100 (bench/NOTES.md
# v0.37, tuning sweeps' problems).
@pytest.mark.parametrize("m,n,k,dtype,routed", [
    (63, 29821, 2013, "bfloat16", True),      # 0.82: copies and product 1.22 x cuBLAS's time
    (18, 12634, 26658, "float16", True),      # 0.36: cuBLAS streams 4-byte rows at 2.4 TB/s
    (133, 7765, 974, "float16", False),       # 1.75: cuBLAS computes 256 rows for 133
    (13398, 132, 12721, "float16", False),    # 1.46: likewise 132 columns
    (2984, 4320, 3549, "float16", False),     # compute-bound: the copy is a small share
    (17, 5, 23, "float16", False),            # tiny: launches set the pace
    (4096, 4096, 4096, "float16", False),     # nothing copied
])
def test_calls_whose_aligned_copies_outlast_cublas_go_to_cupy(m, n, k, dtype, routed):
    align = math.gcd(8, 2 * k, 2 * n)
    reason = heuristics.copy_route_reason(Problem(m, n, k, 1, dtype), H100_SXM,
                                          _copied_bytes(m, n, k), align)
    assert (reason is not None) == routed
    if routed:
        assert reason.startswith("rows not a multiple of 16 bytes") and "MB" in reason
        assert "cuBLAS" in reason and f"{align}-byte rows" in reason


def test_cublas_model_on_unaligned_rows():
    """cuBLAS on rows of 2 bytes: the operands moved at 1 TB/s or the product computed at 115
    TFLOP/s on its short side in whole tiles of 128, whichever takes longer."""
    cublas_us = heuristics.cublas_unaligned_us
    p = Problem(6000, 100, 12001, 1, "float16")
    moved = (6000 + 100) * 12001 * 2 + 6000 * 100 * 2
    tile_flops = 2 * 128 * 6000 * 12001
    assert cublas_us(p, 2, H100_SXM) == pytest.approx(max(moved / 1e6, tile_flops / 115e6))
    # 129 columns take two tiles; on 4-byte rows cuBLAS is faster.
    wide = Problem(6000, 129, 12001, 1, "float16")
    assert cublas_us(wide, 2, H100_SXM) == pytest.approx(2 * tile_flops / 115e6)
    assert cublas_us(p, 4, H100_SXM) < cublas_us(p, 2, H100_SXM)


H200_DRAM = replace(H100_SXM, dram_tbps=4.81)


@pytest.mark.parametrize("columns,align,streamed", [
    (40, 4, True), (64, 8, True),     # few columns of 4- or 8-byte rows: at the DRAM's rate
    (65, 4, False),                   # past half a tile: computed on whole tiles of 128
    (40, 2, False),                   # 2-byte rows: bound by their loads, not by DRAM
])
def test_cublas_streams_few_rows_of_4_or_8_bytes_at_the_dram_rate(columns, align, streamed):
    """Where the short side is at most 64 and rows are 4- or 8-byte multiples, cuBLAS's model
    takes a fixed time, then moves the operands at its narrow rate scaled by the device's DRAM
    (dram_scale); elsewhere the rate does not depend on the DRAM."""
    p = Problem(9000, columns, 12001, 1, "float16")
    moved = (9000 + columns) * 12001 * 2 + 9000 * columns * 2
    h200_us = heuristics.cublas_unaligned_us(p, align, H200_DRAM)
    h100_us = heuristics.cublas_unaligned_us(p, align, H100_SXM)
    if streamed:
        scale = heuristics.dram_scale(H200_DRAM)
        assert scale > 1.0
        fixed, tbps = heuristics.CUBLAS_NARROW_FIXED_US, heuristics.CUBLAS_NARROW_TBPS
        assert h200_us == pytest.approx(fixed + moved / (tbps * scale * 1e6))
        assert h100_us == pytest.approx(fixed + moved / (tbps * 1e6))
    else:
        assert h200_us == h100_us >= moved / (heuristics.CUBLAS_UNALIGNED_TBPS[align] * 1e6)


def test_cublas_few_rows_take_the_faster_model_and_a_long_k():
    """The streamed model's fixed time outweighs its rate on small products, where the model of
    whole tiles stands; under CUBLAS_NARROW_MIN_K the latter stands too."""
    cublas_us = heuristics.cublas_unaligned_us
    small = Problem(60, 1154, 10038, 1, "bfloat16")
    moved = (60 + 1154) * 10038 * 2 + 60 * 1154 * 2
    tiles = max(moved / 1.4e6, 2 * 128 * 1154 * 10038 / 180e6)
    assert cublas_us(small, 4, H100_SXM) == pytest.approx(tiles)
    assert heuristics.CUBLAS_NARROW_FIXED_US + moved / (heuristics.CUBLAS_NARROW_TBPS * 1e6) \
        > tiles
    large = Problem(40, 17566, 23838, 1, "bfloat16")
    short_k = replace(large, k=heuristics.CUBLAS_NARROW_MIN_K - 1)
    assert cublas_us(large, 4, H200_DRAM) < cublas_us(large, 4, H100_SXM) \
        < cublas_us(large, 2, H100_SXM)
    assert cublas_us(short_k, 4, H200_DRAM) == cublas_us(short_k, 4, H100_SXM)


# An epilogue that reads bias or c waits on one load per pair on the overlap kernels (their
# registers allow no more), once per box on the others (bench/NOTES.md v0.19): 8192 x 8192 x
# 1024 with c ran 0.62 x torch.addmm on persistent_overlap.
@pytest.mark.parametrize("m,n,k", [(8192, 8192, 1024), (5000, 3000, 4096), (3000, 5000, 4096)])
def test_epilogues_that_read_operands_stay_off_the_overlap_kernels(m, n, k):
    plain = choose(m, n, k)
    assert plain.schedule.accumulator_sets == 2  # these shapes take the overlap kernel otherwise
    assert choose(m, n, k, epilogue=True).schedule is plain.schedule  # activation only
    reads = heuristics.choose(Problem(m, n, k, 1, "bfloat16"), H100_SXM, None, True, True)
    assert reads.schedule.accumulator_sets == 1
    assert "two accumulator sets" not in reads.reason
    assert "no overlap kernel: the fused epilogue reads bias or c" in reads.reason


@pytest.mark.parametrize("m,n", [(2560, 5120), (4096, 5632)])
def test_epilogues_that_read_operands_stay_off_the_tall_cluster_tile(m, n):
    """Three consumers leave the 192 x 192 tile's epilogue one pair's operands at a time."""
    plain = choose(m, n, 4096)
    assert (plain.config.block_m, plain.config.block_n) == heuristics.TALL_TILE
    assert not plain.schedule.epilogue_fetches_boxes(plain.config)
    reads = heuristics.choose(Problem(m, n, 4096, 1, "bfloat16"), H100_SXM, None, True, True)
    assert reads.schedule.epilogue_fetches_boxes(reads.config)
    assert choose(m, n, 4096, epilogue=True).config == plain.config  # activation only


def test_row_store_choice_keeps_the_tile_and_leaves_the_overlap_kernel():
    """A result of unaligned rows: a config that takes the row store keeps its schedule; the
    overlap kernel's 128 x 192 (no registers for it) gives way to the single-set kernel of
    the same tile, unless forced; split-K and gemv keep the copy (None)."""
    from hopmm.schedules import PersistentOverlapSchedule, PersistentSchedule

    dev = H100_SXM
    problem = Problem(1000, 3001, 8192, 1, "bfloat16")
    choice = heuristics.choose(problem, dev)
    assert choice.schedule is PersistentOverlapSchedule and choice.config.block_n == 192
    stored = heuristics.row_store_choice(choice, problem, dev)
    assert stored.schedule is PersistentSchedule and stored.config.row_store
    assert (stored.config.block_m, stored.config.block_n) == (128, 192)
    assert stored.raster_group == choice.raster_group
    assert "stores them itself" in stored.reason
    assert heuristics.row_store_choice(choice, problem, dev, forced=True) is None

    short = Problem(4000, 3001, 256, 1, "bfloat16")
    plain = heuristics.choose(short, dev)
    assert not plain.schedule.name.endswith("overlap")
    kept = heuristics.row_store_choice(plain, short, dev)
    assert kept.schedule is plain.schedule and kept.config == replace(plain.config,
                                                                       row_store=True)
    few = Problem(96, 190, 8192, 1, "bfloat16")
    assert heuristics.row_store_choice(heuristics.choose(few, dev, "split_k_parallel"), few,
                                       dev) is None
    decode = Problem(1, 8191, 8192, 1, "bfloat16")
    assert heuristics.row_store_choice(heuristics.choose(decode, dev, "gemv"), decode,
                                       dev) is None


# Products of at most NARROW_BLOCK_N columns (heuristics._narrow): the 64-wide tile on every
# unclustered 128-row schedule; split_k_parallel's wider tiles only where forced.
@pytest.mark.parametrize("m,n,k,schedule", [
    (5056, 64, 5504, "persistent"),        # 40 tiles, DRAM-bound: unsplit beats a split
    (16384, 32, 4096, "persistent"),       # B rows of 64 bytes: no cluster kernel for them
    (20032, 17, 1728, "persistent"),
    (2752, 64, 16192, "split_k_cluster"),  # 22 tiles, 253 k-blocks: split
    (1664, 48, 22336, "split_k_cluster"),
])
def test_narrow_products_take_the_narrow_tile(m, n, k, schedule):
    # phaseable: the narrow pick, where stream-K on the narrow tile displaced it
    # (tests/test_stream_k_cpu.py)
    c = heuristics.phaseable(choose(m, n, k, device=H100_CLUSTERS))
    assert c.schedule.name == schedule and c.tail is None
    assert c.config.block_n == heuristics.NARROW_BLOCK_N and c.config.block_m == 128
    assert f"tiles of 128x{heuristics.NARROW_BLOCK_N}" in c.reason
    # one column more and the tile-time model is not offered the narrow tile (the wave
    # model may still take it: test_narrow_tile_by_the_wave_model)
    assert all(t[1] != heuristics.NARROW_BLOCK_N for t in heuristics._offered_shapes(
        heuristics.PersistentSchedule, Problem(m, heuristics.NARROW_BLOCK_N + 1, k, 1,
                                               "bfloat16"), H100_SXM))


def test_narrow_split_k_configs_and_models():
    """split_k and split_k_cluster take the narrow tile; split_k_parallel, whose tiles are
    wider, is not chosen above 64 rows unless forced (its 64-row tiles stay for problems of
    at most 64 rows); the narrow k-block is NARROW_KBLOCK_SCALE of the 128-wide one in the
    split-K models, so the unsplit reference a split must beat is faster too."""
    narrow = Problem(2752, 64, 16192, 1, "bfloat16")
    for sched in (heuristics.SplitKSchedule, heuristics.SplitKClusterSchedule):
        (cfg,) = heuristics.split_configs(sched, narrow, H100_SXM)
        assert cfg.block_n == heuristics.NARROW_BLOCK_N
    for m in (1000, 2752):
        unforced = choose(m, 64, 16192, device=H100_CLUSTERS)
        assert unforced.schedule is not heuristics.SplitKParallelSchedule
        forced = choose(m, 64, 16192, schedule="split_k_parallel")
        assert forced.schedule is heuristics.SplitKParallelSchedule and forced.splits >= 2
    few_rows = Problem(48, 64, 16192, 1, "bfloat16")
    assert all(c.block_m == 64 for c in heuristics.split_configs(
        heuristics.SplitKParallelSchedule, few_rows, H100_SXM))
    args = (22, 253, 4, 24 * 1024, 10_000_000)   # compute-bound: the k-blocks set the pace
    wide = heuristics.split_k_estimate_us(*args, sm_count=132, dram_scale=1.0)
    thin = heuristics.split_k_estimate_us(*args, sm_count=132, dram_scale=1.0,
                                          block_n=heuristics.NARROW_BLOCK_N)
    assert thin < wide
    wider = Problem(2752, 65, 16192, 1, "bfloat16")
    assert heuristics._one_split_us(narrow, H100_SXM) < heuristics._one_split_us(wider, H100_SXM)


def test_narrow_b_rows_are_not_the_unaligned_b_case():
    """B rows of fewer than 128 bytes go to the persistent kernel's narrow tile, not to the
    cluster kernel that splits B tiles across a pair (UNALIGNED_B_SCHEDULE)."""
    p = Problem(16384, 48, 4096, 1, "bfloat16", b_pitch_aligned=False)
    assert not heuristics._b_rows_unaligned(p)
    wide = Problem(16384, 200, 4096, 1, "bfloat16", b_pitch_aligned=False)
    assert heuristics._b_rows_unaligned(wide)
    assert choose(16384, 48, 4096, b_pitch_aligned=False).schedule.name == "persistent"


@pytest.mark.parametrize("m,n,k,narrow", [
    (23808, 128, 7616, True),    # both DRAM-bound: level by the wave model, the narrow tile
    # (5312 x 128 x 2112, 42 tiles or 84, took the narrow tile until one round of 64 x 128
    # tiles did: test_short_tile_cpu.py, NOTES v0.38)
    (4800, 192, 4928, True),
    (11648, 128, 13760, False),  # 91 tiles in one wave, or 182 in two
    (19648, 256, 1984, False),   # 9.3 waves of narrow tiles against 2.3 of 128 x 128
    (8192, 320, 8192, False),    # wider than NARROW_WAVES_MAX_N
])
def test_narrow_tile_by_the_wave_model(m, n, k, narrow):
    """Products of 65-256 columns take the narrow tile where the wave model puts it no slower
    than the 128-row tile the tile-time model chose, in groups of one M-tile."""
    c = choose(m, n, k, device=H100_CLUSTERS)
    assert (c.config.block_n == heuristics.NARROW_BLOCK_N) == narrow, c.reason
    if narrow:
        assert c.schedule is heuristics.PersistentSchedule and c.tail is None
        assert c.raster_group == heuristics.NARROW_RASTER_GROUP
        assert "by the wave model against" in c.reason
        p = Problem(m, n, k, 1, "bfloat16")
        wide = heuristics.PersistentSchedule.deepest("bfloat16", 128, False, True,
                                                     H100_SXM.smem_per_block_optin)
        assert (heuristics._persistent_us(heuristics.PersistentSchedule, p, H100_CLUSTERS,
                                          c.config)
                <= heuristics._persistent_us(heuristics.PersistentSchedule, p, H100_CLUSTERS,
                                             wide))
    # forced schedules keep the tile-time model's width
    forced = choose(m, n, k, schedule="persistent")
    assert forced.config.block_n >= 128


def test_level_split_counts_take_the_most():
    """Where the DRAM term binds several split counts alike, the most of them (more CTAs
    stream faster, v0.31): 1664 x 64 x 22336 on the narrow tile, 5-8 splits level."""
    p = Problem(1664, 64, 22336, 1, "bfloat16")
    c = choose(1664, 64, 22336, device=H100_CLUSTERS)
    estimates = heuristics._split_estimates(c.schedule, p, c.config, H100_CLUSTERS, False)
    level = [s for s, t in estimates.items() if t == min(estimates.values())]
    assert len(level) > 1 and c.splits == max(level)


def _narrow_b_copy(m, n, k, pitch=None, b_major="n", device=H100_SXM):
    problem = Problem(m, n, k, 1, "bfloat16", "k", b_major, b_pitch_aligned=False)
    return heuristics.narrow_b_copy_reason(problem, 2 * n if pitch is None else pitch, device)


def test_narrow_b_copy_only_for_rows_shorter_than_a_sector():
    """heuristics.narrow_b_copy_reason: an N-major B of a narrow product whose rows are shorter
    than a 32-byte sector, read by the narrow tile, over a product whose estimate times
    NARROW_B_ROW_COST exceeds the copy's launch and bytes."""
    reason = _narrow_b_copy(16256, 8, 9408)
    assert reason and "16 bytes" in reason and "32-byte sector" in reason
    assert _narrow_b_copy(16256, 16, 9408) is None          # 32-byte rows: whole sectors
    assert _narrow_b_copy(16256, 24, 9408) is None          # 48 bytes: the copy did not pay
    assert _narrow_b_copy(16256, 8, 9408, pitch=64) is None   # a view of wider rows
    assert _narrow_b_copy(16256, 8, 9408, b_major="k") is None   # B as w.T: K-major
    assert _narrow_b_copy(3000, 8, 3000) is None            # the launch would eat the gain
    # The copy pays from where the estimate's NARROW_B_ROW_COST passes its cost.
    problem = Problem(16256, 8, 9408, 1, "bfloat16", "k", "n", b_pitch_aligned=True)
    estimate = heuristics._choice_us(heuristics.choose(problem, H100_SXM), problem, H100_SXM)
    cost = heuristics.MIN_CALL_US + heuristics.copy_us(9408 * 8 * 2, H100_SXM)
    assert heuristics.NARROW_B_ROW_COST * estimate > cost


def test_narrow_b_copy_only_on_the_narrow_tile(monkeypatch):
    """A narrow product on another tile (split_k_parallel's 64 x 128 over few rows) reads B
    where it lies however much the copy would save: it was measured on the narrow tile only."""
    monkeypatch.setattr(heuristics, "NARROW_B_ROW_COST", 1.0)
    assert _narrow_b_copy(16256, 8, 9408)
    problem = Problem(64, 8, 32768, 1, "bfloat16", "k", "n", b_pitch_aligned=True)
    assert heuristics.choose(problem, H100_SXM).config.block_n != heuristics.NARROW_BLOCK_N
    assert _narrow_b_copy(64, 8, 32768) is None

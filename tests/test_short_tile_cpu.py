"""CPU: the persistent kernels' 64-row tiles (one consumer warpgroup): which schedules offer
them, where the heuristic takes them (heuristics.SHORT_TILE_MIN_GAIN, _short_tiles_fit), the
raster groups of their one-round grids, the splits they replace, and where they are kept out
(short main loops, narrow products, wave tails, cluster pairs); products of at most 64 rows,
which take the 64 x 128 tile alone where it fits one wave (heuristics.FEW_ROWS_TILE).
Each rule's measurements: bench/NOTES.md v0.33, v0.34."""

from dataclasses import replace

import pytest

from hopmm import heuristics
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS
from hopmm.problem import Problem
from hopmm.schedules import (SCHEDULES, WGMMA_M, PersistentOverlapSchedule, PersistentSchedule,
                             SplitKClusterSchedule, SplitKParallelSchedule, SplitKSchedule)

# An H100 as the device reports it: split_k_cluster needs its cluster capacity.
H100 = H100_SXM_CLUSTERS


def choose(m, n, k, batch=1, dtype="bfloat16", device=H100, schedule=None, epilogue=False):
    heuristics.choose.cache_clear()
    return heuristics.choose(Problem(m, n, k, batch, dtype), device, schedule, epilogue,
                             epilogue)


def test_which_kernels_offer_64_row_tiles():
    offered = {name: [t for t in s.tile_shapes() if t[0] == WGMMA_M]
               for name, s in SCHEDULES.items() if not s.split_k}
    # 64 x 64: autotuned only (no speed in heuristics.TILE_SPEED)
    assert offered.pop("persistent") == [(64, 64), (64, 128), (64, 192), (64, 256)]
    # two 64 x 256 accumulator sets would take all 256 registers of a consumer
    assert offered.pop("persistent_overlap") == [(64, 128), (64, 192)]
    # clusters of four: 64-row tiles of tall products, each quarter of B loaded once per group
    assert offered.pop("persistent_cluster4") == [(64, 128), (64, 192), (64, 256)]
    assert not any(offered.values()), offered


def test_64_by_64_tile_is_autotuned_never_chosen():
    """The 64 x 64 tile has no speed in the wave model yet (NOTES v0.57): autotune times it,
    the heuristic never takes it, with the schedule forced or not."""
    import random

    from hopmm import tuning

    rng = random.Random(64)
    for _ in range(300):
        m, n, k = (int(2 ** rng.uniform(6, 14)) // 8 * 8 for _ in range(3))
        for schedule in (None, "persistent"):
            c = choose(m, n, k, schedule=schedule)
            assert (c.config.block_m, c.config.block_n) != (WGMMA_M, 64), (m, n, k, schedule)
    tried = tuning.candidates(Problem(2496, 192, 5376, 1, "bfloat16"), H100)
    assert any(c.schedule is PersistentSchedule and (c.config.block_m, c.config.block_n)
               == (WGMMA_M, 64) for c in tried)


@pytest.mark.parametrize("sched", [PersistentSchedule, PersistentOverlapSchedule])
def test_64_row_configs_have_one_consumer_and_fit(sched):
    for block_m, block_n in sched.tile_shapes():
        if block_m != WGMMA_M:
            continue
        cfg = sched.deepest("float16", block_n, False, True, H100_SXM.smem_per_block_optin,
                            block_m)
        assert cfg.consumers == 1 and sched.threads(cfg) == 256
        assert cfg.stages >= heuristics.FAST_STAGES
        assert sched.smem_bytes(cfg) <= H100_SXM.smem_per_block_optin
        sched.check(cfg)


# 64 x 192 on the single-set kernel: the overlap kernel takes 128-row tiles only
# (heuristics.OVERLAP_BLOCK_MS).
@pytest.mark.parametrize("m,n,k,sched,tile", [
    (1472, 896, 9472, PersistentSchedule, (64, 192)),          # 84 -> 115 tiles
    (3968, 320, 22656, PersistentSchedule, (64, 192)),         # 93 -> 124
    (640, 2304, 10944, PersistentSchedule, (64, 192)),         # 90 -> 120
    (1024, 1024, 1024, PersistentSchedule, (64, 128)),         # 64 -> 128
    (320, 5696, 6400, PersistentSchedule, (64, 256)),          # 90 of 128 x 192 -> 115
])
def test_64_row_tiles_fill_the_sms_128_row_tiles_leave_idle(m, n, k, sched, tile):
    c = choose(m, n, k)
    assert c.schedule is sched and (c.config.block_m, c.config.block_n) == tile
    assert c.tail is None and c.splits == 1
    tiles = heuristics._tiles(Problem(m, n, k, 1, "bfloat16"), *tile)
    assert tiles <= H100.sm_count and f"{tiles} tiles of {tile[0]}x{tile[1]}" in c.reason


def test_the_margin_decides():
    """1472 x 896 x 9472: 115 tiles of 64 x 192 against 84 of 128 x 128, both one wave:
    12288 / (0.93 x 0.95) against 16384 x 149 / 148 / 0.90, 1.32 x fewer tile-times."""
    assert choose(1472, 896, 9472).config.block_m == WGMMA_M
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "SHORT_TILE_MIN_GAIN", 1.35)
        assert choose(1472, 896, 9472).config.block_m == 128
    heuristics.choose.cache_clear()


@pytest.mark.parametrize("m,n,k,why", [
    (6528, 1728, 192, "short main loop"),
    (1600, 6784, 768, "short main loop"),
    (5120, 64, 6272, "narrow"),
    (6001, 17, 3000, "narrow"),
])
def test_64_row_tiles_kept_out(m, n, k, why):
    p = Problem(m, n, k, 1, "bfloat16")
    assert not heuristics._short_tiles_fit(p), why
    assert all(t[0] != WGMMA_M for t in heuristics._offered_shapes(PersistentSchedule, p, H100))
    assert choose(m, n, k).config.block_m != WGMMA_M or m <= WGMMA_M


@pytest.mark.parametrize("m,n,k", [(4928, 192, 7040), (4800, 192, 4928), (4352, 192, 1856)])
def test_the_narrow_tile_keeps_its_problems(m, n, k):
    """Where the wave model takes the narrow tile over the 128-row tiles, it keeps the problem
    (the 64 x 192 tile ran 0.87-0.92 x it)."""
    c = choose(m, n, k)
    assert (c.config.block_m, c.config.block_n) == (128, 64), c.reason


@pytest.mark.parametrize("m,n,k,group", [
    (320, 5696, 6400, 5),     # B's k-block slice the larger: every M-tile, column by column
    (640, 2304, 10944, 10),
    (1536, 960, 8128, 1),     # A's the larger: along rows
    (3968, 320, 22656, 1),
])
def test_one_round_groups_of_64_row_tiles_share_the_larger_operand(m, n, k, group):
    c = choose(m, n, k)
    assert c.config.block_m == WGMMA_M and c.raster_group == group


def test_several_waves_of_64_row_tiles_take_groups_by_footprint():
    c = choose(704, 17984, 15360)   # 11 x 71 tiles of 64 x 256: 5.9 waves
    assert (c.config.block_m, c.config.block_n) == (64, 256)
    p = Problem(704, 17984, 15360, 1, "bfloat16")
    assert c.raster_group == heuristics._raster_group(p, c.config, H100)
    assert c.raster_group in [min(g, 11) for g in heuristics.RASTER_GROUPS]


def test_64_row_tiles_are_never_paired_into_clusters():
    """6 waves of 240 k-blocks would pair 128 x 256 tiles (CLUSTER_MIN_WAVES); the cluster
    kernel has no 64-row tiles, so the 64 x 256 tile stays on the persistent kernel."""
    c = choose(704, 17984, 15360)
    assert c.schedule is PersistentSchedule and c.config.block_m == WGMMA_M
    assert (c.config.block_m, c.config.block_n) in c.schedule.tile_shapes()


@pytest.mark.parametrize("m,n,k,split", [
    (2176, 320, 1472, SplitKClusterSchedule), (704, 1088, 1536, SplitKClusterSchedule),
    (2048, 448, 2176, SplitKClusterSchedule), (1024, 1024, 2048, SplitKClusterSchedule),
    (1024, 1024, 4096, SplitKClusterSchedule), (640, 1024, 3072, SplitKClusterSchedule),
    (2048, 512, 2048, SplitKClusterSchedule)])
def test_64_row_tiles_replace_splits_they_beat(m, n, k, split):
    """The split models put a split SPLIT_K_MIN_GAIN ahead of the 128-row tiles; the 64 x 128
    tiles' wave model is within that of the split: unsplit. They ran 1.03-1.40 x the split on
    these (and 0.97-1.48 x, geomean 1.19, on 25 problems of the tuning seeds). (192 x 4288 x
    21696's split_k_parallel pick is now one split, which those tiles run: NOTES v0.67.)"""
    c = choose(m, n, k)
    assert c.schedule is PersistentSchedule and c.splits == 1
    assert (c.config.block_m, c.config.block_n) == (64, 128)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "_short_tiles_beat_split", lambda *args: False)
        assert choose(m, n, k).schedule is split
    forced = choose(m, n, k, schedule=split.name)
    assert forced.schedule is split   # a forced schedule is never replaced


# One round of 64 x 128 tiles over a short main loop (heuristics.ONE_ROUND_SHORT_GAIN); the
# old choice, and the 64 x 128 tiles' speed over it, measured on an H100 (NOTES v0.38).
@pytest.mark.parametrize("m,n,k,dtype,old", [
    (1984, 256, 6272, "bfloat16", SplitKParallelSchedule),     # 1.10 x
    (2432, 192, 3456, "float16", SplitKClusterSchedule),       # 1.10-1.13 x
    (3328, 256, 7040, "bfloat16", SplitKClusterSchedule),      # 1.13 x
    (768, 768, 4032, "float16", SplitKClusterSchedule),        # 1.08 x
    (2752, 256, 1600, "float16", SplitKClusterSchedule),       # 1.39-1.41 x
    (5312, 128, 2112, "float16", PersistentSchedule),          # the narrow tile: 1.03-1.04 x
])
def test_one_round_of_64_row_tiles_beats_splits_and_the_narrow_tile_on_short_loops(
        m, n, k, dtype, old):
    c = choose(m, n, k, dtype=dtype)
    assert c.schedule is PersistentSchedule and c.splits == 1 and c.tail is None
    assert (c.config.block_m, c.config.block_n) == heuristics.FEW_ROWS_TILE
    assert "one round of 64x128 tiles" in c.reason
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "_short_tiles_in_one_round", lambda *args: False)
        before = choose(m, n, k, dtype=dtype)
    heuristics.choose.cache_clear()
    assert before.schedule is old and (before.config.block_m == 128 or before.splits > 1)


def test_the_one_round_margin_and_main_loop_bound_decide():
    """1984 x 256 x 6272: the wave model's 21.4 us against split_k_parallel's 16.9 (1.26 x)."""
    assert choose(1984, 256, 6272).splits == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "ONE_ROUND_SHORT_GAIN", heuristics.SPLIT_K_MIN_GAIN)
        assert choose(1984, 256, 6272).splits > 1
        mp.setattr(heuristics, "ONE_ROUND_SHORT_GAIN", 1.3)
        mp.setattr(heuristics, "ONE_ROUND_SHORT_MAX_K_BLOCKS", 97)   # 98 k-blocks
        assert choose(1984, 256, 6272).splits > 1
    heuristics.choose.cache_clear()


@pytest.mark.parametrize("m,n,k,dtype", [
    (1408, 704, 31744, "float16"),    # 496 k-blocks: the split ran 1.26 x the 64-row tiles
    (3456, 128, 15040, "bfloat16"),   # 235: 1.12 x
    (4096, 128, 25536, "float16"),    # 399: 1.06 x
])
def test_long_main_loops_keep_their_split(m, n, k, dtype):
    p = Problem(m, n, k, 1, dtype)
    assert heuristics._k_blocks(p) > heuristics.ONE_ROUND_SHORT_MAX_K_BLOCKS
    assert heuristics._tiles(p, *heuristics.FEW_ROWS_TILE) <= H100.sm_count
    assert choose(m, n, k, dtype=dtype).splits > 1


# Splits whose CTAs outnumber the 64-row tiles by heuristics.SPLIT_MORE_CTAS over a long main
# loop are not held by the 64-row tiles' bars; each new pick's speed over the old, H200 (NOTES
# v0.51).
@pytest.mark.parametrize("m,n,k,dtype,split", [
    (128, 4224, 30144, "bfloat16", SplitKClusterSchedule),   # 1.38 x
    (1088, 512, 13504, "bfloat16", SplitKSchedule),           # 1.19 x
    (192, 2432, 9536, "float16", SplitKParallelSchedule),     # 1.14 x
])
def test_splits_of_more_ctas_than_64_row_tiles_take_long_loops(m, n, k, dtype, split):
    p = Problem(m, n, k, 1, dtype)
    assert heuristics._k_blocks(p) >= heuristics._split_more_ctas_min_k_blocks(H100)
    c = choose(m, n, k, dtype=dtype)
    assert c.schedule is split and c.splits >= 2
    assert "tiles' bar does not hold it" in c.reason   # what explain says decided
    ctas = heuristics._tiles(p, c.config.block_m, c.config.block_n) * c.splits
    assert ctas >= heuristics.SPLIT_MORE_CTAS * heuristics._tiles(p, *heuristics.FEW_ROWS_TILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "SPLIT_MORE_CTAS", float("inf"))
        before = choose(m, n, k, dtype=dtype)
    heuristics.choose.cache_clear()
    assert before.splits == 1 and before.config.block_m == WGMMA_M


# On an H200's faster DRAM the main loop past which such splits go unheld is shorter: 89
# k-blocks, not 128. Each problem's split over the 64-row tiles there, in the A/B (NOTES v0.56);
# on the H100 the same problems keep those tiles.
@pytest.mark.parametrize("m,n,k,dtype", [
    (128, 4672, 6080, "bfloat16"),   # 95 k-blocks: 1.20 x
    (1984, 192, 5952, "float16"),    # 93: 1.22 x
    (4608, 128, 6400, "bfloat16"),   # 100: 1.07 x
    (1024, 512, 6400, "float16"),    # 100 (0.735 x cuBLAS in the seed-211 sweep before)
])
def test_faster_dram_unholds_splits_over_shorter_loops(m, n, k, dtype):
    h200 = replace(H100, name="NVIDIA H200 (assumed)", dram_tbps=4.81)
    bound = heuristics._split_more_ctas_min_k_blocks
    assert bound(H100) == heuristics.SPLIT_MORE_CTAS_MIN_K_BLOCKS
    assert bound(h200) == 89
    assert 89 <= heuristics._k_blocks(Problem(m, n, k, 1, dtype)) < 128
    on_h100 = choose(m, n, k, dtype=dtype)
    assert on_h100.splits == 1 and on_h100.config.block_m == WGMMA_M
    on_h200 = choose(m, n, k, dtype=dtype, device=h200)
    assert on_h200.splits >= 2 and "tiles' bar does not hold it" in on_h200.reason


# Two splits of 128-row tiles, about as many CTAs as the 64-row tiles (they ran 0.87-0.89 x
# those on an H200, NOTES v0.51), and a short loop (98 k-blocks: the split ran 0.91 x on an
# H100, v0.38) stay held.
@pytest.mark.parametrize("m,n,k,dtype,by_ctas", [
    (256, 3072, 8960, "bfloat16", True),
    (3200, 256, 9792, "float16", True),
    (1984, 256, 6272, "bfloat16", False),
])
def test_splits_of_about_as_many_ctas_or_short_loops_stay_held(m, n, k, dtype, by_ctas):
    c = choose(m, n, k, dtype=dtype)
    assert c.splits == 1 and c.config.block_m == WGMMA_M
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "SPLIT_MORE_CTAS", 1.0)   # any split count is "more CTAs"
        loose = choose(m, n, k, dtype=dtype)
    heuristics.choose.cache_clear()
    assert (loose.splits > 1) == by_ctas


def test_one_round_keeps_to_the_64_by_128_tile():
    """4928 x 192 x 7040: 77 tiles of 64 x 192 would fit one round, but the rule was measured
    on the 64 x 128 tile only: the narrow tile keeps the problem (v0.33)."""
    p = Problem(4928, 192, 7040, 1, "bfloat16")
    cfg = PersistentSchedule.deepest("bfloat16", 192, False, True, H100.smem_per_block_optin,
                                     WGMMA_M)
    assert not heuristics._short_tiles_in_one_round(p, H100, cfg)
    c = choose(4928, 192, 7040)
    assert (c.config.block_m, c.config.block_n) == (128, 64)


@pytest.mark.parametrize("m,n,k", [(17344, 128, 6848), (5120, 5120, 5120), (462, 20000, 4096),
                                   (1856, 2688, 22016), (4672, 2048, 26240)])
def test_wave_tails_keep_128_row_tiles(m, n, k):
    c = choose(m, n, k)
    assert c.tail is not None
    assert c.config.block_m != WGMMA_M
    assert c.tail.choice.config.block_m != WGMMA_M or c.tail.choice.schedule.split_k


def test_64_row_192_wide_tiles_stay_on_the_single_set_kernel_with_or_without_an_epilogue():
    """The overlap kernel's two 64 x 192 sets ran slower than the single-set kernel's one
    (heuristics.OVERLAP_BLOCK_MS, NOTES v0.36) and leave a lone consumer 64 registers, so that
    a fused epilogue would fetch bias and c one pair at a time: plain and fused calls alike
    take the single-set kernel."""
    plain = choose(1472, 896, 9472)
    fused = choose(1472, 896, 9472, epilogue=True)
    for c in (plain, fused):
        assert c.schedule is PersistentSchedule
        assert (c.config.block_m, c.config.block_n) == (64, 192)
    overlap = PersistentOverlapSchedule.deepest("bfloat16", 192, False, False,
                                                H100_SXM.smem_per_block_optin, WGMMA_M)
    assert not PersistentOverlapSchedule.epilogue_fetches_boxes(overlap)


@pytest.mark.parametrize("m,n,k", [(64, 5632, 4480), (48, 8192, 8192), (17, 16896, 2048),
                                   (64, 8192, 8192)])
@pytest.mark.parametrize("schedule", [None, "persistent", "persistent_overlap"])
def test_few_rows_take_the_64x128_tile_alone(m, n, k, schedule):
    """At most 64 rows in one wave of 64 x 128 tiles: the persistent kernels run that tile
    (B's stream sets the pace: the most CTAs with the deepest ring), forced or not; the
    128-row tiles of the kernels that have no 64-row tile are still offered."""
    p = Problem(m, n, k, 1, "bfloat16")
    assert heuristics._few_rows(p, H100)
    for sched in (PersistentSchedule, PersistentOverlapSchedule):
        assert heuristics._offered_shapes(sched, p, H100) == [heuristics.FEW_ROWS_TILE]
        # wave tails (short=False) keep the 128-row tiles
        assert all(t[0] != WGMMA_M
                   for t in heuristics._offered_shapes(sched, p, H100, short=False))
    assert all(t[0] != WGMMA_M for t in heuristics._offered_shapes(
        SCHEDULES["persistent_cluster"], p, H100))
    c = choose(m, n, k, schedule=schedule, epilogue=True)
    assert (c.config.block_m, c.config.block_n) == heuristics.FEW_ROWS_TILE and c.splits == 1


@pytest.mark.parametrize("m,n,k,why", [
    (64, 17024, 4096, "past one wave"),       # 133 tiles of 64 x 128
    (64, 28480, 576, "short main loop"),
    (64, 64, 65536, "narrow"),
    (65, 8192, 8192, "more than 64 rows"),
])
def test_few_rows_tile_kept_out(m, n, k, why):
    assert not heuristics._few_rows(Problem(m, n, k, 1, "bfloat16"), H100), why


def test_few_rows_split_must_beat_the_unsplit_64x128_tiles():
    """The split's estimate against the few-rows model, within PARALLEL_FILL_SLACK: 20 tiles
    of 64 x 2560 x 13504 split (too few CTAs to draw DRAM's rate), 46 of 64 x 5888 x 8832 not
    (1.20 x its split of two, NOTES v0.34)."""
    split = choose(64, 2560, 13504, epilogue=True)
    assert split.schedule is SplitKParallelSchedule and split.splits > 1
    assert "against" in split.reason and "for the unsplit 64x128 tiles" in split.reason
    unsplit = choose(64, 5888, 8832, epilogue=True)
    assert unsplit.schedule is PersistentSchedule and unsplit.splits == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(heuristics, "_few_rows_us", lambda *args: 1e9)
        moved = choose(64, 5888, 8832, epilogue=True)
        assert moved.schedule is SplitKParallelSchedule and moved.splits > 1
    heuristics.choose.cache_clear()


def test_a_batched_split_counts_each_tile_once():
    """Two slices of 128 x 1152 x 25792: the split's CTAs (18 tiles of 128 x 128 in 5 splits)
    and the 64-row tiles it outnumbers (36) are counted over the batch once, as the grid runs
    them."""
    c = choose(128, 1152, 25792, batch=2)
    assert c.schedule.name == "split_k_cluster" and c.splits == 5
    assert "90 CTAs, at least 1.4 x the 36 unsplit 64x128 tiles" in c.reason, c.reason

"""The time models' DRAM rates follow the device's memory bandwidth (heuristics.dram_scale):
measured on an H100, scaled by another device's peak over the H100's (bench/NOTES.md v0.52)."""
from dataclasses import replace

import pytest

from hopmm import heuristics, tuning
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS, dram_peak_tbps
from hopmm.problem import Problem
from hopmm.schedules import DUAL_B_SCHEDULES

# The H200 as it reports itself: HBM3e at 3201 MHz over 6016 bits.
H200_DRAM_TBPS = dram_peak_tbps(3_201_000, 6016)
H200 = replace(H100_SXM_CLUSTERS, name="NVIDIA H200 (assumed)", dram_tbps=H200_DRAM_TBPS)


def test_peak_bandwidth_from_clock_and_bus():
    assert H100_SXM.dram_tbps == pytest.approx(3.352, abs=1e-3)    # the published 3.35
    assert H200_DRAM_TBPS == pytest.approx(4.814, abs=1e-3)        # the published 4.8


def test_scale_is_one_on_the_reference_and_where_unknown():
    assert heuristics.dram_scale(H100_SXM) == 1.0
    assert heuristics.dram_scale(H100_SXM_CLUSTERS) == 1.0
    assert heuristics.dram_scale(replace(H100_SXM, dram_tbps=None)) == 1.0
    assert heuristics.dram_scale(H200) == pytest.approx(H200_DRAM_TBPS / H100_SXM.dram_tbps)


def test_a_memory_bound_estimate_shrinks_by_the_scale():
    """One row of 8192 x 8192 unsplit: gemv's stream of B is the whole estimate but its
    launch."""
    p = Problem(1, 8192, 8192, 1, "bfloat16")
    choice = heuristics.choose(p, H100_SXM_CLUSTERS)
    assert choice.schedule.name == "gemv"
    stream = {dev.name: heuristics.gemv_estimate_us(p, choice.config, 1, dev)
              - heuristics.GEMV_LAUNCH_US for dev in (H100_SXM_CLUSTERS, H200)}
    assert stream[H100_SXM_CLUSTERS.name] / stream[H200.name] == pytest.approx(
        heuristics.dram_scale(H200), rel=1e-6)


def test_copies_are_faster_on_faster_memory():
    assert heuristics.copy_us(10 ** 9, H100_SXM) == pytest.approx(
        2e9 / (heuristics.COPY_TBPS * 1e6))
    assert heuristics.copy_us(10 ** 9, H200) == pytest.approx(
        heuristics.copy_us(10 ** 9, H100_SXM) / heuristics.dram_scale(H200))


@pytest.mark.parametrize("m,n,k,h100,h200", [
    # Few rows over a long K: where the H100's DRAM holds the unsplit 64-row tiles to the
    # splits' pace, the H200's leaves the k-blocks to decide (A/B on an H200: 1.31 x and
    # 1.28 x; NOTES v0.52).
    (64, 4096, 22592, "persistent 64x128", "split_k_parallel 64x128"),
    (64, 3840, 17728, "persistent 64x128", "split_k_parallel 64x128"),
    # Few columns: the 128 x 64 tiles split in clusters (1.18 x, 1.27 x).
    (5312, 64, 30464, "persistent 128x64", "split_k_cluster 128x64"),
    (4928, 64, 6720, "persistent 128x64", "split_k_cluster 128x64"),
])
def test_the_choice_follows_the_devices_memory(m, n, k, h100, h200):
    p = Problem(m, n, k, 1, "bfloat16")
    picks = [tuning.label(heuristics.choose(p, dev)) for dev in (H100_SXM_CLUSTERS, H200)]
    assert picks[0].startswith(h100 + " ") and picks[1].startswith(h200 + " ")


def test_one_wave_of_few_row_tiles_streams_below_faster_dram():
    """One wave of 64-row tiles streams at most FEW_ROWS_WAVE_TBPS (few CTAs, not the DRAM,
    cap it), over at most FEW_ROWS_UNSCALED_MAX_M rows at the H100's rate; past one wave at
    the scaled rate. On the H100 neither cap binds."""
    one_wave, two_waves = H200.sm_count, H200.sm_count + 1
    rows, decode_rows = 64, heuristics.FEW_ROWS_UNSCALED_MAX_M
    scaled = heuristics.FEW_ROWS_DRAM_TBPS * heuristics.dram_scale(H200)
    assert heuristics.FEW_ROWS_DRAM_TBPS < heuristics.FEW_ROWS_WAVE_TBPS < scaled
    assert heuristics._few_rows_dram_tbps(one_wave, rows, H200) == heuristics.FEW_ROWS_WAVE_TBPS
    assert heuristics._few_rows_dram_tbps(one_wave, decode_rows, H200) == \
        heuristics.FEW_ROWS_DRAM_TBPS
    assert heuristics._few_rows_dram_tbps(two_waves, decode_rows, H200) == pytest.approx(scaled)
    for tiles, m in ((one_wave, rows), (one_wave, decode_rows), (two_waves, rows)):
        assert heuristics._few_rows_dram_tbps(tiles, m, H100_SXM_CLUSTERS) == \
            heuristics.FEW_ROWS_DRAM_TBPS


@pytest.mark.parametrize("m,n,k,h200", [
    # 4 rows: the split tiles' 128 CTAs win on the H200 (41.5 against 47.3 us; NOTES v0.52).
    (4, 8192, 8192, "split_k_parallel 64x128"),
    # 64 rows over a short K: one wave unsplit streams fast enough that a split's hand-off
    # does not pay (A/B on an H200: 1.48 x, 1.42 x; NOTES v0.55).
    (64, 7424, 2112, "persistent 64x128"),
    (64, 6656, 2368, "persistent 64x128"),
])
def test_few_row_picks_on_faster_dram(m, n, k, h200):
    p = Problem(m, n, k, 1, "bfloat16")
    assert tuning.label(heuristics.choose(p, H100_SXM_CLUSTERS)).startswith("persistent 64x128 ")
    assert tuning.label(heuristics.choose(p, H200)).startswith(h200 + " ")


def test_the_pair_of_256_rows_takes_the_one_kernel_on_faster_memory():
    """matmul_shared_a at 256 x 14336 x 4096: the two paths' models within 1 % on the H100
    (composed); with the H200's DRAM the one kernel's read of A once decides."""
    p = Problem(256, 14336, 4096, 1, "bfloat16")
    pair = DUAL_B_SCHEDULES["shared_a"]
    assert not heuristics.dual_b_pays(pair, p, H100_SXM_CLUSTERS)[0]
    assert heuristics.dual_b_pays(pair, p, H200)[0]


def test_gpu_tier_picks_hold_at_any_dram_bandwidth():
    """The GPU tier's unforced narrow-tile and few-row cases whose rows TMA reads in place
    take the schedule and tile they name at 0.6-1.6 x the H100's DRAM bandwidth, so that they
    check the same kernels on an H100 and an H200."""
    from test_gpu_narrow import CASES, NARROW
    from test_gpu_short_tile import UNFORCED

    cases = [(m, n, k, schedule, NARROW) for m, n, k, schedule in CASES.values()]
    cases += list(UNFORCED.values())
    for m, n, k, schedule, tile in cases:
        if n % 8 or k % 8 or m % 8:   # read through copies or phase maps: another problem
            continue
        for scale in (0.6, 1.0, 1.44, 1.6):
            dev = replace(H100_SXM_CLUSTERS, dram_tbps=H100_SXM.dram_tbps * scale)
            label = tuning.label(heuristics.choose(Problem(m, n, k, 1, "bfloat16"), dev))
            assert label.startswith(f"{schedule} {tile} ") and "tail" not in label, \
                (m, n, k, scale, label)


@pytest.mark.parametrize("m,n,k", [(31872, 14080, 64), (7000, 8192, 64), (9024, 8320, 64)])
def test_the_short_store_tile_only_where_dram_binds(m, n, k):
    """Store-bound results at one k-block: the 64 x 256 tile, whose one consumer per SM stores
    C at up to STORE_BOUND_SHORT_TILE_TBPS, on the H100, whose DRAM writes no faster; on the
    H200 the 128-row tiles' two consumers (1.19 x on 15 such products there, NOTES v0.54)."""
    assert heuristics.short_store_tile_keeps_pace(H100_SXM_CLUSTERS)
    assert not heuristics.short_store_tile_keeps_pace(H200)
    p = Problem(m, n, k, 1, "bfloat16")
    h100, h200 = (heuristics.choose(p, dev) for dev in (H100_SXM_CLUSTERS, H200))
    assert (h100.config.block_m, h100.config.block_n) == (64, 256)
    assert h200.config.block_m == 128 and h200.config.block_n in heuristics.STORE_BOUND_WIDTHS
    for c in (h100, h200):
        assert "the stores set the pace" in c.reason
        assert c.raster_group == heuristics.STORE_BOUND_RASTER_GROUP
    assert "not 64x256, whose one consumer per SM stores at most" in h200.reason
    assert "whose one consumer" not in h100.reason

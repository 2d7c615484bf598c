"""CPU tier: CTAs per SM by registers, threads and shared memory (hopmm.occupancy), against
the CUDA occupancy calculator's arithmetic for compute capability 9.0, and gemv's K split by
the rounds of CTAs the SMs hold at once."""
import pytest

from hopmm import heuristics, occupancy
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import GemvConfig, GemvSchedule

OPTIN = H100_SXM.smem_per_block_optin   # 227 KB: an SM has 228 KB


@pytest.mark.parametrize("registers,threads,smem,expect", [
    (104, 256, 128, 2),        # 3328 registers a warp: 4 warps a quarter, 16 warps
    (128, 256, 0, 2),          # 4096 a warp: exactly 16 warps
    (129, 256, 0, 1),          # 136 a thread after rounding: 3 warps a quarter
    (255, 128, 0, 2),          # 8192 a warp: 2 a quarter, 8 warps
    (64, 256, 0, 4),           # registers allow 32 warps, threads 8 CTAs
    (32, 64, 0, 32),           # the CTA slots bound it
    (32, 1024, 0, 2),          # the threads bound it
    (32, 128, 100 * 1024, 2),  # shared memory: (228 KB) // (100 KB + 1 KB)
    (168, 384, 230464, 1),     # a tile kernel: one CTA per SM
    (32, 128, OPTIN + 1, 0),   # past the opt-in limit: none fits
])
def test_resident_ctas_per_sm(registers, threads, smem, expect):
    assert occupancy.resident_ctas_per_sm(registers, threads, smem, OPTIN) == expect


def test_shared_memory_is_allocated_in_units():
    """A CTA's shared memory rounds up to SMEM_UNIT and carries CTA_RESERVED_SMEM: two CTAs
    of exactly half the SM's memory less the reserve fit, one byte more does not."""
    sm = OPTIN + occupancy.CTA_RESERVED_SMEM
    half = sm // 2 - occupancy.CTA_RESERVED_SMEM
    assert occupancy.resident_ctas_per_sm(32, 128, half, OPTIN) == 2
    assert occupancy.resident_ctas_per_sm(32, 128, half + 1, OPTIN) == 1


@pytest.mark.parametrize("registers,threads", [(0, 128), (32, 0)])
def test_rejects_empty_kernels(registers, threads):
    with pytest.raises(ValueError, match="positive"):
        occupancy.resident_ctas_per_sm(registers, threads, 0, OPTIN)


def decode_problem(m, n, k):
    """m x k @ k x n with B K-major (a weight's transposed view), as gemv's K-major loops read
    it."""
    return Problem(m=m, n=n, k=k, batch=1, dtype="bfloat16", a_major="k", b_major="k")


def test_rounds_cost():
    """A grid's stream in rounds of resident CTAs: a round of fewer CTAs than fill the DRAM
    takes as long as a full one."""
    assert heuristics._gemv_rounds_cost(140, 264, 198) == 198        # one round, not full
    assert heuristics._gemv_rounds_cost(264, 264, 198) == 264
    assert heuristics._gemv_rounds_cost(280, 264, 198) == 264 + 198  # 16 CTAs past a round
    assert heuristics._gemv_rounds_cost(282, 132, 198) == 3 * 198    # rounds of 132, 132, 18


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n", [1024, 1664, 3072, 4480, 6208, 9000])
def test_split_count_streams_in_the_fewest_round_times(m, n):
    """gemv's split count is, of those up to the fewest that fill the SMs' bytes in flight,
    the one whose rounds of resident CTAs take the least time per split; with every CTA
    resident at once it is that fewest count."""
    for mma in (False, True) if m >= 8 else (False,):
        cfg = GemvConfig.default("bfloat16", False, False, m, False, mma)
        p = decode_problem(m, n, 8192)
        splits = heuristics.gemv_splits(p, cfg, H100_SXM)
        row_groups, col_blocks = GemvSchedule.tiles(p, cfg)
        ctas = row_groups * col_blocks
        resident = heuristics.gemv_resident_ctas(cfg, H100_SXM)
        full = heuristics._gemv_ctas_wanted(cfg, H100_SXM)
        wanted = heuristics._gemv_splits_wanted(p, cfg, H100_SXM)
        costs = [heuristics._gemv_rounds_cost(s * ctas, resident, full) / s
                 for s in range(1, wanted + 1)]
        assert splits == 1 + costs.index(min(costs)), (cfg.tag, splits, costs)
        if wanted * ctas <= resident:
            assert splits == wanted


def test_a_split_grid_just_past_a_round_stays_unsplit(monkeypatch):
    """1 x 4480 x 8192 (K-major, two CTAs per SM by registers): 140 column blocks; two
    splits would be 280 CTAs, 16 past the 264 held at once, whose round takes as long as the
    first: unsplit. With every CTA resident at once it splits in two."""
    cfg = GemvConfig.default("bfloat16", False, False, 1, False, False)
    p = decode_problem(1, 4480, 8192)
    assert GemvSchedule.tiles(p, cfg) == (1, 140)
    assert heuristics.gemv_resident_ctas(cfg, H100_SXM) == 2 * H100_SXM.sm_count
    assert heuristics.gemv_splits(p, cfg, H100_SXM) == 1
    monkeypatch.setattr(heuristics, "gemv_resident_ctas", lambda cfg, device: 10 ** 9)
    assert heuristics.gemv_splits(p, cfg, H100_SXM) == 2


def test_a_grid_past_a_round_splits_to_shorten_its_last():
    """8 x 4480 x 8192 on the 8-row K-major CUDA-core loops (one CTA per SM by registers):
    140 CTAs unsplit run in rounds of 132 and 8 as long as each other; two splits run three
    rounds of half the length."""
    cfg = GemvConfig.default("bfloat16", False, False, 8, False, False)
    p = decode_problem(8, 4480, 8192)
    assert heuristics.gemv_resident_ctas(cfg, H100_SXM) == H100_SXM.sm_count
    assert heuristics._gemv_grid_ctas(p, cfg) == 140
    assert heuristics.gemv_splits(p, cfg, H100_SXM) == 2


def test_rows_read_in_place_keep_the_wanted_split():
    """Rows read in place split K to fill the bytes in flight whatever the rounds: 8 x 1199 x
    4000 from offset views, 19 CTAs of one per SM, keeps its 11 splits (209 CTAs)."""
    p = Problem(8, 1199, 4000, 1, "float16", b_major="n")
    c = heuristics.gemv_in_place_choice(p, H100_SXM, 1, True)
    assert c.config.in_place and c.config.mma
    assert heuristics.gemv_resident_ctas(c.config, H100_SXM) == H100_SXM.sm_count
    assert c.splits == heuristics._gemv_splits_wanted(p, c.config, H100_SXM) == 11

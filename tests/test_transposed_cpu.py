"""CPU: the transposed product (KernelConfig.trans_c: the kernel computes C^T = B^T A^T and
stores it transposed): which configs and schedules may ask for it, where the heuristic takes
it (heuristics._transposed_choice, TRANSPOSE_MIN_GAIN; against a wave tail or stream-K, the
lower model) and where it keeps its pick, what the choice it displaced still serves (results
stored by rows, operands read through phase maps), the model's estimate of it, and
autotune's entries of it. The kernels compile in the kernels
tier (report.kernel_matrix); the launch layer runs in tests/test_cpu_simulated_launch.py; the
measurements: bench/NOTES.md v0.58."""
import random
from dataclasses import replace

import pytest

from hopmm import heuristics, tuning
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS
from hopmm.epilogue import EpilogueSpec
from hopmm.problem import Problem
from hopmm.schedules import (SCHEDULES, GemvConfig, GemvSchedule, KernelConfig,
                             PersistentOverlapSchedule, PersistentSchedule, transposed_problem)

H200 = replace(H100_SXM_CLUSTERS, dram_tbps=4.81)   # an H100's limits at an H200's DRAM peak
DEVICES = [H100_SXM_CLUSTERS, H200]


def choose(m, n, k, device=H100_SXM_CLUSTERS, a_major="k", b_major="n", schedule=None,
           epilogue=False, b_pitch_aligned=True):
    heuristics.choose.cache_clear()
    problem = Problem(m, n, k, 1, "bfloat16", a_major, b_major, b_pitch_aligned)
    return heuristics.choose(problem, device, schedule, epilogue, epilogue)


def test_the_transpose_swaps_sides_and_operands():
    p = Problem(300, 500, 700, 2, "float16", a_major="k", b_major="n")
    t = transposed_problem(p)
    # its A is B^T (N-major B: M-major), its B is A^T (K-major A: K-major)
    assert (t.m, t.n, t.k, t.batch, t.dtype, t.a_major, t.b_major) == (
        500, 300, 700, 2, "float16", "m", "k")
    assert transposed_problem(t) == p
    cfg = PersistentSchedule.deepest("float16", 128, t.trans_a, t.trans_b, 232448)
    assert PersistentSchedule.kernel_problem(p, cfg) is p
    assert PersistentSchedule.kernel_problem(p, replace(cfg, trans_c=True)) == t
    gemv = GemvConfig.default("float16", False, True, 16, trans_c=True)
    assert GemvSchedule.kernel_problem(p, gemv) == t


def test_only_plain_products_through_tma_on_the_persistent_kernels():
    cfg = PersistentSchedule.deepest("bfloat16", 256, True, False, 232448)
    for bad in (dict(epilogue=EpilogueSpec("relu")), dict(row_store=True),
                dict(a_pitch_mod8=3, trans_a=False)):
        with pytest.raises(ValueError, match="trans_c"):
            replace(cfg, trans_c=True, **bad)
    ok = {name for name, s in SCHEDULES.items() if s.transposed_store_ok}
    assert ok == {"persistent", "persistent_overlap"}
    for name, sched in SCHEDULES.items():
        if name in ok:
            continue
        shape = sched.tile_shapes()[0]
        other = sched.deepest("bfloat16", shape[1], False, True, 232448, shape[0])
        with pytest.raises(ValueError, match="no trans_c"):
            sched.check(replace(other, trans_c=True))
    src = PersistentOverlapSchedule.render(replace(
        PersistentOverlapSchedule.deepest("bfloat16", 192, True, False, 232448),
        trans_c=True))
    assert "kTransC = true" in src.source and "_ct_" in src.name
    assert PersistentOverlapSchedule.consumer_roles(replace(
        PersistentOverlapSchedule.deepest("bfloat16", 192, True, False, 232448), trans_c=True)
    ) == "2 warpgroups share each 128x192 tile of C^T, 64 rows each"


@pytest.mark.parametrize("device", DEVICES, ids=["h100", "h200"])
@pytest.mark.parametrize("m,n,k", [(11008, 256, 5248), (5696, 448, 4224), (1728, 1856, 7040)])
def test_products_the_transpose_fits_in_fewer_waves(device, m, n, k):
    """E.g. 11008 x 256: 86 tiles of 128 x 256 (0.65 waves, half the SMs idle), against 116
    of the transpose's 128 x 192 (2 x 58)."""
    c = choose(m, n, k, device)
    assert c.config.trans_c and c.schedule in (PersistentSchedule, PersistentOverlapSchedule)
    assert c.reason.startswith(f"computed as C^T = B^T A^T ({n} x {m}) and stored transposed")
    picked = c.instead
    assert picked is not None and not picked.config.trans_c and picked.tail is None
    problem, flipped = Problem(m, n, k, 1, "bfloat16"), Problem(n, m, k, 1, "bfloat16", "m", "k")
    assert (c.config.trans_a, c.config.trans_b) == (flipped.trans_a, flipped.trans_b)
    us = heuristics._persistent_us(c.schedule, flipped, device, c.config)
    assert heuristics.estimate_us(c, problem, device) == pytest.approx(us)
    assert (heuristics._persistent_us(picked.schedule, problem, device, picked.config)
            >= heuristics.TRANSPOSE_MIN_GAIN * us)
    # every layout: the transpose's operands are the same arrays read the other way
    for a_major, b_major in (("m", "n"), ("k", "k"), ("m", "k")):
        assert choose(m, n, k, device, a_major, b_major).config.trans_c


def test_where_the_pick_stays():
    m, n, k = 11008, 256, 5248
    assert not choose(m, n, k, epilogue=True).config.trans_c            # a fused epilogue
    assert not choose(m, n, k, schedule="persistent").config.trans_c    # a forced schedule
    assert not choose(m, n, k, b_pitch_aligned=False).config.trans_c    # B's clusters
    assert not choose(4096, 4096, 4096).config.trans_c                  # nothing to gain
    # the narrow tile keeps its problems (NOTES v0.33), and so do wave tails and stream-K
    narrow = choose(20032, 64, 1728)
    assert narrow.config.block_n == heuristics.NARROW_BLOCK_N and not narrow.config.trans_c
    tail = choose(17344, 128, 6848)
    assert tail.tail is not None and not tail.config.trans_c


@pytest.mark.parametrize("device", DEVICES, ids=["h100", "h200"])
def test_the_rule_on_random_products(device):
    """On random shapes: a transposed choice is the persistent kernels' tile on the transpose,
    at least TRANSPOSE_MIN_GAIN ahead of the pick it displaced by the wave model; a plain
    persistent pick (not the narrow tile's, not store-bound) is never that far behind it."""
    rng = random.Random(58)
    moved = 0
    for _ in range(400):
        m, n, k = (int(2 ** rng.uniform(8, 15)) // 64 * 64 for _ in range(3))
        heuristics.choose.cache_clear()
        problem = Problem(m, n, k, 1, "bfloat16")
        c = heuristics.choose(problem, device)
        if c.config.trans_c:
            moved += 1
            pick, flipped = c.instead, transposed_problem(problem)
            assert (heuristics._persistent_us(pick.schedule, problem, device, pick.config)
                    >= heuristics.TRANSPOSE_MIN_GAIN
                    * heuristics._persistent_us(c.schedule, flipped, device, c.config))
            assert c.tail is None and c.schedule in heuristics.TAIL_MAIN_SCHEDULES
        elif (c.schedule in heuristics.TAIL_MAIN_SCHEDULES and c.tail is None
              and c.config.block_n != heuristics.NARROW_BLOCK_N
              and not heuristics._store_bound(problem, device)):
            assert heuristics._transposed_choice(c, problem, device) is None, (m, n, k)
    assert 10 < moved < 100


@pytest.mark.parametrize("device", DEVICES, ids=["h100", "h200"])
def test_against_a_wave_tail_or_stream_k_the_lower_model_wins(device):
    """Where stream-K or a wave tail would also take the pick, the transposed choice runs
    only where its wave model is below theirs (NOTES v0.58)."""
    p = Problem(4800, 256, 30272, 1, "bfloat16")   # 76 tiles of 128 x 128 over 473 k-blocks
    c = choose(4800, 256, 30272, device)
    assert c.config.trans_c and "us by the model of stream_k 128x" in c.reason, c.reason
    heuristics.choose.cache_clear()
    with pytest.MonkeyPatch.context() as mp:   # the rival it beat
        mp.setattr(heuristics, "TRANSPOSE_MIN_GAIN", float("inf"))
        rival = heuristics.choose(p, device)
    assert rival.schedule.name == "stream_k"
    assert heuristics._choice_us(c, p, device) < heuristics._rival_us(rival, p, device)
    p = Problem(8768, 256, 12096, 1, "bfloat16")   # the tail's two kernels ahead
    c = choose(8768, 256, 12096, device)
    assert c.tail is not None and not c.config.trans_c
    transposed = heuristics._transposed_choice(c.tail.whole, p, device)
    assert transposed is not None
    assert heuristics._rival_us(c, p, device) <= heuristics._choice_us(transposed, p, device)


def test_the_displaced_choice_serves_rows_and_phase_maps():
    problem = Problem(11008, 256, 5248, 1, "bfloat16")
    c = choose(11008, 256, 5248)
    assert c.config.trans_c
    assert heuristics.phaseable(c) is c.instead
    rows = heuristics.row_store_choice(c, problem, H100_SXM_CLUSTERS)
    assert rows == heuristics.row_store_choice(c.instead, problem, H100_SXM_CLUSTERS)
    assert rows.config.row_store and not rows.config.trans_c
    # a transposed choice itself is read through no phase maps (its operands are copied)
    assert heuristics.phased_choice(c, 3, 0, problem, H100_SXM_CLUSTERS, 2) is None
    # an autotuned one displaced none: its result goes through an aligned buffer
    assert heuristics.row_store_choice(replace(c, instead=None), problem,
                                       H100_SXM_CLUSTERS) is None


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))


@pytest.mark.usefixtures("table")
def test_autotune_entries_of_the_transpose():
    problem = Problem(11008, 256, 5248, 1, "bfloat16")
    key = tuning.problem_key(problem, H100_SXM)
    tuning.record({key: tuning.TunedEntry("persistent_overlap", 192, 4, 8, 500.0, "d",
                                          trans_c=True)})
    c = tuning.lookup(problem, H100_SXM)
    assert c.config.trans_c and (c.config.trans_a, c.config.trans_b) == (True, False)
    assert "stored transposed" in c.reason and tuning.label(c).startswith(
        "persistent_overlap 128x192 C^T ")
    assert tuning.lookup(problem, H100_SXM, epilogue=True) is None   # no fused epilogue
    for bad in (dict(schedule="pingpong", block_n=128), dict(trans_c="yes")):
        fields = dict(schedule="persistent_overlap", block_n=192, stages=4, raster_group=8,
                      tflops=1.0, when="d", trans_c=True)
        tuning.record({key: tuning.TunedEntry(**{**fields, **bad})})
        assert tuning.lookup(problem, H100_SXM) is None


def test_config_names_carry_the_transpose():
    cfg = KernelConfig("float16", 128, 4, True, False)
    assert "_ct_" not in cfg.tag and replace(cfg, trans_c=True).tag.endswith("_ct_TT")

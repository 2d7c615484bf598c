"""CPU: the tiles past a problem's last whole wave as a second kernel (heuristics.Tail): when
the model takes it, how the problem is cut, and the launches it makes (against the simulated
GPU of test_cpu_simulated_launch, which computes each launch's part from its maps, base
addresses and integers alone)."""
import math
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import api, device, fastpath, heuristics, launch, layout, tuning
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import PersistentSchedule, SplitKParallelSchedule

import test_cpu_simulated_launch as simulated
from test_cpu_simulated_launch import SimulatedLaunch, expect, rand

simulated_gpu = simulated.simulated_gpu   # the fixture, for four_sms below


def choose(m, n, k, batch=1, a_major="k", b_major="n", device=H100_SXM, epilogue=False,
           schedule=None):
    return heuristics.choose(Problem(m, n, k, batch, "bfloat16", a_major, b_major), device,
                             schedule, epilogue)


@pytest.mark.parametrize("m,n,k,axis,start", [
    (17344, 128, 6848, "m", 16896),    # 136 tiles of 128 x 128: 132 in a wave, 4 left
    (17196, 128, 4096, "m", 16896),
    (462, 20000, 4096, "n", 16896),    # 4 x 79 tiles of 128 x 256: 66 columns fill two waves
    (5120, 5120, 5120, "m", 4992),     # 800 tiles of 128 x 256: 780 in whole waves
])
def test_tiles_past_whole_waves_run_as_a_tail(m, n, k, axis, start):
    c = choose(m, n, k)
    assert c.tail is not None and (c.tail.axis, c.tail.start) == (axis, start)
    assert c.schedule in heuristics.TAIL_MAIN_SCHEDULES
    step = c.config.block_m if axis == "m" else c.config.block_n
    main, tail = c.tail.problems(Problem(m, n, k, 1, "bfloat16"))
    assert start % step == 0 and getattr(main, axis) == start
    assert getattr(tail, axis) == (m if axis == "m" else n) - start
    # the main part fills whole waves but for less than one row (column) of tiles
    tiles = heuristics._tiles(main, c.config.block_m, c.config.block_n)
    across = -(-n // c.config.block_n) if axis == "m" else -(-m // c.config.block_m)
    assert tiles // H100_SXM.sm_count >= 1 and -tiles % H100_SXM.sm_count < across
    assert c.tail.choice.schedule is not heuristics.GemvSchedule
    assert "as a problem of their own" in c.reason and "by the wave model" in c.reason
    assert " + tail " in tuning.label(c)


def test_the_model_of_the_split_beats_the_whole_by_the_margin():
    problem = Problem(17344, 128, 6848, 1, "bfloat16")
    c = heuristics.choose(problem, H100_SXM)
    whole_us = heuristics._choice_us(c.tail.whole, problem, H100_SXM)
    main, tail = c.tail.problems(problem)
    split_us = (heuristics._persistent_us(c.schedule, main, H100_SXM, c.config)
                + heuristics.TAIL_LAUNCH_US
                + heuristics._choice_us(c.tail.choice, tail, H100_SXM))
    assert split_us * heuristics.TAIL_MIN_GAIN <= whole_us
    # one wave of 132 tiles streaming A from DRAM, then 4 tiles alone: the wave model's two
    # terms (NOTES v0.30: 113 us measured on the whole of the same tiles at 64 columns)
    assert 100 < whole_us < 130


def test_wave_model_counts_the_last_wave():
    """A last wave of few tiles costs a compute-bound tile's main loop at little load."""
    cfg = PersistentSchedule.deepest("bfloat16", 256, False, True,
                                     H100_SXM.smem_per_block_optin, 128)
    one = heuristics._persistent_us(PersistentSchedule, Problem(128 * 132, 256, 8192, 1,
                                                                "bfloat16"), H100_SXM, cfg)
    more = heuristics._persistent_us(PersistentSchedule, Problem(128 * 133, 256, 8192, 1,
                                                                 "bfloat16"), H100_SXM, cfg)
    assert 1.6 < more / one < 1.9


@pytest.mark.parametrize("m,n,k", [
    (16896, 128, 4096),   # exactly one wave of 128 x 128
    (4096, 4096, 4096),   # 3.88 waves: the last nearly full
    (8192, 8192, 8192),   # the cluster kernel's pairs: not a schedule the model times
    (1000, 1000, 64),     # under one wave
])
def test_no_tail_where_waves_are_whole_or_the_model_does_not_apply(m, n, k):
    assert choose(m, n, k).tail is None


def test_no_tail_for_a_forced_schedule():
    assert choose(17344, 128, 6848, schedule="persistent").tail is None


def test_fused_epilogues_and_batches_take_tails_too():
    fused = choose(17344, 128, 6848, epilogue=True)
    assert fused.tail is not None and fused.tail.start == 16896
    batched = choose(17344, 128, 6848, batch=2)
    # 272 tiles: two whole waves hold 132 rows of tiles of both matrices
    assert batched.tail is not None and batched.tail.start == 16896
    spec = object()
    with_spec = heuristics.with_epilogue(fused, spec)
    assert with_spec.config.epilogue is spec and with_spec.tail.choice.config.epilogue is spec
    assert with_spec.tail.whole.config.epilogue is spec


def test_a_result_stored_by_rows_keeps_the_tail_only_where_both_parts_store_rows():
    problem = Problem(17344, 128, 6848, 1, "bfloat16")
    c = heuristics.choose(problem, H100_SXM)
    assert c.tail.choice.schedule is SplitKParallelSchedule   # no row store: the whole instead
    stored = heuristics.row_store_choice(c, problem, H100_SXM)
    assert stored.tail is None and stored.config.row_store
    assert stored.config.block_n == c.tail.whole.config.block_n
    # both parts on persistent kernels: both store rows
    both = replace(c, tail=replace(c.tail, choice=c.tail.whole))
    stored = heuristics.row_store_choice(both, problem, H100_SXM)
    assert stored.tail is not None
    assert stored.config.row_store and stored.tail.choice.config.row_store


# ---- the launches, on the simulated GPU (a device of 4 SMs, so that small problems take
# ---- tails) -----------------------------------------------------------------------------

FOUR_SMS = replace(H100_SXM, sm_count=4)


@pytest.fixture
def four_sms(simulated_gpu, monkeypatch):
    monkeypatch.setattr(device, "query", lambda device_id: FOUR_SMS)
    monkeypatch.setattr(launch, "query", lambda device_id: FOUR_SMS)
    # The tails' launches, with the transposed product (whose wave model takes some of these
    # small products on four SMs; tests/test_transposed_cpu.py) out of their way.
    monkeypatch.setattr(heuristics, "TRANSPOSE_MIN_GAIN", math.inf)
    heuristics.choose.cache_clear()
    yield
    heuristics.choose.cache_clear()


TAIL_CASES = {   # (m, k, n, A transposed, B transposed, axis of the tail)
    "rows": (632, 4096, 128, False, False, "m"),
    "rows_a_transposed": (632, 4096, 128, True, False, "m"),
    "rows_b_transposed": (632, 4096, 128, False, True, "m"),
    "rows_wide_tiles": (600, 4096, 256, False, False, "m"),
    "columns": (200, 4096, 832, False, False, "n"),
    "columns_b_transposed": (200, 4096, 832, False, True, "n"),
    "columns_persistent_tail": (640, 4096, 832, False, False, "n"),
}


def _operands(m, k, n, a_t, b_t):
    a = rand((k, m)).T if a_t else rand((m, k))
    b = rand((n, k)).T if b_t else rand((k, n))
    return a, b


def _fused_reference(a, b, bias, c, alpha, beta):
    acc = np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32))
    y = alpha * acc + beta * np.asarray(c, np.float32) + np.asarray(bias, np.float32)
    return np.maximum(y, 0)


FUSED_TAIL_CASES = {   # (m, k, n, axis): tails also for an epilogue that reads bias and c
    "rows": (632, 4096, 128, "m"),
    "columns": (200, 4096, 1280, "n"),
    "columns_persistent_tail": (640, 4096, 832, "n"),
}


@pytest.mark.parametrize("bias_form", ["columns", "rows"])
@pytest.mark.parametrize("case", FUSED_TAIL_CASES, ids=list(FUSED_TAIL_CASES))
def test_simulated_tail_with_a_fused_epilogue(four_sms, case, bias_form):
    """bias, c, alpha, beta and relu on both parts: the tail's bias and c pointers moved to
    its first row (column), its extents its own."""
    m, k, n, axis = FUSED_TAIL_CASES[case]
    a, b = rand((m, k)), rand((k, n))
    bias = rand((n,)) if bias_form == "columns" else rand((m, 1))
    c = rand((m, n))
    keywords = dict(bias=bias, c=c, alpha=0.5, beta=2.0, activation="relu")
    text = hopmm.explain(a, b, **keywords)
    assert f"\ntail: {'rows' if axis == 'm' else 'columns'} " in text and "fused" in text
    for _ in range(2):   # the first call, then a repeat through its remembered launches
        got = hopmm.matmul(a, b, **keywords)
        ref = _fused_reference(a, b, keywords["bias"], keywords["c"], 0.5, 2.0)
        got = np.asarray(got, np.float32)
        assert np.linalg.norm(got - ref) <= 1e-2 * np.linalg.norm(ref)
        keywords.update(bias=rand(bias.shape), c=rand(c.shape))   # new bias and c pointers
    assert fastpath._recipes, "the fused call with a tail was remembered"


@pytest.mark.parametrize("m,k,n,axis", [(800, 4096, 128, "m"), (600, 4096, 640, "n"),
                                        (600, 16384, 128, "m")])
def test_simulated_batched_tail(four_sms, m, k, n, axis):
    a, b = rand((2, m, k)), rand((2, k, n))
    call = api._kernel_call(a, b, layout.matmul_shapes(a.shape, b.shape))
    assert call.choice.tail is not None and call.choice.tail.axis == axis
    expect(a, b, hopmm.matmul(a, b))
    # explain's tail line names the grid the tail's kernel (the last launch) ran on
    tail_line = next(x for x in hopmm.explain(a, b).splitlines() if x.startswith("tail:"))
    assert f"grid {tuple(SimulatedLaunch.last.grid)}" in tail_line, tail_line


@pytest.mark.parametrize("case", TAIL_CASES, ids=list(TAIL_CASES))
def test_simulated_tail_computes_every_part(four_sms, case):
    m, k, n, a_t, b_t, axis = TAIL_CASES[case]
    a, b = _operands(m, k, n, a_t, b_t)
    call = api._kernel_call(a, b, layout.matmul_shapes(a.shape, b.shape))
    assert call.choice.tail is not None and call.choice.tail.axis == axis
    text = hopmm.explain(a, b)
    assert f"tail: {'rows' if axis == 'm' else 'columns'} {call.choice.tail.start}-" in text
    out = rand((m, n))
    out[...] = np.nan
    expect(a, b, hopmm.matmul(a, b, out=out))
    main = heuristics.tail_problems(call.problem, axis, call.choice.tail.start)[0]
    expected = len(launch.build_launches(replace(call.choice, tail=None), main, call.a3,
                                         call.a_map, call.b3, call.b_map, out[None]))
    assert SimulatedLaunch.launches > expected   # the tail's launch(es) after the main part's


def test_simulated_tail_repeats_on_new_operands(four_sms):
    m, k, n = 632, 4096, 128
    a, b = rand((m, k)), rand((k, n))
    expect(a, b, hopmm.matmul(a, b))
    before = SimulatedLaunch.launches
    a2, b2 = rand((m, k)), rand((k, n))
    expect(a2, b2, hopmm.matmul(a2, b2))    # the remembered launches, moved to a2, b2
    assert SimulatedLaunch.launches - before >= 2
    assert len(fastpath._recipes) >= 1


def test_simulated_odd_rows_fall_back_to_the_whole(four_sms):
    """N = 127: the result's rows are not 16-byte aligned; the tail's split-K cannot store
    rows itself, so the call runs on the whole choice with the row store."""
    a, b = rand((600, 4096)), rand((4096, 127))
    text = hopmm.explain(a, b)
    assert "tail:" not in text and "stores the rows itself" in text
    expect(a, b, hopmm.matmul(a, b))

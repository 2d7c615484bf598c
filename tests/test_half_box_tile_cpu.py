"""CPU: the 128 x 160 tile (schedules.HALF_BOX_BLOCK_N). Its plan (B in whole 64-wide boxes,
C staged and stored in boxes of 32 columns), where the heuristic and autotune offer it (where
it fills a wave that 64-wide steps leave idle; never stored transposed nor with B through
phase maps), what it refuses, and a forced product through the launch layer on the simulated
GPU (its maps and grid). Its kernels compile with the rest (tests/test_kernels_cpu.py,
report.kernel_matrix)."""
import random
from dataclasses import replace

import numpy as np
import pytest

from hopmm import heuristics, report, tma, tuning
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (BLOCK_M, ELEM_BYTES, HALF_BOX_BLOCK_N, SCHEDULES, TMA_BOX_ELEMS,
                             WGMMA_M, KernelConfig, b_tile_cols, c_box_bytes, c_box_cols)
from test_cpu_simulated_launch import (SimulatedLaunch, _kernel_name, expect, fake, rand,  # noqa: F401
                                       simulated_gpu)

TILE = (BLOCK_M, HALF_BOX_BLOCK_N)
SMEM = H100_SXM.smem_per_block_optin


def half_box_config(schedule="persistent", trans_b=True, **changes):
    cfg = SCHEDULES[schedule].deepest("bfloat16", TILE[1], False, trans_b, SMEM)
    return replace(cfg, **changes)


def test_the_plan_of_a_half_box():
    cfg = half_box_config()
    assert cfg.half_box
    assert (c_box_cols(cfg), b_tile_cols(cfg)) == (TMA_BOX_ELEMS // 2, 3 * TMA_BOX_ELEMS)
    assert c_box_bytes(cfg) == WGMMA_M * 32 * ELEM_BYTES
    sched = SCHEDULES["persistent"]
    assert sched.stage_bytes(cfg) == (BLOCK_M + 192) * TMA_BOX_ELEMS * ELEM_BYTES
    assert sched.c_boxes(cfg) == 5   # one consumer's 64 rows: five boxes of 32 columns
    assert sched.smem_bytes(cfg) <= SMEM
    whole = half_box_config(block_n=192)
    assert not whole.half_box
    assert (c_box_cols(whole), b_tile_cols(whole)) == (TMA_BOX_ELEMS, 192)


@pytest.mark.parametrize("name", ["persistent", "persistent_overlap"])
def test_the_kernels_that_offer_it(name):
    sched = SCHEDULES[name]
    assert TILE in sched.tile_shapes() and (WGMMA_M, TILE[1]) not in sched.tile_shapes()
    sched.check(half_box_config(name))
    assert any(c.block_n == TILE[1] for c in sched.configs(SMEM))


def wave_problem(**changes):
    """1984 x 1152: 96 tiles of 128 x 192 leave a third of the H100's 132 SMs idle in the one
    wave; 128 tiles of 128 x 160 fill all but four."""
    return replace(Problem(1984, 1152, 2240, 1, "bfloat16", "k", "n", True), **changes)


def test_the_heuristic_takes_it_where_it_fills_the_wave():
    pick = heuristics.choose(wave_problem(), H100_SXM)
    assert (pick.schedule.name, pick.config.block_m, pick.config.block_n) == (
        "persistent", *TILE), heuristics.label(pick)
    assert "128x160 = 0.97 waves" in pick.reason
    # where 192-wide tiles fill their waves as well, the wider tile keeps it (more flops per
    # byte loaded): 2048 x 2304 has 16 x 12 = 192 tiles of 128 x 192, 16 x 15 of 128 x 160
    wide = heuristics.choose(wave_problem(m=2048, n=2304), H100_SXM)
    assert wide.config.block_n != TILE[1], heuristics.label(wide)


def test_autotune_times_it_but_not_stored_transposed():
    p = wave_problem()
    candidates = tuning.candidates(p, H100_SXM)
    assert any(c.config.block_n == TILE[1] and not c.config.trans_c for c in candidates)
    assert not any(c.config.half_box and c.config.trans_c for c in candidates)
    assert any(c.config.trans_c for c in candidates)   # the whole-box tiles are


def test_a_transposed_choice_takes_whole_boxes():
    """The transpose's tile is chosen among whole boxes (a half box of C is never stored
    transposed): where 128 x 160 tiles would fill the transposed product's wave best, another
    width; and no transposed choice of a random draw is a half box."""
    flipped = wave_problem()   # its own pick is the half box
    assert heuristics.choose(flipped, H100_SXM).config.half_box
    _, cfg, _ = heuristics._persistent_tile(SCHEDULES["persistent"], flipped, H100_SXM,
                                            forced=False, epilogue_reads=False, transposed=True)
    assert not cfg.half_box
    rng, transposed = random.Random(5), 0
    for _ in range(2000):
        m, n, k = (rng.randrange(64, 8192, 64) for _ in range(3))
        pick = heuristics.choose(wave_problem(m=m, n=n, k=k), H100_SXM)
        transposed += pick.config.trans_c
        assert not (pick.config.trans_c and pick.config.half_box), heuristics.label(pick)
    assert transposed > 0


def test_one_row_of_tiles_and_ties_with_128_keep_other_tiles(monkeypatch):
    """At most HALF_BOX_MIN_M - 1 rows (one row of tiles streaming B, whose loads of 192
    columns for 160 set the pace) it is not offered; where it saves no more than its area in
    waves over 128 x 128 (the same operand bytes per flop, one stage fewer), 128 x 128 keeps
    the product."""
    one_row = wave_problem(m=128, n=17024, k=6400)
    assert not heuristics.choose(one_row, H100_SXM).config.half_box
    monkeypatch.setattr(heuristics, "HALF_BOX_MIN_M", 0)
    heuristics.choose.cache_clear()
    assert heuristics.choose(one_row, H100_SXM).config.half_box   # the rule is what kept it
    monkeypatch.undo()
    heuristics.choose.cache_clear()
    # 2496 x 3904: 4 waves of 128 x 160 (500 tiles) against 5 of 128 x 128 (620): 1.25 x
    tie = heuristics.choose(wave_problem(m=2496, n=3904, k=640), H100_SXM)
    assert (tie.config.block_m, tie.config.block_n) == (BLOCK_M, 128), heuristics.label(tie)


def test_b_through_phase_maps_leaves_the_half_box():
    """B's rows off 16 bytes (1147 columns): a half-box choice's phased options are the other
    tiles reading B through phase maps, or its own tile with B copied and A phased; never a
    phased half box of B."""
    p = wave_problem(n=1147)
    own = heuristics.choose(p, H100_SXM)
    assert own.config.half_box, heuristics.label(own)
    options = heuristics._phased_options(own, 5, 3, p, H100_SXM, keep_tile=False)
    assert not any(o.config.half_box and o.config.b_pitch_mod8 for o in options)
    assert any(o.config.half_box and o.config.a_pitch_mod8 == 5 for o in options)
    assert any(o.config.b_pitch_mod8 == 3 for o in options)
    kept = heuristics._phased_options(own, 0, 3, p, H100_SXM, keep_tile=True)
    assert kept == []   # an autotuned half box keeps its tile: B from an aligned copy
    for keep_tile in (False, True):
        phased = heuristics.phased_choice(own, 0, 3, p, H100_SXM, 2, keep_tile)
        assert phased is None or not (phased.config.half_box and phased.config.b_pitch_mod8)


def test_schedules_that_cannot_take_it_refuse_it():
    for name, sched in SCHEDULES.items():
        if name in ("persistent", "persistent_overlap") or getattr(sched, "streaming", False):
            continue
        assert TILE not in sched.tile_shapes(), name
        with pytest.raises(ValueError, match="160"):
            sched.check(half_box_config(block_m=BLOCK_M))


def test_what_a_half_box_refuses():
    with pytest.raises(ValueError, match="half a box"):
        half_box_config(trans_c=True)
    with pytest.raises(ValueError, match="half a box"):
        half_box_config(b_pitch_mod8=3)
    assert half_box_config(trans_b=False, a_pitch_mod8=3).a_pitch_mod8 == 3  # A's phases: yes
    with pytest.raises(ValueError, match="block_n must be one of"):
        KernelConfig(dtype="bfloat16", block_n=96, stages=4, trans_a=False, trans_b=True)


def test_the_kernel_matrix_has_no_transposed_or_phased_b_half_box():
    for sched, cfg in report.kernel_matrix(H100_SXM):
        if cfg.half_box:
            assert sched.name in ("persistent", "persistent_overlap")
            assert not cfg.trans_c and not cfg.b_pitch_mod8


@pytest.mark.parametrize("name", ["persistent", "persistent_overlap"])
@pytest.mark.parametrize("m,n,k", [(257, 481, 300), (1, 159, 64), (300, 161, 1000)])
def test_a_forced_product_on_the_simulated_gpu(simulated_gpu, name, m, n, k):  # noqa: F811
    import cupy

    from hopmm import launch, layout, operands
    from hopmm.heuristics import Choice

    rng = np.random.default_rng(m + n + k)
    a = fake(rng.standard_normal((m, k)).astype(np.float16))
    b = fake(rng.standard_normal((k, n)).astype(np.float16))
    shapes = layout.matmul_shapes(a.shape, b.shape)
    call = operands.kernel_operands(a, b, shapes)
    cfg = SCHEDULES[name].deepest("float16", TILE[1], False, True, SMEM)
    out = cupy.zeros((1, m, layout.padded(n, 2)), np.float16)[:, :, :n]
    choice = Choice(SCHEDULES[name], cfg, "test", 4, 1)
    launches = launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, out)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, out.data.ptr)
    last = SimulatedLaunch.last
    # C's box: 32 columns of 64 rows, swizzled over its 64-byte rows
    assert last.templates[2][3] == (32, 64, 1) and last.templates[2][4] == tma.SWIZZLE[64]
    assert (last.tiles_m, last.tiles_n) == (-(-m // 128), -(-n // 160))
    ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
    np.testing.assert_allclose(np.asarray(out[0], np.float32), ref, rtol=2e-2, atol=2e-2)


WAVE_SHAPE = (1984, 2240, 1152)   # m, k, n: the heuristic's half box on the H100 (above)


@pytest.mark.parametrize("case", ["plain", "batched", "fused", "row_store", "b_off_16_bytes"])
def test_the_heuristics_half_box_through_matmul(simulated_gpu, case):  # noqa: F811
    """hopmm.matmul's own pick, end to end on the simulated GPU: the half box launched as
    picked, with a batch, a fused bias and relu, a result whose rows TMA cannot store (the
    row store), and B's rows off 16 bytes (B through phase maps on another tile, or from an
    aligned copy: never a phased half box)."""
    import hopmm

    m, k, n = WAVE_SHAPE
    if case == "b_off_16_bytes":
        n -= 5
    if case == "batched":
        m //= 2   # two matrices of half the rows: as many tiles
    a = rand(((2,) if case == "batched" else ()) + (m, k))
    b = rand(((2,) if case == "batched" else ()) + (k, n))
    if case == "fused":
        bias = rand((n,))
        got = hopmm.matmul(a, b, bias=bias, activation="relu")
        ref = np.maximum(np.asarray(a, np.float32) @ np.asarray(b, np.float32)
                         + np.asarray(bias, np.float32), 0)
        assert np.linalg.norm(np.asarray(got, np.float32) - ref) <= 1e-2 * np.linalg.norm(ref)
    elif case == "row_store":
        buf = fake(np.full((m, n + 3), np.nan, np.asarray(a).dtype))
        out = buf[:, 1:n + 1]
        assert hopmm.matmul(a, b, out=out) is out
        expect(a, b, out)
        assert np.isnan(np.asarray(buf[:, 0], np.float32)).all()
        assert np.isnan(np.asarray(buf[:, n + 1:], np.float32)).all()
    else:
        expect(a, b, hopmm.matmul(a, b))
    name = _kernel_name(SimulatedLaunch.last.function)
    if case == "b_off_16_bytes":
        assert not ("_128x160x64_" in name and "_bp" in name), name
    else:
        assert name.startswith("hopmm_persistent_") and "_128x160x64_" in name, name
        assert ("_rs_" in name) == (case == "row_store"), name

"""CPU: the 128 x 160 tile (schedules.trial_tile_shapes). Its plan (B in whole 64-wide boxes,
C staged and stored in boxes of 32 columns), who may ask for it (named only: neither the
heuristic nor autotune offers it), what it refuses, and a forced product through the launch
layer on the simulated GPU (its maps and grid). Its kernels compile with the rest
(tests/test_kernels_cpu.py, report.kernel_matrix)."""
from dataclasses import replace

import numpy as np
import pytest

from hopmm import heuristics, report, tma, tuning
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (BLOCK_M, ELEM_BYTES, SCHEDULES, TMA_BOX_ELEMS, WGMMA_M,
                             KernelConfig, b_tile_cols, c_box_bytes, c_box_cols)
from test_cpu_simulated_launch import SimulatedLaunch, fake, simulated_gpu  # noqa: F401

TRIAL = (BLOCK_M, 160)
SMEM = H100_SXM.smem_per_block_optin


def trial_config(schedule="persistent", trans_b=True, **changes):
    cfg = SCHEDULES[schedule].deepest("bfloat16", TRIAL[1], False, trans_b, SMEM)
    return replace(cfg, **changes)


def test_the_plan_of_a_half_box():
    cfg = trial_config()
    assert cfg.half_box
    assert (c_box_cols(cfg), b_tile_cols(cfg)) == (TMA_BOX_ELEMS // 2, 3 * TMA_BOX_ELEMS)
    assert c_box_bytes(cfg) == WGMMA_M * 32 * ELEM_BYTES
    sched = SCHEDULES["persistent"]
    assert sched.stage_bytes(cfg) == (BLOCK_M + 192) * TMA_BOX_ELEMS * ELEM_BYTES
    assert sched.c_boxes(cfg) == 5   # one consumer's 64 rows: five boxes of 32 columns
    assert sched.smem_bytes(cfg) <= SMEM
    whole = trial_config(block_n=192)
    assert not whole.half_box
    assert (c_box_cols(whole), b_tile_cols(whole)) == (TMA_BOX_ELEMS, 192)


@pytest.mark.parametrize("name", ["persistent", "persistent_overlap"])
def test_named_only(name):
    sched = SCHEDULES[name]
    assert TRIAL in sched.trial_tile_shapes() and TRIAL not in sched.tile_shapes()
    sched.check(trial_config(name))
    assert any(c.block_n == 160 for c in sched.configs(SMEM))
    p = Problem(1984, 1152, 2240, 1, "bfloat16", "k", "n", True)
    assert all(c.config.block_n != 160 for c in tuning.candidates(p, H100_SXM))
    assert heuristics.choose(p, H100_SXM).config.block_n != 160


def test_schedules_that_cannot_take_it_refuse_it():
    for name, sched in SCHEDULES.items():
        if name in ("persistent", "persistent_overlap") or getattr(sched, "streaming", False):
            continue
        assert TRIAL not in sched.trial_tile_shapes(), name
        with pytest.raises(ValueError, match="160"):
            sched.check(trial_config(block_m=BLOCK_M))


def test_what_a_half_box_refuses():
    with pytest.raises(ValueError, match="half a box"):
        trial_config(trans_c=True)
    with pytest.raises(ValueError, match="half a box"):
        trial_config(b_pitch_mod8=3)
    assert trial_config(trans_b=False, a_pitch_mod8=3).a_pitch_mod8 == 3  # A's phases: yes
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
    cfg = SCHEDULES[name].deepest("float16", TRIAL[1], False, True, SMEM)
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

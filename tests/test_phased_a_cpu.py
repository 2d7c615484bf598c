"""CPU: a K-major A whose rows are not 16-byte aligned, read in place through eight tensor
maps of every eighth row (KernelConfig.a_pitch_mod8): which operands qualify, the maps'
addresses and extents, the config and its shared-memory plan, the heuristic's model, the
launch's grouped map parameter, and the whole call on the simulated GPU (A gathered back
from the eight maps exactly as described, so a wrong offset, lead or extent gives a wrong
product)."""
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import _tensormap, heuristics, launch, layout
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (MIN_STAGES, SCHEDULES, KernelConfig, PersistentSchedule,
                             a_raw_bytes, stage_barriers)
from test_cpu_simulated_launch import (BF16, SimulatedLaunch, expect, fake, rand,  # noqa: F401
                                       simulated_gpu)

LIMIT = H100_SXM.smem_per_block_optin


@pytest.mark.parametrize("shape,strides,address,ok", [
    ((1, 100, 1001), (0, 2002, 2), 0, True),        # odd pitch, base on 16 bytes
    ((1, 100, 1000), (0, 2000, 2), 0, False),       # 2000 bytes: one map reads it
    ((1, 100, 1001), (0, 2002, 2), 2, False),       # base off 16 bytes
    ((1, 7, 1001), (0, 2002, 2), 0, False),         # fewer rows than phases
    ((2, 104, 1001), (208208, 2002, 2), 0, True),   # batch slices 16-byte multiples apart
    ((2, 101, 1001), (202202, 2002, 2), 0, False),  # ... or not
    ((1, 100, 1001), (0, 2, 200), 0, False),        # column-major: not K-major
    ((1, 100, 1001), (0, -2002, 2), 0, False),      # negative pitch
])
def test_which_operands_the_phase_maps_read(shape, strides, address, ok):
    assert layout.phased_rows_ok(shape, strides, 2, address) is ok


@pytest.mark.parametrize("m,k,pitch", [(100, 1001, 1001), (77, 63, 65), (8, 130, 134),
                                       (259, 300, 300)])
def test_phase_maps_address_every_row(m, k, pitch):
    """Element (8 q + j, c) of A lies at map j's (lead_j + c, q): its base 16-byte aligned,
    its pitch eight rows', its first dimension K plus the lead (so what lies past K reads as
    zeros), its rows the phase's; the lead is what the kernel computes from the pitch."""
    a = fake(np.zeros((m, pitch), BF16))[:, :k].reshape(1, m, k)
    specs = launch.phased_specs(a)
    assert len(specs) == layout.A_PHASES
    base = a.data.ptr
    for j, (offset, spec) in enumerate(specs):
        spec.validate()
        lead = (j * (pitch % layout.A_PHASES)) % layout.A_PHASES   # producer_tma.cuh a_lead
        assert spec.address == base + offset and offset % layout.TMA_ALIGN == 0
        assert spec.dims == (k + lead, -(-(m - j) // layout.A_PHASES), 1)
        assert spec.strides_bytes[0] == layout.A_PHASES * pitch * 2
        assert spec.box == (64 + layout.A_PHASES, 64 // layout.A_PHASES, 1)
        assert spec.swizzle == 0
        for q in range(spec.dims[1]):
            for c in (0, k - 1):
                row = layout.A_PHASES * q + j
                assert (spec.address + (lead + c) * 2 + q * spec.strides_bytes[0]
                        == base + (row * pitch + c) * 2)


def test_the_config_names_and_checks_its_pitch_class():
    cfg = KernelConfig("bfloat16", 64, 4, False, True, a_pitch_mod8=5)
    assert "_ap5_" in cfg.tag
    for bad in (dict(a_pitch_mod8=8), dict(a_pitch_mod8=-1), dict(a_pitch_mod8=True),
                dict(a_pitch_mod8=3, trans_a=True), dict(a_pitch_mod8=3, a_rows=16)):
        args = dict(dtype="bfloat16", block_n=64, stages=4, trans_a=False, trans_b=True)
        args.update(bad)
        with pytest.raises(ValueError, match="a_pitch_mod8"):
            KernelConfig(**args)


@pytest.mark.parametrize("name", ["persistent_cluster", "split_k", "split_k_cluster",
                                  "split_k_parallel", "stream_k", "warp_specialized"])
def test_schedules_without_phase_maps_refuse_them(name):
    sched = SCHEDULES[name]
    cfg = next(c for c in sched.configs(LIMIT) if not c.trans_a)
    with pytest.raises(ValueError, match="one map"):
        sched.render(replace(cfg, a_pitch_mod8=3))


def test_the_raw_buffers_take_their_place_in_the_shared_memory_plan():
    """Each stage gets a raw buffer of the tile's rows, a K-block and eight elements each, and
    a third barrier; the phased config keeps as many stages as then fit (the kernel
    static_asserts that the plan is its own)."""
    cfg = PersistentSchedule.deepest("bfloat16", 64, False, True, LIMIT)
    phased = PersistentSchedule.phased_a_config(cfg, 3, LIMIT)
    assert a_raw_bytes(phased) == 128 * (64 + 8) * 2 and stage_barriers(phased) == 3
    assert a_raw_bytes(cfg) == 0 and stage_barriers(cfg) == 2
    assert PersistentSchedule.smem_bytes(phased) <= LIMIT
    assert MIN_STAGES <= phased.stages < cfg.stages
    one_map = replace(phased, a_pitch_mod8=0)
    assert (PersistentSchedule.smem_bytes(phased) - PersistentSchedule.smem_bytes(one_map)
            == phased.stages * (a_raw_bytes(phased) + 8))


def choice_for(m, n, k, dtype="bfloat16"):
    p = Problem(m, n, k, 1, dtype)
    return p, heuristics.choose(p, H100_SXM)


def test_the_model_takes_phase_maps_where_they_beat_cublas_on_such_rows():
    """Enough tiles to stream A from every SM: the phased kernel, its estimate below cuBLAS's
    on rows of 2-byte alignment and below the aligned copy's; few tiles over a long K, where
    its per-CTA k-block time leaves cuBLAS ahead: None (the copy or cuBLAS decides)."""
    p, c = choice_for(26947, 40, 5815)
    phased = heuristics.phased_a_choice(c, 7, p, H100_SXM, 2)
    assert phased is not None and phased.config.a_pitch_mod8 == 7
    assert phased.config.stages >= heuristics.PHASED_A_MIN_STAGES
    assert "eight tensor maps" in phased.reason and "against cuBLAS" in phased.reason
    assert heuristics.phased_a_us(c, p, H100_SXM) < heuristics.cublas_unaligned_us(p, 2)
    p, c = choice_for(5625, 52, 8110, "float16")
    assert heuristics.phased_a_us(c, p, H100_SXM) > heuristics.cublas_unaligned_us(p, 4)
    assert heuristics.phased_a_choice(c, 2, p, H100_SXM, 4) is None


def test_choices_without_phase_maps_stay_on_the_copy():
    p, c = choice_for(1024, 40, 30000)      # few tiles over a long K: split-K
    assert not c.schedule.phased_a_ok
    assert heuristics.phased_a_choice(c, 1, p, H100_SXM, 2) is None
    p, c = choice_for(26947, 40, 5815)
    trimmed = replace(c, config=replace(c.config, a_rows=16))
    assert heuristics.phased_a_choice(trimmed, 1, p, H100_SXM, 2) is None


def test_a_launch_takes_a_group_of_maps_as_one_parameter():
    """The eight maps are one kernel parameter: one base address for them all at launch,
    each map at its own offset (the count is checked before the driver is asked)."""
    a = fake(np.zeros((100, 1001), BF16)).reshape(1, 100, 1001)
    group = [(offset, launch._map_template(spec)) for offset, spec in launch.phased_specs(a)]
    b = fake(np.zeros((1, 1024, 128), BF16))
    template = launch._map_template(launch.matrix_spec(b, "cols", 64))
    kl = _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [group, template, template], [1], 0,
                                 False, (1, 1, 1))
    with pytest.raises(ValueError, match="one base address per tensor map, then 0 pointer"):
        kl.launch(0, *range(1, 11))     # an address per map, not per parameter
    _tensormap.DirectRepeat([kl], (0, 1), (0, 1), None)   # three parameters: A, B and C
    with pytest.raises(ValueError, match="at most 12 tensor maps"):
        _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [group, group], [], 0, False,
                                (1, 1, 1))
    with pytest.raises(ValueError, match="byte offset, template"):
        _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [[template]], [], 0, False, (1, 1, 1))


def unaligned_a(m, k, pitch, batch=()):
    return rand(batch + (m, pitch))[..., :k]


@pytest.mark.parametrize("m,n,k,pitch,batch", [(16001, 24, 2001, 2001, ()),
                                               (8000, 40, 1001, 1003, (2,))])
def test_simulated_phased_a(simulated_gpu, m, n, k, pitch, batch):
    """The whole call on the simulated GPU: no copy of A (no row-copy launch), the phased
    kernel, its product right; a repeat on new arrays reads them (the remembered launch)."""
    a = unaligned_a(m, k, pitch, batch)
    b = rand(batch + (k, n))
    assert "eight tensor maps of every eighth row" in hopmm.explain(a, b)
    expect(a, b, hopmm.matmul(a, b))
    assert SimulatedLaunch.copies == 0 and "_ap" in _last_kernel()
    a2, b2 = unaligned_a(m, k, pitch, batch), rand(batch + (k, n))
    expect(a2, b2, hopmm.matmul(a2, b2))
    assert SimulatedLaunch.copies == 0


def _last_kernel():
    from test_cpu_simulated_launch import _kernel_name
    return _kernel_name(SimulatedLaunch.last.function)


def test_the_phased_tile_is_chosen_by_its_own_model_unless_forced():
    """244 tiles of 128 x 64 take two waves of k-blocks where 122 of 128 x 128 take one: the
    phased kernel moves to the wider tile; a forced (or autotuned) choice keeps its schedule
    and tile."""
    p, c = choice_for(15510, 70, 7941, "float16")
    assert (c.config.block_m, c.config.block_n) == (128, 64)
    moved = heuristics.phased_a_choice(c, 3, p, H100_SXM, 2)
    assert (moved.config.block_m, moved.config.block_n) == (128, 128)
    assert "on 128x128 tiles (fewer waves of k-blocks)" in moved.reason
    p = Problem(8443, 759, 4097, 1, "bfloat16")
    forced = heuristics.choose(p, H100_SXM, "pingpong")
    kept = heuristics.phased_a_choice(forced, 1, p, H100_SXM, 2, keep_tile=True)
    assert kept.schedule is forced.schedule and kept.config.block_n == forced.config.block_n
    assert kept.config.a_pitch_mod8 == 1
    free = heuristics.phased_a_choice(forced, 1, p, H100_SXM, 2)
    assert free.schedule is PersistentSchedule and free.config.block_n != forced.config.block_n


def test_a_declined_phase_map_copies_each_operand_once(simulated_gpu, monkeypatch):
    """Where the choice does not take the phase maps (here: an A too small to be worth it),
    A gets its aligned copy and B keeps the one it already has: one copy of each."""
    copied = []
    real = launch.copy_rows
    monkeypatch.setattr(launch, "copy_rows", lambda dst, src: copied.append(src.shape)
                        or real(dst, src))
    a, b = rand((97, 23)), rand((23, 75))   # rows of 46 and 150 bytes: both off 16 bytes
    assert "eight tensor maps" not in hopmm.explain(a, b)
    copied.clear()
    expect(a, b, hopmm.matmul(a, b))
    assert sorted(copied) == [(1, 23, 75), (1, 97, 23)]

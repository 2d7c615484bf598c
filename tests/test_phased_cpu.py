"""CPU: a K-major A or an N-major B whose rows are not 16-byte aligned, read in place through
eight tensor maps of every eighth row (KernelConfig.a_pitch_mod8, b_pitch_mod8): which
operands qualify, the maps' addresses and extents, the config and its shared-memory plan, the
heuristic's model, the launch's grouped map parameters, and the whole call on the simulated
GPU (each operand gathered back from its eight maps exactly as described, so a wrong offset,
lead or extent gives a wrong product)."""
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import _tensormap, heuristics, launch, layout
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (DUAL_B_SCHEDULES, MIN_STAGES, PHASED_MIN_STAGES, SCHEDULES,
                             KernelConfig, PersistentSchedule, raw_bytes, stage_barriers)
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
    assert len(specs) == layout.PHASES
    base = a.data.ptr
    for j, (offset, spec) in enumerate(specs):
        spec.validate()
        lead = (j * (pitch % layout.PHASES)) % layout.PHASES   # producer_tma.cuh a_lead
        assert spec.address == base + offset and offset % layout.TMA_ALIGN == 0
        assert spec.dims == (k + lead, -(-(m - j) // layout.PHASES), 1)
        assert spec.strides_bytes[0] == layout.PHASES * pitch * 2
        assert spec.box == (64 + layout.PHASES, 64 // layout.PHASES, 1)
        assert spec.swizzle == 0
        for q in range(spec.dims[1]):
            for c in (0, k - 1):
                row = layout.PHASES * q + j
                assert (spec.address + (lead + c) * 2 + q * spec.strides_bytes[0]
                        == base + (row * pitch + c) * 2)


@pytest.mark.parametrize("shape,pitch,batch,merged", [
    ((2, 3, 104, 1001), 1003, (2, 3), True),     # batch dimensions one stride apart
    ((104, 1001), 1005, (4,), True),             # broadcast over the batch
    ((3, 2, 104, 1001), 1003, (2, 3), False),    # swapped batch dimensions: a copy
    ((5, 104, 1001), 1001, (5,), True),
])
def test_the_plan_reads_the_pitch_class_without_making_the_view(shape, pitch, batch, merged):
    """view_pitch_mod8 (what the plan asks, with no GPU work) is pitch_mod8 of the batch view
    the call makes, and 0 where that view would be a copy (batch dimensions no stride
    merges), without making it."""
    from hopmm import operands

    x = fake(np.zeros(shape[:-1] + (pitch,), BF16))[..., :shape[-1]]
    if not merged:
        x = x.swapaxes(0, 1)
    got = operands.view_pitch_mod8(x, False, 0, batch)
    if merged:
        assert got == operands.pitch_mod8(operands.batch_view(x, False, 0, batch)) == pitch % 8
    else:
        assert got == 0


def test_the_config_names_and_checks_its_pitch_classes():
    cfg = KernelConfig("bfloat16", 64, 4, False, True, a_pitch_mod8=5)
    assert "_ap5_" in cfg.tag and "_bp" not in cfg.tag
    assert "_ap5_bp2_" in replace(cfg, b_pitch_mod8=2).tag
    assert "_bp2_" in replace(cfg, a_pitch_mod8=0, b_pitch_mod8=2).tag
    for bad in (dict(a_pitch_mod8=8), dict(a_pitch_mod8=-1), dict(a_pitch_mod8=True),
                dict(a_pitch_mod8=3, trans_a=True), dict(a_pitch_mod8=3, a_rows=16),
                dict(b_pitch_mod8=8), dict(b_pitch_mod8=2.0), dict(b_pitch_mod8=1, trans_b=False)):
        args = dict(dtype="bfloat16", block_n=64, stages=4, trans_a=False, trans_b=True)
        args.update(bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            KernelConfig(**args)


@pytest.mark.parametrize("name", ["persistent_cluster", "split_k_cluster", "stream_k",
                                  "warp_specialized", *DUAL_B_SCHEDULES])
@pytest.mark.parametrize("which", ["a_pitch_mod8", "b_pitch_mod8"])
def test_schedules_without_phase_maps_refuse_them(name, which):
    sched = {**SCHEDULES, **DUAL_B_SCHEDULES}[name]
    cfg = next(c for c in sched.configs(LIMIT) if not c.trans_a and c.trans_b)
    with pytest.raises(ValueError, match="one map"):
        sched.render(replace(cfg, **{which: 3}))


@pytest.mark.parametrize("a_pitch,b_pitch,raw", [
    (3, 0, 128 * (64 + 8) * 2),                  # A: each of the tile's 128 rows
    (0, 5, 2 * 64 * (64 + 8) * 2),               # B: 64 k rows of each 64-column block
    (3, 5, (128 + 2 * 64) * (64 + 8) * 2),       # both
])
def test_the_raw_buffers_take_their_place_in_the_shared_memory_plan(a_pitch, b_pitch, raw):
    """Each stage gets a raw buffer of each phased tile's rows, 64 elements and eight of room
    each, and a third barrier; the phased config keeps as many stages as then fit (the kernel
    static_asserts that the plan is its own)."""
    cfg = PersistentSchedule.deepest("bfloat16", 128, False, True, LIMIT)
    phased = PersistentSchedule.phased_config(cfg, a_pitch, b_pitch, LIMIT)
    assert raw_bytes(phased) == raw and stage_barriers(phased) == 3
    assert raw_bytes(cfg) == 0 and stage_barriers(cfg) == 2
    assert PersistentSchedule.smem_bytes(phased) <= LIMIT
    assert MIN_STAGES <= phased.stages < cfg.stages
    one_map = replace(phased, a_pitch_mod8=0, b_pitch_mod8=0)
    assert (PersistentSchedule.smem_bytes(phased) - PersistentSchedule.smem_bytes(one_map)
            == phased.stages * (raw + 8))


def test_a_phased_a_loads_whole_tiles():
    """split_k_parallel's trimmed A tiles (few rows) load every row again where A is phased
    (its eight maps' boxes are whole 64-row blocks); a phased B alone keeps the trim."""
    sched = SCHEDULES["split_k_parallel"]
    cfg = next(c for c in sched.configs(LIMIT) if c.a_rows == 16 and c.trans_b)
    assert sched.phased_config(cfg, 1, 0, LIMIT).a_rows is None
    assert sched.phased_config(cfg, 0, 1, LIMIT).a_rows == 16


def choice_for(m, n, k, dtype="bfloat16"):
    """The problem and the choice its phase maps would run (phaseable: a stream-K choice's
    displaced pick)."""
    p = Problem(m, n, k, 1, dtype)
    return p, heuristics.phaseable(heuristics.choose(p, H100_SXM))


def test_the_model_takes_phase_maps_where_they_beat_cublas_on_such_rows():
    """Enough tiles to stream A from every SM: the phased kernel, its estimate below cuBLAS's
    on rows of 2-byte alignment and below the aligned copy's; few tiles over a long K: split
    over the SMs, which brings the k-blocks a CTA loads within the margin of cuBLAS's model
    (test_a_split_choice_is_modelled_by_its_slices: where it does not, None)."""
    p, c = choice_for(26947, 40, 5815)
    phased = heuristics.phased_choice(c, 7, 0, p, H100_SXM, 2)
    assert phased is not None and phased.config.a_pitch_mod8 == 7
    assert phased.config.b_pitch_mod8 == 0 and phased.config.stages >= PHASED_MIN_STAGES
    assert "A's rows are not 16-byte aligned" in phased.reason
    assert "eight tensor maps" in phased.reason and "against cuBLAS" in phased.reason
    assert (heuristics.phased_us(phased, p, H100_SXM)
            < heuristics.cublas_unaligned_us(p, 2, H100_SXM))
    p, c = choice_for(5625, 52, 8110, "float16")
    assert not c.schedule.split_k   # 44 tiles of 128 x 64, one wave: split over the SMs
    split = heuristics.phased_choice(c, 2, 0, p, H100_SXM, 4)
    assert split.schedule.split_k and split.splits > 1 and split.config.a_pitch_mod8 == 2
    assert f"K split {split.splits} ways" in split.reason


@pytest.mark.parametrize("schedule", ["persistent_cluster", "stream_k"])
def test_choices_without_phase_maps_stay_on_the_copy(schedule):
    p = Problem(20000, 1000, 3000, 1, "bfloat16", b_pitch_aligned=False)
    c = heuristics.choose(p, H100_SXM, schedule)
    assert not c.schedule.phased_ok
    assert heuristics.phased_choice(c, 1, 3, p, H100_SXM, 2, keep_tile=True) is None


def test_a_split_choice_is_modelled_by_its_slices():
    """Few tiles over a long K: the split-K choice's phased kernel keeps its split count, and
    the model counts one CTA's slice of the k-blocks (here 40 CTAs at the phased k-block rate
    fall behind cuBLAS's model on such rows: the copy or cuBLAS decides)."""
    p, c = choice_for(1024, 40, 30000)
    assert c.schedule.split_k and c.splits > 1
    phased = replace(c, config=c.schedule.phased_config(c.config, 1, 0, LIMIT))
    k_blocks = -(-30000 // 64)
    assert heuristics.cta_k_blocks(phased, p, H100_SXM) == -(-k_blocks // c.splits)
    assert (heuristics.phased_us(phased, p, H100_SXM)
            > heuristics.cublas_unaligned_us(p, 2, H100_SXM))
    assert heuristics.phased_choice(c, 1, 0, p, H100_SXM, 2, keep_tile=True) is None


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
    both = _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [group, group, template], [], 0,
                                   False, (1, 1, 1))   # a phased A and a phased B: 17 maps
    _tensormap.DirectRepeat([both], (0, 1), (0, 1), None)
    with pytest.raises(ValueError, match="at most 20 tensor maps"):
        _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [group, group, group], [], 0, False,
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


def unaligned_b(k, n, pitch, batch=()):
    return rand(batch + (k, pitch))[..., :n]


@pytest.mark.parametrize("m,n,k,b_pitch,a_pitch,tags,copies", [
    (40, 20001, 3000, 20003, 3000, "_bp", 0),        # B alone off 16 bytes
    (33, 14743, 127, 14743, 127, "_ap_bp", 0),       # both, both phased (K of two k-blocks)
    (33, 4517, 2219, 4517, 2219, "_bp", 1),          # both: A copied, B phased, split over K
])
def test_simulated_phased_b(simulated_gpu, monkeypatch, m, n, k, b_pitch, a_pitch, tags,
                            copies):
    """An N-major B of k rows off 16 bytes (and A's rows too) on the simulated GPU: the
    phased kernel of the operands the model phases (_ap, _bp), a copy of any other (A's), the
    product right, and a repeat on new arrays right."""
    copied = []
    real = launch.copy_rows
    monkeypatch.setattr(launch, "copy_rows", lambda dst, src: copied.append(src.shape)
                        or real(dst, src))
    a, b = unaligned_a(m, k, a_pitch), unaligned_b(k, n, b_pitch)
    text = hopmm.explain(a, b)
    assert "eight tensor maps of every eighth row" in text, text
    assert ("from an aligned copy" in text) == bool(copies), text
    copied.clear()
    expect(a, b, hopmm.matmul(a, b))
    name = _last_kernel()
    assert [t for t in ("_ap", "_bp") if t in name] == [t for t in ("_ap", "_bp") if t in tags]
    operand_copies = [shape for shape in copied if len(shape) == 3]   # (the result's: 2-D)
    assert operand_copies == [(1, m, k)] * copies
    a2, b2 = unaligned_a(m, k, a_pitch), unaligned_b(k, n, b_pitch)
    expect(a2, b2, hopmm.matmul(a2, b2))   # (the remembered call copies A its own way)


def _last_kernel():
    from test_cpu_simulated_launch import _kernel_name
    return _kernel_name(SimulatedLaunch.last.function)


def test_the_phased_tile_is_chosen_by_its_own_model_unless_forced():
    """244 tiles of 128 x 64 take two waves of k-blocks where 122 of 128 x 128 take one: the
    phased kernel moves to the wider tile; a forced (or autotuned) choice keeps its schedule
    and tile."""
    p, c = choice_for(15510, 70, 7941, "float16")
    assert (c.config.block_m, c.config.block_n) == (128, 64)
    moved = heuristics.phased_choice(c, 3, 0, p, H100_SXM, 2)
    assert (moved.config.block_m, moved.config.block_n) == (128, 128)
    assert "on persistent's 128x128 tiles (fewer waves of k-blocks)" in moved.reason
    p = Problem(8443, 759, 4097, 1, "bfloat16")
    forced = heuristics.choose(p, H100_SXM, "pingpong")
    kept = heuristics.phased_choice(forced, 1, 0, p, H100_SXM, 2, keep_tile=True)
    assert kept.schedule is forced.schedule and kept.config.block_n == forced.config.block_n
    assert kept.config.a_pitch_mod8 == 1
    free = heuristics.phased_choice(forced, 1, 0, p, H100_SXM, 2)
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

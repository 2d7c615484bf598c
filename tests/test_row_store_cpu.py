"""CPU: the row store (KernelConfig.row_store: the epilogue writes output rows that are not
16-byte aligned itself, epilogue_tma_store.cuh). Every schedule that offers it compiles it for
sm_90a on each of its tiles, plain and with the fullest fused chain, without spills and with
element stores instead of TMA stores in its SASS; the others refuse it; which results it
takes (layout.row_store_strides, api._output_store); and whole calls on the simulated GPU
write odd rows in place, with no aligned buffer and no copy."""
import re
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import api, compile as compiler, heuristics, layout, sass
from hopmm.device import H100_SXM
from hopmm.epilogue import EpilogueSpec
from hopmm.problem import Problem
from hopmm.schedules import ALL_SCHEDULES, SCHEDULES
from test_cpu_simulated_launch import (BF16, SimulatedLaunch, expect, fake, rand,  # noqa: F401
                                       simulated_gpu)

ROW_STORE = sorted(name for name, s in SCHEDULES.items() if s.row_store_ok)
FULLEST = EpilogueSpec("gelu_tanh", bias=True, c=True)
SMEM = H100_SXM.smem_per_block_optin


def _cases():
    """(schedule, config) of every row-store schedule's tiles (bf16, plain layout) and its
    widest tile with the fullest chain in fp16."""
    out = []
    for name in ROW_STORE:
        sched = SCHEDULES[name]
        for block_m, block_n in sched.tile_shapes():
            cfg = sched.deepest("bfloat16", block_n, False, False, SMEM, block_m)
            if cfg is not None and sched.row_store_fits(cfg):
                out.append((sched, replace(cfg, row_store=True)))
                # the whole row block staged at once (heuristics._whole_row_staging)
                whole = replace(cfg, row_store=True, c_buffers=min(
                    block_n // 64, sched.c_boxes(cfg)))
                whole = replace(whole, stages=min(cfg.stages, sched.max_stages(whole, SMEM)))
                if whole != out[-1][1] and sched.row_store_fits(whole):
                    out.append((sched, whole))
        for block_m, block_n in sched.tile_shapes():
            cfg = sched.deepest("float16", block_n, True, True, SMEM, block_m)
            fused = replace(cfg, row_store=True, epilogue=FULLEST)
            if sched.row_store_fits(fused):
                out.append((sched, fused))
    return out


CASES = _cases()


@pytest.mark.parametrize("sched,cfg", CASES, ids=[s.kernel_name(c) for s, c in CASES])
def test_row_store_kernels_compile_without_spills(sched, cfg):
    kernel = compiler.compile_kernel(sched.render(cfg))
    assert "_rs_" in kernel.name
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    assert r.problems(sched.smem_bytes(cfg), SMEM) == []
    tool = sass.find_cuobjdump()
    if tool is None:
        return
    listing = sass.cached_listing(kernel.cubin_path, tool)
    s = sass.summarize_listing(listing)
    assert s.counts["local_memory"] == 0 and s.counts["hgmma"] > 0
    assert s.counts["tma_store"] == 0, "a row store issues no TMA store"
    assert re.search(r"STG\.E\s", listing) and "STG.E.U16" in listing   # pairs, elements
    assert sass.global_access_before_dependency_wait(listing) == []


def test_row_store_source_takes_the_output_by_address():
    sched = SCHEDULES["persistent"]
    cfg = sched.deepest("bfloat16", 256, False, False, SMEM)
    plain, rows = sched.render(cfg), sched.render(replace(cfg, row_store=True))
    assert "kRowStore = true;" in rows.source and "kRowStore = false;" in plain.source
    assert "address_in_map_slot(&map_c)" in rows.source and "out_row_stride" in rows.source
    assert "int out_m, int out_n" in rows.source and "int out_m" not in plain.source
    assert rows.name == plain.name.replace("_NT", "_rs_NT") and rows.source_hash != plain.source_hash


@pytest.mark.parametrize("name", sorted(set(ALL_SCHEDULES) - set(ROW_STORE) - {"gemv"}))
def test_schedules_that_store_through_tma_only_refuse_a_row_store(name):
    sched = ALL_SCHEDULES[name]
    cfg = sched.configs(SMEM)[0]
    with pytest.raises(ValueError, match="row_store"):
        sched.render(replace(cfg, row_store=True))


def test_no_row_store_where_registers_are_short():
    """Two 64 x 192 accumulator sets leave 40 registers a thread: a row store spilled there,
    so such configs refuse it (the call copies its result instead); 64 x 128 sets take it."""
    sched = SCHEDULES["persistent_overlap"]
    cfg = replace(sched.deepest("bfloat16", 192, False, False, SMEM), row_store=True)
    assert not sched.row_store_fits(cfg)
    with pytest.raises(ValueError, match="row_store"):
        sched.render(cfg)
    assert sched.row_store_fits(replace(sched.deepest("bfloat16", 128, False, False, SMEM),
                                        row_store=True, epilogue=FULLEST))
    assert SCHEDULES["persistent"].row_store_fits(
        replace(SCHEDULES["persistent"].deepest("bfloat16", 256, False, False, SMEM),
                row_store=True, epilogue=FULLEST))


def test_row_store_strides():
    f = layout.row_store_strides
    assert f((1, 5, 7), (70, 14, 2), 2) == (7, 0)          # one contiguous matrix
    assert f((3, 5, 7), (70, 14, 2), 2) == (7, 35)         # a contiguous batch
    assert f((1, 5, 7), (0, 22, 2), 2) == (11, 0)          # a strided out
    assert f((1, 1, 7), (0, 0, 2), 2) == (0, 0)            # one row: never stepped over
    assert f((1, 5, 7), (0, 12, 2), 2) is None             # rows that overlap
    assert f((1, 5, 7), (0, -14, 2), 2) is None            # reversed rows
    assert f((1, 5, 7), (0, 28, 4), 2) is None             # a column stride
    assert f((1, 5, 7), (0, 15, 2), 2) is None             # half-element rows
    assert f((2, 5, 7), (40, 14, 2), 2) is None            # slices that overlap
    assert f((1, 5, 7), (0, 2 * 2**31, 2), 2) is None      # past the kernel's 32-bit strides


def test_output_store_decisions():
    shapes = lambda m, n, batch=(): layout.matmul_shapes(batch + (m, 64), (64, n))  # noqa: E731
    itemsize = 2
    assert api._output_store(None, shapes(100, 64), itemsize) == "tma"
    assert api._output_store(None, shapes(100, 63), itemsize) == "rows"
    assert api._output_store(None, shapes(100, 63, (3,)), itemsize) == "rows"
    strided = fake(np.zeros((100, 70), BF16))[:, 1:64]
    assert api._output_store(strided, shapes(100, 63), itemsize) == "rows"
    assert api._output_store(strided, shapes(100, 63), itemsize, overlapping=True) == "copy"
    every_other = fake(np.zeros((100, 128), BF16))[:, ::2]
    assert api._output_store(every_other, shapes(100, 64), itemsize) == "copy"
    batched_view = fake(np.zeros((3, 100, 70), BF16))[:, :, :63]
    assert api._output_store(batched_view, shapes(100, 63, (3,)), itemsize) == "copy"


def _last_kernel() -> str:
    """The name of the kernel the simulated GPU launched last."""
    from test_cpu_simulated_launch import _kernel_name

    return _kernel_name(SimulatedLaunch.last.function)


def test_odd_rows_are_stored_in_place_on_the_simulated_gpu(simulated_gpu, monkeypatch):
    """An odd N: one row-store launch writes the result, with no aligned buffer of the
    result's shape and no copy into it (B, of odd rows too, is copied as before); the repeat
    does the same."""
    from hopmm import launch

    buffers, copies = [], []
    real_empty, real_copy = launch.padded_empty, launch.copy_rows
    monkeypatch.setattr(launch, "padded_empty",
                        lambda *a: buffers.append(a[1:3]) or real_empty(*a))
    monkeypatch.setattr(launch, "copy_rows",
                        lambda dst, src: copies.append(dst.shape) or real_copy(dst, src))
    a, b = rand((300, 96)), rand((96, 137))
    for _ in range(2):
        got = hopmm.matmul(a, b)
        expect(a, b, got)
        assert "_rs_" in _last_kernel()
    assert (300, 137) not in buffers and buffers == [(96, 137)]   # B's copy, first call
    assert all(shape[-2:] != (300, 137) for shape in copies)
    assert SimulatedLaunch.launches == 2


def test_strided_out_keeps_its_gaps_on_the_simulated_gpu(simulated_gpu):
    a, b = rand((50, 80)), rand((80, 30))
    buf = fake(np.full((50, 37), np.nan, BF16))
    out = buf[:, 3:33]
    for _ in range(2):
        assert hopmm.matmul(a, b, out=out) is out
        expect(a, b, out)
        assert "_rs_" in _last_kernel()
        assert np.isnan(np.asarray(buf[:, :3], np.float32)).all()
        assert np.isnan(np.asarray(buf[:, 33:], np.float32)).all()


def test_explain_names_the_row_store(simulated_gpu):
    a, b = rand((300, 96)), rand((96, 137))
    text = hopmm.explain(a, b)
    assert "output: the epilogue stores the rows itself" in text and "_rs_" in text
    assert "output: TMA stores into the result" in hopmm.explain(a, rand((96, 136)))


def test_a_result_stored_by_rows_does_not_count_toward_the_copy_route(simulated_gpu):
    """Short K, odd N: only B's small copy is made (the result is stored by rows), so the
    call runs on hopmm's kernels; counting the result's copy (32 MB) would have routed it."""
    from hopmm import heuristics
    from hopmm.device import H100_SXM
    from hopmm.problem import Problem

    a, b = rand((4000, 64)), rand((64, 4001))
    assert hopmm.plan(a, b).path == "kernel"
    result_bytes = 4000 * 4001 * 2
    problem = Problem(4000, 4001, 64, 1, a.dtype.name)
    assert heuristics.copy_route_reason(problem, H100_SXM, b.nbytes + result_bytes, 2) is not None
    assert "stores the rows itself" in hopmm.explain(a, b)


def test_what_the_copy_route_weighs(simulated_gpu):
    """The copy route's inputs: the product as it would run on the copies (each operand along
    its own contiguous axis) and the rows' alignment cuBLAS reads them at (the largest power of
    two up to 8 bytes dividing the bases, the strides and the result's pitch)."""
    def shapes(a, b):
        return layout.matmul_shapes(a.shape, b.shape)

    a, b = fake(np.zeros((300, 98), BF16)), fake(np.zeros((98, 62), BF16))
    assert a.data.ptr % 16 == 0 and b.data.ptr % 16 == 0
    assert api._row_alignment(a, b, shapes(a, b)) == 4          # 196- and 124-byte rows
    a2 = fake(np.zeros((300, 97), BF16))
    assert api._row_alignment(a2, b[:97], shapes(a2, b[:97])) == 2   # 194-byte rows
    a8, b8 = fake(np.zeros((300, 100), BF16)), fake(np.zeros((100, 64), BF16))
    assert api._row_alignment(a8, b8, shapes(a8, b8)) == 8          # 200- and 128-byte rows
    p = api._copied_problem(a, b, shapes(a, b))
    assert (p.m, p.n, p.k, p.a_major, p.b_major) == (300, 62, 98, "k", "n")
    bt = fake(np.zeros((62, 98), BF16)).T                      # B stored as its transpose
    assert api._copied_problem(a, bt, shapes(a, bt)).b_major == "k"


def test_a_call_the_overlap_kernel_would_copy_runs_on_the_single_set_kernel(simulated_gpu):
    """400 x 6335 x 1024 (one whole wave of 128 x 192 tiles): the heuristic's 128 x 192
    overlap tile has no registers for the row store; the call runs the same tile on the
    persistent kernel, storing its rows itself, and says so; forced onto the overlap kernel it
    copies its result as before."""
    a, b = rand((400, 1024)), rand((1024, 6335))
    text = hopmm.explain(a, b)
    assert "schedule: persistent\n" in text and "_128x192x64_" in text and "_rs_" in text
    assert "would copy the result" in text
    expect(a, b, hopmm.matmul(a, b))
    assert _last_kernel().startswith("hopmm_persistent_bf16_128x192")
    hopmm.use_schedule("persistent_overlap")
    assert "through an aligned buffer" in hopmm.explain(a, b)
    expect(a, b, hopmm.matmul(a, b))
    assert "_rs_" not in _last_kernel()


def test_the_fullest_kernel_signature_fits_the_launchers_integers():
    """The launcher (csrc/tensormap.cpp, KernelLaunch) holds at most kMaxInts integer
    arguments: the fullest kernel (a row store and a fused chain with bias and c) must fit,
    and build_launches must pass it as many as its signature takes."""
    from pathlib import Path

    source = (Path(hopmm.__file__).resolve().parent.parent / "csrc" / "tensormap.cpp").read_text()
    limit = int(re.search(r"kMaxInts = (\d+);", source).group(1))
    sched = SCHEDULES["persistent"]
    cfg = replace(sched.deepest("bfloat16", 128, False, True, SMEM), row_store=True,
                  epilogue=FULLEST)
    src = sched.render(cfg).source
    signature = src[src.index(sched.kernel_name(cfg) + "("):]
    signature = signature[:signature.index(") {")]
    ints = len(re.findall(r"\b(?:int|float) [a-z_]+", signature))   # 32-bit words each
    assert ints == 12 + 4 + 9   # the kernel's, the row store's, the fused chain's
    assert ints <= limit


def test_whole_row_staging_where_the_main_loop_is_short():
    """A 128 x 256 row-store config stages its whole row block (4 boxes, one stage fewer)
    where K is short; keeps its ring of 2 where K is long; 128 x 192 stages 3 already."""
    sched = SCHEDULES["persistent"]
    wide = replace(sched.deepest("bfloat16", 256, False, True, SMEM), row_store=True)
    assert (wide.c_buffers, wide.stages) == (2, 4)
    for k, expected in ((52, (4, 3)), (4096, (2, 4))):
        cfg = heuristics._whole_row_staging(sched, wide, Problem(25324, 1757, k, 1, "bfloat16"),
                                            H100_SXM)
        assert (cfg.c_buffers, cfg.stages) == expected
    narrow = replace(sched.deepest("bfloat16", 192, False, True, SMEM), row_store=True)
    assert heuristics._whole_row_staging(sched, narrow, Problem(25324, 1757, 52, 1, "bfloat16"),
                                         H100_SXM) == narrow


@pytest.mark.parametrize("k,short", [(52, True), (240, True), (4096, False)])
def test_short_k_row_stores_take_192_wide_tiles_in_groups_of_one(k, short):
    """Short K, rows not 16-byte aligned: the persistent 128 x 256 tile becomes 128 x 192 (its
    whole rows go out faster) and the raster groups one M-tile; long K keeps both."""
    problem = Problem(25324, 1757, k, 1, "bfloat16")
    chosen = heuristics.choose(problem, H100_SXM)
    assert chosen.config.block_n == 256
    c = heuristics.row_store_choice(chosen, problem, H100_SXM)
    assert c.config.row_store
    if short:
        assert (c.config.block_n, c.config.c_buffers, c.raster_group) == (192, 3, 1)
        assert "the store sets the pace" in c.reason
    else:
        assert (c.config.block_n, c.raster_group) == (256, chosen.raster_group)
    forced = heuristics.row_store_choice(chosen, problem, H100_SXM, forced=True)
    assert forced.config.block_n == 256

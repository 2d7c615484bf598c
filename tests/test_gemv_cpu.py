"""CPU: the gemv schedule's kernels render and compile for sm_90a without local memory and
keep the programmatic-launch rule; its configs and launch geometry; the heuristic's choices
(decode shapes take gemv, larger M and calls with a fused epilogue do not)."""
import re
from dataclasses import replace

import pytest

from hopmm import compile as compiler
from hopmm import heuristics, sass
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (ALL_SCHEDULES, GEMV_COUNTERS, GEMV_MAX_ROWS, SCHEDULES,
                             GemvConfig, GemvSchedule)

CONFIGS = GemvSchedule.configs()
# A CTA of 256 threads gets at most this many registers per thread (65536 / 256).
REGISTER_FILE = 65536


def _chosen_configs() -> list:
    """The configs the heuristic picks for decode problems of 1-16 rows or columns, both B
    layouts and both 16-bit dtypes: the quick tier compiles these; `-m kernels` all of them."""
    picked = []
    for dtype in ("bfloat16", "float16"):
        for m, n, k in ((1, 8192, 8192), (4, 8192, 8192), (16, 8192, 8192), (8192, 8, 4096)):
            for b_major in ("k", "n"):
                problem = Problem(m=m, n=n, k=k, batch=1, dtype=dtype, b_major=b_major)
                choice = heuristics.choose(problem, H100_SXM, "gemv")
                if choice.config not in picked:
                    picked.append(choice.config)
    return picked


QUICK_CONFIGS = _chosen_configs()


@pytest.fixture(scope="module")
def _gemv_cache(request, _private_kernel_cache):
    """The gemv kernels the selected tests check, with their SASS listings, compiled into the
    session's cache once, in one process per CPU (the tests below then hit the cache)."""
    from hopmm import report

    wanted = {item.callspec.params["compiled"] for item in request.session.items
              if "compiled" in getattr(getattr(item, "callspec", None), "params", {})}
    report.fill_cache([(GemvSchedule, cfg) for cfg in CONFIGS if cfg in wanted])


@pytest.fixture(scope="module", ids=[c.tag for c in CONFIGS], params=[
    pytest.param(c, marks=() if c in QUICK_CONFIGS else pytest.mark.kernels) for c in CONFIGS])
def compiled(request, _gemv_cache):
    cfg = request.param
    return cfg, compiler.compile_kernel(GemvSchedule.render(cfg))


def test_the_quick_tier_compiles_both_loops_of_the_heuristics_picks():
    """The quick tier's gemv kernels are registered configs and cover the CUDA-core and the
    tensor-core loops, both B layouts and the transposed (few columns) case."""
    assert all(c in CONFIGS for c in QUICK_CONFIGS)
    assert {c.mma for c in QUICK_CONFIGS} == {False, True}
    assert {c.trans_b for c in QUICK_CONFIGS} == {False, True}
    assert any(c.trans_c for c in QUICK_CONFIGS)
    assert len(QUICK_CONFIGS) < len(CONFIGS)


def test_every_config_the_heuristic_picks_is_registered():
    """What the kernel matrix checks is what runs: the heuristic's gemv picks over a seeded
    random set of decode problems (few rows or few columns, any K, every layout) are all
    registered configs."""
    import random

    rng = random.Random(18)
    for _ in range(400):
        few, many = rng.randint(1, 16), rng.randint(17, 20000)
        m, n = (few, many) if rng.random() < 0.5 else (many, few)
        problem = Problem(m=m, n=n, k=rng.randint(1, 20000), batch=rng.randint(1, 3),
                          dtype=rng.choice(["bfloat16", "float16"]),
                          a_major=rng.choice("km"), b_major=rng.choice("kn"))
        choice = heuristics.choose(problem, H100_SXM, "gemv")
        assert choice.config in CONFIGS, (problem, choice.config)


def test_compiles_without_spills(compiled):
    cfg, kernel = compiled
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    assert r.problems(GemvSchedule.smem_bytes(cfg), H100_SXM.smem_per_block_optin) == []
    assert r.registers <= REGISTER_FILE // cfg.threads


def test_sass_streams_on_the_intended_units(compiled):
    """CUDA-core FMAs (or, for 8-16 rows, mma.m16n8k16 with fp32 accumulators) on 128-bit
    loads, no wgmma, TMA or local memory, nothing global before griddepcontrol.wait (launches
    are programmatic), the next kernel let in."""
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    cfg, kernel = compiled
    listing = sass.cached_listing(kernel.cubin_path, tool)
    s = sass.summarize_listing(listing)
    assert s.arch == "sm_90a"
    assert s.counts["hgmma"] == 0 and s.counts["tma_load"] == 0
    assert s.counts["local_memory"] == 0
    # B: 16-byte loads that allocate no L1 line and prefetch 256 B into L2 (ld_stream_v4)
    assert re.search(r"\bLDG\.E\.NA\.LTC256B\.128\b", listing)
    if cfg.mma:
        assert "HMMA.16816.F32" in listing
    else:
        assert "FFMA" in listing and "HMMA" not in listing
    assert s.counts["dependency_wait"] == 1 and s.counts["launch_dependents"] == 0
    assert sass.global_access_before_dependency_wait(listing) == []


def test_gemv_is_registered_apart_from_the_tile_schedules():
    assert "gemv" in ALL_SCHEDULES and "gemv" not in SCHEDULES
    assert ALL_SCHEDULES["gemv"] is GemvSchedule


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_rows=3), "max_rows"), (dict(warps=0), "warps"),
    (dict(trans_b=True, cols=2, unroll=8), "cols"), (dict(trans_b=True, cols=1, unroll=4), "unroll"),
    (dict(dtype="float32"), "dtype"), (dict(mma=True), "max_rows"),
    (dict(mma=True, max_rows=16, cols=4), "cols"),
    (dict(mma=True, max_rows=8, unroll=0), "unroll")])
def test_config_validates(kwargs, match):
    base = dict(dtype="bfloat16", trans_a=False, trans_b=False, max_rows=4)
    with pytest.raises(ValueError, match=match):
        GemvConfig(**{**base, **kwargs})


@pytest.mark.parametrize("rows,max_rows", [(1, 1), (2, 2), (3, 4), (7, 8), (9, 16), (16, 16),
                                           (40, 16)])
def test_default_rows_step(rows, max_rows):
    assert GemvConfig.default("bfloat16", False, False, rows).max_rows == max_rows


def test_tags_name_every_tunable():
    cfg = GemvConfig("float16", True, False, 8, warps=4, cols=2, unroll=3)
    assert GemvSchedule.kernel_name(cfg) == "hopmm_gemv_f16_m8_w4_c2_u3_TT"
    assert cfg.block_n == 8 and cfg.threads == 128
    assert GemvConfig("bfloat16", False, True, 1, cols=1, unroll=8).block_n == 256
    swapped = GemvConfig("bfloat16", False, True, 1, cols=1, unroll=8, trans_c=True)
    assert GemvSchedule.kernel_name(swapped) == "hopmm_gemv_bf16_m1_w8_c1_u8_ct_NN"
    # Tensor cores: a K-major warp owns 16 columns, an N-major CTA 64.
    tc = GemvConfig("bfloat16", False, False, 16, warps=8, cols=1, unroll=4, mma=True)
    assert GemvSchedule.kernel_name(tc) == "hopmm_gemv_bf16_m16_w8_c1_u4_tc_NT"
    assert tc.block_n == 128 and tc.inflight_bytes == 8 * 4 * 32 * 16 * 2
    assert replace(tc, trans_b=True, unroll=1).block_n == 64


def test_grid_and_scratch():
    p = Problem(20, 1000, 4096, 3, "bfloat16", b_major="k")
    cfg = GemvConfig.default("bfloat16", False, False, 20)   # 16 rows, 128 columns a CTA
    assert cfg.mma and GemvSchedule.tiles(p, cfg) == (2, 8)
    assert GemvSchedule.grid(p, cfg, 3, splits=4) == (16, 4, 3)
    assert GemvSchedule.scratch_bytes(p, cfg, 3, 1) == 0
    assert GemvSchedule.scratch_bytes(p, cfg, 3, 4) == GEMV_COUNTERS * 4 + 16 * 3 * 4 * 16 * 128 * 4
    # a 32-element chunk of K per split at the least on tensor cores, a vector on CUDA cores
    GemvSchedule.grid(p, cfg, 3, splits=4096 // 32)
    with pytest.raises(ValueError, match="splits"):
        GemvSchedule.grid(p, cfg, 3, splits=4096 // 32 + 1)
    fma = GemvConfig.default("bfloat16", False, False, 4)
    assert GemvSchedule.max_splits(p, fma, 3) == 4096 // 8
    # more tiles than counters: unsplit only
    wide = Problem(1, 8 * 32 * GEMV_COUNTERS, 64, 1, "bfloat16", b_major="k")
    assert GemvSchedule.max_splits(wide, GemvConfig.default("bfloat16", False, False, 1), 1) == 1


# The decode shapes (M x N x K) and the tuning set's that gemv streams at the DRAM rate
# (from 8 rows on tensor cores: the CUDA-core FMAs bind there, bench/NOTES.md v0.18).
DECODE = [(1, 8192, 8192), (2, 8192, 8192), (4, 8192, 8192), (8, 8192, 8192),
          (1, 4096, 4096), (4, 14336, 4096), (16, 8192, 8192), (16, 28672, 8192),
          (16, 14336, 4096)]


# N-major B takes gemv on one row (from two, the tile kernels: the tests below).
DECODE_CASES = [(m, n, k, b_major) for m, n, k in DECODE for b_major in "kn"
                if b_major == "k" or m <= heuristics.GEMV_N_MAJOR_MAX_ROWS]


@pytest.mark.parametrize("m,n,k,b_major", DECODE_CASES,
                         ids=[f"{m}x{n}x{k}_{b}" for m, n, k, b in DECODE_CASES])
def test_decode_shapes_take_gemv(m, n, k, b_major):
    p = Problem(m, n, k, 1, "bfloat16", b_major=b_major)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is GemvSchedule and c.config.max_rows >= m
    assert c.config.trans_b == (b_major == "n")
    assert "gemv" in c.reason and "predicted" in c.reason
    # the grid keeps the bytes in flight the model asks for, or splits as far as K allows
    tiles = GemvSchedule.tiles(p, c.config)
    ctas = tiles[0] * tiles[1] * c.splits
    assert (ctas * c.config.inflight_bytes >= H100_SXM.sm_count * heuristics.GEMV_INFLIGHT_PER_SM
            or c.splits == k // heuristics.GEMV_MIN_SPLIT_K)


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m,n,k", [(16, 8192, 8192), (16, 28672, 8192), (8, 8192, 8192)])
def test_rows_of_eight_to_sixteen_stream_on_tensor_cores(m, n, k, b_major):
    """16 x 8192 x 8192 ran the FMA loops at 0.44-0.49 of the copy bandwidth (v0.18), 8 x 8192
    x 8192 at 12 TFLOP/s of FMAs (v0.29): 8-16 rows take the mma loops, whose model is bound by
    B's bytes alone, at their measured stream rate (v0.21). K-major B then takes gemv; N-major
    B, whose mma loop streams at 2.35 TB/s, stays on the tile kernels (v0.29: 8 x 8192 x 8192
    19.7 TFLOP/s on the persistent tiles against 12.1 on gemv's FMA loops)."""
    p = Problem(m, n, k, 1, "bfloat16", b_major=b_major)
    est = {}
    for mma in (True, False):
        cfg = GemvConfig.default("bfloat16", False, b_major == "n", m, mma=mma)
        est[mma] = heuristics.gemv_estimate_us(p, cfg, heuristics.gemv_splits(p, cfg, H100_SXM),
                                               H100_SXM)
    rate = heuristics.GEMV_MMA_DRAM_TBPS[b_major]
    stream = (n * k + m * k + m * n) * 2 / (rate * 1e6)
    assert stream < est[True] < 1.2 * stream
    # gemv (forced or not) takes the loops the model finds faster: tensor cores from 8 rows.
    forced = heuristics.choose(p, H100_SXM, "gemv")
    assert forced.config.mma == (est[True] <= est[False])
    assert forced.config.mma
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule.name == ("persistent" if b_major == "n" else "gemv")


@pytest.mark.parametrize("m,n,k,narrow", [
    (16, 17856, 2816, True), (8, 17088, 4032, True), (6, 18880, 5696, True),
    (16, 8192, 8192, False),     # 128 column blocks of 64 still need a split: 8 warps, split
    (16, 28672, 8192, False),    # 224 column blocks of 128 need no split: 8 warps, unsplit
])
def test_narrow_tensor_core_ctas_instead_of_a_k_split(m, n, k, narrow):
    """K-major B on tensor cores: where 128-column CTAs need a K split to keep the SMs
    streaming and 64-column CTAs (half the warps, twice the chunks each: the same bytes in
    flight) need none, the narrow ones run unsplit (NOTES v0.36: 1.13 x on 24 problems)."""
    p = Problem(m, n, k, 1, "bfloat16", b_major="k")
    wide = GemvConfig.default("bfloat16", False, False, m)
    assert heuristics._gemv_splits_wanted(p, wide, H100_SXM) > 1 or not narrow
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is GemvSchedule and c.config.mma
    if narrow:
        assert heuristics._gemv_splits_wanted(p, wide, H100_SXM) > 1
        assert c.config == wide.narrow() and c.splits == 1
        assert (c.config.warps, c.config.unroll) == (wide.warps // 2, wide.unroll * 2)
        assert c.config.inflight_bytes == wide.inflight_bytes
        assert c.config.block_n == wide.block_n // 2
    else:
        assert c.config == wide
    assert ("half-width CTAs" in c.reason) == narrow
    assert c.config in CONFIGS


@pytest.mark.parametrize("m,n,k", [(15104, 6, 13568), (18176, 16, 4608)])
def test_narrow_ctas_not_where_a_is_gathered(m, n, k):
    """Few columns run as C^T = B^T A^T, whose A (the problem's row-major B) is M-major and
    gathered element by element: there the narrow CTAs ran 0.84 x the wide ones (14 problems,
    NOTES v0.36), so the wide config keeps its split."""
    p = Problem(m, n, k, 1, "bfloat16", b_major="n")
    c = heuristics.choose(p, H100_SXM, "gemv")
    assert c.schedule is GemvSchedule and c.config.trans_c and c.config.trans_a
    assert c.config.mma and c.config.narrow() is None
    assert c.config == GemvConfig.default("bfloat16", True, False, n, True)
    assert "half-width CTAs" not in c.reason


@pytest.mark.parametrize("m,n,k", [(2, 8192, 8192), (4, 8192, 8192), (3, 2816, 7488),
                                   (12, 5184, 3648), (4, 14336, 4096)])
def test_n_major_b_from_two_rows_takes_the_tiles(m, n, k):
    """gemv's N-major loops stream B up to 50 % below their model from two rows (NOTES v0.35):
    the tile kernels take such problems (their one-wave 64 x 128 tiles or split_k_parallel's),
    whichever estimate gemv's would have beaten; forced, gemv still runs them; a K-major B of
    as many rows, and one row of an N-major B, keep gemv."""
    p = Problem(m, n, k, 1, "bfloat16", b_major="n")
    assert m > heuristics.GEMV_N_MAJOR_MAX_ROWS >= 1
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule.name in ("persistent", "persistent_overlap", "split_k_parallel")
    assert c.config.block_m == 64 and "gemv" not in c.reason
    assert heuristics.choose(p, H100_SXM, "gemv").schedule is GemvSchedule
    k_major = Problem(m, n, k, 1, "bfloat16", b_major="k")
    assert heuristics.choose(k_major, H100_SXM).schedule is GemvSchedule
    one_row = Problem(1, n, k, 1, "bfloat16", b_major="n")
    assert heuristics.choose(one_row, H100_SXM).schedule is GemvSchedule


@pytest.mark.parametrize("m", [17, 64, 128, 4096])
def test_more_rows_do_not_take_gemv(m):
    c = heuristics.choose(Problem(m, 8192, 8192, 1, "bfloat16"), H100_SXM)
    assert c.schedule is not GemvSchedule


@pytest.mark.parametrize("a_major,b_major", [("k", "k"), ("k", "n"), ("m", "k"), ("m", "n")])
@pytest.mark.parametrize("m,n,k", [(8192, 1, 8192), (8192, 4, 8192), (28672, 4, 8192)])
def test_few_columns_take_gemv_transposed(m, n, k, a_major, b_major):
    """C^T = B^T A^T: the kernel's rows are the problem's columns, its A is B^T (K-major where
    B is), its B is A^T (K-major where A is)."""
    p = Problem(m, n, k, 1, "bfloat16", a_major, b_major)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is GemvSchedule and c.config.trans_c and "C^T = B^T A^T" in c.reason
    kp = GemvSchedule.kernel_problem(p, c.config)
    assert (kp.m, kp.n, kp.k) == (n, m, k)
    assert kp.trans_a == (b_major == "n") and kp.trans_b == (a_major == "m")
    assert (c.config.trans_a, c.config.trans_b) == (kp.trans_a, kp.trans_b)
    assert GemvSchedule.tiles(kp, c.config)[0] == 1


def test_many_columns_and_rows_do_not_transpose():
    assert heuristics.choose(Problem(8192, 17, 8192, 1, "bfloat16"),
                             H100_SXM).schedule is not GemvSchedule


@pytest.mark.parametrize("m,n,k", [(1, 8192, 8192), (16, 28672, 8192)])
def test_epilogue_calls_never_take_gemv(m, n, k):
    p = Problem(m, n, k, 1, "bfloat16", b_major="k")
    assert heuristics.choose(p, H100_SXM, epilogue=True).schedule is not GemvSchedule
    with pytest.raises(ValueError, match="epilogue"):
        heuristics.choose(p, H100_SXM, "gemv", epilogue=True)


def test_forced_gemv_takes_any_rows():
    p = Problem(100, 300, 70, 2, "float16", b_major="k")
    c = heuristics.choose(p, H100_SXM, "gemv")
    assert c.schedule is GemvSchedule and c.config.max_rows == 16 and "forced" in c.reason
    assert GemvSchedule.grid(p, c.config, 2, splits=c.splits)[0] == 7 * -(-300 // c.config.block_n)
    # M-major A with N-major B: groups of 16 rows on tensor cores, 8 on the CUDA cores.
    tn = heuristics.choose(Problem(100, 300, 70, 2, "float16", a_major="m"), H100_SXM, "gemv")
    assert tn.config.trans_a and tn.config.trans_b
    assert tn.config.max_rows == (16 if tn.config.mma else 8)
    assert GemvConfig.default("float16", True, True, 100, mma=False).max_rows == 8


def test_model_terms():
    est = heuristics.gemv_estimate_us
    cfg = GemvConfig.default("bfloat16", False, False, 1)
    p = Problem(1, 8192, 8192, 1, "bfloat16", b_major="k")
    floor = 8192 * 8192 * 2 / (heuristics.GEMV_DRAM_TBPS * 1e6)
    assert est(p, cfg, 1, H100_SXM) == pytest.approx(floor + heuristics.GEMV_LAUNCH_US, rel=0.01)
    # splitting adds its hand-off; too few CTAs lose bandwidth
    assert est(p, cfg, 2, H100_SXM) > est(p, cfg, 1, H100_SXM)
    few = Problem(1, 256, 8192, 1, "bfloat16", b_major="k")
    assert est(few, cfg, 1, H100_SXM) > 2 * est(few, cfg, 8, H100_SXM) - heuristics.GEMV_LAUNCH_US
    # rows past max_rows read B again
    big = GemvConfig.default("bfloat16", False, False, 16)
    p16, p32 = (Problem(m, 8192, 8192, 1, "bfloat16", b_major="k") for m in (16, 32))
    assert est(p32, big, heuristics.gemv_splits(p32, big, H100_SXM), H100_SXM) > \
        1.8 * est(p16, big, heuristics.gemv_splits(p16, big, H100_SXM), H100_SXM)


@pytest.mark.parametrize("rows", [2, 3, 4])
def test_few_rows_of_k_major_b_stream_at_the_memory_bound(rows):
    """The K-major CUDA-core loops of 2-4 rows ran at the memory bound on an H200 (16-21
    TFLOP/s at 8 and 16 rows), not at the N-major loops' 12 (NOTES v0.53): with that DRAM
    (1.44 x the H100's) 2-4 rows of 8192 x 8192 stream B in gemv, where 12 TFLOP/s had sent 3
    and 4 rows to split_k_parallel (41.3-41.6 us against gemv's 36.6-37.0); the 8-row loops,
    one CTA per SM, keep the lower rate, and N-major B keeps the tiles."""
    h200 = replace(H100_SXM, dram_tbps=H100_SXM.dram_tbps * 1.44)
    p = Problem(rows, 8192, 8192, 1, "bfloat16", b_major="k")
    choice = heuristics.choose(p, h200)
    assert choice.schedule is GemvSchedule and not choice.config.mma
    cfg = choice.config
    assert heuristics._gemv_tflops(cfg) == heuristics.GEMV_FMA_K_MAJOR_TFLOPS
    memory_bound = heuristics.gemv_estimate_us(p, cfg, choice.splits, h200)
    n_major_loops = GemvConfig.default("bfloat16", False, True, rows, mma=False)
    assert heuristics._gemv_tflops(n_major_loops) == heuristics.GEMV_FMA_TFLOPS
    compute = 2 * cfg.max_rows * 8192 * 8192 / (heuristics.GEMV_FMA_K_MAJOR_TFLOPS * 1e6)
    assert compute < memory_bound - heuristics.GEMV_LAUNCH_US
    eight = GemvConfig.default("bfloat16", False, False, 8, mma=False)
    assert heuristics._gemv_tflops(eight) == heuristics.GEMV_FMA_TFLOPS
    n_major = heuristics.choose(Problem(rows, 8192, 8192, 1, "bfloat16", b_major="n"), h200)
    assert n_major.schedule is not GemvSchedule


def test_max_rows_steps_cover_the_heuristic_limit():
    assert GEMV_MAX_ROWS[-1] >= heuristics.GEMV_MAX_M


@pytest.mark.parametrize("m,n,k,b_major,rival,instead", [
    (16, 28672, 8192, "k", "the persistent tiles'", "persistent"),
    (1, 8192, 8192, "k", "split_k_parallel's", "persistent"),
    (16, 8192, 8192, "k", "split_k_parallel's", "persistent"),
    (1, 8192, 8192, "n", "split_k_parallel's", "persistent"),
    (1, 2048, 16384, "k", "split_k_parallel's", "split_k_parallel")])
def test_gemv_is_weighed_against_the_64_row_tiles(m, n, k, b_major, rival, instead):
    """gemv's rival is split_k_parallel's model of its 64-row tiles where they split, else
    the persistent tiles rated at the unsplit 64-row tile (v0.23), and gemv's reason names
    which. A fused call, which gemv cannot take, runs the 64-row tiles where they split and
    beat the unsplit tiles (64 x 128 on the persistent kernel, v0.34), else those."""
    p = Problem(m, n, k, 1, "bfloat16", b_major=b_major)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule.name == "gemv"
    assert f"against {rival}" in c.reason
    assert heuristics.choose(p, H100_SXM, epilogue=True).schedule.name == instead


H200_LIKE = replace(H100_SXM, dram_tbps=H100_SXM.dram_tbps * 1.44)


def _gemv_rival(p, device):
    """heuristics._gemv_rival beside the tile kernels' choice for `p`, as choose asks it."""
    return heuristics._gemv_rival(
        p, device, lambda: heuristics._choose_one(p, device, None, False, False, gemv=False))


@pytest.mark.parametrize("device", [H100_SXM, H200_LIKE], ids=["h100", "h200"])
@pytest.mark.parametrize("m,n,k", [(9472, 16, 20544), (2304, 16, 8640), (7744, 8, 3072)])
def test_few_columns_gathering_a_are_weighed_against_the_tiles(device, m, n, k):
    """Where gemv's transposed loops would gather their A (B^T of a row-major B, 8-16 columns)
    they are weighed against the lower of split_k_parallel's estimate and the tile kernels' own
    choice at its model's time (NOTES v0.59): these products, where the tiles ran 1.6-2.2 x
    faster on an H200, take the tiles, and gemv's model is above that rival."""
    p = Problem(m, n, k, 1, "bfloat16", b_major="n")
    c = heuristics.choose(p, device)
    assert c.schedule is not GemvSchedule
    gemv = heuristics.choose(p, device, "gemv")
    assert gemv.config.mma and gemv.config.trans_c and heuristics._gathers_a(gemv.config)
    rival_us, what = _gemv_rival(p, device)
    tiles_us = heuristics.estimate_us(c, p, device)
    split_k = heuristics._tile_rival(p, device)
    assert rival_us == pytest.approx(min(tiles_us, split_k[0] if split_k else tiles_us))
    assert (heuristics.label(c) in what) == (rival_us == tiles_us)
    assert heuristics.estimate_us(gemv, p, device) >= rival_us


@pytest.mark.parametrize("m,n,k,b_major", [(10878, 16, 23664, "k"), (8192, 4, 8192, "n"),
                                           (16, 8192, 8192, "n")])
def test_gemv_keeps_its_rival_where_it_gathers_nothing(m, n, k, b_major):
    """A K-major B (B^T read by vectors), fewer than 8 columns (the CUDA-core loops, not
    measured against the tiles) and few-row products keep split_k_parallel's estimate as
    gemv's rival, or none; the first takes gemv."""
    p = Problem(m, n, k, 1, "bfloat16", b_major=b_major)
    assert _gemv_rival(p, H100_SXM) == heuristics._tile_rival(p, H100_SXM)
    if b_major == "k":
        assert heuristics.choose(p, H100_SXM).schedule is GemvSchedule


@pytest.mark.parametrize("rows", [8, 16])
@pytest.mark.parametrize("mma", [True, False])
def test_a_gathered_stretches_the_transposed_stream(monkeypatch, rows, mma):
    """The transposed loops over an M-major B^T (B's rows contiguous) stream 1 + rows x
    GEMV_M_MAJOR_A_ROW_COST times as long as over a K-major one, tensor-core and CUDA-core
    loops alike (so that the stretch does not move gemv between them; their FMA bound is
    lifted here to compare the streams); rows read in place keep their own model."""
    monkeypatch.setattr(heuristics, "GEMV_FMA_TFLOPS", 1e9)
    k_major = Problem(9472, rows, 20544, 1, "bfloat16", b_major="k")
    m_major = replace(k_major, b_major="n")
    times = []
    for p in (k_major, m_major):
        cfg = GemvConfig.default("bfloat16", p.trans_b, False, rows, True, mma)
        assert cfg.trans_a == (p is m_major) and cfg.max_rows == rows
        assert heuristics._gathers_a(cfg) == (p is m_major)
        times.append(heuristics.gemv_estimate_us(p, cfg, 1, H100_SXM) - heuristics.GEMV_LAUNCH_US)
    stretch = 1 + rows * heuristics.GEMV_M_MAJOR_A_ROW_COST
    assert times[1] == pytest.approx(times[0] * stretch, rel=1e-3)
    in_place = GemvConfig.default("bfloat16", True, False, rows, True, mma, in_place=True)
    assert not heuristics._gathers_a(in_place)


@pytest.mark.parametrize("m,n,k,b_major,rival", [
    (9472, 16, 20544, "n", "the tile kernels' (persistent 128x64"),
    (4, 8192, 8192, "n", "split_k_parallel's")])
def test_the_tiles_reason_names_gemv_where_its_model_lost(m, n, k, b_major, rival):
    """Where unforced gemv was weighed and its model lost, the tile kernels' choice says so
    (hopmm.explain's model terms): gemv's estimate against the rival's."""
    p = Problem(m, n, k, 1, "bfloat16", b_major=b_major)
    c = heuristics.choose(p, H200_LIKE)
    assert c.schedule is not GemvSchedule
    gemv_us = heuristics.estimate_us(heuristics.choose(p, H200_LIKE, "gemv"), p, H200_LIKE)
    assert f"gemv {gemv_us:.1f} us by its model, against {rival}" in c.reason


def test_the_reason_leaves_gemv_out_where_a_rule_not_its_model_declined_it():
    """Two rows of an N-major B: gemv's loops are declined by GEMV_N_MAJOR_MAX_ROWS, not by its
    model, which reads them ahead of the tiles there; the reason does not claim otherwise."""
    p = Problem(2, 8192, 8192, 1, "bfloat16", b_major="n")
    c = heuristics.choose(p, H100_SXM)
    gemv_us = heuristics.estimate_us(heuristics.choose(p, H100_SXM, "gemv"), p, H100_SXM)
    rival_us = heuristics._tile_rival(p, H100_SXM)[0]
    assert c.schedule is not GemvSchedule and gemv_us < rival_us
    assert "gemv " not in c.reason

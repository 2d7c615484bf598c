"""CPU: stream-K in lanes (schedules.StreamKSchedule) — its lanes, launch geometry and
workspace, the forced choice and its model, the heuristic's rule for sub-wave grids over a
long K, its place in autotune, the rendered kernel's hand-off order; and the heuristic's
store-bound rule for short K."""
import math
import random
import re
from dataclasses import replace

import pytest

from hopmm import heuristics, tuning
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS
from hopmm.epilogue import EpilogueSpec
from hopmm.problem import LINE_BYTES, Problem
from hopmm.schedules import SCHEDULES, PersistentSchedule, StreamKSchedule as SK

# An H200 as the heuristic sees it: the H100's SMs and clusters, HBM3e's 4.81 TB/s.
H200 = replace(H100_SXM_CLUSTERS, name="NVIDIA H200 (assumed)", dram_tbps=4.81)


@pytest.fixture
def without_transpose(monkeypatch):
    """Stream-K's rule on its own: the transposed product, whose model beats stream-K's on some
    of these products (its rule: tests/test_transposed_cpu.py), out of the way."""
    monkeypatch.setattr(heuristics, "TRANSPOSE_MIN_GAIN", math.inf)
    heuristics.choose.cache_clear()
    yield
    heuristics.choose.cache_clear()


def problem(m, n, k, batch=1, dtype="bfloat16"):
    return Problem(m, n, k, batch, dtype, "k", "n")


def in_place(m, n, k):
    """problem() with B's rows read where they lie: lines of whole cache lines only where N
    fills them (b_pitch_aligned), as kernel_operands describes a contiguous B."""
    return replace(problem(m, n, k), b_pitch_aligned=n * 2 % LINE_BYTES == 0)


def config(width, p):
    return SK.deepest(p.dtype, width, p.trans_a, p.trans_b, H100_SXM.smem_per_block_optin)


def test_lanes_are_rows_or_columns_of_tiles():
    """Raster groups of one M-tile walk rows of tiles (a lane per M-tile), groups of every
    M-tile walk columns (a lane per N-tile); as many CTAs a lane as the SMs allow."""
    p = problem(1472, 896, 9472)   # 12 x 7 tiles of 128 x 128, 148 k-blocks
    cfg = config(128, p)
    assert (SK.lane_tiles(p, cfg, 1), SK.lanes(p, cfg, 1)) == (7, 12)
    assert (SK.lane_tiles(p, cfg, 12), SK.lanes(p, cfg, 12)) == (12, 7)
    assert SK.lanes(p, cfg, 16) == 7   # a group past every M-tile is all of them
    assert not SK.lanes_are_columns(p, cfg, 1) and SK.lanes_are_columns(p, cfg, 16)
    assert SK.most_ctas(p, cfg, 1, 1, 132) == 12 * 11
    assert SK.most_ctas(p, cfg, 1, 12, 132) == 7 * 18
    assert SK.most_ctas(p, cfg, 1, 1, 8) == 0          # more lanes than SMs
    tiny = problem(129, 64, 64)                        # 2 tiles of one k-block each
    assert SK.most_ctas(tiny, config(128, tiny), 1, 2, 132) == 2


@pytest.mark.parametrize("group", [1, 2])
def test_one_row_of_tiles_is_one_lane(group):
    """A problem of one M-tile is one lane whatever the group (a lane per tile would hold its
    CTAs to a multiple of the tiles: 96 of 132 SMs for 12 tiles)."""
    p = problem(100, 1500, 3000)   # 1 x 12 tiles of 128 x 128, 47 k-blocks
    cfg = config(128, p)
    assert not SK.lanes_are_columns(p, cfg, group)
    assert (SK.lane_tiles(p, cfg, group), SK.lanes(p, cfg, group)) == (12, 1)
    assert SK.most_ctas(p, cfg, 1, group, 132) == 132


@pytest.mark.parametrize("ctas,ok", [(126, True), (7, True), (132, False), (6, False),
                                     (7 * 12 * 148 + 7, False)])
def test_grid_checks(ctas, ok):
    """A whole number of CTAs for each lane, at most one CTA a k-block of the lane, at most one
    CTA an SM (an owner waits for later CTAs of its lane)."""
    p = problem(1472, 896, 9472)
    cfg = config(128, p)
    if ok:
        SK.check_grid(p, cfg, 1, 12, ctas)
        assert SK.grid(p, cfg, 1, 132, ctas) == (ctas, 1, 1)
    else:
        with pytest.raises(ValueError, match="stream_k"):
            SK.check_grid(p, cfg, 1, 12, ctas)
            SK.grid(p, cfg, 1, 132, ctas)
    with pytest.raises(ValueError, match="CTAs on 132 SMs"):
        SK.grid(p, cfg, 1, 132, 133)


def test_workspace_is_a_tile_piece_per_cta():
    p = problem(1472, 896, 9472)
    cfg = config(256, p)
    assert SK.workspace_shape(p, cfg, 1, 132) == (132, 128, 256)
    assert SK.semaphore_count(p, cfg, 1, 132) == 132 * 2
    assert SK.workspace and not SK.workspace_map and SK.pointers == 2


def test_forced_stream_k_takes_a_model_choice_that_fits():
    """Forced, stream-K takes the tile and lane direction its model puts fastest among those
    whose lanes' own operand fits L2, with as many CTAs a lane as the SMs allow."""
    p = problem(3264, 448, 20416)   # A 133 MB: lanes must be columns (B, 18 MB, re-read)
    c = heuristics.choose(p, H100_SXM, "stream_k")
    assert c.schedule is SK
    tiles_m = -(-p.m // c.config.block_m)
    assert c.raster_group == tiles_m
    lanes = SK.lanes(p, c.config, c.raster_group)
    assert c.splits == H100_SXM.sm_count // lanes * lanes
    SK.check_grid(p, c.config, 1, c.raster_group, c.splits)
    assert "stream-K" in c.reason and "predicted" in c.reason
    every = heuristics.stream_k_choices(p, H100_SXM)
    assert len(every) == 6
    fitting = [x for x in every if x.raster_group == tiles_m]
    assert heuristics._choice_us(c, p, H100_SXM) == min(
        heuristics._choice_us(x, p, H100_SXM) for x in fitting)


def test_forced_stream_k_on_tiny_problems():
    """One tile of one k-block: one lane of one CTA; at most a CTA a k-block everywhere."""
    for m, n, k in [(1, 1, 1), (129, 64, 40), (300, 1, 5000), (3, 700, 64)]:
        p = problem(m, n, k)
        c = heuristics.choose(p, H100_SXM, "stream_k")
        SK.check_grid(p, c.config, 1, c.raster_group, c.splits)
    c = heuristics.choose(problem(1, 1, 1), H100_SXM, "stream_k")
    assert c.splits == 1


def test_model_terms():
    """Whole tiles a CTA (a lane's tiles divide among its CTAs) cost no pieces; more CTAs than
    a lane's tiles cut each tile into pieces that its owner adds one by one; a shared operand
    that does not fit L2 is read once a lane."""
    p = problem(1472, 896, 9472)
    cfg = config(128, p)
    whole = heuristics.stream_k_us(p, cfg, 1, 12 * 7, H100_SXM)   # 7 tiles, 7 CTAs a lane
    kblock = (heuristics.UNSPLIT_KBLOCK_US * (1 + heuristics.UNSPLIT_LOAD * 84 / 132)
              * heuristics.STREAM_K_KBLOCK_SCALE)
    assert whole == pytest.approx((148 + 1) * kblock + heuristics.UNSPLIT_EPILOGUE_US)
    cut = heuristics.stream_k_us(p, cfg, 1, 12 * 11, H100_SXM)
    assert cut > (whole - heuristics.UNSPLIT_EPILOGUE_US) * 7 / 11
    tall = problem(139, 20992, 22968)   # B of 964 MB, shared by 2 lanes of M-tiles
    cfg = config(128, tall)
    us = heuristics.stream_k_us(tall, cfg, 1, 132, H100_SXM)
    b_twice = 2 * 20992 * 22968 * 2 / (heuristics.UNSPLIT_DRAM_TBPS * 1e6)
    assert us >= b_twice


@pytest.mark.usefixtures("without_transpose")
def test_sub_wave_long_k_takes_stream_k():
    """76 tiles of 128 x 128 over 473 k-blocks leave 56 SMs idle: stream-K on every SM, one
    lane of 128 x 256 tiles (B, the lanes' own operand, fits L2), says why, and its model is not
    slower than the wave model's pick. A forced schedule is left alone."""
    p = problem(4800, 256, 30272)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is SK and c.config.block_n == 256 and c.splits == H100_SXM.sm_count
    assert "would leave 56 of 132 SMs idle over 473 k-blocks" in c.reason, c.reason
    assert "panel of A from DRAM" in c.reason, c.reason
    assert "stream-K: 1 lane (the column" in c.reason, c.reason
    assert heuristics.choose(p, H100_SXM, "persistent").schedule is PersistentSchedule


@pytest.mark.usefixtures("without_transpose")
def test_sub_wave_counts_a_batchs_tiles_once():
    """Two slices of 2560 x 256 x 15488: 80 tiles of 128 x 128 in all, under the 132 SMs."""
    c = heuristics.choose(problem(2560, 256, 15488, 2), H100_SXM)
    assert c.schedule is SK and "80 tiles of 128x128 would leave 52 of 132 SMs idle" in c.reason


@pytest.mark.parametrize("m,n,k,batch,why", [
    (4800, 256, 64 * heuristics.STREAM_K_OWN_TILE_MIN_K_BLOCKS - 64, 1,
     "a k-block short of the rule"),
    (4800, 256, 64 * heuristics.STREAM_K_MIN_K_BLOCKS - 64, 1,
     "a shorter loop: stream-K's 128 x 256 tile, ahead by its model, is not the pick's"),
    (2816, 192, 8320, 1, "the 64 x 128 tile: no 128-row grid"),
    (2944, 448, 30000, 1, "B of 27 MB, the lanes' own operand, does not fit L2"),
    (16384, 256, 30272, 1, "past one wave of 128-row tiles"),
    (4800, 256, 8192 * 4, 2, "a batch of 2: 152 tiles"),
])
def test_sub_wave_rule_keeps_the_pick(m, n, k, batch, why):
    c = heuristics.choose(problem(m, n, k, batch), H100_SXM)
    assert c.schedule is not SK, why


@pytest.mark.usefixtures("without_transpose")
def test_sub_wave_stream_k_keeps_the_pick_it_displaced():
    """Operands read in place through phase maps (which stream-K lacks) run on the persistent
    choice the rule displaced (heuristics.phaseable); a fused epilogue and a row store reach it
    too; a forced stream-K displaced nothing."""
    p = problem(4800, 256, 8192)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is SK and c.instead.schedule is PersistentSchedule
    assert c.instead.config.block_n == 128 and heuristics.phaseable(c) is c.instead
    forced = heuristics.choose(p, H100_SXM, "stream_k")
    assert forced.instead is None and heuristics.phaseable(forced) is forced
    spec = EpilogueSpec("relu", bias=True)
    fused = heuristics.with_epilogue(c, spec)
    assert fused.config.epilogue == spec and fused.instead.config.epilogue == spec
    stored = heuristics.row_store_choice(fused, p, H100_SXM)
    assert stored.schedule is SK and stored.config.row_store and stored.config.epilogue == spec
    assert stored.instead.config.row_store and stored.instead.config.epilogue == spec


def test_sub_wave_stream_k_displaces_a_split_of_128_wide_tiles():
    """192 columns over a long K: split_k's 128 x 128 tiles compute a second column of tiles
    half past N; stream-K's 128 x 192 tile covers them once on every SM (1.15 x on an H200;
    NOTES v0.55). The split stays what phase maps read operands on. (Over 25472 of K, as
    measured then, split_k_parallel's 64 x 192 tiles in two splits now take it: NOTES v0.67.)"""
    p = problem(3456, 192, 16384)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is SK and (c.config.block_m, c.config.block_n) == (128, 192)
    assert c.instead.schedule.name == "split_k" and c.instead.splits == 2
    assert heuristics.phaseable(c) is c.instead
    assert c.reason.startswith("54 tiles of 128x128 (2 columns of them over 192 columns) in 2 "
                               "splits (split_k)")
    assert c.splits // SK.lanes(p, c.config, c.raster_group) > \
        4 * SK.lane_tiles(p, c.config, c.raster_group), "more than four CTAs a tile"


@pytest.mark.usefixtures("without_transpose")
def test_wait_on_stages_of_a_decides_a_sub_wave_pick():
    """8832 x 128 x 8576 on an H200: 69 tiles of 128 x 128, whose wave model (46.9 us) is
    below stream-K's (47.3), but whose CTAs wait on their six stages of A longer (55.6; the
    pick ran 61.6, cuBLAS 46.2; NOTES v0.56). The floor is the wait of each k-block."""
    p = problem(8832, 128, 8576)
    pick = heuristics.choose(p, H100_SXM, "persistent")
    wait = heuristics._stream_wait_us(pick, p, H200)
    stages_behind = pick.config.stages - 1
    assert wait == pytest.approx(134 * heuristics.STREAM_WAIT_US / stages_behind
                                 + heuristics.UNSPLIT_EPILOGUE_US)
    assert heuristics._choice_us(pick, p, H200) < heuristics._choice_us(
        heuristics._stream_k_choice(p, H200), p, H200) < wait
    c = heuristics.choose(p, H200)
    assert c.schedule is SK and c.instead.schedule is PersistentSchedule
    assert re.search(r"\(55\.6 us waiting on its stages of A, the wave model's 46\.9\)", c.reason)


def test_wait_on_stages_counts_only_for_a():
    """243 x 9864 x 15416: stream-K's lanes there are rows of tiles (B streamed), and its
    model is below the wait on its stages of the 128 x 192 overlap tile (the pick then), but
    stream-K ran 0.71 x that tile (NOTES v0.50's probe): the floor, measured on tall products,
    is weighed only for A."""
    p = problem(243, 9864, 15416)
    c = heuristics.choose(p, H200)
    stream = heuristics._stream_k_choice(p, H200)
    assert not SK.lanes_are_columns(p, stream.config, stream.raster_group)
    assert c.schedule is not SK and c.config.block_m == 128
    overlap = SCHEDULES["persistent_overlap"]
    measured = heuristics.Choice(overlap, overlap.deepest(p.dtype, 192, p.trans_a, p.trans_b,
                                                          H200.smem_per_block_optin),
                                 "NOTES v0.50's pick", 2)
    assert (heuristics._choice_us(stream, p, H200)
            < heuristics._stream_wait_us(measured, p, H200))


@pytest.mark.parametrize("device", [H100_SXM, H200], ids=["H100", "H200"])
def test_stream_k_taken_only_where_its_rule_holds(device):
    """Wherever the heuristic takes stream-K unforced on B of whole-line rows: a sub-wave grid
    of 128-row tiles before, a long main loop, the lanes' own operand in L2, at most
    STREAM_K_MAX_CTAS_PER_TILE CTAs a tile, and its model no slower than the pick's time: the
    wave model's or a split's, or the wait on its stages of A where that is longer (restated
    from the reason)."""
    rng = random.Random(7)
    taken = 0
    for _ in range(3000):
        m, n, k = (int(2 ** rng.uniform(7, 15)) // 8 * 8 for _ in range(3))
        p = problem(m, n, k)
        c = heuristics.choose(p, device)
        assert c.tail is None or c.tail.choice.schedule is not SK
        if c.schedule is not SK:
            continue
        taken += 1
        k_blocks = heuristics._k_blocks(p)
        # B's lines are whole cache lines here (problem()): the narrow tile's rule, for rows
        # that start mid-sector, never takes stream-K (its own tests follow).
        assert "stream-K on the narrow tile" not in c.reason
        assert k_blocks >= heuristics.STREAM_K_OWN_TILE_MIN_K_BLOCKS
        short = k_blocks < heuristics.STREAM_K_MIN_K_BLOCKS
        if short:
            assert (c.config.block_m, c.config.block_n) == \
                (c.instead.config.block_m, c.instead.config.block_n)
        lanes = SK.lanes(p, c.config, c.raster_group)
        assert c.splits // lanes <= (heuristics.STREAM_K_MAX_CTAS_PER_TILE
                                     * SK.lane_tiles(p, c.config, c.raster_group))
        assert heuristics._lane_operand_bytes(p, c.config, c.raster_group) \
            <= heuristics.STREAM_K_L2_BYTES
        displaced = c.reason.split("; stream-K:")[0]
        tiles = float(re.match(r"(\d+) tiles ", displaced).group(1))
        pick_us = float(re.match(r"(?:its model's |the wave model's )?([\d.]+) us",
                                 displaced.rsplit("(", 1)[1]).group(1))
        assert tiles < device.sm_count
        gain = heuristics.STREAM_K_SHORT_GAIN if short else 1.0
        assert heuristics._choice_us(c, p, device) * gain <= pick_us + 0.05
    assert taken, "no random problem took stream-K"


def test_autotune_entries_of_stream_k():
    """A recorded stream_k winner comes back with its CTAs; one whose CTAs do not divide into
    its lanes is refused."""
    p = problem(1472, 896, 9472)
    ok = tuning.TunedEntry("stream_k", 128, 6, 12, 500.0, "2026-11-26", splits=126)
    c = tuning.choice_from(ok, p, H100_SXM)
    assert c.schedule is SK and c.splits == 126 and c.raster_group == 12
    assert tuning.label(c) == "stream_k 128x128 s6 g12 ctas126"
    bad = tuning.TunedEntry("stream_k", 128, 6, 12, 500.0, "2026-11-26", splits=130)
    with pytest.raises(ValueError, match="multiple of the lanes"):
        tuning.choice_from(bad, p, H100_SXM)


def test_rendered_hand_off_order():
    """A contributor's piece is stored, fenced and the barrier passed before the flag is
    released; an owner reads a piece only after the flag's acquire and the barrier."""
    cfg = SK.configs(H100_SXM.smem_per_block_optin)[0]
    src = SK.render(cfg).source
    publish = src[src.index("void publish("):src.index("void add(")]
    order = [publish.index(x) for x in ("make_float4(", "__threadfence();",
                                        "named_barrier_sync(", "st_release_gpu(")]
    assert order == sorted(order)
    add = src[src.index("void add("):src.index("stream_k_gemm(")]
    order = [add.index(x) for x in ("ld_acquire_gpu(", "named_barrier_sync(",
                                    "ld_global_cg_f32x4(")]
    assert order == sorted(order)


@pytest.mark.parametrize("m,n,k,tile", [
    (1024, 24896, 40, (128, 256)),    # 784 tiles of 256 (6 waves) or 1040 of 192 (8): a tie
    (13248, 1472, 64, (128, 256)),    # 5 waves of 256 against 7 of 192
    (13056, 5120, 64, (128, 192)),    # 21 waves of 192 hold fewer bytes than 16 of 256
    (9920, 19328, 128, (128, 256)),   # two k-blocks: never the 64-row tile
    (9536, 8256, 128, (128, 192)),
    (31872, 14080, 64, (64, 256)),    # one k-block, wide rows, a large result
    (7000, 8192, 64, (64, 256)),
    (2000, 8192, 64, (128, 256)),     # wide rows, a result below STORE_BOUND_SHORT_MIN_BYTES
    (8000, 7912, 40, (64, 256)),      # B rows of 15,824 B, off 128-byte lines
    (6000, 7912, 40, (128, 192)),
    (19131, 2840, 56, (128, 192)),
])
def test_store_bound_problems(m, n, k, tile):
    """At most two k-blocks and a result ten times the operands, over several waves: the
    persistent kernel with each consumer's whole tile staged, in waves along rows of tiles,
    whatever B's alignment; the 128-row width of fewer tile bytes per SM over whole waves, or
    the 64 x 256 tile for results of at least STORE_BOUND_SHORT_MIN_BYTES in rows of at least
    STORE_BOUND_SHORT_MIN_N columns at one k-block; no tail."""
    p = in_place(m, n, k)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is PersistentSchedule and c.tail is None and c.splits == 1
    assert (c.config.block_m, c.config.block_n) == tile
    assert c.config.c_buffers == PersistentSchedule.c_boxes(c.config)
    assert c.raster_group == heuristics.STORE_BOUND_RASTER_GROUP
    assert "the stores set the pace" in c.reason
    assert (f"rows of {n} columns" in c.reason) == (tile[0] == 64)
    assert ("KiB an SM" in c.reason) == (tile[0] == 128)
    if not p.b_pitch_aligned:
        assert "instead of: clusters of 2 CTAs sharing B's tiles" in c.reason


@pytest.mark.parametrize("m,n,k", [(31872, 14080, 64), (7000, 8192, 64), (13056, 5120, 64)])
def test_store_bound_row_store_keeps_its_tile(m, n, k):
    """A store-bound result stored by rows takes the short-K row store's 128-row tile."""
    p = problem(m, n, k)
    rows = heuristics.row_store_choice(heuristics.choose(p, H100_SXM), p, H100_SXM)
    assert rows.config.row_store and rows.config.block_m == 128
    assert rows.config.block_n == heuristics.ROW_STORE_SHORT_K_WIDTH
    assert rows.raster_group == heuristics.ROW_STORE_SHORT_K_GROUP


@pytest.mark.parametrize("m,n,k", [(9920, 19328, 192),   # three k-blocks
                                   (10048, 7360, 320), (960, 21376, 640),
                                   (600, 30000, 64),     # a result of 9 x the operands
                                   (1000, 1000, 64)])    # less than a wave
def test_not_store_bound(m, n, k):
    """The tile-time model's choice elsewhere."""
    c = heuristics.choose(problem(m, n, k), H100_SXM)
    assert "the stores set the pace" not in c.reason


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("a_major,b_major", [("k", "n"), ("m", "n"), ("k", "k"), ("m", "k")])
@pytest.mark.parametrize("m,n,tile", [(13248, 1472, (128, 256, 3)), (13056, 5120, (128, 192, 4)),
                                      (7000, 8192, (64, 256, 4))])
def test_store_bound_kernels_compile_without_spills(dtype, a_major, b_major, m, n, tile):
    """The store-bound configs (the whole tile staged, on fewer stages than the kernel matrix's
    deepest configs) compile for sm_90a without spills, within the shared memory, and store
    through TMA."""
    from hopmm import compile as compiler
    from hopmm import sass

    p = Problem(m, n, 64, 1, dtype, a_major, b_major)
    c = heuristics.choose(p, H100_SXM)
    assert (c.config.block_m, c.config.block_n, c.config.stages) == tile
    assert c.config.c_buffers == PersistentSchedule.c_boxes(c.config)
    kernel = compiler.compile_kernel(c.schedule.render(c.config))
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    assert r.problems(c.schedule.smem_bytes(c.config), H100_SXM.smem_per_block_optin) == []
    tool = sass.find_cuobjdump()
    if tool is not None:
        s = sass.summarize_listing(sass.cached_listing(kernel.cubin_path, tool))
        assert s.counts["local_memory"] == 0 and s.counts["hgmma"] > 0
        assert s.counts["tma_store"] > 0


@pytest.mark.usefixtures("without_transpose")
def test_short_loop_takes_stream_k_on_the_picks_own_tile():
    """9216 x 192 x 6720 on an H200 (105 k-blocks, seed 223's lowest at 0.77 x cuBLAS): 72
    tiles of 128 x 192 on the overlap kernel. Below STREAM_K_MIN_K_BLOCKS stream-K may run
    only that tile, and only at least STREAM_K_SHORT_GAIN x faster by its model than the
    pick's wait (the autotune table had it 1.16 x the pick; NOTES v0.57)."""
    p = problem(9216, 192, 6720)
    k_blocks = heuristics._k_blocks(p)
    assert heuristics.STREAM_K_OWN_TILE_MIN_K_BLOCKS <= k_blocks < heuristics.STREAM_K_MIN_K_BLOCKS
    c = heuristics.choose(p, H200)
    assert c.schedule is SK and c.instead.schedule.name == "persistent_overlap"
    assert (c.config.block_m, c.config.block_n) == (c.instead.config.block_m,
                                                    c.instead.config.block_n) == (128, 192)
    wait = heuristics._stream_wait_us(c.instead, p, H200)
    assert heuristics._choice_us(c, p, H200) * heuristics.STREAM_K_SHORT_GAIN <= wait
    assert "72 tiles of 128x192 would leave 60 of 132 SMs idle over 105 k-blocks" in c.reason
    assert "under 128 k-blocks stream-K runs the same tile, at least 1.1 x ahead" in c.reason


def test_short_loop_refuses_a_wider_stream_k_tile():
    """4352 x 192 x 4800 (75 k-blocks): the pick's 128 x 64 tiles (102 of them); stream-K's
    model put its 128 x 192 tile ahead, which ran 0.76 x the pick (NOTES v0.56's refuted
    A/B): stream-K has no 128 x 64 tile, so the pick stays."""
    p = problem(4352, 192, 4800)
    c = heuristics.choose(p, H200)
    assert c.schedule is not SK and (c.config.block_m, c.config.block_n) == (128, 64)


# ---- the narrow tile: stream-K where B's rows are narrow (heuristics._narrow_stream_k) -------

@pytest.mark.parametrize("columns,cost", [
    (24, 0.6 * 16 / 48), (40, 0.6 * 16 / 80), (56, 0.6 * 16 / 112),   # mid-sector rows
    (20, 0.6 * 16 / 48),                 # 40-byte rows, read as 48 (whole 16-byte chunks)
    (16, 0.0), (32, 0.0), (48, 0.0), (64, 0.0),   # whole sectors, whole lines
    (8, 0.0),                            # under a sector: the line copy's rule instead
])
def test_narrow_b_mid_sector_cost(columns, cost):
    p = in_place(20000, columns, 4096)
    assert heuristics.narrow_b_mid_sector_cost(p) == pytest.approx(cost)
    k_major = Problem(20000, columns, 4096, 1, "bfloat16", "k", "k")
    assert heuristics.narrow_b_mid_sector_cost(k_major) == 0.0
    # read from a copy of whole lines (launch.line_copy: B's aligned copies), no row starts
    # mid-sector
    assert heuristics.narrow_b_mid_sector_cost(replace(p, b_pitch_aligned=True)) == 0.0


@pytest.mark.parametrize("device", [H100_SXM_CLUSTERS, H200], ids=["H100", "H200"])
@pytest.mark.parametrize("m,n,k", [(24064, 24, 29376), (11840, 24, 5376), (15680, 40, 10944),
                                   (5184, 24, 26688)])
def test_narrow_products_of_mid_sector_rows_take_stream_k_on_the_narrow_tile(m, n, k, device):
    """Tall products of 24 or 40 columns whose narrow pick (persistent, or split_k_cluster over
    few tiles) its model charges for B's rows: stream-K on the narrow tile, one lane of every
    SM, keeping the pick it displaced (phaseable) and saying why; from a copy of whole lines,
    not that rule: the narrow pick, or over more than a wave, the whole-line rule's stream-K."""
    p = in_place(m, n, k)
    c = heuristics.choose(p, device)
    assert c.schedule is SK and (c.config.block_m, c.config.block_n) == (128, 64), c.reason
    assert c.splits == device.sm_count and SK.lanes(p, c.config, c.raster_group) == 1
    assert "start mid-sector" in c.reason and "stream-K on the narrow tile" in c.reason
    assert c.instead is not None and c.instead.config.block_n == 64
    assert heuristics.phaseable(c) is c.instead
    copied = heuristics.choose(replace(p, b_pitch_aligned=True), device)
    assert copied.config.block_n == 64 and "start mid-sector" not in copied.reason
    waves = -(-m // 128) / device.sm_count
    assert copied.schedule is not SK or (waves > 1 and copied.reason.startswith(
        "stream-K on the narrow tile instead of"))


def test_the_narrow_rule_weighs_the_models():
    """Uncharged (rows of whole lines), the narrow pick stays where stream-K's model is slower;
    charging the pick moves the same product; K-major B and a forced schedule are left alone."""
    p = in_place(11840, 24, 5376)
    pick = heuristics._choose_one(p, H200, None, False, False)
    stream, = [c for c in heuristics.stream_k_choices(p, H200, (128, 64))
               if SK.lanes(p, c.config, c.raster_group) == 1]
    pick_us = heuristics._choice_us(pick, p, H200)
    stream_us = heuristics._choice_us(stream, p, H200)
    assert pick_us < stream_us <= pick_us * (1 + heuristics.narrow_b_mid_sector_cost(p))
    assert heuristics._narrow_stream_k(pick, p, H200) is not None
    assert heuristics._narrow_stream_k(pick, replace(p, n=64), H200) is None
    assert heuristics._narrow_stream_k(pick, replace(p, b_major="k"), H200) is None
    forced = heuristics.choose(p, H200, "stream_k")
    assert forced.config.block_n in heuristics.STREAM_K_WIDE_BLOCK_NS


def test_wide_picks_and_sub_wave_rules_never_offer_the_narrow_tile():
    """stream_k_choices without a tile weighs the wide tiles only, so the sub-wave rule and a
    forced stream-K choose as they did before the narrow tile was offered."""
    p = problem(9000, 24, 20000)
    assert {c.config.block_n for c in heuristics.stream_k_choices(p, H200)} \
        == set(heuristics.STREAM_K_WIDE_BLOCK_NS)
    assert {c.config.block_n for c in heuristics.stream_k_choices(p, H200, (128, 64))} == {64}


def test_the_narrow_rule_needs_a_main_loop():
    """Under NARROW_STREAM_K_MIN_K_BLOCKS k-blocks (not measured) the narrow pick stays."""
    k = (heuristics.NARROW_STREAM_K_MIN_K_BLOCKS - 1) * 64
    p = in_place(29504, 24, k)
    pick = heuristics._choose_one(p, H200, None, False, False)
    assert heuristics._narrow_stream_k(pick, p, H200) is None
    assert heuristics._narrow_stream_k(pick, replace(p, k=k + 64), H200) is not None


# ---- the narrow tile over whole lines (heuristics._whole_line_narrow_stream_k) --------------

def whole_line_pick(m, k, device=H200):
    p = in_place(m, 64, k)
    assert p.b_pitch_aligned and heuristics.narrow_b_mid_sector_cost(p) == 0.0
    return p, heuristics._choose_one(p, device, None, False, False)


@pytest.mark.parametrize("device", [H100_SXM_CLUSTERS, H200], ids=["H100", "H200"])
def test_whole_lines_over_a_partial_last_wave_take_stream_k(device):
    """A narrow pick of 64 columns over more than a wave without a tail, whose model stream-K
    beats: stream-K on the narrow tile, keeping the pick it displaced and saying why."""
    p, pick = whole_line_pick(17088, 2048, device)
    assert pick.tail is None and -(-p.m // 128) > device.sm_count
    c = heuristics._whole_line_narrow_stream_k(pick, p, device)
    assert c is not None and c.schedule is SK and c.config.block_n == 64
    assert c.instead is pick and heuristics.phaseable(c) is pick
    assert heuristics._choice_us(c, p, device) <= heuristics._choice_us(pick, p, device)
    assert c.reason.startswith(f"stream-K on the narrow tile instead of {heuristics.label(pick)}")
    assert heuristics.choose(p, device).schedule is SK


def test_the_whole_line_rule_leaves_alone():
    """A sub-wave grid, a short main loop, a pick with a tail, rows of part lines, a K-major B
    and a transposed pick: the pick stays."""
    p, pick = whole_line_pick(24384, 16704)
    rule = heuristics._whole_line_narrow_stream_k
    assert rule(pick, p, H200) is not None                                    # as it stands
    assert rule(pick, replace(p, m=132 * 128), H200) is None                  # one wave
    k = (heuristics.WHOLE_LINE_STREAM_K_MIN_K_BLOCKS - 1) * 64
    assert rule(pick, replace(p, k=k), H200) is None
    tail = heuristics.Tail("m", 128 * 132, pick, pick)
    assert rule(replace(pick, tail=tail), p, H200) is None
    assert rule(pick, replace(p, b_pitch_aligned=False), H200) is None
    assert rule(pick, replace(p, b_major="k"), H200) is None
    assert rule(replace(pick, config=replace(pick.config, trans_c=True)), p, H200) is None


def test_the_whole_line_rule_charges_split_k_cluster_its_error(monkeypatch):
    """split_k_cluster's narrow pick is weighed at CLUSTER_NARROW_MODEL_ERROR x its model."""
    p, _ = whole_line_pick(17024, 29376)
    pick = heuristics.choose(p, H200, "split_k_cluster")
    assert pick.config.block_n == 64 and pick.splits >= 2
    stream_us = min(heuristics._choice_us(c, p, H200)
                    for c in heuristics.stream_k_choices(p, H200, (128, 64)))
    ratio = stream_us / heuristics._choice_us(pick, p, H200)
    monkeypatch.setattr(heuristics, "CLUSTER_NARROW_MODEL_ERROR", ratio * 0.99)
    assert heuristics._whole_line_narrow_stream_k(pick, p, H200) is None
    monkeypatch.setattr(heuristics, "CLUSTER_NARROW_MODEL_ERROR", ratio * 1.01)
    taken = heuristics._whole_line_narrow_stream_k(pick, p, H200)
    assert taken is not None and "its error on this tile" in taken.reason


def test_a_line_copy_is_weighed_on_the_narrow_pick():
    """The line copy of B's rows under a sector (narrow_b_copy_reason) is weighed on the narrow
    pick's own time, not on the stream-K the copy then runs (over more than a wave)."""
    p = in_place(21440, 8, 2496)
    reason = heuristics.narrow_b_copy_reason(p, 16, H200)
    assert reason is not None and "read from a copy of whole 128-byte lines" in reason
    copied = heuristics.choose(replace(p, b_pitch_aligned=True), H200)
    assert copied.schedule is SK and copied.instead is not None


def test_a_row_store_that_drops_a_wave_tail_weighs_the_whole_line_rule():
    """A narrow pick whose wave tail cannot store unaligned rows (split-K's) falls back to the
    whole choice, over a partial last wave: stream-K on the narrow tile where the rule takes
    it, both storing rows, a fused epilogue in both (the rule is weighed where the tail is
    made, before the epilogue is added); a forced schedule (which takes no tail) keeps its
    own choice."""
    p = replace(in_place(17418, 30, 16528), b_pitch_aligned=True)   # B's copy, 60-byte C rows
    c = heuristics.choose(p, H200)
    assert c.tail is not None and not c.tail.choice.schedule.row_store_ok
    stored = heuristics.row_store_choice(c, p, H200)
    assert stored.schedule is SK and stored.config.row_store and stored.tail is None
    assert stored.instead is not None and stored.instead.config.row_store
    assert stored.instead.tail is None and stored.instead.schedule is PersistentSchedule
    spec = EpilogueSpec("relu", bias=True)
    fused = heuristics.row_store_choice(heuristics.with_epilogue(c, spec), p, H200)
    assert fused.schedule is SK and fused.config.row_store and fused.config.epilogue == spec
    assert fused.instead.config.epilogue == spec
    own = heuristics.choose(p, H200, "persistent")
    assert own.tail is None
    forced = heuristics.row_store_choice(own, p, H200, forced=True)
    assert forced.schedule is PersistentSchedule and forced.tail is None

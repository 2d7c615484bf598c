"""GPU: the row store (KernelConfig.row_store). Outputs whose rows are not 16-byte aligned
(an odd N, a strided out) cannot take TMA stores; the row-store kernels write them from the
staged boxes with element stores, in place. Every such schedule and tile against cupy.matmul
into NaN-poisoned buffers whose rows start at every alignment: every element written, nothing
written between the rows or below the last one; and whole hopmm.matmul calls (fresh results,
strided outs, repeats, batches, fused epilogues) take it instead of an aligned buffer and a
copy."""
import pytest

from conftest import requires_hopper
import forced

pytestmark = requires_hopper

ROW_STORE_SCHEDULES = ("warp_specialized", "persistent", "persistent_overlap", "pingpong",
                       "persistent_cluster", "persistent_cluster4", "persistent_cluster_overlap")
# Tile edges on every side, one row, one column, K below one k-block, K of 14 k-blocks less a
# few, an N that ends mid-chunk.
EDGE_SHAPES = [(129, 257, 130), (1, 263, 192), (200, 1, 192), (136, 145, 40), (300, 517, 849)]
# Row pitches past N (elements): rows then start on 2, 4 and 8 bytes (and some on 16).
PITCH_PADS = (1, 2, 4)


def _check_rows(a, b, schedule, tile, dtype, pad):
    import cupy

    n = b.shape[-1]
    c3, buf = forced.run(a, b, schedule, tile, row_pitch=n + pad)
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32)).reshape(c3.shape)
    forced.check_close(c3, ref, dtype)
    m = c3.shape[1]
    assert bool(cupy.isnan(buf[:, :, 0]).all()), "wrote left of the rows"
    assert bool(cupy.isnan(buf[:, :, n + 1:]).all()), "wrote between the rows"
    assert bool(cupy.isnan(buf[:, m:, :]).all()), "wrote below the last row"


def _tiles(schedule):
    """The schedule's tiles whose configs take a row store (row_store_fits)."""
    from dataclasses import replace

    from hopmm.device import H100_SXM
    from hopmm.schedules import SCHEDULES

    sched = SCHEDULES[schedule]
    return [(m, n) for m, n in sched.tile_shapes()
            if sched.row_store_fits(replace(sched.deepest(
                "bfloat16", n, False, False, H100_SXM.smem_per_block_optin, m), row_store=True))]


@pytest.mark.parametrize("schedule", ROW_STORE_SCHEDULES)
def test_every_row_store_schedule_and_tile(schedule):
    import cupy

    cupy.random.seed(1)
    for tile in _tiles(schedule):
        for dtype in ("bfloat16", "float16"):
            a, b = forced.operands(129, 257, 130, dtype)
            _check_rows(a, b, schedule, tile, dtype, pad=3)


@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pad", PITCH_PADS)
@pytest.mark.parametrize("schedule", ("persistent", "pingpong"))
def test_row_store_edges_and_alignments(schedule, shape, pad):
    import cupy

    cupy.random.seed(2)
    m, n, k = shape
    a, b = forced.operands(m, n, k, "bfloat16")
    _check_rows(a, b, schedule, _tiles(schedule)[-1], "bfloat16", pad)


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
def test_row_store_transposed_and_batched(ta, tb):
    import cupy

    cupy.random.seed(3)
    a, b = forced.operands(100, 75, 136, "float16", ta, tb, batch=(3,))
    _check_rows(a, b, "persistent", 128, "float16", pad=5)


def _matmul_store(a, b, out=None, **keywords):
    """The kernel and output lines of hopmm.explain for this call."""
    import hopmm

    lines = hopmm.explain(a, b, out, **keywords).splitlines()
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_matmul_stores_odd_rows_in_place(dtype):
    """A fresh result of odd N: a row-store kernel writes it, no aligned buffer (the plan
    says so), then a repeat through the remembered launches."""
    import cupy

    import hopmm

    cupy.random.seed(4)
    a, b = forced.operands(1000, 1450, 240, dtype)
    info = _matmul_store(a, b)
    assert "_rs_" in info["kernel"] and "stores the rows itself" in info["output"], info
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    for _ in range(2):   # the first call, then the repeat
        forced.check_close(hopmm.matmul(a, b), ref, dtype)


def test_matmul_into_a_strided_out_keeps_the_gaps():
    import cupy

    import hopmm

    cupy.random.seed(5)
    a, b = forced.operands(333, 200, 512, "bfloat16")
    buf = cupy.full((333, 211), cupy.nan, dtype=a.dtype)
    out = buf[:, 3:203]
    assert "stores the rows itself" in _matmul_store(a, b, out)["output"]
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    for _ in range(2):
        buf.fill(cupy.nan)
        assert hopmm.matmul(a, b, out=out) is out
        forced.check_close(out, ref, "bfloat16")
        assert bool(cupy.isnan(buf[:, :3]).all()) and bool(cupy.isnan(buf[:, 203:]).all())


def test_matmul_batched_odd_rows():
    import cupy

    import hopmm

    cupy.random.seed(6)
    a, b = forced.operands(70, 99, 300, "float16", batch=(4,))
    assert "stores the rows itself" in _matmul_store(a, b)["output"]
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    forced.check_close(hopmm.matmul(a, b), ref, "float16")


def test_fused_epilogue_with_a_row_store():
    import cupy

    import hopmm
    from hopmm import epilogue

    cupy.random.seed(7)
    a, b = forced.operands(257, 333, 384, "bfloat16")
    bias = forced.rand((333,), "bfloat16")
    c = forced.rand((257, 333), "bfloat16")
    keywords = dict(bias=bias, activation="gelu", alpha=0.5, beta=2.0, c=c)
    assert "stores the rows itself" in _matmul_store(a, b, **keywords)["output"]
    f32 = [x.astype(cupy.float32) for x in (a, b, bias, c)]
    ref = epilogue.activate(cupy, 0.5 * (f32[0] @ f32[1]) + 2.0 * f32[3] + f32[2], "gelu")
    for _ in range(2):
        forced.check_close(hopmm.matmul(a, b, **keywords), ref, "bfloat16")


def test_split_k_still_copies_odd_rows():
    """Split-K kernels store through TMA only: an odd-N result goes through the aligned
    buffer and a copy, and is right."""
    import cupy

    import hopmm

    cupy.random.seed(8)
    a, b = forced.operands(96, 190, 8192, "bfloat16")
    hopmm.use_schedule("split_k_parallel")
    try:
        info = _matmul_store(a, b)
        assert "aligned buffer" in info["output"], info
        ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
        forced.check_close(hopmm.matmul(a, b), ref, "bfloat16")
    finally:
        hopmm.use_schedule(None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_overlap_tiles_of_odd_rows_run_on_the_single_set_kernel(dtype):
    """400 x 6335 x 1024 (one whole wave of 128 x 192 tiles): the heuristic's
    persistent_overlap 128 x 192 has no registers for the row store, so the call runs the
    same tile on the persistent kernel, storing its rows itself (heuristics.row_store_choice);
    first call and repeat."""
    import cupy

    import hopmm

    cupy.random.seed(9)
    a, b = forced.operands(400, 6335, 1024, dtype)
    info = _matmul_store(a, b)
    assert info["schedule"] == "persistent" and "_128x192x64_" in info["kernel"], info
    assert "stores the rows itself" in info["output"], info
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    for _ in range(2):
        forced.check_close(hopmm.matmul(a, b), ref, dtype)


@pytest.mark.parametrize("shape,pad,persistent", [
    ((2000, 1757, 52), 0, False), ((4001, 1757, 40), 5, False), ((3001, 2045, 60), 2, False),
    ((1000, 1999, 100), 1, False), ((61, 1757, 52), 3, False),
    ((2000, 1757, 52), 1, True), ((4001, 1757, 40), 0, True)],
    ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_short_k_rows_written_whole(shape, pad, persistent):
    """Short K, rows that are not 16-byte aligned: a consumer's row block staged whole and
    written a row at a time (the heuristic's 128 x 192 tile in groups of one M-tile, 128 x 128;
    with the persistent schedule forced, 128 x 256 with its 4 boxes staged), into outs with
    gaps between the rows (rows on 2, 4 and 8 bytes, fewer than 64 of them, widths past a
    tile's edge) that stay NaN."""
    import cupy

    import hopmm

    m, n, k = shape
    cupy.random.seed(7)
    a, b = forced.operands(m, n, k, "bfloat16")
    buf = cupy.full((m, n + 1 + pad), cupy.nan, dtype=a.dtype)
    out = buf[:, 1:n + 1] if pad else buf[:, :n].copy()
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    hopmm.use_schedule("persistent" if persistent else None)
    try:
        info = _matmul_store(a, b, out)
        assert "_rs_" in info["kernel"] and "stores the rows itself" in info["output"], info
        if n == 1757 and m > 1000:
            tile = "128x256x64_s3_c4_rs" if persistent else "128x192x64_s4_c3_rs"
            assert tile in info["kernel"], info
        assert hopmm.matmul(a, b, out=out) is out
    finally:
        hopmm.use_schedule(None)
    forced.check_close(out, ref, "bfloat16")
    if pad:
        assert bool(cupy.isnan(buf[:, :1]).all()) and bool(cupy.isnan(buf[:, n + 1:]).all())

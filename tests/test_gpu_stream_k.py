"""GPU tier: stream-K in lanes (schedules.StreamKSchedule) against an fp32 cupy.matmul into
NaN-poisoned outputs with spare rows below: every tile width, lanes by rows and by columns of
tiles, every layout, K not a multiple of 64 or below one k-block, one row or one column,
sliced and transposed operands, batches, the row store, fused epilogues, out = c, bitwise
repeats and new operands through the remembered launches; and the heuristic's own choice of it
for sub-wave grids over a long K, for tall products of B rows that start mid-sector on the
narrow tile, and for those over more than a wave on B rows of whole lines (its rules:
tests/test_stream_k_cpu.py), plain and fused.
Skips without a Hopper GPU."""
import pytest

from conftest import requires_hopper
from forced import (SPARE_ROWS, check_call, check_close, check_fused_into_c, operands, rand,
                    reference)

pytestmark = [requires_hopper, pytest.mark.usefixtures("heuristic_choice")]

LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}


def run_lanes(a, b, width, lanes_by, ctas_per_lane=None):
    """C = A @ B on stream_k's tile of `width` columns, lanes by "rows" or "columns" of
    tiles, `ctas_per_lane` CTAs a lane (default: as many as the SMs allow), into a
    NaN-poisoned buffer with SPARE_ROWS rows below. Returns (C, the buffer, the lanes)."""
    import cupy

    from hopmm import launch, layout, operands as operands_mod
    from hopmm.device import query
    from hopmm.heuristics import Choice
    from hopmm.schedules import StreamKSchedule as SK

    shapes = layout.matmul_shapes(a.shape, b.shape)
    call = operands_mod.kernel_operands(a, b, shapes)
    p = call.problem
    dev = query(cupy.cuda.Device().id)
    cfg = SK.deepest(p.dtype, width, p.trans_a, p.trans_b, dev.smem_per_block_optin)
    tiles_m = -(-p.m // cfg.block_m)
    group = max(tiles_m, 2) if lanes_by == "columns" else 1
    lanes = SK.lanes(p, cfg, group)
    ctas = (lanes * ctas_per_lane if ctas_per_lane
            else SK.most_ctas(p, cfg, p.batch, group, dev.sm_count))
    choice = Choice(SK, cfg, "test", group, ctas)
    padded = layout.padded(shapes.n, a.itemsize)
    buf = cupy.full((shapes.batch, shapes.m + SPARE_ROWS, padded), cupy.nan, dtype=a.dtype)
    c3 = buf[:, :shapes.m, :shapes.n]
    launches = launch.build_launches(choice, p, call.a3, call.a_map, call.b3, call.b_map, c3)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, c3.data.ptr)
    cupy.cuda.get_current_stream().synchronize()
    return c3.reshape(shapes.out_shape), buf, lanes


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("lanes_by", ["rows", "columns"])
@pytest.mark.parametrize("width", [64, 128, 192, 256])
def test_stream_k_lanes_match_cupy(width, lanes_by, dtype, layout):
    """Every tile width and lane direction: 1,000 x 700 over K = 3,000 (47 k-blocks, the last
    partial), cut into pieces that start inside tiles (lanes of 8 tiles or fewer, over as many
    CTAs as the SMs allow); nothing written below the result."""
    import cupy

    m, n, k = 1000, 700, 3000
    a, b = operands(m, n, k, dtype, *LAYOUTS[layout])
    got, buf, lanes = run_lanes(a, b, width, lanes_by)
    assert lanes > 1
    check_close(got, reference(a, b), dtype)
    assert bool(cupy.isnan(buf[:, m:, :].astype(cupy.float32)).all()), "wrote below the result"


@pytest.mark.parametrize("lanes_by", ["rows", "columns"])
def test_one_row_of_tiles_runs_as_one_lane(lanes_by):
    """A product of one M-tile (100 rows) is one lane of 12 tiles whatever the group, cut over
    every SM; nothing written below the result."""
    import cupy

    m, n, k = 100, 1500, 3000
    a, b = operands(m, n, k, "bfloat16")
    got, buf, lanes = run_lanes(a, b, 128, lanes_by)
    assert lanes == 1
    check_close(got, reference(a, b), "bfloat16")
    assert bool(cupy.isnan(buf[:, m:, :].astype(cupy.float32)).all()), "wrote below the result"


@pytest.mark.parametrize("ctas_per_lane", [1, 2, 3, 7, 22])
def test_stream_k_any_share(ctas_per_lane):
    """Lanes of one CTA (whole tiles, no pieces) up to CTAs of one or two k-blocks each, so
    that one tile is cut into many pieces (an owner adds several, in order)."""
    m, n, k = 700, 500, 1000
    a, b = operands(m, n, k, "bfloat16")
    got, _, _ = run_lanes(a, b, 128, "rows", ctas_per_lane)
    check_close(got, reference(a, b), "bfloat16")


@pytest.mark.parametrize("m,n,k", [(1, 300, 5000), (300, 1, 5000), (1, 1, 1), (129, 64, 40),
                                   (257, 129, 64 * 300 + 5), (2000, 301, 12000)])
def test_forced_stream_k_edges(m, n, k):
    """Forced (use_schedule): one row, one column (2-byte rows: the row store), K of one
    partial k-block, sizes one past a tile, odd columns over a long K."""
    import cupy

    import hopmm

    hopmm.use_schedule("stream_k")
    a, b = operands(m, n, k, "float16")
    text = hopmm.explain(a, b)
    assert "schedule: stream_k\n" in text, text
    buf = cupy.full((m + 1) * n, cupy.nan, dtype="float16")
    out = buf[:m * n].reshape(m, n)
    assert hopmm.matmul(a, b, out=out) is out
    check_close(out, reference(a, b), "float16")
    assert bool(cupy.isnan(buf[m * n:].astype(cupy.float32)).all())


def test_forced_stream_k_views_and_batches():
    """Sliced operands (rows of A longer than K), transposed B, a batch of three with B
    broadcast, and a batch of three of each."""
    import hopmm

    hopmm.use_schedule("stream_k")
    wide = rand((900, 5100), "bfloat16")
    a = wide[:, :5000]
    b = rand((700, 5000), "bfloat16").T
    assert "schedule: stream_k\n" in hopmm.explain(a, b)
    check_close(hopmm.matmul(a, b), reference(a, b), "bfloat16")
    for b_batch in ((), (3,)):
        a3, _ = operands(600, 300, 4000, "bfloat16", batch=(3,))
        _, b3 = operands(600, 300, 4000, "bfloat16", batch=b_batch)
        check_close(hopmm.matmul(a3, b3), reference(a3, b3), "bfloat16")


@pytest.mark.parametrize("bias_form", ["columns", "rows"])
def test_forced_stream_k_fused_epilogue(bias_form):
    """bias, c, alpha, beta and gelu applied once, by each tile's owner, after the pieces are
    added; the result written into c itself."""
    import hopmm

    hopmm.use_schedule("stream_k")
    text = check_fused_into_c(*operands(1472, 896, 9472, "bfloat16"), bias_form)
    assert "schedule: stream_k\n" in text and "fused into the kernel" in text, text


def test_stream_k_repeats_bitwise():
    """The pieces are added in a fixed order: the same operands give the same bits, through
    the remembered launches too; new operands give their own product."""
    import cupy

    import hopmm

    hopmm.use_schedule("stream_k")
    a, b = operands(1472, 896, 9472, "float16")
    first = hopmm.matmul(a, b)
    for _ in range(3):
        again = hopmm.matmul(a, b)
        assert bool(cupy.array_equal(again.view(cupy.uint16), first.view(cupy.uint16)))
    a2, b2 = operands(1472, 896, 9472, "float16")
    check_close(hopmm.matmul(a2, b2), reference(a2, b2), "float16")


# Sub-wave grids of 128-row tiles over at least STREAM_K_MIN_K_BLOCKS k-blocks that the heuristic
# gives stream-K, on an H100 and an H200 alike (neither transposed product's model is ahead of
# stream-K's: tests/test_transposed_cpu.py).
SUB_WAVE = [(6400, 384, 8192, "bfloat16"), (4608, 192, 8192, "float16")]


@pytest.mark.parametrize("m,n,k,dtype", SUB_WAVE)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sub_wave_products_take_stream_k(m, n, k, dtype, layout):
    check_call(m, n, k, dtype, *LAYOUTS[layout], "schedule: stream_k\n", "SMs idle")


@pytest.mark.parametrize("m,n,k,dtype", SUB_WAVE)
def test_sub_wave_stream_k_fused_into_c(m, n, k, dtype):
    text = check_fused_into_c(*operands(m, n, k, dtype), "columns", dtype)
    assert "schedule: stream_k\n" in text and "fused into the kernel" in text, text


# Tall products the heuristic gives stream-K on the narrow tile (its rules:
# tests/test_stream_k_cpu.py), B N-major (the rules' layouts): a few dozen columns whose B rows
# start mid-sector, over one lane of every SM, pieces cut inside tiles; and products over more
# than a wave on B rows of whole lines whose narrow pick has no tail: 64 columns in place, and
# 8 columns read from B's line copy (whose rows are whole lines).
NARROW = [(11840, 24, 5376, "bfloat16"), (15680, 40, 10944, "float16"),
          (5184, 24, 26688, "bfloat16")]
WHOLE_LINES = [(17088, 64, 2048, "float16"), (20096, 64, 2432, "bfloat16"),
               (21440, 8, 2496, "bfloat16")]
NARROW_RULES = ([(*shape, "start mid-sector") for shape in NARROW]
                + [(*shape, "stream-K on the narrow tile instead of") for shape in WHOLE_LINES])


@pytest.mark.parametrize("m,n,k,dtype,reason", NARROW_RULES)
@pytest.mark.parametrize("layout", ["NN", "TN"])
def test_narrow_products_take_stream_k(m, n, k, dtype, reason, layout):
    check_call(m, n, k, dtype, *LAYOUTS[layout], "schedule: stream_k\n", reason)


def test_narrow_stream_k_fused_into_c():
    m, n, k, dtype = NARROW[0]
    text = check_fused_into_c(*operands(m, n, k, dtype), "rows", dtype)
    assert "schedule: stream_k\n" in text and "fused into the kernel" in text, text


def test_a_row_store_without_its_wave_tail_takes_stream_k():
    """C rows of 60 bytes from B's copy: the wave tail (split-K, no row store) is dropped, and
    stream-K on the narrow tile stores the rows over every SM instead of a partial last wave."""
    check_call(17418, 30, 4096, "bfloat16", False, False, "schedule: stream_k\n",
               "the epilogue stores the rows itself", "stream-K on the narrow tile instead of")


def test_a_row_store_without_its_wave_tail_fuses_its_epilogue():
    """The same product with bias, c, alpha, beta and gelu: the stream-K that runs without the
    tail applies the epilogue (it was weighed where the tail was made, before the epilogue)."""
    text = check_fused_into_c(*operands(17418, 30, 4096, "bfloat16"), "columns")
    assert "schedule: stream_k\n" in text and "fused into the kernel" in text, text
    assert "the epilogue stores the rows itself" in text, text

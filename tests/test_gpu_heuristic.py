"""GPU tier: the heuristic's choices that depend on how the operands lie in memory, seen
through hopmm.explain, and their results."""
import pytest

from conftest import requires_hopper
from forced import TOL, rand

from hopmm import heuristics

pytestmark = requires_hopper


@pytest.fixture(autouse=True)
def _heuristic_choice():
    import hopmm

    hopmm.use_schedule(None)
    yield


@pytest.mark.parametrize("n,schedule", [(3000, "persistent_cluster"),   # 6000-byte rows
                                        (3008, "persistent_overlap")])  # 6016 = 47 x 128
def test_b_rows_off_cache_lines_take_the_cluster_kernel(n, schedule):
    import cupy

    import hopmm

    a, b = rand((3000, 3000), "bfloat16"), rand((3000, n), "bfloat16")
    text = hopmm.explain(a, b)
    assert f"schedule: {schedule}\n" in text
    assert ("not multiples of 128 B" in text) == (schedule == "persistent_cluster")
    # 3000³ on unaligned rows: 192 x 192 tiles, three consumer warpgroups of 64 rows
    assert ("3 warpgroups share each 192x192 tile" in text) == (schedule == "persistent_cluster")
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = hopmm.matmul(a, b).astype(cupy.float32)
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL["bfloat16"]


def test_an_aligned_copy_has_whole_cache_line_rows():
    """B's 2046-byte rows are not 16-byte multiples: hopmm copies B, with rows padded to
    128 bytes, so the copy needs no cluster."""
    import hopmm

    a, b = rand((2048, 512), "bfloat16"), rand((512, 1023), "bfloat16")
    text = hopmm.explain(a, b)
    assert "aligned copies of b" in text and "schedule: persistent\n" in text


@pytest.mark.parametrize("case", ["padded_rows", "one_row", "strided_rows", "transposed",
                                  "batched", "one_of_a_batch"])
def test_copy_rows_is_an_exact_copy(case):
    """launch.copy_rows (pitched cudaMemcpy2DAsync where rows are contiguous, CuPy otherwise)
    copies every element and nothing else."""
    import cupy

    from hopmm import launch

    src = rand((3, 300, 517), "bfloat16")
    dst_buf = cupy.full((3, 310, 640), cupy.nan, dtype=src.dtype)
    pick = {"padded_rows": (src[0], dst_buf[0, :300, :517]),
            "one_row": (src[0, :1], dst_buf[0, :1, 3:520]),
            "strided_rows": (src[0, ::2], dst_buf[0, ::2, :517][:150]),
            "transposed": (src[0, :, :300].T, dst_buf[0, :300, :300]),
            "batched": (src, dst_buf[:, :300, :517]),
            "one_of_a_batch": (src[1:2], dst_buf[1:2, 5:305, 7:524])}
    s, d = pick[case]
    launch.copy_rows(d, s)
    assert bool(cupy.array_equal(d.view(cupy.uint16), s.view(cupy.uint16)))
    assert int(cupy.isnan(dst_buf.astype(cupy.float32)).sum()) == dst_buf.size - s.size


@pytest.mark.parametrize("case", ["odd_pitch", "odd_destination", "reversed_rows",
                                  "many_rows", "short_rows", "fp16_batch"])
def test_copy_rows_edges(case):
    """launch.copy_rows on the copies hopmm makes: source rows starting on any 2-byte boundary
    (a pitch of 4097 elements), destination rows that are not 16-byte multiples, a negative
    row stride, 70001 rows, rows of 3 elements, a batch; every element copied, nothing around
    it written."""
    import cupy

    from hopmm import launch

    dtype = "float16" if case == "fp16_batch" else "bfloat16"
    shape, src_of, dst_of = {
        "odd_pitch": ((1000, 4097), lambda x: x, lambda buf: buf[:1000, :4097]),
        "odd_destination": ((999, 1023), lambda x: x, lambda buf: buf[1:1000, 3:1026]),
        "reversed_rows": ((300, 517), lambda x: x[::-1], lambda buf: buf[:300, 5:522]),
        "many_rows": ((70001, 9), lambda x: x, lambda buf: buf[:70001, 1:10]),
        "short_rows": ((33, 3), lambda x: x, lambda buf: buf[:33, 8:11]),
        "fp16_batch": ((3, 301, 129), lambda x: x, lambda buf: buf[:, :301, 64:193]),
    }[case]
    src = src_of(rand(shape, dtype))
    buf_shape = shape[:-2] + (shape[-2] + 2, shape[-1] + 72)
    buf = cupy.full(buf_shape, cupy.nan, dtype=src.dtype)
    dst = dst_of(buf)
    launch.copy_rows(dst, src)
    assert bool(cupy.array_equal(dst.view(cupy.uint16), src.view(cupy.uint16)))
    assert int(cupy.isnan(buf.astype(cupy.float32)).sum()) == buf.size - src.size


def test_aligned_rows_take_the_tall_cluster_tile_where_its_waves_are_fuller():
    """2304 x 2048: 66 pairs of 192 x 192 tiles fill the 66 clusters once, where 128-row tiles
    take two waves (heuristics.TALL_CLUSTER_MIN_GAIN)."""
    import cupy

    import hopmm

    a, b = rand((2304, 1024), "bfloat16"), rand((1024, 2048), "bfloat16")
    text = hopmm.explain(a, b)
    assert "schedule: persistent_cluster\n" in text and "fewer tile-times" in text
    assert "3 warpgroups share each 192x192 tile" in text
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = hopmm.matmul(a, b).astype(cupy.float32)
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL["bfloat16"]


@pytest.mark.parametrize("m,n,k,ta,tb,batch", [
    (8320, 4096, 4096, False, False, ()),     # 65 M tiles: one cluster's spare CTA, unstored
    (8320, 4096, 4096, True, True, ()),       # A M-major, B K-major (transposed views)
    (4096, 5120, 4096, False, True, (2,)),    # a batch of two: 1280 tiles, 9.7 waves
])
def test_long_runs_of_256_wide_tiles_run_in_clusters(m, n, k, ta, tb, batch):
    """heuristics.CLUSTER_MIN_WAVES: where 128 x 256 tiles make at least 5 waves of 64+
    k-blocks, the default pairs them in clusters; the result is written whole (out= poisoned
    with NaN) and right."""
    import cupy

    import hopmm
    from forced import operands, rel_err

    a, b = operands(m, n, k, "bfloat16", ta, tb, batch)
    text = hopmm.explain(a, b)
    assert "schedule: persistent_cluster\n" in text
    assert "clusters of 2 CTAs share each B tile" in text and "128x256" in text
    out = cupy.full(batch + (m, n), cupy.nan, dtype=a.dtype)
    hopmm.matmul(a, b, out=out)
    assert rel_err(out, a, b) < TOL["bfloat16"]


@pytest.mark.parametrize("dtype,routed", [("float16", True), ("bfloat16", False)])
def test_copy_route_only_where_cupy_matmul_computes_the_call(dtype, routed):
    """Odd K and N make aligned copies of A and B that outlast the product, so the call
    goes to cupy.matmul, except in bfloat16 with a batch, which CuPy cannot compute: hopmm's
    kernels then run it, copies and all. (The result, of odd rows too, is stored by rows and
    copies nothing.)"""
    import cupy

    import hopmm

    a, b = rand((4, 128, 10001), dtype), rand((4, 10001, 129), dtype)
    assert (hopmm.plan(a, b).path == "cupy.matmul") == routed
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = hopmm.matmul(a, b).astype(cupy.float32)
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k", [(102, 1074, 12336), (3797, 98, 3090), (155, 820, 9254)])
def test_routed_repeats_are_cupy_matmul_bit_for_bit(dtype, m, n, k):
    """Routed products of unaligned rows repeat through cuBLAS's gemmEx itself
    (fastpath.GemmRoute): on new operands each time, on the default and on another stream,
    the result is cupy.matmul's bit for bit."""
    import cupy

    import hopmm
    from hopmm import fastpath

    shapes = [(m, k), (k, n)]
    assert hopmm.plan(rand(shapes[0], dtype), rand(shapes[1], dtype)).path == "cupy.matmul"
    for stream in (cupy.cuda.Stream.null, cupy.cuda.Stream(non_blocking=True)):
        with stream:
            for _ in range(3):
                a, b = rand(shapes[0], dtype), rand(shapes[1], dtype)
                cupy.full((m, n), cupy.nan, dtype=dtype)   # poison the pool's block
                got = hopmm.matmul(a, b)
                ref = cupy.matmul(a, b)
                assert bool((got.view(cupy.uint16) == ref.view(cupy.uint16)).all())
        stream.synchronize()
    assert type(fastpath.lookup(fastpath.key(a, b, None))) is fastpath.GemmRoute


@pytest.mark.parametrize("layout", ["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("m,n,k,tile", [(13248, 1472, 64, "128x256"), (8000, 4352, 40, "128x192"),
                                        (7000, 8192, 64, "64x256"),     # a large result
                                        (2000, 8192, 64, "128x256"),
                                        (9536, 8256, 128, "128x192"),   # two k-blocks
                                        (8000, 7912, 40, "64x256")])    # B rows off lines
def test_store_bound_choice(m, n, k, tile, layout):
    """At most two k-blocks and a large result (heuristics._store_bound): the persistent
    kernel with the whole tile staged per consumer, waves along rows of tiles (the 64 x 256
    tile only where the device's DRAM writes no faster than it stores); every element written
    (NaN-poisoned output, a spare row after it), bitwise repeatable."""
    import cupy

    import hopmm
    from forced import operands
    from hopmm.device import query

    a, b = operands(m, n, k, "float16", layout[0] == "T", layout[1] == "T")
    buf = cupy.full((m + 1) * n, cupy.nan, dtype="float16")
    out = buf[:m * n].reshape(m, n)
    text = hopmm.explain(a, b, out)
    tiles = [f"so {tile} tiles"]
    if tile == "64x256" and not heuristics.short_store_tile_keeps_pace(
            query(cupy.cuda.Device().id)):   # DRAM writes faster than that tile stores
        tiles = [f"so 128x{width} tiles" for width in heuristics.STORE_BOUND_WIDTHS]
    assert "the stores set the pace" in text and any(t in text for t in tiles), text
    assert f"tiles in groups of {heuristics.STORE_BOUND_RASTER_GROUP} M-tiles" in text, text
    hopmm.matmul(a, b, out=out)
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = out.astype(cupy.float32)
    assert not bool(cupy.isnan(got).any())
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL["float16"]
    assert bool(cupy.isnan(buf[m * n:].astype(cupy.float32)).all())
    again = hopmm.matmul(a, b)
    assert bool(cupy.array_equal(again.view(cupy.uint16), out.view(cupy.uint16)))


def test_dram_bandwidth_is_read_from_the_device():
    """The peak the time models' DRAM rates are scaled by (heuristics.dram_scale), from the
    memory clock and bus width the device reports; explain names it where it is not the
    H100's."""
    import cupy

    import hopmm
    from hopmm.device import query

    dev = query(cupy.cuda.Device().id)
    assert dev.dram_tbps is not None and 1.0 < dev.dram_tbps < 20.0
    why = hopmm.plan(rand((256, 256), "float16"), rand((256, 256), "float16")).reason
    scale = heuristics.dram_scale(dev)
    assert (f"x {scale:.2f}" in why) == (scale != 1.0), why

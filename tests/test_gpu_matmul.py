"""GPU tier: hopmm.matmul against cupy.matmul (cuBLAS) on fresh random inputs, outputs
poisoned with NaN first. Skips without a Hopper GPU."""

import numpy as np
import pytest

from conftest import requires_hopper
from forced import TOL, rand, rel_err

pytestmark = requires_hopper

DTYPES = ["bfloat16", "float16"]
EDGE = [1, 17, 100, 1000, 1023, 4097]


SCHEDULE_NAMES = ["warp_specialized", "persistent", "persistent_overlap", "persistent_cluster",
                  "persistent_cluster4", "persistent_cluster_overlap", "pingpong", "split_k",
                  "split_k_cluster", "split_k_parallel"]


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """Every call in these tests must run on hopmm's kernels unless a test says otherwise."""
    monkeypatch.setenv("HOPMM_STRICT", "1")


@pytest.fixture(autouse=True, params=SCHEDULE_NAMES)
def schedule(request):
    """Every test runs on every schedule (forced; the heuristic is tested on the CPU)."""
    import hopmm

    hopmm.use_schedule(request.param)
    yield request.param
    hopmm.use_schedule(None)


def poisoned_out(a, b):
    import cupy

    from hopmm.layout import matmul_shapes

    return cupy.full(matmul_shapes(a.shape, b.shape).out_shape, cupy.nan, dtype=a.dtype)


def check(a, b, dtype):
    import hopmm

    out = poisoned_out(a, b)
    res = hopmm.matmul(a, b, out=out)
    assert res is out
    assert rel_err(out, a, b) < TOL[dtype]
    fresh = hopmm.matmul(a, b)   # the path that allocates its own result
    assert fresh.dtype == a.dtype and fresh.flags.c_contiguous
    assert rel_err(fresh, a, b) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", ["m", "n", "k"])
@pytest.mark.parametrize("size", EDGE)
def test_edge_sizes(dim, size, dtype):
    shape = {"m": 300, "n": 260, "k": 200}
    shape[dim] = size
    check(rand((shape["m"], shape["k"]), dtype), rand((shape["k"], shape["n"]), dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(4097, 4097, 4097), (1023, 1000, 17), (17, 4097, 1023),
                                   (1, 1, 1), (2048, 2048, 2048), (128, 256, 64),
                                   (8192, 8192, 256),     # 2048 tiles: ~16 per SM
                                   (384, 640, 2000)])     # 15 tiles: most SMs idle
def test_mixed_sizes(m, n, k, dtype):
    check(rand((m, k), dtype), rand((k, n), dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("m,n,k", [(1000, 1023, 4097), (256, 512, 320), (17, 100, 1023)])
def test_transposed(ta, tb, m, n, k, dtype):
    a = rand((k, m), dtype).T if ta else rand((m, k), dtype)
    b = rand((n, k), dtype).T if tb else rand((k, n), dtype)
    check(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view,copies", [
    ("rows_offset", ""),        # aligned row offsets: read in place
    ("padded_ld", ""),          # leading dimensions larger than the extents: in place
    ("cols_offset", "a, b"),    # bases 6 and 2 bytes off alignment: aligned copies
    ("col_step", "a"),          # no contiguous axis in A
    ("row_step", "b"),          # no contiguous axis in B
    ("negative", "a, b"),       # negative strides
])
def test_sliced_views(view, copies, dtype):
    import hopmm

    big_a, big_b = rand((700, 600), dtype), rand((600, 520), dtype)
    a, b = {
        "rows_offset": (big_a[8:520, :], big_b[:, 8:]),
        "padded_ld": (big_a[:, :520], big_b[:520, :264]),
        "cols_offset": (big_a[:, 3:400], big_b[3:400, 1:]),
        "col_step": (big_a[:, ::2], big_b[::2, :]),
        "row_step": (big_a[::3, :], big_b[:, ::3]),
        "negative": (big_a[::-1, :], big_b[:, ::-1]),
    }[view]
    text = hopmm.explain(a, b)
    assert (f"aligned copies of {copies}" in text) if copies else ("aligned copies" not in text)
    check(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_shape,b_shape", [
    ((4, 200, 300), (4, 300, 100)),
    ((200, 300), (3, 300, 100)),
    ((3, 200, 300), (300, 100)),
    ((2, 1, 200, 64), (3, 64, 136)),
    ((2, 1, 130, 70), (1, 3, 70, 90)),
    ((2, 1, 3, 50, 40), (1, 5, 1, 40, 30)),   # operand batch dims that are not one run
    ((6, 17, 1023), (6, 1023, 17)),
], ids=str)
def test_batched_and_broadcast(a_shape, b_shape, dtype):
    check(rand(a_shape, dtype), rand(b_shape, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_transposed_views(dtype):
    a = rand((5, 300, 200), dtype).transpose(0, 2, 1)
    b = rand((5, 260, 300), dtype).transpose(0, 2, 1)
    check(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_shape,b_shape", [((300,), (300, 200)), ((200, 300), (300,)),
                                             ((300,), (300,)), ((4, 100, 64), (64,)),
                                             ((64,), (3, 64, 40))], ids=str)
def test_vectors(a_shape, b_shape, dtype):
    check(rand(a_shape, dtype), rand(b_shape, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_non_contiguous(dtype):
    import cupy

    import hopmm

    a, b = rand((300, 200), dtype), rand((200, 256), dtype)
    big = cupy.full((300, 512), cupy.nan, dtype=dtype)
    out = big[:, ::2]
    hopmm.matmul(a, b, out=out)
    assert rel_err(out, a, b) < TOL[dtype]
    assert bool(cupy.isnan(big[:, 1::2]).all()), "wrote outside the out view"


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_partial_row_no_overrun(dtype):
    """A 17-wide out inside a wider array: the neighbours past each row stay untouched."""
    import cupy

    import hopmm

    a, b = rand((100, 64), dtype), rand((64, 17), dtype)
    big = cupy.full((100, 32), cupy.nan, dtype=dtype)
    out = big[:, :17]
    hopmm.matmul(a, b, out=out)
    assert rel_err(out, a, b) < TOL[dtype]
    assert bool(cupy.isnan(big[:, 17:]).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["a", "b"])
def test_out_overlapping_input(which, dtype):
    """out is an input: 512 tiles, several waves, so later tiles would read rows of B (or A)
    that earlier tiles had already overwritten were the result stored in place."""
    import hopmm

    a, b = rand((4096, 4096), dtype), rand((4096, 4096), dtype)
    a0, b0 = a.copy(), b.copy()
    hopmm.matmul(a, b, out=a if which == "a" else b)
    assert rel_err(a if which == "a" else b, a0, b0) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_overlapping_through_another_allocation(dtype):
    """An out that aliases an input through a separately wrapped pointer (as DLPack or
    foreign memory gives): CuPy cannot tell they share memory; hopmm compares addresses."""
    import cupy

    import hopmm

    base, b = rand((2049, 2048), dtype), rand((2048, 2048), dtype)
    a = base[1:]
    a0 = a.copy()
    alias = cupy.ndarray(a.shape, a.dtype, cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(a.data.ptr, a.nbytes, base), 0))
    hopmm.matmul(a, b, out=alias)
    assert rel_err(alias, a0, b) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_sizes(dtype):
    import cupy

    import hopmm

    assert hopmm.matmul(rand((0, 5), dtype), rand((5, 7), dtype)).shape == (0, 7)
    assert hopmm.matmul(rand((3, 5), dtype), rand((5, 0), dtype)).shape == (3, 0)
    assert hopmm.matmul(rand((0, 3, 5), dtype), rand((5, 2), dtype)).shape == (0, 3, 2)
    out = cupy.full((4, 6), cupy.nan, dtype=dtype)
    hopmm.matmul(rand((4, 0), dtype), rand((0, 6), dtype), out=out)
    assert bool((out == 0).all())


def test_errors():
    import cupy

    import hopmm

    a = rand((4, 5), "float16")
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        hopmm.matmul(a, rand((4, 5), "float16"))
    with pytest.raises(ValueError, match="scalar"):
        hopmm.matmul(a, cupy.asarray(np.float16(2)))
    with pytest.raises(ValueError, match="broadcast"):
        hopmm.matmul(rand((2, 4, 5), "float16"), rand((3, 5, 4), "float16"))
    with pytest.raises(TypeError, match="cupy.ndarray"):
        hopmm.matmul(a, np.ones((5, 4), np.float16))
    with pytest.raises(ValueError, match="out has shape"):
        hopmm.matmul(a, rand((5, 3), "float16"), out=rand((4, 4), "float16"))


def test_fallback_visible_and_strict(monkeypatch):
    import cupy

    import hopmm

    a, b = rand((64, 32), "float32"), rand((32, 48), "float32")
    assert "cupy.matmul" in hopmm.explain(a, b)
    with pytest.raises(hopmm.FallbackError, match="float32"):
        hopmm.matmul(a, b)
    monkeypatch.setenv("HOPMM_STRICT", "0")
    np.testing.assert_allclose(cupy.asnumpy(hopmm.matmul(a, b)), cupy.asnumpy(a @ b),
                               rtol=1e-5, atol=1e-4)


# The tile each schedule takes for 4096 x 4096 x 4096: 512 tiles of 128 x 256 fill 3.9 waves
# (192 would need 5.3); persistent_overlap has 128 and 192 (8 waves of 128 at 0.9 x the speed
# against 6 of 192: 1138 against 1141 tile-width units); cluster pairs: 256 tiles of 128 x 256
# in 3.9 waves of 66 clusters (persistent_cluster_overlap, 128 or 192 wide: 7.8 waves of pairs
# of 128 against 5.3 of 192, as persistent_overlap); clusters of four, 30 of them at once on an
# H100: 704 tiles of 128 x 192 in 5.9 waves (6 tile-times of 192 / 1.01) against 512 of 128 x
# 256 in 4.3 (5 of 256); pingpong and the split-K schedules have 128-wide tiles only.
EXPLAIN_4096_WIDTH = {"warp_specialized": 256, "persistent": 256, "persistent_overlap": 128,
                      "persistent_cluster": 256, "persistent_cluster4": 192,
                      "persistent_cluster_overlap": 128,
                      "pingpong": 128, "split_k": 128, "split_k_cluster": 128,
                      "split_k_parallel": 128}


def test_explain_kernel_path(schedule):
    import hopmm

    text = hopmm.explain(rand((4096, 4096), "bfloat16"), rand((4096, 4096), "bfloat16"))
    assert "path: kernel" in text and f"schedule: {schedule}" in text
    assert f"128x{EXPLAIN_4096_WIDTH[schedule]}" in text


@pytest.mark.parametrize("dtype", DTYPES)
def test_bitwise_deterministic(dtype):
    import cupy

    import hopmm

    a, b = rand((1000, 700), dtype), rand((700, 1030), dtype)
    r1, r2 = hopmm.matmul(a, b), hopmm.matmul(a, b)
    assert bool(cupy.array_equal(r1.view(cupy.uint16), r2.view(cupy.uint16)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeat_calls_take_the_fast_path_with_new_data(dtype, monkeypatch):
    """Later calls of one shape reuse the first call's launches on their own arrays: after
    the first round, the planning path is never entered again."""
    import hopmm
    from hopmm import api, fastpath

    fastpath.clear()
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    for _ in range(3):
        a, b = rand((384, 320), dtype), rand((320, 512), dtype)
        out = poisoned_out(a, b)
        hopmm.matmul(a, b, out=out)
        assert rel_err(out, a, b) < TOL[dtype]
        fresh = hopmm.matmul(a, b)
        assert rel_err(fresh, a, b) < TOL[dtype]
    assert len(planned) == 2  # the first out= call and the first fresh-result call


def test_repeat_launches_reuse_cached_maps_only_for_their_own_arrays():
    """KernelLaunch keeps the tensor maps of the last few base addresses of each operand: a
    rotation through more operand sets than it keeps, revisited in another order and with
    operands swapped between sets, must read each call's own arrays every time."""
    import hopmm
    from hopmm import fastpath

    fastpath.clear()
    sets = [(rand((384, 320), "bfloat16"), rand((320, 512), "bfloat16")) for _ in range(7)]
    outs = [poisoned_out(a, b) for a, b in sets]
    order = list(range(7)) + [6, 0, 3, 3, 1, 5, 2, 4, 0]
    for i in order:
        a, b = sets[i]
        b_other = sets[(i + 1) % 7][1]   # A of one set with B of another
        for bb in (b, b_other):
            out = outs[i]
            out.fill(float("nan"))
            hopmm.matmul(a, bb, out=out)
            assert rel_err(out, a, bb) < TOL["bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["odd_rows", "transposed_odd", "vector", "sliced_offset",
                                  "batched_odd", "broadcast_materialised"])
def test_repeat_calls_with_aligned_copies(case, dtype, monkeypatch):
    """Calls whose operands or result need aligned copies are remembered with those copies
    (made again from each call's own arrays), except where a copy is not of a view of the
    caller's array (a materialised broadcast): those are planned every time."""
    import hopmm
    from hopmm import api, fastpath

    def operands():
        big = rand((3, 600, 800), dtype)
        return {"odd_rows": (rand((300, 1023), dtype), rand((1023, 517), dtype)),
                "transposed_odd": (rand((1023, 300), dtype).T, rand((1023, 517), dtype)),
                "vector": (rand((1023,), dtype), rand((1023, 517), dtype)),
                "sliced_offset": (big[1, 3:303, 5:799], rand((794, 517), dtype)),  # 10 B in
                "batched_odd": (rand((3, 300, 1023), dtype), rand((3, 1023, 517), dtype)),
                # A varies over batch dims 0 and 2 of (2, 4, 3): not one strided view
                "broadcast_materialised": (rand((2, 1, 3, 300, 64), dtype),
                                           rand((1, 4, 1, 64, 517), dtype))}[case]

    fastpath.clear()
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    for _ in range(3):
        a, b = operands()
        got = hopmm.matmul(a, b)
        assert rel_err(got, a, b) < TOL[dtype]
    assert len(planned) == (3 if case == "broadcast_materialised" else 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_path_declines_an_overlapping_out(dtype):
    import hopmm

    a, b = rand((256, 256), dtype), rand((256, 256), dtype)
    hopmm.matmul(a, b, out=rand((256, 256), dtype))   # remembered with a separate out
    a0 = a.copy()
    hopmm.matmul(a, b, out=a)                          # same key, but out is a
    assert rel_err(a, a0, b) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_path_respects_alignment(dtype):
    """Same shape and strides, but a base 2 bytes off 16-byte alignment: not the same call."""
    big = rand((300, 264), dtype)
    aligned, shifted = big[:, :256], big[:, 1:257]
    b = rand((256, 128), dtype)
    check(aligned, b, dtype)
    check(shifted, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_shape", [(70000, 16, 24), (16, 24)], ids=["batched", "broadcast"])
def test_more_batches_than_one_grid_holds(b_shape, dtype):
    """70000 batches: more than gridDim.z's 65535, so launches are split with an offset."""
    check(rand((70000, 16, 16), dtype), rand(b_shape, dtype), dtype)


def test_result_lives_on_the_operands_device():
    import cupy

    import hopmm

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cupy.cuda.Device(1):
        a, b = rand((256, 128), "bfloat16"), rand((128, 192), "bfloat16")
    with cupy.cuda.Device(0):
        c = hopmm.matmul(a, b)
    assert c.device.id == 1
    with cupy.cuda.Device(1):
        assert rel_err(c, a, b) < TOL["bfloat16"]

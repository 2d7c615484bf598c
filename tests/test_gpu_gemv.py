"""GPU tier, gemv (the memory-streaming schedule for outputs of few rows): against cupy.matmul
into NaN-poisoned outputs over its edge shapes (1-64 rows and past 64, N and K odd and not
multiples of the 8-element vector, K below one vector), both B layouts, M-major A, sliced and
transposed views, batches and broadcasts, explicit K splits, rows read where they lie at every
offset and through aligned copies; bitwise repeatable run to run; the split-K counters back at
zero after every kernel. Skips without a Hopper GPU."""
import dataclasses

import pytest

import forced
from conftest import requires_hopper
from forced import TOL, rand, rel_err

pytestmark = requires_hopper



@pytest.fixture(autouse=True)
def _gemv(monkeypatch):
    """Every call runs on gemv (use_schedule), never on cupy.matmul (HOPMM_STRICT)."""
    import hopmm

    monkeypatch.setenv("HOPMM_STRICT", "1")
    hopmm.use_schedule("gemv")
    yield
    hopmm.use_schedule(None)


def poisoned_matmul(a, b):
    """hopmm.matmul(a, b) into a NaN-filled out."""
    import cupy

    import hopmm
    from hopmm import layout

    out = cupy.full(layout.matmul_shapes(a.shape, b.shape).out_shape, cupy.nan, dtype=a.dtype)
    assert hopmm.matmul(a, b, out=out) is out
    return out


def counters_zero() -> bool:
    """Every gemv scratch's counters are zero (each launch resets those it used)."""
    import cupy

    from hopmm import workspace
    from hopmm.schedules import GEMV_COUNTERS

    cupy.cuda.Device().synchronize()
    return all(not bool(buf[:4 * GEMV_COUNTERS].view(cupy.uint32).any())
               for buf in workspace._gemv_scratch.values())


def run_gemv(a, b, splits=None, **config):
    """C = A @ B on gemv with exactly `splits` K splits (None: the heuristic's) and config
    fields replaced by `config`, into a poisoned result. Returns (C, the choice)."""
    from hopmm import heuristics

    # Operands read where they lie (the call made no aligned copy) keep the in-place loads.
    in_place = _call_reads_in_place(a, b)

    def adjust(problem, dev):
        choice = heuristics.choose(problem, dev, "gemv")
        cfg = dataclasses.replace(choice.config, **{"in_place": in_place, **config})
        return dataclasses.replace(choice, config=cfg, splits=splits or choice.splits)

    return forced.run_choice(a, b, adjust, in_place=in_place)


def _has_unaligned_rows(a, b) -> bool:
    from hopmm import api, layout

    return api._unaligned_operand_bytes(a, b, layout.matmul_shapes(a.shape, b.shape)) > 0


def _call_reads_in_place(a, b) -> bool:
    """Whether the call's choice reads the operands where they lie (GemvConfig.in_place)."""
    from hopmm import api, layout

    call = api._kernel_call(a, b, layout.matmul_shapes(a.shape, b.shape))
    return getattr(call.choice.config, "in_place", False)


ROWS = [1, 2, 3, 7, 8, 15, 16]
# (N, K): odd N and K, neither a multiple of 8; K below one vector; long K; N below one vector.
SIZES = [(1000, 4096), (257, 1001), (24, 5), (4104, 777), (7, 300)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("n,k", SIZES, ids=[f"n{n}_k{k}" for n, k in SIZES])
@pytest.mark.parametrize("m", ROWS)
def test_gemv_matches_cupy(m, n, k, b_major, dtype):
    a = rand((m, k), dtype)
    b = rand((k, n), dtype) if b_major == "n" else rand((n, k), dtype).T
    c = poisoned_matmul(a, b)
    assert rel_err(c, a, b) < TOL[dtype]
    assert counters_zero()


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (5, 1000, 4097), (16, 300, 2000),
                                   (3, 40, 130)])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16])
def test_explicit_splits(m, n, k, b_major, splits):
    """K split across CTAs into uneven slices (K not a multiple of the splits), reduced by
    each tile's last CTA; counters back at zero."""
    dtype = "bfloat16"
    a = rand((m, k), dtype)
    b = rand((k, n), dtype) if b_major == "n" else rand((n, k), dtype).T
    c, choice = run_gemv(a, b, splits)
    assert choice.splits == splits and choice.schedule.name == "gemv"
    assert rel_err(c, a, b) < TOL[dtype]
    assert counters_zero()


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("splits", [1, 5])
def test_bitwise_repeatable(b_major, splits):
    """The same operands give the same bits on every run, split or not (the split partials
    are added in split order whichever CTA arrives last)."""
    import cupy

    dtype = "bfloat16"
    a = rand((4, 6000), dtype)
    b = rand((6000, 3000), dtype) if b_major == "n" else rand((3000, 6000), dtype).T
    first, _ = run_gemv(a, b, splits)
    bits = first.view(cupy.uint16).copy()
    for _ in range(5):
        again, _ = run_gemv(a, b, splits)
        assert bool(cupy.array_equal(again.view(cupy.uint16), bits))
    assert counters_zero()


@pytest.mark.parametrize("config", [dict(warps=4), dict(cols=2), dict(cols=8, unroll=1),
                                    dict(unroll=4), dict(max_rows=16)])
def test_tunables_k_major(config):
    """Other warps / columns / unroll / row steps of K-major B (bench/gemv_tune.py's sweep);
    K = 2056: B's rows are whole vectors (read in place, K-major), 257 of them per column."""
    a, b = rand((3, 2056), "float16"), rand((517, 2056), "float16").T
    c, choice = run_gemv(a, b, 3, **config)
    assert not choice.config.trans_b
    assert rel_err(c, a, b) < TOL["float16"]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("rows", [6, 8, 16])
@pytest.mark.parametrize("k", [2056, 2049])
def test_narrow_tensor_core_ctas(rows, k, splits):
    """The tensor-core K-major loop on 64-column CTAs (GemvConfig.narrow: 4 warps, 8 chunks
    each), unsplit and split, over 517 columns (a partial last block) and K of whole vectors
    or read in place (2049: rows off 16 bytes)."""
    a, b = rand((rows, k), "bfloat16"), rand((517, k), "bfloat16").T
    c, choice = run_gemv(a, b, splits, mma=True, cols=1, warps=4, unroll=8)
    assert choice.config.mma and not choice.config.trans_b and choice.config.block_n == 64
    assert rel_err(c, a, b) < TOL["bfloat16"]


@pytest.mark.parametrize("config", [dict(warps=8, unroll=8), dict(unroll=8),
                                    dict(warps=16, unroll=8), dict(max_rows=8)])
def test_tunables_n_major(config):
    """Other warps / unroll / row steps of N-major B than the default's 4 x 16 (the former
    default, 8 warps of 8 rows, among them)."""
    a, b = rand((3, 2049), "float16"), rand((2049, 517), "float16")
    c, _ = run_gemv(a, b, 3, **config)
    assert rel_err(c, a, b) < TOL["float16"]


# Every 16-bit element of this pattern is a NaN in bfloat16 and in float16.
NAN_16 = 0x7FC0


def _dirty_pool():
    """Fills memory the pool then hands out again with 16-bit NaNs: a read of anything a
    kernel was not given (padding of an aligned copy, elements past K) then shows in its
    result."""
    import cupy

    junk = [cupy.full((1 << 21,), NAN_16, dtype=cupy.uint16) for _ in range(64)]
    del junk


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "copies"])
@pytest.mark.parametrize("k", [5, 1030])
@pytest.mark.parametrize("a_major,b_major", [("k", "k"), ("k", "n"), ("m", "k"), ("m", "n")])
@pytest.mark.parametrize("m,n", [(16, 2000), (2000, 16), (8, 300), (300, 8)])
def test_k_tails_over_dirty_memory(m, n, k, a_major, b_major, in_place, monkeypatch):
    """K not a multiple of the 32-element chunk, in every layout, both ways round (C^T =
    B^T A^T for few columns), with odd pitches (read where they lie, NaN past K; or, with
    in-place reads off, aligned copies whose padding is NaN) and without, on memory that held
    NaN: nothing past K reaches a result."""
    import cupy

    from hopmm import api

    if not in_place:
        monkeypatch.setattr(api, "_in_place_gemv", lambda *args, **kw: None)
    dtype = "bfloat16"

    def nan_padded(rows, cols, pad):
        x = cupy.full((rows, cols + pad), cupy.nan, dtype=dtype)
        x[:, :cols] = rand((rows, cols), dtype)
        return x[:, :cols]

    # K-major operands: pitches of whole 16-byte vectors (read in place, NaN between K and
    # the pitch) and odd ones (aligned copies); the M- and N-major ones are copied either way.
    for pad in ((-k) % 8 or 8, 1):
        _dirty_pool()
        a = nan_padded(m, k, pad) if a_major == "k" else nan_padded(k, m, pad).T
        b = nan_padded(n, k, pad).T if b_major == "k" else nan_padded(k, n, pad)
        _dirty_pool()
        c, choice = run_gemv(a, b, mma=True, cols=1, unroll=2,
                             max_rows=8 if min(m, n) <= 8 else 16)
        assert choice.config.mma
        assert choice.config.in_place == (in_place and _has_unaligned_rows(a, b))
        assert rel_err(c, a, b) < TOL[dtype]


@pytest.mark.parametrize("batch,k", [(1, 100), (3, 1030), (2, 72)])
def test_aligned_copies_get_zeroed_row_tails(batch, k):
    """launch.zero_row_tails on the GPU (cuMemsetD2D8Async): in an aligned copy over NaN-filled
    memory, exactly the bytes from each row's end to its next 16-byte boundary become zero;
    rows that end on one are left alone."""
    import cupy

    from hopmm import launch

    x = rand((batch, 7, k), "bfloat16")[:, :, ::-1]   # reversed: copied
    copy, axis = launch.prepare_operand(x)
    assert axis == "cols" and copy.data.ptr != x.data.ptr
    pitch = copy.strides[1] // copy.itemsize
    whole = cupy.ndarray((batch, 7, pitch), copy.dtype, copy.data, copy.strides)
    whole[:, :, k:] = cupy.nan
    launch.zero_row_tails(copy)
    bits = whole.view(cupy.uint16)
    tail = -k % 8   # elements to the next 16-byte boundary
    assert bool((bits[:, :, k:k + tail] == 0).all())
    assert bool(cupy.isnan(whole[:, :, k + tail:]).all())
    assert bool((bits[:, :, :k] == x.view(cupy.uint16)).all())


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m,config", [(3, dict(max_rows=8)), (13, dict(unroll=2)),
                                      (16, dict(unroll=3, warps=4)), (11, dict(warps=2))])
def test_tunables_tensor_cores(m, config, b_major):
    """The mma loops at other unrolls, warps and row steps, over K = 2049 (a last chunk of one
    element) and N = 517 (a part of the last column block)."""
    a = rand((m, 2049), "bfloat16")
    b = rand((517, 2049), "bfloat16").T if b_major == "k" else rand((2049, 517), "bfloat16")
    mma = dict(mma=True, cols=1, max_rows=16, unroll=1)
    c, choice = run_gemv(a, b, 3, **{**mma, **config})
    assert choice.config.mma
    assert rel_err(c, a, b) < TOL["bfloat16"]


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m", [1, 8, 16])
def test_m_major_a(m, b_major):
    """A transposed view (contiguous along M), read element by element."""
    dtype = "bfloat16"
    a = rand((1500, m), dtype).T
    b = rand((1500, 700), dtype) if b_major == "n" else rand((700, 1500), dtype).T
    assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]


@pytest.mark.parametrize("m", [17, 40, 100])
def test_rows_past_sixteen_take_row_groups(m):
    dtype = "bfloat16"
    for b in (rand((640, 900), "bfloat16"), rand((900, 640), "bfloat16").T):
        a = rand((m, 640), dtype)
        assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]


FEW_COLUMNS = [(1001, 1, 777), (4096, 3, 4096), (300, 8, 5), (2000, 16, 1030)]


@pytest.mark.parametrize("layouts", ["kk", "kn", "mk", "mn"])
@pytest.mark.parametrize("m,n,k", FEW_COLUMNS, ids=[f"{m}x{n}x{k}" for m, n, k in FEW_COLUMNS])
def test_few_columns_run_transposed(m, n, k, layouts):
    """More rows than columns: the kernel computes C^T = B^T A^T, streaming A, and stores C
    transposed (A: K- or M-major; B: K- or N-major)."""
    dtype = "bfloat16"
    a = rand((m, k), dtype) if layouts[0] == "k" else rand((k, m), dtype).T
    b = rand((n, k), dtype).T if layouts[1] == "k" else rand((k, n), dtype)
    c, choice = run_gemv(a, b)
    assert choice.config.trans_c
    assert rel_err(c, a, b) < TOL[dtype]
    assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]
    c, _ = run_gemv(a, b, min(3, -(-k // 8)))   # at most a split per 8-element vector of K
    assert rel_err(c, a, b) < TOL[dtype]
    assert counters_zero()


def test_matrix_times_vector_default_path():
    """Unforced, a matrix times a vector runs on the transposed gemv."""
    import hopmm

    hopmm.use_schedule(None)
    a, v = rand((8192, 8192), "bfloat16"), rand((8192,), "bfloat16")
    assert "C^T = B^T A^T" in hopmm.explain(a, v)
    got = hopmm.matmul(a, v)
    assert got.shape == (8192,)
    assert rel_err(got[:, None], a, v[:, None]) < TOL["bfloat16"]


def test_sliced_views_and_vectors():
    import hopmm

    dtype = "float16"
    a = rand((40, 2100), dtype)[10:14, 8:2008]     # 4200-byte row pitch: an aligned copy
    b = rand((2000, 2, 96), dtype)[:, 1, :]        # every other row of 96: read in place
    assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]
    w = rand((3000, 2048), dtype)[100:2100, :2000]  # a sliced torch-style weight, used as w.T
    assert rel_err(poisoned_matmul(a, w.T), a, w.T) < TOL[dtype]
    v = rand((2000,), dtype)                        # vector @ matrix: one row
    got = hopmm.matmul(v, b)
    assert got.shape == (96,)
    assert rel_err(got[None, :], v[None, :], b) < TOL[dtype]


@pytest.mark.parametrize("b_major", ["k", "n"])
def test_batches(b_major):
    """Batched A with B broadcast (a decode step of several sequences), batched both, and a
    batch broadcast over inner and outer dimensions."""
    dtype = "bfloat16"
    b = rand((1024, 3000), dtype) if b_major == "n" else rand((3000, 1024), dtype).T
    a = rand((5, 2, 1024), dtype)
    assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]
    bb = rand((5, 1024, 300), dtype) if b_major == "n" else \
        rand((5, 300, 1024), dtype).transpose(0, 2, 1)
    assert rel_err(poisoned_matmul(a, bb), a, bb) < TOL[dtype]
    a4 = rand((2, 1, 3, 1024), dtype)
    b4 = rand((1, 3, 1024, 72), dtype)
    assert rel_err(poisoned_matmul(a4, b4), a4, b4) < TOL[dtype]
    assert counters_zero()


def test_repeat_calls_take_the_fast_path_on_new_operands():
    """The remembered launches (fastpath.Recipe) read each call's own operands."""
    import hopmm
    from hopmm import fastpath

    fastpath.clear()
    for _ in range(3):
        a, b = rand((2, 4096), "bfloat16"), rand((1000, 4096), "bfloat16").T
        assert rel_err(hopmm.matmul(a, b), a, b) < TOL["bfloat16"]
    assert counters_zero()


@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m", [1, 4, 8, 16])
def test_decode_default_path(m, b_major):
    """Unforced, the heuristic takes the schedule its model picks on the issue's decode shapes:
    on the H100 the models were fitted on, gemv for K-major B, on tensor cores from 8 rows; for
    N-major B gemv on one row, then the unsplit persistent tiles (NOTES v0.21, v0.35); on a
    device of other DRAM bandwidth one of the streams the models weigh (v0.52). The result is
    right."""
    import cupy

    import hopmm
    from hopmm import heuristics
    from hopmm.device import query

    hopmm.use_schedule(None)
    dtype = "bfloat16"
    a = rand((m, 8192), dtype)
    b = rand((8192, 8192), dtype) if b_major == "n" else rand((8192, 8192), dtype).T
    text = hopmm.explain(a, b)
    if heuristics.dram_scale(query(cupy.cuda.Device().id)) == 1.0:
        expected = ("persistent" if b_major == "n" and m > heuristics.GEMV_N_MAJOR_MAX_ROWS
                    else "gemv")
        assert f"schedule: {expected}\n" in text, text
    else:
        assert any(f"schedule: {s}\n" in text
                   for s in ("gemv", "persistent", "split_k_parallel")), text
    out = cupy.full((m, 8192), cupy.nan, dtype=dtype)
    hopmm.matmul(a, b, out=out)
    assert rel_err(out, a, b) < TOL[dtype]
    assert counters_zero()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64, 100])
def test_in_place_rows_at_every_offset(m, b_major, dtype):
    """Rows read where they lie (GemvConfig.in_place): views starting at each of the 8 element
    offsets of a 16-byte vector, over odd pitches (so every row starts at another offset), both
    B layouts, 1-16 rows a CTA and row groups past 16, K and N with tails; no aligned copy,
    and the result of odd rows stored in place."""
    from hopmm import api, layout

    k, n = 1003, 517
    for offset in range(8):
        a = rand((m, k + 9), dtype)[:, offset:offset + k]
        b = (rand((k, n + 9), dtype)[:, offset:offset + n] if b_major == "n"
             else rand((n, k + 9), dtype)[:, offset:offset + k].T)
        call = api._kernel_call(a, b, layout.matmul_shapes(a.shape, b.shape))
        assert call.choice.config.in_place and call.copies == []
        assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]
    assert counters_zero()


@pytest.mark.parametrize("n", [1, 7, 13, 37])
@pytest.mark.parametrize("a_major", ["k", "m"])
def test_in_place_few_columns(n, a_major):
    """More rows than columns, A's rows odd: C^T = B^T A^T streams A where it lies."""
    dtype = "float16"
    m, k = 3001, 1003
    a = (rand((m, k + 5), dtype)[:, 3:3 + k] if a_major == "k"
         else rand((k, m + 5), dtype)[:, 3:3 + m].T)
    b = rand((k, n + 3), dtype)[:, 1:1 + n]
    c, choice = run_gemv(a, b)
    assert choice.config.trans_c and choice.config.in_place
    assert rel_err(c, a, b) < TOL[dtype]
    assert rel_err(poisoned_matmul(a, b), a, b) < TOL[dtype]
    c, _ = run_gemv(a, b, 4)
    assert rel_err(c, a, b) < TOL[dtype]
    assert counters_zero()


@pytest.mark.parametrize("m,n,k", [(16, 29821, 2013), (9821, 13, 1687), (4, 8191, 8191)])
def test_unaligned_decode_takes_gemv_in_place(m, n, k):
    """Unforced, decode products whose rows are not 16-byte aligned (an odd vocabulary, an odd
    hidden size) run on gemv reading the rows in place; bitwise repeatable."""
    import cupy

    import hopmm

    hopmm.use_schedule(None)
    dtype = "bfloat16"
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    text = hopmm.explain(a, b)
    assert "schedule: gemv" in text and "read where they lie" in text, text
    first = poisoned_matmul(a, b)
    assert rel_err(first, a, b) < TOL[dtype]
    assert bool((poisoned_matmul(a, b).view(cupy.uint16) == first.view(cupy.uint16)).all())
    assert counters_zero()


@pytest.mark.parametrize("mma,in_place,rows", [(False, False, 1), (False, False, 4),
                                               (False, False, 8), (True, False, 16),
                                               (False, True, 4), (True, True, 16)])
def test_residency_is_the_drivers(mma, in_place, rows):
    """The CTAs an SM holds at once that gemv's split count weighs (heuristics.
    gemv_resident_ctas, from the compiled registers, threads and shared memory) are those the
    driver's occupancy query gives for the loaded kernel."""
    import cupy

    from hopmm import heuristics, launch
    from hopmm.device import query
    from hopmm.schedules import GemvConfig, GemvSchedule

    device_id = cupy.cuda.Device().id
    dev = query(device_id)
    cfg = GemvConfig.default("bfloat16", False, False, rows, False, mma, in_place)
    loaded, smem, _ = launch._checked_kernel(GemvSchedule, cfg, device_id)
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(loaded.kernel.ptr,
                                                                        cfg.threads, smem)
    assert per_sm >= 1
    assert heuristics.gemv_resident_ctas(cfg, dev) == per_sm * dev.sm_count, (cfg.tag, per_sm)

"""GPU test helpers: run one forced (schedule, tile, raster group) through the launch layer
into a NaN-poisoned buffer and check it against an fp32 cupy.matmul reference. A tile is its
width (128 rows) or a (rows, width) pair."""
TOL = {"bfloat16": 1e-2, "float16": 2e-3}
SPARE_ROWS = 128   # rows of NaN below each result slice: a stray store past m lands there


def rand(shape, dtype):
    import cupy

    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)


def rel_err(got, a, b):
    """Relative Frobenius error of got against an fp32 cupy.matmul; got must hold no NaN."""
    import cupy

    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = got.astype(cupy.float32)
    assert got.shape == ref.shape
    assert not bool(cupy.isnan(got).any()), "unwritten (NaN-poisoned) or NaN output elements"
    denom = float(cupy.linalg.norm(ref))
    return float(cupy.linalg.norm(got - ref)) / (denom if denom else 1.0)


def reference(a, b):
    """The fp32 cupy.matmul of a and b."""
    import cupy

    return cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))


def check_close(got, ref, dtype):
    """got (a 16-bit result) against the fp32 reference `ref`: same shape, no NaN (poisoned
    outputs left unwritten show), relative Frobenius error within TOL."""
    import cupy

    got = got.astype(cupy.float32)
    assert got.shape == ref.shape
    assert not bool(cupy.isnan(got).any()), "unwritten (NaN-poisoned) or NaN output elements"
    err = float(cupy.linalg.norm(got - ref)) / max(float(cupy.linalg.norm(ref)), 1e-30)
    assert err < TOL[dtype], err


def operands(m, n, k, dtype, ta=False, tb=False, batch=()):
    a = rand(batch + (k, m), dtype).swapaxes(-1, -2) if ta else rand(batch + (m, k), dtype)
    b = rand(batch + (n, k), dtype).swapaxes(-1, -2) if tb else rand(batch + (k, n), dtype)
    return a, b


def tile_shape(tile) -> tuple[int, int]:
    """(block_m, block_n) of a tile given as its width (128 rows) or as that pair."""
    from hopmm.schedules import BLOCK_M

    return tile if isinstance(tile, tuple) else (BLOCK_M, tile)


def run(a, b, schedule, tile, group=16, row_pitch=None, phased=False, splits=1,
        transposed=False):
    """C = A @ B on one forced schedule, tile and raster group, stored into a NaN-poisoned
    buffer with spare rows below each slice and padding right of each row. Returns (the
    result view, the whole buffer). With `row_pitch` (elements, any), the kernel is the
    row-store config (KernelConfig.row_store) and the buffer's rows lie that far apart,
    starting one element into the buffer (so no row need start on 16 bytes). With
    `phased`, A and B whose rows lie off 16 bytes are read where they lie through their phase
    maps (KernelConfig.a_pitch_mod8, b_pitch_mod8). `splits`: a split-K schedule's. With
    `transposed`, the kernel computes C^T = B^T A^T on `tile` (KernelConfig.trans_c)."""
    from dataclasses import replace

    import cupy

    from hopmm import launch, layout, operands
    from hopmm.device import query
    from hopmm.heuristics import Choice
    from hopmm.schedules import SCHEDULES, transposed_problem

    shapes = layout.matmul_shapes(a.shape, b.shape)
    call = operands.kernel_operands(a, b, shapes, phased)   # as the tile kernels read them
    sched = SCHEDULES[schedule]
    p = call.problem
    block_m, block_n = tile_shape(tile)
    smem_limit = query(cupy.cuda.Device().id).smem_per_block_optin
    kp = transposed_problem(p) if transposed else p   # the problem the kernel computes
    cfg = sched.deepest(p.dtype, block_n, kp.trans_a, kp.trans_b, smem_limit, block_m)
    if transposed:
        cfg = replace(cfg, trans_c=True)
    if phased:
        assert call.a_pitch_mod8 or call.b_pitch_mod8, "no operand for the phase maps"
        for name in ("a", "b"):
            assert not (getattr(call, f"{name}_pitch_mod8") and name in call.copies), name
        cfg = sched.phased_config(cfg, call.a_pitch_mod8, call.b_pitch_mod8, smem_limit)
    if row_pitch is None:
        padded = layout.padded(shapes.n, a.itemsize) + layout.TMA_ALIGN
        buf = cupy.full((shapes.batch, shapes.m + SPARE_ROWS, padded), cupy.nan, dtype=a.dtype)
        c3 = buf[:, :shapes.m, :shapes.n]
    else:
        cfg = replace(cfg, row_store=True)
        buf = cupy.full((shapes.batch, shapes.m + SPARE_ROWS, row_pitch + 1), cupy.nan,
                        dtype=a.dtype)
        c3 = buf[:, :shapes.m, 1:shapes.n + 1]
    if sched.split_k:   # at most the splits the schedule allows on this problem
        splits = min(splits, sched.max_splits(p, cfg, p.batch,
                                              query(cupy.cuda.Device().id).sm_count))
    if sched.name == "stream_k":   # as many CTAs a lane as the SMs allow
        splits = sched.most_ctas(p, cfg, p.batch, group, query(cupy.cuda.Device().id).sm_count)
    choice = Choice(sched, cfg, "test", group, splits)
    launches = launch.build_launches(choice, p, call.a3, call.a_map, call.b3, call.b_map, c3)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, c3.data.ptr)
    cupy.cuda.get_current_stream().synchronize()
    return c3, buf


def run_choice(a, b, adjust, in_place: bool = False):
    """C = A @ B on the heuristic's choice for the operands' problem as `adjust(problem,
    device)` returns it, through the launch layer into a NaN-poisoned result (rows padded to
    TMA's alignment). The operands as the tile kernels read them (aligned copies where TMA
    cannot read them), or with `in_place` as the call takes them (gemv reads unaligned rows
    where they lie). Returns (C in the result's shape, the choice)."""
    import cupy

    from hopmm import api, launch, layout, operands
    from hopmm.device import query

    shapes = layout.matmul_shapes(a.shape, b.shape)
    call = (api._kernel_call(a, b, shapes) if in_place
            else operands.kernel_operands(a, b, shapes))
    choice = adjust(call.problem, query(cupy.cuda.Device().id))
    s = shapes
    c3 = cupy.full((s.batch, s.m, layout.padded(s.n, a.itemsize)), cupy.nan,
                   dtype=a.dtype)[:, :, :s.n]
    launches = launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, c3)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, c3.data.ptr)
    return c3.reshape(s.out_shape), choice


def check(a, b, schedule, tile, dtype, group=16, phased=False, splits=1, transposed=False):
    """Runs `run` and asserts: every output element written and within TOL of the reference,
    nothing written below the last row or right of the last column. Returns the result."""
    import cupy

    from hopmm.layout import padded

    c3, buf = run(a, b, schedule, tile, group, phased=phased, splits=splits,
                  transposed=transposed)
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    ref = ref.reshape(c3.shape)
    got = c3.astype(cupy.float32)
    assert not bool(cupy.isnan(got).any()), "unwritten (NaN-poisoned) output elements"
    err = float(cupy.linalg.norm(got - ref)) / max(float(cupy.linalg.norm(ref)), 1e-30)
    assert err < TOL[dtype]
    m, n = c3.shape[1:]
    assert bool(cupy.isnan(buf[:, m:, :]).all()), "wrote below the last row of a slice"
    # (TMA stores whole 16-byte chunks: the columns up to the next 16 bytes may be written)
    assert bool(cupy.isnan(buf[:, :, padded(n, c3.itemsize):]).all()), "wrote right of the rows"
    return c3


def check_call(m, n, k, dtype, ta, tb, *expected) -> None:
    """hopmm.matmul (the heuristic's choice) of fresh m x k and k x n operands (A, B transposed
    views where ta, tb) into a C-contiguous out with a spare row of NaN after it: explain's text
    holds each of `expected`, the result is within TOL of the fp32 reference, the spare row
    stays NaN, a repeat is bitwise the same, and new operands through the remembered launches
    are right too."""
    import cupy

    import hopmm

    a, b = operands(m, n, k, dtype, ta, tb)
    buf = cupy.full((m + 1) * n, cupy.nan, dtype=dtype)
    out = buf[:m * n].reshape(m, n)
    text = hopmm.explain(a, b, out)
    assert all(e in text for e in expected), text
    assert hopmm.matmul(a, b, out=out) is out
    check_close(out, reference(a, b), dtype)
    assert bool(cupy.isnan(buf[m * n:].astype(cupy.float32)).all())
    again = hopmm.matmul(a, b)
    assert bool(cupy.array_equal(again.view(cupy.uint16), out.view(cupy.uint16)))
    a2, b2 = operands(m, n, k, dtype, ta, tb)
    check_close(hopmm.matmul(a2, b2), reference(a2, b2), dtype)


def check_fused_into_c(a, b, bias_form, dtype="bfloat16") -> str:
    """hopmm.matmul(a, b, c) with bias ((N,) for bias_form "columns", (M, 1) for "rows"), c,
    alpha 0.5, beta 2 and gelu, the result written into c itself (out=c), against the fp32
    computation; returns explain's text for the call."""
    import cupy

    import hopmm
    from hopmm import epilogue

    m, n = a.shape[-2], b.shape[-1]
    bias = rand((n,) if bias_form == "columns" else (m, 1), dtype)
    c = rand((m, n), dtype)
    keywords = dict(bias=bias, c=c, alpha=0.5, beta=2.0, activation="gelu")
    text = hopmm.explain(a, b, c, **keywords)
    ref = epilogue.reference(cupy, reference(a, b), bias=bias, activation="gelu", alpha=0.5,
                             beta=2.0, c=c)
    assert hopmm.matmul(a, b, c, **keywords) is c
    check_close(c, ref, dtype)
    return text

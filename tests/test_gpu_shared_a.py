"""GPU tier: matmul_shared_a and swiglu against the unfused fp32 computation, composed (the
default) and on the forced one-kernel schedules (shared_a, swiglu: both products from one A
tile per k-block), whose outputs are NaN-poisoned before the launch: tile edges, one row, K
below one k-block, transposed and misaligned views, batches; bitwise repeatable; torch in and
out on a non-default stream."""
import pytest

from conftest import requires_hopper
from forced import TOL, check_close, operands, rand

pytestmark = requires_hopper

# (m, n, k): edges in every dimension, one row, K below one k-block, a long K.
SHAPES = [(300, 704, 200), (1, 256, 64), (129, 136, 16), (65, 1000, 4160), (2000, 3000, 200)]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]


def _f32_products(a, bs):
    import cupy

    return [cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32)) for b in bs]


def _silu(x):
    from hopmm import epilogue

    import cupy

    return epilogue.activate(cupy, x, "silu")


def _forced(name, a, b0, b1, activation=None):
    """The one-kernel path of schedule `name` into NaN-poisoned results (checked to be
    taken), twice: the two runs must agree bit for bit."""
    import cupy

    import hopmm
    from hopmm import api, shared_a
    from hopmm.schedules import DUAL_B_SCHEDULES

    sched = DUAL_B_SCHEDULES[name]
    hopmm.use_schedule(name)
    try:
        p = api.plan(a, b0, activation=activation)
        checked = shared_a._Checked([p, api.plan(a, b1, activation=activation)], activation,
                                    [None, None])
        assert shared_a._one_kernel(sched, a, b0, b1, checked, 0)
        runs = []
        for _ in range(2):
            poisoned = [cupy.full(p.shapes.out_shape, cupy.nan, dtype=a.dtype)
                        for _ in range(sched.outputs)]
            runs.append(shared_a._run_dual(sched, a, b0, b1, p, activation, poisoned))
    finally:
        hopmm.use_schedule(None)
    for first, second in zip(*runs):
        assert bool((first.view(cupy.uint16) == second.view(cupy.uint16)).all())
    return runs[0]


@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_swiglu_kernel(m, n, k, ta, tb, dtype):
    a, g = operands(m, n, k, dtype, ta, tb)
    _, u = operands(m, n, k, dtype, ta, tb)
    # Weights scaled as a model's are: products of unit size, whose gated product cannot
    # overflow float16 (with unit weights, K = 4160 makes it about 1e-3 likely per call).
    g *= k ** -0.5   # in place: the views keep their layouts
    u *= k ** -0.5
    p_gate, p_up = _f32_products(a, [g, u])
    (y,) = _forced("swiglu", a, g, u)
    check_close(y, _silu(p_gate) * p_up, dtype)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES[:3])
def test_shared_a_kernel(m, n, k, ta, tb, activation):
    from hopmm import epilogue

    import cupy

    dtype = "bfloat16"
    a, b0 = operands(m, n, k, dtype, ta, tb)
    _, b1 = operands(m, n, k, dtype, ta, tb)
    ys = _forced("shared_a", a, b0, b1, activation)
    for y, p in zip(ys, _f32_products(a, [b0, b1])):
        check_close(y, epilogue.activate(cupy, p, activation), dtype)


# (m, n, k): products of at most 64 rows, which the forced schedules run on 64-row tiles (one
# consumer): one row, 16, an edge inside the tile, 64; K below one k-block, K off 64, a long K.
FEW_ROWS = [(1, 1000, 4160), (16, 384, 1000), (33, 136, 64), (64, 256, 3000)]


@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", FEW_ROWS)
def test_few_rows_on_64_row_tiles(m, n, k, ta, tb):
    from hopmm import epilogue, heuristics, layout
    from hopmm import operands as kernel_operands
    from hopmm.device import query
    from hopmm.schedules import SwigluSchedule

    import cupy

    dtype = "bfloat16"
    a, g = operands(m, n, k, dtype, ta, tb)
    _, u = operands(m, n, k, dtype, ta, tb)
    g *= k ** -0.5
    u *= k ** -0.5
    problem = kernel_operands.kernel_operands(a, g, layout.matmul_shapes(a.shape,
                                                                         g.shape)).problem
    choice = heuristics.dual_b_choice(SwigluSchedule, problem, query(cupy.cuda.Device().id))
    assert choice.config.block_m == 64
    p_gate, p_up = _f32_products(a, [g, u])
    (y,) = _forced("swiglu", a, g, u)
    check_close(y, _silu(p_gate) * p_up, dtype)
    y0, y1 = _forced("shared_a", a, g, u, "relu")
    check_close(y0, epilogue.activate(cupy, p_gate, "relu"), dtype)
    check_close(y1, epilogue.activate(cupy, p_up, "relu"), dtype)


@pytest.mark.parametrize("case", ["batched", "b_broadcast", "vector_a", "misaligned"])
def test_kernels_on_batches_and_views(case):
    dt = "bfloat16"
    if case == "batched":
        a, g = operands(200, 320, 256, dt, batch=(3,))
        u = rand(g.shape, dt)
    elif case == "b_broadcast":
        a, g, u = rand((2, 3, 100, 128), dt), rand((128, 192), dt), rand((128, 192), dt)
    elif case == "vector_a":
        a, g, u = rand((256,), dt), rand((256, 384), dt), rand((256, 384), dt)
    else:   # misaligned bases: both Bs read from aligned copies
        a = rand((100, 64), dt)
        g, u = rand((64, 130), dt)[:, 1:129], rand((64, 130), dt)[:, 1:129]
    p_gate, p_up = _f32_products(a, [g, u])
    (y,) = _forced("swiglu", a, g, u)
    check_close(y, _silu(p_gate) * p_up, dt)
    y0, y1 = _forced("shared_a", a, g, u)
    check_close(y0, p_gate, dt)
    check_close(y1, p_up, dt)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_composed_calls(dtype):
    """The default path: one hopmm.matmul per B (bias and activation fused), and swiglu's
    product of two such results."""
    import cupy

    import hopmm
    from hopmm import epilogue

    a, b0 = operands(300, 700, 200, dtype)
    b1 = rand((200, 700), dtype)
    bias = rand((700,), dtype)
    y0, y1 = hopmm.matmul_shared_a(a, [b0, b1], bias=[bias, None], activation="gelu_tanh")
    p0, p1 = _f32_products(a, [b0, b1])
    check_close(y0, epilogue.activate(cupy, p0 + bias.astype(cupy.float32), "gelu_tanh"), dtype)
    check_close(y1, epilogue.activate(cupy, p1, "gelu_tanh"), dtype)
    y = hopmm.swiglu(a, b0, b1)
    check_close(y, _silu(p0) * p1, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_unforced_swiglu_where_the_one_kernel_pays(dtype, monkeypatch):
    """Compute-bound rows: the heuristic takes the one kernel by itself."""
    import cupy

    import hopmm
    from hopmm import shared_a
    from hopmm.device import query
    from hopmm.schedules import SwigluSchedule

    m, n, k = 2048, 2560, 4096
    assert hopmm.heuristics.dual_b_pays(SwigluSchedule, hopmm.Problem(m, n, k, 1, dtype),
                                        query(cupy.cuda.Device().id))[0]
    runs = []
    run_dual = shared_a._run_dual
    monkeypatch.setattr(shared_a, "_run_dual",
                        lambda sched, *args, **kw: runs.append(sched) or run_dual(sched, *args,
                                                                                   **kw))
    a, g = operands(m, n, k, dtype)
    u = rand((k, n), dtype)
    g *= k ** -0.5   # a model's weight scale: unit weights overflow float16 (test_swiglu_kernel)
    u *= k ** -0.5
    y = hopmm.swiglu(a, g, u)
    assert runs == [SwigluSchedule]
    p_gate, p_up = _f32_products(a, [g, u])
    check_close(y, _silu(p_gate) * p_up, dtype)


@pytest.mark.parametrize("name", ["swiglu", "shared_a"])
@pytest.mark.parametrize("m,n,k,tb", [(16, 14336, 4096, False), (1, 4096, 1000, True),
                                      (50, 2304, 3000, False)])
def test_few_rows_repeat_the_one_kernel_on_new_operands(name, m, n, k, tb, monkeypatch):
    """Decode rows take the one kernel by themselves (heuristics.dual_b_pays); a repeat
    launches the remembered launches (no new build) on new operands at other addresses, and
    every result matches the fp32 products."""
    import cupy

    import hopmm
    from hopmm import launch, shared_a
    from hopmm.device import query
    from hopmm.schedules import DUAL_B_SCHEDULES

    sched = DUAL_B_SCHEDULES[name]
    problem = hopmm.Problem(m, n, k, 1, "bfloat16")   # as shared_a._one_kernel asks
    assert hopmm.heuristics.dual_b_pays(sched, problem, query(cupy.cuda.Device().id))[0]
    builds = []
    build = launch.build_launches
    monkeypatch.setattr(launch, "build_launches",
                        lambda *args, **kw: builds.append(1) or build(*args, **kw))
    shared_a._dual_launches.clear()
    for _ in range(3):
        a, g = operands(m, n, k, "bfloat16", False, tb)
        _, u = operands(m, n, k, "bfloat16", False, tb)
        g *= k ** -0.5
        u *= k ** -0.5
        p_gate, p_up = _f32_products(a, [g, u])
        if name == "swiglu":
            check_close(hopmm.swiglu(a, g, u), _silu(p_gate) * p_up, "bfloat16")
        else:
            y0, y1 = hopmm.matmul_shared_a(a, [g, u])
            check_close(y0, p_gate, "bfloat16")
            check_close(y1, p_up, "bfloat16")
        assert len(builds) == 1 and len(shared_a._dual_launches) == 1


def test_torch_in_and_out_on_a_side_stream():
    torch = pytest.importorskip("torch")
    import hopmm

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = hopmm.swiglu(x, g.T, u.T)
        y0, y1 = hopmm.matmul_shared_a(x, [g.T, u.T])
        for name in ("swiglu", "shared_a"):
            hopmm.use_schedule(name)
            try:
                forced = (hopmm.swiglu(x, g.T, u.T) if name == "swiglu"
                          else hopmm.matmul_shared_a(x, [g.T, u.T])[0])
            finally:
                hopmm.use_schedule(None)
            assert isinstance(forced, torch.Tensor)
    stream.synchronize()
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    ref = torch.nn.functional.silu(x.float() @ g.float().T) * (x.float() @ u.float().T)
    assert float((y.float() - ref).norm() / ref.norm()) < TOL["bfloat16"]
    assert float((y0.float() - x.float() @ g.float().T).norm()
                 / (x.float() @ g.float().T).norm()) < TOL["bfloat16"]
    assert isinstance(y1, torch.Tensor)

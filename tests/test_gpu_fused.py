"""GPU tier: fused epilogues (matmul's bias / activation / alpha / beta / c keywords) against
the unfused fp32 computation, on tile-edge shapes, batches and transposed operands, with the
heuristic's choice and with every schedule forced (split-K included: the split or rows that
produce the final output apply the chain once); each fused call is one kernel launch into a
NaN-poisoned out."""
import pytest

from conftest import requires_hopper
from forced import check_close, operands, rand

pytestmark = requires_hopper

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid"]


def _reference(a, b, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
    """The unfused computation in fp32: product, then the chain (hopmm.epilogue.reference)."""
    import cupy

    from hopmm import epilogue, layout

    shapes = layout.matmul_shapes(a.shape, b.shape)
    acc = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    acc = acc.reshape(shapes.batch_shape + (shapes.m, shapes.n))
    c3 = None if c is None or beta == 0 else epilogue.c_view(c, shapes)[0]
    y = epilogue.reference(cupy, acc, bias=bias, activation=activation, alpha=alpha,
                           beta=beta, c=c3)
    return y.reshape(shapes.out_shape)


@pytest.fixture
def launches(monkeypatch):
    """Counts kernel launches (every launch of every call, fast path included)."""
    from hopmm import launch

    count = []
    real = launch.launch_all

    def counting(ls, *args):
        count.append(len(ls))
        return real(ls, *args)

    monkeypatch.setattr(launch, "launch_all", counting)
    return count


def _fused(a, b, dtype, keywords, out_alias_c=False, launches=None):
    """One fused call into a NaN-poisoned out (or into c itself), checked against the
    reference, and that it ran as one kernel launch."""
    import cupy

    import hopmm

    ref = _reference(a, b, **keywords)
    assert hopmm.plan(a, b, **keywords).path == "kernel"
    if out_alias_c:
        out = keywords["c"]
    else:
        out = cupy.full(ref.shape, cupy.nan, dtype=dtype)
    before = sum(launches) if launches is not None else 0
    assert hopmm.matmul(a, b, out=out, **keywords) is out
    if launches is not None:
        assert sum(launches) - before == 1, "a fused call is one kernel launch"
    check_close(out, ref, dtype)


COMBOS = {
    "bias_n": lambda m, n, dt: dict(bias=rand((n,), dt)),
    "bias_m": lambda m, n, dt: dict(bias=rand((m, 1), dt)),
    "c_full": lambda m, n, dt: dict(c=rand((m, n), dt), beta=1.0),
    "c_row": lambda m, n, dt: dict(c=rand((n,), dt), beta=1.0, bias=rand((n,), dt)),
    "alpha_beta": lambda m, n, dt: dict(c=rand((m, n), dt), alpha=0.75, beta=-0.5),
    "out_is_c": lambda m, n, dt: dict(c=rand((m, n), dt), beta=1.0, bias=rand((n,), dt)),
}


@pytest.mark.parametrize("combo", COMBOS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_activation_and_operand(activation, combo, dtype, launches):
    m, n, k = 300, 700, 200   # edges in every dimension
    a, b = operands(m, n, k, dtype)
    kw = dict(COMBOS[combo](m, n, dtype), activation=activation)
    _fused(a, b, dtype, kw, out_alias_c=combo == "out_is_c", launches=launches)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n,k", [(2000, 3000, 200), (65, 1000, 4160), (4096, 4096, 1024)])
def test_layouts_and_shapes(m, n, k, ta, tb, launches):
    a, b = operands(m, n, k, "bfloat16", ta, tb)
    c = rand((n, m), "bfloat16").T   # a transposed view
    kw = dict(bias=rand((n,), "bfloat16"), c=c, alpha=0.5, beta=2.0, activation="gelu")
    _fused(a, b, "bfloat16", kw, launches=launches)


@pytest.mark.parametrize("case", ["batched", "c_over_batch", "bias_m_batched", "vector_b"])
def test_batches(case, launches):
    dt = "bfloat16"
    if case == "vector_b":
        a, b = rand((3, 200, 256), dt), rand((256,), dt)
        kw = dict(bias=rand((200, 1), dt), activation="silu")
    else:
        a, b = operands(200, 300, 256, dt, batch=(3,))
        kw = {"batched": dict(c=rand((3, 200, 300), dt), beta=1.0, activation="relu"),
              "c_over_batch": dict(c=rand((200, 300), dt), beta=0.5, bias=rand((300,), dt),
                                   activation="gelu_tanh"),
              "bias_m_batched": dict(bias=rand((200, 1), dt), activation="sigmoid")}[case]
    _fused(a, b, dt, kw, launches=launches)


def _schedules():
    from hopmm.schedules import SCHEDULES

    return sorted(SCHEDULES)


SHAPES = {False: [(300, 700, 200), (2000, 3000, 512)],   # tile edges; several tiles per CTA
          True: [(64, 256, 4096), (200, 300, 8192)]}     # split-K: few tiles, long k


@pytest.mark.parametrize("schedule", _schedules())
@pytest.mark.parametrize("shape_index", [0, 1])
@pytest.mark.parametrize("ta", [False, True])
def test_every_schedule_forced(schedule, shape_index, ta, launches):
    import hopmm
    from hopmm.schedules import SCHEDULES

    m, n, k = SHAPES[SCHEDULES[schedule].split_k][shape_index]
    hopmm.use_schedule(schedule)
    try:
        a, b = operands(m, n, k, "bfloat16", ta)
        kw = dict(bias=rand((n,), "bfloat16"), c=rand((m, n), "bfloat16"), alpha=0.5,
                  beta=1.5, activation="gelu")
        _fused(a, b, "bfloat16", kw, launches=launches)
        # The bias along rows and c broadcast along them, on the same schedule.
        kw = dict(bias=rand((m, 1), "bfloat16"), c=rand((n,), "bfloat16"), beta=1.0,
                  activation="relu")
        _fused(a, b, "bfloat16", kw, launches=launches)
    finally:
        hopmm.use_schedule(None)


# Operand layouts of the epilogue's three load paths (epilogue_functors.cuh load_row): rows
# contiguous and 4-byte aligned, rows contiguous but with an odd pitch or offset (alternate
# rows misaligned), and neither (a transposed c, a strided bias).
LAYOUTS = {
    "odd_pitch": lambda m, n, dt: dict(c=rand((m, n + 1), dt)[:, :n],
                                       bias=rand((n,), dt)),
    "odd_offset": lambda m, n, dt: dict(c=rand((m, n + 1), dt)[:, 1:],
                                        bias=rand((n + 1,), dt)[1:]),
    "c_transposed": lambda m, n, dt: dict(c=rand((n, m), dt).T, bias=rand((m, 1), dt)),
    "strided_bias": lambda m, n, dt: dict(c=rand((m, 2 * n), dt)[:, ::2],
                                          bias=rand((2 * n,), dt)[::2]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("schedule", _schedules())
def test_epilogue_operand_layouts_on_every_schedule(schedule, layout, launches):
    """Every load path of bias and c, on every schedule (whole-box fetches and pair-by-pair
    ones, the c prefetch and none), at tile edges."""
    import hopmm
    from hopmm.schedules import SCHEDULES

    m, n, k = SHAPES[SCHEDULES[schedule].split_k][0]
    hopmm.use_schedule(schedule)
    try:
        a, b = operands(m, n, k, "bfloat16", False)
        kw = dict(LAYOUTS[layout](m, n, "bfloat16"), alpha=0.5, beta=1.5, activation="silu")
        _fused(a, b, "bfloat16", kw, launches=launches)
    finally:
        hopmm.use_schedule(None)


def test_repeats_take_new_bias_and_c(launches):
    """Repeated calls go through remembered launches and must read each call's own bias and
    c (a launch reusing the first call's pointers would fail here)."""
    import hopmm

    a, b = operands(512, 768, 256, "bfloat16")
    for _ in range(3):
        kw = dict(bias=rand((768,), "bfloat16"), c=rand((512, 768), "bfloat16"), beta=1.0,
                  activation="relu")
        check_close(hopmm.matmul(a, b, **kw), _reference(a, b, **kw), "bfloat16")
    # Plain calls on the same operands are untouched by the fused recipe.
    check_close(hopmm.matmul(a, b), _reference(a, b), "bfloat16")


def test_fallback_dtypes_compute_the_chain():
    import cupy

    import hopmm

    a, b = rand((100, 64), cupy.float32), rand((64, 50), cupy.float32)
    kw = dict(bias=rand((50,), cupy.float32), activation="gelu")
    got = hopmm.matmul(a, b, **kw)
    assert hopmm.plan(a, b, **kw).path == "cupy.matmul"
    assert float(cupy.abs(got - _reference(a, b, **kw)).max()) < 1e-4

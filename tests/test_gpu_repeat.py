"""GPU tier, repeat calls: a call that reads its operands in place and stores straight into
its result repeats through one DirectRepeat run (fastpath.DirectRecipe); split-K's repeats
take the general recipe. Results against cupy.matmul, outputs poisoned with NaN first. Skips
without a Hopper GPU."""

import pytest

from conftest import requires_hopper
from forced import TOL, rand, rel_err

pytestmark = requires_hopper

DTYPES = ["bfloat16", "float16"]
SHAPE_A, SHAPE_B = (384, 320), (320, 512)
# More operand sets than a KernelLaunch keeps encoded maps for (four per operand), revisited
# in another order: repeats encode new maps and reuse cached ones.
SETS = 7
ORDER = list(range(SETS)) + [6, 0, 3, 3, 1, 5, 2, 4, 0]


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """Every call in these tests must run on hopmm's kernels."""
    monkeypatch.setenv("HOPMM_STRICT", "1")


def _schedule_names():
    from hopmm.schedules import SCHEDULES

    return sorted(SCHEDULES)


@pytest.fixture(autouse=True, params=_schedule_names())
def schedule(request):
    """Every schedule, forced: each but split_k (its workspace) repeats through a DirectRepeat."""
    import hopmm

    hopmm.use_schedule(request.param)   # clears the remembered recipes
    yield request.param
    hopmm.use_schedule(None)


@pytest.fixture
def planned(monkeypatch):
    """One entry per call that took the full path."""
    from hopmm import api

    calls = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: calls.append(1) or real_plan(*args))
    return calls


def poison_pool(shape, dtype):
    """A NaN-filled block of a result's size, freed at once to CuPy's memory pool, where the
    next allocation of that size usually finds it: an element the kernel leaves unwritten
    then reads NaN."""
    import cupy

    cupy.full(shape, cupy.nan, dtype=dtype)


def expected_recipe(schedule):
    from hopmm import fastpath

    from hopmm.schedules import SCHEDULES

    # split_k looks up its stream's workspace in Python on every launch.
    return fastpath.Recipe if SCHEDULES[schedule].workspace else fastpath.DirectRecipe


@pytest.mark.parametrize("with_out", [True, False], ids=["out", "fresh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_repeats_on_rotating_operand_sets(schedule, planned, dtype, with_out):
    """Each call reads its own arrays, A of one set also with B of the next: whatever maps
    the launches hold encoded, a repeat must compute this call's product."""
    import cupy

    import hopmm
    from hopmm import fastpath

    sets = [(rand(SHAPE_A, dtype), rand(SHAPE_B, dtype)) for _ in range(SETS)]
    out_shape = (SHAPE_A[0], SHAPE_B[1])
    outs = [cupy.empty(out_shape, dtype=dtype) for _ in range(SETS)]
    for i in ORDER:
        a, b = sets[i]
        for bb in (b, sets[(i + 1) % SETS][1]):
            if with_out:
                outs[i].fill(cupy.nan)
                result = hopmm.matmul(a, bb, out=outs[i])
                assert result is outs[i]
            else:
                poison_pool(out_shape, dtype)
                result = hopmm.matmul(a, bb)
            assert rel_err(result, a, bb) < TOL[dtype]
            del result
    assert len(planned) == 1
    (recipe,) = fastpath._recipes.values()
    assert type(recipe) is expected_recipe(schedule)


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeats_decline_an_out_that_overlaps_an_operand(schedule, planned, dtype):
    """A recipe remembered with a separate out: a repeat whose out only touches B runs it;
    one whose out is A, or covers half of B, takes the full path (computed aside, copied)."""
    import cupy

    import hopmm
    from hopmm import fastpath

    n = 256
    a, b = rand((n, n), dtype), rand((n, n), dtype)
    hopmm.matmul(a, b, out=cupy.empty((n, n), dtype=dtype))
    assert len(planned) == 1
    assert type(next(iter(fastpath._recipes.values()))) is expected_recipe(schedule)

    buf = rand((3 * n, n), dtype)   # rows [0, n): B; [n, 2n): an out right after it
    a, b, out = rand((n, n), dtype), buf[:n], buf[n:2 * n]
    out.fill(cupy.nan)
    assert hopmm.matmul(a, b, out=out) is out
    assert rel_err(out, a, b) < TOL[dtype]
    assert len(planned) == 1, "an out that only touches B takes the recipe"

    a = buf[:n]
    a0, b = a.copy(), rand((n, n), dtype)
    assert hopmm.matmul(a, b, out=a) is a
    assert rel_err(a, a0, b) < TOL[dtype]
    assert len(planned) == 2

    b = buf[n:2 * n]
    a, b0 = rand((n, n), dtype), b.copy()
    buf[2 * n:].fill(cupy.nan)
    out = buf[n // 2 * 3:n // 2 * 5]   # the second half of B and the half row block after it
    assert hopmm.matmul(a, b, out=out) is out
    assert rel_err(out, a, b0) < TOL[dtype]
    assert len(planned) == 3

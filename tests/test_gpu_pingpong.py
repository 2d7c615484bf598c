"""GPU tier, ping-pong specifics: the tile walk of two consumers over one stage ring, checked
where it can go wrong. A CTA's n tiles alternate between the consumers, so n = 1 (consumer 1
idle), odd and even n, n < stages, tiles crossing batch slices, one k-block per tile (ring
parity flips every tile) and many are each run; a deadlock in the turn-taking or the ring
would hang, so those cases run in a child process with a timeout. Outputs are NaN-poisoned and
checked tile by tile, so one wrong 128 x 128 tile cannot hide in a large matrix's norm.
Skips without a Hopper GPU."""
import json
import os
import subprocess
import sys

import pytest

from conftest import requires_hopper

pytestmark = requires_hopper

TOL = {"bfloat16": 1e-2, "float16": 2e-3}
TILE = 128
HANG_TIMEOUT_S = 300   # a whole case, compile included; a hung kernel never returns


def rand(shape, dtype):
    import cupy

    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)


def worst_tile_error(got, a, b) -> float:
    """max over 128 x 128 output tiles (of every batch slice) of ‖got − ref‖ / ‖ref‖."""
    import cupy

    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = got.astype(cupy.float32)
    assert got.shape == ref.shape
    assert not bool(cupy.isnan(got).any()), "unwritten (NaN-poisoned) or NaN output elements"
    m, n = ref.shape[-2:]
    pad_m, pad_n = -m % TILE, -n % TILE
    ref3 = ref.reshape(-1, m, n)
    diff = cupy.pad(got.reshape(-1, m, n) - ref3, ((0, 0), (0, pad_m), (0, pad_n)))
    ref3 = cupy.pad(ref3, ((0, 0), (0, pad_m), (0, pad_n)))
    tiles = (ref3.shape[0], (m + pad_m) // TILE, TILE, (n + pad_n) // TILE, TILE)
    err = cupy.sqrt((diff.reshape(tiles) ** 2).sum(axis=(2, 4)))
    norm = cupy.sqrt((ref3.reshape(tiles) ** 2).sum(axis=(2, 4)))
    return float((err / cupy.maximum(norm, 1e-30)).max())


def run_case(case: dict) -> dict:
    """One matmul on the ping-pong schedule; returns what the parent asserts on."""
    import cupy

    import hopmm

    hopmm.use_schedule("pingpong")
    dtype = case["dtype"]
    m, n, k, batch = case["m"], case["n"], case["k"], case["batch"]
    lead = (batch,) if batch > 1 else ()
    a = rand(lead + (k, m), dtype).swapaxes(-1, -2) if case["ta"] else rand(lead + (m, k), dtype)
    b = rand(lead + (n, k), dtype).swapaxes(-1, -2) if case["tb"] else rand(lead + (k, n), dtype)
    out = cupy.full(lead + (m, n), cupy.nan, dtype=dtype)
    text = hopmm.explain(a, b, out=out)
    hopmm.matmul(a, b, out=out)
    cupy.cuda.get_current_stream().synchronize()
    return {"explain": text, "error": worst_tile_error(out, a, b)}


def run_in_child(case: dict) -> dict:
    env = dict(os.environ, HOPMM_STRICT="1")
    try:
        proc = subprocess.run([sys.executable, __file__, json.dumps(case)], env=env,
                              capture_output=True, text=True, timeout=HANG_TIMEOUT_S,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"no result within {HANG_TIMEOUT_S} s (a hang: turn-taking or ring "
                    f"deadlock?) for {case}")
    assert proc.returncode == 0, f"{case}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sm_count() -> int:
    import cupy

    from hopmm.device import query

    return query(cupy.cuda.Device().id).sm_count


def pingpong_stages(dtype: str) -> int:
    import cupy

    from hopmm.device import query
    from hopmm.schedules import PingPongSchedule

    smem = query(cupy.cuda.Device().id).smem_per_block_optin
    return PingPongSchedule.deepest(dtype, TILE, False, True, smem).stages


def shape_with_tiles(tiles: int) -> tuple[int, int]:
    """(m, n), neither a multiple of 128, whose grid of 128 x 128 tiles has `tiles` tiles."""
    tiles_n = max(d for d in range(1, 9) if tiles % d == 0)
    tiles_m = tiles // tiles_n
    return TILE * tiles_m - 5, TILE * tiles_n - 9


def check_case(case: dict, expected_grid_x: int) -> None:
    got = run_in_child(case)
    assert "schedule: pingpong" in got["explain"]
    assert f"grid: ({expected_grid_x}, 1, 1)" in got["explain"], got["explain"]
    assert got["error"] < TOL[case["dtype"]], case


# Tiles per CTA: n = tiles // SMs or one more. The offsets make CTAs with 1 tile (consumer 1
# idle), with 1 and 2 tiles side by side, all even, all odd, and mixed odd / even.
TILE_COUNTS = {
    "one_tile": lambda sms: 1,
    "three_tiles": lambda sms: 3,
    "one_per_cta_but_one": lambda sms: sms - 1,
    "one_per_cta": lambda sms: sms,
    "one_cta_with_two": lambda sms: sms + 1,
    "two_per_cta": lambda sms: 2 * sms,
    "three_per_cta": lambda sms: 3 * sms,
    "three_or_four": lambda sms: 3 * sms + 7,
    "three_or_four_most": lambda sms: 4 * sms - 1,
}


@pytest.mark.parametrize("k_blocks", ["one", "stages", "stages_plus_one", "many"])
@pytest.mark.parametrize("count", TILE_COUNTS, ids=list(TILE_COUNTS))
def test_tiles_per_cta(count, k_blocks):
    dtype = "bfloat16"
    sms = sm_count()
    tiles = TILE_COUNTS[count](sms)
    m, n = shape_with_tiles(tiles)
    stages = pingpong_stages(dtype)
    k = {"one": 17, "stages": 64 * stages, "stages_plus_one": 64 * stages + 1,
         "many": 4097}[k_blocks]
    check_case(dict(m=m, n=n, k=k, batch=1, dtype=dtype, ta=False, tb=False),
               min(sms, tiles))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
def test_layouts_with_odd_tiles_per_cta(ta, tb, dtype):
    sms = sm_count()
    m, n = shape_with_tiles(3 * sms + 1)
    check_case(dict(m=m, n=n, k=333, batch=1, dtype=dtype, ta=ta, tb=tb), sms)


@pytest.mark.parametrize("batch,m,n", [
    (7, 300, 260),     # 63 tiles: one per CTA, consumer 1 idle everywhere
    (37, 300, 260),    # 333 tiles: a CTA's tiles cross batch slices
    (150, 100, 100),   # one tile per slice: consecutive tiles of a consumer differ in batch
], ids=str)
def test_batches(batch, m, n):
    sms = sm_count()
    tiles = batch * -(-m // TILE) * -(-n // TILE)
    check_case(dict(m=m, n=n, k=200, batch=batch, dtype="float16", ta=False, tb=False),
               min(sms, tiles))


@pytest.fixture
def pingpong():
    import hopmm

    hopmm.use_schedule("pingpong")
    yield
    hopmm.use_schedule(None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bitwise_identical_run_to_run(pingpong, dtype):
    """~7.75 tiles per CTA (odd and even counts): any race between the consumers over the
    ring or the staging tiles shows as a difference between runs."""
    import cupy

    import hopmm

    a, b = rand((4096, 1024), dtype), rand((1024, 4096), dtype)
    first = hopmm.matmul(a, b)
    assert worst_tile_error(first, a, b) < TOL[dtype]
    for _ in range(5):
        again = hopmm.matmul(a, b)
        assert bool(cupy.array_equal(first.view(cupy.uint16), again.view(cupy.uint16)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_same_bits_as_the_persistent_128_wide_kernel(dtype):
    """Both kernels compute each output element with the same m64n128k16 wgmmas over the same
    k order, so which warpgroup computed a tile must not change a bit of it."""
    import cupy

    from hopmm import launch, layout
    from hopmm.device import query
    from hopmm.heuristics import Choice
    from hopmm.problem import Problem
    from hopmm.schedules import PersistentSchedule, PingPongSchedule

    m, n, k = 1000, 2000, 776   # rows of A and B 16-byte aligned: read in place
    a, b = rand((1, m, k), dtype), rand((1, k, n), dtype)
    problem = Problem(m, n, k, 1, dtype, "k", "n")
    smem = query(cupy.cuda.Device().id).smem_per_block_optin
    outs = []
    for sched in (PersistentSchedule, PingPongSchedule):
        cfg = sched.deepest(dtype, TILE, False, True, smem)
        c3 = cupy.full((1, m, layout.padded(n, 2)), cupy.nan, dtype=dtype)[:, :, :n]
        launches = launch.build_launches(Choice(sched, cfg, "test", 4), problem, a,
                                         layout.BatchMapping(0, 0, 1, 1), b,
                                         layout.BatchMapping(0, 0, 1, 1), c3)
        launch.launch_all(launches, a.data.ptr, b.data.ptr, c3.data.ptr)
        outs.append(cupy.ascontiguousarray(c3[0]))
    assert worst_tile_error(outs[1], a[0], b[0]) < TOL[dtype]
    assert bool(cupy.array_equal(outs[0].view(cupy.uint16), outs[1].view(cupy.uint16)))


def test_explain_names_the_schedule_and_its_consumers(pingpong):
    import hopmm

    text = hopmm.explain(rand((4096, 4096), "bfloat16"), rand((4096, 4096), "bfloat16"))
    assert "schedule: pingpong" in text and "hopmm_pingpong_bf16_128x128x64" in text
    assert "alternate 128x128 tiles" in text


if __name__ == "__main__":
    print(json.dumps(run_case(json.loads(sys.argv[1]))))

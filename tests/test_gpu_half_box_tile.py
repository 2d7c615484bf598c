"""GPU: the 128 x 160 tile (schedules.HALF_BOX_BLOCK_N), which loads B in whole 64-wide boxes
(the last one half used) and stages and stores C in boxes of 32 columns. Forced through the
launch layer against cupy.matmul in fp32, into NaN-poisoned buffers: tile edges on every side,
every layout, both dtypes, batches, the row store, A read through phase maps, fused epilogues;
and repeatable bit for bit."""
import pytest

from conftest import requires_hopper
import forced

pytestmark = requires_hopper

TILE = (128, 160)
SCHEDULES = ("persistent", "persistent_overlap")
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
# One row, one column, K below one k-block, N ending in the half box (159, 161, 33) and on it
# (160, 320), M past a tile, several waves (1000 x 1000: 8 x 7 tiles).
EDGE_SHAPES = [(1, 160, 64), (300, 1, 192), (129, 161, 40), (257, 159, 1000), (64, 33, 257),
               (200, 320, 64), (1000, 1000, 777), (1984, 1152, 448)]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", EDGE_SHAPES)
def test_edges_and_layouts(schedule, ta, tb, m, n, k):
    a, b = forced.operands(m, n, k, "bfloat16", ta, tb)
    forced.check(a, b, schedule, TILE, "bfloat16", group=4)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtypes_and_batches(schedule, dtype):
    a, b = forced.operands(300, 500, 300, dtype, batch=(3,))
    forced.check(a, b, schedule, TILE, dtype, group=2)
    # a B broadcast over A's batch
    a = forced.rand((2, 257, 130), dtype)
    b = forced.rand((130, 481), dtype)
    forced.check(a, b, schedule, TILE, dtype)


@pytest.mark.parametrize("m,n,k", [(129, 161, 130), (300, 517, 849), (1, 263, 192)])
@pytest.mark.parametrize("pad", [1, 2, 4])
def test_row_store(m, n, k, pad):
    """Rows of any pitch (the single-set kernel's row store; two 64 x 160 sets leave the
    overlap kernel too few registers for it)."""
    import cupy

    a, b = forced.operands(m, n, k, "bfloat16")
    c3, buf = forced.run(a, b, "persistent", TILE, row_pitch=n + pad)
    forced.check_close(c3, forced.reference(a, b).reshape(c3.shape), "bfloat16")
    assert bool(cupy.isnan(buf[:, :, 0]).all()), "wrote left of the rows"
    assert bool(cupy.isnan(buf[:, :, n + 1:]).all()), "wrote between the rows"
    assert bool(cupy.isnan(buf[:, c3.shape[1]:, :]).all()), "wrote below the last row"


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("k", [129, 1003])
def test_a_through_phase_maps(schedule, k):
    """A's rows off 16 bytes (an odd K), read in place; B (N a multiple of 8) through its one
    map: a half box of B is never phased."""
    a, b = forced.operands(300, 320, k, "bfloat16")
    forced.check(a, b, schedule, TILE, "bfloat16", phased=True)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("bias_form", ["columns", "rows"])
def test_fused_epilogue(schedule, bias_form):
    """bias, gelu, alpha and beta * c on the half-box tile, the chain applied per half box."""
    from dataclasses import replace

    import cupy

    from hopmm import epilogue, launch, layout, operands
    from hopmm.device import query
    from hopmm.heuristics import Choice
    from hopmm.schedules import SCHEDULES as ALL

    m, n, k = 257, 481, 300
    a, b = forced.operands(m, n, k, "bfloat16")
    bias = forced.rand((n,) if bias_form == "columns" else (m, 1), "bfloat16")
    c = forced.rand((m, n), "bfloat16")
    shapes = layout.matmul_shapes(a.shape, b.shape)
    device_id = cupy.cuda.Device().id
    fused = epilogue.resolve(shapes, a.dtype, device_id, bias=bias, activation="gelu",
                             alpha=0.5, beta=2.0, c=c).readable(None)
    call = operands.kernel_operands(a, b, shapes)
    sched = ALL[schedule]
    cfg = sched.deepest("bfloat16", TILE[1], call.problem.trans_a, call.problem.trans_b,
                        query(device_id).smem_per_block_optin)
    choice = Choice(sched, replace(cfg, epilogue=fused.spec), "test", 4, 1)
    out = cupy.full((1, m, layout.padded(n, 2)), cupy.nan, dtype=a.dtype)[:, :, :n]
    launches = launch.build_launches(choice, call.problem, call.a3, call.a_map, call.b3,
                                     call.b_map, out, fused)
    launch.launch_all(launches, call.a3.data.ptr, call.b3.data.ptr, out.data.ptr,
                      *fused.pointers())
    ref = epilogue.reference(cupy, forced.reference(a, b), bias=bias, activation="gelu",
                             alpha=0.5, beta=2.0, c=c)
    forced.check_close(out[0], ref, "bfloat16")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bitwise_repeatable(schedule):
    a, b = forced.operands(1000, 1000, 777, "bfloat16")
    first, _ = forced.run(a, b, schedule, TILE)
    again, _ = forced.run(a, b, schedule, TILE)
    assert bool((first.view("uint16") == again.view("uint16")).all())

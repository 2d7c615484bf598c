"""GPU tier: the epilogue's staging ring (epilogue_tma_store.cuh) on every schedule and tile
width. Where the ring is shorter than a consumer's part of the tile (128 x 256 tiles, ping-pong
tiles) a staging box is rewritten within one epilogue, and in the persistent kernels across
tiles while the previous tile's stores may still be reading it: shapes with several tiles per
CTA, edges that are not multiples of the tile, every layout."""
import pytest

from conftest import requires_hopper
from forced import check, operands

pytestmark = requires_hopper

LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}


def _cases():
    from hopmm.schedules import SCHEDULES

    return [(name, width) for name, sched in SCHEDULES.items() if not sched.split_k
            for width in sched.block_ns]


@pytest.mark.parametrize("schedule,block_n", _cases(), ids=lambda x: str(x))
@pytest.mark.parametrize("layout,dtype", [(lay, "bfloat16") for lay in LAYOUTS]
                         + [("NN", "float16")])
@pytest.mark.parametrize("m,n,k", [(2000, 3000, 200),   # 192-384 tiles: several per CTA
                                   (300, 700, 4097),    # one wave, long k
                                   (65, 1000, 64)])     # one M tile, partial rows
def test_staging_ring(m, n, k, layout, dtype, schedule, block_n):
    check(*operands(m, n, k, dtype, *LAYOUTS[layout]), schedule, block_n, dtype)



@pytest.mark.parametrize("block_n", [128, 192])
@pytest.mark.parametrize("m,n,k", [(2000, 3000, 200),    # 2-3 tiles per CTA: both sets, odd end
                                   (4224, 4096, 128),    # ~11-16 tiles per CTA
                                   (300, 700, 4097)])    # one tile per CTA: no overlap at all
def test_overlapped_epilogue_is_bitwise_the_persistent_kernel(m, n, k, block_n):
    """Two accumulator sets change when a tile is stored, not what is summed: the same bits
    as the single-set kernel (a tile stored from the wrong set, or before its last k-block
    completed, would differ)."""
    import cupy

    from forced import run

    a, b = operands(m, n, k, "bfloat16")
    overlapped, _ = run(a, b, "persistent_overlap", block_n)
    single, _ = run(a, b, "persistent", block_n)
    assert not bool(cupy.isnan(overlapped.astype(cupy.float32)).any())
    assert bool(cupy.array_equal(overlapped.view(cupy.uint16), single.view(cupy.uint16)))

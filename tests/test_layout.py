"""CPU: cupy.matmul's shape rules, batch broadcasting maps and TMA describability."""
import itertools

import numpy as np
import pytest

from hopmm import layout

SHAPE_PAIRS = [
    ((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((4, 5), (5, 3)), ((2, 4, 5), (5, 3)),
    ((4, 5), (2, 5, 3)), ((2, 1, 4, 5), (3, 5, 3)), ((1, 3, 4, 5), (2, 1, 5, 3)),
    ((5,), (2, 5, 3)), ((2, 4, 5), (5,)), ((0, 4, 5), (5, 3)), ((4, 0), (0, 3)),
    ((4, 5), (6, 3)), ((2, 4, 5), (3, 5, 3)), ((5,), (4,)), ((3, 1, 2, 4), (2, 4, 1)),
]


@pytest.mark.parametrize("a_shape,b_shape", SHAPE_PAIRS, ids=str)
def test_shapes_match_numpy(a_shape, b_shape):
    try:
        expected = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    except ValueError:
        with pytest.raises(ValueError, match="matmul"):
            layout.matmul_shapes(a_shape, b_shape)
        return
    assert layout.matmul_shapes(a_shape, b_shape).out_shape == expected


@pytest.mark.parametrize("a_shape,b_shape", [((), (3,)), ((3, 3), ())], ids=str)
def test_scalars_rejected(a_shape, b_shape):
    with pytest.raises(ValueError, match="scalar"):
        layout.matmul_shapes(a_shape, b_shape)


BATCHES = [((), ()), ((4,), (4,)), ((1,), (4,)), ((3, 1), (3, 2)), ((2,), (3, 2)),
           ((3, 1, 4), (3, 2, 4)), ((1, 2, 1), (3, 2, 4)), ((2, 1, 3), (2, 5, 3)), ((5, 6), (5, 6))]


@pytest.mark.parametrize("op_batch,batch_shape", BATCHES, ids=str)
def test_batch_mapping_indexes_the_broadcast(op_batch, batch_shape):
    """For every output batch index z, (z // div) % mod names the operand slice that numpy's
    broadcasting pairs with it, or the mapping is None and a copy is made instead."""
    mapping = layout.batch_mapping(op_batch, batch_shape)
    ids = np.arange(int(np.prod(op_batch, dtype=int))).reshape(op_batch)
    expected = np.broadcast_to(ids, batch_shape).reshape(-1)
    if mapping is None:
        assert op_batch == (3, 1, 4) or op_batch == (2, 1, 3)  # varying dims not one run
        return
    padded = (1,) * (len(batch_shape) - len(op_batch)) + tuple(op_batch)
    run = ids.reshape(padded)[tuple(slice(None) if mapping.lo <= i < mapping.hi else 0
                                    for i in range(len(batch_shape)))].reshape(-1)
    got = [run[(z // mapping.div) % mapping.mod] for z in range(expected.size)]
    assert list(expected) == got


ITEM = 2


@pytest.mark.parametrize("shape,strides,address,expected", [
    ((64, 128), (256, 2), 0, "cols"),         # row-major, 16-byte aligned rows
    ((64, 128), (2, 128), 0, "rows"),         # column-major (a transposed view)
    ((64, 17), (34, 2), 0, None),             # row length 34 B: not a multiple of 16
    ((64, 128), (256, 2), 2, None),           # misaligned base
    ((64, 128), (256, 4), 0, None),           # no contiguous axis
    ((64, 128), (-256, 2), 0, None),          # negative stride
    ((1, 17), (34, 2), 0, "cols"),            # one row: its stride is never used
    ((17, 1), (2, 34), 0, "rows"),
], ids=lambda v: str(v))
def test_tma_major(shape, strides, address, expected):
    assert layout.tma_major(shape, strides, ITEM, address) == expected


@pytest.mark.parametrize("cols,ok", [(8, True), (64, True), (17, False), (1, False)])
def test_store_needs_whole_16_byte_rows(cols, ok):
    stride = layout.padded(cols, ITEM) * ITEM
    assert layout.store_ok((10, cols), (stride, ITEM), ITEM, 0) is ok


@pytest.mark.parametrize("batch", [1, 65535, 65536, 200000])
def test_batch_chunks_cover_within_grid_limit(batch):
    chunks = layout.batch_chunks(batch)
    assert all(0 < n <= layout.MAX_GRID_Z for _, n in chunks)
    covered = list(itertools.chain.from_iterable(range(z, z + n) for z, n in chunks))
    assert covered == list(range(batch))


@pytest.mark.parametrize("tiles_m,tiles_n,group", [(1, 1, 1), (32, 112, 16), (17, 5, 16),
                                                   (64, 32, 16), (5, 7, 3), (40, 3, 16)])
def test_grouped_raster_visits_every_tile_once(tiles_m, tiles_n, group):
    order = [layout.grouped_raster(t, tiles_m, tiles_n, group) for t in range(tiles_m * tiles_n)]
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]


def test_grouped_raster_keeps_a_wave_compact():
    """The first 132 tiles of a 32 x 112 grid touch at most 16 M-tiles and 9 N-tiles."""
    wave = [layout.grouped_raster(t, 32, 112, 16) for t in range(132)]
    assert len({m for m, _ in wave}) == 16 and len({n for _, n in wave}) <= 9

"""CPU: persistent_cluster4, the cluster kernel in clusters of four CTAs on adjacent M tiles
(each loads its A tile and a quarter of the shared B tile): rendering, the B slices, the grid
on the clusters a device runs at once, and the heuristic that takes it for B rows that are not
whole cache lines. The walk and the launch's tensor-map boxes are tested with the pair's in
test_cluster_cpu.py; compile/resource/SASS checks with every other kernel in
test_kernels_cpu.py."""
import itertools
from dataclasses import replace

import pytest

from hopmm import heuristics
from hopmm.device import H100_SXM, H100_SXM_CLUSTERS
from hopmm.problem import Problem
from hopmm.schedules import (CLUSTER_QUAD, SCHEDULES, TMA_BOX_ELEMS,
                             PersistentClusterQuadSchedule, PersistentClusterSchedule,
                             PersistentSchedule)

Quad = PersistentClusterQuadSchedule
CONFIGS = Quad.configs(H100_SXM.smem_per_block_optin)


def test_every_dtype_layout_and_tile_is_registered():
    assert SCHEDULES["persistent_cluster4"] is Quad and Quad.cluster_size == CLUSTER_QUAD == 4
    got = {(c.dtype, (c.block_m, c.block_n), c.trans_a, c.trans_b) for c in CONFIGS}
    tiles = [(128, 128), (128, 192), (128, 256), (64, 128), (64, 192), (64, 256)]
    assert got == set(itertools.product(("float16", "bfloat16"), tiles, (False, True),
                                        (False, True)))


@pytest.mark.parametrize("cfg", CONFIGS, ids=Quad.kernel_name)
def test_rendered_kernel_runs_in_clusters_of_four(cfg):
    src = Quad.render(cfg).source
    entry = src[src.index('extern "C" __global__'):]
    assert entry.index("__cluster_dims__(4, 1, 1)") < entry.index("__launch_bounds__")
    assert "static constexpr int kClusterSize = 4;" in src
    assert "hopmm::persistent_cluster_gemm<Config, hopmm::MulticastTmaProducer<Config>" in src
    # the same shared-memory plan as the unclustered kernel: only the loads are split
    assert Quad.smem_bytes(cfg) == PersistentSchedule.smem_bytes(cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=Quad.kernel_name)
def test_b_slices_are_whole_swizzle_atoms(cfg):
    """K-major B: a quarter of the tile's rows per CTA (32, 48 or 64 rows); N-major B: the
    256-wide tile's four boxes dealt out whole, the narrower tiles' boxes in k slices of 16
    rows (2 KB), each a whole number of 1024-byte swizzle atoms (the producer's
    static_asserts)."""
    a_rows, b_rows = Quad.box_rows(cfg)
    assert (a_rows, b_rows) == (TMA_BOX_ELEMS, cfg.block_n // 4) and b_rows % 8 == 0
    k_rows = Quad.mn_box_k_rows(cfg)
    assert k_rows == (TMA_BOX_ELEMS if cfg.block_n == 256 else 16)
    assert k_rows * 128 % 1024 == 0
    # the pair and the unclustered kernels keep whole boxes
    assert PersistentClusterSchedule.mn_box_k_rows(cfg) == TMA_BOX_ELEMS
    assert PersistentSchedule.mn_box_k_rows(cfg) == TMA_BOX_ELEMS


def test_grid_takes_the_clusters_the_device_runs_at_once():
    """An H100 SXM runs 30 clusters of four (120 SMs: a cluster lies inside one GPC), not 33:
    a grid of 33 would leave three clusters waiting for a whole round of tiles."""
    p = Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n")
    cfg = Quad.deepest("bfloat16", 256, False, True, H100_SXM.smem_per_block_optin)
    assert Quad.resident_ctas(H100_SXM_CLUSTERS) == 120
    assert Quad.grid(p, cfg, 1, Quad.resident_ctas(H100_SXM_CLUSTERS)) == (120, 1, 1)
    # unknown capacity: whole clusters of the SM count
    assert Quad.resident_ctas(H100_SXM) == 132
    # the pair's 66 clusters fill the SMs; the unclustered kernels take one CTA per SM
    assert PersistentClusterSchedule.resident_ctas(H100_SXM_CLUSTERS) == 132
    assert PersistentSchedule.resident_ctas(H100_SXM_CLUSTERS) == 132
    # few tiles: one cluster per group of four M tiles
    small = Problem(300, 152, 1000, 1, "bfloat16", "k", "n")
    short = Quad.deepest("bfloat16", 192, False, True, H100_SXM.smem_per_block_optin, 64)
    assert Quad.grid(small, short, 1, 120) == (8, 1, 1)   # 5 M tiles of 64 rows: 2 groups


def unaligned(m, n, k):
    """Row-major A and B with B's rows of 2n bytes, not a multiple of 128."""
    assert 2 * n % 128
    return Problem(m, n, k, 1, "bfloat16", "k", "n", b_pitch_aligned=False)


@pytest.mark.parametrize("m,n,k,sched,tile", [
    # 116 tiles of 64 x 192 in one round of 30 clusters of four (quad speed 0.83, x 1.05 for
    # 64 rows) against 58 x 2 tiles of 128 x 128 in one round of 66 pairs (0.84): 14,808
    # against 19,505 tile-width units
    (7383, 152, 8784, "persistent_cluster4", (64, 192)),
    (5000, 136, 8000, "persistent_cluster4", (64, 192)),
    (9000, 248, 8000, "persistent_cluster4", (128, 256)),
    # 125 pairs of 192 x 192 in 1.9 waves of 66 against 47 groups of 128 x 192 in 1.6 waves of
    # 30: 2 x 36,864 / 1.04 against 2 x 24,576 / 1.06, the pair's fewer tile-times
    (24000, 184, 2000, "persistent_cluster", (192, 192)),
    # wider than UNALIGNED_B_QUAD_MAX_N: the pair
    (8764, 424, 8312, "persistent_cluster", (128, 192)),
])
def test_unaligned_b_rows_take_the_cluster_with_fewer_tile_times(m, n, k, sched, tile):
    c = heuristics.choose(unaligned(m, n, k), H100_SXM_CLUSTERS)
    assert c.schedule.name == sched and (c.config.block_m, c.config.block_n) == tile
    assert "not multiples of 128 B" in c.reason
    assert f"clusters of {c.schedule.cluster_size} CTAs share each B tile" in c.reason


def test_the_clusters_of_four_need_the_devices_capacity():
    """Without the device's cluster capacity (H100_SXM: none reported) the unforced choice
    keeps the pair; forced, the clusters of four assume whole clusters of the SM count."""
    p = unaligned(7383, 152, 8784)
    c = heuristics.choose(p, H100_SXM)
    assert c.schedule is PersistentClusterSchedule
    assert heuristics.choose(p, H100_SXM, "persistent_cluster4").schedule is Quad
    four = heuristics.choose(p, H100_SXM_CLUSTERS)
    assert "116 tiles of 64x192 = 0.97 waves of 30 clusters of 4" in four.reason
    assert "fewer tile-times than the clusters of 2's best tile" in four.reason


def test_aligned_b_rows_never_take_the_clusters_of_four_unforced():
    p = replace(unaligned(7383, 152, 8784), n=192, b_pitch_aligned=True)
    assert heuristics.choose(p, H100_SXM_CLUSTERS).schedule is not Quad

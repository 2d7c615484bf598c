"""CPU: the persistent_cluster schedule (clusters of two CTAs sharing a B tile through TMA
multicast): rendering, barrier accounting in the source, the tile walk, the launch geometry
and the tensor-map boxes, selection by name. Its compile/resource/SASS checks run with every
other kernel in test_kernels_cpu.py."""
import itertools
import os
import subprocess
import sys

import pytest

from hopmm import heuristics, launch
from hopmm.device import H100_SXM, DeviceInfo
from hopmm.heuristics import Choice
from hopmm.problem import Problem
from hopmm.schedules import (CLUSTER_PAIR, SCHEDULES, TMA_BOX_ELEMS,
                             PersistentClusterQuadSchedule, PersistentClusterSchedule,
                             PersistentSchedule)

Cluster = PersistentClusterSchedule
Quad = PersistentClusterQuadSchedule
CONFIGS = Cluster.configs(H100_SXM.smem_per_block_optin)


def test_every_dtype_layout_and_width_is_registered():
    assert SCHEDULES["persistent_cluster"] is Cluster
    got = {(c.dtype, (c.block_m, c.block_n), c.trans_a, c.trans_b) for c in CONFIGS}
    tiles = [(128, 128), (128, 192), (128, 256), (192, 192)]
    assert got == set(itertools.product(("float16", "bfloat16"), tiles, (False, True),
                                        (False, True)))
    assert all(c.consumers == c.block_m // 64 for c in CONFIGS)


@pytest.mark.parametrize("cfg", CONFIGS, ids=Cluster.kernel_name)
def test_rendered_kernel_is_a_cluster_kernel(cfg):
    src = Cluster.render(cfg).source
    entry = src[src.index('extern "C" __global__'):]
    assert entry.index(f"__cluster_dims__({CLUSTER_PAIR}, 1, 1)") < entry.index("__launch_bounds__")
    assert f"static constexpr int kClusterSize = {CLUSTER_PAIR};" in src
    assert "hopmm::persistent_cluster_gemm<Config, hopmm::MulticastTmaProducer<Config>" in src
    # Same shared-memory plan as the unclustered kernel: only the loads are split.
    assert Cluster.smem_bytes(cfg) == PersistentSchedule.smem_bytes(cfg)


@pytest.mark.parametrize("sched", [s for s in SCHEDULES.values() if s.cluster_size == 1],
                         ids=lambda s: s.name)
def test_other_kernels_have_no_cluster(sched):
    src = sched.render(sched.configs(H100_SXM.smem_per_block_optin)[0]).source
    assert "__cluster_dims__" not in src[src.index('extern "C" __global__'):]
    assert "static constexpr int kClusterSize = 1;" in src


def _body(src, start, end):
    return src[src.index(start):src.index(end, src.index(start))]


def test_barrier_protocol_in_the_source():
    """HOPPER-PTX 4 and 8: expect_tx of all bytes that land in the CTA, empty barriers counting
    the consumers of both CTAs, release on every CTA's empty barrier, the init published
    cluster-wide before use, and a cluster barrier before exit."""
    src = Cluster.render(CONFIGS[0]).source
    producer = _body(src, "struct MulticastTmaProducer", "};\n\n}  // namespace hopmm")
    assert "mbar_arrive_expect_tx(smem.full_bar(s), S::kStageBytes);" in producer
    # own A plus the whole shared B tile (one: clusters multicast a single B)
    assert "kStageBytes = kABytes + kBOperands * kBBytes;" in src and "kBOperands = 1;" in src
    assert "mbar_init(smem.empty_bar(s), S::kEmptyArrivals);" in src
    assert "kEmptyArrivals = kStageReaders * kClusterSize;" in src
    release = _body(src, "void release_stage(", "\n}\n")
    assert "mapa_shared(local, rank)" in release and "rank < S::kClusterSize" in release
    assert "fence.mbarrier_init.release.cluster;" in src
    skeleton = _body(src, "void run_persistent_cluster(", "\n}\n")
    setup, first_sync = skeleton.index("setup_shared_storage"), skeleton.index("cluster_sync();")
    assert setup < first_sync < skeleton.index("setmaxnreg_dec")
    assert skeleton.rstrip().endswith("cluster_sync();")
    # no store past the last M tile
    assert "return c.m_tile < tiles_m;" in _body(src, "struct ClusterTileWalk", "};")
    assert "persistent_consumer<" in _body(src, "void persistent_cluster_gemm(", "\n}\n")
    assert "if (walk.stores(c))" in _body(src, "void persistent_consumer(", "\n}\n")


def test_shared_operand_box_is_a_slice_of_the_tile():
    for cfg in CONFIGS:
        assert Cluster.box_rows(cfg) == (TMA_BOX_ELEMS, cfg.block_n // CLUSTER_PAIR)
        assert PersistentSchedule.box_rows(cfg) == (TMA_BOX_ELEMS, TMA_BOX_ELEMS)
        # the producer's static_asserts: K-major slices of whole 8-row (1024-byte) swizzle
        # atoms; N-major: at least one 64-wide box per CTA
        assert (cfg.block_n // CLUSTER_PAIR) % 8 == 0
        assert cfg.block_n // TMA_BOX_ELEMS >= CLUSTER_PAIR


@pytest.mark.parametrize("m,n,batch,sm_count,expected", [
    (8192, 8192, 1, 132, 132),       # many pairs: one cluster per two SMs
    (8192, 8192, 1, 131, 130),       # an odd SM count leaves one SM idle
    (100, 100, 1, 132, 2),           # one tile: one cluster, the second CTA computes nothing
    (300, 100, 1, 132, 4),           # 3 M tiles: 2 pairs
    (300, 260, 5, 132, 60),          # 2 pairs x 3 N tiles x 5 batches
    (128, 128, 1, 1, 2),             # a device with one SM still gets a whole cluster
])
def test_grid_is_whole_clusters(m, n, batch, sm_count, expected):
    p = Problem(m, n, 64, batch, "bfloat16")
    cfg = Cluster.deepest("bfloat16", 128, False, True, H100_SXM.smem_per_block_optin)
    grid = Cluster.grid(p, cfg, batch, sm_count)
    assert grid == (expected, 1, 1) and grid[0] % CLUSTER_PAIR == 0


WALKS = [(1, 1, 1, 1, 66), (3, 1, 1, 1, 66), (5, 7, 3, 1, 4), (17, 5, 16, 3, 7),
         (32, 112, 16, 1, 66), (7, 2, 4, 5, 66), (2, 2, 1, 2, 1), (9, 9, 32, 2, 13)]


@pytest.mark.parametrize("sched", [Cluster, Quad], ids=lambda s: s.name)
@pytest.mark.parametrize("tiles_m,tiles_n,group,batch,clusters", WALKS, ids=str)
def test_cluster_walk_covers_every_tile_once(tiles_m, tiles_n, group, batch, clusters, sched):
    size = sched.cluster_size
    walks = [sched.cta_tiles(cta, clusters, tiles_m, tiles_n, group, batch)
             for cta in range(clusters * size)]
    inside = [t for w in walks for t in w if t[1] < tiles_m]
    assert sorted(inside) == list(itertools.product(range(batch), range(tiles_m), range(tiles_n)))
    for c in range(clusters):
        ranks = walks[size * c:size * (c + 1)]
        assert len({len(w) for w in ranks}) == 1   # every CTA runs the same iterations
        for step in zip(*ranks):
            (z0, m0, n0) = step[0]
            assert m0 % size == 0 and m0 < tiles_m
            # one shared B tile: the same batch slice and N tile, adjacent M tiles
            assert list(step) == [(z0, m0 + rank, n0) for rank in range(size)]
    outside = [t for w in walks for t in w if t[1] >= tiles_m]
    assert len(outside) == (-tiles_m % size) * tiles_n * batch


def test_cluster_walk_keeps_a_wave_compact():
    """66 clusters of the grouped raster over pairs touch 16 M tiles, like the unclustered
    kernel's 132-tile wave with groups of 16."""
    wave = [t for cta in range(132) for t in Cluster.cta_tiles(cta, 66, 32, 112, 16, 1)[:1]]
    assert len({m for _, m, _ in wave}) == 16 and len({n for _, _, n in wave}) <= 9


def test_cluster_is_selectable_and_ranks_its_own_tiles():
    p = Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n")
    # the default pairs 128 x 256 tiles (15.5 waves, heuristics.CLUSTER_MIN_WAVES); forced, the
    # cluster schedule ranks its tiles by waves of clusters
    assert heuristics.choose(p, H100_SXM).config.block_n == 256
    c = heuristics.choose(p, H100_SXM, "persistent_cluster")
    # 32 x 43 pairs of 128 x 192 tiles = 20.8 waves of 66 clusters (21 tile-times of 192)
    # against 32 x 32 pairs of 128 x 256 = 15.5 waves (16 of 256)
    assert c.schedule is Cluster and c.config.block_n == 192
    assert "20.85 waves of 66 clusters of 2" in c.reason
    assert c.schedule.grid(p, c.config, 1, H100_SXM.sm_count) == (H100_SXM.sm_count, 1, 1)
    small = DeviceInfo("small", (9, 0), 132, 160 * 1024)   # 3 stages of 192, 2 of 256
    assert heuristics.choose(p, small, "persistent_cluster").config.block_n == 192
    # 192 does not fit even beside a one-box ring, 128 does (2 stages, one box)
    smaller = DeviceInfo("smaller", (9, 0), 132, 90 * 1024)
    assert heuristics.choose(p, smaller, "persistent_cluster").config.block_n == 128


def test_environment_selects_the_schedule():
    code = "import hopmm.api as a; print(a._schedule_override)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HOPMM_SCHEDULE": "persistent_cluster"})
    assert run.returncode == 0 and run.stdout.strip() == "persistent_cluster", run.stderr


class _RecordedLaunch:
    def __init__(self, function, grid, block_x, shared_mem_bytes, map_templates, ints,
                 pointers=0, programmatic=False, cluster=(1, 1, 1)):
        self.grid, self.block_x, self.smem = grid, block_x, shared_mem_bytes
        self.cluster = cluster
        self.templates, self.ints = map_templates, ints


class _Array:
    """The attributes of a (batch, rows, cols) cupy array that build_launches reads."""

    def __init__(self, shape, strides_elems, itemsize=2):
        import numpy as np

        self.shape, self.itemsize = shape, itemsize
        self.strides = tuple(s * itemsize for s in strides_elems)
        self.dtype = np.dtype("float16")
        self.data = type("Ptr", (), {"ptr": 1 << 20})()


@pytest.mark.parametrize("sched,block_m,block_n",
                         [(s, *t) for s in (Cluster, Quad) for t in s.tile_shapes()],
                         ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_launch_builds_the_b_box_from_the_schedule(monkeypatch, sched, block_m, block_n,
                                                   b_major):
    import types

    from hopmm import _tensormap

    m, n, k = 300, 520, 192
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0)),
        RawModule=None))
    monkeypatch.setattr(launch, "query", lambda device_id: H100_SXM)
    monkeypatch.setattr(launch, "_loaded", lambda *args: types.SimpleNamespace(
        kernel=types.SimpleNamespace(ptr=0)))
    monkeypatch.setattr(_tensormap, "KernelLaunch", _RecordedLaunch)
    problem = Problem(m, n, k, 1, "float16", "k", b_major)
    cfg = sched.deepest("float16", block_n, False, problem.trans_b,
                        H100_SXM.smem_per_block_optin, block_m)
    a3 = _Array((1, m, k), (m * k, k, 1))
    b3 = _Array((1, k, n), (k * n, n, 1)) if b_major == "n" else _Array((1, k, n), (k * n, 1, k))
    c3 = _Array((1, m, n), (m * n, n, 1))
    from hopmm.layout import BatchMapping

    one = BatchMapping(0, 0, 1, 1)
    (launched,) = launch.build_launches(Choice(sched, cfg, "test", 16), problem, a3, one, b3,
                                        one, c3)
    (_, _, _, a_box, *_), (_, b_dims, _, b_box, *_), _ = launched.templates
    assert a_box == (TMA_BOX_ELEMS, TMA_BOX_ELEMS, 1)   # a K-major A tile in 64-row boxes
    # K-major B: a box of a 1/cluster share of the tile's rows; N-major B: 64 x 64 boxes dealt
    # out whole where the tile has a box per CTA, else each CTA's k slice of every box (a
    # quarter of 64 k rows in the clusters of four, for 128 and 192 columns).
    size = sched.cluster_size
    n_major_k_rows = TMA_BOX_ELEMS if block_n // TMA_BOX_ELEMS >= size else TMA_BOX_ELEMS // size
    assert size == 2 or n_major_k_rows == (TMA_BOX_ELEMS if block_n == 256 else 16)
    assert b_box == ((TMA_BOX_ELEMS, block_n // size, 1) if b_major == "k"
                     else (TMA_BOX_ELEMS, n_major_k_rows, 1))
    assert b_dims[:2] == ((k, n) if b_major == "k" else (n, k))
    tiles_m, tiles_n = -(-m // block_m), -(-n // block_n)
    # 3 M tiles of 128 rows -> 2 pairs per N column (1 group of four), 2 of 192 rows -> 1 pair,
    # 5 of 64 rows -> 2 groups of four
    assert launched.grid == (size * -(-tiles_m // size) * tiles_n, 1, 1)
    assert launched.block_x == (1 + block_m // 64) * 128
    assert launched.ints[7:] == (tiles_m, tiles_n, 16, m, n)


def test_autotune_entry_of_the_cluster_schedule_round_trips(tmp_path, monkeypatch):
    from hopmm import tuning

    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    p = Problem(4096, 4096, 4096, 1, "bfloat16", "k", "n")
    assert any(c.schedule is Cluster for c in tuning.candidates(p, H100_SXM))
    tuning.record({tuning.problem_key(p, H100_SXM): tuning.TunedEntry(
        "persistent_cluster", 256, 3, 16, 750.0, "2026-11-22")})
    choice = tuning.lookup(p, H100_SXM)
    assert choice.schedule is Cluster and choice.config.block_n == 256

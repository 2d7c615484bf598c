"""CPU: the heuristic is a pure function of the problem and the device description."""
import pytest

from hopmm import heuristics
from hopmm.device import H100_SXM, DeviceInfo
from hopmm.problem import Problem


def choose(m, n, k, batch=1, dtype="bfloat16", a_major="k", b_major="n", device=H100_SXM):
    return heuristics.choose(Problem(m, n, k, batch, dtype, a_major, b_major), device)


def test_large_problem_takes_wide_tiles_and_fits_smem():
    c = choose(8192, 8192, 8192)
    assert c.config.block_n == 256
    assert c.schedule.smem_bytes(c.config) <= H100_SXM.smem_per_block_optin
    assert c.config.stages >= heuristics.MIN_STAGES


@pytest.mark.parametrize("m,n", [(512, 512), (128, 4096), (4096, 100)])
def test_few_tiles_take_narrow_tiles(m, n):
    assert choose(m, n, 1024).config.block_n == 128


@pytest.mark.parametrize("m,n,k,width", [
    (3000, 3000, 3000, 192),    # 288 tiles of 256 (2.2 waves) vs 384 of 192 (2.9 waves)
    (8192, 8192, 8192, 256),    # 15.5 waves of 256: quantization costs little
    (4096, 14336, 4096, 256),
    (4096, 4096, 4096, 256),    # 3.9 waves
])
def test_tile_width_follows_wave_quantization(m, n, k, width):
    c = choose(m, n, k)
    assert c.config.block_n == width and "waves" in c.reason


def test_layout_sets_transpose_bits():
    c = choose(1024, 1024, 1024, a_major="m", b_major="k")
    assert c.config.trans_a and not c.config.trans_b
    c = choose(1024, 1024, 1024, a_major="k", b_major="n")
    assert not c.config.trans_a and c.config.trans_b


def test_less_shared_memory_means_shallower_or_narrower():
    small = DeviceInfo("small", (9, 0), 132, 160 * 1024)
    c = choose(8192, 8192, 8192, device=small)
    assert c.config.block_n < 256 and "fewer than" in c.reason
    assert c.schedule.smem_bytes(c.config) <= small.smem_per_block_optin
    medium = DeviceInfo("medium", (9, 0), 132, 200 * 1024)
    assert choose(8192, 8192, 8192, device=medium).config.stages < choose(8192, 8192, 8192).config.stages


def test_too_little_shared_memory_is_an_error():
    tiny = DeviceInfo("tiny", (9, 0), 132, 48 * 1024)
    with pytest.raises(RuntimeError, match="too little"):
        choose(8192, 8192, 8192, device=tiny)


@pytest.mark.parametrize("field,value", [("m", 0), ("dtype", "float32"), ("a_major", "n"),
                                         ("b_major", "m")])
def test_problem_validates(field, value):
    kwargs = dict(m=8, n=8, k=8, batch=1, dtype="float16")
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        Problem(**kwargs)


def test_raster_groups_m_tiles():
    assert choose(4096, 28672, 8192).raster_group == heuristics.RASTER_GROUP_M
    assert choose(100, 28672, 8192).raster_group == 1


def test_schedule_by_name():
    from hopmm.schedules import PersistentSchedule

    c = heuristics.choose(Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n"), H100_SXM,
                          "persistent")
    assert c.schedule is PersistentSchedule
    assert c.schedule.grid(Problem(8192, 8192, 8192, 1, "bfloat16", "k", "n"), c.config, 1,
                           H100_SXM.sm_count) == (H100_SXM.sm_count, 1, 1)


def test_default_schedule_is_persistent():
    assert choose(8192, 8192, 8192).schedule.name == "persistent"

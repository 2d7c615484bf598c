"""CPU: the autotune table (lookup, merge under a lock, several writers, bad files) and the
candidate list. Timing itself runs in the GPU tier."""
import json
import multiprocessing

import pytest

from hopmm import heuristics, tuning
from hopmm.kernel_cache import CacheWarning
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import HALF_BOX_BLOCK_N, SCHEDULES, StreamKSchedule

PROBLEM = Problem(4096, 4096, 4096, 1, "bfloat16", "k", "n")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    return tmp_path


def entry(schedule="persistent", block_n=256, stages=3, group=16, tflops=700.0):
    return tuning.TunedEntry(schedule, block_n, stages, group, tflops, "2026-11-22")


def test_lookup_returns_the_recorded_winner():
    assert tuning.lookup(PROBLEM, H100_SXM) is None
    tuning.record({tuning.problem_key(PROBLEM, H100_SXM): entry(group=8)})
    choice = tuning.lookup(PROBLEM, H100_SXM)
    assert choice.schedule.name == "persistent" and choice.config.block_n == 256
    assert choice.raster_group == 8 and choice.config.trans_b and "autotuned" in choice.reason
    other = Problem(4096, 4096, 4096, 1, "float16", "k", "n")
    assert tuning.lookup(other, H100_SXM) is None


def test_tall_tile_entries_round_trip_and_old_entries_mean_128_rows():
    unaligned = Problem(3000, 3000, 3000, 1, "bfloat16", "k", "n", b_pitch_aligned=False)
    key = tuning.problem_key(unaligned, H100_SXM)
    tuning.record({key: tuning.TunedEntry("persistent_cluster", 192, 4, 16, 600.0, "d",
                                          block_m=192)})
    cfg = tuning.lookup(unaligned, H100_SXM).config
    assert (cfg.block_m, cfg.block_n, cfg.consumers, cfg.stages) == (192, 192, 3, 4)
    # a table written before tall tiles: no block_m field
    data = json.loads(tuning.table_path().read_text())
    del data[key]["block_m"]
    tuning.table_path().write_text(json.dumps(data))
    assert tuning.lookup(unaligned, H100_SXM).config.block_m == 128
    # a tall tile the schedule does not offer
    tuning.record({key: tuning.TunedEntry("persistent", 192, 4, 16, 600.0, "d", block_m=192)})
    assert tuning.lookup(unaligned, H100_SXM) is None


def test_record_merges_instead_of_overwriting():
    tuning.record({"a": entry()})
    tuning.record({"b": entry(block_n=128)})
    data = json.loads(tuning.table_path().read_text())
    assert set(data) == {"a", "b"} and data["b"]["block_n"] == 128


def test_record_of_none_removes_an_entry():
    """Where the heuristic's choice with a wave tail (two kernels) wins, autotune removes the
    problem's entry, in the file and in memory."""
    key = tuning.problem_key(PROBLEM, H100_SXM)
    tuning.record({key: entry(group=8), "b": entry()})
    assert tuning.lookup(PROBLEM, H100_SXM) is not None
    tuning.record({key: None})
    assert set(json.loads(tuning.table_path().read_text())) == {"b"}
    assert tuning.lookup(PROBLEM, H100_SXM) is None


def test_labels_name_a_wave_tail():
    problem = Problem(17344, 64, 6848, 1, "bfloat16")
    choice = heuristics.choose(problem, H100_SXM)
    assert tuning.label(choice).endswith(
        f" + tail m16896: {tuning.label(choice.tail.choice)}")
    assert tuning.label(choice) != tuning.label(choice.tail.whole)


def _writer(args):
    cache_dir, i = args
    import os

    os.environ["HOPMM_CACHE_DIR"] = cache_dir
    from hopmm import tuning as t

    for j in range(5):
        t.record({f"p{i}-{j}": t.TunedEntry("persistent", 256, 3, 16, float(i), "d")})


def test_concurrent_writers_lose_nothing(cache):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(str(cache), i) for i in range(4)])
    data = json.loads(tuning.table_path().read_text())
    assert set(data) == {f"p{i}-{j}" for i in range(4) for j in range(5)}


def test_unreadable_table_is_ignored_with_a_warning():
    tuning.table_path().write_text("{not json")
    with pytest.warns(CacheWarning, match="ignoring unreadable autotune table"):
        assert tuning.lookup(PROBLEM, H100_SXM) is None


def test_entry_of_an_unknown_schedule_is_ignored(capsys):
    tuning.record({tuning.problem_key(PROBLEM, H100_SXM): entry(schedule="gone")})
    assert tuning.lookup(PROBLEM, H100_SXM) is None
    assert "ignoring autotune entry" in capsys.readouterr().err


def test_candidates_cover_schedules_widths_and_groups():
    cands = tuning.candidates(PROBLEM, H100_SXM)
    names = {tuning.label(c) for c in cands}
    # pingpong: 128 only; split-K: none here, 1024 tiles leave no SM idle; stream_k: each
    # tile with lanes by rows and by columns of tiles (its two raster groups), no others.
    shapes = sum(len(s.tile_shapes()) for s in SCHEDULES.values()
                 if not s.split_k and s is not StreamKSchedule)
    stream_k = [c for c in cands if c.schedule is StreamKSchedule]
    # and the transpose on the schedules that store it (KernelConfig.trans_c), every tile of
    # whole boxes (a half box of C is not stored transposed)
    transposed = [c for c in cands if c.config.trans_c]
    assert len(transposed) == len(tuning.RASTER_GROUPS) * sum(
        len([t for t in s.tile_shapes() if t[1] != HALF_BOX_BLOCK_N])
        for s in SCHEDULES.values() if s.transposed_store_ok)
    assert all(" C^T " in tuning.label(c) and c.config.trans_a == PROBLEM.trans_b
               for c in transposed)
    assert len(names) == len(cands) == ((shapes * len(tuning.RASTER_GROUPS) + len(stream_k)
                                         + len(transposed)))
    tiles_m = -(-PROBLEM.m // 128)
    assert sorted((c.config.block_n, c.raster_group) for c in stream_k) == [
        (n, g) for n in (128, 192, 256) for g in (1, tiles_m)]
    for c in stream_k:   # as many CTAs as the SMs allow, a whole number for each lane
        lanes = StreamKSchedule.lanes(PROBLEM, c.config, c.raster_group)
        assert c.splits == H100_SXM.sm_count // lanes * lanes
    assert {(c.schedule.name, c.config.block_m, c.config.block_n) for c in cands} >= {
        ("persistent_cluster", 192, 192), ("persistent", 128, 256)}
    assert {(c.schedule.name, c.config.block_n) for c in cands} >= {("pingpong", 128)}
    assert not any(c.schedule.name == "pingpong" and c.config.block_n != 128 for c in cands)
    assert {c.schedule.name for c in cands} >= {"persistent", "persistent_cluster"}
    small = tuning.candidates(Problem(256, 4096, 4096, 1, "bfloat16", "k", "n"), H100_SXM)
    # only two M tiles to group (four of split_k_parallel's 64-row tiles)
    assert all(c.raster_group == -(-256 // c.config.block_m) for c in small
               if c.schedule is not StreamKSchedule   # (its group 1: lanes of rows)
               and not c.config.trans_c)              # (4096 rows of the transpose's)
    assert {c.raster_group for c in small if c.config.trans_c} == set(tuning.RASTER_GROUPS)
    assert {c.raster_group for c in small if c.config.block_m == 128
            and c.schedule is not StreamKSchedule and not c.config.trans_c} == {2}


@pytest.mark.parametrize("field,value", [("raster_group", 0), ("block_n", "256"),
                                         ("block_n", 96), ("stages", 50), ("stages", 1)])
def test_invalid_entries_are_ignored(field, value, capsys):
    fields = dict(schedule="persistent", block_n=256, stages=3, group=16)
    fields[{"raster_group": "group"}.get(field, field)] = value
    tuning.record({tuning.problem_key(PROBLEM, H100_SXM): entry(**fields)})
    assert tuning.lookup(PROBLEM, H100_SXM) is None
    assert "ignoring autotune entry" in capsys.readouterr().err


def test_table_of_the_wrong_shape_is_ignored():
    tuning.table_path().write_text("[1, 2, 3]")
    with pytest.warns(CacheWarning, match="ignoring unreadable autotune table"):
        assert tuning.lookup(PROBLEM, H100_SXM) is None


@pytest.mark.parametrize("shapes,dtype", [([(1, 2)], "bfloat16"), ([(0, 8, 8)], "bfloat16"),
                                          ([(8, 8, 8)], "float32"), ([], "float16")])
def test_autotune_rejects_bad_arguments_before_any_gpu_work(shapes, dtype):
    with pytest.raises(ValueError, match="autotune"):
        tuning.autotune(shapes, dtype)


def test_split_candidates_where_tiles_leave_sms_idle():
    """512 x 512 x 16384 (16 tiles, 256 k-blocks): split_k within its co-residency bound (8
    splits of 16 tiles fill 128 SMs), split_k_cluster up to a cluster of 8; each count with
    every raster group."""
    p = Problem(512, 512, 16384, 1, "bfloat16", "k", "n")
    cands = tuning.candidates(p, H100_SXM)
    splits = {name: sorted({c.splits for c in cands if c.schedule.name == name})
              for name in ("split_k", "split_k_cluster")}
    assert splits == {"split_k": [2, 4, 8], "split_k_cluster": [2, 4, 8]}
    assert all(c.splits == 1 for c in cands
               if not c.schedule.split_k and c.schedule is not StreamKSchedule)
    labels = [tuning.label(c) for c in cands if c.schedule.name == "split_k_cluster"]
    assert len(labels) == len(set(labels)) and "split_k_cluster 128x128 s5 g4 k8" in labels


@pytest.mark.parametrize("shape", [(768, 768, 25600), (1024, 576, 8064), (1088, 256, 17920)])
def test_candidates_hold_the_heuristics_choice(shape):
    """Split counts of the heuristic's choice that SPLIT_COUNTS does not list (5 and 3 here,
    v0.23) are timed too, so autotune never keeps a config slower than the untuned one."""
    from hopmm import heuristics

    p = Problem(*shape, 1, "bfloat16", "k", "n")
    own = heuristics.choose(p, H100_SXM)
    assert own.splits not in tuning.SPLIT_COUNTS
    assert tuning.label(own) in {tuning.label(c) for c in tuning.candidates(p, H100_SXM)}


def test_sustained_finalists_are_the_fastest_of_large_problems():
    medians = {"slow": 3.0, "fast": 1.0, "mid": 2.0, "slower": 4.0}
    big = tuning.SUSTAINED_MIN_FLOPS
    assert tuning.sustained_finalists(medians, big) == ["fast", "mid", "slow"][
        :tuning.SUSTAINED_FINALISTS]
    assert tuning.sustained_finalists(medians, big - 1) == []
    assert tuning.sustained_finalists({"only": 1.0}, big) == []


DECODE = Problem(4, 8192, 8192, 1, "bfloat16", "k", "k")


def test_decode_candidates_include_gemv_split_counts():
    from hopmm import heuristics
    from hopmm.schedules import GemvSchedule

    gemv = [c for c in tuning.candidates(DECODE, H100_SXM) if c.schedule is GemvSchedule]
    base = heuristics.choose(DECODE, H100_SXM, "gemv")
    assert {c.splits for c in gemv} >= {1, base.splits, 2 * base.splits}
    assert all(c.config == base.config for c in gemv)
    assert len({tuning.label(c) for c in gemv}) == len(gemv)
    assert not any(c.schedule is GemvSchedule for c in tuning.candidates(PROBLEM, H100_SXM))


def test_gemv_entries_round_trip_and_stale_ones_are_ignored(capsys):
    from hopmm import heuristics
    from hopmm.schedules import GemvSchedule

    cfg = heuristics.choose(DECODE, H100_SXM, "gemv").config
    key = tuning.problem_key(DECODE, H100_SXM)
    tuning.record({key: tuning.TunedEntry("gemv", cfg.block_n, 0, 1, 3.0, "d", splits=3,
                                          block_m=cfg.max_rows)})
    choice = tuning.lookup(DECODE, H100_SXM)
    assert choice.schedule is GemvSchedule and choice.splits == 3 and choice.config == cfg
    assert tuning.lookup(DECODE, H100_SXM, epilogue=True) is None   # gemv takes no epilogue
    tuning.record({key: tuning.TunedEntry("gemv", cfg.block_n + 1, 0, 1, 3.0, "d", splits=3,
                                          block_m=cfg.max_rows)})
    assert tuning.lookup(DECODE, H100_SXM) is None
    assert "ignoring autotune entry" in capsys.readouterr().err


def test_a_winner_that_reads_pairs_is_not_taken_for_an_epilogue_that_reads_operands():
    """Timed without the epilogue, the 192-wide overlap tile would read bias or c one pair at
    a time; the 128-wide one fetches whole boxes and stays."""
    from hopmm import heuristics
    from hopmm.schedules import PersistentOverlapSchedule

    problem = Problem(8192, 8192, 1024, 1, "bfloat16")
    base = heuristics.choose(problem, H100_SXM)
    assert base.schedule is PersistentOverlapSchedule and base.config.block_n == 192
    key = tuning.problem_key(problem, H100_SXM)
    tuning.record({key: tuning.TunedEntry(base.schedule.name, base.config.block_n,
                                          base.config.stages, base.raster_group, 100.0, "d")})
    assert tuning.lookup(problem, H100_SXM).schedule is base.schedule
    assert tuning.lookup(problem, H100_SXM, epilogue=True).schedule is base.schedule
    assert tuning.lookup(problem, H100_SXM, epilogue=True, epilogue_reads=True) is None
    narrow = PersistentOverlapSchedule.deepest("bfloat16", 128, False, False,
                                               H100_SXM.smem_per_block_optin)
    tuning.record({key: tuning.TunedEntry(base.schedule.name, 128, narrow.stages,
                                          base.raster_group, 100.0, "d")})
    kept = tuning.lookup(problem, H100_SXM, epilogue=True, epilogue_reads=True)
    assert kept.schedule is PersistentOverlapSchedule and kept.config.block_n == 128

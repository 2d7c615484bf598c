"""CPU-only tests for the pure parts of bench/compare.py (forced kernels against cuBLAS,
interleaved and alone)."""
import importlib.util
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("hopmm_compare_under_test", BENCH_DIR / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def test_parse_kernel():
    spec = compare.parse_kernel("persistent_overlap/128x192/4")
    assert spec == compare.KernelSpec("persistent_overlap", (128, 192), 4)
    assert spec.label == "persistent_overlap/128x192/4"
    assert compare.parse_kernel(" persistent_cluster/192X192/16 ").tile == (192, 192)
    # the half-box tile (schedules.HALF_BOX_BLOCK_N)
    assert compare.parse_kernel("persistent/128x160/4").tile == (128, 160)


@pytest.mark.parametrize("text, message", [
    ("persistent/128x256", "schedule/BMxBN/group"),
    ("nosuch/128x256/16", "unknown schedule"),
    ("persistent/128x200/16", "128x128, 128x160, 128x192, 128x256"),
    ("persistent/192x192/16", "tiles"),            # the tall tile is the cluster kernel's
    ("pingpong/128x160/4", "tiles"),               # no half boxes on the ping-pong kernel
    ("persistent/128xabc/16", "BMxBN"),
    ("persistent/128x256/0", "at least 1"),
    ("split_k/128x128/16", "split count"),
    ("split_k_cluster/128x128/16", "split count"),
])
def test_parse_kernel_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        compare.parse_kernel(text)


def test_shapes_must_be_read_in_place():
    assert compare.parse_shape("3000x3000x3000") == (3000, 3000, 3000)   # 6000-byte rows
    with pytest.raises(ValueError, match="multiples of 8"):
        compare.parse_shape("1000x1023x4096")
    with pytest.raises(ValueError, match="multiples of 8"):
        compare.parse_shape("1000x1024x4097")


def test_cli_rejects_a_bad_kernel_with_its_reason(capsys):
    with pytest.raises(SystemExit):
        compare.main(["4096x4096x4096", "persistent/128x100/16"])
    assert "persistent computes tiles" in capsys.readouterr().err


def test_ratios_are_to_the_faster_cublas_of_the_same_timing():
    got = compare.ratios({"cupy": 2.0, "torch": 1.6, "k": 1.5})
    assert got == pytest.approx({"cupy": 0.8, "torch": 1.0, "k": 1.6 / 1.5})
    assert compare.ratios({"cupy": 2.0, "k": 4.0})["k"] == pytest.approx(0.5)


POWER_CAP, POWER_BRAKE, GPU_IDLE = 0x4, 0x80, 0x1


def _reading(mhz, watts, limiters):
    return {"sm_mhz": mhz, "power_w": watts, "temp_c": 70, "limiters": limiters}


def test_limiter_shares_name_the_known_limiters_only():
    readings = [_reading(1300, 700, POWER_CAP), _reading(1290, 701, POWER_CAP | POWER_BRAKE),
                _reading(1310, 699, POWER_CAP | GPU_IDLE), _reading(1320, 690, None)]
    assert compare.limiter_shares(readings) == {"power cap": 1.0, "power brake": pytest.approx(1 / 3)}
    assert compare.limiter_shares([_reading(1980, 300, 0)]) == {}
    assert compare.limiter_shares([]) == {}


def test_summarize_alone_medians_and_work_per_joule():
    runs = [compare.AloneRun(1.0e-3, 0.70, [_reading(1300, 700, POWER_CAP)]),
            compare.AloneRun(1.2e-3, 0.80, [_reading(1250, 690, POWER_CAP),
                                            _reading(1350, 710, 0)]),
            compare.AloneRun(1.1e-3, None, [])]
    got = compare.summarize_alone(runs, flops=1.0e12)
    assert got["seconds"] == pytest.approx(1.1e-3)
    assert got["power_w"] == 700 and got["sm_mhz"] == 1300
    assert got["gflop_per_j"] == pytest.approx(1.0e12 / 0.75 * 1e-9)   # the runs with a counter
    assert got["limiters"] == {"power cap": pytest.approx(2 / 3)}
    bare = compare.summarize_alone([compare.AloneRun(2e-3, None, [])], flops=1.0)
    assert bare == {"seconds": 2e-3, "power_w": None, "sm_mhz": None, "gflop_per_j": None,
                    "limiters": {}}


def _alone(seconds, watts=None, mhz=None, gflop_per_j=None, limiters=None):
    return {"seconds": seconds, "power_w": watts, "sm_mhz": mhz, "gflop_per_j": gflop_per_j,
            "limiters": limiters or {}}


def test_format_table_shows_both_timings_and_the_power_readings():
    text = compare.format_table(
        "=== t", {"cupy": 100e-6, "torch": 110e-6, "k": 95e-6},
        {"cupy": _alone(100e-6), "torch": _alone(100e-6),
         "k": _alone(102e-6, 699.6, 1305.0, 951.4, {"power cap": 1.0, "power brake": 0.25})})
    lines = text.splitlines()
    assert lines[0] == "=== t" and len(lines) == 6
    assert lines[3].split() == ["cupy", "100.0", "1.000", "100.0", "1.000", "-", "-", "-", "-"]
    assert lines[5].split() == ["k", "95.0", "1.053", "102.0", "0.980", "700", "1305", "951",
                                "power", "cap", "100%,", "power", "brake", "25%"]


def test_alone_summaries_size_runs_and_readings_and_rotate(monkeypatch):
    """Each contestant runs alone once per round (hopmm.timing.sustained_runs: rotated, at
    least one pass over the inputs), with NVML read every POWER_READING_S of its calls."""
    per_call = {"cupy": 2e-3, "k": 1e-3}
    calls = []

    def fake_run_alone(fn, inputs, launches, chunk, gpu):
        calls.append((fn, launches, chunk))
        return compare.AloneRun(per_call[fn], 0.5 * per_call[fn], [_reading(1300, 700, POWER_CAP)])

    monkeypatch.setattr(compare, "run_alone", fake_run_alone)
    got = compare.alone_summaries({n: n for n in per_call}, [0, 1, 2], per_call, 0.6, None,
                                  flops=2e9, rounds=2)
    assert calls == [("cupy", 300, 10), ("k", 600, 20), ("k", 600, 20), ("cupy", 300, 10)]
    assert got["k"]["seconds"] == 1e-3 and got["k"]["gflop_per_j"] == pytest.approx(4000.0)
    assert got["cupy"]["limiters"] == {"power cap": 1.0}


def test_hopmm_stands_for_the_default_path():
    assert compare.parse_kernel("hopmm") == compare.DEFAULT_PATH
    assert compare.parse_kernel(" hopmm ") == compare.DEFAULT_PATH
    with pytest.raises(ValueError, match="unknown schedule"):
        compare.parse_kernel("hopmm/128x256/16")


def test_burst_summaries_size_each_burst_and_shuffle_the_rounds(monkeypatch):
    """Every contestant bursts once per round, after the same idle, its untimed and timed calls
    sized from its time per call; the rounds run in hopmm.timing.round_orders' orders."""
    from hopmm.timing import round_orders

    per_call = {"cupy": 2e-3, "torch": 1e-3, "k": 1e-4}
    calls = []

    def fake_run_burst(fn, inputs, warm, launches, idle_s, gpu):
        calls.append((fn, warm, launches, idle_s))
        return compare.AloneRun(per_call[fn], None, [_reading(1980, 450, 0)])

    monkeypatch.setattr(compare, "run_burst", fake_run_burst)
    got = compare.burst_summaries({n: n for n in per_call}, [0, 1], per_call, 0.25, None,
                                  rounds=3)
    sizes = {"cupy": (1, 5, 0.25), "torch": (2, 10, 0.25), "k": (20, 100, 0.25)}
    assert calls == [(n, *sizes[n]) for order in round_orders(list(per_call), 3) for n in order]
    assert got["k"] == {"seconds": 1e-4, "power_w": 450, "sm_mhz": 1980, "gflop_per_j": None,
                        "limiters": {}}
    # at least one pass over the input sets, at least one untimed call
    calls.clear()
    compare.burst_summaries({"cupy": "cupy"}, list(range(8)), {"cupy": 1.0}, 0.0, None, 1)
    assert calls == [("cupy", 1, 8, 0.0)]


def test_format_bursts_shows_the_clock_of_each_contestant():
    text = compare.format_bursts(
        "--- b", {"cupy": _alone(100e-6, 520.0, 1980.0), "torch": _alone(98e-6),
                  "k": _alone(95e-6, 610.4, 1965.0, limiters={"power cap": 0.5})})
    lines = text.splitlines()
    assert lines[0] == "--- b" and len(lines) == 6
    assert lines[3].split() == ["cupy", "100.0", "0.980", "520", "1980", "-"]
    assert lines[4].split() == ["torch", "98.0", "1.000", "-", "-", "-"]
    assert lines[5].split() == ["k", "95.0", "1.032", "610", "1965", "power", "cap", "50%"]


@pytest.mark.parametrize("flag", [["--bursts", "-1"], ["--burst-idle", "-0.5"]])
def test_cli_rejects_negative_bursts(flag, capsys):
    with pytest.raises(SystemExit):
        compare.main(["4096x4096x4096", "hopmm", *flag])
    assert "at least 0" in capsys.readouterr().err


def test_run_burst_idles_warms_up_then_times_half_and_half(monkeypatch):
    """The idle first, then `warm` untimed calls, then run_alone's timed calls going on with the
    input rotation, with one NVML reading when about half of them have run."""
    events = []
    monkeypatch.setattr(compare.time, "sleep", lambda s: events.append(("idle", s)))

    def fake_run_alone(fn, inputs, launches, chunk, gpu, first=0):
        events.append(("timed", launches, chunk, first))
        return compare.AloneRun(1e-3, None, [])

    monkeypatch.setattr(compare, "run_alone", fake_run_alone)
    got = compare.run_burst(lambda x: events.append(("call", x)), [(0,), (1,), (2,)], 4, 7, 0.5,
                            None)
    assert events == [("idle", 0.5), ("call", 0), ("call", 1), ("call", 2), ("call", 0),
                      ("timed", 7, 3, 4)]
    assert got.seconds == 1e-3
    compare.run_burst(lambda x: None, [(0,)], 1, 1, 0.0, None)
    assert events[-1] == ("timed", 1, 1, 1)

"""CPU-only tests for the pure parts of bench/bench.py and bench/chart.py."""
import importlib.util
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load(name, filename):
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load("hopmm_bench_under_test", "bench.py")


def fake_rows():
    rows = []
    for shape, speed in (("4096x4096x4096", 700.0), ("2048x2048x2048", 550.0), ("512x512x16384", 90.0)):
        for dtype in ("bf16", "fp16"):
            tf = {"hopmm": speed * 1.02, "cupy": speed, "torch": speed * 1.01}
            rows.append({"shape": shape, "dtype": dtype, "ok": True, "error": None,
                         "rel_err": 2.5e-3 if dtype == "bf16" else 3.1e-4,
                         "tflops": tf, "host_us": {"hopmm": 6.5} if shape.startswith("512x") else None,
                         "enqueue_us": {"hopmm": 4.3} if shape.startswith("512x") else None,
                         **bench.speed_ratios(tf)})
    return rows


# ------------------------------------------------------------ metadata
def test_command_line_names_the_machine_output_folder_by_its_variable(monkeypatch):
    monkeypatch.setenv("OUT", "/scratch/out/")
    assert (bench.command_line(["--out", "/scratch/out", "--rounds", "6"])
            == "python bench/bench.py --out $OUT --rounds 6")
    assert bench.command_line(["--out", "/scratch/out/probe"]) == "python bench/bench.py --out $OUT/probe"
    monkeypatch.delenv("OUT")
    assert (bench.command_line(["--out", "/scratch/out", "--shapes", "a b"])
            == "python bench/bench.py --out /scratch/out --shapes 'a b'")


# ------------------------------------------------------------ parsing
@pytest.mark.parametrize("text, expected", [
    ("8192x8192x8192", (8192, 8192, 8192)),
    ("4096x28672x8192", (4096, 28672, 8192)),
    (" 512X512x16384 ", (512, 512, 16384)),
])
def test_parse_shape(text, expected):
    assert bench.parse_shape(text) == expected


@pytest.mark.parametrize("text", ["8192x8192", "1x2x3x4", "axbxc", "0x16x16", "-1x2x3", "4096x4096x", "", "1.5x2x3"])
def test_parse_shape_rejects_malformed(text):
    with pytest.raises(ValueError, match="MxNxK|positive"):
        bench.parse_shape(text)


def test_parse_shapes_keeps_order():
    assert bench.parse_shapes("1024x1024x1024,512x512x16384") == [(1024, 1024, 1024), (512, 512, 16384)]


def test_cli_rejects_bad_shape_with_clear_message(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--shapes", "4096x4096"])
    assert exc.value.code != 0
    assert "4096x4096" in capsys.readouterr().err


def test_cli_rejects_bad_dtype(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtypes", "fp32"])
    assert "fp32" in capsys.readouterr().err


def test_cli_defaults_and_quick():
    full = bench.parse_args([])
    assert len(full.shapes) == 13 and full.shapes[0] == (8192, 8192, 8192)
    assert full.dtypes == ["bf16", "fp16"]
    assert full.seconds_per_shape == bench.DEFAULT_WARMUP_S and full.rounds == bench.DEFAULT_ROUNDS
    quick = bench.parse_args(["--quick"])
    assert quick.shapes == [(4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024), (512, 512, 16384)]
    assert (quick.seconds_per_shape, quick.rounds) == (bench.QUICK_WARMUP_S, bench.QUICK_ROUNDS)
    assert (full.sustained_seconds, quick.sustained_seconds) == (bench.SUSTAINED_S,
                                                                 bench.QUICK_SUSTAINED_S)
    assert bench.parse_args(["--sustained-seconds", "0"]).sustained_seconds == 0
    explicit = bench.parse_args(["--quick", "--shapes", "256x256x256", "--dtypes", "bfloat16"])
    assert explicit.shapes == [(256, 256, 256)] and explicit.dtypes == ["bf16"]


def test_default_run_fits_time_budget():
    """Warm-up, interleaved and sustained rounds must leave room in the ~5-minute budget."""
    args = bench.parse_args([])
    pairs = len(args.shapes) * len(args.dtypes)
    rounds_s = args.rounds * len(bench.CONTESTANTS) * bench.TARGET_TIMING_S
    sustained = [s for s in args.shapes if bench.sustained_applies(s, args.sustained_seconds)]
    sustained_s = (len(sustained) * len(args.dtypes) * bench.SUSTAINED_ROUNDS
                   * len(bench.CONTESTANTS) * args.sustained_seconds)
    assert len(sustained) == 10  # the power-limited shapes: 2048^3 and up
    assert pairs * (args.seconds_per_shape + rounds_s) + sustained_s < 0.6 * 5 * 60


def test_sustained_applies_to_large_shapes_only():
    assert bench.sustained_applies((2048, 2048, 2048), 0.4)
    assert bench.sustained_applies((8192, 8192, 1024), 0.4)
    assert not bench.sustained_applies((2048, 2048, 2047), 0.4)
    assert not bench.sustained_applies((512, 512, 16384), 0.4)
    assert not bench.sustained_applies((8192, 8192, 8192), 0.0)


def test_sustained_rounds_run_each_alone_in_rotated_order(monkeypatch):
    """Each contestant gets one run per round of about `seconds` of launches, every slot once
    over the rounds; the medians give the ratios."""
    calls = []
    per_launch = {"hopmm": 200e-6, "cupy": 250e-6, "torch": 240e-6}
    slow_once = {"hopmm": [400e-6]}  # one outlier round: the median ignores it

    def fake_time(ctx, c, n):
        calls.append((c.name, n))
        extra = slow_once.get(c.name)
        return extra.pop() if extra else per_launch[c.name]

    monkeypatch.setattr(bench, "time_contestant", fake_time)
    contestants = [bench.Contestant(name, None, []) for name in per_launch]
    got = bench.sustained_rounds(None, contestants, per_launch, (4096, 4096, 4096), 0.5)
    assert len(calls) == bench.SUSTAINED_ROUNDS * len(contestants)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    for slot in range(3):
        assert {r[slot][0] for r in rounds} == set(per_launch)
    assert all(n == round(0.5 / per_launch[name]) for name, n in calls)
    assert got["tflops"]["hopmm"] == pytest.approx(bench.tflops(4096, 4096, 4096, 200e-6))
    assert got["hopmm_vs_best"] == pytest.approx(240 / 200)
    assert got["seconds"] == 0.5 and len(got["per_launch_us"]["hopmm"]) == bench.SUSTAINED_ROUNDS


# ----------------------------------------------------------- rotation
@pytest.mark.parametrize("names", [("hopmm", "cupy", "torch"), ("hopmm", "cupy")])
def test_rounds_balance_slots_and_predecessors(names):
    rounds = 2 * math.factorial(len(names))
    orders = bench.permutation_orders(names, rounds)
    assert len(orders) == rounds and orders[0] == list(names)
    for order in orders:
        assert sorted(order) == sorted(names)
    for pos in range(len(names)):
        counts = Counter(order[pos] for order in orders)
        assert set(counts) == set(names) and len(set(counts.values())) == 1
    for name in names:  # who ran just before `name` in the same round
        before = Counter(order[order.index(name) - 1] for order in orders if order[0] != name)
        assert set(before) == set(names) - {name} and len(set(before.values())) == 1


def test_default_rounds_run_every_order_of_three():
    assert bench.DEFAULT_ROUNDS % math.factorial(len(bench.CONTESTANTS)) == 0
    assert bench.QUICK_ROUNDS % math.factorial(len(bench.CONTESTANTS)) == 0


# ------------------------------------------------------ sizing, ratios
def test_input_set_count_bounds_and_l2():
    l2 = bench.L2_FALLBACK_BYTES
    assert bench.input_set_count(8192, 8192, 8192, l2) == bench.MIN_INPUT_SETS
    assert bench.input_set_count(512, 512, 512, l2) == bench.MAX_INPUT_SETS
    m = n = k = 1024  # 6 MiB per set
    count = bench.input_set_count(m, n, k, l2)
    assert bench.MIN_INPUT_SETS <= count <= bench.MAX_INPUT_SETS
    assert count * (m * k + k * n + m * n) * bench.ELEMENT_BYTES > bench.L2_MULTIPLE * l2 or count == bench.MAX_INPUT_SETS


def test_launches_for_targets_timing_length():
    assert bench.launches_for(1e-3) == round(bench.TARGET_TIMING_S / 1e-3)
    assert bench.launches_for(10.0) == 1
    assert bench.launches_for(1e-9) == bench.MAX_LAUNCHES
    assert bench.launches_for(0.0) == bench.MAX_LAUNCHES


def test_speed_ratios_and_tflops():
    assert bench.tflops(1000, 1000, 1000, 1e-3) == pytest.approx(2.0)
    r = bench.speed_ratios({"hopmm": 600.0, "cupy": 500.0, "torch": 550.0})
    assert r["hopmm_vs_cupy"] == pytest.approx(1.2)
    assert r["hopmm_vs_torch"] == pytest.approx(600 / 550)
    assert r["hopmm_vs_best"] == pytest.approx(600 / 550)
    no_torch = bench.speed_ratios({"hopmm": 600.0, "cupy": 500.0})
    assert no_torch["hopmm_vs_torch"] is None and no_torch["hopmm_vs_best"] == pytest.approx(1.2)
    assert bench.speed_ratios({"cupy": 500.0})["hopmm_vs_best"] is None


def test_rel_err_gate():
    assert bench.rel_err_ok(5e-3, "bf16") and not bench.rel_err_ok(5e-3, "fp16")
    assert not bench.rel_err_ok(math.nan, "bf16") and not bench.rel_err_ok(None, "fp16")


def test_device_slug():
    assert bench.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.device_slug("  ") == "unknown-device"


# --------------------------------------------------------------- table
def test_format_table_columns_and_alignment():
    rows = fake_rows()
    rows.append(bench.error_row((3000, 3000, 3000), "fp16", "RuntimeError: boom"))
    bad = dict(rows[0], ok=False, rel_err=0.5, error="rel_err too big")
    rows.append(bad)
    text = bench.format_table(rows)
    lines = text.splitlines()
    assert lines[0] == bench.TABLE_TITLE
    for column in ("shape", "dtype", "hopmm TFLOP/s", "cupy TFLOP/s", "torch TFLOP/s",
                   "hopmm/cupy", "hopmm/best", "sust/best", "rel_err", "host_us",
                   "enqueue_us", "MHz/W"):
        assert column in lines[1]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned: equal widths
    assert "4096x4096x4096" in text and "714.0" in text and "6.5" in text and "4.3" in text
    assert "ERROR" in lines[-2] and "FAIL" in lines[-1]


def test_format_table_shows_the_sustained_ratio():
    rows = fake_rows()[:2]
    rows[0]["sustained"] = {"hopmm_vs_best": 0.987}
    lines = bench.format_table(rows).splitlines()
    column = lines[1].index("sust/best") + len("sust/best")
    assert lines[3][:column].endswith("0.987") and lines[4][:column].endswith("-")


def test_format_table_shows_clock_and_power():
    rows = fake_rows()[:2]
    rows[0]["gpu_state"] = {"sm_mhz": 1305.0, "power_w": 699.4, "temp_c": 77, "readings": 9}
    rows[1]["gpu_state"] = {"sm_mhz": 1980.0, "power_w": None, "temp_c": None, "readings": 1}
    lines = bench.format_table(rows).splitlines()
    assert lines[3].endswith("1305/699") and lines[4].endswith("1980/-")


# ------------------------------------------------------------ GPU state
def test_summarize_gpu_state_medians_and_hottest():
    samples = [{"sm_mhz": 1300, "power_w": 700.0, "temp_c": 75},
               {"sm_mhz": 1500, "power_w": 650.0, "temp_c": 78},
               {"sm_mhz": 1350, "power_w": None, "temp_c": 76}]
    assert bench.summarize_gpu_state(samples) == {"sm_mhz": 1350, "power_w": 675.0,
                                                  "temp_c": 78, "readings": 3}
    assert bench.summarize_gpu_state([]) is None
    assert bench.summarize_gpu_state([{"sm_mhz": None, "power_w": None, "temp_c": None}]) is None


class FakeNvml:
    """NVML's calling convention: status 0 and the value through the last pointer."""

    def __init__(self, values):
        self.values = values  # name -> value, or None for an error status

    def __getattr__(self, name):
        def call(handle, *args):
            value = self.values[name]
            if value is None:
                return 999  # NVML_ERROR_UNKNOWN
            args[-1]._obj.value = value
            return 0
        return call


def test_gpu_state_reads_and_converts_units():
    lib = FakeNvml({"nvmlDeviceGetPowerUsage": 699500, "nvmlDeviceGetClockInfo": 1305,
                    "nvmlDeviceGetTemperature": 77, "nvmlDeviceGetEnforcedPowerLimit": 700000,
                    "nvmlDeviceGetMaxClockInfo": 1980})
    state = bench.GpuState(lib, handle=None)
    assert state.read() == {"sm_mhz": 1305, "power_w": pytest.approx(699.5), "temp_c": 77}
    assert state.limits() == {"power_limit_w": pytest.approx(700.0), "max_sm_mhz": 1980}
    lib.values["nvmlDeviceGetPowerUsage"] = None  # e.g. not supported on this board
    assert state.read()["power_w"] is None and state.read()["sm_mhz"] == 1305


def test_gpu_state_open_without_nvml_says_why():
    with pytest.raises(OSError):
        bench.GpuState.open("0000:00:00.0", library="libhopmm-no-such-nvml.so")


# ---------------------------------------------------------------- JSON
def test_json_round_trip(tmp_path):
    rows = fake_rows()
    meta = {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132, "date": "2025-01-01T00:00:00+00:00"}
    path = bench.write_json(tmp_path / "sub" / "bench.json", meta, rows)
    assert bench.load_json(path) == (meta, rows)
    assert not list(path.parent.glob("*.tmp"))
    # one line a row: the file stays small and a shape's row can be grepped
    row_lines = [line.rstrip(",") for line in path.read_text().splitlines()
                 if line.startswith('{"')]
    assert [json.loads(line) for line in row_lines] == rows


def test_json_stores_nan_as_null(tmp_path):
    row = bench.error_row((64, 64, 64), "bf16", "rel_err is NaN")
    row["rel_err"] = math.nan
    path = bench.write_json(tmp_path / "nan.json", {}, [row])
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert bench.load_json(path)[1][0]["rel_err"] is None


# --------------------------------------------------------------- chart
def test_draw_chart_writes_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    rows = fake_rows() + [bench.error_row((3000, 3000, 3000), "bf16", "boom")]
    path = bench.draw_chart(rows, tmp_path / "chart.png", "test chart")
    assert path is not None and path.stat().st_size > 0
    assert path.read_bytes()[:len(PNG_MAGIC)] == PNG_MAGIC


def test_chart_cli_redraws_from_json(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    json_path = bench.write_json(tmp_path / "run.json", {"device": "Fake GPU", "date": "2025-01-01"}, fake_rows())
    chart = _load("hopmm_chart_under_test", "chart.py")
    assert chart.main([str(json_path)]) == 0
    png = json_path.with_suffix(".png")
    assert png.read_bytes()[:len(PNG_MAGIC)] == PNG_MAGIC
    assert str(png) in capsys.readouterr().out


# ------------------------------------------------------- importability
def test_bench_imports_without_gpu_libraries():
    """Make cupy, torch and hopmm unimportable, then import bench.py."""
    code = (
        "import sys, importlib.util\n"
        "for m in ('cupy', 'torch', 'hopmm'): sys.modules[m] = None\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(BENCH_DIR / 'bench.py')!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "print(mod.format_table([]).splitlines()[0])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert bench.TABLE_TITLE in result.stdout


# ------------------------------------------------------------ host cost
def test_enqueue_us_issues_batches_from_an_idle_gpu_and_never_waits_inside_one():
    events = []

    class Ctx:
        def sync(self):
            events.append("sync")

    sets = [("a0", "b0", "c0"), ("a1", "b1", "c1"), ("a2", "b2", "c2")]
    c = bench.Contestant("fake", lambda a, b, out: events.append(a), sets)
    us = bench.enqueue_us(Ctx(), c, calls=4, batches=3)
    assert us > 0
    # A sync before each batch and one after the last; none between the calls of a batch.
    batch = ["sync", "a0", "a1", "a2", "a0"]
    assert events == batch * 3 + ["sync"]


def test_parallel_tests_balances_files_and_adds_up_summaries(monkeypatch):
    parallel_tests = _load("hopmm_parallel_tests_under_test", "parallel_tests.py")
    counts = {"a.py": 10, "b.py": 7, "c.py": 4, "d.py": 3}
    monkeypatch.setattr(parallel_tests, "count_tests", counts.__getitem__)
    groups = parallel_tests.balance(list(counts), 2)
    assert sorted(map(sorted, groups)) == [["a.py", "d.py"], ["b.py", "c.py"]]
    assert parallel_tests.balance(["a.py"], 4) == [["a.py"]]  # no empty groups
    text = "....\nFAILED x.py::t - boom\n3 failed, 120 passed, 2 skipped, 1 error in 9.1s\n"
    assert parallel_tests.tally(text) == {"failed": 3, "passed": 120, "skipped": 2, "errors": 1}
    assert parallel_tests.tally("collected nothing\n") == {}
    # A failure's why, without its log: the test's header and pytest's error lines.
    log = ("____ test_x[1] ____\nx.py:3: in test_x\n    assert f() == 2\nE   assert 1 == 2\n"
           "FAILED x.py::test_x[1] - assert 1 == 2\n")
    assert parallel_tests.error_lines(log) == ["____ test_x[1] ____", "E   assert 1 == 2"]


# ------------------------------------------------------------ autotune_table --from-sweep
autotune_table = _load("hopmm_autotune_table_under_test", "autotune_table.py")


def test_sweep_shapes_are_the_slow_kernel_path_ones_in_their_dtypes():
    def row(m, ratio, path="kernel", aligned=True, ok=True, dtype="fp16"):
        return {"m": m, "n": 64, "k": 128, "dtype": dtype, "ok": ok, "rows_aligned": aligned,
                "plan": {"path": path}, "hopmm_vs_best": ratio,
                "tflops": {"hopmm": 1.0, "cupy": float(m), "torch": m + 0.5}}

    rows = [row(1, 0.9), row(2, 0.5, dtype="bf16"), row(3, 0.99), row(4, 0.5, "cupy.matmul"),
            row(5, 0.5, aligned=False), row(6, 0.5, ok=False), row(7, 0.96)]
    assert autotune_table.sweep_shapes(rows, 0.97) == [
        ((2, 64, 128), "bf16", 2.5), ((1, 64, 128), "fp16", 1.5), ((7, 64, 128), "fp16", 7.5)]
    assert autotune_table.sweep_shapes(rows, 0.6) == [((2, 64, 128), "bf16", 2.5)]


def test_pick_line_rates_the_pick_against_the_fastest_candidate():
    line = autotune_table.pick_line((64, 512, 1024), "bf16", "persistent 128x128 s6 g16",
                                    {"persistent 128x128 s6 g16": 80.0,
                                     "persistent 128x128 s6 g4": 100.0}, 125.0)
    assert line.startswith("64x512x1024 bf16: pick persistent 128x128 s6 g16 80.0 TFLOP/s, "
                           "0.800 of the best; best persistent 128x128 s6 g4 100.0 (0.80 x "
                           "the sweep's cuBLAS 125.0)")
    assert "untimed" in autotune_table.pick_line((1, 1, 1), "fp16", "gone", {"a": 1.0}, 2.0)


# ------------------------------------------------------------ pick_ab
pick_ab = _load("hopmm_pick_ab_under_test", "pick_ab.py")
H100_SXM_CLUSTERS = pick_ab.H100_SXM_CLUSTERS


def test_pick_ab_reads_the_change_as_constants_that_undo_it():
    assert pick_ab.parse_patches("ONE_ROUND_SHORT_MAX_K_BLOCKS=0; ONE_ROUND_SHORT_GAIN = 1.1") \
        == {"ONE_ROUND_SHORT_MAX_K_BLOCKS": 0, "ONE_ROUND_SHORT_GAIN": 1.1}
    for bad, why in (("FOO=1", "not a constant"), ("choose=1", "not a constant"),
                     ("ONE_ROUND_SHORT_GAIN", "not NAME=VALUE"),
                     ("ONE_ROUND_SHORT_GAIN=1.1x", "not a Python literal"), (";", "no NAME")):
        with pytest.raises(ValueError, match=why):
            pick_ab.parse_patches(bad)


def test_pick_ab_patches_and_restores_the_heuristic():
    from hopmm import heuristics

    before = heuristics.ONE_ROUND_SHORT_MAX_K_BLOCKS
    p = pick_ab.row_major_problem(1984, 256, 6272, "bfloat16")
    new = heuristics.choose(p, H100_SXM_CLUSTERS)
    with pick_ab.patched({"ONE_ROUND_SHORT_MAX_K_BLOCKS": 0}):
        assert heuristics.ONE_ROUND_SHORT_MAX_K_BLOCKS == 0
        old = heuristics.choose(p, H100_SXM_CLUSTERS)
    assert heuristics.ONE_ROUND_SHORT_MAX_K_BLOCKS == before
    assert new.splits == 1 and old.splits > 1   # the one-round rule's own measured case
    assert heuristics.choose(p, H100_SXM_CLUSTERS) == new


def test_pick_ab_writes_a_timed_row_in_one_line():
    row = dict(shape=[4096, 16, 8192], dtype="bf16", new="persistent 128x64 s8 g1",
               old="gemv bf16_m16", tflops={"new": 60.0, "old": 30.0, "cupy": 50.0},
               cublas_tflops=50.0, rel_err={"new": 1e-3, "old": 2e-3}, ok=True)
    assert pick_ab.row_line(row) == ("4096x16x8192 bf16: new / old 2.000, x cuBLAS 1.200 (old "
                                     "0.600); persistent 128x64 s8 g1 (old gemv bf16_m16)")
    failed = pick_ab.row_line(dict(row, ok=False))
    assert failed.endswith("FAILED the check: {'new': 0.001, 'old': 0.002}")


def test_pick_ab_lists_the_shapes_a_change_moves():
    moved = pick_ab.moved_shapes([11, 13, 17], {"ONE_ROUND_SHORT_MAX_K_BLOCKS": 0},
                                 H100_SXM_CLUSTERS)
    assert {"shape": [3136, 192, 7360], "dtype": "fp16",
            "new": "persistent 64x128 s8 g1",
            "old": "split_k_cluster 128x128 s5 g4 k2"} in moved
    assert all(e["new"] != e["old"] for e in moved)
    assert pick_ab.moved_shapes([11], {"ONE_ROUND_SHORT_GAIN":
                                       pick_ab.heuristics.ONE_ROUND_SHORT_GAIN},
                                H100_SXM_CLUSTERS) == []


def test_pick_ab_lists_the_moves_on_a_device_of_another_dram_peak(capsys):
    """`--list --dram-tbps`: the choices of an H100-like device of that DRAM peak; undoing the
    scaling (the reference peak set to the device's) moves what the H200's rates moved (NOTES
    v0.52); on the GPU the device reports its own peak."""
    h200 = "4.814304"
    assert pick_ab.main(["--seeds", "681", "--old", f"REFERENCE_DRAM_TBPS={h200}", "--list",
                         "--dram-tbps", h200]) == 0
    out = capsys.readouterr().out
    count = int(out.split()[0])
    assert count > 0 and out.count(" -> ") == count
    h100 = repr(pick_ab.heuristics.REFERENCE_DRAM_TBPS)   # the H100's own: nothing moves
    assert pick_ab.main(["--seeds", "681", "--old", f"REFERENCE_DRAM_TBPS={h100}", "--list"]) == 0
    assert capsys.readouterr().out.startswith("0 sweep shapes")
    with pytest.raises(SystemExit):
        pick_ab.main(["--seeds", "681", "--old", "SPLIT_MORE_CTAS=1", "--dram-tbps", h200])


def test_pick_ab_draws_decode_shapes(capsys):
    """`--draw decode`: products of 1-16 rows; v0.53's K-major FMA rate moves 3-4 row products
    of a K-major B (NT) on an H200-like device, none on the H100 and none of an N-major B."""
    old = "GEMV_FMA_K_MAJOR_TFLOPS=12.0"
    h200 = "4.814304"
    assert pick_ab.main(["--draw", "decode", "--seeds", "801", "--layout", "NT", "--old", old,
                         "--list", "--dram-tbps", h200]) == 0
    out = capsys.readouterr().out
    count = int(out.split()[0])
    assert out.split()[1] == "decode" and count > 0 and out.count(" -> gemv ") == count
    rows = [int(line.split("x")[0]) for line in out.splitlines()[1:]]
    assert len(rows) == count and all(3 <= m <= 4 for m in rows)
    for args in (["--layout", "NT"], ["--layout", "NN", "--dram-tbps", h200]):
        assert pick_ab.main(["--draw", "decode", "--seeds", "801", "--old", old, "--list",
                             *args]) == 0
        assert capsys.readouterr().out.startswith("0 decode shapes")


def test_pick_ab_layouts_describe_the_operands_and_move_their_own_shapes():
    nt = pick_ab.layout_problem(128, 3520, 10368, "bfloat16", "NT")
    tn = pick_ab.layout_problem(128, 3520, 10368, "bfloat16", "TN")
    assert (nt.a_major, nt.b_major, tn.a_major, tn.b_major) == ("k", "k", "m", "n")
    assert pick_ab.row_major_problem(64, 96, 32, "float16") == \
        pick_ab.layout_problem(64, 96, 32, "float16", "NN")
    # A transposed A's lines are M long: 100 rows of 2 bytes are not 16-byte multiples.
    assert pick_ab.layout_aligned(100, 128, 64, "NN")
    assert not pick_ab.layout_aligned(100, 128, 64, "TN")
    assert not pick_ab.layout_aligned(128, 128, 100, "NT")
    off = {"SPLIT_MORE_CTAS": float("inf")}
    for name in ("NT", "TN"):
        moved = pick_ab.moved_shapes(range(561, 566), off, H100_SXM_CLUSTERS, name)
        assert moved and all(e["new"] != e["old"] for e in moved)
        assert all(pick_ab.layout_aligned(*e["shape"], name) for e in moved)


def test_pick_ab_summary():
    def row(new, old, cublas, ok=True):
        return {"ok": ok, "tflops": {"new": new, "old": old}, "cublas_tflops": cublas}

    s = pick_ab.summarize([row(110, 100, 100), row(90, 100, 100), row(1, 100, 100, ok=False)])
    assert s["timed"] == 2 and s["geomean_new_over_old"] == pytest.approx((1.1 * 0.9) ** 0.5)
    assert (s["min"], s["max"]) == (pytest.approx(0.9), pytest.approx(1.1))
    assert (s["below_new"], s["below_old"]) == (1, 0)
    assert pick_ab.summarize([]) == {"timed": 0}

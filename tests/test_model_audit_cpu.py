"""bench/model_audit.py: the heuristic's models against sweep timings, on sweep files written
here (no GPU)."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import model_audit as audit  # noqa: E402

H100_META = {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132}


def sweep_row(m, n, k, measured_over_model=1.0, kernel=None, aligned=True, layout="NN"):
    """A sweep row as bench/sweep.py writes one, timed at `measured_over_model` x the model
    of today's pick (or on `kernel`)."""
    device = audit.device_of(H100_META)
    problem = audit.pick_ab.row_major_problem(m, n, k, "bfloat16")
    choice = audit.heuristics.choose(problem, device)
    model = audit.heuristics.estimate_us(choice, problem, device)
    return {"shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "dtype": "bf16", "ok": True,
            "rows_aligned": aligned,
            "plan": {"path": "kernel", "layout": layout,
                     "kernel": kernel or choice.schedule.kernel_name(choice.config)},
            "median_us": {"hopmm": model * measured_over_model, "cupy": model, "torch": model}}


def write_sweep(tmp_path, rows, meta=H100_META):
    path = tmp_path / "sweep-test.json"
    path.write_text(json.dumps({"metadata": meta, "rows": rows}))
    return path


def test_devices_take_the_sweeps_dram_peak():
    assert audit.device_of(H100_META).dram_tbps == pytest.approx(3.352, abs=1e-3)
    assert audit.device_of({"device": "NVIDIA H200"}).dram_tbps == pytest.approx(4.814, abs=1e-3)
    assert audit.device_of({"device": "X", "dram_tbps": 2.0, "sm_count": 114}).sm_count == 114
    assert audit.device_of({"device": "unknown"}).dram_tbps is None   # the models' own rates


@pytest.mark.parametrize("tiles,label", [(60, "<1"), (132, "1-2"), (300, "2-4"), (528, "4+"),
                                         (527, "2-4")])
def test_waves_are_grouped_by_their_edges(tiles, label):
    assert audit.waves_label(tiles, 132) == label


def test_rows_give_measured_over_model_and_skip_what_the_model_did_not_pick(tmp_path):
    rows = [sweep_row(4096, 4096, 4096, 1.25), sweep_row(2048, 6144, 1024, 0.8),
            sweep_row(4096, 4096, 2048, 1.1, kernel="hopmm_persistent_an_older_pick"),
            sweep_row(4096, 4096, 1024, 1.1, aligned=False),
            sweep_row(4096, 2048, 1024, 1.1, layout="NN (A k-major, B n-major); aligned copies of a")]
    got, changed = audit.audit_rows(write_sweep(tmp_path, rows))
    assert changed == 1
    assert [r["ratio"] for r in got] == pytest.approx([1.25, 0.8])
    assert all(r["device"] == "NVIDIA H100 80GB HBM3" for r in got)
    groups = audit.summarize(got, ("device",), 1)
    assert groups[0]["rows"] == 2 and groups[0]["geomean"] == pytest.approx(math.sqrt(1.25 * 0.8))
    assert audit.summarize(got, ("device",), 3) == []    # below the smallest group shown


def test_main_prints_the_tables(tmp_path, capsys):
    path = write_sweep(tmp_path, [sweep_row(4096, 4096, 4096, 1.2) for _ in range(8)])
    out_json = tmp_path / "audit.json"
    assert audit.main([str(path), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("8 rows of 1 sweeps (0 left out")
    assert "| 1.200 |" in out
    assert json.loads(out_json.read_text())["detail"][0]["rows"] == 8


def test_candidates_of_autotune_tables(tmp_path, capsys):
    """--candidates: every timed candidate of a table against its model (the device's DRAM
    peak given), grouped by schedule and tile; labels today's candidates do not hold, tiles
    no model rates and untimed ones left out."""
    from dataclasses import replace

    from hopmm import tuning

    device = replace(audit.H100_SXM_CLUSTERS, dram_tbps=4.81)
    m, n, k = 832, 256, 20160
    problem = audit.pick_ab.row_major_problem(m, n, k, "bfloat16")
    flop = 2 * m * n * k
    tflops, expected = {}, {}
    for i, choice in enumerate(tuning.candidates(problem, device)):
        try:
            model = audit.heuristics.estimate_us(choice, problem, device)
        except KeyError:
            model = None
        ratio = 1.0 + 0.1 * (i % 3)
        label = tuning.label(choice)
        tflops[label] = flop / (model * ratio * 1e6) if model else 100.0
        if model:
            expected[label] = ratio
    assert any(c.config.block_n == 64 and c.config.block_m == 64
               for c in tuning.candidates(problem, device))   # a tile no model rates
    tflops["persistent 128x999 s4 g1"] = 100.0
    tflops[next(iter(expected))] = None    # not timed
    del expected[next(iter(expected))]
    path = tmp_path / "table.json"
    path.write_text(json.dumps([{"shape": [m, n, k], "dtype": "bf16", "pick": "",
                                 "tflops": tflops, "cublas_tflops": 1.0}]))
    rows = audit.candidate_rows(path, device)
    assert {r["label"]: r["ratio"] for r in rows} == pytest.approx(expected)
    assert audit.main(["--candidates", str(path), "--dram-tbps", "4.81", "--min-rows", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(expected)} timed candidates of 1 tables")
    assert "split_k_parallel | 64x128 |" in out

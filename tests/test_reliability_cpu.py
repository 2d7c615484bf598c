"""CPU: the parts of bench/reliability.py that need no GPU: arguments, the sanitizer's
command lines and plan, how a sanitizer run is judged, the summary table, finding
compute-sanitizer, the shapes' notation and the cache check."""
import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

from hopmm import epilogue, kernel_cache
from hopmm.schedules import SCHEDULES

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def _load(name, filename):
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH_DIR / filename)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH_DIR))


rel = _load("hopmm_reliability_under_test", "reliability.py")
driver = _load("hopmm_reliability_driver_under_test", "reliability_driver.py")


def test_arguments_default_quick_and_explicit():
    args = rel.parse_args([])
    assert args.items == list(rel.ITEMS) and not args.quick
    assert (args.soak_s, args.threads_s) == (rel.DEFAULT_SOAK_S, rel.DEFAULT_THREADS_S)
    quick = rel.parse_args(["--quick"])
    assert (quick.soak_s, quick.threads_s) == (rel.QUICK_SOAK_S, rel.QUICK_THREADS_S)
    given = rel.parse_args(["--quick", "--soak-s", "7", "--threads-s", "3",
                            "--items", "soak, threads"])
    assert (given.soak_s, given.threads_s, given.items) == (7.0, 3.0, ["soak", "threads"])


@pytest.mark.parametrize("argv", [["--items", "soak,nonsense"], ["--soak-s", "-1"],
                                  ["--threads-s", "x"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        rel.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_default_runtime_budget_leaves_room_for_the_other_items():
    """Threads and soak together take at most half of the 6-minute default budget."""
    assert rel.DEFAULT_SOAK_S + rel.DEFAULT_THREADS_S <= 180


def test_sanitizer_command_runs_the_driver_on_one_schedule_under_one_tool():
    cmd = rel.sanitizer_command("/opt/cs/compute-sanitizer", "racecheck", "pingpong",
                                ["129x257x130", "96x192x849"])
    assert cmd[0] == "/opt/cs/compute-sanitizer"
    assert cmd[cmd.index("--tool") + 1] == "racecheck"
    assert cmd[cmd.index("--error-exitcode") + 1] == str(rel.SANITIZER_ERROR_EXIT)
    assert cmd[cmd.index("--kernel-name") + 1] == "kns=hopmm"
    program = cmd.index(sys.executable)
    assert "--tool" not in cmd[program:]                   # sanitizer options come first
    assert cmd[program + 1].endswith("reliability_driver.py")
    assert cmd[cmd.index("--schedule") + 1] == "pingpong"
    assert cmd[-2:] == ["129x257x130", "96x192x849"]
    # initcheck must see the kernels that initialise the operands: no kernel filter
    init = rel.sanitizer_command("cs", "initcheck", "persistent", ["1x2x3"])
    assert "--kernel-name" not in init and init[init.index("--tool") + 1] == "initcheck"


@pytest.mark.parametrize("quick", [False, True])
def test_sanitizer_plan_covers_every_tool_and_schedule_on_edge_shapes(quick):
    plan = rel.sanitizer_plan(list(SCHEDULES), quick)
    assert {(tool, s) for tool, s, _ in plan} == {(t, s) for t in rel.TOOLS for s in SCHEDULES}
    memcheck = {tuple(shapes) for tool, _, shapes in plan if tool == "memcheck"}
    racecheck = {tuple(shapes) for tool, _, shapes in plan if tool == "racecheck"}
    assert len(memcheck) == len(racecheck) == 1
    assert 1 <= len(next(iter(racecheck))) <= 3 < len(next(iter(memcheck)))
    for _, _, shapes in plan:
        for spec in shapes:
            assert driver.Case.parse(spec).spec() == spec
    # initcheck runs one shape at a time, each run with its own timeout, every shape covered.
    # The split-K kernels, whose semaphore polls initcheck slows most, take one shape.
    table = rel.QUICK_TOOL_SHAPES if quick else rel.TOOL_SHAPES
    for schedule in SCHEDULES:
        init = [shapes for tool, s, shapes in plan if tool == "initcheck" and s == schedule]
        assert all(len(shapes) == 1 for shapes in init)
        names = (rel.WORKSPACE_INITCHECK_SHAPES if schedule in rel.WORKSPACE_SCHEDULES
                 else table["initcheck"])
        assert sorted(s for (s,) in init) == sorted(rel.EDGE_SHAPES[x] for x in names)


def test_gemv_is_sanitized_on_its_own_decode_edge_shapes():
    assert "gemv" in rel.sanitized_schedules()
    plan = rel.sanitizer_plan(["gemv"], True)
    assert {tool for tool, _, _ in plan} == set(rel.TOOLS)
    for tool in rel.TOOLS:
        runs = [shapes for t, _, shapes in plan if t == tool]
        assert sorted(s for run in runs for s in run) == sorted(rel.GEMV_SHAPES)
    cases = [driver.Case.parse(spec) for spec in rel.GEMV_SHAPES]
    assert all(c.spec() in rel.GEMV_SHAPES and not c.fused for c in cases)
    # gemv's cases: few rows (both row-step loops, K parts of a chunk) or few columns
    assert {c.m for c in cases if c.n > 16} >= {1, 16} and any(c.n <= 16 for c in cases)
    assert any(c.k % 32 for c in cases if 8 <= c.m <= 16)
    assert any(c.trans_b for c in cases) and any(c.batch for c in cases)
    assert any(c.odd_pitch for c in cases)


def test_edge_shapes_hold_the_edges_they_are_named_for():
    cases = {name: driver.Case.parse(spec) for name, spec in rel.EDGE_SHAPES.items()}
    assert cases["one_row"].m == 1 and cases["one_col"].n == 1
    assert cases["short_k"].k < 64                         # below one k-block
    assert cases["k_split"].k % 64 and cases["k_split"].k // 64 >= 8
    assert cases["batch"].batch > 1 and cases["odd_pitch"].odd_pitch
    assert cases["tile_edge"].m % 128 == 1 and cases["tile_edge"].n % 128 == 1
    # the persistent kernels' 64-row tiles, forced: the few-rows tile and one round of them
    from hopmm import heuristics
    from hopmm.device import H100_SXM
    from hopmm.problem import Problem

    for name in ("few_rows", "short_tiles"):
        c = cases[name]
        for schedule in ("persistent", "persistent_overlap"):
            choice = heuristics.choose(Problem(c.m, c.n, c.k, 1, "bfloat16"), H100_SXM,
                                       schedule)
            assert choice.config.block_m == 64, (name, schedule)
    assert cases["few_rows"].m <= heuristics.SHORT_TILE_MAX_M < cases["short_tiles"].m


def test_shape_notation_round_trips_and_rejects_unknown_flags():
    case = driver.Case.parse("100x72x136:b3:ta:pitch:fp16")
    assert (case.m, case.n, case.k, case.batch, case.trans_a, case.trans_b) == (
        100, 72, 136, 3, True, False)
    assert case.odd_pitch and case.dtype == "float16"
    assert driver.Case.parse(case.spec()) == case
    with pytest.raises(ValueError, match="unknown flag"):
        driver.Case.parse("1x2x3:sideways")


CLEAN = ("all good\n{\"cases\": 2, \"failures\": 0, \"compiles\": 0, \"kernels\": 1}\n"
         "========= ERROR SUMMARY: 0 errors\n")
RACY = ("{\"cases\": 2, \"failures\": 0, \"compiles\": 0, \"kernels\": 1}\n"
        "========= Error: Race reported between Write access at hopmm_x+0x10\n"
        "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n"
        "========= ERROR SUMMARY: 1 error\n")
WRONG = "x: WRONG\n{\"cases\": 2, \"failures\": 1, \"compiles\": 0, \"kernels\": 1}\n"


@pytest.mark.parametrize("rc,output,status,words", [
    (0, CLEAN, "ok", "0 errors"),
    (rel.SANITIZER_ERROR_EXIT, RACY, "FAIL", "Race reported"),
    (1, WRONG, "FAIL", "exit 1"),
    (0, WRONG, "FAIL", "1 of 2 products wrong"),
    (0, "crashed before the summary", "FAIL", "exit 0"),
])
def test_a_sanitizer_run_is_judged_by_its_exit_status_errors_and_products(rc, output, status,
                                                                          words):
    got, detail = rel.judge_sanitizer_run(rc, output)
    assert got == status and words in detail


def test_summary_table_counts_per_item_and_names_the_first_failure():
    results = [rel.Result("sanitize", "memcheck persistent", "ok", "", 3.0),
               rel.Result("sanitize", "racecheck pingpong", "FAIL", "race", 4.0),
               rel.Result("sanitize", "racecheck split_k", "FAIL", "race", 1.0),
               rel.Result("soak", "60 s", "ok", "", 60.0),
               rel.Result("threads", "16 threads", "skip", "", 0.0),
               rel.Result("sanitize", "initcheck split_k", "known", "", 2.0)]
    table = rel.summary_table(results).splitlines()
    cells = {row.split("|")[0].strip(): [c.strip() for c in row.split("|")]
             for row in table[2:]}
    assert cells["sanitize"][1:8] == ["4", "1", "2", "0", "1", "10", "racecheck pingpong"]
    assert cells["soak"][1:6] == ["1", "1", "0", "0", "0"]
    assert cells["threads"][4] == "1"
    assert cells["total"][1:6] == ["6", "2", "2", "1", "1"]
    assert "[sanitize] racecheck pingpong: FAIL" in rel.line(results[1])


def test_compute_sanitizer_is_found_on_path_or_reported_absent(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(rel.glob, "glob", lambda *a, **k: [])   # no CUDA install, no wheels
    monkeypatch.setenv("PATH", str(tmp_path))
    path, places = rel.find_sanitizer()
    assert path is None and "PATH" in places
    tool = tmp_path / rel.SANITIZER_NAME
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert rel.find_sanitizer()[0] == str(tool)
    assert rel.find_sanitizer(str(tmp_path / "missing"))[0] is None


def test_compute_sanitizer_is_found_under_cuda_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    tool = tmp_path / "cuda" / "bin" / rel.SANITIZER_NAME
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert rel.find_sanitizer()[0] == str(tool)


def test_random_cases_are_seeded_and_in_range():
    first = [rel.random_case(random.Random(5)) for _ in range(1)]
    again = [rel.random_case(random.Random(5)) for _ in range(1)]
    assert first == again
    rng = random.Random(1)
    cases = [rel.random_case(rng) for _ in range(500)]
    assert all(1 <= d <= rel.RANDOM_MAX_DIM for c in cases for d in (c.m, c.n, c.k))
    assert {c.dtype for c in cases} == {"bfloat16", "float16"}
    assert any(c.batch for c in cases) and any(c.trans_a for c in cases)
    assert min(c.m for c in cases) < 8 and max(c.m for c in cases) > 512


def test_driver_summary_is_the_last_json_line():
    assert rel.driver_summary("noise\n{\"cases\": 1}\nmore noise\n") == {"cases": 1}
    assert rel.driver_summary("no summary at all") is None


def test_verify_cache_finds_damaged_entries_and_leftovers(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for stem in (good, bad):
        kernel_cache.write_entry(stem, {".cubin": b"\x7fELF", ".log": b"log"})
    (tmp_path / "bad.cubin").write_bytes(b"\x7fELF changed")
    (tmp_path / "x.cubin123.tmp").write_bytes(b"")
    problems = rel.verify_cache(tmp_path)
    assert len(problems) == 2
    assert any(p.startswith("bad:") for p in problems)
    assert any("left over" in p for p in problems)
    assert not any(p.startswith("good") for p in problems)
    assert os.path.exists(good.with_name("good.cubin"))


def test_commands_run_together_and_each_output_comes_back():
    """Each child prints when it started and ended: all start before any ends."""
    script = ("import sys, time; start = time.time(); time.sleep(1.0); "
              "print(sys.argv[1], start, time.time()); sys.exit(int(sys.argv[1]))")
    done = rel.run_together([[sys.executable, "-c", script, str(i)] for i in range(3)],
                            dict(os.environ))
    assert [rc for rc, _ in done] == [0, 1, 2]
    fields = [out.split() for _, out in done]
    assert [f[0] for f in fields] == ["0", "1", "2"]
    assert max(float(f[1]) for f in fields) < min(float(f[2]) for f in fields)


@pytest.mark.parametrize("tool,schedule,detail,known", [
    ("initcheck", "split_k", "Uninitialized __global__ memory read of size 8 bytes", True),
    ("initcheck", "split_k_parallel", "Uninitialized __global__ memory read of 16", True),
    ("initcheck", "persistent", "Uninitialized __global__ memory read of size 8 bytes", False),
    ("memcheck", "split_k", "Uninitialized __global__ memory read of size 8 bytes", False),
    ("initcheck", "split_k", "Invalid __global__ read; Uninitialized __global__ memory read",
     False),
])
def test_only_initchecks_blind_spot_on_the_workspace_is_known(tool, schedule, detail, known):
    assert rel.known_blind_spot(tool, schedule, detail) == known


def _initcheck_report(function: str) -> str:
    """One report as compute-sanitizer's initcheck prints it."""
    return ("========= Uninitialized __global__ memory read of size 2 bytes\n"
            f"=========     at {function}+0x180\n"
            "=========     by thread (32,0,0) in block (8,0,0)\n"
            "=========     Address 0x7efec883a440\n=========\n")


@pytest.mark.parametrize("functions,known", [
    (["cupy_copy__bfloat16_float32", "cupy_copy__bfloat16_float32"], True),
    (["cupy_copy__bfloat16_float32", "hopmm_persistent_bf16_128x256x64_s4_c2_NT"], False),
    (["hopmm_copy_rows"], False),
    ([], False),
])
def test_initcheck_reads_of_tma_results_are_told_from_hopmms_own(functions, known):
    """Reports of CuPy reading a result only TMA stores wrote are initcheck's blind spot;
    one report in a hopmm kernel (or none at all) is not."""
    output = ("========= COMPUTE-SANITIZER\n" + "".join(map(_initcheck_report, functions))
              + f"========= ERROR SUMMARY: {len(functions)} errors\n")
    assert rel.reads_of_tma_results_only("initcheck", output) == known
    assert not rel.reads_of_tma_results_only("memcheck", output)


@pytest.mark.parametrize("schedule,rc,failures,known", [
    ("persistent", "error exit", 0, "tma result"),
    ("persistent", "error exit", 1, None),     # a wrong product is never a blind spot
    ("persistent", 0, 0, None),                # not the sanitizer's error exit
    ("split_k", "error exit", 1, "workspace"),
    ("gemv", "error exit", 0, "in place"),
    ("gemv", "error exit", 1, None),           # the discarded bytes never reach a result
])
def test_known_reason_names_the_blind_spot_a_failed_run_shows(schedule, rc, failures, known):
    rc = rel.SANITIZER_ERROR_EXIT if rc == "error exit" else rc
    kernel = "hopmm_gemv_bf16_m16_w8_c1_u1_tc_ip_NN" if schedule == "gemv" else \
        "cupy_copy__bfloat16_float32"
    output = _initcheck_report(kernel) + f'{{"cases": 1, "failures": {failures}}}\n'
    detail = "1 errors: Uninitialized __global__ memory read of size 2 bytes"
    expected = {"tma result": rel.KNOWN_TMA_RESULT, "workspace": rel.KNOWN_BLIND_SPOT,
                "in place": rel.KNOWN_IN_PLACE_READS, None: None}[known]
    assert rel.known_reason("initcheck", schedule, rc, output, detail) == expected


def test_initcheck_other_errors_are_not_the_blind_spot():
    output = (_initcheck_report("cupy_copy__bfloat16_float32")
              + "========= Invalid __global__ write of size 2 bytes\n"
              "=========     at hopmm_persistent_bf16+0x10\n")
    assert not rel.reads_of_tma_results_only("initcheck", output)


def test_sanitize_can_be_narrowed_to_tools_and_schedules(capsys):
    args = rel.parse_args(["--tools", "initcheck", "--schedules", "split_k, swiglu"])
    assert args.tools == ["initcheck"] and args.schedules == ["split_k", "swiglu"]
    plan = rel.sanitizer_plan(args.schedules, False, args.tools)
    shapes = len(rel.TOOL_SHAPES["initcheck"])
    assert [(tool, schedule) for tool, schedule, _ in plan] == (
        [("initcheck", "split_k")] * len(rel.WORKSPACE_INITCHECK_SHAPES)
        + [("initcheck", "swiglu")] * shapes)
    assert rel.parse_args([]).tools is None and rel.parse_args([]).schedules is None
    for argv in (["--tools", "memcheck,nope"], ["--schedules", "nope"], ["--tools", ","]):
        with pytest.raises(SystemExit):
            rel.parse_args(argv)
    assert "unknown or no names" in capsys.readouterr().err


def test_fused_cases_parse_and_their_reference_applies_the_chain():
    import numpy as np

    case = driver.Case.parse(rel.EDGE_SHAPES["fused"])
    assert case.fused and driver.Case.parse(case.spec()) == case
    assert "fused" in rel.QUICK_TOOL_SHAPES["memcheck"]
    a = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    bias, c = np.array([1.0, -1.0], np.float32), np.ones((2, 2), np.float32)
    expected = np.maximum(driver.FUSED_ALPHA * a + driver.FUSED_BETA * c + bias, 0.0)
    assert np.array_equal(driver.reference(a, b, bias, c), expected)
    assert np.array_equal(driver.reference(a, b), a)
    assert driver.rel_err(expected, expected) == 0.0
    assert driver.rel_err(expected[:1], expected) == float("inf")
    assert driver.rel_err(np.full_like(expected, np.nan), expected) == float("inf")


def test_soak_fused_keywords_fit_the_case():
    """The soak's fused calls: one of SOAK_CHAINS (an activation matmul knows, a bias of
    shape (N,), c of the result's shape with beta) and alpha."""
    import numpy as np

    class Generator:   # cupy.random.RandomState's call, on the host
        def standard_normal(self, shape, dtype):
            return np.zeros(shape, dtype)

    rng = random.Random(1)
    seen = set()
    for _ in range(200):
        case = rel.random_case(rng, max_dim=64)
        kw = rel.fused_keywords(rng, case, Generator())
        assert kw["activation"] in epilogue.ACTIVATIONS and kw["alpha"] != 0
        lead = (case.batch,) if case.batch else ()
        if "bias" in kw:
            assert kw["bias"].shape == (case.n,)
        if "c" in kw:
            assert kw["c"].shape == lead + (case.m, case.n) and kw["beta"] != 0
        seen.add((kw["activation"], "bias" in kw, "c" in kw))
    # Every chain drawn, and no other: those are the ones load_every_kernel loads first.
    assert seen == set(rel.SOAK_CHAINS)
    assert {a for a, _, _ in seen} == set(epilogue.ACTIVATIONS)
    assert {(b, c) for _, b, c in seen} == {(False, True), (True, False), (True, True)}


def test_soak_loads_every_kernel_its_calls_can_run():
    """load_every_kernel's set: every registered config, and each of matmul's tile configs
    with every soak chain, with and without a row store where that fits; each once."""
    from dataclasses import replace

    from hopmm.device import H100_SXM
    from hopmm.epilogue import EpilogueSpec
    from hopmm.schedules import ALL_SCHEDULES, SCHEDULES

    smem = H100_SXM.smem_per_block_optin
    cases = rel.soak_kernels(smem)
    names = [s.kernel_name(c) for s, c in cases]
    assert len(names) == len(set(names))
    keys = {(s.name, c) for s, c in cases}
    for name, sched in ALL_SCHEDULES.items():
        for cfg in sched.configs(smem):
            assert (name, cfg) in keys
            if name in SCHEDULES:
                for chain in rel.SOAK_CHAINS:
                    fused = replace(cfg, epilogue=EpilogueSpec(*chain))
                    assert (name, fused) in keys
                    rows = replace(fused, row_store=True)
                    assert ((name, rows) in keys) == sched.row_store_fits(rows)

#!/usr/bin/env bash
# The one script run on the GPU machine, from the repo root:
#     bash bench/device_check.sh [extra bench.py args, e.g. --quick]
# DEVICE_CHECK_TESTS=0 leaves the GPU tests out (run them separately: python3 -m pytest tests);
# DEVICE_CHECK_TESTS=gpu runs the files that need the GPU or its driver only (the CPU tier's
# kernel checks compile every kernel first: once each, in one process per CPU). The test files
# run in DEVICE_CHECK_JOBS (default 4) pytest processes at once (bench/parallel_tests.py).
# DEVICE_CHECK_BENCH=0 leaves bench.py out (e.g. for a run that is only a sweep).
# DEVICE_CHECK_INSTALL=0 skips the install (hopmm installed already, e.g. beside a run in the
# background that has the compiled helper loaded).
# DEVICE_CHECK_SWEEP="SEED [COUNT [START]]" also runs the shape sweep after the bench:
#     python3 bench/sweep.py --seed SEED [--count COUNT] [--start START] --out "$BENCH_OUT"
#         --budget-s "${DEVICE_CHECK_SWEEP_BUDGET_S:-300}"
# (COUNT and START default to sweep.py's own: 200 shapes from index 0; the budget stops it
# before a shape that would end past that many seconds) and prints its summary before the
# bench table.
# Installs hopmm, runs the GPU tests, the main job (python3 -m hopmm), the
# benchmark and the sweep, then prints the test summary line, the sweep summary and the
# bench table LAST, because the caller only sees the tail of the output.
# Logs and bench results go to $OUT when it is set (else a mktemp folder for
# logs and bench/results for results).
# Exit status: the tests' status if they failed, else the benchmark's (nonzero
# on a correctness failure), else the sweep's (nonzero when a shape failed its check), else
# the main job's.
set -euo pipefail
export PYTHONUNBUFFERED=1

LOG_DIR="${OUT:-$(mktemp -d)}"
BENCH_OUT="${OUT:-bench/results}"  # with OUT set, JSON and PNG land in $OUT directly
mkdir -p "$LOG_DIR" "$BENCH_OUT"
TAIL_LINES=20  # lines of a log shown when its step fails or finishes

echo "== device"
nvidia-smi -L || echo "nvidia-smi failed"
python3 --version
python3 - <<'EOF'
import importlib
for name in ("cupy", "torch", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # report, do not stop: torch is optional
        print(f"{name}: not importable ({type(e).__name__}: {e})")
EOF

echo "== install"
if [[ "${DEVICE_CHECK_INSTALL:-1}" == 0 ]]; then
    echo "install skipped (DEVICE_CHECK_INSTALL=0)"
elif ! python3 -m pip install --no-build-isolation --no-deps -e . > "$LOG_DIR/pip-install.log" 2>&1; then
    tail -n "$TAIL_LINES" "$LOG_DIR/pip-install.log"
    echo "pip install failed (full log: pip-install.log)"
    exit 1
else
    tail -n 1 "$LOG_DIR/pip-install.log"
fi

export HOPMM_CACHE_DIR="${HOPMM_CACHE_DIR:-$(mktemp -d)}"

echo "== tests"
test_status=0
if [[ "${DEVICE_CHECK_TESTS:-1}" == 0 ]]; then
    # For a run split in two under a per-command time limit: the tests ran on their own.
    echo "tests skipped (DEVICE_CHECK_TESTS=0)" | tee "$LOG_DIR/pytest.log"
else
    # Test files in DEVICE_CHECK_JOBS pytest processes at once (compiling dominates; the kernel
    # cache is shared safely), then the timed autotune tests alone.
    if [[ "${DEVICE_CHECK_TESTS:-1}" == gpu ]]; then
        test_files=(tests/test_gpu_*.py tests/test_tma.py tests/test_cpu_simulated_launch.py)
    else
        test_files=(tests/test_*.py)
    fi
    python3 bench/parallel_tests.py --jobs "${DEVICE_CHECK_JOBS:-4}" --log-dir "$LOG_DIR" \
        --alone tests/test_gpu_autotune.py -- "${test_files[@]}" 2>&1 \
        | tee "$LOG_DIR/pytest.log" || test_status=$?
fi

echo "== python3 -m hopmm"
main_status=0
python3 -m hopmm > "$LOG_DIR/hopmm-main.log" 2>&1 || main_status=$?
tail -n "$TAIL_LINES" "$LOG_DIR/hopmm-main.log"

echo "== bench"
bench_status=0
if [[ "${DEVICE_CHECK_BENCH:-1}" == 0 ]]; then
    echo "bench skipped (DEVICE_CHECK_BENCH=0)" | tee "$LOG_DIR/bench.log"
else
    python3 bench/bench.py --out "$BENCH_OUT" "$@" 2>&1 | tee "$LOG_DIR/bench.log" || bench_status=$?
fi

sweep_status=0
if [[ -n "${DEVICE_CHECK_SWEEP:-}" ]]; then
    echo "== sweep"
    read -r sweep_seed sweep_count sweep_start extra <<< "$DEVICE_CHECK_SWEEP"
    if [[ -n "${extra:-}" || ! "$sweep_seed" =~ ^[0-9]+$ || ! "${sweep_count:-0}" =~ ^[0-9]+$
          || ! "${sweep_start:-0}" =~ ^[0-9]+$ ]]; then
        echo "DEVICE_CHECK_SWEEP must be \"SEED [COUNT [START]]\" (integers), got \"$DEVICE_CHECK_SWEEP\""
        exit 2
    fi
    sweep_args=(--seed "$sweep_seed")
    [[ -n "${sweep_count:-}" ]] && sweep_args+=(--count "$sweep_count")
    [[ -n "${sweep_start:-}" ]] && sweep_args+=(--start "$sweep_start")
    python3 bench/sweep.py "${sweep_args[@]}" --out "$BENCH_OUT" \
        --budget-s "${DEVICE_CHECK_SWEEP_BUDGET_S:-300}" 2>&1 | tee "$LOG_DIR/sweep.log" \
        || sweep_status=$?
fi

echo
echo "== summary (exit status: tests $test_status, main job $main_status, bench $bench_status, sweep $sweep_status)"
summary=$(grep -E '[0-9]+ (passed|failed|errors?|skipped)|no tests ran|tests skipped' "$LOG_DIR/pytest.log" | tail -n 1 || true)
echo "tests: ${summary:-$(tail -n 1 "$LOG_DIR/pytest.log")}"
if [[ -n "${DEVICE_CHECK_SWEEP:-}" ]]; then
    # sweep.py prints its summary last, from its '=== hopmm sweep summary' title line.
    sweep_summary=$(sed -n '/^=== hopmm sweep summary/,$p' "$LOG_DIR/sweep.log")
    if [[ -n "$sweep_summary" ]]; then
        echo "$sweep_summary"
    else
        echo "sweep produced no summary; last lines of its log:"
        tail -n "$TAIL_LINES" "$LOG_DIR/sweep.log"
    fi
    echo
fi
# bench.py prints its table last, starting with a '=== hopmm bench' title line.
table=$(sed -n '/^=== hopmm bench/,$p' "$LOG_DIR/bench.log")
if [[ -n "$table" ]]; then
    echo "$table"
elif [[ "${DEVICE_CHECK_BENCH:-1}" == 0 ]]; then
    echo "bench skipped (DEVICE_CHECK_BENCH=0)"
else
    echo "bench produced no table; last lines of its log:"
    tail -n "$TAIL_LINES" "$LOG_DIR/bench.log"
fi

for status in "$test_status" "$bench_status" "$sweep_status" "$main_status"; do
    if [[ "$status" -ne 0 ]]; then
        exit "$status"
    fi
done

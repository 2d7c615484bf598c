"""Runs pytest files in several processes at once on one GPU, then the timed ones alone.

The GPU tier spends most of its time compiling kernels on the CPU; the kernel cache is safe to
share between processes (issue 20's tests), so N processes on N cores finish in about 1/N of
the time. Test files that time kernels (`--alone`) run afterwards, one process, nothing else
on the GPU. Prints each process's summary line, the failures, and a total line last:
    python3 bench/parallel_tests.py --jobs 4 --alone tests/test_gpu_autotune.py \\
        tests/test_gpu_*.py tests/test_tma.py
Exit status: 0 when every process passed, else 1.
"""
import argparse
import os
import re
import subprocess
import sys
import time

SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")


def count_tests(path: str) -> int:
    """Tests pytest collects in one file (its share of the work, roughly)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "",
                          path], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if "::" in line)


def balance(files: list[str], jobs: int) -> list[list[str]]:
    """Files into `jobs` groups of about equal test counts (largest first, greedy)."""
    counts = sorted(((count_tests(f), f) for f in files), reverse=True)
    groups: list[list[str]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for n, f in counts:
        i = load.index(min(load))
        groups[i].append(f)
        load[i] += n
    return [g for g in groups if g]


def tally(text: str) -> dict[str, int]:
    """The counts of pytest's last summary line in `text`."""
    lines = [line for line in text.splitlines() if SUMMARY.search(line) and " in " in line]
    out: dict[str, int] = {}
    if lines:
        for n, what in SUMMARY.findall(lines[-1]):
            key = "errors" if what.startswith("error") else what
            out[key] = out.get(key, 0) + int(n)
    return out


# Of a failing process, the lines that say why (each failing test's header and pytest's "E   "
# lines), so that the tail of this script's output explains a failure without its log file.
ERROR_LINES_SHOWN = 40


def error_lines(text: str) -> list[str]:
    """pytest's failure headers ("____ test ____") and error lines ("E   ...") of `text`."""
    return [line.strip() for line in text.splitlines()
            if line.startswith("E   ") or (line.startswith("___") and line.endswith("___"))]


def run_groups(groups: list[list[str]], log_dir: str, tag: str) -> list[tuple[int, str]]:
    procs = []
    for i, files in enumerate(groups):
        log = open(os.path.join(log_dir, f"pytest-{tag}{i}.log"), "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-m", "", *files]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    results = []
    for proc, log in procs:
        status = proc.wait()
        log.close()
        with open(log.name) as f:
            results.append((status, f.read()))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--alone", nargs="*", default=[], help="files run afterwards, by themselves")
    p.add_argument("--log-dir", default=".")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    alone = list(dict.fromkeys(args.alone))
    shared = [f for f in dict.fromkeys(args.files) if f not in alone]
    start = time.time()
    results = run_groups(balance(shared, args.jobs), args.log_dir, "group")
    if alone:
        results += run_groups([alone], args.log_dir, "alone")
    total: dict[str, int] = {}
    failed = False
    for status, text in results:
        counts = tally(text)
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
        failed |= status != 0 or not counts
        print(text.splitlines()[-1] if text.strip() else "(no output)")
        for line in text.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print("  " + line)
        for line in error_lines(text)[:ERROR_LINES_SHOWN]:
            print("    " + line)
    words = ", ".join(f"{n} {key}" for key, n in sorted(total.items()))
    print(f"{words or 'no tests ran'} in {time.time() - start:.0f}s "
          f"({len(results)} processes)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark hopmm.matmul against cuBLAS (through CuPy and, if present, PyTorch).

    python bench/bench.py [--shapes 8192x8192x8192,...] [--dtypes bf16,fp16]
                          [--seconds-per-shape S] [--rounds R] [--out DIR]
                          [--quick] [--no-torch]

Method (each choice was checked on an H100):
  * correctness first: hopmm writes into a NaN-poisoned buffer and is compared
    with cupy.matmul in float32; too large an error (or NaN) makes the run
    exit nonzero after all shapes are done.
  * several rotating input sets whose total size exceeds twice the L2, so no
    contestant is timed on L2-resident operands.
  * a warm-up of a few seconds per shape: clocks drop 5-10% under sustained
    load, and the first calls pay one-off costs (JIT, heuristics).
  * one timing = CUDA events around n back-to-back launches (no sync between
    them; a sync per call badly understates small shapes), n chosen so that a
    timing lasts ~30 ms; time per launch = elapsed / n.
  * rounds: each contestant is timed once per round, the rounds running
    through every order of the contestants in turn, so each takes every slot
    and follows each other one equally often (under the power limit a timing
    may depend on what ran just before it); the median over rounds is
    reported.  Timed this way the same function entered twice agreed within
    1-4%.
  * every contestant writes into a preallocated output (out=), so no one pays
    for an allocation.
  * host cost (shapes up to 512x512x16384): host_us is the wall clock per call
    over 2000 back-to-back calls until the GPU has run them (the host's cost or
    the GPU's, whichever is larger); enqueue_us is the host's alone, the time to
    issue batches of 200 calls that the GPU never holds up.
  * the GPU's state is read through NVML after every round: the SM clock,
    power draw and temperature the shape ran at (the MHz/W column).  Under
    sustained GEMM load an H100 sits at its power limit with the SM clock far
    below its maximum.
  * sustained rounds (shapes of at least 2048^3 multiply-adds): each contestant
    also runs alone for 0.4 s, in rotated order, three times; the median gives
    the sust/best column.  In a 30 ms timing among the others a kernel runs
    near the clock the mix's power draw sets, and a kernel that draws more
    power per cycle than the others borrows from them; alone for 0.4 s it runs
    at the clock its own draw sets, as in a long run of large GEMMs
    (bench/NOTES.md v0.14: the two ratios differed by up to 6 %).

Output: <out>/bench-<date>-<device>.json (metadata + one row per shape and
dtype), a PNG chart next to it, and an aligned table printed last.

The module imports no GPU library at import time, so its pure parts (parsing,
table, JSON, chart) are testable on a CPU-only machine.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

# ---------------------------------------------------------------- settings
DEFAULT_SHAPES = (
    "8192x8192x8192,6144x6144x6144,4096x4096x4096,3000x3000x3000,"
    "2048x2048x2048,1024x1024x1024,512x512x512,4096x28672x8192,"
    "4096x8192x28672,8192x8192x1024,4096x14336x4096,512x512x16384,2304x2048x8192"
)
QUICK_SHAPES = "4096x4096x4096,2048x2048x2048,1024x1024x1024,512x512x16384"
DEFAULT_DTYPES = "bf16,fp16"
DEFAULT_OUT = "bench/results"

# 24 (shape, dtype) pairs x (2 s warm-up + ~1 s of rounds + setup) stays
# well inside the 5-minute budget of the default run.
DEFAULT_WARMUP_S = 2.0
QUICK_WARMUP_S = 0.5
DEFAULT_ROUNDS = 12  # a multiple of 3! = 6: every order of three contestants, twice
QUICK_ROUNDS = 6

TARGET_TIMING_S = 0.03  # one event-timed batch; 20-50 ms hides launch gaps and event resolution
PROBE_FRACTION = 4  # the calibration probe stops once a batch reaches TARGET / this
PROBE_GROWTH = 8  # the probe multiplies the batch size by this each step
MAX_LAUNCHES = 20000  # cap for launch-bound tiny shapes (a few microseconds each)

L2_FALLBACK_BYTES = 50 * 2**20  # H100 L2, used if the device does not report one
L2_MULTIPLE = 2  # rotating inputs must total more than this many L2s
MIN_INPUT_SETS = 2
MAX_INPUT_SETS = 8
ELEMENT_BYTES = 2  # fp16 and bf16

# Sustained rounds (see the method above): seconds each contestant runs alone per round, the
# rounds (rotated orders: every contestant takes every slot once), and the shapes that get them
# (at least this many multiply-adds: 2048^3 and larger reach the power limit).
SUSTAINED_S = 0.4
QUICK_SUSTAINED_S = 0.25
SUSTAINED_ROUNDS = 3
SUSTAINED_MIN_MNK = 2048**3

HOST_CALLS = 2000  # calls averaged for host_us
HOST_US_MAX_MNK = 4 * 1024**3  # "small" shapes get host_us and enqueue_us: up to 512x512x16384
# enqueue_us: batches of calls issued with the GPU idle at the start of each, few enough that no
# call waits for room in the launch queue (about a thousand launches), so the GPU never sets the
# pace; the median batch.
ENQUEUE_CALLS = 200
ENQUEUE_BATCHES = 15

SEED = 20240901  # fixed so runs are reproducible; the data is never all zeros

NVML_LIBRARY = "libnvidia-ml.so.1"  # part of the driver, like libcuda
NVML_CLOCK_SM = 1                   # nvmlClockType_t
NVML_TEMPERATURE_GPU = 0            # nvmlTemperatureSensors_t
MILLI = 1e-3                        # NVML reports power in mW and energy in mJ
# nvmlClocksThrottleReasons bits: what holds the SM clock below its maximum at a reading
NVML_CLOCK_LIMITERS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal",
                       0x40: "hw thermal", 0x80: "power brake"}

DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
                 "float16": "fp16", "half": "fp16"}
CUPY_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
REL_ERR_LIMITS = {"bf16": 1e-2, "fp16": 2e-3}

CONTESTANTS = ("hopmm", "cupy", "torch")
CUBLAS_CONTESTANTS = ("cupy", "torch")
TABLE_TITLE = ("=== hopmm bench: TFLOP/s = 2MNK / median time; ratio > 1 means hopmm is faster; "
               "sust/best: each contestant alone for a sustained run ===")

# chart look
CHART_DPI = 120
CHART_HEIGHT_IN = 5.5
CHART_MIN_WIDTH_IN = 8.0
CHART_WIDTH_PER_SHAPE_IN = 0.9
CHART_DTYPE_OFFSET = 0.12  # x offset between dtype series so markers do not overlap
CHART_LINESTYLES = ("-", "--", ":", "-.")
CHART_MARKERS = ("o", "s", "^", "D")


# ------------------------------------------------------------ pure helpers
def parse_shape(text: str) -> tuple[int, int, int]:
    """'4096x28672x8192' -> (M, N, K) = (4096, 28672, 8192)."""
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"bad shape {text!r}: expected MxNxK with positive integers, e.g. 4096x4096x4096")
    dims = tuple(int(p) for p in parts)
    if min(dims) <= 0:
        raise ValueError(f"bad shape {text!r}: every dimension must be positive")
    return dims


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no shapes given: expected a comma-separated list like 4096x4096x4096,2048x2048x2048")
    return [parse_shape(t) for t in items]


def parse_dtypes(text: str) -> list[str]:
    out = []
    for t in (s.strip().lower() for s in text.split(",")):
        if not t:
            continue
        if t not in DTYPE_ALIASES:
            raise ValueError(f"bad dtype {t!r}: expected one of bf16, fp16")
        out.append(DTYPE_ALIASES[t])
    if not out:
        raise ValueError("no dtypes given: expected bf16, fp16 or both")
    return out


def shape_label(shape) -> str:
    return "x".join(str(d) for d in shape)


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (safe in file names)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-device"


def input_set_count(m: int, n: int, k: int, l2_bytes: int = L2_FALLBACK_BYTES) -> int:
    """Enough (A, B, C) sets that together they exceed L2_MULTIPLE x L2."""
    set_bytes = (m * k + k * n + m * n) * ELEMENT_BYTES
    needed = (L2_MULTIPLE * l2_bytes) // set_bytes + 1
    return max(MIN_INPUT_SETS, min(MAX_INPUT_SETS, needed))


def rotated(items, r: int) -> list:
    """The order for round r: start at index r (ABC, BCA, CAB, ...)."""
    items = list(items)
    return items[r % len(items):] + items[:r % len(items)]


def permutation_orders(items, rounds: int) -> list[list]:
    """Round r runs the r-th order of the contestants (all orders in turn): over
    a multiple of len(items)! rounds each contestant takes every slot, and
    follows each other one, equally often, so a bias of slot or predecessor
    hits everyone alike.  (A plain rotation ABC, BCA, CAB balances the slots
    but lets A always follow C.)"""
    orders = list(itertools.permutations(items))
    return [list(orders[r % len(orders)]) for r in range(rounds)]


def launches_for(per_launch_s: float) -> int:
    """Launches per timing so that one timing lasts about TARGET_TIMING_S."""
    if not per_launch_s > 0:
        return MAX_LAUNCHES
    return max(1, min(MAX_LAUNCHES, round(TARGET_TIMING_S / per_launch_s)))


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    return 2.0 * m * n * k / seconds / 1e12


def speed_ratios(tf: dict) -> dict:
    """hopmm throughput over each cuBLAS route's (> 1: hopmm faster)."""
    hop = tf.get("hopmm")
    blas = [tf[c] for c in CUBLAS_CONTESTANTS if tf.get(c)]
    best = max(blas) if blas else None

    def ratio(other):
        return hop / other if hop and other else None

    return {"hopmm_vs_cupy": ratio(tf.get("cupy")),
            "hopmm_vs_torch": ratio(tf.get("torch")),
            "hopmm_vs_best": ratio(best)}


def rel_err_ok(rel_err, dtype: str) -> bool:
    return rel_err is not None and math.isfinite(rel_err) and rel_err <= REL_ERR_LIMITS[dtype]


def error_row(shape, dtype: str, error: str) -> dict:
    m, n, k = shape
    return {"shape": shape_label(shape), "m": m, "n": n, "k": k, "dtype": dtype,
            "ok": False, "error": error, "rel_err": None,
            "rel_err_limit": REL_ERR_LIMITS[dtype], "tflops": {}, "host_us": None,
            "enqueue_us": None, "gpu_state": None,
            **speed_ratios({})}


def summarize_gpu_state(samples: list[dict]) -> dict | None:
    """Median SM clock and power and the highest temperature over one shape's
    readings (a reading may lack a field NVML would not give); None without any."""
    def values(key):
        return [x[key] for x in samples if x.get(key) is not None]

    clocks, power, temps = values("sm_mhz"), values("power_w"), values("temp_c")
    if not (clocks or power or temps):
        return None
    return {"sm_mhz": statistics.median(clocks) if clocks else None,
            "power_w": statistics.median(power) if power else None,
            "temp_c": max(temps) if temps else None, "readings": len(samples)}


# ------------------------------------------------------------------ table
def _fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _rel_err_cell(row: dict) -> str:
    if row.get("error") and row.get("rel_err") is None:
        return "ERROR"
    rel_err = row.get("rel_err")
    cell = "nan" if isinstance(rel_err, float) and math.isnan(rel_err) else _fmt(rel_err, ".1e")
    return cell if row.get("ok", True) else cell + " FAIL"


def _gpu_state_cell(state) -> str:
    """'1305/699' (SM MHz / W) for the table; '-' where unknown."""
    if not state:
        return "-"
    return f"{_fmt(state.get('sm_mhz'), '.0f')}/{_fmt(state.get('power_w'), '.0f')}"


TABLE_COLUMNS = ("shape", "dtype", "hopmm TFLOP/s", "cupy TFLOP/s", "torch TFLOP/s",
                 "hopmm/cupy", "hopmm/best", "sust/best", "rel_err", "host_us", "enqueue_us",
                 "MHz/W")


def format_table(rows: list[dict]) -> str:
    """An aligned text table; text columns left-aligned, numbers right-aligned."""
    body = []
    for r in rows:
        tf = r.get("tflops") or {}
        host = (r.get("host_us") or {}).get("hopmm")
        enqueue = (r.get("enqueue_us") or {}).get("hopmm")
        body.append((r["shape"], r["dtype"], _fmt(tf.get("hopmm"), ".1f"),
                     _fmt(tf.get("cupy"), ".1f"), _fmt(tf.get("torch"), ".1f"),
                     _fmt(r.get("hopmm_vs_cupy"), ".3f"), _fmt(r.get("hopmm_vs_best"), ".3f"),
                     _fmt((r.get("sustained") or {}).get("hopmm_vs_best"), ".3f"),
                     _rel_err_cell(r), _fmt(host, ".1f"), _fmt(enqueue, ".1f"),
                     _gpu_state_cell(r.get("gpu_state"))))
    widths = [max(len(c) for c in col) for col in zip(TABLE_COLUMNS, *body)]
    left_aligned = 2  # shape and dtype

    def line(cells):
        return "  ".join(c.ljust(w) if i < left_aligned else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([TABLE_TITLE, line(TABLE_COLUMNS), line("-" * w for w in widths),
                      *(line(b) for b in body)])


# ------------------------------------------------------------------- JSON
def _json_safe(value):
    """NaN/inf are not JSON; store them as null (the row's 'error' says why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path, metadata: dict, rows: list[dict]) -> Path:
    """Write atomically (temp file + rename) so a run killed mid-write leaves
    the previous complete file, not a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(results_text(_json_safe(metadata), _json_safe(rows)))
    os.replace(tmp, path)
    return path


def results_text(metadata: dict, rows: list[dict]) -> str:
    """The JSON of a results file: the metadata indented, each row on a line of its own (a
    sweep's 200 rows indented took 0.9 MB; on one line each, half of that, and still one line
    per shape to read or grep)."""
    rows_text = ",\n".join(json.dumps(row, default=str) for row in rows)
    return ('{\n"metadata": ' + json.dumps(metadata, indent=2, default=str)
            + ',\n"rows": [\n' + rows_text + "\n]}\n")


def load_json(path) -> tuple[dict, list[dict]]:
    data = json.loads(Path(path).read_text())
    return data.get("metadata", {}), data["rows"]


# ------------------------------------------------------------------ chart
def chart_title(metadata: dict) -> str:
    parts = [metadata.get("device", ""), (metadata.get("date") or "")[:10]]
    return "matmul throughput  " + "  ".join(p for p in parts if p)


def draw_chart(rows: list[dict], path, title: str = "") -> Path | None:
    """TFLOP/s per shape (x, in row order); one series per contestant and
    dtype: colour = contestant, line style and marker = dtype."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("note: matplotlib is not installed; chart skipped")
        return None
    labels = list(dict.fromkeys(r["shape"] for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    names = [c for c in CONTESTANTS if any((r.get("tflops") or {}).get(c) for r in rows)]
    lookup = {(r["shape"], r["dtype"]): r.get("tflops") or {} for r in rows}

    fig = Figure(figsize=(max(CHART_MIN_WIDTH_IN, CHART_WIDTH_PER_SHAPE_IN * len(labels) + 3),
                          CHART_HEIGHT_IN))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for di, dt in enumerate(dtypes):
        offset = (di - (len(dtypes) - 1) / 2) * CHART_DTYPE_OFFSET
        for ci, name in enumerate(names):
            ys = [lookup.get((lab, dt), {}).get(name) for lab in labels]
            ax.plot([x + offset for x in range(len(labels))],
                    [math.nan if y is None else y for y in ys],
                    color=f"C{ci}", linestyle=CHART_LINESTYLES[di % len(CHART_LINESTYLES)],
                    marker=CHART_MARKERS[di % len(CHART_MARKERS)], label=f"{name} {dt}")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=35, ha="right")
    ax.set_xlabel("shape M x N x K")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=max(1, len(dtypes)))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=CHART_DPI)
    return path


# -------------------------------------------------------------------- CLI
def arg_type(parser_fn):
    """An argparse type from a parser that raises ValueError: its message reaches the user
    (bench/compare.py uses it too)."""
    def convert(text):
        try:
            return parser_fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parser_fn.__name__  # argparse names the type in errors
    return convert


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark hopmm.matmul against cuBLAS (CuPy, PyTorch).")
    p.add_argument("--shapes", type=arg_type(parse_shapes), default=None,
                   help="comma-separated MxNxK list (A is MxK, B is KxN); default: the full list")
    p.add_argument("--dtypes", type=arg_type(parse_dtypes), default=parse_dtypes(DEFAULT_DTYPES),
                   help="comma-separated: bf16, fp16 (default: both)")
    p.add_argument("--seconds-per-shape", type=float, default=None,
                   help=f"warm-up seconds per shape and dtype (default {DEFAULT_WARMUP_S}, quick {QUICK_WARMUP_S})")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"timed rounds per shape and dtype (default {DEFAULT_ROUNDS}, quick {QUICK_ROUNDS})")
    p.add_argument("--sustained-seconds", type=float, default=None,
                   help=f"seconds each contestant runs alone per sustained round, on shapes of "
                        f"at least 2048^3 (default {SUSTAINED_S}, quick {QUICK_SUSTAINED_S}; "
                        f"0: none)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true",
                   help="short shape list, short warm-up, fewer rounds")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out even if it imports")
    args = p.parse_args(argv)
    if args.shapes is None:
        args.shapes = parse_shapes(QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    if args.seconds_per_shape is None:
        args.seconds_per_shape = QUICK_WARMUP_S if args.quick else DEFAULT_WARMUP_S
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    if args.sustained_seconds is None:
        args.sustained_seconds = QUICK_SUSTAINED_S if args.quick else SUSTAINED_S
    if args.rounds < 1 or args.seconds_per_shape < 0 or args.sustained_seconds < 0:
        p.error("--rounds must be >= 1, --seconds-per-shape and --sustained-seconds >= 0")
    return args


# ============================================================ GPU section
# Everything below needs CuPy and a GPU; the GPU modules are imported lazily.

class GpuState:
    """The benchmarked GPU's SM clock, power draw and temperature through NVML
    (ctypes on the driver's library: no extra package)."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, handle

    @classmethod
    def open(cls, pci_bus_id: str, library: str = NVML_LIBRARY) -> "GpuState":
        """OSError, saying why, where NVML or the device cannot be had."""
        import ctypes
        lib = ctypes.CDLL(library)  # OSError if the library is missing
        handle = ctypes.c_void_p()
        rc = lib.nvmlInit_v2()
        if rc == 0:
            rc = lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
        if rc != 0:
            raise OSError(f"NVML error {rc} for the device at PCI bus id {pci_bus_id}")
        return cls(lib, handle)

    def _read(self, fn, *args) -> int | None:
        import ctypes
        value = ctypes.c_uint()
        return value.value if fn(self.handle, *args, ctypes.byref(value)) == 0 else None

    def read(self) -> dict:
        power_mw = self._read(self.lib.nvmlDeviceGetPowerUsage)
        return {"sm_mhz": self._read(self.lib.nvmlDeviceGetClockInfo, NVML_CLOCK_SM),
                "power_w": None if power_mw is None else power_mw * MILLI,
                "temp_c": self._read(self.lib.nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU)}

    def energy_j(self) -> float | None:
        """Joules the GPU has used since the driver loaded (NVML's total energy counter)."""
        import ctypes
        value = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value))
        return value.value * MILLI if rc == 0 else None

    def clock_limiters(self) -> int | None:
        """The bit mask of NVML_CLOCK_LIMITERS (and others) active at this reading."""
        import ctypes
        value = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle, ctypes.byref(value))
        return value.value if rc == 0 else None

    def limits(self) -> dict:
        limit_mw = self._read(self.lib.nvmlDeviceGetEnforcedPowerLimit)
        return {"power_limit_w": None if limit_mw is None else limit_mw * MILLI,
                "max_sm_mhz": self._read(self.lib.nvmlDeviceGetMaxClockInfo, NVML_CLOCK_SM)}


class Contestant:
    """One implementation: a launch function and its per-input-set arguments."""

    def __init__(self, name, launch, arg_sets):
        self.name, self.launch, self.arg_sets = name, launch, arg_sets
        self.launches = 1  # per timing; set by warm_up


class Context:
    """The imported GPU modules and device facts, shared by all shapes."""

    def __init__(self, use_torch: bool):
        import cupy
        import hopmm
        self.cupy, self.hopmm = cupy, hopmm
        self.stream = cupy.cuda.get_current_stream()
        dev = cupy.cuda.Device()
        self.props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        self.l2_bytes = int(self.props.get("l2CacheSize") or L2_FALLBACK_BYTES)
        self.torch, self.torch_note = (self._import_torch() if use_torch else (None, "disabled by --no-torch"))
        try:
            self.gpu_state, self.gpu_state_note = GpuState.open(dev.pci_bus_id), None
        except OSError as e:  # the run goes on without the MHz/W column
            self.gpu_state, self.gpu_state_note = None, str(e)

    def _import_torch(self):
        try:
            import torch
        except Exception as e:  # any import failure just drops the contestant
            return None, f"import torch failed: {e}"
        if not torch.cuda.is_available():
            return None, "torch has no CUDA"
        if self.stream.ptr != 0:
            # CuPy is on a non-default stream: run torch on the same one so the
            # CUDA events bracket its kernels too.
            torch.cuda.set_stream(torch.cuda.ExternalStream(self.stream.ptr))
        return torch, None

    def cupy_dtype(self, dtype: str):
        try:
            return self.cupy.dtype(CUPY_DTYPE_NAMES[dtype])
        except TypeError:  # 'bfloat16' is known by name only once ml_dtypes registered it
            import ml_dtypes
            return self.cupy.dtype(getattr(ml_dtypes, CUPY_DTYPE_NAMES[dtype]))

    def sync(self):
        self.cupy.cuda.Device().synchronize()


def to_torch(torch, array):
    """Zero-copy torch view of a CuPy array; bf16 goes through int16 if the
    DLPack exchange does not carry bfloat16."""
    want = torch.bfloat16 if array.dtype.name == "bfloat16" else torch.float16
    try:
        t = torch.from_dlpack(array)
        if t.dtype == want:
            return t
    except Exception:  # some CuPy/torch pairs reject bf16 in DLPack: fall back below
        pass
    return torch.from_dlpack(array.view("int16")).view(want)


def make_inputs(ctx: Context, m: int, n: int, k: int, dtype: str) -> list[tuple]:
    """Rotating (A, B, C) sets of fresh standard-normal data, row-major."""
    cp, dt = ctx.cupy, ctx.cupy_dtype(dtype)
    sets = []
    for _ in range(input_set_count(m, n, k, ctx.l2_bytes)):
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(dt)
        sets.append((a, b, cp.empty((m, n), dtype=dt)))
    return sets


def rel_error(cp, got, ref) -> float:
    """||got - ref|| / ||ref|| in float32 (NaN if got holds any NaN)."""
    g, r = got.astype(cp.float32), ref.astype(cp.float32)
    return float(cp.linalg.norm(g - r) / cp.linalg.norm(r))


def poisoned(cp, shape, dt):
    """An output buffer full of NaN: a kernel that skips any tile shows up."""
    return cp.full(shape, math.nan, dtype=cp.float32).astype(dt)


def issue(c: Contestant, calls: int) -> None:
    """`calls` back-to-back calls of c, cycling through its input sets, no sync between."""
    sets, count = c.arg_sets, len(c.arg_sets)
    for i in range(calls):
        c.launch(*sets[i % count])


def time_contestant(ctx: Context, c: Contestant, n: int) -> float:
    """Seconds per launch: events around n back-to-back launches, cycling
    through the input sets, with no synchronization in between."""
    cp = ctx.cupy
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(ctx.stream)
    issue(c, n)
    stop.record(ctx.stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e-3 / n


def warm_up(ctx: Context, contestants: list[Contestant], seconds: float) -> None:
    """Pay one-off costs, size each contestant's batch, then keep the GPU busy
    (rotating contestants) until clocks settle."""
    for c in contestants:
        c.launch(*c.arg_sets[0])
    ctx.sync()
    for c in contestants:  # grow the batch until a timing is long enough to trust
        n = 1
        while True:
            per = time_contestant(ctx, c, n)
            if per * n >= TARGET_TIMING_S / PROBE_FRACTION or n >= MAX_LAUNCHES:
                break
            n = min(MAX_LAUNCHES, n * PROBE_GROWTH)
        c.launches = launches_for(per)
    deadline = time.perf_counter() + seconds
    r = 0
    while time.perf_counter() < deadline:
        for c in rotated(contestants, r):
            c.launches = launches_for(time_contestant(ctx, c, c.launches))
        r += 1


def sustained_applies(shape, seconds: float) -> bool:
    m, n, k = shape
    return seconds > 0 and m * n * k >= SUSTAINED_MIN_MNK


def sustained_rounds(ctx: Context, contestants: list[Contestant], per_launch_s: dict,
                     shape, seconds: float) -> dict:
    """Each contestant alone for about `seconds` of back-to-back launches (sized from its
    median launch time `per_launch_s`), SUSTAINED_ROUNDS rotated rounds; the medians."""
    from hopmm.timing import sustained_runs

    by_name = {c.name: c for c in contestants}
    runs = sustained_runs({c.name: per_launch_s[c.name] for c in contestants}, seconds,
                          SUSTAINED_ROUNDS, lambda name, n: time_contestant(ctx, by_name[name], n))
    tf = {name: tflops(*shape, statistics.median(ts)) for name, ts in runs.items()}
    return {"seconds": seconds, "rounds": SUSTAINED_ROUNDS, "tflops": tf,
            "per_launch_us": {name: [t * 1e6 for t in ts] for name, ts in runs.items()},
            **speed_ratios(tf)}


def host_overhead_us(ctx: Context, c: Contestant, calls: int = HOST_CALLS) -> float:
    """Wall-clock microseconds per call over back-to-back calls, until the GPU has finished
    them: the host's cost or the GPU's, whichever is larger (see enqueue_us)."""
    ctx.sync()
    t0 = time.perf_counter()
    issue(c, calls)
    ctx.sync()
    return (time.perf_counter() - t0) / calls * 1e6


def enqueue_us(ctx: Context, c: Contestant, calls: int = ENQUEUE_CALLS,
               batches: int = ENQUEUE_BATCHES) -> float:
    """The host's cost of one call alone, in microseconds: the time to issue a batch of
    back-to-back calls (the GPU idle when the batch starts, not waited for inside it), per
    call, median over batches."""
    per_batch = []
    for _ in range(batches):
        ctx.sync()
        t0 = time.perf_counter()
        issue(c, calls)
        per_batch.append((time.perf_counter() - t0) / calls * 1e6)
    ctx.sync()
    return statistics.median(per_batch)


def check_hopmm(ctx: Context, a, b, ref) -> float:
    cp = ctx.cupy
    out = poisoned(cp, ref.shape, ref.dtype)
    ctx.hopmm.matmul(a, b, out=out)
    return rel_error(cp, out, ref)


def check_torch(ctx: Context, ta, tb, ref) -> float:
    """Sanity check of the DLPack views (bf16 in particular); not a gate."""
    cp = ctx.cupy
    out = poisoned(cp, ref.shape, ref.dtype)
    ctx.torch.matmul(ta, tb, out=to_torch(ctx.torch, out))
    return rel_error(cp, out, ref)


def build_contestants(ctx: Context, sets: list[tuple], include_hopmm: bool) -> list[Contestant]:
    hop, cp, torch = ctx.hopmm, ctx.cupy, ctx.torch
    out = []
    if include_hopmm:
        out.append(Contestant("hopmm", lambda a, b, c: hop.matmul(a, b, out=c), sets))
    out.append(Contestant("cupy", lambda a, b, c: cp.matmul(a, b, out=c), sets))
    if torch is not None:
        tsets = [tuple(to_torch(torch, x) for x in s) for s in sets]
        out.append(Contestant("torch", lambda a, b, c: torch.matmul(a, b, out=c), tsets))
    return out


def run_shape(ctx: Context, shape, dtype: str, warmup_s: float, rounds: int,
              sustained_s: float = 0.0, host_costs: bool = True) -> dict:
    """One shape and dtype: checked, warmed up, timed. `host_costs` False skips host_us and
    enqueue_us (thousands of calls per contestant). first_call_s is the wall clock of hopmm's
    first call with its error check: it includes compiling any kernel not cached yet, which
    the warm-up keeps out of every timing."""
    m, n, k = shape
    cp = ctx.cupy
    row = error_row(shape, dtype, None)
    sets = make_inputs(ctx, m, n, k, dtype)
    a, b = sets[0][0], sets[0][1]
    row["input_sets"] = len(sets)
    try:
        row["explain"] = str(ctx.hopmm.explain(a, b))
    except Exception as e:
        row["explain"] = f"explain failed: {type(e).__name__}: {e}"

    ref = cp.matmul(a, b)
    hopmm_runs = True
    try:
        t0 = time.perf_counter()
        row["rel_err"] = check_hopmm(ctx, a, b, ref)
        row["first_call_s"] = time.perf_counter() - t0
        row["ok"] = rel_err_ok(row["rel_err"], dtype)
        if not row["ok"]:
            row["error"] = f"rel_err {row['rel_err']:.3g} over limit {REL_ERR_LIMITS[dtype]:g}"
    except Exception as e:  # keep benchmarking cuBLAS; the run still fails at the end
        hopmm_runs = False
        row["error"] = f"hopmm.matmul raised {type(e).__name__}: {e}"

    contestants = build_contestants(ctx, sets, hopmm_runs)
    if ctx.torch is not None:
        ta, tb, _ = contestants[-1].arg_sets[0]
        try:
            row["torch_rel_err"] = check_torch(ctx, ta, tb, ref)
        except Exception as e:  # informative only: the timing below still runs
            row["torch_rel_err"] = None
            row["torch_note"] = f"torch check raised {type(e).__name__}: {e}"
    del ref

    warm_up(ctx, contestants, warmup_s)
    per_launch = {c.name: [] for c in contestants}
    readings = []
    for order in permutation_orders(contestants, rounds):
        for c in order:
            per_launch[c.name].append(time_contestant(ctx, c, c.launches))
        if ctx.gpu_state:
            readings.append(ctx.gpu_state.read())
    row["gpu_state"] = summarize_gpu_state(readings)

    medians = {name: statistics.median(ts) for name, ts in per_launch.items()}
    row["tflops"] = {name: tflops(m, n, k, t) for name, t in medians.items()}
    row["median_us"] = {name: t * 1e6 for name, t in medians.items()}
    row["timings"] = {c.name: {"launches_per_timing": c.launches,
                               "per_launch_us": [t * 1e6 for t in per_launch[c.name]]}
                      for c in contestants}
    row.update(speed_ratios(row["tflops"]))
    if sustained_applies(shape, sustained_s):
        row["sustained"] = sustained_rounds(ctx, contestants, medians, shape, sustained_s)
    if host_costs and m * n * k <= HOST_US_MAX_MNK:
        row["host_us"] = {c.name: host_overhead_us(ctx, c) for c in contestants}
        row["enqueue_us"] = {c.name: enqueue_us(ctx, c) for c in contestants}
    return row


TORCH_MATMUL_FLAGS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def _torch_flag(torch, name):
    try:
        return getattr(torch.backends.cuda.matmul, name)
    except Exception as e:  # renamed or removed in some torch version
        return f"unavailable ({type(e).__name__})"


# The output folder a GPU machine gives its command (bench/device_check.sh passes it as
# --out "$OUT"): the recorded command names it $OUT, so no machine's path enters the results.
OUT_ENV = "OUT"


def command_line(argv: list[str], script: str = "bench/bench.py") -> str:
    """The command as it is recorded in the results' metadata."""
    words = [shlex.quote(a) for a in [script, *argv]]
    out = os.environ.get(OUT_ENV, "").rstrip("/")
    if out:
        words = [w.replace(out, "$" + OUT_ENV) for w in words]
    return "python " + " ".join(words)


def device_metadata(ctx: Context, command: str) -> dict:
    """The machine, the software and the command of a run (bench/sweep.py shares it)."""
    from hopmm.device import query

    cp, torch = ctx.cupy, ctx.torch
    name = ctx.props["name"]
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    meta = {
        "device": name,
        "sm_count": int(ctx.props["multiProcessorCount"]),
        "compute_capability": f"{ctx.props['major']}.{ctx.props['minor']}",
        "l2_bytes": ctx.l2_bytes,
        # the DRAM peak that scales the heuristic's rates (bench/model_audit.py reads it)
        "dram_tbps": query(cp.cuda.Device().id).dram_tbps,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "python": platform.python_version(),
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cp.cuda.runtime.driverGetVersion(),
        "hopmm": getattr(ctx.hopmm, "__version__", None),
        "torch": getattr(torch, "__version__", None),
        "torch_note": ctx.torch_note,
    }
    meta["gpu_state"] = (ctx.gpu_state.limits() if ctx.gpu_state
                         else f"not read: {ctx.gpu_state_note}")
    if torch is not None:  # these change which cuBLAS kernels torch may pick
        meta["torch_matmul_flags"] = {f: _torch_flag(torch, f) for f in TORCH_MATMUL_FLAGS}
    return meta


def collect_metadata(ctx: Context, args, argv) -> dict:
    meta = device_metadata(ctx, command_line(sys.argv[1:] if argv is None else argv))
    meta.update({
        "settings": {"warmup_s": args.seconds_per_shape, "rounds": args.rounds,
                     "sustained_s": args.sustained_seconds,
                     "sustained_rounds": SUSTAINED_ROUNDS,
                     "sustained_min_mnk": SUSTAINED_MIN_MNK,
                     "target_timing_s": TARGET_TIMING_S, "host_calls": HOST_CALLS,
                     "enqueue_calls": ENQUEUE_CALLS, "enqueue_batches": ENQUEUE_BATCHES,
                     "seed": SEED, "outputs": "preallocated, out="},
    })
    return meta


def _progress(row: dict, seconds: float) -> str:
    tf = row.get("tflops") or {}
    speeds = " ".join(f"{k} {v:.1f}" for k, v in tf.items())
    status = "ok" if row["ok"] else row["error"]
    return f"[bench] {row['shape']} {row['dtype']}: {speeds} TFLOP/s; rel_err {_rel_err_cell(row)}; {status} ({seconds:.1f} s)"


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = Context(use_torch=not args.no_torch)
    ctx.cupy.random.seed(SEED)
    meta = collect_metadata(ctx, args, argv)
    if ctx.torch_note:
        print(f"note: torch contestant skipped: {ctx.torch_note}")
    if ctx.gpu_state_note:
        print(f"note: GPU clock and power not read: {ctx.gpu_state_note}")
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M%S")
    stem = Path(args.out) / f"bench-{stamp}-{device_slug(meta['device'])}"
    json_path = stem.with_suffix(".json")

    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            t0 = time.perf_counter()
            try:
                row = run_shape(ctx, shape, dtype, args.seconds_per_shape, args.rounds,
                                args.sustained_seconds)
            except Exception as e:  # e.g. out of memory: record it, go on, fail at the end
                row = error_row(shape, dtype, f"{type(e).__name__}: {e}")
            ctx.cupy.get_default_memory_pool().free_all_blocks()
            rows.append(row)
            print(_progress(row, time.perf_counter() - t0), flush=True)
            write_json(json_path, meta, rows)  # after every shape: a killed run keeps its results

    print(f"wrote {json_path}")
    png = draw_chart(rows, stem.with_suffix(".png"), chart_title(meta))
    if png:
        print(f"wrote {png}")
    failures = [r for r in rows if not r["ok"]]
    for r in failures:
        print(f"FAILED {r['shape']} {r['dtype']}: {r['error']}")
    print(format_table(rows), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

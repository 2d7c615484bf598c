"""What a sweep (bench/sweep.py) reports from its rows: the per-shape table, the summary per
class with the issue's targets, merging of results, and the chart.  Pure Python (matplotlib
optional): runs on a machine without a GPU."""
from __future__ import annotations

import math
from pathlib import Path

from sweep_shapes import CLASSES, FLOOR_TBPS, FLOOR_TFLOPS, ROUND_TO

# Targets for hopmm against the faster of cupy.matmul and torch.matmul on each shape.
SLOW_RATIO = 0.97            # a shape below this ratio counts as slower than cuBLAS ...
MAX_SLOW_SHARE = 0.03        # ... and at most this share of the shapes may be
FLOOR_RATIO = 0.90           # no shape below this ratio at all
GEOMEAN_RATIO_GOAL = 1.30    # geometric mean of the ratios, at least
FLOOR_FRACTION_GOAL = 0.55   # geometric mean of hopmm's fraction of each shape's floor, at least
MAX_ROUTED_SHARE = 0.05      # share of shapes hopmm.matmul hands to cupy.matmul, at most
ROUTED_PATH = "cupy.matmul"  # the plan path (hopmm.plan / hopmm.explain) of a handed-on call

CUBLAS = ("cupy", "torch")
SUMMARY_TITLE = "=== hopmm sweep summary"  # bench/device_check.sh prints from this line on


# ------------------------------------------------------------------ row fields
def parse_explain(text) -> dict:
    """hopmm.explain's "key: value" lines as a dict (the first of each key); {} for none."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and " " not in key.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def floor_fractions(median_us: dict, floor_s: float) -> dict:
    """Each contestant's fraction of the floor (floor time / its median time), and the best
    cuBLAS route's as "best_cublas"."""
    out = {name: floor_s / (us * 1e-6) for name, us in (median_us or {}).items() if us}
    blas = [out[c] for c in CUBLAS if out.get(c)]
    out["best_cublas"] = max(blas) if blas else None
    return out


def is_routed(row: dict) -> bool:
    return (row.get("plan") or {}).get("path") == ROUTED_PATH


def schedule_cell(row: dict) -> str:
    plan = row.get("plan") or {}
    return plan.get("schedule") or plan.get("path") or "-"


# ------------------------------------------------------------------ statistics
def geomean(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    if min(values) <= 0:
        raise ValueError(f"geomean of non-positive values: {min(values)}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ratio(row):
    return row.get("hopmm_vs_best")


def _floor_fraction(row, name="hopmm"):
    return (row.get("floor_fraction") or {}).get(name)


def group_stats(rows: list[dict]) -> dict:
    """Count, shapes timed, geomean and min of hopmm / best cuBLAS, geomean floor fractions."""
    ratios = [_ratio(r) for r in rows if _ratio(r)]
    return {"shapes": len(rows), "timed": len(ratios),
            "geomean_ratio": geomean(ratios), "min_ratio": min(ratios) if ratios else None,
            "geomean_floor_hopmm": geomean(_floor_fraction(r) for r in rows),
            "geomean_floor_cublas": geomean(_floor_fraction(r, "best_cublas") for r in rows)}


def _share(part: int, whole: int):
    return part / whole if whole else None


def summarize(rows: list[dict]) -> dict:
    """The per-class and per-size statistics, the targets and the lists the summary prints."""
    timed = [r for r in rows if _ratio(r)]
    slow = sorted((r for r in timed if _ratio(r) < SLOW_RATIO), key=_ratio)
    very_slow = [r for r in slow if _ratio(r) < FLOOR_RATIO]
    routed = [r for r in rows if is_routed(r)]
    overall = group_stats(rows)
    classes = {c: group_stats([r for r in rows if r.get("class") == c])
               for c in CLASSES if any(r.get("class") == c for r in rows)}
    def whole_multiples(r):
        return not any(r[d] % ROUND_TO for d in ("m", "n", "k"))

    sizes = {f"multiples of {ROUND_TO}": group_stats([r for r in rows if whole_multiples(r)]),
             "other sizes": group_stats([r for r in rows if not whole_multiples(r)])}

    def target(name, value, spec, goal, met):
        """`spec` formats the value for the summary."""
        return {"name": name, "value": value, "format": spec, "goal": goal,
                "met": None if value is None else met(value)}

    targets = [
        target(f"share of shapes < {SLOW_RATIO}x best cuBLAS", _share(len(slow), len(timed)),
               ".1%", f"<= {MAX_SLOW_SHARE:.0%}", lambda v: v <= MAX_SLOW_SHARE),
        target(f"shapes < {FLOOR_RATIO}x best cuBLAS", len(very_slow) if timed else None,
               "d", "none", lambda v: v == 0),
        target("geomean hopmm / best cuBLAS", overall["geomean_ratio"],
               ".3f", f">= {GEOMEAN_RATIO_GOAL}", lambda v: v >= GEOMEAN_RATIO_GOAL),
        target("geomean hopmm fraction of floor", overall["geomean_floor_hopmm"],
               ".3f", f">= {FLOOR_FRACTION_GOAL}", lambda v: v >= FLOOR_FRACTION_GOAL),
        target(f"share routed to {ROUTED_PATH}", _share(len(routed), len(rows)),
               ".1%", f"<= {MAX_ROUTED_SHARE:.0%}", lambda v: v <= MAX_ROUTED_SHARE),
    ]
    first_calls = [r for r in rows if r.get("first_call_s") is not None]
    return {"overall": overall, "classes": classes, "sizes": sizes, "targets": targets,
            "slow": slow, "routed": routed, "failed": [r for r in rows if not r.get("ok")],
            "first_call_total_s": sum(r["first_call_s"] for r in first_calls),
            "first_call_max": max(first_calls, key=lambda r: r["first_call_s"], default=None)}


# ------------------------------------------------------------------ text
def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def align_table(header, body, left: int) -> list[str]:
    """Lines of an aligned table: the first `left` columns left-aligned, the rest right."""
    widths = [max(len(c) for c in col) for col in zip(header, *body)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line("-" * w for w in widths), *(line(b) for b in body)]


def _status(row: dict) -> str:
    if row.get("ok"):
        return "ok"
    return "ERROR" if row.get("rel_err") is None else "FAIL"


SHAPE_COLUMNS = ("#", "shape", "dtype", "class", "GFLOP", "hopmm TF/s", "cupy", "torch",
                 "hopmm/best", "floor", "cuBLAS floor", "schedule", "1st call s", "check")


def format_shape_table(rows: list[dict]) -> str:
    """One line per shape, in index order."""
    body = []
    for r in sorted(rows, key=lambda r: (r.get("seed", 0), r["index"])):
        tf = r.get("tflops") or {}
        body.append((str(r["index"]), r["shape"], r["dtype"], r.get("class", "-"),
                     fmt(r.get("gflop"), ".1f"), fmt(tf.get("hopmm"), ".1f"),
                     fmt(tf.get("cupy"), ".1f"), fmt(tf.get("torch"), ".1f"),
                     fmt(_ratio(r), ".3f"), fmt(_floor_fraction(r), ".2f"),
                     fmt(_floor_fraction(r, "best_cublas"), ".2f"), schedule_cell(r),
                     fmt(r.get("first_call_s"), ".2f"), _status(r)))
    title = ("=== hopmm sweep: TFLOP/s = 2MNK / median time; hopmm/best > 1: hopmm faster than "
             "the faster cuBLAS route; floor = the shape's floor time / median time ===")
    return "\n".join([title, *align_table(SHAPE_COLUMNS, body, left=4)])


def _group_lines(groups: dict, notes: dict) -> list[str]:
    header = ("class", "shapes", "timed", "geomean hopmm/best", "min", "geomean floor",
              "cuBLAS floor", "")
    body = [(name, str(s["shapes"]), str(s["timed"]), fmt(s["geomean_ratio"], ".3f"),
             fmt(s["min_ratio"], ".3f"), fmt(s["geomean_floor_hopmm"], ".2f"),
             fmt(s["geomean_floor_cublas"], ".2f"), notes.get(name, ""))
            for name, s in groups.items()]
    return align_table(header, body, left=1)


def _shape_line(row: dict) -> str:
    return (f"  #{row['index']} {row['shape']} {row['dtype']} {row.get('class', '-')}: "
            f"hopmm/best {fmt(_ratio(row), '.3f')}, floor {fmt(_floor_fraction(row), '.2f')}, "
            f"{schedule_cell(row)}")


def format_summary(rows: list[dict], header: str = "") -> str:
    """The summary, printed last: per class and per size, the targets, the shapes handed to
    cupy.matmul, those slower than SLOW_RATIO x cuBLAS, and any that failed."""
    s = summarize(rows)
    title = (f"{SUMMARY_TITLE}{': ' + header if header else ''} (hopmm/best: hopmm's speed over "
             f"the faster of cupy.matmul and torch.matmul; floor: max(2MNK / {FLOOR_TFLOPS:g} "
             f"TFLOP/s, bytes of A, B, C / {FLOOR_TBPS:g} TB/s) over the median time) ===")
    lines = [title, *_group_lines({**s["classes"], "all": s["overall"]}, CLASSES), "",
             *_group_lines(s["sizes"], {})]
    longest = s["first_call_max"]
    if longest is not None:
        lines += ["", f"first calls (compiling kernels not cached yet, not timed): "
                      f"{s['first_call_total_s']:.1f} s in all, longest "
                      f"{longest['first_call_s']:.1f} s (#{longest['index']} {longest['shape']})"]
    lines += ["", "targets:"]
    for t in s["targets"]:
        verdict = {True: "met", False: "MISSED", None: "no data"}[t["met"]]
        value = fmt(t["value"], t["format"])
        lines.append(f"  {t['name']:<38} {value:>8}  (goal {t['goal']})  {verdict}")
    listings = ((f"routed to {ROUTED_PATH}", s["routed"], lambda r: (r.get("plan") or {}).get("why")),
                (f"slower than {SLOW_RATIO}x best cuBLAS", s["slow"], lambda r: None),
                ("failed the check or raised", s["failed"], lambda r: r.get("error")))
    for title, listed, reason in listings:
        lines.append(f"{title} ({len(listed)}){':' if listed else ': none'}")
        lines += [_shape_line(r) + (f" ({reason(r)})" if reason(r) else "") for r in listed]
    return "\n".join(lines)


# ------------------------------------------------------------------ merging
def merge_results(loaded: list[tuple[dict, list[dict]]]) -> tuple[dict, list[dict]]:
    """Rows of several sweep results as one, keyed by (seed, index): a later file's row
    replaces an earlier one's.  The metadata lists each source's."""
    by_key = {}
    for _, rows in loaded:
        for r in rows:
            by_key[(r.get("seed"), r["index"])] = r
    rows = sorted(by_key.values(), key=lambda r: (r.get("seed") or 0, r["index"]))
    first = loaded[0][0] if loaded else {}
    meta = {"device": first.get("device"), "date": first.get("date"),
            "merged_from": [m for m, _ in loaded]}
    return meta, rows


def describe(rows: list[dict]) -> str:
    """'seed 1, #0-199, bf16 + fp16' for a summary's title."""
    if not rows:
        return "no shapes"
    seeds = sorted({r.get("seed") for r in rows if r.get("seed") is not None})
    indices = [r["index"] for r in rows]
    dtypes = sorted({r["dtype"] for r in rows})
    seed_text = "seed " + ", ".join(str(x) for x in seeds) if seeds else "seed ?"
    return f"{seed_text}, {len(rows)} shapes #{min(indices)}-{max(indices)}, {' + '.join(dtypes)}"


# ------------------------------------------------------------------ chart
CHART_DPI = 120
CHART_SIZE_IN = (11.0, 9.0)
DTYPE_MARKERS = {"bf16": "o", "fp16": "^"}


def draw_chart(rows: list[dict], path, title: str = "") -> Path | None:
    """Two panels against the shape's GFLOP (log x), one colour per class, one marker per
    dtype: hopmm / best cuBLAS (log y) and hopmm's fraction of the floor.  None (with a note)
    without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("note: matplotlib is not installed; chart skipped")
        return None
    fig = Figure(figsize=CHART_SIZE_IN)
    FigureCanvasAgg(fig)
    ratio_ax, floor_ax = fig.subplots(2, 1, sharex=True)
    for ci, cls in enumerate(CLASSES):
        for dtype, marker in DTYPE_MARKERS.items():
            pts = [r for r in rows if r.get("class") == cls and r["dtype"] == dtype and _ratio(r)]
            if not pts:
                continue
            x = [r["gflop"] for r in pts]
            style = dict(color=f"C{ci}", marker=marker, linestyle="none", alpha=0.8,
                         label=f"{cls} {dtype}")
            ratio_ax.plot(x, [_ratio(r) for r in pts], **style)
            floor_ax.plot(x, [_floor_fraction(r) for r in pts], **style)
    for ax, lines, label in ((ratio_ax, (1.0, SLOW_RATIO, FLOOR_RATIO), "hopmm / best cuBLAS"),
                             (floor_ax, (1.0, FLOOR_FRACTION_GOAL), "hopmm fraction of floor")):
        for y in lines:
            ax.axhline(y, color="grey", linewidth=0.8, linestyle=":" if y != 1.0 else "-")
        ax.set_ylabel(label)
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.25)
    ratio_ax.set_yscale("log")
    floor_ax.set_ylim(bottom=0)
    floor_ax.set_xlabel("problem size (GFLOP = 2MNK / 1e9)")
    if ratio_ax.get_legend_handles_labels()[0]:
        ratio_ax.legend(fontsize="small", ncol=2, loc="best")
    if title:
        ratio_ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=CHART_DPI)
    return path

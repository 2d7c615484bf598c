"""CPU-only tests for the sweep's shape generator (bench/sweep_shapes.py) and its report
(bench/sweep_report.py): no GPU, no timings."""
import math
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH_DIR))   # sweep_report imports sweep_shapes by name, as sweep.py does
import sweep_report  # noqa: E402
import sweep_shapes  # noqa: E402
from sweep_shapes import classify, draw_shape, draw_shapes, floor_seconds  # noqa: E402

DTYPES = ["bf16", "fp16"]
SEEDS = (1, 2, 7)
INDICES = range(120)


# ------------------------------------------------------------------ the generator
def test_a_shape_depends_on_seed_and_index_only():
    whole = draw_shapes(1, 0, 40, DTYPES)
    assert draw_shapes(1, 0, 40, DTYPES) == whole
    # any slice draws what the whole sweep draws at those indices
    assert draw_shapes(1, 25, 15, DTYPES) == whole[25:]
    assert [draw_shape(1, i, DTYPES) for i in (39, 3, 17)] == [whole[39], whole[3], whole[17]]
    assert [s.index for s in whole] == list(range(40))
    # another seed draws other shapes
    other = draw_shapes(2, 0, 40, DTYPES)
    assert sum(a.label != b.label for a, b in zip(whole, other)) > 30


@pytest.mark.parametrize("seed", SEEDS)
def test_shapes_keep_the_stated_bounds(seed):
    for max_gflop in (sweep_shapes.DEFAULT_MAX_GFLOP, 20.0):
        for i in INDICES:
            s = draw_shape(seed, i, DTYPES, max_gflop)
            assert sweep_shapes.MIN_GFLOP <= s.flops / 1e9 <= max_gflop, s
            assert all(sweep_shapes.DIM_MIN <= x <= sweep_shapes.DIM_MAX for x in (s.m, s.n, s.k))


@pytest.mark.parametrize("seed", SEEDS)
def test_even_indices_are_multiples_of_64_and_dtypes_cycle_every_two(seed):
    shapes = draw_shapes(seed, 0, len(INDICES), DTYPES)
    for s in shapes:
        assert s.rounded == (s.index % 2 == 0)
        if s.rounded:
            assert all(x % 64 == 0 for x in (s.m, s.n, s.k)), s
        assert s.dtype == DTYPES[(s.index // 2) % 2]
    odd = [s for s in shapes if not s.rounded]
    # unrounded draws land off multiples of 64 nearly always
    assert sum(any(x % 64 for x in (s.m, s.n, s.k)) for s in odd) > len(odd) * 0.9
    assert {s.dtype for s in shapes if s.rounded} == {s.dtype for s in odd} == set(DTYPES)


def drawn(draw_shapes, draw_shape, seed, long_sides):
    """The first len(INDICES) shapes of a decode-like draw (`draw_shapes`, `draw_shape` one at a
    time), checked for what those draws share: a shape depends on its seed and index only,
    its two long sides (`long_sides(shape)`) lie in [DECODE_DRAW_DIM_MIN, DIM_MAX] and are
    multiples of 64 on even indices, pairs of indices take the dtypes in turn, another seed
    draws other shapes, and no dtypes is an error."""
    shapes = draw_shapes(seed, 0, len(INDICES), DTYPES)
    assert draw_shapes(seed, 30, 10, DTYPES) == shapes[30:40]
    for s in shapes:
        assert all(sweep_shapes.DECODE_DRAW_DIM_MIN <= x <= sweep_shapes.DIM_MAX
                   for x in long_sides(s)), s
        assert s.rounded == (s.index % 2 == 0) and s.dtype == DTYPES[(s.index // 2) % 2]
        if s.rounded:
            assert all(x % 64 == 0 for x in long_sides(s)), s
    other = draw_shapes(seed + 1, 0, len(INDICES), DTYPES)
    assert [s.label for s in shapes] != [s.label for s in other]
    with pytest.raises(ValueError, match="dtype"):
        draw_shape(seed, 0, [])
    return shapes


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_draws_keep_their_bounds_and_depend_on_seed_and_index_only(seed):
    shapes = drawn(sweep_shapes.draw_decode_shapes, sweep_shapes.draw_decode_shape, seed,
                   lambda s: (s.n, s.k))
    assert all(1 <= s.m <= sweep_shapes.DECODE_DRAW_ROWS for s in shapes)
    # the rows spread over 1-16 (log-uniform: one row and sixteen both drawn)
    assert {1, sweep_shapes.DECODE_DRAW_ROWS} <= {s.m for s in shapes}
    assert len({s.m for s in shapes}) >= 12


@pytest.mark.parametrize("seed", SEEDS)
def test_columns_draws_are_the_decode_draws_transposed(seed):
    decode = sweep_shapes.draw_decode_shapes(seed, 5, 40, DTYPES)
    columns = sweep_shapes.draw_columns_shapes(seed, 5, 40, DTYPES)
    assert [(c.index, c.m, c.n, c.k, c.dtype, c.rounded) for c in columns] == \
        [(d.index, d.n, d.m, d.k, d.dtype, d.rounded) for d in decode]
    assert all(1 <= c.n <= sweep_shapes.DECODE_DRAW_ROWS for c in columns)


@pytest.mark.parametrize("seed", SEEDS)
def test_narrow_draws_keep_their_bounds_and_depend_on_seed_and_index_only(seed):
    shapes = drawn(sweep_shapes.draw_narrow_shapes, sweep_shapes.draw_narrow_shape, seed,
                   lambda s: (s.m, s.k))
    step, widest = sweep_shapes.NARROW_DRAW_COLUMN_STEP, sweep_shapes.NARROW_DRAW_MAX_COLUMNS
    assert all(s.n % step == 0 and step <= s.n <= widest for s in shapes)
    assert {s.n for s in shapes} == set(range(step, widest + 1, step))   # every width drawn


def _short_long(s):
    """(short, long) of a few-row or mid-row shape: rows on indices 0, 1 mod 4, columns on 2, 3."""
    return (s.m, s.n) if s.index % 4 < 2 else (s.n, s.m)


SHORT_SIDE_DRAWS = {
    "few_rows": (sweep_shapes.draw_few_rows_shapes, sweep_shapes.draw_few_rows_shape,
                 sweep_shapes.FEW_ROWS_DRAW_MIN, sweep_shapes.FEW_ROWS_DRAW_MAX),
    "mid_rows": (sweep_shapes.draw_mid_rows_shapes, sweep_shapes.draw_mid_rows_shape,
                 sweep_shapes.MID_ROWS_DRAW_MIN, sweep_shapes.MID_ROWS_DRAW_MAX),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("draw", SHORT_SIDE_DRAWS)
def test_short_side_draws_keep_their_bounds_and_depend_on_seed_and_index_only(draw, seed):
    draw_shapes, draw_shape, low, high = SHORT_SIDE_DRAWS[draw]
    shapes = drawn(draw_shapes, draw_shape, seed, lambda s: (_short_long(s)[1], s.k))
    assert all(low <= _short_long(s)[0] <= high for s in shapes)
    shorts = sorted(_short_long(s)[0] for s in shapes)
    # log-uniform over [low, high]: both ends drawn, and about a quarter of the shapes (a
    # sixth at the least) in the lowest quarter of its log range
    assert shorts[0] <= low * 1.1 and shorts[-1] >= high / 1.1 and len(set(shorts)) >= 30
    quarter = low * (high / low) ** 0.25
    assert sum(x <= quarter for x in shorts) >= len(shorts) // 6
    unaligned = [s for s in shapes if not s.rounded and (s.k % 8 or s.n % 8)]
    assert len(unaligned) >= len(shapes) // 4   # rows TMA cannot read in place are drawn


def test_the_few_and_mid_row_draws_meet_and_differ():
    assert sweep_shapes.MID_ROWS_DRAW_MIN == sweep_shapes.FEW_ROWS_DRAW_MAX + 1
    few = sweep_shapes.draw_few_rows_shapes(1, 0, 8, DTYPES)
    mid = sweep_shapes.draw_mid_rows_shapes(1, 0, 8, DTYPES)
    assert [(s.m, s.n, s.k) for s in few] != [(s.m, s.n, s.k) for s in mid]


def test_the_generator_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="max_gflop"):
        draw_shape(1, 0, DTYPES, max_gflop=1.0)
    with pytest.raises(ValueError, match="dtype"):
        draw_shape(1, 0, [])
    with pytest.raises(ValueError, match="start and count"):
        draw_shapes(1, -1, 3, DTYPES)


# ------------------------------------------------------------------ classes and floor
@pytest.mark.parametrize("dims,expected", [
    ((64, 8192, 8192), "decode"),        # M <= 64
    ((8192, 16, 512), "decode"),         # N <= 64 wins over K <= 700
    ((65, 8192, 8192), "few_tiles"),     # one past decode, long K
    ((8192, 8192, 700), "short_k"),
    ((4096, 300, 701), "few_tiles"),
    ((8192, 1024, 2048), "narrow_n"),
    ((8192, 1024, 2047), "odd"),         # K short of LONG_MIN, not a multiple of 64
    ((4096, 4096, 4000), "odd"),
    ((2048, 2048, 1024), "large"),       # exactly 2048^2 outputs and K = 1024
    ((2048, 1984, 4096), "other"),       # M x N just under 2048^2
    ((4096, 4096, 960), "other"),        # K under 1024
])
def test_classes_as_documented(dims, expected):
    assert classify(*dims) == expected
    assert expected in sweep_shapes.CLASSES


def test_drawn_shapes_fall_in_several_classes():
    classes = {s.shape_class for seed in SEEDS for s in draw_shapes(seed, 0, 200, DTYPES)}
    assert len(classes) >= 5 and classes <= set(sweep_shapes.CLASSES)


def test_floor_is_the_larger_of_compute_and_memory_time():
    # 8192^3: compute-bound, 2 x 8192^3 flops at 800 TFLOP/s
    assert floor_seconds(8192, 8192, 8192) == pytest.approx(2 * 8192**3 / 800e12)
    # 16 x 8192 x 8192: memory-bound, A (16 x 8192), B (8192^2), C (16 x 8192) of 2 bytes at
    # 3 TB/s
    assert floor_seconds(16, 8192, 8192) == pytest.approx(
        (16 * 8192 + 8192 * 8192 + 16 * 8192) * 2 / 3e12)
    s = draw_shape(1, 5, DTYPES)
    assert s.floor_s == floor_seconds(s.m, s.n, s.k)
    assert s.floor_s >= s.flops / 800e12


def test_rows_aligned_needs_16_byte_rows_of_a_b_and_c():
    assert sweep_shapes.rows_aligned(4096, 4096)
    assert not sweep_shapes.rows_aligned(4096, 4100)   # A's rows of 8200 bytes
    assert not sweep_shapes.rows_aligned(4100, 4096)   # B's and C's rows
    assert sweep_shapes.rows_aligned(4104, 4096)


# ------------------------------------------------------------------ the report
def _row(index, m, n, k, ratio, floor, *, path="kernel", ok=True, first_call_s=None,
         dtype="bf16", seed=1):
    return {"seed": seed, "index": index, "m": m, "n": n, "k": k, "shape": f"{m}x{n}x{k}",
            "dtype": dtype, "class": classify(m, n, k), "gflop": 2 * m * n * k / 1e9,
            "hopmm_vs_best": ratio, "ok": ok, "first_call_s": first_call_s,
            "floor_fraction": {"hopmm": floor, "best_cublas": floor / ratio if ratio else None},
            "plan": {"path": path, "why": "rows not a multiple of 16 bytes"
                     if path == "cupy.matmul" else "fp16 on H100",
                     "schedule": None if path == "cupy.matmul" else "persistent"},
            "error": None if ok else "RuntimeError: boom"}


def synthetic_rows():
    return [_row(0, 4096, 4096, 4096, 1.25, 0.80, first_call_s=2.0),
            _row(1, 8192, 8192, 8192, 1.00, 0.90, first_call_s=0.5),
            _row(2, 4096, 4096, 4000, 0.95, 0.60),                        # slow
            _row(3, 64, 8192, 8192, 0.85, 0.40),                          # very slow
            _row(4, 4000, 4000, 4004, 1.00, 0.50, path="cupy.matmul"),   # routed
            _row(5, 4096, 4096, 512, None, None, ok=False)]              # failed, not timed


def test_summary_statistics_and_targets():
    s = sweep_report.summarize(synthetic_rows())
    ratios = [1.25, 1.00, 0.95, 0.85, 1.00]
    assert s["overall"]["shapes"] == 6 and s["overall"]["timed"] == 5
    assert s["overall"]["geomean_ratio"] == pytest.approx(math.prod(ratios) ** (1 / 5))
    assert s["overall"]["min_ratio"] == 0.85
    assert s["overall"]["geomean_floor_hopmm"] == pytest.approx(
        (0.80 * 0.90 * 0.60 * 0.40 * 0.50) ** (1 / 5))
    assert [r["index"] for r in s["slow"]] == [3, 2]          # slowest first
    assert [r["index"] for r in s["routed"]] == [4]
    assert [r["index"] for r in s["failed"]] == [5]
    assert s["first_call_total_s"] == 2.5 and s["first_call_max"]["index"] == 0
    assert s["classes"]["large"]["shapes"] == 2 and s["classes"]["decode"]["min_ratio"] == 0.85
    assert s["sizes"]["multiples of 64"]["shapes"] == 4       # #0, #1, #3, #5
    met = {t["name"]: (t["value"], t["met"]) for t in s["targets"]}
    assert met["share of shapes < 0.97x best cuBLAS"] == (pytest.approx(2 / 5), False)
    assert met["shapes < 0.9x best cuBLAS"] == (1, False)
    assert met["share routed to cupy.matmul"] == (pytest.approx(1 / 6), False)
    assert met["geomean hopmm / best cuBLAS"][1] is False     # about 1.0, goal 1.3


def test_summary_targets_met_and_without_data():
    good = [_row(i, 4096, 4096, 4096 + 64 * i, 1.4, 0.7) for i in range(4)]
    assert all(t["met"] for t in sweep_report.summarize(good)["targets"])
    untimed = sweep_report.summarize([_row(0, 4096, 4096, 4096, None, None, ok=False)])
    assert untimed["overall"]["geomean_ratio"] is None
    assert {t["met"] for t in untimed["targets"]
            if t["name"] != "share routed to cupy.matmul"} == {None}


def test_formatted_summary_lists_routed_slow_and_failed_shapes():
    rows = synthetic_rows()
    text = sweep_report.format_summary(rows, sweep_report.describe(rows))
    first, *rest = text.splitlines()
    assert first.startswith(sweep_report.SUMMARY_TITLE)
    assert "seed 1, 6 shapes #0-5, bf16" in first
    assert "routed to cupy.matmul (1):" in text and "(rows not a multiple of 16 bytes)" in text
    assert "slower than 0.97x best cuBLAS (2):" in text
    assert "failed the check or raised (1):" in text and "RuntimeError: boom" in text
    assert "2.5 s in all, longest 2.0 s (#0 4096x4096x4096)" in text
    assert any(line.split()[:3] == ["all", "6", "5"] for line in rest)
    assert "MISSED" in text
    clean = sweep_report.format_summary([_row(0, 4096, 4096, 4096, 1.4, 0.7)])
    for listing in ("routed to cupy.matmul", "slower than 0.97x best cuBLAS",
                    "failed the check or raised"):
        assert f"{listing} (0): none" in clean


def test_merged_results_keep_the_later_row_of_a_shape():
    early = [_row(0, 4096, 4096, 4096, 0.9, 0.5), _row(1, 8192, 8192, 8192, 1.0, 0.9)]
    later = [_row(1, 8192, 8192, 8192, 1.1, 0.95), _row(2, 2048, 2048, 2048, 1.2, 0.7)]
    meta, rows = sweep_report.merge_results([({"device": "H100", "date": "d1"}, early),
                                             ({"device": "H100", "date": "d2"}, later)])
    assert [(r["index"], r["hopmm_vs_best"]) for r in rows] == [(0, 0.9), (1, 1.1), (2, 1.2)]
    assert meta["date"] == "d1" and len(meta["merged_from"]) == 2

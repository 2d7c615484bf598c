"""The shapes of a sweep (bench/sweep.py): drawn from a seeded generator, classified, and
given the floor that no GEMM of their size beats.  Pure Python: no GPU, no NumPy."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

# Each of M, N and K is drawn log-uniform in [DIM_MIN, DIM_MAX]; draws whose product is below
# the minimum or above the --max-gflop cap are drawn again.  Below 2 GFLOP a call is mostly
# host-side overhead, which bench.py's host_us columns measure instead.
DIM_MIN = 16
DIM_MAX = 32768
MIN_GFLOP = 2.0
DEFAULT_MAX_GFLOP = 1100.0  # about 8192^3: a call stays under ~2 ms, a shape under ~2 s
ROUND_TO = 64  # every other shape has all three extents rounded to a multiple of this
MAX_DRAWS = 100_000  # a generous bound: a valid cap accepts a draw every few tries

# The row pitch (bytes between the starts of consecutive rows) that TMA can address in
# place; rows that start elsewhere make hopmm copy the operand first.
ROW_ALIGN_BYTES = 16
ELEMENT_BYTES = 2  # fp16 and bf16

# The floor of a shape: the larger of its flops at the tensor rate reached in practice and
# its bytes of A, B and C once at the device-to-device copy bandwidth (H100 SXM, FACTS.md).
FLOOR_TFLOPS = 800.0
FLOOR_TBPS = 3.0

# Classes, tested in this order (a shape takes the first that fits), so that each names what
# most limits a kernel on the shape.  Thresholds in elements.
DECODE_MAX = 64          # M or N at most this: one wgmma-high strip of output, bound by B
SHORT_K_MAX = 700        # K at most this: ~11 k-blocks, the prologue and epilogue dominate
FEW_TILES_MAX = 300      # M or N at most this (K long): too few output tiles for the SMs
NARROW_N_MAX = 1024      # N at most this with M and K at least LONG_MIN
LONG_MIN = 2048
# M x N at least this (about a wave of 128 x 256 output tiles on 132 SMs, or more) and K at
# least LARGE_MIN_K: throughput-bound, where the last, partial wave costs most.
LARGE_MIN_OUTPUT = 2048 * 2048
LARGE_MIN_K = 1024
CLASSES = {
    "decode": f"M or N <= {DECODE_MAX}",
    "short_k": f"K <= {SHORT_K_MAX}",
    "few_tiles": f"M or N <= {FEW_TILES_MAX}, long K",
    "narrow_n": f"N <= {NARROW_N_MAX}, M and K >= {LONG_MIN}",
    "odd": f"an extent not a multiple of {ROUND_TO}",
    "large": f"M x N >= 2048^2, K >= {LARGE_MIN_K}",
    "other": "the rest",
}


@dataclass(frozen=True)
class Shape:
    index: int
    m: int
    n: int
    k: int
    dtype: str
    rounded: bool  # drawn rounded to multiples of ROUND_TO

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def shape_class(self) -> str:
        return classify(self.m, self.n, self.k)

    @property
    def floor_s(self) -> float:
        return floor_seconds(self.m, self.n, self.k)


def classify(m: int, n: int, k: int) -> str:
    """The first class of CLASSES that fits M x N x K."""
    if min(m, n) <= DECODE_MAX:
        return "decode"
    if k <= SHORT_K_MAX:
        return "short_k"
    if min(m, n) <= FEW_TILES_MAX:
        return "few_tiles"
    if n <= NARROW_N_MAX and m >= LONG_MIN and k >= LONG_MIN:
        return "narrow_n"
    if any(x % ROUND_TO for x in (m, n, k)):
        return "odd"
    if m * n >= LARGE_MIN_OUTPUT and k >= LARGE_MIN_K:
        return "large"
    return "other"


def rows_aligned(n: int, k: int, element_bytes: int = ELEMENT_BYTES) -> bool:
    """Whether every row of a row-major A (K wide), B and C (N wide) starts on a
    ROW_ALIGN_BYTES boundary."""
    return (k * element_bytes) % ROW_ALIGN_BYTES == 0 and (n * element_bytes) % ROW_ALIGN_BYTES == 0


def floor_seconds(m: int, n: int, k: int, element_bytes: int = ELEMENT_BYTES) -> float:
    """max(2MNK / FLOOR_TFLOPS, bytes of A, B and C once / FLOOR_TBPS)."""
    compute = 2.0 * m * n * k / (FLOOR_TFLOPS * 1e12)
    memory = (m * k + k * n + m * n) * element_bytes / (FLOOR_TBPS * 1e12)
    return max(compute, memory)


def _round_to(x: int, step: int = ROUND_TO) -> int:
    return max(step, round(x / step) * step)


def draw_shape(seed: int, index: int, dtypes, max_gflop: float = DEFAULT_MAX_GFLOP) -> Shape:
    """Shape `index` of the sweep `seed`: a function of (seed, index, max_gflop) alone, so any
    slice of a sweep (--start, --count) draws the same shapes as the whole.  Even indices are
    rounded to multiples of ROUND_TO; the dtype cycles every two indices, so each dtype gets
    rounded and unrounded shapes alike."""
    if max_gflop < MIN_GFLOP:
        raise ValueError(f"max_gflop must be at least {MIN_GFLOP}, got {max_gflop}")
    if not dtypes:
        raise ValueError("dtypes must name at least one dtype")
    rng = random.Random(f"hopmm-sweep/{seed}/{index}")  # string seeds hash the same everywhere
    rounded = index % 2 == 0
    lo, hi = math.log(DIM_MIN), math.log(DIM_MAX)
    for _ in range(MAX_DRAWS):
        m, n, k = (round(math.exp(rng.uniform(lo, hi))) for _ in range(3))
        if rounded:
            m, n, k = _round_to(m), _round_to(n), _round_to(k)
        if MIN_GFLOP <= 2.0 * m * n * k / 1e9 <= max_gflop:
            return Shape(index, m, n, k, dtypes[(index // 2) % len(dtypes)], rounded)
    raise ValueError(f"no shape between {MIN_GFLOP} and {max_gflop} GFLOP in {MAX_DRAWS} draws")


def draw_shapes(seed: int, start: int, count: int, dtypes,
                max_gflop: float = DEFAULT_MAX_GFLOP) -> list[Shape]:
    """Shapes start .. start + count - 1 of the sweep `seed`."""
    return [draw_shape(seed, i, dtypes, max_gflop) for i in _indices(start, count)]


def _indices(start: int, count: int) -> range:
    if start < 0 or count < 0:
        raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
    return range(start, start + count)


# Decode draws (draw_decode_shape): the products of a model's layers at a decode step, which
# the sweep's 2 GFLOP minimum leaves out below ~16 rows. M log-uniform in [1, DECODE_DRAW_ROWS],
# N and K log-uniform in [DECODE_DRAW_DIM_MIN, DIM_MAX].
DECODE_DRAW_ROWS = 16
DECODE_DRAW_DIM_MIN = 1024


def draw_decode_shape(seed: int, index: int, dtypes) -> Shape:
    """Decode shape `index` of the draw `seed`, a function of (seed, index) alone like
    draw_shape's; even indices have N and K rounded to multiples of ROUND_TO."""
    rng, rounded = _shape_generator("decode", seed, index, dtypes)
    m = round(math.exp(rng.uniform(0.0, math.log(DECODE_DRAW_ROWS))))
    n, k = _two_long_sides(rng, rounded)
    return Shape(index, m, n, k, _dtype_of(index, dtypes), rounded)


def _shape_generator(draw: str, seed: int, index: int, dtypes) -> tuple[random.Random, bool]:
    """The generator of shape `index` of the `draw` draws' `seed` (a function of the three
    alone) and whether its long sides are rounded (even indices); ValueError without dtypes."""
    if not dtypes:
        raise ValueError("dtypes must name at least one dtype")
    return random.Random(f"hopmm-{draw}/{seed}/{index}"), index % 2 == 0


def _dtype_of(index: int, dtypes) -> str:
    """The dtype of shape `index` of the decode, narrow and few-row draws: pairs of shapes
    (one rounded, one not) take the dtypes in turn."""
    return dtypes[(index // 2) % len(dtypes)]


def _two_long_sides(rng: random.Random, rounded: bool) -> tuple[int, int]:
    """Two extents log-uniform in [DECODE_DRAW_DIM_MIN, DIM_MAX], rounded to ROUND_TO if
    `rounded`: the long sides of the decode, narrow and few-row draws."""
    lo, hi = math.log(DECODE_DRAW_DIM_MIN), math.log(DIM_MAX)
    x, y = (round(math.exp(rng.uniform(lo, hi))) for _ in range(2))
    return (_round_to(x), _round_to(y)) if rounded else (x, y)


def draw_decode_shapes(seed: int, start: int, count: int, dtypes) -> list[Shape]:
    """Decode shapes start .. start + count - 1 of the draw `seed`."""
    return [draw_decode_shape(seed, i, dtypes) for i in _indices(start, count)]


def draw_columns_shapes(seed: int, start: int, count: int, dtypes) -> list[Shape]:
    """The decode shapes of the draw `seed` with M and N swapped: products of 1-16 columns
    (a router's or a classifier's few outputs over many tokens), whose big operand is A."""
    return [Shape(s.index, s.n, s.m, s.k, s.dtype, s.rounded)
            for s in draw_decode_shapes(seed, start, count, dtypes)]


# Narrow draws (draw_narrow_shape): tall products of a few dozen columns (a mixture of experts'
# router, a low-rank adapter's down projection, a small head) whose 16-bit rows are whole
# 16-byte chunks: N a multiple of NARROW_DRAW_COLUMN_STEP up to NARROW_DRAW_MAX_COLUMNS, M and K
# log-uniform in [DECODE_DRAW_DIM_MIN, DIM_MAX], both rounded to multiples of ROUND_TO on even
# indices.
NARROW_DRAW_COLUMN_STEP = 8
NARROW_DRAW_MAX_COLUMNS = 64


def draw_narrow_shape(seed: int, index: int, dtypes) -> Shape:
    """Narrow shape `index` of the draw `seed`, a function of (seed, index) alone like
    draw_shape's."""
    rng, rounded = _shape_generator("narrow", seed, index, dtypes)
    steps = NARROW_DRAW_MAX_COLUMNS // NARROW_DRAW_COLUMN_STEP
    n = rng.randint(1, steps) * NARROW_DRAW_COLUMN_STEP
    m, k = _two_long_sides(rng, rounded)
    return Shape(index, m, n, k, _dtype_of(index, dtypes), rounded)


def draw_narrow_shapes(seed: int, start: int, count: int, dtypes) -> list[Shape]:
    """Narrow shapes start .. start + count - 1 of the draw `seed`."""
    return [draw_narrow_shape(seed, i, dtypes) for i in _indices(start, count)]


# Few-row draws (draw_few_rows_shape): products of a few dozen rows or columns (a batch of
# requests at a decode step, a small head over many tokens) between the decode draws' 16 and
# half a 128-row tile, at any width: the short side log-uniform in [FEW_ROWS_DRAW_MIN,
# FEW_ROWS_DRAW_MAX] (rows on indices 0, 1 mod 4, columns on 2, 3), the long sides as the
# decode draws' (rounded on even indices), so half of them have rows TMA cannot read in place.
FEW_ROWS_DRAW_MIN = DECODE_DRAW_ROWS + 1
FEW_ROWS_DRAW_MAX = 64


def draw_few_rows_shape(seed: int, index: int, dtypes) -> Shape:
    """Few-row shape `index` of the draw `seed`, a function of (seed, index) alone like
    draw_shape's."""
    return _short_side_shape("few-rows", seed, index, dtypes, FEW_ROWS_DRAW_MIN, FEW_ROWS_DRAW_MAX)


def _short_side_shape(draw: str, seed: int, index: int, dtypes, lo: int, hi: int) -> Shape:
    """Shape `index` of the `draw` draws' `seed` whose short side is log-uniform in [lo, hi]
    (rows on indices 0, 1 mod 4, columns on 2, 3), its long sides as the decode draws'."""
    rng, rounded = _shape_generator(draw, seed, index, dtypes)
    short = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    long, k = _two_long_sides(rng, rounded)
    m, n = (short, long) if index % 4 < 2 else (long, short)
    return Shape(index, m, n, k, _dtype_of(index, dtypes), rounded)


def draw_few_rows_shapes(seed: int, start: int, count: int, dtypes) -> list[Shape]:
    """Few-row shapes start .. start + count - 1 of the draw `seed`."""
    return [draw_few_rows_shape(seed, i, dtypes) for i in _indices(start, count)]


# Mid-row draws (draw_mid_rows_shape): as the few-row draws, the short side from past them to
# two and a half 128-row tiles (a batch of a hundred-odd decode requests, a prefill chunk),
# which the sweep's rounding to multiples of ROUND_TO leaves at 128 and 192 where its long
# sides are rounded.
MID_ROWS_DRAW_MIN = FEW_ROWS_DRAW_MAX + 1
MID_ROWS_DRAW_MAX = 320


def draw_mid_rows_shape(seed: int, index: int, dtypes) -> Shape:
    """Mid-row shape `index` of the draw `seed`, a function of (seed, index) alone like
    draw_shape's."""
    return _short_side_shape("mid-rows", seed, index, dtypes, MID_ROWS_DRAW_MIN, MID_ROWS_DRAW_MAX)


def draw_mid_rows_shapes(seed: int, start: int, count: int, dtypes) -> list[Shape]:
    """Mid-row shapes start .. start + count - 1 of the draw `seed`."""
    return [draw_mid_rows_shape(seed, i, dtypes) for i in _indices(start, count)]

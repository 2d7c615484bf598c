"""GPU tier: products of at most 64 columns on the 64-wide tile (heuristics.NARROW_BLOCK_N),
and of up to 256 where the wave model takes it, through hopmm.matmul, unsplit and split along
K: against an fp32 cupy.matmul into NaN-poisoned outputs with a spare row after them, every
layout, K not a multiple of 64 or below one k-block, columns that are not 16-byte aligned
(the row store), B's rows of 16 bytes read from a copy of whole lines, batches, fused
epilogues, forced split-K schedules, bitwise repeats and new operands through the remembered
launches. Skips without a Hopper GPU."""
import pytest

from conftest import requires_hopper
from forced import check_call, check_close, check_fused_into_c, operands, reference

pytestmark = [requires_hopper, pytest.mark.usefixtures("heuristic_choice")]

NARROW = "128x64"


# (m, n, k, schedule the heuristic takes): unsplit where the main loop is too short for a
# split to pay, split where the few tiles' long main loops set the pace; 17 columns (34-byte
# rows: stored by rows), K of one partial k-block. Each takes the same schedule and tile
# whatever the device's DRAM bandwidth, from 0.6 to 1.6 x the H100's (heuristics.dram_scale).
CASES = {
    "unsplit": (5056, 64, 1504, "persistent"),
    "unsplit_odd_rows": (6001, 17, 1504, "persistent"),
    "unsplit_short_k": (9000, 48, 40, "persistent"),
    "split": (2752, 64, 16192, "split_k_cluster"),
    "split_odd": (1664, 37, 22339, "split_k_cluster"),
    # 65-256 columns where the wave model takes the narrow tile: two and three N-tiles (past
    # one round of 64 x 128 tiles, which keep fewer rows: heuristics.ONE_ROUND_SHORT_GAIN)
    "waves_128": (8000, 128, 800, "persistent"),
    "waves_192": (4800, 192, 4928, "persistent"),
    "waves_odd": (8000, 103, 704, "persistent"),
}
LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_narrow_tile_matches_cupy(case, dtype, layout):
    m, n, k, schedule = CASES[case]
    check_call(m, n, k, dtype, *LAYOUTS[layout], f"tiles of {NARROW}", f"schedule: {schedule}\n")


@pytest.mark.parametrize("schedule", ["split_k", "split_k_cluster", "persistent"])
@pytest.mark.parametrize("m,n,k", [(1000, 64, 4100), (300, 33, 700), (129, 64, 64)])
def test_forced_schedules_take_the_narrow_tile(schedule, m, n, k):
    import hopmm

    a, b = operands(m, n, k, "bfloat16")
    hopmm.use_schedule(schedule)
    text = hopmm.explain(a, b)
    assert f"tiles of {NARROW}" in text or f"_{NARROW}x64_" in text, text
    check_close(hopmm.matmul(a, b), reference(a, b), "bfloat16")


@pytest.mark.parametrize("bias_form", ["columns", "rows"])
@pytest.mark.parametrize("m,n,k", [(5056, 64, 5504), (2752, 40, 16192), (3000, 17, 900)])
def test_narrow_fused_epilogue(m, n, k, bias_form):
    """bias ((N,) or (M, 1)), c, alpha, beta and gelu on the narrow tile, against the fp32
    computation; the result written into c itself (out=c)."""
    text = check_fused_into_c(*operands(m, n, k, "bfloat16"), bias_form)
    assert f"tiles of {NARROW}" in text and "fused into the kernel" in text, text


def test_narrow_batches():
    """Three matrices of 1,500 x 40 (one B broadcast over them), split and unsplit."""
    import hopmm

    for k in (600, 20000):
        a, b = operands(1500, 40, k, "float16", batch=(3,))
        assert f"tiles of {NARROW}" in hopmm.explain(a, b)
        check_close(hopmm.matmul(a, b), reference(a, b), "float16")
        a1, _ = operands(1500, 40, k, "float16", batch=(3,))
        b1 = b[0]
        check_close(hopmm.matmul(a1, b1), reference(a1, b1), "float16")


# B's rows shorter than a sector read from a line copy (heuristics.narrow_b_copy_reason), on
# every device's DRAM: 8 columns past a wave, over a long K (split on faster DRAM), and between;
# the narrow tile's kernel persistent or, past a wave, stream-K (_whole_line_narrow_stream_k).
LINE_COPY_CASES = [(23851, 8, 9216), (5378, 8, 30744), (16256, 8, 9408)]
LINE_COPY_NOTES = (f"_{NARROW}x64_", "aligned copies of b (", "shorter than a 32-byte sector")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k", LINE_COPY_CASES)
def test_narrow_b_rows_read_from_a_line_copy(m, n, k, dtype):
    check_call(m, n, k, dtype, False, False, *LINE_COPY_NOTES)


@pytest.mark.parametrize("m,n,k", LINE_COPY_CASES)
def test_narrow_b_line_copy_fused(m, n, k):
    text = check_fused_into_c(*operands(m, n, k, "bfloat16"), "columns")
    assert all(note in text for note in LINE_COPY_NOTES), text
    assert "fused into the kernel" in text, text


def test_narrow_b_line_copy_batched():
    """Four matrices of 4,096 x 8,192 times one B of 8 columns broadcast over them, and a
    batch of four Bs."""
    import hopmm

    a, b = operands(4096, 8, 8192, "bfloat16", batch=(4,))
    for bb in (b[0], b):
        text = hopmm.explain(a, bb)
        assert all(note in text for note in LINE_COPY_NOTES), text
        check_close(hopmm.matmul(a, bb), reference(a, bb), "bfloat16")

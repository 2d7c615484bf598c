"""GPU tier: products whose tiles past the last whole wave run as a second kernel
(heuristics.Tail), through hopmm.matmul: against an fp32 cupy.matmul into NaN-poisoned outputs
with a spare row after them, both axes, transposed operands, tails on split-K and persistent
kernels, rows that are not 16-byte aligned, repeats on new operands (the remembered launches),
bitwise repeatable, fused epilogues and batches; a strided out or a tail that cannot store
unaligned rows falls back to one kernel. Skips without a Hopper GPU."""
import pytest

from conftest import requires_hopper
from forced import check_call, check_close, check_fused_into_c, operands, reference

pytestmark = [requires_hopper, pytest.mark.usefixtures("heuristic_choice")]


# (m, n, k, A transposed, B transposed, the tail's part): 136 tiles of 128 rows, a tail of
# 300 rows on a split-K schedule; 3 x 92 tiles of 128 x 192, a tail of 704 columns; tails on a
# persistent kernel (3648 x 2944: on the half-box tile), on aligned rows and on rows of 2,686
# bytes (both parts store rows themselves).
CASES = {
    "rows": (17196, 64, 4096, False, False, "rows"),
    "rows_a_transposed": (17196, 64, 4096, True, False, "rows"),
    "rows_b_transposed": (17196, 64, 4096, False, True, "rows"),
    "rows_wider": (17196, 512, 4096, False, False, "rows"),
    "columns": (384, 17600, 4096, False, False, "columns"),
    "columns_b_transposed": (384, 17600, 4096, False, True, "columns"),
    "persistent_tail": (3648, 2944, 5888, False, False, "columns"),
    "persistent_tail_odd_rows": (5440, 1343, 4096, False, False, "columns"),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_tail_matches_cupy(case, dtype):
    """Both parts into one out (a spare NaN row after it), bitwise repeatable (no atomics in
    either kernel's reduction), new operands through the remembered launches."""
    m, n, k, ta, tb, part = CASES[case]
    check_call(m, n, k, dtype, ta, tb, f"\ntail: {part} ")


@pytest.mark.parametrize("case", ["odd_n", "strided_out"])
def test_results_stored_by_rows_run_on_one_kernel(case):
    """Rows that TMA cannot store (N = 100: 200-byte rows; an out whose rows lie apart) take
    the row store, which the tail's split-K does not have: the whole problem runs on the
    persistent kernel, storing rows itself, into a NaN-poisoned out."""
    import cupy

    import hopmm

    n = 100 if case == "odd_n" else 64
    a, b = operands(17196, n, 4096, "bfloat16")
    buf = cupy.full((17196, n + 8), cupy.nan, dtype="bfloat16")
    out = buf[:, :n] if case == "strided_out" else buf[:, :n].copy()
    text = hopmm.explain(a, b, out)
    assert "tail:" not in text and "stores the rows itself" in text, text
    hopmm.matmul(a, b, out=out)
    check_close(out, reference(a, b), "bfloat16")
    if case == "strided_out":
        assert bool(cupy.isnan(buf[:, n:].astype(cupy.float32)).all())


@pytest.mark.parametrize("bias_form", ["columns", "rows"])
@pytest.mark.parametrize("m,n,k,part", [(17196, 64, 4096, "rows"), (384, 17600, 4096, "columns"),
                                        (4800, 2048, 4096, "rows")])
def test_fused_epilogue_on_both_parts(m, n, k, part, bias_form):
    """bias ((N,) or (M, 1)), c, alpha, beta and gelu on the main part and the tail, against
    the fp32 computation; the result written into c itself (out=c)."""
    text = check_fused_into_c(*operands(m, n, k, "bfloat16"), bias_form)
    assert f"\ntail: {part} " in text and "fused into the kernel" in text, text


def test_batched_tail():
    """Two matrices: the tail's rows of both run after the main part's."""
    import hopmm

    a, b = operands(8600, 64, 4096, "float16", batch=(2,))
    assert "\ntail: rows 8448-8599" in hopmm.explain(a, b)
    check_close(hopmm.matmul(a, b), reference(a, b), "float16")

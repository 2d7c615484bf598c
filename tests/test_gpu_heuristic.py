"""GPU tier: the heuristic's choices that depend on how the operands lie in memory, seen
through hopmm.explain, and their results."""
import pytest

from conftest import requires_hopper
from forced import TOL, rand

pytestmark = requires_hopper


@pytest.fixture(autouse=True)
def _heuristic_choice():
    import hopmm

    hopmm.use_schedule(None)
    yield


@pytest.mark.parametrize("n,schedule", [(3000, "persistent_cluster"),   # 6000-byte rows
                                        (3008, "persistent_overlap")])  # 6016 = 47 x 128
def test_b_rows_off_cache_lines_take_the_cluster_kernel(n, schedule):
    import cupy

    import hopmm

    a, b = rand((3000, 3000), "bfloat16"), rand((3000, n), "bfloat16")
    text = hopmm.explain(a, b)
    assert f"schedule: {schedule}\n" in text
    assert ("not multiples of 128 B" in text) == (schedule == "persistent_cluster")
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    got = hopmm.matmul(a, b).astype(cupy.float32)
    assert float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)) < TOL["bfloat16"]


def test_an_aligned_copy_has_whole_cache_line_rows():
    """B's 2046-byte rows are not 16-byte multiples: hopmm copies B, with rows padded to
    128 bytes, so the copy needs no cluster."""
    import hopmm

    a, b = rand((2048, 512), "bfloat16"), rand((512, 1023), "bfloat16")
    text = hopmm.explain(a, b)
    assert "aligned copies of b" in text and "schedule: persistent\n" in text

"""GPU: autotune times every candidate, records the fastest correct one, and matmul uses it."""
from conftest import requires_hopper

pytestmark = requires_hopper

SHAPE = (1024, 1536, 512)


def test_autotune_records_a_winner_that_matmul_uses(capsys):
    import cupy

    import hopmm
    from hopmm import tuning
    from hopmm.device import query
    from hopmm.problem import Problem

    m, n, k = SHAPE
    rows = hopmm.autotune([SHAPE], "bfloat16", warmup_s=0.05, rounds=2)
    problem = Problem(m, n, k, 1, "bfloat16", "k", "n")
    device = query(cupy.cuda.Device().id)
    assert len(rows[0]["tflops"]) == len(tuning.candidates(problem, device))
    assert rows[0]["best"] == max(rows[0]["tflops"], key=rows[0]["tflops"].get)
    # A wrong candidate is skipped, not timed: these schedules all computed correctly.
    assert {"warp_specialized", "persistent", "pingpong"} <= {
        name.split()[0] for name in rows[0]["tflops"]}
    assert "[autotune]" in capsys.readouterr().err
    assert tuning.label(tuning.lookup(problem, device)) == rows[0]["best"]

    a = cupy.random.standard_normal((m, k), dtype=cupy.float32).astype("bfloat16")
    b = cupy.random.standard_normal((k, n), dtype=cupy.float32).astype("bfloat16")
    assert "autotuned" in hopmm.explain(a, b)
    out = hopmm.matmul(a, b).astype(cupy.float32)
    ref = cupy.matmul(a.astype(cupy.float32), b.astype(cupy.float32))
    assert float(cupy.linalg.norm(out - ref) / cupy.linalg.norm(ref)) < 1e-2

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


def test_autotune_times_its_finalists_alone_on_large_problems(monkeypatch, capsys):
    """Where a problem reaches the power limit the fastest interleaved candidates run again
    alone and the fastest of them alone wins (the threshold lowered so a small shape takes
    that path)."""
    import cupy

    import hopmm
    from hopmm import timing, tuning
    from hopmm.device import query
    from hopmm.problem import Problem

    monkeypatch.setattr(tuning, "SUSTAINED_MIN_FLOPS", 0)
    monkeypatch.setattr(timing, "SUSTAINED_S", 0.02)
    m, n, k = SHAPE
    row = hopmm.autotune([SHAPE], "bfloat16", warmup_s=0.05, rounds=2)[0]
    alone = row["sustained_tflops"]
    assert len(alone) == tuning.SUSTAINED_FINALISTS
    assert set(alone) == set(sorted(row["tflops"], key=row["tflops"].get)[-len(alone):])
    assert row["best"] == max(alone, key=alone.get) and all(v > 0 for v in alone.values())
    assert f"alone, of {len(alone)} finalists" in capsys.readouterr().err
    problem = Problem(m, n, k, 1, "bfloat16", "k", "n")
    assert tuning.label(tuning.lookup(problem, query(cupy.cuda.Device().id))) == row["best"]

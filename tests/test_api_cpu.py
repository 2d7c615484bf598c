"""CPU: argument validation that needs no GPU (non-CuPy inputs are refused first)."""
import numpy as np
import pytest

import hopmm


@pytest.mark.parametrize("a,b", [(np.ones((2, 2), np.float16), np.ones((2, 2), np.float16)),
                                 ([[1.0]], [[1.0]])], ids=["numpy", "lists"])
def test_non_cupy_inputs_are_type_errors(a, b):
    with pytest.raises(TypeError, match="cupy.ndarray"):
        hopmm.matmul(a, b)
    with pytest.raises(TypeError, match="cupy.ndarray"):
        hopmm.explain(a, b)


def test_python_scalars_are_value_errors():
    with pytest.raises(ValueError, match="scalar"):
        hopmm.matmul(2.0, np.ones((2, 2)))


def test_main_job_cpu_report_lists_every_kernel(capsys):
    from hopmm.__main__ import main
    from hopmm.device import H100_SXM
    from hopmm.schedules import SCHEDULES

    assert main(["--cpu"]) == 0
    out = capsys.readouterr().out
    for sched in SCHEDULES.values():
        for cfg in sched.configs(H100_SXM.smem_per_block_optin):
            assert sched.kernel_name(cfg) in out


def test_use_schedule_validates_and_clears_remembered_launches():
    from hopmm import fastpath

    fastpath._recipes["stale"] = object()
    with pytest.raises(ValueError, match="unknown schedule"):
        hopmm.use_schedule("no_such_schedule")
    hopmm.use_schedule("persistent")
    assert "stale" not in fastpath._recipes
    hopmm.use_schedule(None)

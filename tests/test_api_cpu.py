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


def test_main_job_cpu_report_lists_every_kernel(capsys, kernel_matrix):
    from hopmm.__main__ import main
    from hopmm.device import H100_SXM
    from hopmm.schedules import SCHEDULES

    assert main(["--cpu"]) == 0
    out = capsys.readouterr().out
    for sched in SCHEDULES.values():
        for cfg in sched.configs(H100_SXM.smem_per_block_optin):
            assert sched.kernel_name(cfg) in out


def test_use_schedule_validates_and_clears_remembered_launches():
    from hopmm import api, fastpath

    previous = api._schedule_override
    fastpath._recipes["stale"] = object()
    generation = fastpath.generation
    with pytest.raises(ValueError, match="unknown schedule"):
        hopmm.use_schedule("no_such_schedule")
    try:
        hopmm.use_schedule("persistent")
        assert "stale" not in fastpath._recipes and fastpath.generation > generation
    finally:
        hopmm.use_schedule(previous)


def test_a_choice_made_before_a_clear_is_not_remembered():
    from hopmm import fastpath

    chosen_at = fastpath.generation
    fastpath.clear()
    fastpath.remember("k", object(), chosen_at)
    assert fastpath.lookup("k") is None


def test_imports_without_cupy():
    """CuPy is imported by the first call (fastpath binds it then), never by `import hopmm`."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c",
                          "import sys; sys.modules['cupy'] = None; import hopmm"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_unknown_schedule_in_the_environment_is_a_clear_error():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "import hopmm"], capture_output=True, text=True,
                         env={**__import__("os").environ, "HOPMM_SCHEDULE": "persistant"})
    assert run.returncode != 0 and "unknown schedule 'persistant'" in run.stderr


@pytest.mark.parametrize("shape,strides,expected", [
    ((4, 8), (16, 2), (0, 64)), ((4, 8), (-16, 2), (-48, 16)), ((0, 8), (16, 2), (0, 0)),
    ((3,), (-4,), (-8, 2))], ids=str)
def test_byte_bounds(shape, strides, expected):
    from hopmm import layout

    assert layout.byte_bounds(0, shape, strides, 2) == expected


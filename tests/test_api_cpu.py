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


@pytest.mark.parametrize("scalar", [2.0, 3, 1j, True], ids=["float", "int", "complex", "bool"])
def test_python_scalars_are_type_errors_like_cupy(scalar):
    """cupy.matmul's core routine takes cupy arrays only: a Python number is a TypeError."""
    with pytest.raises(TypeError, match="scalar"):
        hopmm.matmul(scalar, np.ones((2, 2)))
    with pytest.raises(TypeError, match="operand a"):   # the first operand is checked first
        hopmm.matmul(np.ones((2, 2)), scalar)


def test_main_job_cpu_report_lists_every_kernel(capsys, kernel_matrix):
    from hopmm.__main__ import main
    from hopmm.device import H100_SXM
    from hopmm.schedules import DUAL_B_SCHEDULES, SCHEDULES

    assert main(["--cpu"]) == 0
    out = capsys.readouterr().out
    for sched in (*SCHEDULES.values(), *DUAL_B_SCHEDULES.values()):
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


def test_remembered_values_retire_with_their_generation_and_stay_bounded():
    """fastpath.Remembered (torch calls' launches, shared-A plans): a value kept before a
    clear() is never returned after it; past its limit everything is dropped; None is no key."""
    from hopmm import fastpath

    kept = fastpath.Remembered(limit=2)
    kept.put("a", 1)
    kept.put(None, 2)
    assert kept.get("a") == 1 and kept.get(None) is None and len(kept) == 1
    fastpath.clear()
    assert kept.get("a") is None and len(kept) == 0
    kept.put("a", 1)
    kept.put("b", 2)
    kept.put("c", 3)
    assert len(kept) == 1 and kept.get("c") == 3 and kept.values() == [3]
    kept.put("d", 4)
    with pytest.raises(TypeError):   # an unhashable key is refused before anything is dropped
        kept.put(("e", [5]), 5)
    assert len(kept) == 2 and kept.get("c") == 3


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



def test_none_operand_is_a_type_error():
    """(cupy.matmul(None, x) crashes CuPy 14's typed core routine; hopmm refuses it.)"""
    with pytest.raises(TypeError, match="operand a must be a cupy.ndarray, got NoneType"):
        hopmm.matmul(None, np.ones((2, 2)))


@pytest.mark.parametrize("operand,error", [(2.0, AttributeError), ([[1.0]], AttributeError),
                                           (np.float16(2), TypeError),
                                           (np.ones((2, 2), np.float16), TypeError)],
                         ids=["float", "list", "numpy_scalar", "numpy_array"])
def test_bad_operands_with_out_raise_what_cupys_gufunc_path_raises(operand, error):
    """With an out, cupy.matmul's gufunc path reads each operand's dtype first (a Python
    number or list has none), then refuses an out that is not a cupy array (here a numpy
    one) before it looks at dimensions (tests/test_fuzz_cpu.py has the cupy-out cases)."""
    with pytest.raises(error):
        hopmm.matmul(operand, np.ones((2, 2), np.float16), out=np.ones((2, 2)))

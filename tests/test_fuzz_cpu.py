"""CPU: the validation and planning of hopmm.matmul over a few hundred fuzz cases
(tests/fuzz_cases.py), operands being real cupy arrays over host memory (their shapes,
strides, dtypes and pointers are all that validation and planning read).

Each case's outcome (hopmm.plan's exception type, or its result shape and dtype) is compared
with cupy.matmul's own where cupy decides before it touches the GPU (its argument checks run
here too: cuBLAS is stubbed, and the first GPU call fails), and otherwise with numpy's rules.
Only without a GPU: the operands' host pointers must never reach a real device (on the GPU
machine bench/fuzz.py runs the same cases for real)."""
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import fuzz_cases
import hopmm
from hopmm import device

SEED = 20261125
COUNT = 400
MAX_DIM = 64   # host buffers: small extents keep the run quick


def _no_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() == 0
    except Exception:  # no driver: exactly the machine this test is for
        return True


pytestmark = pytest.mark.skipif(not _no_gpu(), reason="host-memory cupy arrays must not reach "
                                "a GPU; bench/fuzz.py covers these cases there")

_KEEP = []   # host buffers behind the cupy arrays of the running case


def _dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _host_flat(n, dtype):
    import cupy

    dtype = _dtype(dtype) if isinstance(dtype, str) else dtype
    host = np.zeros(max(n, 1), dtype)
    _KEEP.append(host)
    memory = cupy.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
    return cupy.ndarray((n,), dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


class _ReachedGpu(Exception):
    """cupy.matmul got past its argument checks (it asked for cuBLAS)."""


class _StubCublas(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _ReachedGpu(name)


@pytest.fixture
def host_cupy(monkeypatch):
    import cupy
    import cupy_backends.cuda.libs as libs
    from cupy_backends.cuda.api import driver, runtime

    stub = _StubCublas("cupy_backends.cuda.libs.cublas")
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", stub)
    monkeypatch.setitem(vars(libs), "cublas", stub)   # (getattr would load the real one)
    monkeypatch.setattr(device, "query", lambda device_id: device.H100_SXM)
    yield fuzz_cases.ArrayMaker(_host_flat, cupy, np), (
        _ReachedGpu, runtime.CUDARuntimeError, driver.CUDADriverError, ImportError)
    _KEEP.clear()


INCONCLUSIVE = "inconclusive"


def cupy_outcome(a, b, out, reached_gpu) -> str:
    """cupy.matmul's exception kind where it raises before any GPU work, else INCONCLUSIVE."""
    import cupy

    try:
        cupy.matmul(a, b) if out is None else cupy.matmul(a, b, out=out)
    except reached_gpu:
        return INCONCLUSIVE
    except Exception as exc:
        return fuzz_cases.error_kind(exc)
    return INCONCLUSIVE


def numpy_outcome(a, b, out) -> str:
    """numpy's rules for cupy-array operands: shapes (ValueError), a common dtype
    (TypeError), out's shape (ValueError) and the cast into it (TypeError); else "ok"."""
    shape = fuzz_cases.result_shape(a, b, np)
    if shape is None:
        return "ValueError"
    dtype = fuzz_cases.result_dtype(a, b, np)
    if dtype is None:
        return "TypeError"
    if out is not None:
        if out.shape != shape:
            return "ValueError"
        if not np.can_cast(dtype, out.dtype, casting="same_kind"):
            return "TypeError"
    return "ok"


def hopmm_outcome(a, b, out):
    try:
        return "ok", hopmm.plan(a, b, out)
    except Exception as exc:
        return fuzz_cases.error_kind(exc), None


def test_fuzzed_validation_matches_cupy_and_numpy(host_cupy):
    maker, reached_gpu = host_cupy
    seen = {}
    for c in fuzz_cases.cases(SEED, COUNT, MAX_DIM, torch=False):
        a, b, out = fuzz_cases.build(c, maker)
        expected = cupy_outcome(a, b, out, reached_gpu)
        source = "cupy"
        if expected == INCONCLUSIVE:
            # Only cupy arrays get past cupy's checks into the GPU work.
            expected, source = numpy_outcome(a, b, out), "numpy"
        got, plan = hopmm_outcome(a, b, out)
        assert got == expected, f"{c}: hopmm {got}, {source} {expected}"
        if plan is not None:
            assert plan.shapes.out_shape == fuzz_cases.result_shape(a, b, np), c
            assert plan.dtype == fuzz_cases.result_dtype(a, b, np), c
            expected_path = ("empty" if 0 in plan.shapes.out_shape
                             else "zeros" if plan.shapes.k == 0 else None)
            assert expected_path in (None, plan.path), c
        seen[c.category, source, got] = seen.get((c.category, source, got), 0) + 1
        _KEEP.clear()
    # The run covers every category and both kinds of outcome.
    assert {cat for cat, _, _ in seen} == set(fuzz_cases.CATEGORIES) - {"torch"}
    assert {"ok", "TypeError", "ValueError", "AttributeError"} <= {g for _, _, g in seen}
    assert any(src == "cupy" and g != INCONCLUSIVE for _, src, g in seen)


def test_cases_are_reproducible_and_cover_every_form():
    first = fuzz_cases.cases(SEED, 300)
    assert first == fuzz_cases.cases(SEED, 300)
    assert fuzz_cases.cases(SEED, 10, start=100) == first[100:110]
    assert first != fuzz_cases.cases(SEED + 1, 300)
    without_torch = fuzz_cases.cases(SEED, 300, torch=False)
    assert without_torch == [c for c in first if not c.torch]
    specs = [x for c in first for x in (c.a, c.b) if isinstance(x, fuzz_cases.OperandSpec)]
    assert any(s.transposed for s in specs) and any(s.offset for s in specs)
    assert any(min(s.steps, default=1) < 0 for s in specs) and any(s.expand for s in specs)
    assert any(0 in s.shape for s in specs) and any(len(s.shape) == 1 for s in specs)
    outs = {c.out for c in first}
    assert set(fuzz_cases.VALID_OUTS + fuzz_cases.BAD_OUTS) <= outs
    bad = {x for c in first for x in (c.a, c.b) if isinstance(x, str)}
    assert bad == set(fuzz_cases.BAD_OPERANDS)
    assert any(c.torch for c in first)
    assert all(min(x.steps, default=1) > 0 for c in first if c.torch
               for x in (c.a, c.b) if isinstance(x, fuzz_cases.OperandSpec))


def test_host_cupy_arrays_have_the_specs_layout(host_cupy):
    maker, _ = host_cupy
    spec = fuzz_cases.OperandSpec((2, 3, 5), "float16", transposed=True, steps=(1, -2, 3),
                                  offset=1, expand=(0,))
    x = fuzz_cases.operand(spec, maker)
    # Stored (1, 10, 9) after one element; stepped (1, 5, 3), strides (180, -36, 6) bytes;
    # transposed, then broadcast along the first axis.
    assert x.shape == (2, 3, 5) and x.strides == (0, 6, -36)


def _numpy_as_cupy():
    """numpy in the place of cupy for bench/fuzz.py's harness (its one CUDA call a no-op)."""
    shim = types.SimpleNamespace(**{name: getattr(np, name) for name in dir(np)
                                    if not name.startswith("_")})
    shim.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    return shim


def _numpy_maker():
    rng = np.random.default_rng(0)
    return fuzz_cases.ArrayMaker(
        lambda n, dtype: rng.standard_normal(n).astype(_dtype(dtype)), _numpy_as_cupy(), np)


def _harness():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("fuzz_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flaw", [None, "scaled", "value_error", "writes_out_then_raises"])
def test_gpu_fuzzer_harness_finds_what_it_must(flaw):
    """bench/fuzz.py's per-case comparison, with numpy standing in for cupy and a stand-in
    for hopmm: numpy itself agrees with itself on every case, and each planted flaw (a wrong
    value, another exception type, out written before a raise) is reported as a mismatch."""
    bench_fuzz = _harness()

    def matmul(a, b, out=None):
        if flaw == "writes_out_then_raises" and isinstance(out, np.ndarray) and out.size:
            out.reshape(-1)[:1] = 7   # (a view: out's first element)
            raise ValueError("planted")
        # (numpy gives a scalar for vector @ vector where cupy gives a 0-d array)
        result = np.asarray(np.matmul(a, b)) if out is None else np.matmul(a, b, out=out)
        if flaw == "scaled" and isinstance(result, np.ndarray) and result.size:
            result = result * 2
        return result

    def matmul_value_errors(a, b, out=None):
        try:
            return matmul(a, b, out)
        except Exception as exc:
            raise ValueError(str(exc)) from exc

    fake = types.SimpleNamespace(matmul=matmul_value_errors if flaw == "value_error" else matmul)
    maker = _numpy_maker()
    outcomes = {}
    for c in fuzz_cases.cases(SEED, 120, MAX_DIM, torch=False):
        if "bfloat16" in {getattr(x, "dtype", None) for x in (c.a, c.b)}:
            continue   # numpy has no bfloat16 matmul
        outcome, detail = bench_fuzz.run_cupy_case(c, maker, fake)
        outcomes.setdefault(outcome, []).append((c, detail))
    if flaw is None:
        assert "mismatch" not in outcomes, outcomes.get("mismatch")[:3]
        assert {"same result", "same error"} <= set(outcomes)
    else:
        assert "mismatch" in outcomes


def test_bfloat16_operands_have_an_fp32_reference():
    """bfloat16's numpy dtype has kind 'V', not 'f': its cases must still get the fp32
    product, so that a batch cupy.matmul cannot compute is judged against it ("cupy cannot")."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bench_fuzz = _harness()
    a = np.ones((2, 3, 4), dtype=ml_dtypes.bfloat16)
    b = np.ones((2, 4, 5), dtype=ml_dtypes.bfloat16)
    ref = bench_fuzz._fp32_reference(a, b, np)
    assert ref is not None and ref.dtype == np.float32 and (ref == 4).all()
    assert bench_fuzz._cupy_cannot(TypeError(bench_fuzz.CUPY_NO_BF16_BATCH), ref)
    assert bench_fuzz._fp32_reference(a, np.ones((2, 4, 5), dtype=np.int32), np) is None

import pytest


def _hopper_reason():
    """None when a Hopper GPU is usable, else why the GPU tier is skipped."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA GPU"
        props = cupy.cuda.runtime.getDeviceProperties(0)
        if (props["major"], props["minor"]) != (9, 0):
            return f"GPU is sm_{props['major']}{props['minor']}, not Hopper (sm_90)"
        return None
    except Exception as exc:  # no driver, no runtime
        return f"no usable CUDA GPU ({type(exc).__name__}: {exc})"


HOPPER_SKIP_REASON = _hopper_reason()
requires_hopper = pytest.mark.skipif(HOPPER_SKIP_REASON is not None,
                                     reason=str(HOPPER_SKIP_REASON))


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    """Each test session compiles into its own cache, so nothing stale is ever tested."""
    import os

    old = os.environ.get("HOPMM_CACHE_DIR")
    if old is None:
        os.environ["HOPMM_CACHE_DIR"] = str(tmp_path_factory.mktemp("hopmm-cache"))
    yield
    if old is None:
        os.environ.pop("HOPMM_CACHE_DIR", None)


@pytest.fixture
def heuristic_choice(monkeypatch):
    """The heuristic chooses (no schedule forced), and a call that would quietly fall back to
    cupy.matmul raises instead (HOPMM_STRICT)."""
    import hopmm

    monkeypatch.setenv("HOPMM_STRICT", "1")
    hopmm.use_schedule(None)
    yield
    hopmm.use_schedule(None)


@pytest.fixture(scope="session")
def kernel_matrix(_private_kernel_cache):
    """Every registered (schedule, config) for an H100, compiled for sm_90a with its SASS
    listing into the session's kernel cache once, in parallel processes. Tests that check
    kernels compile them again (a cache hit) and read their listings from the cache."""
    from hopmm import report
    from hopmm.device import H100_SXM

    cases = report.kernel_matrix(H100_SXM)
    report.fill_cache(cases)
    return cases


def pytest_collection_modifyitems(config, items):
    """Every test that needs the whole compiled kernel matrix is a `kernels` test."""
    for item in items:
        if "kernel_matrix" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kernels)

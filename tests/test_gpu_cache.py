"""GPU: kernels are loaded from the bytes hopmm verified, so a cache that cannot be written
(memory-only mode) still runs them, and the loader sets the kernel's shared-memory limit."""
import os

import pytest

import forced
from conftest import requires_hopper
from hopmm import compile as compiler
from hopmm import kernel_cache, launch
from hopmm.kernel_cache import CacheWarning


def _refuse(*args, **kwargs):
    raise OSError(30, "Read-only file system")


@requires_hopper
def test_a_cache_that_cannot_be_written_still_runs_kernels(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path / "cache"))
    # hopmm's writes only (CuPy may compile and cache kernels of its own meanwhile)
    monkeypatch.setattr(kernel_cache, "atomic_write", _refuse)
    monkeypatch.setattr(kernel_cache, "open", _refuse, raising=False)   # the lock files
    compiled_here = []

    def compile_now(schedule, config):   # past launch.compiled's memo: compiled here
        kernel = compiler.compile_schedule(schedule, config)
        compiled_here.append(kernel)
        return kernel

    monkeypatch.setattr(launch, "compiled", compile_now)
    compiler.clear_memo()
    kernel_cache.forget_reports()
    a, b = forced.operands(300, 520, 192, "bfloat16")
    with pytest.warns(CacheWarning, match="in memory only"):
        got, _ = forced.run(a, b, "persistent", 128)
    assert compiled_here and not compiled_here[0].cubin_path.exists()
    assert os.listdir(tmp_path / "cache") == []
    assert forced.rel_err(got.reshape(300, 520), a, b) < forced.TOL["bfloat16"]


@requires_hopper
def test_the_loader_sets_the_dynamic_shared_memory_limit():
    import cupy
    from cupy.cuda import driver

    from hopmm.device import query
    from hopmm.schedules import PersistentSchedule

    dev = query(cupy.cuda.Device().id)
    cfg = PersistentSchedule.deepest("bfloat16", 256, False, False, dev.smem_per_block_optin)
    info = launch.compiled(PersistentSchedule, cfg)
    smem = PersistentSchedule.smem_bytes(cfg)
    loaded = launch._loaded(str(info.cubin_path), info.name, smem, cupy.cuda.Device().id)
    assert driver.funcGetAttribute(
        driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, loaded.kernel.ptr) == smem

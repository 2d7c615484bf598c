"""CPU: the kernel cache is verified before anything in it is used. Damaged, foreign and
unsafe entries are reported once and rebuilt, never loaded; an unwritable cache still works in
memory; each kernel is compiled once per process, and once among processes sharing a cache.

Most tests use a stand-in compiler (a fake cubin and a real-looking ptxas log) so they run in
milliseconds; the compile-error test runs NVRTC itself."""
import errno
import hashlib
import json
import multiprocessing
import os
import stat
import tempfile
import threading
import time

import pytest

import hopmm
from hopmm import compile as compiler
from hopmm import kernel_cache, nvrtc, render, tuning
from hopmm.device import H100_SXM
from hopmm.kernel_cache import CacheWarning
from hopmm.problem import Problem

NAME = "hopmm_cache_test_kernel"
SOURCE = f'extern "C" __global__ void {NAME}() {{}}\n'
# Long enough for two processes' compiles to overlap if nothing kept them apart.
SLOW_COMPILE_S = 0.3
PROCESSES = 8
THREADS = 8
REAL_COMPILE = compiler._compile_with_report


def fake_log(name: str) -> str:
    return (f"ptxas info    : Compiling entry function '{name}' for 'sm_90a'\n"
            f"ptxas info    : Used 32 registers, used 0 barriers\n"
            f"ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")


def fake_cubin(source: str) -> bytes:
    return b"\x7fELF-fake-cubin-" + hashlib.sha256(source.encode()).digest() * 8


def fake_compile(name: str, source: str, delay_s: float = 0.0) -> nvrtc.CompileResult:
    time.sleep(delay_s)
    return nvrtc.CompileResult(cubin=fake_cubin(source), log=fake_log(name))


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """A cache and a temporary directory of this test's own; nothing remembered from before."""
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(compiler, "_compile_with_report", fake_compile)
    monkeypatch.setattr(tuning, "_table", tuning._Table())
    for forget in (compiler.clear_memo, kernel_cache.forget_reports,
                   kernel_cache.forget_resolved):
        forget()
    yield tmp_path
    for forget in (compiler.clear_memo, kernel_cache.forget_reports,
                   kernel_cache.forget_resolved):
        forget()


def kernel(name=NAME, source=SOURCE):
    return render.RenderedKernel(name=name, source=source, snippet_hashes={})


def compile_fresh(rendered=None):
    """Compiles as a new process would: nothing remembered in memory, the disk read again."""
    compiler.clear_memo()
    return compiler.compile_kernel(rendered or kernel())


def entry_files(k) -> dict:
    stem = k.cubin_path.with_suffix("")
    return {"cubin": k.cubin_path, "log": stem.with_name(stem.name + compiler.LOG_SUFFIX),
            "manifest": kernel_cache.manifest_path(stem)}


def assert_entry_verifies(k):
    stem = k.cubin_path.with_suffix("")
    entry = kernel_cache.read_entry(stem, compiler.ENTRY_PARTS)
    assert entry is not None and entry[compiler.CUBIN_SUFFIX] == fake_cubin(SOURCE)


def test_an_entry_is_written_with_its_hashes_and_read_back_without_compiling():
    first = compile_fresh()
    files = entry_files(first)
    manifest = json.loads(files["manifest"].read_text())
    assert manifest["sha256"][".cubin"] == hashlib.sha256(files["cubin"].read_bytes()).hexdigest()
    assert manifest["sha256"][".log"] == hashlib.sha256(files["log"].read_bytes()).hexdigest()
    before = compiler.compile_count
    again = compile_fresh()
    assert compiler.compile_count == before and again.cubin == first.cubin == fake_cubin(SOURCE)


def damage_flip(files):
    data = bytearray(files["cubin"].read_bytes())
    data[len(data) // 2] ^= 0xFF   # same size, one byte changed
    files["cubin"].write_bytes(bytes(data))


def damage_truncate(files):
    files["cubin"].write_bytes(files["cubin"].read_bytes()[:100])


def damage_garble_log(files):
    files["log"].write_bytes(b"\xff\xfe not a ptxas log")


def damage_garble_manifest(files):
    files["manifest"].write_text("{half a manifest")


def damage_foreign(files):
    """Someone else's cubin, with a manifest that matches it but is not hopmm's format."""
    foreign = b"\x7fELF someone else's code"
    files["cubin"].write_bytes(foreign)
    files["manifest"].write_text(json.dumps({"sha256": {
        ".cubin": hashlib.sha256(foreign).hexdigest()}}))


def damage_planted(files):
    """Files and no manifest: an interrupted write, or planted by someone."""
    files["manifest"].unlink()
    files["cubin"].write_bytes(b"\x7fELF planted")


def damage_symlink(files):
    target = files["cubin"].with_name("elsewhere.bin")
    target.write_bytes(files["cubin"].read_bytes())
    files["cubin"].unlink()
    files["cubin"].symlink_to(target)


def damage_group_writable(files):
    files["cubin"].chmod(0o664)


@pytest.mark.parametrize("damage", [damage_flip, damage_truncate, damage_garble_log,
                                    damage_garble_manifest, damage_foreign, damage_planted,
                                    damage_symlink, damage_group_writable],
                         ids=lambda f: f.__name__.removeprefix("damage_"))
def test_a_damaged_entry_is_reported_once_rebuilt_and_never_loaded(damage):
    files = entry_files(compile_fresh())
    damage(files)
    before = compiler.compile_count
    with pytest.warns(CacheWarning, match="damaged") as caught:
        rebuilt = compile_fresh()
    assert len(caught) == 1
    assert compiler.compile_count == before + 1          # compiled again, not loaded
    assert rebuilt.cubin == fake_cubin(SOURCE)
    assert compiler.cubin_of(str(rebuilt.cubin_path)) == fake_cubin(SOURCE)
    assert_entry_verifies(rebuilt)                        # and the entry replaced
    assert not stat.S_ISLNK(files["cubin"].lstat().st_mode)
    assert not files["cubin"].stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_the_loader_gets_the_verified_bytes_not_the_file():
    k = compile_fresh()
    k.cubin_path.write_bytes(b"swapped after the check")
    assert compiler.cubin_of(str(k.cubin_path)) == fake_cubin(SOURCE)
    with pytest.raises(KeyError):
        compiler.cubin_of(str(k.cubin_path.with_name("never-compiled.cubin")))


def test_a_cache_directory_others_can_write_is_refused(fresh):
    shared = fresh / "cache"
    shared.mkdir()
    shared.chmod(0o777)   # chmod, not mkdir's mode: the umask may not strip group/other write
    with pytest.warns(CacheWarning, match="writable by group or others") as caught:
        k = compile_fresh()
        compile_fresh(kernel("other_kernel", SOURCE.replace(NAME, "other_kernel")))
    assert len(caught) == 1                               # said once
    private = k.cubin_path.parent
    assert private != shared and private.parent == fresh / "tmp"
    assert stat.S_IMODE(private.stat().st_mode) == kernel_cache.PRIVATE_DIR_MODE
    assert list(shared.iterdir()) == []                   # nothing written where others write
    assert_entry_verifies(k)


def test_a_cache_directory_of_another_user_is_refused(fresh, monkeypatch):
    (fresh / "cache").mkdir()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(fresh).st_uid + 1)
    with pytest.warns(CacheWarning, match="owned by uid"):
        k = compile_fresh()
    assert k.cubin_path.parent != fresh / "cache"
    assert list((fresh / "cache").iterdir()) == []


def test_a_squatted_private_directory_is_not_used(fresh):
    (fresh / "cache").mkdir()
    (fresh / "cache").chmod(0o777)
    squatted = fresh / "tmp" / f"hopmm-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    with pytest.warns(CacheWarning):
        k = compile_fresh()
    assert k.cubin_path.parent not in (squatted, fresh / "cache")
    assert stat.S_IMODE(k.cubin_path.parent.stat().st_mode) == kernel_cache.PRIVATE_DIR_MODE


@pytest.mark.parametrize("error", [errno.EROFS, errno.ENOSPC])
def test_an_unwritable_cache_works_in_memory_and_says_so_once(fresh, monkeypatch, error):
    """Read-only or full: every write fails. Simulated, so that it also holds under root,
    whom a read-only mode does not stop."""
    def refuse(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    (fresh / "cache").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    for module in (kernel_cache, tuning):   # their lock files
        monkeypatch.setattr(module, "open", refuse, raising=False)
    with pytest.warns(CacheWarning, match="kept in memory only") as caught:
        first = compile_fresh()
        second = compiler.compile_kernel(
            kernel("other_kernel", SOURCE.replace(NAME, "other_kernel")))
        tuning.record({"some shape": tuning.TunedEntry("persistent", 256, 3, 16, 1.0, "d")})
    assert len(caught) == 1
    assert list((fresh / "cache").iterdir()) == []
    assert compiler.cubin_of(str(first.cubin_path)) == fake_cubin(SOURCE)
    assert second.cubin and second.report.registers == 32
    assert "some shape" in tuning._table.entries()       # autotune results kept in memory


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_really_read_only_directory(fresh):
    ro = fresh / "cache"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.warns(CacheWarning, match="kept in memory only"):
            k = compile_fresh()
        assert k.cubin == fake_cubin(SOURCE) and list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_a_corrupt_autotune_table_is_reported_once_never_used_and_replaced():
    problem = Problem(4096, 4096, 4096, 1, "bfloat16", "k", "n")
    key = tuning.problem_key(problem, H100_SXM)
    path = compiler.cache_dir() / tuning.TABLE_NAME
    good = {key: {"schedule": "persistent", "block_n": 256, "stages": 3, "raster_group": 8,
                  "tflops": 700.0, "when": "d"}}
    path.write_text(json.dumps(good)[:-7])   # truncated mid-entry
    with pytest.warns(CacheWarning, match="unreadable autotune table") as caught:
        assert tuning.lookup(problem, H100_SXM) is None
        assert tuning.lookup(problem, H100_SXM) is None
    assert len(caught) == 1
    tuning.record({"other": tuning.TunedEntry("persistent", 256, 3, 16, 1.0, "d")})
    assert set(json.loads(path.read_text())) == {"other"}   # rebuilt: valid JSON again


def test_a_group_writable_autotune_table_is_not_used():
    problem = Problem(4096, 4096, 4096, 1, "bfloat16", "k", "n")
    tuning.record({tuning.problem_key(problem, H100_SXM):
                   tuning.TunedEntry("persistent", 256, 3, 8, 700.0, "d")})
    assert tuning.lookup(problem, H100_SXM) is not None
    tuning.table_path().chmod(0o666)
    os.utime(tuning.table_path(), ns=(0, 1))   # a new stamp: the table is read again
    with pytest.warns(CacheWarning, match="writable by group or others"):
        assert tuning.lookup(problem, H100_SXM) is None


def test_threads_asking_for_one_kernel_compile_it_once(monkeypatch):
    monkeypatch.setattr(compiler, "_compile_with_report",
                        lambda name, source: fake_compile(name, source, SLOW_COMPILE_S))
    before = compiler.compile_count
    start = threading.Barrier(THREADS)
    results = []

    def ask():
        start.wait()
        results.append(compiler.compile_kernel(kernel()))

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiler.compile_count == before + 1
    assert len(results) == THREADS and all(r is results[0] for r in results)


def _compile_in_child(args):
    """A new process: the stand-in compiler, slow enough for all of them to overlap; returns
    (compiles it ran, SHA-256 of the cubin it got)."""
    cache, start_at = args
    os.environ["HOPMM_CACHE_DIR"] = cache
    from hopmm import compile as child_compiler

    child_compiler._compile_with_report = (
        lambda name, source: fake_compile(name, source, SLOW_COMPILE_S))
    time.sleep(max(0.0, start_at - time.time()))
    k = child_compiler.compile_kernel(kernel())
    return child_compiler.compile_count, hashlib.sha256(k.cubin).hexdigest()


def test_processes_on_an_empty_cache_compile_a_kernel_once_between_them(fresh):
    """Each waits on the entry's lock while one compiles, then reads its entry."""
    cache = str(fresh / "cache")
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        # A start time after every child has imported hopmm, so that they all ask at once.
        start_at = time.time() + 3.0
        results = pool.map(_compile_in_child, [(cache, start_at)] * PROCESSES)
    compiles = [count for count, _ in results]
    assert all(count <= 1 for count in compiles) and sum(compiles) == 1, compiles
    assert {digest for _, digest in results} == {hashlib.sha256(fake_cubin(SOURCE)).hexdigest()}
    assert_entry_verifies(compile_fresh())
    leftovers = [p.name for p in (fresh / "cache").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


class BrokenSchedule:
    """A schedule whose kernel does not compile."""
    name = "broken_schedule"

    @staticmethod
    def render(config):
        return render.RenderedKernel(
            name="hopmm_broken_kernel",
            source='extern "C" __global__ void hopmm_broken_kernel() { no_such_function(); }\n',
            snippet_hashes={})


def test_a_compile_error_names_the_schedule_the_config_and_the_log(monkeypatch):
    monkeypatch.setattr(compiler, "_compile_with_report", REAL_COMPILE)   # NVRTC itself
    config = ("a config", 128, 256)
    with pytest.raises(hopmm.KernelCompileError) as caught:
        compiler.compile_schedule(BrokenSchedule, config)
    message = str(caught.value)
    assert "broken_schedule" in message and "hopmm_broken_kernel" in message
    assert repr(config) in message or str(config) in message
    assert "no_such_function" in message and "no_such_function" in caught.value.log
    assert isinstance(caught.value, nvrtc.CompileError)
    assert caught.value.schedule == "broken_schedule" and caught.value.config == config
    assert not any(compiler.cache_dir().glob("hopmm_broken_kernel*.cubin"))


class _FakeDeviceArray:
    def __init__(self, n):
        self.nbytes = self.size = n


def test_workspaces_are_bounded_and_the_oldest_dropped_first(monkeypatch):
    """A program making streams without end holds at most MAX_WORKSPACES workspaces."""
    import sys
    import types

    from hopmm import workspace

    fake = types.SimpleNamespace(empty=lambda n, dtype: _FakeDeviceArray(n),
                                 zeros=lambda n, dtype: _FakeDeviceArray(n),
                                 uint8="uint8", uint32="uint32")
    monkeypatch.setitem(sys.modules, "cupy", fake)
    workspace.clear()
    first_stream = 1000   # far from the special handles (the per-thread default stream: 2)
    streams = range(first_stream, first_stream + workspace.MAX_WORKSPACES + 10)
    try:
        kept = [workspace.get(0, s, 64, 4) for s in streams]
        assert len(workspace._workspaces) == workspace.MAX_WORKSPACES
        assert (0, streams[0], None) not in workspace._workspaces
        assert (0, streams[-1], None) in workspace._workspaces
        assert workspace.get(0, streams[-1], 64, 4) is kept[-1]   # a hit reuses its pair
    finally:
        workspace.clear()


def test_every_listed_cache_reports_its_size_and_bounded_ones_their_bound():
    from hopmm import caches

    sizes, bounds = caches.sizes(), caches.bounds()
    assert set(bounds) <= set(sizes)
    assert all(isinstance(n, int) and n >= 0 for n in sizes.values())
    assert all(isinstance(n, int) and n > 0 for n in bounds.values())
    for name in sizes:   # every cache the code keeps is in the module's table
        assert name.split(".")[0] in caches.__doc__


def test_threads_loading_one_kernel_load_one_module(monkeypatch):
    """A second module would be dropped by the cache, and unloaded under the launches built
    from it."""
    import functools

    from hopmm import launch

    loads = []

    @functools.lru_cache(maxsize=None)
    def slow_load(*key):
        loads.append(key)
        time.sleep(SLOW_COMPILE_S)
        return object()

    monkeypatch.setattr(launch, "_loaded", slow_load)
    start = threading.Barrier(THREADS)
    got = []

    def load():
        start.wait()
        got.append(launch.loaded_kernel("k.cubin", "k", 0, 0))

    threads = [threading.Thread(target=load) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(got) == THREADS and all(g is got[0] for g in got)

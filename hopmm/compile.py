"""Rendered kernel -> checked sm_90a cubin, cached on disk by the hash of its source.

The cache key is the hash of the full rendered source (snippets inlined), the NVRTC options
and the NVRTC version, so an edited snippet can never be served a stale cubin. What is read
back from the cache is verified first (kernel_cache.py); each kernel is compiled at most once
per process, and across processes one compiles while the others wait for its entry.
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import kernel_cache, nvrtc, render

# hopmm calls NVRTC itself (CuPy's compiler would append its own -arch=sm_90). Every kernel
# holds wgmma and setmaxnreg, which ptxas accepts for sm_90a only, so a successful compile is
# itself proof of the target; the CPU tests also read "code for sm_90a" from the SASS.
ARCH_OPTION = "-arch=sm_90a"
NVRTC_OPTIONS = (ARCH_OPTION, "-std=c++17", "--ptxas-options=-v", "-diag-suppress=177")

# ptxas diagnostics that mean a kernel silently lost what it was written for. ptxas prints
# some of them as "info" lines ("ptxas info : (C7508) Potential Performance Loss: ..."), so
# every line is searched for the codes, whatever its level.
FATAL_PTXAS_WARNINGS = {
    "C7508": "setmaxnreg ignored (no register cap at kernel entry)",
    "C7510": "wgmma serialized",
    "C7511": "wgmma serialized",
    "C7514": "wgmma serialized (accumulators read inside a wgmma pipeline stage)",
    "C7515": "wgmma serialized",
    "C7517": "warpgroup.wait injected (wgmma serialized)",
    "C7519": "warpgroup.arrive injected (wgmma serialized)",
}

_REGISTERS = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_WARNING_CODE = re.compile(r"\((C\d{4})\)")

CUBIN_SUFFIX = ".cubin"
LOG_SUFFIX = ".log"
ENTRY_PARTS = (CUBIN_SUFFIX, LOG_SUFFIX)


def _function_section(log: str, function: str | None) -> str:
    """The lines of a ptxas log about one kernel (from its "Compiling entry function" line to
    the next one), or the whole log if it names no such kernel."""
    start = log.find(f"Compiling entry function '{function}'") if function else -1
    if start < 0:
        return log
    end = log.find("Compiling entry function", start + 1)
    return log[start:] if end < 0 else log[start:end]


class ResourceError(RuntimeError):
    """A compiled kernel breaks a resource rule (spills, shared memory, serialized wgmma)."""


@dataclass(frozen=True)
class ResourceReport:
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    warnings: tuple  # ptxas lines that carry a diagnostic code (C....) or say "warning"

    @classmethod
    def parse(cls, log: str, function: str | None = None) -> "ResourceReport":
        """Reads the report of `function` (the log's only or first kernel when None); the
        diagnostics of every line count."""
        section = _function_section(log, function)
        regs = _REGISTERS.search(section)
        frame = _FRAME.search(section)
        if not regs or not frame:
            raise ResourceError(f"no ptxas resource report in the compile log:\n{log}")
        warnings = tuple(line.strip() for line in log.splitlines()
                         if _WARNING_CODE.search(line) or "warning" in line.lower())
        return cls(int(regs.group(1)), *(int(x) for x in frame.groups()), warnings)

    def problems(self, smem_bytes: int, smem_limit: int) -> list[str]:
        out = []
        if self.spill_stores or self.spill_loads or self.stack_frame:
            out.append(f"local memory used: {self.stack_frame} B stack, {self.spill_stores} B "
                       f"spill stores, {self.spill_loads} B spill loads")
        if smem_bytes > smem_limit:
            out.append(f"shared memory {smem_bytes} B exceeds the {smem_limit} B limit")
        for line in self.warnings:
            for code in _WARNING_CODE.findall(line):
                if code in FATAL_PTXAS_WARNINGS:
                    out.append(f"{FATAL_PTXAS_WARNINGS[code]}: {line}")
        return out


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    cubin_path: Path       # where the entry lies in the cache (absent in memory-only mode)
    report: ResourceReport
    source_hash: str
    cubin: bytes = field(default=b"", repr=False, compare=False)  # the verified content


class KernelCompileError(nvrtc.CompileError):
    """NVRTC rejected a kernel hopmm rendered. Names the schedule, the config and the kernel,
    and carries the compiler log (`log`)."""

    def __init__(self, kernel: str, log: str, schedule: str | None = None, config=None):
        self.kernel, self.schedule, self.config = kernel, schedule, config
        what = f"kernel {kernel}"
        if schedule is not None:
            what += f" of schedule {schedule!r}"
        if config is not None:
            what += f" with config {config}"
        super().__init__(f"hopmm could not compile {what}; compiler log:\n{log}", log)


# The kernels of this process, by (name, source): _compiled holds those done, _compiling the
# lock of the thread building one. Bounded by the set of kernels hopmm can render.
_compiled: dict = {}
_compiling: dict = {}
_memo_lock = threading.Lock()
compile_count = 0   # compiles this process ran (the reliability checks read it)


def cache_dir(create: bool = True) -> Path:
    return kernel_cache.cache_dir(create)


def atomic_write(path: Path, data: bytes) -> None:
    kernel_cache.atomic_write(path, data)


def cache_key(kernel: render.RenderedKernel, options=NVRTC_OPTIONS) -> str:
    """Names the entry; the cache's format is part of it, so files of an older layout (with
    no manifest) are never looked at rather than each reported as foreign."""
    major, minor = nvrtc.version()
    return render.sha256("\n".join([kernel.source, *options, f"nvrtc {major}.{minor}",
                                     kernel_cache.MANIFEST_FORMAT]))[:40]


def _compile_with_report(name: str, source: str) -> nvrtc.CompileResult:
    """Compiles `source`, making sure the ptxas report comes with it. NVRTC (12.9 and later)
    keeps its own cache of compiled programs, and on a hit it returns the cubin with an empty
    log (seen on the GPU machine: the same source compiled twice in one process). Then the
    source is compiled once more with an empty kernel of a name used once: a program NVRTC
    has not seen, whose log reports every kernel in it. The cubin of the first compile is
    kept; the report is read from the section of the log about kernel `name`."""
    result = nvrtc.compile_cubin(source, f"{name}.cu", NVRTC_OPTIONS)
    if _REGISTERS.search(result.log):
        return result
    marker = f'\nextern "C" __global__ void hopmm_report_{os.urandom(8).hex()}() {{}}\n'
    again = nvrtc.compile_cubin(source + marker, f"{name}.cu", NVRTC_OPTIONS)
    return nvrtc.CompileResult(cubin=result.cubin, log=again.log)


def _run_compiler(name: str, source: str) -> nvrtc.CompileResult:
    global compile_count
    if os.environ.get("HOPMM_DUMP_SOURCE"):
        Path(os.environ["HOPMM_DUMP_SOURCE"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["HOPMM_DUMP_SOURCE"]) / f"{name}.cu").write_text(source)
    with _memo_lock:
        compile_count += 1
    try:
        return _compile_with_report(name, source)
    except nvrtc.CompileError as exc:
        raise KernelCompileError(name, getattr(exc, "log", str(exc))) from exc


def _from_entry(name: str, stem: Path, entry: dict, source: str) -> CompiledKernel:
    """The kernel of a verified entry; DamagedEntry where its log holds no report of it."""
    try:
        report = ResourceReport.parse(entry[LOG_SUFFIX].decode(), name)
    except (UnicodeDecodeError, ResourceError) as exc:
        raise kernel_cache.DamagedEntry(f"log unreadable: {exc}") from exc
    if not entry[CUBIN_SUFFIX]:
        raise kernel_cache.DamagedEntry("empty cubin")
    return CompiledKernel(name, stem.with_name(stem.name + CUBIN_SUFFIX), report,
                          render.sha256(source), entry[CUBIN_SUFFIX])


def _load_entry(name: str, stem: Path, source: str) -> CompiledKernel | None:
    """The cached kernel at `stem`; None if there is none; DamagedEntry if it is damaged."""
    entry = kernel_cache.read_entry(stem, ENTRY_PARTS)
    return None if entry is None else _from_entry(name, stem, entry, source)


def _build(name: str, source: str) -> CompiledKernel:
    """Reads the kernel from the cache or compiles it and stores it. Across processes, one
    compiles while the others wait on the entry's lock and then read what it wrote."""
    key = cache_key(render.RenderedKernel(name=name, source=source, snippet_hashes={}))
    stem = kernel_cache.cache_dir() / f"{name}-{key}"
    try:
        found = _load_entry(name, stem, source)
        if found is not None:
            return found
    except kernel_cache.DamagedEntry:
        pass   # perhaps mid-write by another process: judged again under the lock
    with kernel_cache.entry_lock(stem) as locked:
        if locked:
            try:
                found = _load_entry(name, stem, source)
                if found is not None:
                    return found
            except kernel_cache.DamagedEntry as exc:
                kernel_cache.warn_once(("damaged", str(stem)), f"hopmm: kernel cache entry "
                                       f"{stem.name} is damaged ({exc}); compiling it again")
        result = _run_compiler(name, source)
        kernel = CompiledKernel(name, stem.with_name(stem.name + CUBIN_SUFFIX),
                                ResourceReport.parse(result.log, name), render.sha256(source),
                                result.cubin)
        try:
            kernel_cache.write_entry(stem, {CUBIN_SUFFIX: result.cubin,
                                            LOG_SUFFIX: result.log.encode()})
        except OSError as exc:
            kernel_cache.report_unwritable(stem.parent, exc)
        return kernel


def _compile_cached(name: str, source: str) -> CompiledKernel:
    """Each kernel compiled (or read from disk) at most once per process: a second thread
    asking for a kernel being compiled waits for it."""
    key = (name, source)
    found = _compiled.get(key)
    if found is not None:
        return found
    with _memo_lock:
        found = _compiled.get(key)
        if found is not None:
            return found
        lock = _compiling.setdefault(key, threading.Lock())
    with lock:
        found = _compiled.get(key)
        if found is None:
            found = _build(name, source)
            with _memo_lock:
                _compiled[key] = found
                _by_path[str(found.cubin_path)] = found
                _compiling.pop(key, None)
        return found


def clear_memo() -> None:
    """Forgets the kernels of this process (tests): the next request reads the cache again.
    The loader's bytes (_by_path) stay: launch.compiled may still hand out those kernels."""
    with _memo_lock:
        _compiled.clear()


# cubin path -> the latest CompiledKernel of that path, for the loader (launch._loaded), which
# is keyed by path. Bounded like _compiled.
_by_path: dict = {}


def cubin_of(cubin_path: str) -> bytes:
    """The verified content of a kernel this process compiled or read, by its cache path."""
    kernel = _by_path.get(str(cubin_path))
    if kernel is None:
        raise KeyError(f"{cubin_path} is no kernel this process compiled or verified")
    return kernel.cubin


def cached_cubin(kernel: render.RenderedKernel) -> Path | None:
    """The cubin path of a verified cache entry of `kernel`, None where compile_kernel would
    compile it (no entry, or a damaged one)."""
    stem = kernel_cache.cache_dir() / f"{kernel.name}-{cache_key(kernel)}"
    try:
        found = _load_entry(kernel.name, stem, kernel.source)
    except kernel_cache.DamagedEntry:
        return None
    return None if found is None else found.cubin_path


def compile_kernel(kernel: render.RenderedKernel) -> CompiledKernel:
    return _compile_cached(kernel.name, kernel.source)


def compile_schedule(schedule, config) -> CompiledKernel:
    """The kernel of `schedule` at `config`; KernelCompileError names both on failure."""
    kernel = schedule.render(config)
    try:
        return compile_kernel(kernel)
    except KernelCompileError as exc:
        raise KernelCompileError(kernel.name, exc.log, schedule.name, config) from exc

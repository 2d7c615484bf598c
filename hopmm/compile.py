"""Rendered kernel -> checked sm_90a cubin, cached on disk by the hash of its source.

The cache key is the hash of the full rendered source (snippets inlined), the NVRTC options
and the NVRTC version, so an edited snippet can never be served a stale cubin.
"""
from __future__ import annotations

import functools
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import nvrtc, render

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


CACHE_FILE_MODE = 0o644


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
    cubin_path: Path
    report: ResourceReport
    source_hash: str


def cache_dir(create: bool = True) -> Path:
    """HOPMM_CACHE_DIR, else ~/.cache/hopmm; made on the way unless `create` is False (the
    per-call lookup of the autotune table only reads, and a mkdir per call costs ~20 us)."""
    root = os.environ.get("HOPMM_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "hopmm"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Several processes may compile the same kernel: write aside, then rename into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, CACHE_FILE_MODE)  # mkstemp makes 0600; a cache directory may be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cache_key(kernel: render.RenderedKernel, options=NVRTC_OPTIONS) -> str:
    major, minor = nvrtc.version()
    return render.sha256("\n".join([kernel.source, *options, f"nvrtc {major}.{minor}"]))[:40]


def _cached_report(name: str, cubin_path: Path, log_path: Path) -> ResourceReport | None:
    """The report of a complete cache entry; None for a missing, partial or unreadable one
    (another process mid-write, an interrupted run, a foreign file), which is recompiled."""
    try:
        if cubin_path.stat().st_size == 0:
            return None
        return ResourceReport.parse(log_path.read_text(), name)
    except (OSError, ValueError, ResourceError):
        return None


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


def _cubin_path(kernel: render.RenderedKernel) -> Path:
    return cache_dir() / f"{kernel.name}-{cache_key(kernel)}.cubin"


def cached_cubin(kernel: render.RenderedKernel) -> Path | None:
    """The cubin of a complete cache entry of `kernel`, None where compile_kernel would
    compile it."""
    cubin_path = _cubin_path(kernel)
    found = _cached_report(kernel.name, cubin_path, cubin_path.with_suffix(".log"))
    return None if found is None else cubin_path


@functools.lru_cache(maxsize=None)
def _compile_cached(name: str, source: str) -> CompiledKernel:
    kernel = render.RenderedKernel(name=name, source=source, snippet_hashes={})
    cubin_path = _cubin_path(kernel)
    log_path = cubin_path.with_suffix(".log")
    report = _cached_report(name, cubin_path, log_path)
    if report is None:
        if os.environ.get("HOPMM_DUMP_SOURCE"):
            Path(os.environ["HOPMM_DUMP_SOURCE"]).mkdir(parents=True, exist_ok=True)
            (Path(os.environ["HOPMM_DUMP_SOURCE"]) / f"{name}.cu").write_text(source)
        result = _compile_with_report(name, source)
        report = ResourceReport.parse(result.log, name)
        # The cubin first, the log last: a readable log marks a complete entry.
        atomic_write(cubin_path, result.cubin)
        atomic_write(log_path, result.log.encode())
    return CompiledKernel(name=name, cubin_path=cubin_path, report=report,
                          source_hash=render.sha256(source))


def compile_kernel(kernel: render.RenderedKernel) -> CompiledKernel:
    return _compile_cached(kernel.name, kernel.source)

"""Reads the machine code of a cubin (cuobjdump) to confirm the instructions a kernel was
written for are really there: HGMMA (wgmma), UTMALDG / UTMASTG (TMA), no LDL / STL."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .compile import atomic_write

_OPCODES = {
    "hgmma": re.compile(r"\bHGMMA\."),
    "tma_load": re.compile(r"\bUTMALDG\b"),
    "tma_store": re.compile(r"\bUTMASTG\b"),
    "stmatrix": re.compile(r"\bSTSM\b"),
    "local_memory": re.compile(r"\b(LDL|STL)\b"),
    "setmaxnreg": re.compile(r"\bUSETMAXREG\b"),
    "tma_multicast": re.compile(r"\bUTMALDG\.[\w.]*MULTICAST\b"),   # counted in tma_load too
    "cluster_barrier": re.compile(r"\bUCGABAR_(ARV|WAIT)\b"),
    "remote_arrive": re.compile(r"\bSYNCS\.ARRIVE\.TRANS64\.RED\b"),  # mbarrier on a peer CTA
    "dependency_wait": re.compile(r"\bACQBULK\b"),      # griddepcontrol.wait
    "launch_dependents": re.compile(r"\bPREEXIT\b"),    # griddepcontrol.launch_dependents
}
# Opcodes that read or write global memory: TMA and bulk copies / reductions, plain and
# atomic loads and stores.
_GLOBAL_ACCESS = {"UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP", "UBLKRED", "LDG", "STG", "ATOMG",
                  "ATOM", "RED"}
# An instruction line: its offset, an optional predicate, then the opcode (up to its first '.').
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_ARCH = re.compile(r"code for (sm_\w+)")
# A listing kept beside its cubin (cached_listing) is named by this many hex digits of the
# cubin's SHA-256: a cubin replaced by another can never be served the old one's listing.
LISTING_HASH_DIGITS = 16


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, under CUDA_HOME, or from the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [Path(os.environ[v]) / "bin" / "cuobjdump"
                  for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for entry in sys.path:
        candidates += list(Path(entry).glob("nvidia/cu*/bin/cuobjdump")) if entry else []
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


@dataclass(frozen=True)
class SassSummary:
    arch: str
    counts: dict

    @property
    def ok(self) -> bool:
        c = self.counts
        return (self.arch == "sm_90a" and c["hgmma"] > 0 and c["tma_load"] > 0
                and c["tma_store"] > 0 and c["local_memory"] == 0)


def disassemble(cubin_path: Path, tool: str | None = None) -> str:
    """The cubin's SASS listing."""
    tool = tool or find_cuobjdump()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: `pip install nvidia-cuda-cuobjdump`")
    done = subprocess.run([tool, "-sass", str(cubin_path)], capture_output=True, text=True)
    if done.returncode != 0:
        hint = (" (`pip install nvidia-cuda-nvdisasm`: cuobjdump runs it)"
                if "nvdisasm" in done.stderr else "")
        raise RuntimeError(f"{tool} -sass {cubin_path} failed{hint}: {done.stderr.strip()}")
    return done.stdout


def listing_path(cubin_path: Path) -> Path:
    """Where cached_listing keeps the listing of this cubin's present contents."""
    cubin_path = Path(cubin_path)
    digest = hashlib.sha256(cubin_path.read_bytes()).hexdigest()[:LISTING_HASH_DIGITS]
    return cubin_path.with_name(f"{cubin_path.stem}.{digest}.sass")


def cached_listing(cubin_path: Path, tool: str | None = None) -> str:
    """`disassemble`, kept in a file beside the cubin (in the kernel cache): reading a listing
    takes cuobjdump and nvdisasm about as long as compiling the kernel took NVRTC, and every
    check of a kernel (and every process checking it) reads the same one."""
    path = listing_path(cubin_path)
    try:
        return path.read_text()
    except FileNotFoundError:
        pass
    listing = disassemble(cubin_path, tool)
    atomic_write(path, listing.encode())
    return listing


# {listing path: SassSummary}: the summaries of cached listings read in this process. Counting
# the opcodes of a listing (about 300 KB) takes a quarter of a second.
_summaries: dict = {}


def cached_summary(cubin_path: Path, tool: str | None = None) -> SassSummary:
    """summarize_listing(cached_listing(...)), once per cubin's contents in a process."""
    path = listing_path(cubin_path)
    if path not in _summaries:
        _summaries[path] = summarize_listing(cached_listing(cubin_path, tool))
    return _summaries[path]


def global_access_before_dependency_wait(listing: str) -> list[str]:
    """Instructions of a one-kernel SASS listing that touch global memory at a lower address
    than its first griddepcontrol.wait (all of them if it has none). A programmatically
    launched kernel may run beside the previous kernel of its stream until that wait."""
    wait = None
    accesses = []
    for line in listing.splitlines():
        ins = _INSTRUCTION.search(line)
        if ins is None:
            continue
        offset, opcode = int(ins.group(1), 16), ins.group(2)
        if wait is None and opcode == "ACQBULK":
            wait = offset
        elif opcode in _GLOBAL_ACCESS:
            accesses.append((offset, line.strip()))
    return [text for at, text in accesses if wait is None or at < wait]


def summarize(cubin_path: Path, tool: str | None = None) -> SassSummary:
    return summarize_listing(disassemble(cubin_path, tool))


def summarize_listing(listing: str) -> SassSummary:
    """The architecture and the counts of _OPCODES in a SASS listing."""
    arch = _ARCH.search(listing)
    counts = {name: len(rx.findall(listing)) for name, rx in _OPCODES.items()}
    return SassSummary(arch=arch.group(1) if arch else "unknown", counts=counts)

"""CPU: the probe kernels in bench/probes still compile for sm_90a against the snippets they
include from csrc/hopmm, each entry without spills (a probe that silently stopped building
would measure nothing)."""
import re
from pathlib import Path

from hopmm import compile as compiler, nvrtc

ROOT = Path(__file__).resolve().parent.parent
SKINNY_ENTRIES = {f"rk_{dtype}_{width}" for dtype in ("bf16", "f16") for width in (32, 64, 128)}


def test_skinny_in_place_probe_compiles_without_spills():
    source = (ROOT / "bench" / "probes" / "skinny_in_place.cu").read_text()
    options = compiler.NVRTC_OPTIONS + (f"-I{ROOT / 'csrc' / 'hopmm'}",)
    result = nvrtc.compile_cubin(source, "skinny_in_place.cu", options)
    assert result.cubin
    entries = re.findall(r"Compiling entry function '(\w+)'", result.log)
    assert set(entries) == SKINNY_ENTRIES | {"to_16bit"}
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.log)
    assert len(spills) == len(entries) and all(s == ("0", "0") for s in spills)

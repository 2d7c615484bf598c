"""CPU: the probe kernels in bench/probes still compile for sm_90a (against the snippets they
include from csrc/hopmm, where they do), each entry without spills (a probe that silently
stopped building would measure nothing)."""
import re
from pathlib import Path

from hopmm import compile as compiler, nvrtc

ROOT = Path(__file__).resolve().parent.parent
SKINNY_ENTRIES = {f"rk_{dtype}_{width}" for dtype in ("bf16", "f16") for width in (32, 64, 128)}


def entries_without_spills(result) -> set:
    """The entry functions of a compile (a cubin came out), each checked to spill nothing."""
    assert result.cubin
    entries = re.findall(r"Compiling entry function '(\w+)'", result.log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.log)
    assert len(spills) == len(entries) and all(s == ("0", "0") for s in spills)
    return set(entries)


def test_skinny_in_place_probe_compiles_without_spills():
    source = (ROOT / "bench" / "probes" / "skinny_in_place.cu").read_text()
    options = compiler.NVRTC_OPTIONS + (f"-I{ROOT / 'csrc' / 'hopmm'}",)
    result = nvrtc.compile_cubin(source, "skinny_in_place.cu", options)
    assert entries_without_spills(result) == SKINNY_ENTRIES | {"to_16bit"}


def test_sm_placement_probe_compiles_without_spills():
    """Its kernels are compiled by CuPy on the GPU machine only: NVRTC here checks them first."""
    text = (ROOT / "bench" / "probes" / "sm_placement.py").read_text()
    source = re.search(r'SOURCE = r"""(.*?)"""', text, re.DOTALL).group(1)
    result = nvrtc.compile_cubin(source, "sm_placement.cu", compiler.NVRTC_OPTIONS)
    assert entries_without_spills(result) == {"read_smids", "stream_read"}

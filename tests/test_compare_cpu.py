"""CPU-only tests for the pure parts of bench/compare.py (forced kernels against cuBLAS,
interleaved and alone)."""
import importlib.util
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
_spec = importlib.util.spec_from_file_location("hopmm_compare_under_test", BENCH_DIR / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def test_parse_kernel():
    spec = compare.parse_kernel("persistent_overlap/128x192/4")
    assert spec == compare.KernelSpec("persistent_overlap", (128, 192), 4)
    assert spec.label == "persistent_overlap/128x192/4"
    assert compare.parse_kernel(" persistent_cluster/192X192/16 ").tile == (192, 192)


@pytest.mark.parametrize("text, message", [
    ("persistent/128x256", "schedule/BMxBN/group"),
    ("nosuch/128x256/16", "unknown schedule"),
    ("persistent/128x200/16", "128x128, 128x192, 128x256"),
    ("persistent/192x192/16", "tiles"),            # the tall tile is the cluster kernel's
    ("persistent/128xabc/16", "BMxBN"),
    ("persistent/128x256/0", "at least 1"),
    ("split_k/128x128/16", "split count"),
    ("split_k_cluster/128x128/16", "split count"),
])
def test_parse_kernel_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        compare.parse_kernel(text)


def test_shapes_must_be_read_in_place():
    assert compare.parse_shape("3000x3000x3000") == (3000, 3000, 3000)   # 6000-byte rows
    with pytest.raises(ValueError, match="multiples of 8"):
        compare.parse_shape("1000x1023x4096")
    with pytest.raises(ValueError, match="multiples of 8"):
        compare.parse_shape("1000x1024x4097")


def test_cli_rejects_a_bad_kernel_with_its_reason(capsys):
    with pytest.raises(SystemExit):
        compare.main(["4096x4096x4096", "persistent/128x100/16"])
    assert "persistent computes tiles" in capsys.readouterr().err


def test_ratios_are_to_the_faster_cublas_of_the_same_timing():
    got = compare.ratios({"cupy": 2.0, "torch": 1.6, "k": 1.5})
    assert got == pytest.approx({"cupy": 0.8, "torch": 1.0, "k": 1.6 / 1.5})
    assert compare.ratios({"cupy": 2.0, "k": 4.0})["k"] == pytest.approx(0.5)


def test_format_table_shows_both_timings():
    text = compare.format_table("=== t", {"cupy": 100e-6, "torch": 110e-6, "k": 95e-6},
                                {"cupy": 100e-6, "torch": 100e-6, "k": 102e-6})
    lines = text.splitlines()
    assert lines[0] == "=== t" and len(lines) == 6
    assert lines[5].split() == ["k", "95.0", "1.053", "102.0", "0.980"]

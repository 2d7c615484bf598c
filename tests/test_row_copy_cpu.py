"""CPU: hopmm's row-copy kernel (row_copy.py) renders and compiles for sm_90a without spills,
its SASS moves aligned chunks in 16-byte accesses, and the jobs it cannot take are declined."""
import pytest

from hopmm import row_copy, sass
from hopmm.device import H100_SXM


@pytest.fixture(scope="module")
def kernel():
    return row_copy.compiled()


def test_resources(kernel):
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0
    assert r.problems(0, H100_SXM.smem_per_block_optin) == []


def test_sass(kernel):
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    listing = sass.cached_listing(kernel.cubin_path, tool)
    summary = sass.summarize_listing(listing)
    assert summary.arch == "sm_90a" and summary.counts["local_memory"] == 0
    assert "LDG.E.128" in listing and "STG.E.128" in listing   # whole chunks where aligned
    assert "LDG.E.U16" in listing and "STG.E.U16" in listing   # elements where not


def test_jobs_that_do_not_fit_the_kernel_are_declined():
    """Pitches and extents are the kernel's 32-bit integers; a row wider than a pitch is no
    copy. The launcher declines such jobs (None) before compiling anything."""
    wide = row_copy.RowJob(rows=4, width=2**31, src_pitch=2**31, dst_pitch=2**31, pad=False)
    assert not wide.fits()
    assert not row_copy.RowJob(rows=4, width=9, src_pitch=8, dst_pitch=16, pad=True).fits()
    assert row_copy.RowJob(rows=4, width=9, src_pitch=9, dst_pitch=16, pad=True).fits()
    # A padded destination needs room for each row's last whole chunk; the caller's rows not.
    assert not row_copy.RowJob(rows=4, width=9, src_pitch=9, dst_pitch=12, pad=True).fits()
    assert row_copy.RowJob(rows=4, width=9, src_pitch=16, dst_pitch=12, pad=False).fits()
    assert row_copy.launcher([wide], 0, H100_SXM.sm_count) is None
    assert row_copy.launcher([], 0, H100_SXM.sm_count) is None

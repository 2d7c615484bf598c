"""hopmm's row-copy kernel (csrc/hopmm/copy_rows.cuh): the aligned copies of a repeated call's
operands, both in one launch, and the copy of its result out of an aligned buffer. A repeat
of such a call issued each copy as a cudaMemcpy2DAsync (5-7 us of host time apiece) into an
allocation of its own and was bound by its host; with one scratch allocation and this kernel
its host time fell from ~57 to 18-23 us (bench/NOTES.md v0.23)."""
from __future__ import annotations

import functools
from typing import NamedTuple

from . import compile as compiler
from . import render

KERNEL_NAME = "hopmm_copy_rows"
THREADS = 256
# Resident CTAs per SM the grid-stride loop asks for: enough 16-byte chunks in flight to
# stream at the copy bandwidth, few enough that small copies launch few idle CTAs.
BLOCKS_PER_SM = 8
MAX_JOBS = 2          # copies per launch (the kernel's blockIdx.y)
CHUNK = 8             # elements a thread moves (copy_rows.cuh's kCopyChunk)
POINTERS = 2 * MAX_JOBS   # (source, destination) per copy, unused ones 0
ELEM_BYTES = 2        # 16-bit elements only: the kernels' operand types
INT32_MAX = 2**31 - 1


class RowJob(NamedTuple):
    """One copy: `rows` rows of `width` elements, `src_pitch` / `dst_pitch` elements apart.
    `pad`: the destination is one of hopmm's padded buffers, whose rows the kernel fills with
    zeros to the end of their last 16-byte chunk; else it writes the rows' elements only."""
    rows: int
    width: int
    src_pitch: int
    dst_pitch: int
    pad: bool

    def fits(self) -> bool:
        """Whether the kernel's 32-bit arguments hold it (and a padded destination has room
        for each row's last whole chunk)."""
        room = -(-self.width // CHUNK) * CHUNK if self.pad else self.width
        return (all(0 <= v <= INT32_MAX for v in self) and self.width <= self.src_pitch
                and room <= self.dst_pitch)

    @property
    def chunks(self) -> int:
        return self.rows * -(-self.width // CHUNK)


JOB_INTS = len(RowJob._fields)   # the kernel's int32 arguments per job


def rendered() -> render.RenderedKernel:
    return render.render_kernel(KERNEL_NAME, ["copy_rows.cuh"], {}, {"THREADS": THREADS},
                                entry="copy_rows_entry.cu.in")


@functools.lru_cache(maxsize=None)
def compiled() -> compiler.CompiledKernel:
    return compiler.compile_kernel(rendered())


def loaded(device_id: int):
    """The kernel loaded on `device_id` (launch.loaded_kernel: once per device)."""
    from . import launch

    kernel = compiled()
    return launch.loaded_kernel(str(kernel.cubin_path), kernel.name, 0, device_id)


def launcher(jobs: list[RowJob], device_id: int, sm_count: int):
    """A KernelLaunch of the copy kernel doing `jobs` (one or two), launched as
    launch(stream, src0, dst0, src1, dst1) with byte addresses (0 for a missing second
    job); None where a job does not fit the kernel's arguments."""
    from ._tensormap import KernelLaunch

    if not 1 <= len(jobs) <= MAX_JOBS or not all(job.fits() for job in jobs):
        return None
    kernel = loaded(device_id).kernel
    ints = [int(v) for job in jobs for v in job] + [0] * (JOB_INTS * (MAX_JOBS - len(jobs)))
    blocks = min(max(-(-job.chunks // THREADS) for job in jobs), sm_count * BLOCKS_PER_SM)
    return KernelLaunch(kernel.ptr, (max(blocks, 1), len(jobs), 1), THREADS, 0, [],
                        ints, pointers=POINTERS)

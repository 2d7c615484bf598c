"""How many CTAs of one kernel an SM of a Hopper GPU holds at once: the least of what its
registers, threads, CTA slots and shared memory allow, each counted in the units the hardware
allocates (the CUDA C Programming Guide's table for compute capability 9.0, as the CUDA
occupancy calculator applies it)."""
from __future__ import annotations

from .schedules import REGISTER_FILE, WARP_THREADS

SM_MAX_THREADS = 2048
SM_MAX_CTAS = 32
# The register file (REGISTER_FILE 32-bit registers per SM) in four quarters, one per warp
# scheduler; a warp's registers come whole from one quarter, in units of REGISTER_UNIT.
SM_QUARTERS = 4
REGISTER_UNIT = 256
# Shared memory: allocated per CTA in units of SMEM_UNIT, plus CTA_RESERVED_SMEM the system
# keeps for each CTA; an SM has its largest CTA's opt-in limit plus that reserve (228 KB and
# 227 KB on Hopper).
SMEM_UNIT = 128
CTA_RESERVED_SMEM = 1024


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def resident_ctas_per_sm(registers: int, threads: int, smem_bytes: int,
                         smem_per_block_optin: int) -> int:
    """CTAs of `threads` threads, `registers` registers a thread and `smem_bytes` of shared
    memory each that one SM runs at once (0 where one does not fit)."""
    if threads <= 0 or registers <= 0:
        raise ValueError(f"threads and registers must be positive, got {threads}, {registers}")
    warps = -(-threads // WARP_THREADS)
    warp_registers = _round_up(registers * WARP_THREADS, REGISTER_UNIT)
    warps_by_registers = (REGISTER_FILE // SM_QUARTERS // warp_registers) * SM_QUARTERS
    by_registers = warps_by_registers // warps
    by_threads = SM_MAX_THREADS // (warps * WARP_THREADS)
    sm_smem = smem_per_block_optin + CTA_RESERVED_SMEM
    by_smem = sm_smem // (_round_up(smem_bytes, SMEM_UNIT) + CTA_RESERVED_SMEM)
    return min(by_registers, by_threads, SM_MAX_CTAS, by_smem)

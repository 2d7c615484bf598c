"""The CPU report of `python -m hopmm`: every registered schedule x config rendered,
compiled for sm_90a and checked (registers, shared memory, spills, SASS contents)."""
from __future__ import annotations

from dataclasses import dataclass

from . import compile as compiler
from . import sass
from .device import DeviceInfo
from .schedules import SCHEDULES

# A cluster kernel meets its peers twice: after the mbarrier init and before exit.
CLUSTER_BARRIERS = 2
# A kernel whose cluster is shaped at launch (split_k_cluster) meets its peers twice too: once
# its partials are staged, and once they are read, before exit.
LAUNCH_CLUSTER_BARRIERS = 2


@dataclass(frozen=True)
class KernelCheck:
    name: str
    registers: int
    smem_bytes: int
    spill_bytes: int
    sass: sass.SassSummary | None
    problems: tuple

    @property
    def ok(self) -> bool:
        return not self.problems and (self.sass is None or self.sass.ok)


def check_all(device: DeviceInfo) -> list[KernelCheck]:
    tool = sass.find_cuobjdump()
    out = []
    for schedule in SCHEDULES.values():
        for cfg in schedule.configs(device.smem_per_block_optin):
            kernel = compiler.compile_schedule(schedule, cfg)
            smem = schedule.smem_bytes(cfg)
            summary = sass.summarize(kernel.cubin_path, tool) if tool else None
            r = kernel.report
            problems = r.problems(smem, device.smem_per_block_optin)
            problems += cluster_problems(schedule, summary) if summary else []
            out.append(KernelCheck(kernel.name, r.registers, smem, r.spill_stores + r.spill_loads,
                                   summary, tuple(problems)))
    return out


def cluster_problems(schedule, summary: sass.SassSummary) -> list[str]:
    """A cluster kernel must multicast its TMA loads, arrive on its peers' mbarriers and meet
    its peers at cluster barriers (after the barrier init and before exit); a kernel in a
    cluster shaped at launch must meet its peers at its cluster barriers (every warpgroup: at
    least an arrive and a wait for each) and neither multicast nor arrive on a peer's
    mbarrier; a kernel without a cluster must do none of it."""
    c = summary.counts
    if schedule.cluster_at_launch:
        used = [name for name in ("tma_multicast", "remote_arrive") if c[name]]
        out = ([f"multicast or remote arrives in a split-K cluster: {', '.join(used)}"]
               if used else [])
        if c["cluster_barrier"] < 2 * LAUNCH_CLUSTER_BARRIERS:
            out.append(f"{c['cluster_barrier']} cluster barrier instructions: expected an arrive "
                       f"and a wait for each of {LAUNCH_CLUSTER_BARRIERS} cluster barriers")
        return out
    if schedule.cluster_size == 1:
        used = [name for name in ("tma_multicast", "cluster_barrier", "remote_arrive") if c[name]]
        return [f"cluster instructions without a cluster: {', '.join(used)}"] if used else []
    out = []
    if not c["tma_multicast"]:
        out.append("no multicast TMA load (UTMALDG.MULTICAST) in a cluster kernel")
    if not c["remote_arrive"]:
        out.append("no arrive on a peer CTA's mbarrier in a cluster kernel")
    if c["cluster_barrier"] < 2 * CLUSTER_BARRIERS:
        out.append(f"{c['cluster_barrier']} cluster barrier instructions: expected an arrive and a "
                   f"wait for each of {CLUSTER_BARRIERS} cluster barriers (init, exit)")
    return out


def format_checks(checks: list[KernelCheck]) -> str:
    head = f"{'kernel':<48} {'regs':>4} {'smem B':>7} {'spill':>5}  {'arch':<7} HGMMA UTMALDG UTMASTG  ok"
    rows = [head, "-" * len(head)]
    for c in checks:
        s = c.sass
        sass_cols = (f"{s.arch:<7} {s.counts['hgmma']:>5} {s.counts['tma_load']:>7} "
                     f"{s.counts['tma_store']:>7}" if s else f"{'(no cuobjdump)':<31}")
        rows.append(f"{c.name:<48} {c.registers:>4} {c.smem_bytes:>7} {c.spill_bytes:>5}  "
                    f"{sass_cols}  {'yes' if c.ok else 'NO: ' + '; '.join(c.problems)}")
    return "\n".join(rows)

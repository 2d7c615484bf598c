"""What the kernels need to know about a GPU, read from the device (never hard-coded)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

HOPPER_CC = (9, 0)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int  # bytes a block may use after raising its dynamic limit
    # cluster_capacity[n - 1]: clusters of n CTAs, each holding a whole SM (one CTA per SM, as
    # hopmm's kernels take), that run at once; empty where unknown. A cluster is placed whole
    # inside one GPC, so where GPCs hold different numbers of SMs this is less than
    # sm_count // n (an H100 SXM held 30 clusters of four, 120 of its 132 SMs).
    cluster_capacity: tuple = ()
    # Peak DRAM bandwidth in TB/s (dram_peak_tbps of the memory clock and bus width it
    # reports); None where unknown.
    dram_tbps: float | None = None

    @property
    def is_hopper(self) -> bool:
        return self.compute_capability == HOPPER_CC

    def clusters_at_once(self, size: int) -> int | None:
        """Clusters of `size` whole-SM CTAs that run at once, or None where unknown."""
        if 1 <= size <= len(self.cluster_capacity):
            return self.cluster_capacity[size - 1]
        return None


def dram_peak_tbps(memory_clock_khz: int, bus_bits: int) -> float:
    """Peak DRAM bandwidth in TB/s of HBM at `memory_clock_khz` over a `bus_bits`-wide bus:
    two transfers a clock."""
    return 2 * memory_clock_khz * 1e3 * bus_bits / 8 / 1e12


# The H100 SXM as measured (FACTS): used where no device can be asked (CPU-only checks). Its
# HBM3 runs at 2619 MHz over 5120 bits (3.35 TB/s, the published peak).
H100_SXM = DeviceInfo(name="NVIDIA H100 (assumed)", compute_capability=HOPPER_CC, sm_count=132,
                      smem_per_block_optin=232448, dram_tbps=dram_peak_tbps(2_619_000, 5120))
# The same with the cluster capacity it reports (cuOccupancyMaxActiveClusters, clusters of 1-8
# CTAs; bench/NOTES.md v0.13: 15 clusters of 7 or 8 CTAs, 17 of 6): the choices a real H100
# gets, cluster kernels included, made without one.
H100_SXM_CLUSTERS = replace(H100_SXM, cluster_capacity=(132, 66, 39, 30, 22, 17, 15, 15))


# The largest portable cluster: the sizes whose capacity query() reads.
MAX_PORTABLE_CLUSTER = 8
# Threads of the kernel whose cluster occupancy query() asks for: as many as hopmm's largest
# CTA (four warpgroups). Shared memory, the whole per-block limit, is what makes it one per SM.
_CAPACITY_PROBE_THREADS = 512
_CAPACITY_PROBE = 'extern "C" __global__ void hopmm_cluster_capacity_probe() {}'


def _cluster_capacity(device_id: int, smem_optin: int) -> tuple:
    """cuOccupancyMaxActiveClusters for clusters of 1..MAX_PORTABLE_CLUSTER CTAs of an empty
    kernel that takes all of an SM's shared memory; () where the driver cannot tell."""
    import cupy

    from . import _tensormap

    try:
        with cupy.cuda.Device(device_id):
            probe = cupy.RawKernel(_CAPACITY_PROBE, "hopmm_cluster_capacity_probe")
            probe.max_dynamic_shared_size_bytes = smem_optin
            return tuple(_tensormap.max_active_clusters(probe.kernel.ptr,
                                                        _CAPACITY_PROBE_THREADS, smem_optin,
                                                        size)
                         for size in range(1, MAX_PORTABLE_CLUSTER + 1))
    except (RuntimeError, cupy.cuda.driver.CUDADriverError,
            cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.compiler.CompileException):
        return ()


@functools.lru_cache(maxsize=None)
def query(device_id: int) -> DeviceInfo:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    capability = (props["major"], props["minor"])
    smem_optin = props["sharedMemPerBlockOptin"]
    return DeviceInfo(
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=capability,
        sm_count=props["multiProcessorCount"],
        smem_per_block_optin=smem_optin,
        # Clusters exist from compute capability 9.0 on.
        cluster_capacity=(_cluster_capacity(device_id, smem_optin)
                          if capability >= HOPPER_CC else ()),
        dram_tbps=_dram_tbps(device_id),
    )


def _dram_tbps(device_id: int) -> float | None:
    """The device's peak DRAM bandwidth from the memory clock and bus width attributes it
    reports, or None where it reports none."""
    import cupy

    runtime = cupy.cuda.runtime
    try:
        clock_khz = runtime.deviceGetAttribute(runtime.cudaDevAttrMemoryClockRate, device_id)
        bus_bits = runtime.deviceGetAttribute(runtime.cudaDevAttrGlobalMemoryBusWidth,
                                              device_id)
    except runtime.CUDARuntimeError:
        return None
    return dram_peak_tbps(clock_khz, bus_bits) if clock_khz > 0 and bus_bits > 0 else None


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False

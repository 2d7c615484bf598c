"""What the kernels need to know about a GPU, read from the device (never hard-coded)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

HOPPER_CC = (9, 0)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int  # bytes a block may use after raising its dynamic limit

    @property
    def is_hopper(self) -> bool:
        return self.compute_capability == HOPPER_CC


# The H100 SXM as measured (FACTS): used where no device can be asked (CPU-only checks).
H100_SXM = DeviceInfo(name="NVIDIA H100 (assumed)", compute_capability=HOPPER_CC, sm_count=132,
                      smem_per_block_optin=232448)


@functools.lru_cache(maxsize=None)
def query(device_id: int) -> DeviceInfo:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return DeviceInfo(
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=(props["major"], props["minor"]),
        sm_count=props["multiProcessorCount"],
        smem_per_block_optin=props["sharedMemPerBlockOptin"],
    )


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False

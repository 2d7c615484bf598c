"""Split-K scratch memory: an fp32 workspace and the per-tile semaphores, one pair per
(device, stream).

Two streams never share one: split-K kernels running concurrently on two streams would
otherwise reduce into each other's workspace tiles and count on each other's semaphores.
Launches on one stream are ordered, so they can all reuse the same pair. The semaphores are
zeroed once, when allocated (on the stream that uses them, so the memset is ordered before
the first kernel); every split-K kernel leaves them at zero (the last split of a tile resets
its semaphore), so no launch needs a memset. The workspace needs no initialisation: the first
split of a tile overwrites its part before anything reads it.

Growing replaces an allocation with a larger one. The old one is released to CuPy's memory
pool, whose free chunks are kept per stream: only later work on the same stream, which is
ordered after the kernels still using the old chunk, can receive it.
(A caveat: a stream destroyed while its split-K kernels still run and a new stream that gets
the same handle would share the pair.)

At most MAX_WORKSPACES pairs are kept, the least recently made or grown dropped first (a hit
stays lock-free, so it does not reorder them): a program that makes streams (or threads, each
with its own per-thread default stream) without end would otherwise hold a pair for each.
Dropping one is safe for the reason growing is: its memory goes back to its stream's pool, for
later work on that stream only.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

# Allocations grow to at least this, and by doubling, so a sequence of growing problems
# reallocates only a few times.
MIN_WORKSPACE_BYTES = 1 << 20
MIN_SEMAPHORES = 1024
PER_THREAD_DEFAULT_STREAM = 2   # cudaStreamPerThread
# Pairs kept at once: well above the streams a program keeps busy at one time (a few per
# device), so only streams it has stopped using lose theirs.
MAX_WORKSPACES = 64


@dataclass
class Workspace:
    data: object        # cupy uint8 array: the fp32 workspace
    semaphores: object  # cupy uint32 array, zero between kernels

    @property
    def data_ptr(self) -> int:
        return self.data.data.ptr

    @property
    def semaphores_ptr(self) -> int:
        return self.semaphores.data.ptr


_workspaces: OrderedDict = OrderedDict()   # (device, stream, thread) -> Workspace, LRU order
_lock = threading.Lock()


def _grown(current: int, needed: int, floor: int) -> int:
    size = max(current, floor)
    while size < needed:
        size *= 2
    return size


def get(device_id: int, stream_ptr: int, workspace_bytes: int, semaphores: int) -> Workspace:
    """The (device, stream)'s workspace with at least `workspace_bytes` bytes and
    `semaphores` zeroed semaphores; call with that device and stream current."""
    # CuPy's per-thread default stream has the same handle in every host thread but is a
    # different stream in each: those threads must not share semaphores.
    key = (device_id, stream_ptr,
           threading.get_ident() if stream_ptr == PER_THREAD_DEFAULT_STREAM else None)
    ws = _workspaces.get(key)
    if (ws is not None and ws.data.nbytes >= workspace_bytes
            and ws.semaphores.size >= semaphores):
        return ws
    import cupy

    with _lock:
        ws = _workspaces.get(key)
        data = ws.data if ws is not None else None
        sems = ws.semaphores if ws is not None else None
        if data is None or data.nbytes < workspace_bytes:
            data = cupy.empty(_grown(0 if data is None else data.nbytes, workspace_bytes,
                                     MIN_WORKSPACE_BYTES), dtype=cupy.uint8)
        if sems is None or sems.size < semaphores:
            sems = cupy.zeros(_grown(0 if sems is None else sems.size, semaphores,
                                     MIN_SEMAPHORES), dtype=cupy.uint32)
        ws = Workspace(data, sems)
        _workspaces[key] = ws
        _workspaces.move_to_end(key)
        while len(_workspaces) > MAX_WORKSPACES:
            _workspaces.popitem(last=False)
        return ws


def clear() -> None:
    """Drops every cached workspace (tests; freeing memory)."""
    with _lock:
        _workspaces.clear()
        _gemv_scratch.clear()


# gemv's split-K scratch (schedules.GemvSchedule): one buffer per (device, stream) whose first
# GEMV_COUNTERS u32 are counters and the rest fp32 partials. Allocated zeroed (on the stream
# that uses it); every gemv launch leaves its counters at zero again. Kept apart from the
# split-K workspace above, whose semaphores and partials other kernels use differently.
_gemv_scratch: dict = {}


def gemv_scratch(device_id: int, stream_ptr: int, nbytes: int) -> int:
    """Device pointer to the (device, stream)'s gemv scratch of at least `nbytes` bytes; call
    with that device and stream current."""
    key = (device_id, stream_ptr,
           threading.get_ident() if stream_ptr == PER_THREAD_DEFAULT_STREAM else None)
    buf = _gemv_scratch.get(key)
    if buf is None or buf.nbytes < nbytes:
        import cupy

        with _lock:
            buf = _gemv_scratch.get(key)
            if buf is None or buf.nbytes < nbytes:
                size = _grown(0 if buf is None else buf.nbytes, nbytes, MIN_WORKSPACE_BYTES)
                buf = cupy.zeros(size, dtype=cupy.uint8)
                _gemv_scratch[key] = buf
    return buf.data.ptr

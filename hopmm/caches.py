"""Every cache hopmm keeps in a process, what keys it and what bounds it. None grows with the
number of distinct shapes without a limit, so a long-running process stays flat in memory:

| cache | key | bound |
|---|---|---|
| heuristics.choose (lru_cache) | problem, device, forced schedule | 4096 entries |
| fastpath._recipes | operand shapes/strides/dtypes/alignment, device | MAX_RECIPES, then cleared |
| tensor maps of a launch (C++ KernelLaunch) | base address of A, B, C | 4 per map |
| workspace._workspaces (split-K scratch) | device, stream, thread | MAX_WORKSPACES, oldest out |
| launch.compiled (lru_cache) | schedule, config | the kernels hopmm can render |
| compile._compiled (verified cubins) | kernel name, source | the kernels hopmm can render |
| launch._loaded (lru_cache) | kernel, shared memory, device | kernels x devices |
| device.query (lru_cache) | device id | the devices |
| tuning._table | the autotune table file | one table (its entries: tuned shapes) |
| interop._streams (torch streams) | device, stream pointer | MAX_STREAMS, then cleared |
| interop._direct (torch calls' launches) | tensors' shapes/strides/dtypes, device | MAX_RECIPES, then cleared |
| shared_a._plans | a product's fastpath key, forced schedule | MAX_PLANS, then cleared |
| shared_a._dual_launches | both products' plan keys, the one-kernel schedule | MAX_PLANS, then cleared |
| shared_a._composed (pairs the model composed) | the same | MAX_PLANS, then cleared |
| shared_a._torch_dual (torch calls' one-kernel launches) | tensors' keys, schedule, activation | MAX_PLANS, then cleared |
| heuristics.dual_b_pays (lru_cache) | dual-B schedule, problem | 4096 entries |
| shared_a._gated_product (lru_cache) | nothing: one elementwise kernel | 1 |

`sizes()` reports them all, for the soak test of bench/reliability.py.
"""
from __future__ import annotations


def sizes() -> dict:
    """{cache name: entries held now}."""
    from . import compile as compiler
    from . import device, fastpath, heuristics, interop, launch, shared_a, tuning, workspace

    return {
        "heuristics.choose": heuristics.choose.cache_info().currsize,
        "fastpath.recipes": len(fastpath._recipes),
        "workspace.workspaces": len(workspace._workspaces),
        "launch.compiled": launch.compiled.cache_info().currsize,
        "compile.compiled": len(compiler._compiled),
        "launch.loaded": launch._loaded.cache_info().currsize,
        "device.query": device.query.cache_info().currsize,
        "tuning.table": len(tuning._table._entries),
        "interop.streams": len(interop._streams),
        "interop.direct": len(interop._direct),
        "shared_a.plans": len(shared_a._plans),
        "shared_a.dual_launches": len(shared_a._dual_launches),
        "shared_a.composed": len(shared_a._composed),
        "shared_a.torch_dual": len(shared_a._torch_dual),
        "heuristics.dual_b_pays": heuristics.dual_b_pays.cache_info().currsize,
    }


def bounds() -> dict:
    """{cache name: the most entries it can hold} for the caches bounded by a number."""
    from . import fastpath, heuristics, interop, shared_a, workspace

    return {
        "heuristics.choose": heuristics.choose.cache_info().maxsize,
        "fastpath.recipes": fastpath.MAX_RECIPES,
        "workspace.workspaces": workspace.MAX_WORKSPACES,
        "interop.streams": interop.MAX_STREAMS,
        "interop.direct": fastpath.MAX_RECIPES,
        "shared_a.plans": shared_a.MAX_PLANS,
        "shared_a.dual_launches": shared_a.MAX_PLANS,
        "shared_a.composed": shared_a.MAX_PLANS,
        "shared_a.torch_dual": shared_a.MAX_PLANS,
        "heuristics.dual_b_pays": heuristics.dual_b_pays.cache_info().maxsize,
    }

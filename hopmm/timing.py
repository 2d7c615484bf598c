"""Fair side-by-side timing on the GPU: CUDA events around back-to-back launches, rotating
input sets, implementations interleaved round by round, medians over rounds; and sustained
runs, each contestant alone for a fraction of a second."""
from __future__ import annotations

import random
import statistics
import time

# Each round runs the contestants in a fresh random order. Under the GPU's power limit a timing
# may depend on what ran just before it: in a cyclic rotation, where every contestant always
# follows the same one, identical kernels read 1-3 % apart by their place (H100,
# bench/NOTES.md v0.8). Seeded, so a run is repeatable.
ORDER_SEED = 20261123


def round_orders(names, rounds: int, seed: int = ORDER_SEED) -> list[list]:
    """One random permutation of `names` per round."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def time_per_call(fn, inputs, launches: int) -> float:
    """Seconds per call of `fn(*inputs[i % len(inputs)])` over `launches` back-to-back calls."""
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for i in range(launches):
        fn(*inputs[i % len(inputs)])
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / launches


def interleaved_medians(contestants: dict, inputs, rounds: int, warmup_s: float,
                        target_s: float = 0.02) -> dict:
    """{name: median seconds per call}; the contestants run in a new order every round."""
    names = list(contestants)
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        for name in names:
            time_per_call(contestants[name], inputs, len(inputs))
    launches = {}
    for name in names:  # size each timing to ~target_s so event resolution does not matter
        t = time_per_call(contestants[name], inputs, len(inputs))
        launches[name] = max(len(inputs), int(target_s / max(t, 1e-7)))
    samples = {name: [] for name in names}
    for order in round_orders(names, rounds):
        for name in order:
            samples[name].append(time_per_call(contestants[name], inputs, launches[name]))
    return {name: statistics.median(v) for name, v in samples.items()}


# Sustained runs. At the power limit a 30 ms timing among other kernels runs near the clock
# their power draw sets, so a kernel that draws more per cycle reads faster than it runs alone
# for long (H100, bench/NOTES.md v0.14: up to 6 %). Alone for SUSTAINED_S a kernel runs at the
# clock its own draw sets; rotated rounds give every contestant every place once.
SUSTAINED_S = 0.3
SUSTAINED_ROUNDS = 3


def sustained_runs(per_call: dict, seconds: float, rounds: int, run, min_launches: int = 1) -> dict:
    """{name: [run(name, launches) of each round]}: every name of `per_call` (its seconds per
    call) alone once per round for about `seconds` of back-to-back calls (at least
    `min_launches`), the rounds in rotated order (every name takes every place once)."""
    names = list(per_call)
    results = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            launches = max(min_launches, round(seconds / per_call[name]))
            results[name].append(run(name, launches))
    return results


def sustained_medians(contestants: dict, inputs, per_call: dict, seconds: float | None = None,
                      rounds: int = SUSTAINED_ROUNDS) -> dict:
    """{name: median seconds per call}, each contestant alone for about `seconds` (default
    SUSTAINED_S) of back-to-back calls (sized from `per_call`, its seconds per call) per round,
    at least one pass over the inputs, in rotated order (sustained_runs)."""
    runs = sustained_runs({name: per_call[name] for name in contestants},
                          SUSTAINED_S if seconds is None else seconds, rounds,
                          lambda name, n: time_per_call(contestants[name], inputs, n),
                          min_launches=len(inputs))
    return {name: statistics.median(v) for name, v in runs.items()}

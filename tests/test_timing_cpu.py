"""The interleaving order of hopmm.timing (pure: no GPU)."""
from collections import Counter

from hopmm import timing

NAMES = ("hopmm", "cupy", "torch", "candidate")


def test_every_round_runs_every_contestant_once():
    orders = timing.round_orders(NAMES, 12)
    assert len(orders) == 12
    assert all(sorted(order) == sorted(NAMES) for order in orders)


def test_orders_are_repeatable_and_seeded():
    assert timing.round_orders(NAMES, 9) == timing.round_orders(NAMES, 9)
    assert timing.round_orders(NAMES, 9, seed=1) != timing.round_orders(NAMES, 9, seed=2)


def test_no_contestant_always_follows_the_same_one():
    """A cyclic rotation gives every contestant one fixed predecessor (a bias under the power
    limit); random orders give each several, and every place in the round."""
    orders = timing.round_orders(NAMES, 24)
    for name in NAMES:
        before = Counter(order[order.index(name) - 1] for order in orders if order[0] != name)
        assert len(before) > 1
        assert len({order.index(name) for order in orders}) == len(NAMES)


def test_sustained_runs_size_each_contestant_and_rotate(monkeypatch):
    """Each contestant runs alone once per round for about `seconds` of calls (at least one
    pass over the inputs), every place once over the rounds; the medians come back."""
    per_call = {"a": 1e-3, "b": 2e-3, "c": 1e-6}
    calls = []

    def fake_time(fn, inputs, launches):
        calls.append((fn, launches))
        return per_call[fn] * (2 if len(calls) == 1 else 1)  # one slow outlier

    monkeypatch.setattr(timing, "time_per_call", fake_time)
    got = timing.sustained_medians({n: n for n in per_call}, [0, 1], per_call, seconds=0.3,
                                   rounds=3)
    assert got == per_call
    assert [name for name, _ in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: n for name, n in calls} == {"a": 300, "b": 150, "c": 300000}

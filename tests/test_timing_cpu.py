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

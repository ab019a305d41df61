"""A recorded run's runs of frees in one canonical order (torch-free)."""

from __future__ import annotations

from memfit.estimate.derived.events import frees_in_order


def test_frees_in_a_row_are_put_in_the_order_of_their_births() -> None:
    # births of keys 0, 1, 2; then frees of 2, 0, 1 in a row, a phase mark, and a free of 3's
    # storage born after: the row is sorted, the mark cuts it
    ev = [0 << 1, 1 << 1, 2 << 1, 2 << 1 | 1, 0 << 1 | 1, 1 << 1 | 1, 3 << 1, 3 << 1 | 1]
    got = frees_in_order(ev, [[5, "backward"]])
    assert got == [0, 2, 4, 1, 5, 3, 6, 7]
    assert frees_in_order(ev, [[4, "backward"]])[3:6] == [5, 1, 3]

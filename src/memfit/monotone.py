"""The largest value a monotone test passes: the one bisection every "largest that fits" search
shares (vLLM's max-model-len, SGLang's context length, llama.cpp's -ngl and -c, the KV planner).

``ok(value)`` answers a witness (the start-up, the estimate) when ``value`` passes and None when
it does not; a test that passes for a value passes for every smaller one (memory grows with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["largest"]

T = TypeVar("T")


def largest(ok: Callable[[int], T | None], upper: int, lower: int = 0) -> tuple[int, T | None]:
    """(the largest value in ``lower .. upper`` that ``ok`` passes, its witness); ``(lower,
    None)`` when none above ``lower`` does (``lower`` itself is not tested)."""
    lo, hi, best = lower, upper, None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = ok(mid)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid - 1
    return lo, best

"""Time the caching-allocator replay on 1,000,000 synthetic events.

Run: ``python benchmarks/allocator_speed.py [n_events]``. Prints events/s for the default
allocator and for ``expandable_segments=True``. The events mimic a training step: a mostly
last-in-first-out stack of activation-like tensors (sizes log-uniform between 256 B and 64 MiB)
with some long-lived ones, at most ~4,000 live at once. The seed is fixed, so runs compare.
"""

from __future__ import annotations

import random
import sys
import time

from memfit.estimate.allocator.caching import simulate


def synthetic_events(n_events: int, *, seed: int = 0) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    events: list[tuple[str, int, int]] = []
    live: list[int] = []
    next_key = 0
    while len(events) < n_events:
        if live and (len(live) > 4000 or rng.random() < 0.5):
            # Mostly free the newest tensor (a stack), sometimes a random one.
            index = len(live) - 1 if rng.random() < 0.8 else rng.randrange(len(live))
            live[index], live[-1] = live[-1], live[index]
            events.append(("f", live.pop(), 0))
        else:
            n_bytes = int(2 ** rng.uniform(8, 26))
            events.append(("a", next_key, n_bytes))
            live.append(next_key)
            next_key += 1
    return events


def main() -> None:
    n_events = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    events = synthetic_events(n_events)
    for expandable in (False, True):
        start = time.perf_counter()
        result = simulate(events, expandable_segments=expandable)
        elapsed_s = time.perf_counter() - start
        print(
            f"expandable_segments={expandable}: {n_events:,} events in {elapsed_s:.2f} s "
            f"({n_events / elapsed_s:,.0f} events/s); peak allocated "
            f"{result.peak_allocated_bytes / 2**30:.2f} GiB, peak reserved "
            f"{result.peak_reserved_bytes / 2**30:.2f} GiB, {result.n_segments} segments"
        )


if __name__ == "__main__":
    main()

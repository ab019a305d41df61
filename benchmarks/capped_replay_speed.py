"""Time ``replay_run``'s capped default-configuration replay: CachingAllocatorSim (before issue 32)
against the compiled kernel with a capacity (after), on a synthetic sequence-length run.

Run: ``PYTHONPATH=src python benchmarks/capped_replay_speed.py [n_steps]`` (default 1,000 steps).
Writes ``benchmarks/results/capped_replay_speed.md``. The run: a training-like trace (three
30 MiB weights; per step 120 activations of ``length x 4 KiB x (1 + i % 7)`` freed in reverse,
24 gradients of 8 MiB, optimizer states in the first step, a loss kept into the next step) traced
at 128, 1024 and 2048 tokens, replayed at lengths drawn uniformly from 128-2048 (seed 0). Two
capacities below the run's unbounded reserved peak: between the fixed-2048 peak and it (segments
given back, no OOM expected) and half the fixed-2048 allocated peak (OOMs). Each figure is the
best of three wall-clock runs (``time.perf_counter``); both replays must give the same figures.
The kernel is loaded (compiled if need be) before any timing.
"""

from __future__ import annotations

import itertools
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import CachingAllocatorSim
from memfit.estimate.allocator.fast import compiled_replay
from memfit.estimate.seqrun.replay import RunEvents, replay_run, run_events, templates_from_traces
from memfit.units import KiB, MiB

RESULTS = Path(__file__).parent / "results" / "capped_replay_speed.md"


def trace(length: int) -> tuple[list[tuple[str, int, int]], list[tuple[str, int]]]:
    keys = itertools.count()
    events: list[tuple[str, int, int]] = []
    marks: list[tuple[str, int]] = []

    def alloc(n_bytes: int) -> int:
        k = next(keys)
        events.append(("a", k, n_bytes))
        return k

    for _ in range(3):
        alloc(30 * MiB)
    carry = None
    for step in range(3):
        marks.append(("forward", len(events)))
        acts = [alloc(length * 4 * KiB * (1 + i % 7)) for i in range(120)]
        marks.append(("backward", len(events)))
        grads = [alloc(8 * MiB) for _ in range(24)]
        for k in reversed(acts):
            events.append(("f", k, 0))
        marks.append(("optimizer", len(events)))
        if step == 0:
            for _ in range(48):
                alloc(16 * MiB)
        for k in grads:
            events.append(("f", k, 0))
        if carry is not None:
            events.append(("f", carry, 0))
        carry = alloc(512)
    marks.append(("end", len(events)))
    return events, marks


def sim_replay(events: RunEvents, capacity: int) -> tuple[int, int, int]:
    """The capped replay as replay_run made it before: CachingAllocatorSim event by event."""
    sim = CachingAllocatorSim(capacity_bytes=capacity)
    malloc, free = sim.malloc, sim.free
    for born, key, n_bytes in zip(
        events.is_alloc.tolist(), events.keys.tolist(), events.n_bytes.tolist(), strict=True
    ):
        if born:
            malloc(key, n_bytes)
        else:
            free(key)
    r = sim.result()
    return r.peak_reserved_bytes, r.peak_allocated_bytes, r.n_ooms


def kernel_replay(events: RunEvents, capacity: int) -> tuple[int, int, int]:
    r = compiled_replay(
        events.is_alloc, events.keys, events.n_bytes, events.n_keys, capacity_bytes=capacity
    )
    assert r is not None, allocator_jit.describe()
    return r.peak_reserved_bytes, r.peak_allocated_bytes, r.n_ooms


def best_of(fn: Callable[..., Any], *args: Any, n: int = 3) -> tuple[float, Any]:
    best, got = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        got = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, got


def main() -> None:
    n_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    t0 = time.perf_counter()
    assert allocator_jit.load_kernel(wait=True) is not None, allocator_jit.describe()
    load_s = time.perf_counter() - t0
    templates = templates_from_traces({n: trace(n) for n in (128, 1024, 2048)})
    rng = random.Random(0)
    lengths = [rng.randint(128, 2048) for _ in range(n_steps)]
    events = run_events(templates, lengths)
    unbounded = replay_run(templates, lengths)
    fixed = replay_run(templates, [2048] * 3)
    capacities = {
        "between fixed-2048 and unbounded peak": (
            fixed.peak_reserved_bytes + unbounded.peak_reserved_bytes
        )
        // 2,
        "half the fixed-2048 allocated peak": fixed.peak_allocated_bytes // 2,
    }
    rows = []
    for name, capacity in capacities.items():
        sim_s, want = best_of(sim_replay, events, capacity)
        jit_s, got = best_of(kernel_replay, events, capacity)
        assert got == want, (name, got, want)
        run_s, run = best_of(lambda c: replay_run(templates, lengths, capacity_bytes=c), capacity)
        assert (run.peak_reserved_bytes, run.peak_allocated_bytes, run.n_ooms) == want
        rows.append((name, capacity, want, sim_s, jit_s, run_s))
    load = os.getloadavg()
    lines = [
        "# Capped default replay: CachingAllocatorSim vs the compiled kernel",
        "",
        f"`PYTHONPATH=src python benchmarks/capped_replay_speed.py {n_steps}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        " (shared machine); kernel load/compile before timing "
        f"{load_s:.1f} s). Synthetic run: {n_steps} steps, {len(events.keys):,} events "
        f"(see the script's docstring). Unbounded reserved peak "
        f"{unbounded.peak_reserved_bytes / MiB:,.0f} MiB. Best of 3 wall-clock runs each; both "
        "replays gave identical peak reserved, peak allocated and OOM count (asserted).",
        "",
        "| capacity | MiB | peak reserved MiB | OOMs | sim (before) s | kernel (after) s "
        "| speed-up | whole replay_run now s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, capacity, (peak_r, _peak_a, n_ooms), sim_s, jit_s, run_s in rows:
        lines.append(
            f"| {name} | {capacity / MiB:,.0f} | {peak_r / MiB:,.0f} | {n_ooms:,} | {sim_s:.3f} "
            f"| {jit_s:.4f} | {sim_s / jit_s:,.0f}x | {run_s:.3f} |"
        )
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Time ``replay_run``'s expandable-segments replay: CachingAllocatorSim (before) against the
compiled kernel of ``estimate/allocator/kernel_expandable.py`` (after), on a synthetic
sequence-length run.

Run: ``PYTHONPATH=src python benchmarks/expandable_replay_speed.py [n_steps]`` (default 1,000
steps). Writes ``benchmarks/results/expandable_replay_speed.md``. The run is
``capped_replay_speed.py``'s (a training-like trace at 128, 1024 and 2048 tokens, replayed at
lengths drawn uniformly from 128-2048, seed 0), with ``expandable_segments`` on; three
capacities: none, between the fixed-2048 and the run's reserved peak (pages given back, no OOM
expected) and half the fixed-2048 allocated peak (OOMs). Each figure is the best of three
wall-clock runs (``time.perf_counter``); both replays must give the same result, field for field.
The kernel is loaded (compiled if need be) before any timing.
"""

from __future__ import annotations

import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from capped_replay_speed import best_of, trace  # noqa: E402

from memfit.estimate.allocator import jit as allocator_jit  # noqa: E402
from memfit.estimate.allocator.caching import AllocatorResult, CachingAllocatorSim  # noqa: E402
from memfit.estimate.allocator.fast import compiled_replay  # noqa: E402
from memfit.estimate.seqrun.replay import (  # noqa: E402
    RunEvents,
    replay_run,
    run_events,
    templates_from_traces,
)
from memfit.units import MiB  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "expandable_replay_speed.md"


def sim_replay(events: RunEvents, capacity: int | None) -> AllocatorResult:
    """The expandable replay as replay_run made it before: CachingAllocatorSim event by event."""
    sim = CachingAllocatorSim(capacity_bytes=capacity, expandable_segments=True)
    malloc, free = sim.malloc, sim.free
    for born, key, n_bytes in zip(
        events.is_alloc.tolist(), events.keys.tolist(), events.n_bytes.tolist(), strict=True
    ):
        if born:
            malloc(key, n_bytes)
        else:
            free(key)
    return sim.result()


def kernel_replay(events: RunEvents, capacity: int | None) -> AllocatorResult:
    r = compiled_replay(
        events.is_alloc, events.keys, events.n_bytes, events.n_keys,
        capacity_bytes=capacity, expandable_segments=True,
    )  # fmt: skip
    assert r is not None, allocator_jit.describe()
    return r


def main() -> None:
    n_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    t0 = time.perf_counter()
    assert allocator_jit.load_kernel(wait=True) is not None, allocator_jit.describe()
    load_s = time.perf_counter() - t0
    templates = templates_from_traces({n: trace(n) for n in (128, 1024, 2048)})
    rng = random.Random(0)
    lengths = [rng.randint(128, 2048) for _ in range(n_steps)]
    events = run_events(templates, lengths)
    unbounded = replay_run(templates, lengths, expandable_segments=True)
    fixed = replay_run(templates, [2048] * 3, expandable_segments=True)
    capacities: dict[str, int | None] = {
        "none": None,
        "between fixed-2048 and the run's peak": (
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
        rows.append((name, capacity, want, sim_s, jit_s))
    load = os.getloadavg()
    lines = [
        "# Expandable-segments replay: CachingAllocatorSim vs the compiled kernel",
        "",
        f"`PYTHONPATH=src python benchmarks/expandable_replay_speed.py {n_steps}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        " (shared machine); kernel load/compile before timing "
        f"{load_s:.1f} s). Synthetic run: {n_steps} steps, {len(events.keys):,} events "
        "(see the script's docstring). Reserved peak without a capacity "
        f"{unbounded.peak_reserved_bytes / MiB:,.0f} MiB. Best of 3 wall-clock runs each; both "
        "replays gave the same result, field for field (asserted).",
        "",
        "| capacity | MiB | peak reserved MiB | final reserved MiB | OOMs | sim (before) s "
        "| kernel (after) s | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, capacity, r, sim_s, jit_s in rows:
        cap = "-" if capacity is None else f"{capacity / MiB:,.0f}"
        lines.append(
            f"| {name} | {cap} | {r.peak_reserved_bytes / MiB:,.0f} "
            f"| {r.final_reserved_bytes / MiB:,.0f} | {r.n_ooms:,} | {sim_s:.3f} | {jit_s:.4f} "
            f"| {sim_s / jit_s:,.0f}x |"
        )
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

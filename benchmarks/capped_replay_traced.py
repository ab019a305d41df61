"""The capped default replay on a traced run: CachingAllocatorSim (before issue 32) against the
compiled kernel with a capacity (after), checked equal field for field.

Run: ``PYTHONPATH=src python benchmarks/capped_replay_traced.py`` (~1 min; needs torch).
Writes ``benchmarks/results/capped_replay_traced.md``. The run: the tiny Llama of
``tests/estimate/seqrun/test_run.py`` (2 layers, hidden 256, vocab 8000; bf16-mixed, LoRA rank 8,
batch 4) traced by memfit's fake-CUDA engine at 64, 160, 256 and 512 tokens, replayed over 2,000
steps (seed 1: 70 % of steps at 64 or 160 tokens, the rest any of the four), at capacities from
just below the unbounded peak down to 3 MiB. One wall-clock run each (``time.perf_counter``),
the kernel loaded before.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from pathlib import Path

from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import AllocatorResult, CachingAllocatorSim
from memfit.estimate.allocator.fast import compiled_replay
from memfit.estimate.seqrun.replay import RunEvents, replay_run, run_events, templates_from_traces
from memfit.units import MiB

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the run of tests/estimate/seqrun/test_run.py (one definition of its model and job)
from tests.estimate.seqrun.test_run import CONFIG, LENGTHS, WORKLOAD  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "capped_replay_traced.md"


def sim_replay(events: RunEvents, capacity: int) -> AllocatorResult:
    sim = CachingAllocatorSim(capacity_bytes=capacity)
    for born, key, n_bytes in zip(
        events.is_alloc.tolist(), events.keys.tolist(), events.n_bytes.tolist(), strict=True
    ):
        if born:
            sim.malloc(key, n_bytes)
        else:
            sim.free(key)
    return sim.result()


def main() -> None:
    from memfit.estimate.trace.engine import trace_step_events

    assert allocator_jit.load_kernel(wait=True) is not None, allocator_jit.describe()
    traces = {
        n: trace_step_events(dict(CONFIG), dataclasses.replace(WORKLOAD, seq_len=n))
        for n in LENGTHS
    }
    templates = templates_from_traces(traces)
    rng = random.Random(1)
    lengths = [
        rng.choice(LENGTHS[:2]) if rng.random() < 0.7 else rng.choice(LENGTHS) for _ in range(2000)
    ]
    events = run_events(templates, lengths)
    free = replay_run(templates, lengths)
    fixed = replay_run(templates, [512] * 3)
    capacities = (
        free.peak_reserved_bytes - 1,
        (free.peak_reserved_bytes + fixed.peak_reserved_bytes) // 2,
        fixed.peak_reserved_bytes,
        fixed.peak_allocated_bytes,
        fixed.peak_allocated_bytes // 2,
        3 * MiB,
    )
    load = os.getloadavg()
    lines = [
        "# Capped default replay on a traced run: CachingAllocatorSim vs the compiled kernel",
        "",
        "`PYTHONPATH=src python benchmarks/capped_replay_traced.py` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, shared machine). "
        f"{len(events.keys):,} events; unbounded reserved peak "
        f"{free.peak_reserved_bytes / MiB:.1f} MiB, fixed-512 {fixed.peak_reserved_bytes / MiB:.1f}"
        " MiB. One wall-clock run each; `equal`: every field of the two results.",
        "",
        "| capacity MiB | equal | OOMs | peak reserved MiB | final reserved MiB | segments "
        "| sim (before) s | kernel (after) s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for capacity in capacities:
        t0 = time.perf_counter()
        want = sim_replay(events, capacity)
        sim_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = compiled_replay(
            events.is_alloc, events.keys, events.n_bytes, events.n_keys, capacity_bytes=capacity
        )
        jit_s = time.perf_counter() - t0
        lines.append(
            f"| {capacity / MiB:.2f} | {got == want} | {want.n_ooms:,} "
            f"| {want.peak_reserved_bytes / MiB:.1f} | {want.final_reserved_bytes / MiB:.1f} "
            f"| {want.n_segments} | {sim_s:.3f} | {jit_s:.4f} |"
        )
    RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The segments a traced FSDP2 step reserves, one by one (issues 30 / 32, helper "fsdpmore"):
the trace engine's allocation events of a fast-path grid row (a bundled config cut to 2 layers,
batch 5, the grid's job) replayed through the caching-allocator model (``allocator/caching.py``),
printing each new segment with the request that made it, and the analytic engine's allocated
bytes and range top beside the trace's (docs/accuracy.md, "FSDP2: the root group's segments at
any GPU count").

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_segments.py phi-4 mixed_fsdp_g32
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_segments.py olmo-2-7b mixed_fsdp_g64
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20


def events_of(name: str, job: str) -> tuple[list, list[int], object, object]:
    """(the trace's events, the cuBLAS workspaces the replay starts with, the trace's and the
    analytic engine's estimates at the top of its range) of grid job ``job`` on ``name``."""
    from benchmarks.fastpath_grid import _workload, real_config
    from memfit.estimate.policy import run_engine
    from memfit.estimate.trace import engine as trace_engine
    from memfit.models import resolve_model

    caught: dict[str, object] = {}
    replay = trace_engine.replay_reserved

    def catch(events: list, gpu: object, training: bool) -> int:
        caught["events"], caught["ws"] = (
            list(events),
            trace_engine.allocator_workspaces(gpu, training=training),
        )
        return replay(events, gpu, training)

    path = Path(tempfile.mkdtemp(prefix="memfit-seg-")) / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(real_config(name, 2)))
    source = resolve_model(str(path.parent))
    w = _workload(job, name, source.config["model_type"], batch=5, seq=128, config=source.config)
    trace_engine.replay_reserved = catch  # type: ignore[assignment]
    try:
        traced = run_engine("trace", source, w, None)
    finally:
        trace_engine.replay_reserved = replay  # type: ignore[assignment]
    fast = run_engine("analytic", source, w, None, reserved_end="high")
    return caught["events"], caught["ws"], traced, fast  # type: ignore[return-value]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", help="a bundled config (cut to 2 layers)")
    p.add_argument("job", help="a grid job, e.g. mixed_fsdp_g32")
    p.add_argument("--min-mib", type=float, default=40.0, help="segments listed from this size")
    args = p.parse_args(argv)
    from memfit.estimate.allocator.caching import CachingAllocatorSim

    events, workspaces, traced, fast = events_of(args.name, args.job)
    sim = CachingAllocatorSim()
    for i, n in enumerate(workspaces):
        sim.malloc(-1 - i, n)
    for index, (kind, key, n_bytes) in enumerate(events):
        if kind != "a":
            sim.free(key)
            continue
        before = sim.reserved_bytes
        sim.malloc(key, n_bytes)
        grown = sim.reserved_bytes - before
        if grown and grown >= args.min_mib * MIB:
            print(f"event {index:6d}: new segment {grown / MIB:9.1f} MiB for a request of "
                  f"{n_bytes / MIB:9.1f} MiB; reserved {sim.reserved_bytes / MIB:9.0f} MiB, "
                  f"allocated {sim.allocated_bytes / MIB:9.0f} MiB")  # fmt: skip
    t, a = traced, fast
    print(f"trace: allocated {t.peak_allocated_bytes / MIB:.0f} MiB, reserved "  # type: ignore[attr-defined]
          f"{t.peak_reserved_bytes / MIB:.0f} MiB; analytic: allocated "  # type: ignore[attr-defined]
          f"{a.peak_allocated_bytes / MIB:.0f} MiB, range top "  # type: ignore[attr-defined]
          f"{a.peak_reserved_bytes / MIB:.0f} MiB")  # type: ignore[attr-defined]  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

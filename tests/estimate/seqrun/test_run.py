"""A variable-length run under bf16-mixed (the default training precision) against its ground
truth: the allocator model replaying, in sequence, the full trace of each sampled length.

The ground truth here is built independently of :mod:`memfit.estimate.seqrun.replay`: each step is
the raw event list of the trace at that step's length (the events in the tracker's own order, no
interpolation, no reordering), keys renamed per replayed step, and the whole run goes through
:func:`memfit.estimate.allocator.caching.simulate` once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from memfit.estimate.allocator.caching import simulate
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.seqrun.dist import step_lengths
from memfit.estimate.seqrun.replay import N_TRACED_STEPS, same_steps
from memfit.estimate.seqrun.run import SeqRunEstimate, estimate_seq_run
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec
from memfit.spec.seqrun import SeqDist, StepPlan

# A small Llama whose logits and MLP activations reach the large pool (> 1 MiB) at these
# lengths, so new lengths cost new segments and the run grows over the fixed shape.
CONFIG = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
    vocab_size=8000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
LENGTHS = (64, 160, 256, 512)
WORKLOAD = WorkloadSpec(batch_size=4, seq_len=512, precision="bf16-mixed", lora_rank=8)

Trace = tuple[list[tuple[str, int, int]], list[tuple[str, int]]]


def stitched_run(traces: dict[int, Trace], lengths: list[int]) -> list[tuple[str, int, int]]:
    """The run's events: before the first step from the first length's trace, then replayed
    step k from traced step min(k, 3) of the trace at ``lengths[k-1]``; a block is named by the
    replayed step that allocated it and its position in that step."""
    parts, sites = {}, {}
    for n, (events, marks) in traces.items():
        starts = [i for phase, i in marks if phase == "forward"]
        end = [i for phase, i in marks if phase == "end"][-1]
        bounds = [0, *starts, end]
        parts[n] = [events[bounds[s] : bounds[s + 1]] for s in range(len(bounds) - 1)]
        sites[n] = {
            key: (s, pos)
            for s, seg in enumerate(parts[n])
            for pos, (kind, key, _) in enumerate(seg)
            if kind == "a"
        }
    names: dict[tuple[int, int], int] = {}
    out = [
        (kind, names.setdefault((0, pos), len(names)), n_bytes)
        for pos, (kind, _, n_bytes) in enumerate(parts[lengths[0]][0])
    ]
    for k, n in enumerate(lengths, start=1):
        traced = min(k, N_TRACED_STEPS)
        for kind, key, n_bytes in parts[n][traced]:
            born, pos = sites[n][key]
            name = (0, pos) if born == 0 else (k - (traced - born), pos)
            out.append((kind, names.setdefault(name, len(names)), n_bytes))
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Trace]:
    from memfit.estimate.trace.engine import trace_step_events

    return {
        n: trace_step_events(dict(CONFIG), dataclasses.replace(WORKLOAD, seq_len=n))
        for n in LENGTHS
    }


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SeqRunEstimate, list[int]]:
    """estimate_seq_run (its own anchors, floor search and replay) over a histogram run."""
    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    dist = SeqDist(max_len=512, lengths=LENGTHS, weights=(4, 3, 2, 1))
    plan = StepPlan(batch_size=1, n_steps=40, seed=3)
    est = estimate_seq_run(resolve_model(str(folder)), WORKLOAD, dist, plan)
    return est, step_lengths(dist, plan)


@pytest.mark.slow
def test_bf16_mixed_steps_of_other_lengths_free_the_autocast_casts_in_another_order(
    traced: dict[int, Trace],
) -> None:
    traces = traced
    kinds = {tuple(e[0] for e in events) for events, _ in traces.values()}
    assert len(kinds) == 1  # the same allocations and frees at every length...
    freed = {n: tuple(freed_positions(*t)) for n, t in traces.items()}
    assert len(set(freed.values())) > 1  # ...but not the same blocks freed at each position
    # the same once each run of consecutive frees is put in one order
    assert all(same_steps(traces[n], traces[max(LENGTHS)]) for n in LENGTHS)


def freed_positions(events: list[tuple[str, int, int]], marks: Any) -> list[int]:
    """For each free, the index of the allocation it frees."""
    born: dict[int, int] = {}
    out = []
    for i, (kind, key, _) in enumerate(events):
        if kind == "a":
            born[key] = i
        else:
            out.append(born.get(key, -1))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("expandable", [False, True])
def test_the_replayed_run_equals_the_full_traces_of_its_lengths_in_sequence(
    traced: dict[int, Trace],
    replayed: tuple[SeqRunEstimate, list[int]],
    expandable: bool,
) -> None:
    traces = traced
    est, lengths = replayed
    assert est.floor_len == 1 and est.anchors == LENGTHS and len(set(lengths)) == 4
    workspaces = [("a", -1 - i, n) for i, n in enumerate(allocator_workspaces(None, training=True))]
    truth = simulate(workspaces + stitched_run(traces, lengths), expandable_segments=expandable)
    fixed = simulate(workspaces + stitched_run(traces, [512] * 3), expandable_segments=expandable)
    run = est.run.reserved_expandable_bytes if expandable else est.run.reserved_bytes
    assert run == truth.peak_reserved_bytes
    assert (est.fixed.reserved_expandable_bytes if expandable else est.fixed.reserved_bytes) == (
        fixed.peak_reserved_bytes
    )
    if not expandable:  # the run grows over the fixed shape (what --seq-dist is for)
        assert truth.peak_reserved_bytes > fixed.peak_reserved_bytes * 1.2
    assert est.unmatched_frees == 0


@pytest.mark.slow
def test_a_run_that_grows_recommends_expandable_segments_and_lists_the_fixes(
    replayed: tuple[SeqRunEstimate, list[int]],
) -> None:
    est, _ = replayed
    assert est.growth > 0.2
    assert any("expandable_segments:True" in r for r in est.recommendations)
    by_name = {v.name: v for v in est.alternatives}
    assert set(by_name) == {"pad", "group", "packing"}
    # packing: every step at MAX, i.e. the fixed-shape run, and it changes the batches
    assert by_name["packing"].reserved_bytes == est.fixed.reserved_bytes
    assert not by_name["packing"].memory_only and by_name["pad"].memory_only

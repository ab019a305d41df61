"""Whisper's full fine-tune and inference on the fast path (issue 32, helper whisper2).

The training rule holds the segment a later step takes again for the backward's largest CUDA
reduction staging block (``WhisperStep.staging_stranded_bytes``); the inference rows are judged
by the inference fit as it is (``benchmarks/infer_reserved.py``, ``WHISPER_FAMILIES``). The
bytes compared are the grid rows' (``benchmarks/results/fastpath_grid.jsonl``: the trace
engine's replay of whisper-base cut to 2 layers), read here, not copied.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memfit.estimate import fastpath
from memfit.estimate.analytic import estimate_analytic
from memfit.estimate.result import MemoryEstimate
from memfit.hardware.cuda_allocator import round_size, segment_size
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks import infer_reserved as bench  # noqa: E402
from benchmarks.fastpath_grid import _latest, real_config  # noqa: E402

MiB = 2**20
WHISPER_BASE_2 = real_config("whisper-base", 2)
#: the grid's whisper-base training shape (fastpath_grid.REAL: batch 5 x 32 label tokens)
TRAIN = {"mode": "train", "precision": "bf16-true", "batch_size": 5, "seq_len": 32}


def _grid_row(family: str, origin: str, job: str) -> dict:
    rows = [json.loads(x) for x in (ROOT / "benchmarks/results/fastpath_grid.jsonl").open()]
    (row,) = [
        r for r in _latest(rows) if (r["family"], r["origin"], r["job"]) == (family, origin, job)
    ]
    return row


def _analytic(end: str = "mid", **fields: object) -> MemoryEstimate:
    w = WorkloadSpec(**{**TRAIN, **fields})  # type: ignore[arg-type]
    return estimate_analytic(WHISPER_BASE_2, w, reserved_end=end)


def test_a_full_fine_tune_reserves_the_staging_blocks_second_segment() -> None:
    """whisper-base cut to 2 layers, batch 5: fc1's bias gradient summed over 5 x 1500 encoder
    frames stages 108 MiB (the SM-count cap); the top of the range now covers the trace's
    reserved bytes (it was 4.89 % under: allocated x 1.278 alone)."""
    est = _analytic("high")  # what the grid's validation judges (fastpath_grid.default_answer)
    stranded = int(est.trace["analytic"]["staging_stranded_bytes"])
    assert stranded == 108 * MiB
    trace = _grid_row("whisper-base", "bundled-2", "train")["trace"]
    top = est.peak_reserved_bytes
    assert top >= trace["reserved_bytes"] * (1 - fastpath.TOLERANCE)
    assert top - stranded < trace["reserved_bytes"] * (1 - fastpath.TOLERANCE)  # needs it
    assert "reduction staging block" in " ".join(est.notes)


def test_a_lora_job_strands_no_staging_segment() -> None:
    """LoRA freezes the biases: no bias gradient is summed, no staging block is stranded."""
    est = _analytic(lora_rank=8)
    assert "staging_stranded_bytes" not in est.trace["analytic"]


def test_the_staging_segment_grows_with_the_encoder_frames_until_the_sm_cap() -> None:
    small, large = _analytic(batch_size=1), _analytic(batch_size=8)
    one = int(small.trace["analytic"]["staging_stranded_bytes"])
    capped = int(large.trace["analytic"]["staging_stranded_bytes"])
    assert one < capped == 108 * MiB


@pytest.mark.slow
def test_the_replay_takes_the_staging_block_a_second_segment_in_a_later_step() -> None:
    """The mechanism, in the trace engine's allocator replay of 3 steps (whisper-base cut to 2
    layers, batch 4): the backward's largest request is the staging block the analytic
    program sizes, it takes a new segment in step 1 and again in step 2 or 3, then never."""
    from memfit.estimate.allocator.caching import CachingAllocatorSim
    from memfit.estimate.trace.engine import trace_step_events

    w = WorkloadSpec(**{**TRAIN, "batch_size": 4})  # type: ignore[arg-type]
    events, marks = trace_step_events(WHISPER_BASE_2, w, n_steps=4)
    start = next(i for p, i in marks if p == "backward")
    stop = next(i for p, i in marks if p == "optimizer")
    largest = max(e[2] for e in events[start:stop] if e[0] == "a")
    stranded = int(estimate_analytic(WHISPER_BASE_2, w).trace["analytic"]["staging_stranded_bytes"])
    assert segment_size(round_size(largest)) == stranded
    sim, fresh = CachingAllocatorSim(), []
    for e in events:
        before = sim.reserved_bytes
        if e[0] == "a":
            sim.malloc(e[1], e[2])
            if e[2] == largest:
                fresh.append(sim.reserved_bytes > before)
        else:
            sim.free(e[1])
    assert fresh[0] and sum(fresh) == 2 and not fresh[-1]


def test_whisper_inference_and_the_full_fine_tune_answer_on_the_fast_path() -> None:
    """``memfit estimate whisper-small --mode infer --gpu T4`` (16-true there), bf16
    inference, the full fine-tune and its checkpointed form are answered by the analytic
    engine."""
    config = {"model_type": "whisper"}
    for fields in (
        {"mode": "infer", "precision": "16-true", "new_tokens": 64},
        {"mode": "infer", "precision": "bf16-true", "new_tokens": 64},
        TRAIN,
        {**TRAIN, "checkpointing": "full"},
    ):
        w = WorkloadSpec(**fields)  # type: ignore[arg-type]
        assert fastpath.not_validated(config, w) is None, fields


@pytest.mark.parametrize(
    ("name", "batch", "seq"), [("whisper-base", 5, 32), ("whisper-small", 5, 128)]
)
def test_a_checkpointed_full_fine_tune_frees_the_recomputed_input_before_the_bias_staging(
    name: str, batch: int, seq: int
) -> None:
    """The grid rows' trace (cut to 2 layers, bf16-true, full checkpointing): the analytic
    peak within 0.1 % (it was +1.20 % / +2.009 %: fc1's recomputed input counted at the bias
    gradient's 108 MiB staging, which the trace frees first)."""
    w = WorkloadSpec(mode="train", precision="bf16-true", batch_size=batch, seq_len=seq,
                     checkpointing="full")  # fmt: skip
    est = estimate_analytic(real_config(name, 2), w)
    trace = _grid_row(name, "bundled-2", "ckpt")["trace"]["allocated_bytes"]
    assert abs(est.peak_allocated_bytes / trace - 1) < 0.001


def test_whisper_inference_rows_are_judged_by_the_fit_not_fitted_to() -> None:
    """The 12 recorded rows (tiny whisper, whisper-base and whisper-small cut to 2 layers;
    ``infer``, ``infer_long`` and their fp16 jobs): the answer shown at most 2 % under the
    trace's reserved bytes, the band's top over them; none is among the fit's points."""
    rows = [
        r for r in bench.moe_rows() + bench.variant_rows() if r["family"] in bench.WHISPER_FAMILIES
    ]
    assert len(rows) >= 12
    assert {r["family"] for r in rows} == set(bench.WHISPER_FAMILIES)
    judged = bench.judge(rows)
    assert all(j["holds"] for j in judged), [j["label"] for j in judged if not j["holds"]]
    assert min(j["shown_err"] for j in judged) > 0.03  # least over: whisper-base infer, +4.75 %
    fitted = {p.label for p in bench.all_points()}
    assert not any(j["label"] in fitted for j in judged)

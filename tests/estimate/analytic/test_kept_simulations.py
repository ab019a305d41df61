"""Simulations the analytic engine keeps across estimates (``api._SIMULATIONS``, issue 32): the
answers of a process that keeps nothing, and never a kept answer for a changed input."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from memfit.estimate.analytic import api, engine, estimate_analytic, estimate_many
from memfit.estimate.result import MemoryEstimate
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

#: (model, workload fields, GPU): training (full, LoRA, QLoRA, checkpointed, accumulated,
#: ZeRO-3 on 2 GPUs, tensor parallel), inference.
JOBS: list[tuple[str, dict[str, Any], str]] = [
    ("llama-3.2-1b", {"batch_size": 2, "seq_len": 1024, "precision": "bf16-mixed"}, "L4"),
    ("llama-3.2-1b", {"batch_size": 1, "seq_len": 1024, "grad_accum": 4}, "L4"),
    (
        "qwen3-0.6b",
        {"batch_size": 4, "seq_len": 512, "lora_rank": 16, "checkpointing": "full"},
        "RTX-4090",
    ),
    (
        "qwen3-0.6b",
        {"batch_size": 3, "seq_len": 512, "lora_rank": 16, "quant": "nf4", "loss": "fused"},
        "A100-80GB",
    ),
    ("qwen3-0.6b", {"batch_size": 2, "seq_len": 512, "gpus": 2, "shard": "zero3"}, "A100-40GB"),
    ("qwen3-0.6b", {"mode": "infer", "batch_size": 4, "seq_len": 512, "tp": 2, "gpus": 2}, "L4"),
    ("llama-3.2-1b", {"mode": "infer", "batch_size": 8, "seq_len": 2048, "new_tokens": 64}, "T4"),
]


def _answer(est: MemoryEstimate) -> str:
    """The estimate as JSON, its run time left out (the one field a kept simulation changes)."""
    data = est.to_json()
    data["trace"]["analytic"].pop("wall_s")
    return json.dumps(data, sort_keys=True, default=repr)


def _forget() -> None:
    api._SIMULATIONS.clear()
    engine._BLOCKS.clear()


def _estimate(job: tuple[str, dict[str, Any], str], **more: Any) -> MemoryEstimate:
    model, fields, gpu = job
    w = WorkloadSpec(**{"mode": "train", **fields, **more})
    return estimate_analytic(resolve_model(model), w, gpu=get_gpu(gpu))


@pytest.fixture
def simulations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the analytic engine's simulations (``api.simulate`` calls)."""
    count = [0]
    real = api.simulate

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "simulate", counted)
    return count


def test_kept_simulations_answer_as_a_process_that_keeps_none(simulations: list[int]) -> None:
    cold = []
    for job in JOBS:
        _forget()
        cold.append(_answer(_estimate(job)))
    _forget()
    for job in [*JOBS, *reversed(JOBS)]:  # every job estimated once, then read back
        _estimate(job)
    simulations[0] = 0
    warm = [_answer(_estimate(job)) for job in JOBS]
    assert simulations[0] == 0  # every answer came from a kept simulation
    assert warm == cold


def test_estimate_many_reads_kept_lines_with_the_same_answers(simulations: list[int]) -> None:
    source, gpu = resolve_model("llama-3.2-1b"), get_gpu("L4")
    base = WorkloadSpec(mode="train", batch_size=1, seq_len=1024, lora_rank=16)
    alone = [base]  # batch 1 alone: its peaks, one simulation
    lines = [replace(base, batch_size=b) for b in (1, 3, 6)]  # through the batch-2 simulation
    _forget()
    cold_alone = [_answer(e) for e in estimate_many(source, alone, gpu=gpu)]
    _forget()
    cold_lines = [_answer(e) for e in estimate_many(source, lines, gpu=gpu)]
    simulations[0] = 0
    warm_lines = [_answer(e) for e in estimate_many(source, lines, gpu=gpu)]
    warm_alone = [_answer(e) for e in estimate_many(source, alone, gpu=gpu)]
    assert simulations[0] == 1  # the lines were kept; batch 1 alone is kept apart (its peaks)
    assert (warm_lines, warm_alone) == (cold_lines, cold_alone)
    fresh = []
    for w in lines:
        _forget()
        fresh.append(_answer(estimate_analytic(source, w, gpu=gpu)))
    assert [json.loads(a)["components"] for a in warm_lines] == [
        json.loads(a)["components"] for a in fresh
    ]


def test_a_config_changed_in_place_is_simulated_again() -> None:
    source = resolve_model("llama-3.2-1b")
    w, gpu = WorkloadSpec(mode="train", batch_size=2, seq_len=1024), get_gpu("L4")
    _forget()
    before = estimate_analytic(source, w, gpu=gpu)
    assert source.config is not None
    source.config["num_hidden_layers"] = 8  # the same dict, changed
    after = estimate_analytic(source, w, gpu=gpu)
    fresh_source = replace(source, config=copy.deepcopy(source.config))
    _forget()
    fresh = estimate_analytic(fresh_source, w, gpu=gpu)
    assert after.peak_allocated_bytes < before.peak_allocated_bytes
    assert _answer(after) == _answer(fresh)


@pytest.mark.parametrize(
    "change",
    [
        {"gpu": "A100-80GB"},
        {"lora_dropout": 0.1},
        {"seq_len": 1032},
        {"grad_accum": 2},
        {"optimizer": "adamw-8bit"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_changed_gpu_or_workload_field_is_not_answered_from_a_kept_one(
    change: dict[str, Any],
) -> None:
    model, fields = "qwen3-0.6b", {"batch_size": 2, "seq_len": 512, "lora_rank": 16}
    more = {k: v for k, v in change.items() if k != "gpu"}
    job = (model, fields, change.get("gpu", "L4"))
    _forget()
    unchanged = _answer(_estimate((model, fields, "L4")))  # kept
    kept = _answer(_estimate(job, **more))
    _forget()
    fresh = _answer(_estimate(job, **more))
    assert fresh != unchanged  # a stale answer would show
    assert kept == fresh

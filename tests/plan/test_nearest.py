"""The "nearest change that fits" of ``memfit estimate``: the fast search (shared spec parts,
workloads built on use, answers kept per job in the process, issue 32) answers what the plain
search answers, job by job.

The reference is the planner as it ran before: every spec part built and validated anew for each
candidate (:func:`memfit.plan.space._shared` bypassed), every option's workload built when the
option is (no memo), nothing kept between jobs. The jobs are run in one order through the fast
path, so an answer kept under a key too coarse (two jobs, one key) hands a later job an earlier
job's answer and fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from memfit.plan import nearest as nearest_mod
from memfit.plan import request as request_mod
from memfit.plan import space as space_mod
from memfit.plan.nearest import _answer, nearest_fit, plan_command, request_of
from memfit.plan.search import plan
from memfit.spec import WorkloadSpec

A100 = "A100-80GB"


def _train(**kw: Any) -> WorkloadSpec:
    base: dict[str, Any] = {"mode": "train", "precision": "bf16-mixed", "optimizer": "adamw"}
    return WorkloadSpec(**{**base, **kw})


#: (model, job, GPU): jobs that do not fit, of different kinds.
JOBS: list[tuple[str, WorkloadSpec, str]] = [
    ("llama-3.1-8b", _train(batch_size=2, seq_len=512), A100),  # full FT (the web benchmark's)
    ("llama-3.1-8b", _train(batch_size=2, seq_len=1024), A100),  # same model, another seq
    ("llama-3.1-8b", _train(batch_size=4, seq_len=512), A100),  # same model, another batch
    ("mistral-7b-v0.1", _train(batch_size=8, seq_len=1024), A100),
    ("llama-3.1-8b", _train(batch_size=2, seq_len=512), "A100-40GB"),  # same job, smaller GPU
    ("llama-3.2-1b", _train(batch_size=8, seq_len=4096), "L4"),  # full FT, small GPU
    ("llama-3.2-1b", _train(batch_size=8, seq_len=4096, checkpointing="full"), "L4"),
    ("llama-3.2-1b", _train(batch_size=4, seq_len=2048, precision="16-mixed"), "T4"),  # no bf16
    ("llama-3.1-8b", _train(batch_size=8, seq_len=4096, lora_rank=16), "L4"),  # LoRA
    ("llama-3.1-8b", _train(batch_size=8, seq_len=8192, lora_rank=16, quant="nf4"), "T4"),  # QLoRA
    ("qwen3-0.6b", _train(batch_size=4, seq_len=32768), "L4"),  # long sequence
    ("qwen3-0.6b", _train(batch_size=4, seq_len=8192, grad_accum=4), "T4"),  # accumulation
    ("mistral-7b-v0.1", _train(batch_size=2, seq_len=2048, optimizer="adamw-8bit"), A100),
    ("gpt2", _train(batch_size=64, seq_len=1024), "T4"),
    ("llama-3.1-8b", WorkloadSpec(mode="infer", batch_size=32, seq_len=8192), "T4"),  # serving
]


def _reference(model: str, w: WorkloadSpec, gpu: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plain search's answer: no shared parts, no workload memo, no kept answers."""
    with monkeypatch.context() as m:
        m.setattr(space_mod, "_shared", lambda build, flat: build(**flat))
        m.setattr(request_mod, "_workload", lambda s, mode, seq, new: s.workload(mode, seq, new))
        p = plan(model, request_of(w), gpu=gpu)
    return _answer(p, plan_command(model, w, gpu)).to_json()


@pytest.fixture(scope="module")
def fast_answers() -> dict[int, dict[str, Any]]:
    """Every job through the fast path in one process, in order, each asked twice (the second
    answer is the kept one)."""
    nearest_mod._ANSWERS.clear()
    out = {}
    for i, (model, w, gpu) in enumerate(JOBS):
        first = nearest_fit(model, w, gpu, model_name=model)
        again = nearest_fit(model, w, gpu, model_name=model)
        assert first is not None and again is not None
        assert again == first
        out[i] = first.to_json()
    return out


IDS = [f"{m}-{g}-{n}" for n, (m, _, g) in enumerate(JOBS)]


@pytest.mark.parametrize("i", range(len(JOBS)), ids=IDS)
def test_fast_nearest_change_is_the_plain_searchs(
    i: int, fast_answers: dict[int, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, w, gpu = JOBS[i]
    expected = _reference(model, w, gpu, monkeypatch)
    assert fast_answers[i] == expected
    assert expected["change"] is not None  # a job that does not fit has a nearest change


def test_kept_answers_are_bounded() -> None:
    assert len(nearest_mod._ANSWERS) <= nearest_mod.MAX_ANSWERS_KEPT


def test_shared_parts_keep_true_and_one_apart() -> None:
    """``reshard_after_forward=True`` (reshard fully) and ``=1`` (a group of one) are equal as
    Python values; the shared parts must not hand one for the other."""
    a = space_mod.Settings(precision="bf16-mixed", gpus=4, shard="fsdp", reshard_after_forward=True)
    b = space_mod.Settings(precision="bf16-mixed", gpus=4, shard="fsdp", reshard_after_forward=1)
    assert a.parallel.reshard_after_forward is True
    assert b.parallel.reshard_after_forward == 1 and b.parallel.reshard_after_forward is not True

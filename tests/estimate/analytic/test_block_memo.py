"""The analytic engine keeps block profiles per process (``engine._BLOCKS``, issue 32): an answer
built from kept blocks must be the answer built from fresh ones, whatever ran before it."""

from __future__ import annotations

import json

import pytest

from memfit.estimate.analytic import api, engine, estimate_analytic
from memfit.estimate.analytic.api import _prepare
from memfit.estimate.analytic.blocks import Work
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

#: Jobs that differ only in what a block must not read (optimizer, its offload, the sharding,
#: the ranks, accumulation, frozen layers, set_to_none) next to ones that change a block
#: (ZeRO's 16-bit model of a *-mixed job, the optimizer stepped in backward, checkpointing,
#: LoRA, inference), so a kept block answering the wrong job would change an answer.
JOBS = [
    {},
    {"optimizer": "adamw-8bit"},
    {"optimizer": "adafactor"},
    {"optimizer": "sgd", "zero_grad_set_to_none": False, "grad_accum": 4},
    {"optimizer_in_bwd": True},
    {"optimizer_in_bwd": True, "optimizer": "adafactor"},
    {"gpus": 2, "shard": "zero2", "offload": "optimizer"},
    {"gpus": 2, "shard": "zero3"},
    {"gpus": 4, "shard": "fsdp"},
    {"gpus": 2, "shard": "ddp"},
    {"shard": "zero2", "offload": "optimizer"},
    {"freeze_layers": 4},
    {"freeze_layers": 4, "optimizer": "adamw-8bit"},
    {"checkpointing": "full"},
    {"checkpointing": "full", "optimizer": "adamw-8bit"},
    {"checkpointing": "offload"},
    {"precision": "bf16-true"},
    {"precision": "bf16-true", "lora_rank": 16},
    {"precision": "bf16-true", "lora_rank": 16, "zero_grad_set_to_none": False},
    {"loss": "chunked"},
    {"loss": "fused"},
    {"loss": "fused", "checkpointing": "full"},
    {"mode": "infer", "new_tokens": 8},
]


def _answer(source: object, job: dict[str, object]) -> str:
    fields = {"batch_size": 2, "seq_len": 256, "precision": "bf16-mixed", **job}
    wl = WorkloadSpec(**fields)  # type: ignore[arg-type]
    api._SIMULATIONS.clear()  # simulated again: the blocks are what is kept (test_kept_simulations)
    est = estimate_analytic(source, wl, gpu=None)
    out = est.to_json()
    out.pop("elapsed_s", None)
    out.get("trace", {}).get("analytic", {}).pop("wall_s", None)
    return json.dumps(out, sort_keys=True, default=str)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gpt2"])
def test_kept_blocks_answer_as_fresh_ones_in_any_order(model: str) -> None:
    source = resolve_model(model)
    fresh = []
    for job in JOBS:
        engine._BLOCKS.clear()
        fresh.append(_answer(source, job))
    engine._BLOCKS.clear()
    kept = [_answer(source, job) for job in JOBS]
    assert len(engine._BLOCKS) > 0
    backwards = [_answer(source, job) for job in reversed(JOBS)][::-1]
    for job, a, b, c in zip(JOBS, fresh, kept, backwards, strict=True):
        assert a == b == c, job


def test_jobs_that_differ_only_in_the_optimizer_share_their_blocks() -> None:
    source = resolve_model("llama-3.2-1b")
    engine._BLOCKS.clear()
    true = {"precision": "bf16-true"}
    _answer(source, true)
    n = len(engine._BLOCKS)
    _answer(source, {**true, "optimizer": "adamw-8bit", "offload": "optimizer", "shard": "zero2"})
    _answer(source, {**true, "optimizer": "adafactor", "grad_accum": 4})
    assert len(engine._BLOCKS) == n  # every block kept from the first job
    _answer(source, {**true, "checkpointing": "full"})
    assert len(engine._BLOCKS) > n  # checkpointing changes the layer block
    m = len(engine._BLOCKS)
    _answer(source, {"shard": "zero2", "offload": "optimizer"})  # ZeRO's 16-bit model
    _answer(source, {})  # bf16-mixed: fp32 parameters
    assert len(engine._BLOCKS) > m + 3
    k = len(engine._BLOCKS)
    _answer(source, {**true, "loss": "fused"})
    assert len(engine._BLOCKS) == k + 1  # the head computes the loss: the layers are kept


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gpt2"])
@pytest.mark.parametrize(
    "job",
    [{}, {"precision": "bf16-true", "lora_rank": 16}, {"precision": "bf16-true", "batch_size": 4}],
)
def test_host_checkpointed_layer_is_the_full_ones_with_its_checkpoint_moved(
    model: str, job: dict[str, object]
) -> None:
    """The memo derives a ``--checkpointing offload`` layer from the full one's profile (the
    same recomputation): it must be the layer built on its own, point for point."""
    source = resolve_model(model)
    fields = {"batch_size": 2, "seq_len": 256, "precision": "bf16-mixed", **job}
    wl = WorkloadSpec(**{**fields, "checkpointing": "offload"})  # type: ignore[arg-type]
    prog, task = _prepare(source.config, wl)
    s = prog.q_len(wl.seq_len)
    w = Work(
        batch=wl.batch_size, q_len=s, kv_len=s, impl=wl.attention, task=task, train=True,
        use_cache=False, checkpointed=True, loss=wl.loss,
    )  # fmt: skip
    for in_rg in (True, False):
        engine._BLOCKS.clear()
        derived = engine._block(prog, "layer", wl, w, in_rg=in_rg)
        built = engine._run_block(prog, "layer", wl, w, in_rg=in_rg)
        assert derived.checkpoint_bytes > 0
        assert derived == built

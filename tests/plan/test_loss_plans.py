"""The fused cross-entropy and checkpoints in host RAM as the planner's memory-only options:
their cost, their label, the search space, and a job that fits only with them (issue 29's
Unsloth notebooks on a T4)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memfit.cli import main
from memfit.hardware import get_gpu
from memfit.plan.cost import COST_CONSTANTS, ModelFacts, Rates, train_step_cost
from memfit.plan.recipe import MEMORY_ONLY, changes
from memfit.plan.space import Settings, SpaceOptions, candidates

FACTS = ModelFacts(
    n_params=8_030_000_000,
    n_layers=32,
    d_model=4096,
    vocab_size=128256,
    kv_bytes_per_token_per_byte=2 * 32 * 8 * 128,
    tied_embeddings=False,
)
T4 = Rates.of(get_gpu("T4"))
BASE = Settings(precision="16-true", optimizer="adamw-8bit", micro_batch=2, grad_accum=4)


def _cost(s: Settings):
    return train_step_cost(s, FACTS, T4, seq_len=2048, trainable_fraction=0.005)


def test_host_checkpoints_recompute_like_full_and_hide_their_copies_behind_compute() -> None:
    """Unsloth's copies are non-blocking on a side stream: the step pays the recomputation of
    full checkpointing and the PCIe time only where it outlasts the compute."""
    full = _cost(replace(BASE, checkpointing="full"))
    offload = _cost(replace(BASE, checkpointing="offload"))
    pcie = offload.parts_s["checkpoint_pcie"]
    per_micro = 2 * 32 * 2 * 2048 * 4096 * 2  # layers x in-and-out x tokens x d_model x fp16
    link = T4.host_bps * COST_CONSTANTS["host_link_efficiency"][0]
    assert pcie == pytest.approx(4 * per_micro / link, rel=0.01)  # 4 micro-batches
    assert pcie < offload.parts_s["compute"]
    assert offload.step_s == pytest.approx(full.step_s)


def test_the_fused_loss_and_host_checkpoints_are_memory_only_changes() -> None:
    recipe = replace(BASE, checkpointing="none")
    plan = replace(BASE, checkpointing="offload", loss="fused")
    found = changes(plan, recipe, "train")
    assert {c.kind for c in found} == {MEMORY_ONLY}
    text = " ".join(c.what for c in found)
    assert "host RAM" in text and "fused linear cross-entropy" in text


def _options(**kw) -> SpaceOptions:
    base = dict(
        mode="train",
        per_rank_batch=8,
        fixed_micro_batch=False,
        gpus=1,
        n_layers=32,
        supports_bf16=True,
        supports_fp8=False,
        keep_full_finetune=True,
    )
    return SpaceOptions(**{**base, **kw})


def test_the_space_tries_the_fused_loss_and_host_checkpoints_on_one_gpu() -> None:
    found = {(s.checkpointing, s.loss) for s in candidates(_options())}
    assert ("offload", "fused") in found and ("none", "full") in found
    no_fused = {s.loss for s in candidates(_options(memory_only_losses=False))}
    assert no_fused == {"full"}
    offloaded = [s for s in candidates(_options()) if s.offload != "none"]
    assert offloaded and all(s.checkpointing != "offload" for s in offloaded)


def test_a_plan_keeps_the_asked_chunked_loss_or_fuses_it(capsys) -> None:
    rc = main([
        "plan", "llama-3.1-8b", "--gpu", "T4", "--seq", "2048", "--global-batch", "8",
        "--lora-rank", "16", "--quant", "nf4-dq", "--optimizer", "adamw-8bit",
        "--precision", "16-true", "--loss", "chunked", "--engine", "analytic",
        "--confirm", "none", "--json",
    ])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    rec = out["recommended"]["settings"]
    assert rec["loss"] in ("chunked", "fused") and rec["lora_rank"] == 16

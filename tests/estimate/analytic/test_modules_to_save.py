"""peft's ``modules_to_save`` beside LoRA (``--lora-modules-to-save``; axolotl / TRL
``lora_modules_to_save``, LLaMA-Factory ``additional_target``): peft's ``ModulesToSaveWrapper``
keeps the frozen original and trains a ``deepcopy`` of it in the same dtype, so the job carries a
second copy of each saved module, its gradient and its optimizer states. The analytic engine
models the embedding and the LM head of untied chain models and is checked against the trace
(which runs peft itself); it hands everything else to the trace."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY
from tests.estimate.analytic.test_vs_trace import assert_matches_trace

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec

SAVED = ("embed_tokens", "lm_head")

CASES = [
    ("llama", {"lora_rank": 4, "lora_modules_to_save": SAVED, "precision": "bf16-true"}),
    ("llama", {"lora_rank": 4, "lora_modules_to_save": ("lm_head",), "checkpointing": "full"}),
    (
        "llama",
        {"lora_rank": 4, "lora_modules_to_save": ("embed_tokens",), "precision": "bf16-mixed"},
    ),
    ("neox", {"lora_rank": 4, "lora_modules_to_save": ("embed_in", "lm_head")}),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CASES)])
def test_saved_modules_match_the_trace_of_peft(case, trace_hf) -> None:
    family, overrides = case
    traced, analytic = assert_matches_trace(TINY[family], overrides, trace_hf, family)
    plain = estimate_analytic(
        TINY[family],
        WorkloadSpec(
            batch_size=2,
            seq_len=64,
            **{k: v for k, v in overrides.items() if k != "lora_modules_to_save"},
        ),
    )
    # the copies train: more trainable parameters than the adapters alone, and more memory
    assert analytic.n_trainable_params > plain.n_trainable_params
    assert analytic.peak_allocated_bytes > plain.peak_allocated_bytes


def test_saved_embedding_and_head_add_a_copy_its_gradient_and_two_adam_states() -> None:
    """Llama-3.1-8B, bf16 base, AdamW: each copy is vocab x hidden bf16 (0.98 GiB); the
    optimizer step holds the copies, their gradients and AdamW's two states: at least 4 x
    the two copies more than the plain LoRA job."""
    kw = dict(batch_size=1, seq_len=256, lora_rank=8, precision="bf16-true")
    from memfit.estimate import estimate

    plain = estimate("llama-3.1-8b", WorkloadSpec(**kw), engine="analytic")
    saved = estimate(
        "llama-3.1-8b", WorkloadSpec(**kw, lora_modules_to_save=SAVED), engine="analytic"
    )
    copies = 2 * 128256 * 4096 * 2
    step = "optimizer"
    assert (
        saved.phases[step].peak_allocated_bytes - plain.phases[step].peak_allocated_bytes
        >= 4 * copies
    )
    assert saved.n_trainable_params - plain.n_trainable_params == 2 * 128256 * 4096


def test_the_analytic_engine_hands_on_what_it_does_not_model() -> None:
    tied = dict(TINY["llama"], tie_word_embeddings=True)
    wl = WorkloadSpec(batch_size=1, seq_len=32, lora_rank=4, lora_modules_to_save=SAVED)
    with pytest.raises(NotModelledError, match="tied embeddings"):
        estimate_analytic(tied, wl)
    other = WorkloadSpec(batch_size=1, seq_len=32, lora_rank=4, lora_modules_to_save=("norm",))
    with pytest.raises(NotModelledError, match="norm"):
        estimate_analytic(TINY["llama"], other)


def test_a_name_that_matches_no_module_is_refused_by_the_trace(trace_hf) -> None:
    wl = WorkloadSpec(batch_size=1, seq_len=32, lora_rank=4, lora_modules_to_save=("nope",))
    with pytest.raises(SpecError, match="nope"):
        trace_hf(TINY["llama"], wl, name="llama")


def test_modules_to_save_need_a_lora_training_job() -> None:
    with pytest.raises(SpecError, match="lora_modules_to_save"):
        WorkloadSpec(lora_modules_to_save=SAVED)
    with pytest.raises(SpecError, match="module names"):
        WorkloadSpec(lora_rank=8, lora_modules_to_save=("",))
    w = WorkloadSpec(lora_rank=8, lora_modules_to_save=["embed_tokens"])
    assert w.lora_modules_to_save == ("embed_tokens",)
    assert w.normalized()["lora_modules_to_save"] == ["embed_tokens"]
    assert "lora_modules_to_save" not in WorkloadSpec(lora_rank=8).normalized()

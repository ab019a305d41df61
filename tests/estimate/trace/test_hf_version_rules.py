"""The trace engine runs a causal LM's training step as the named transformers release did
(memfit.spec.hf_versions: fp32 logits returned before 4.46) and peft's LoRA dropout as peft
builds it (an nn.Dropout on each adapter's input)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from benchmarks.tiny_models import tiny_config

from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def _trace(config: dict, **kwargs: object) -> MemoryEstimate:
    return trace_hf(config, WorkloadSpec(**kwargs), name="t", extrapolate=False)  # type: ignore[arg-type]


def test_before_446_the_output_holds_fp32_logits_through_backward() -> None:
    """A wide vocabulary makes the logits the step's largest tensors: transformers 4.40 returns
    them in fp32 (4 B per element, held with the output) where the installed release returns the
    bf16 ones (2 B) and upcasts inside its loss, so backward starts about 2 B x N higher (less
    the last position the old loss shifted away)."""
    config = dict(tiny_config("llama"), vocab_size=32000)
    job = {"batch_size": 2, "seq_len": 64, "precision": "bf16-true"}
    now = _trace(config, **job)
    old = _trace(config, **job, transformers_version="4.40")
    n = 2 * 64 * 32000
    grown = (
        old.phases["backward"].peak_allocated_bytes - now.phases["backward"].peak_allocated_bytes
    )
    assert 1.5 * n <= grown <= 6 * n, grown / n
    assert any("4.40" in note and "fp32" in note for note in old.notes)
    same = _trace(config, **job, transformers_version="4.50")
    assert same.peak_allocated_bytes == now.peak_allocated_bytes


def test_lora_dropout_keeps_a_mask_and_a_dropped_copy_per_adapter() -> None:
    """peft's ``lora_B(lora_A(dropout(x)))``: above 0 each adapter keeps the bool mask (1 B per
    input element) and its dropped copy for backward, in place of the shared input; at most
    (4 + 1) B per element of every adapter's input in fp32 (2 layers x q, v here)."""
    config = tiny_config("llama")  # hidden 32, 2 layers
    job = {
        "batch_size": 2, "seq_len": 16, "precision": "32-true", "lora_rank": 4,
        "lora_targets": ("q_proj", "v_proj"),
    }  # fmt: skip
    plain = _trace(config, **job)
    dropped = _trace(config, **job, lora_dropout=0.1)
    per_input = 2 * 16 * 32  # tokens x in_features
    masks = 2 * 2 * per_input  # layers x adapters x 1 B
    grown = dropped.peak_allocated_bytes - plain.peak_allocated_bytes
    assert masks <= grown <= 2 * 2 * per_input * (4 + 1), grown


def test_peft_before_012_trains_bf16_adapters_on_a_bf16_base() -> None:
    """The installed peft casts the adapters to fp32 (``autocast_adapter_dtype``); peft 0.9 kept
    them in the base's bf16: the adapters' Adam states take half the bytes (2 x 2 B, not
    2 x 4 B per trainable parameter)."""
    wide = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
    config = {**tiny_config("llama"), **wide, "num_key_value_heads": 2}  # 512 B-aligned states
    job = {"batch_size": 2, "seq_len": 16, "precision": "bf16-true", "lora_rank": 64}
    now = _trace(config, **job)
    old = _trace(config, **job, peft_version="0.9")
    states_now = now.phases["optimizer"].components["optimizer_states"]
    states_old = old.phases["optimizer"].components["optimizer_states"]
    assert now.n_trainable_params == old.n_trainable_params > 0
    assert states_now == 2 * states_old
    assert any("peft 0.9" in note for note in old.notes)

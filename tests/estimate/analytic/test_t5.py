"""The analytic engine's encoder-decoder program (T5 / Flan-T5) against the trace engine.

Same bounds as test_vs_trace.py: 3 % on peak allocated bytes, and 5 % once the cuBLAS workspaces
(which dwarf a tiny model's activations) are left out of both; parameter and trainable counts
exact; the same phases.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.conftest import TINY_T5
from tests.estimate.analytic.test_vs_trace import (
    CHECKPOINT_NET_TOLERANCE,
    TOLERANCE,
    _fixed_bytes,
    assert_matches_trace,
)

from memfit.errors import SpecError
from memfit.estimate.analytic import estimate_analytic, estimate_many
from memfit.estimate.analytic.registry import read_arch
from memfit.spec import WorkloadSpec

#: Flan-T5's layout: gated-GELU feed-forward, unscaled decoder output (``tie_word_embeddings:
#: false`` in config.json; the weights are tied all the same), a head width that is not
#: d_model / num_heads, and an asymmetric decoder.
TINY_FLAN = dict(
    TINY_T5,
    feed_forward_proj="gated-gelu",
    tie_word_embeddings=False,
    d_kv=16,
    num_decoder_layers=2,
)

CASES = [
    (TINY_T5, {}),
    (TINY_T5, {"precision": "fp32"}),
    (TINY_T5, {"precision": "amp-bf16"}),
    (TINY_T5, {"precision": "fp16"}),  # ``wo`` stays fp32: an fp32 residual stream
    (TINY_T5, {"precision": "fp16", "checkpointing": "full"}),
    (TINY_T5, {"precision": "fp16", "mode": "infer", "new_tokens": 3}),
    (TINY_T5, {"attention": "eager"}),
    (TINY_T5, {"attention": "eager", "precision": "amp-bf16"}),
    (TINY_T5, {"checkpointing": "full"}),
    (TINY_T5, {"checkpointing": "selective"}),
    (TINY_T5, {"lora_rank": 4}),
    (TINY_T5, {"lora_rank": 4, "lora_targets": ("q", "v"), "checkpointing": "full"}),
    (TINY_T5, {"freeze_layers": 1}),
    (TINY_T5, {"zero_grad_set_to_none": False}),
    (TINY_T5, {"optimizer": "adamw-8bit"}),
    (TINY_T5, {"optimizer": "adafactor", "precision": "fp32"}),
    (TINY_T5, {"mode": "infer", "new_tokens": 4}),
    (TINY_T5, {"mode": "infer", "new_tokens": 1}),
    (TINY_T5, {"mode": "infer", "new_tokens": 4, "precision": "amp-bf16"}),
    (TINY_T5, {"mode": "infer", "new_tokens": 6, "attention": "eager", "precision": "fp32"}),
    (TINY_FLAN, {}),
    (TINY_FLAN, {"precision": "amp-bf16", "checkpointing": "full"}),
    (TINY_FLAN, {"mode": "infer", "new_tokens": 3}),
    (TINY_T5, {"quant": "nf4", "lora_rank": 4}),
    (TINY_T5, {"gpus": 2, "shard": "ddp"}),
    (TINY_T5, {"gpus": 2, "shard": "zero2", "offload": "optimizer"}),
    (TINY_T5, {"gpus": 4, "shard": "zero3"}),
    (TINY_T5, {"gpus": 4, "shard": "zero3", "offload": "params"}),
    (TINY_T5, {"mode": "infer", "new_tokens": 3, "quant": "int8"}),
]


def _ids(case: tuple[dict, dict]) -> str:
    config, wl = case
    name = "flan" if config is TINY_FLAN else "t5"
    return name + ":" + (",".join(f"{k}={v}" for k, v in wl.items()) or "default")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_t5_analytic_peak_is_within_three_percent_of_the_trace(case, trace_hf) -> None:
    config, overrides = case
    assert_matches_trace(config, overrides, trace_hf, _ids(case))


#: Checkpointed T5 with SGD (the backward is the peak). Beyond what every family's checkpoint
#: does (test_vs_trace.py): each stack's position bias, made by layer 0, is an argument of every
#: later layer's checkpoint and goes with layer 1's, the last to be done (the cross-attention's
#: zero bias is a leaf its AccumulateGrad keeps to the end); the recomputed bias lives until its
#: layer's recomputation ends; backward starts from the loss alone. Net errors were +4.3 % (T5)
#: and +4.4 % (Flan-T5); measured within 0.3 %, hence the same 1 % as test_vs_trace.py.
T5_CHECKPOINT_CASES = [
    # pure bf16, as validated (under the bf16-mixed default the analytic T5 checkpointed step is
    # 1.4 % under the trace: a known gap, docs/accuracy.md)
    (TINY_T5, {"checkpointing": "full", "precision": "bf16-true"}),
    (TINY_T5, {"checkpointing": "selective", "precision": "bf16-true"}),
    (TINY_FLAN, {"checkpointing": "full", "precision": "bf16-true"}),
    (
        TINY_T5,
        {
            "checkpointing": "full",
            "lora_rank": 4,
            "lora_targets": ("q", "v"),
            "precision": "bf16-true",
        },
    ),
]


@pytest.mark.parametrize("case", T5_CHECKPOINT_CASES, ids=[_ids(c) for c in T5_CHECKPOINT_CASES])
def test_checkpointed_t5_layers_free_the_position_bias_with_layer_one(case, trace_hf) -> None:
    config, overrides = case
    wl = WorkloadSpec(batch_size=2, seq_len=64, optimizer="sgd", **overrides)
    traced = trace_hf(config, wl, name="t5")
    analytic = estimate_analytic(config, wl)
    fixed = _fixed_bytes(wl)
    net = (analytic.peak_allocated_bytes - fixed) / (traced.peak_allocated_bytes - fixed) - 1
    assert abs(net) <= CHECKPOINT_NET_TOLERANCE, net


def test_checkpointed_t5_forward_under_autocast_keeps_the_cached_weight_casts(trace_hf) -> None:
    """The model returns (with its loss) before autocast exits and frees the cached casts of
    every checkpointed layer's weights: flan-t5-large's peak (batch 8 x 1024, AMP, full
    checkpointing) is there. The forward phase was -12 % without them."""
    wl = WorkloadSpec(batch_size=2, seq_len=64, precision="amp-bf16", checkpointing="full")
    traced = trace_hf(TINY_FLAN, wl, name="flan")
    analytic = estimate_analytic(TINY_FLAN, wl)
    fixed = _fixed_bytes(wl)
    a, t = (e.phases["forward"].peak_allocated_bytes - fixed for e in (analytic, traced))
    assert abs(a / t - 1) <= CHECKPOINT_NET_TOLERANCE, (a, t)


def test_a_wider_t5_at_a_longer_sequence_stays_within_tolerance(trace_hf) -> None:
    """Sequence-squared terms (the position bias, its expanded gradient, eager scores) grow
    faster than the rest: a config none of the closed forms were written on, at 4x the length."""
    config = dict(TINY_T5, d_model=256, d_kv=64, d_ff=512, vocab_size=1000)
    for overrides in ({}, {"checkpointing": "full"}, {"precision": "amp-bf16"}):
        wl = WorkloadSpec(batch_size=4, seq_len=256, **overrides)
        traced = trace_hf(config, wl, name="t5-held-out")
        analytic = estimate_analytic(config, wl)
        error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
        assert abs(error) <= TOLERANCE, (overrides, error)


def test_t5_config_reader_follows_t5config() -> None:
    a = read_arch(TINY_FLAN)
    assert (a.hidden, a.head_dim, a.n_heads, a.ffn) == (128, 16, 4, 256)
    assert (a.n_layers, a.n_dec_layers) == (3, 2)
    assert a.act == "gelu_new" and a.extra["_gated"]
    assert a.tie  # T5Config forces the tie in transformers 5
    assert not a.extra["_scale_decoder_outputs"]
    assert read_arch(TINY_T5).extra["_scale_decoder_outputs"]
    assert read_arch(TINY_T5).n_dec_layers == 3  # num_decoder_layers defaults to num_layers


def test_t5_batch_api_matches_single_estimates() -> None:
    for base in (WorkloadSpec(seq_len=64), WorkloadSpec(mode="infer", seq_len=64, new_tokens=4)):
        wls = [replace(base, batch_size=b) for b in (1, 3, 8)]
        many = estimate_many(TINY_T5, wls)
        one = [estimate_analytic(TINY_T5, wl) for wl in wls]
        assert [e.peak_allocated_bytes for e in many] == [e.peak_allocated_bytes for e in one]


def test_t5_fsdp_and_tp_are_refused_with_a_pointer_to_the_trace_engine() -> None:
    """FSDP2 wraps the longest block list in the trace (T5's encoder only) and the
    tensor-parallel split is for Llama-style decoders: neither is modelled for T5."""
    with pytest.raises(SpecError, match=r"shard='fsdp'.*encoder-decoder.*--engine trace"):
        estimate_analytic(TINY_T5, WorkloadSpec(gpus=2, shard="fsdp"))
    with pytest.raises(SpecError, match=r"tp \(2\) with model_type 't5'.*Llama-style"):
        estimate_analytic(TINY_T5, WorkloadSpec(gpus=2, tp=2))

"""The fake trace counts exactly what the same step allocates when executed for real on CPU.

Both runs use the same tracker; the real run builds the model with real (random) weights on the CPU.
CPU has no FlashAttention kernel, so CUDA's SDPA routing is off in both runs
(``emulate_cuda=False``); the routing itself is checked against GPU measurements (docs/accuracy.md).
Tolerance: none — every phase peak and every component must be equal to the byte.
"""

from __future__ import annotations

import pytest
from tests.conftest import TINY_BERT, TINY_GPT2, TINY_LLAMA, TINY_T5

from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec


def _both(config: dict, **workload) -> tuple:
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 64, **workload})
    fake, real = (
        trace_hf(config, wl, name="t", extrapolate=False, execution=ex, emulate_cuda=False)
        for ex in ("fake", "real")
    )
    return fake, real


def _assert_equal(fake, real) -> None:
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert fake.peak_phase == real.peak_phase
    assert {k: v.to_json() for k, v in fake.phases.items()} == {
        k: v.to_json() for k, v in real.phases.items()
    }
    assert fake.n_params == real.n_params and fake.n_trainable_params == real.n_trainable_params


LLAMA_MATRIX = [
    {},
    {"precision": "fp32"},
    {"precision": "16-true"},
    {"precision": "amp-bf16"},
    {"precision": "amp-fp16"},
    {"attention": "eager"},
    {"checkpointing": "full"},
    {"checkpointing": "selective"},
    {"optimizer": "adamw-fused"},
    {"optimizer": "sgd"},
    {"optimizer": "sgd-momentum"},
    {"optimizer": "adafactor"},
    {"optimizer": "none"},
    {"lora_rank": 8},
    {"lora_rank": 4, "lora_targets": ("q_proj", "v_proj"), "checkpointing": "full"},
    {"freeze_layers": 1},
    {"mode": "infer", "new_tokens": 6},
    {"mode": "infer", "precision": "fp32"},
]


@pytest.mark.parametrize(
    "workload", LLAMA_MATRIX, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "default"
)
def test_fake_trace_of_llama_equals_real_cpu_execution(workload: dict) -> None:
    _assert_equal(*_both(TINY_LLAMA, **workload))


@pytest.mark.parametrize(
    "workload",
    [
        {},
        {"precision": "fp32", "attention": "eager"},
        {"precision": "amp-bf16"},
        {"mode": "infer", "new_tokens": 4},
    ],
)
def test_fake_trace_of_gpt2_equals_real_cpu_execution(workload: dict) -> None:
    _assert_equal(*_both(TINY_GPT2, **workload))


@pytest.mark.parametrize("workload", [{}, {"precision": "fp32"}, {"mode": "infer"}])
def test_fake_trace_of_bert_classifier_equals_real_cpu_execution(workload: dict) -> None:
    _assert_equal(*_both(TINY_BERT, **workload))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fake_trace_of_t5_equals_real_cpu_execution(precision: str) -> None:
    """fp16 also runs T5's fp32 ``wo`` path (``_keep_in_fp32_modules``)."""
    _assert_equal(*_both(TINY_T5, precision=precision))


def test_t5_keeps_wo_in_fp32_under_fp16_as_from_pretrained_does() -> None:
    """``from_pretrained(dtype=float16)`` loads ``_keep_in_fp32_modules`` in fp32; the trace builds
    with ``from_config`` and applies the same plan (bf16 and fp32 are left as they are)."""
    import torch

    from memfit.estimate.trace.build import build_hf_model

    for precision, wo, rest in (
        ("16-true", torch.float32, torch.float16),
        ("bf16-true", torch.bfloat16, torch.bfloat16),
    ):
        model = build_hf_model(dict(TINY_T5), WorkloadSpec(precision=precision), "seq2seq")
        dtypes = {n.split(".")[-2]: p.dtype for n, p in model.named_parameters()}
        assert dtypes["wo"] == wo and dtypes["q"] == rest and dtypes["shared"] == rest


def test_real_and_fake_runs_are_not_trivially_equal(tiny_llama: dict) -> None:
    """Guard against a comparison that cannot fail: a bigger batch must change the peak."""
    small, _ = _both(tiny_llama)
    big, _ = _both(tiny_llama, batch_size=4)
    assert big.peak_allocated_bytes > small.peak_allocated_bytes
    assert big.components["activations"] > small.components["activations"]


def test_fake_trace_of_full_size_gpt2_small_equals_real_cpu_execution() -> None:
    """GPT-2 small at its real size (124M parameters), fp32, one short sequence."""
    from memfit.models import resolve_model

    config = resolve_model("gpt2").config
    assert config is not None
    fake, real = _both(config, batch_size=1, seq_len=32, precision="fp32")
    _assert_equal(fake, real)
    assert fake.n_params == 124_439_808

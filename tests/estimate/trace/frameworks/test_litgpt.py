"""LitGPT jobs traced through LitGPT's own GPT, its LoRA and Lightning's bitsandbytes path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("litgpt")

from memfit.errors import SpecError  # noqa: E402
from memfit.estimate.trace.frameworks import estimate_with_framework  # noqa: E402
from memfit.estimate.trace.frameworks import litgpt as litgpt_engine  # noqa: E402
from memfit.estimate.trace.frameworks.litgpt import (  # noqa: E402
    bnb_keeps_input,
    build_model,
    fabric_output,
)
from memfit.estimate.trace.quantized import QuantizedLinear  # noqa: E402
from memfit.estimate.trace.user_step import trace_step  # noqa: E402
from memfit.spec import WorkloadSpec  # noqa: E402

PYTHIA = {"checkpoint_dir": "checkpoints/EleutherAI/pythia-14m", "precision": "bf16-true"}
QLORA = {**PYTHIA, "lora_r": 8, "quantize": "bnb.nf4"}


def estimate(data, **options):
    w = WorkloadSpec(mode="train", batch_size=2, seq_len=64, precision="bf16-true")
    return estimate_with_framework("litgpt", data, w, **options)


def test_bitsandbytes_precision_quantizes_every_linear_the_lm_head_included():
    model = build_model(QLORA, 64)
    assert isinstance(model.lm_head.linear, QuantizedLinear)  # transformers keeps it in bf16
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.transformer.wte).__name__ == "StableEmbedding"


def test_lora_trains_litgpts_adapters_in_bf16():
    from litgpt.utils import num_parameters

    model = build_model({**PYTHIA, "lora_r": 8}, 64)
    est = estimate({**PYTHIA, "lora_r": 8})
    assert est.n_trainable_params == num_parameters(model, requires_grad=True)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if p.requires_grad)
    assert est.engine_reason == "LitGPT's model + finetune step"


def test_old_bitsandbytes_keeps_each_4bit_layers_input_until_backward():
    assert bnb_keeps_input("0.42.0") and not bnb_keeps_input("0.50.2")
    old = estimate(QLORA, bnb_version="0.42.0")
    new = estimate(QLORA, bnb_version="0.50.2")
    assert old.peak_allocated_bytes > new.peak_allocated_bytes


def test_a_name_litgpt_does_not_know_is_a_clear_error():
    with pytest.raises(SpecError, match=r"'nope-7b' is not a LitGPT model name"):
        build_model({"checkpoint_dir": "checkpoints/x/nope-7b"}, 64)


def test_fabric_hands_the_logits_to_the_loss_in_fp32():
    chunks = [torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.bfloat16)]
    assert [t.dtype for t in fabric_output(chunks)] == [torch.float32, torch.float32]
    ids = torch.zeros(2, dtype=torch.long)
    assert fabric_output(ids) is ids


def test_fp32_logits_raise_the_lora_peak_by_at_least_their_extra_bytes(monkeypatch):
    data = {**PYTHIA, "lora_r": 8}
    with_cast = estimate(data).peak_allocated_bytes
    monkeypatch.setattr(litgpt_engine, "fabric_output", lambda out: out)
    without = estimate(data).peak_allocated_bytes
    vocab = build_model(data, 64).config.padded_vocab_size
    assert with_cast - without >= 2 * 64 * vocab * 2  # bf16 -> fp32: 2 more bytes a logit


def test_lightning_quantizes_from_fp16_so_a_4bit_matmul_holds_two_weight_copies():
    model = build_model(QLORA, 64)
    assert all(m.state_dtype is torch.float16 for m in model.modules() if hasattr(m, "fmt"))

    def peak(state_dtype):
        layer = QuantizedLinear(
            "nf4",
            1024,
            1024,
            bias=False,
            dtype=torch.bfloat16,
            compute_dtype=torch.bfloat16,
            state_dtype=state_dtype,
        )
        x = {"x": torch.zeros(1, 64, 1024, dtype=torch.bfloat16)}
        est = trace_step(lambda m, _o, b: m(b["x"]), model=layer, inputs=lambda: x, n_steps=1)
        return est.peak_allocated_bytes

    # the peak moves from the matmul (weight + output) to the cast, where dequantize_4bit's
    # fp16 weight is alive beside the bf16 one the matmul reads and no output exists yet
    weight, out = 1024 * 1024 * 2, 64 * 1024 * 2
    assert peak(torch.float16) - peak(None) == weight - out

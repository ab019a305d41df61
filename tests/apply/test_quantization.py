"""Quantized base weights applied with bitsandbytes (0.50 runs on CPU) and torchao, then QLoRA
training steps through them."""

from __future__ import annotations

import pytest
import torch
from tests.apply.conftest import applied, batch, build
from tests.conftest import TINY_LLAMA

import memfit
from memfit.apply import AmpStep, UnsupportedHardwareError, training_step, verify_plan
from memfit.apply.quantization import from_pretrained_kwargs, quantized_layers
from memfit.estimate import quant
from memfit.spec import WorkloadSpec

pytest.importorskip("bitsandbytes")


def _real_stored(layer: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The tensors a bitsandbytes layer really holds, by the names memfit's estimator uses."""
    w = layer.weight
    out = {"weight": (tuple(w.shape), w.dtype)}
    if type(layer).__name__ == "Linear8bitLt":
        out["SCB"] = (tuple(w.SCB.shape), w.SCB.dtype)
        return out
    qs = w.quant_state
    out["absmax"] = (tuple(qs.absmax.shape), qs.absmax.dtype)
    out["quant_map"] = (tuple(qs.code.shape), qs.code.dtype)
    if qs.nested:
        out["nested_absmax"] = (tuple(qs.state2.absmax.shape), qs.state2.absmax.dtype)
        out["nested_quant_map"] = (tuple(qs.state2.code.shape), qs.state2.code.dtype)
        out["offset"] = (tuple(qs.offset.shape), qs.offset.dtype)
    return out


@pytest.mark.parametrize(
    "fmt,cls",
    [
        ("nf4", "Linear4bit"),
        ("nf4-dq", "Linear4bit"),
        ("fp4", "Linear4bit"),
        ("int8", "Linear8bitLt"),
    ],
)
def test_bitsandbytes_layers_store_what_the_estimator_charges(fmt: str, cls: str) -> None:
    model, w = applied(TINY_LLAMA, quant=fmt, lora_rank=4)
    layers = quantized_layers(model)
    # every Linear of the decoder blocks (7 per block), never the output head
    assert len(layers) == 3 * 7 and set(layers.values()) == {cls}
    assert not any("lm_head" in n for n in layers)
    q = model.get_submodule(next(iter(layers)))
    expected = {
        t.name: (t.shape, getattr(torch, t.dtype))
        for t in quant.stored_tensors(fmt, q.out_features, q.in_features, bias=False)
    }
    assert _real_stored(q) == expected


@pytest.mark.parametrize("fmt", ["nf4-dq", "int8"])
def test_qlora_trains_adapters_through_quantized_layers(fmt: str) -> None:
    model, w = applied(TINY_LLAMA, quant=fmt, lora_rank=4)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert type(q_proj).__module__.startswith("peft.tuners.lora.bnb")  # peft's bitsandbytes LoRA
    packed = q_proj.base_layer.weight.detach().clone()
    opt = memfit.build_optimizer(model, w)
    amp = AmpStep(w, device_type="cpu")
    training_step(model, batch(), opt, amp)
    assert q_proj.lora_A["default"].weight.grad is None  # zeroed after the step…
    training_step(model, batch(), None, amp)  # …and produced again by backward (no step)
    assert q_proj.lora_A["default"].weight.requires_grad
    assert torch.equal(q_proj.base_layer.weight, packed)  # the quantized base never changes
    assert verify_plan(model, w, optimizer=opt) == []


@pytest.mark.parametrize(
    "fmt,tensor,dtype",
    [("int8", "Int8Tensor", torch.int8), ("fp8", "Float8Tensor", torch.float8_e4m3fn)],
)
def test_torchao_weight_only_runs_on_cpu(fmt: str, tensor: str, dtype: torch.dtype) -> None:
    pytest.importorskip("torchao")
    w = WorkloadSpec(batch_size=2, seq_len=16, quant=fmt, lora_rank=4)
    model = memfit.apply_plan_(build(TINY_LLAMA), w, quant_backend="torchao")
    base = model.base_model.model.model.layers[0].mlp.up_proj.base_layer
    assert type(base.weight).__name__ == tensor and base.weight.qdata.dtype == dtype
    loss = training_step(
        model, batch(), memfit.build_optimizer(model, w), AmpStep(w, device_type="cpu")
    )
    assert torch.isfinite(torch.tensor(loss))


def test_fp8_matmuls_need_an_fp8_gpu_and_nothing_changes_before_the_error() -> None:
    model = build(TINY_LLAMA)
    with pytest.raises(UnsupportedHardwareError, match=r"compute capability 8\.9\+.*on 'cpu'"):
        memfit.apply_plan_(model, WorkloadSpec(quant="fp8", lora_rank=4))
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # not cast to bf16 first


def test_gptq_and_awq_need_a_prequantized_checkpoint() -> None:
    with pytest.raises(memfit.SpecError, match="pre-quantized checkpoint.*quant_backend='torchao'"):
        memfit.apply_plan_(build(TINY_LLAMA), WorkloadSpec(quant="int4-awq", lora_rank=4))


def test_torchao_int4_needs_cuda() -> None:
    pytest.importorskip("torchao")
    with pytest.raises(UnsupportedHardwareError, match=r"Int4WeightOnlyConfig needs a CUDA GPU"):
        memfit.apply_plan_(
            build(TINY_LLAMA), WorkloadSpec(quant="int4-gptq", lora_rank=4), quant_backend="torchao"
        )


def test_unknown_quant_backend_is_refused() -> None:
    with pytest.raises(memfit.SpecError, match=r"quant_backend \('gguf'\) must be one of"):
        memfit.apply_plan_(
            build(TINY_LLAMA), WorkloadSpec(quant="int8", lora_rank=4), quant_backend="gguf"
        )


def test_from_pretrained_kwargs_build_the_bitsandbytes_config_memfit_plan_prints() -> None:
    from transformers import BitsAndBytesConfig

    kw = from_pretrained_kwargs(
        WorkloadSpec(precision="bf16-true", quant="nf4-dq", lora_rank=16, attention="eager")
    )
    qc = kw["quantization_config"]
    assert isinstance(qc, BitsAndBytesConfig)
    assert qc.load_in_4bit and qc.bnb_4bit_quant_type == "nf4" and qc.bnb_4bit_use_double_quant
    assert qc.bnb_4bit_compute_dtype == torch.bfloat16
    assert kw["dtype"] == torch.bfloat16 and kw["attn_implementation"] == "eager"
    assert "quantization_config" not in from_pretrained_kwargs(WorkloadSpec())

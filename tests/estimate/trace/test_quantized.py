"""Quantized stand-ins: the fake trace equals real CPU execution, the stand-ins store what the real
libraries store, and bitsandbytes' own CPU kernels allocate what the stand-ins allocate where the
CPU and CUDA code paths coincide.

bitsandbytes runs on CPU (tests skip without it); GPTQ/AWQ kernels and FP8 ``_scaled_mm`` need a
GPU, so those formats are checked against the hand formulas of test_quant_formats.py only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from tests.conftest import TINY_GPT2, TINY_LLAMA

from memfit.errors import SpecError
from memfit.estimate import quant
from memfit.estimate.trace import build, quantized
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec

FORMATS = ["nf4", "nf4-dq", "fp4", "int8", "int4-gptq", "int4-awq", "fp8"]


def _fake_and_real(config: dict, **workload: Any) -> tuple[Any, Any]:
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 64, "quant_group_size": 64, **workload})
    return tuple(  # type: ignore[return-value]
        trace_hf(config, wl, name="t", extrapolate=False, execution=ex, emulate_cuda=False)
        for ex in ("fake", "real")
    )


def _phases(est: Any) -> dict:
    return {k: v.to_json() for k, v in est.phases.items()}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "workload",
    [{"mode": "infer", "new_tokens": 3}, {"lora_rank": 8}],
    ids=["infer", "qlora"],
)
def test_fake_trace_of_quantized_llama_equals_real_cpu_execution(fmt: str, workload: dict) -> None:
    fake, real = _fake_and_real(TINY_LLAMA, quant=fmt, **workload)
    assert _phases(fake) == _phases(real)
    assert fake.n_params == real.n_params


def test_fake_trace_of_quantized_gpt2_conv1d_equals_real_cpu_execution() -> None:
    fake, real = _fake_and_real(TINY_GPT2, quant="nf4", lora_rank=4, checkpointing="full")
    assert _phases(fake) == _phases(real)


def _stand_ins(model: torch.nn.Module) -> dict[str, quantized.QuantizedLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, quantized.QuantizedLinear)}


def test_quantized_llama_2_7b_on_meta_holds_the_hand_formula_bytes() -> None:
    """Full-size Llama-2-7B, built on meta: 224 quantized linears, lm_head and embeddings kept."""
    from memfit.models import resolve_model

    config = resolve_model("llama-2-7b").config
    wl = WorkloadSpec(mode="infer", quant="nf4-dq")
    model = build.build_hf_model(config, wl, "causal-lm")  # type: ignore[arg-type]
    quantized.quantize_(model, quantized.linears_to_quantize(model, "nf4-dq"), wl)
    stand_ins = _stand_ins(model)
    assert len(stand_ins) == 224
    assert type(model.lm_head) is torch.nn.Linear
    buffer_bytes = sum(
        b.numel() * b.element_size() for m in stand_ins.values() for b in m.buffers()
    )
    # hand formula, nf4 + double quant: 4 + 8/64 bits per weight, fp32 per 256 blocks, tables
    h, i = 4096, 11008
    expected = 0
    for n, k in [(h, h)] * 4 + [(i, h), (i, h), (h, i)]:
        w = n * k
        expected += w // 2 + w // 64 + -(-w // 64 // 256) * 4 + 256 * 4 + 4 + 16 * 4
    assert buffer_bytes == 32 * expected
    assert quantized.n_quantized_params(model) == 32 * (4 * h * h + 3 * h * i)


def test_quantized_weights_count_as_parameters_and_shrink_them() -> None:
    wl = WorkloadSpec(mode="infer", batch_size=1, seq_len=32)
    kw = {"name": "t", "extrapolate": False}
    plain = trace_hf(TINY_LLAMA, wl, **kw)  # type: ignore[arg-type]
    nf4 = trace_hf(TINY_LLAMA, dataclasses.replace(wl, quant="nf4"), **kw)  # type: ignore[arg-type]
    assert nf4.n_params == plain.n_params
    assert nf4.components["parameters"] < plain.components["parameters"]
    # embeddings, 7 norms and lm_head stay bf16, the two fp32 RoPE inv_freq buffers stay; 21
    # quantized linears in the 3 tiny layers. Each stored tensor is its own allocation, rounded up
    # to 512 bytes by the caching allocator.
    h, i, v = 128, 256, 500
    per_layer = [(h, h), (64, h), (64, h), (h, h), (i, h), (i, h), (h, i)]
    quantized_bytes = 0
    for n, k in per_layer * 3:  # packed 4-bit weight, fp32 absmax per 64, the 16-entry code
        quantized_bytes += sum(-(-b // 512) * 512 for b in (n * k // 2, n * k // 64 * 4, 64))
    kept = sum(-(-b // 512) * 512 for b in [v * h * 2] * 2 + [h * 2] * 7 + [16 * 4] * 2)
    assert nf4.components["parameters"] == quantized_bytes + kept


def test_qlora_trains_only_the_adapters_around_quantized_base_layers() -> None:
    wl = WorkloadSpec(quant="nf4", lora_rank=8)
    model = build.build_hf_model(TINY_LLAMA, wl, "causal-lm")
    names = quantized.linears_to_quantize(model, "nf4")
    model = build.apply_lora_(model, wl)
    quantized.quantize_(model, names, wl)
    wrapped = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert len(wrapped) == 21
    assert all(isinstance(m.base_layer, quantized.QuantizedLinear) for m in wrapped)
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_fp8_on_a_gpu_without_fp8_is_rejected_by_the_trace_engine() -> None:
    from memfit.hardware.catalog import get_gpu

    wl = WorkloadSpec(mode="infer", quant="fp8")
    with pytest.raises(SpecError, match=r"quant 'fp8' cannot run on T4 \(compute capability 7.5\)"):
        trace_hf(TINY_LLAMA, wl, name="t", gpu=get_gpu("T4"))


# ----------------------------------------------------------------- against the real bitsandbytes
bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is a dev dependency")


def _real_bnb_layer(fmt: str, n: int, k: int, bias: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
    if fmt == "int8":
        layer = bnb.nn.Linear8bitLt(k, n, bias=bias, has_fp16_weights=False, threshold=6.0)
        layer.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        qt, dq = ("fp4" if fmt == "fp4" else "nf4"), fmt == "nf4-dq"
        layer = bnb.nn.Linear4bit(
            k, n, bias=bias, compute_dtype=torch.bfloat16, quant_type=qt, compress_statistics=dq
        )
        layer.weight = bnb.nn.Params4bit(
            w, requires_grad=False, quant_type=qt, compress_statistics=dq
        )
    if bias:
        layer.bias = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16), requires_grad=False)
    return layer.to("cpu")  # quantizes


def _device_tensors(layer: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor a real bitsandbytes layer holds: parameters, and the quant state's tensors."""
    out: list[torch.Tensor] = list(layer.parameters())
    w = layer.weight
    if getattr(w, "SCB", None) is not None:
        out.append(w.SCB)
    state = getattr(w, "quant_state", None)
    if state is not None:
        out += [state.absmax, state.code]
        if state.nested:
            out += [state.offset, state.state2.absmax, state.state2.code]
    unique: dict[int, torch.Tensor] = {}
    for t in out:
        unique.setdefault(t.untyped_storage().data_ptr(), t)
    return list(unique.values())


def _signature(tensors: list[torch.Tensor]) -> list[tuple[int, torch.dtype]]:
    return sorted(((t.untyped_storage().nbytes(), t.dtype) for t in tensors), key=str)


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "fp4", "int8"])
@pytest.mark.parametrize(("n", "k"), [(256, 512), (96, 200)])
def test_stand_in_stores_what_bitsandbytes_stores(fmt: str, n: int, k: int) -> None:
    real = _real_bnb_layer(fmt, n, k, bias=True)
    stand_in = quantized.QuantizedLinear(
        fmt, k, n, bias=True, dtype=torch.bfloat16, compute_dtype=torch.bfloat16, device="cpu"
    )
    assert _signature(_device_tensors(real)) == _signature(list(stand_in.buffers()))
    formula = quant.quantized_linear_bytes(fmt, n, k, bias=True)
    assert sum(formula.values()) == sum(b for b, _ in _signature(_device_tensors(real)))


def test_module_selection_matches_transformers_bitsandbytes_integration() -> None:
    from tests.conftest import TINY_BERT, TINY_T5
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    for config in (TINY_LLAMA, TINY_GPT2, TINY_BERT, TINY_T5):
        task = build.resolve_task(config, "auto")
        model = build.build_hf_model(config, WorkloadSpec(mode="infer"), task)
        ours = quantized.linears_to_quantize(model, "nf4")
        qc = BitsAndBytesConfig(load_in_4bit=True)
        skip = Bnb4BitHfQuantizer(qc).get_modules_to_not_convert(
            model, qc.llm_int8_skip_modules, model._keep_in_fp32_modules
        )
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc)
        theirs = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert sorted(ours) == sorted(theirs), config["model_type"]
        assert ours


def test_linear_subclasses_stay_unquantized_as_transformers_leaves_them() -> None:
    """transformers' bitsandbytes integration converts ``type(module) is nn.Linear`` only: a
    model whose projections subclass nn.Linear (Falcon's FalconLinear) keeps them in its dtype.
    ``quant.LINEAR_SUBCLASSES`` (the analytic engine's rule and the note) names exactly the
    families of memfit's tiny configs that have such layers."""
    from tests.estimate.analytic.configs import TINY
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    with_subclasses = {}
    for config in TINY.values():
        task = build.resolve_task(config, "auto")
        model = build.build_hf_model(config, WorkloadSpec(mode="infer"), task)
        names = {
            type(m).__name__
            for m in model.modules()
            if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear
        }
        if names:
            with_subclasses[config["model_type"]] = names
    assert with_subclasses == {t: {c} for t, c in quant.LINEAR_SUBCLASSES.items()}

    model = build.build_hf_model(TINY["falcon"], WorkloadSpec(mode="infer"), "causal-lm")
    assert quantized.linears_to_quantize(model, "nf4") == []
    falcon = {n for n, m in model.named_modules() if type(m).__name__ == "FalconLinear"}
    replace_with_bnb_linear(model, quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    converted = {n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert falcon and converted == {"lm_head"}  # without the default skips: the one nn.Linear
    est = trace_hf(TINY["falcon"], WorkloadSpec(mode="infer", quant="nf4"), name="falcon")
    assert any("FalconLinear" in n for n in est.notes)


def _cpu_peak_bytes(fn: Any) -> int:
    """Peak of the CPU allocator's running total while ``fn`` runs (every allocation, including
    those inside bitsandbytes' custom ops that a dispatch-level tracker cannot see)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    current = peak = 0
    for _, n_bytes in events:
        current += n_bytes
        peak = max(peak, current)
    return peak


def _train_step_peak(layer: torch.nn.Module, tokens: int, k: int) -> int:
    x = torch.randn(1, tokens, k, dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()

    step()  # first call initialises bitsandbytes' lazy state
    x.grad = None
    return _cpu_peak_bytes(step)


@pytest.mark.parametrize("fmt", ["nf4", "nf4-dq", "fp4"])
def test_4bit_stand_in_allocates_what_bitsandbytes_allocates_on_the_dequant_path(fmt: str) -> None:
    """At 2048 tokens (> 1536) bitsandbytes' CUDA ``gemm_4bit`` takes the dequant + F.linear
    fallback, the path its CPU backend always takes: forward + backward peaks must be equal. At 2
    tokens CUDA's forward runs the fused kernel (no dequantized weight) while CPU still
    dequantizes, so there the stand-in's forward, which follows CUDA, must allocate less than the
    CPU run's. (The backward dequantizes on both, so the whole step's peak may tie: it did on an
    AMD EPYC without AVX-512, where the comparison of whole steps used to fail.)"""
    n, k = 256, 512
    real = _real_bnb_layer(fmt, n, k).train()
    stand_in = quantized.QuantizedLinear(
        fmt, k, n, bias=False, dtype=torch.bfloat16, compute_dtype=torch.bfloat16, device="cpu"
    ).train()
    assert _train_step_peak(stand_in, 2048, k) == _train_step_peak(real, 2048, k)
    assert _forward_peak(stand_in, 2, k) < n * k * 2 <= _forward_peak(real, 2, k)


def _forward_peak(layer: torch.nn.Module, tokens: int, k: int) -> int:
    x = torch.randn(1, tokens, k, dtype=torch.bfloat16)

    def forward() -> None:
        with torch.no_grad():
            layer(x)

    forward()  # first call initialises bitsandbytes' lazy state
    return _cpu_peak_bytes(forward)

"""Quantized routed experts: memfit's stored tensors against the modules transformers 5.23's
integrations build (``FP8Experts``, ``Mxfp4GptOssExperts``), hand formulas for the layouts those
modules do not hold as parameters (MXFP4 scales, Hopper's padded layout, GPTQ per expert), both
engines on an FP8 / GPTQ Qwen3-MoE, and the trace's experts on a tiny gpt-oss."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.estimate import quant
from memfit.estimate.quant_experts import ExpertsShape, stored_expert_tensors
from memfit.spec import WorkloadSpec

QWEN_MOE = ExpertsShape(n_experts=8, hidden=256, intermediate=96)
OSS = ExpertsShape(n_experts=4, hidden=128, intermediate=192, has_bias=True)


def _by_name(tensors) -> dict:
    return {t.name: (t.shape, t.dtype) for t in tensors}


def test_fp8_experts_are_the_parameters_transformers_fp8experts_allocates() -> None:
    torch = pytest.importorskip("torch")
    from transformers import Qwen3MoeConfig
    from transformers.integrations.finegrained_fp8 import FP8Experts

    cfg = Qwen3MoeConfig(hidden_size=256, moe_intermediate_size=96, num_experts=8)
    with torch.device("meta"):
        real = FP8Experts(cfg, block_size=(128, 128))
    theirs = {
        n: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in real.named_parameters()
    }
    assert _by_name(stored_expert_tensors("fp8", QWEN_MOE)) == theirs


def test_mxfp4_experts_hold_the_blocks_mxfp4gptossexperts_allocates_and_one_scale_per_32() -> None:
    torch = pytest.importorskip("torch")
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts

    cfg = GptOssConfig(hidden_size=128, intermediate_size=192, num_local_experts=4)
    with torch.device("meta"):
        real = Mxfp4GptOssExperts(cfg)
    theirs = {
        n: (tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in real.named_parameters()
    }
    ours = _by_name(stored_expert_tensors("mxfp4", OSS))
    assert {n: ours[n] for n in theirs} == theirs
    # the checkpoint's *_scales (E, N, K / 32) uint8 (E8M0), which the kernels keep beside them
    assert ours["gate_up_proj_scales"] == ((4, 384, 128 // 32), "uint8")
    assert ours["down_proj_scales"] == ((4, 128, 192 // 32), "uint8")


def test_hopper_pads_gpt_oss_20b_expert_weights_to_its_64_by_256_byte_tiles() -> None:
    """gpt-oss-20b (E 32, H 2880, I 2880): gate_up's 2880/2 = 1440 bytes a row pad to 1472 and
    its 5760 rows to 5888; down's 1440 to 1472 and 2880 rows to 3072."""
    shape = ExpertsShape(n_experts=32, hidden=2880, intermediate=2880, has_bias=True)
    ours = _by_name(stored_expert_tensors("mxfp4", shape, hopper=True))
    assert ours["gate_up_proj"] == ((32, 5888, 1472), "uint8")
    assert ours["down_proj"] == ((32, 3072, 1472), "uint8")
    plain = _by_name(stored_expert_tensors("mxfp4", shape))
    assert plain["gate_up_proj"] == ((32, 5760, 1440), "uint8")


@pytest.mark.parametrize("fmt", ["int4-gptq", "int4-awq"])
def test_gptq_and_awq_experts_are_each_experts_three_quantized_linears(fmt: str) -> None:
    per_expert = sum(
        sum(quant.quantized_linear_bytes(fmt, n, k, 32).values())
        for n, k in ((96, 256), (96, 256), (256, 96))
    )
    ours = sum(t.n_bytes for t in stored_expert_tensors(fmt, QWEN_MOE, group_size=32))
    assert ours == QWEN_MOE.n_experts * per_expert


def test_bitsandbytes_formats_do_not_store_experts() -> None:
    with pytest.raises(SpecError, match=r"does not store experts quantized"):
        stored_expert_tensors("nf4", QWEN_MOE)


def test_mxfp4_training_is_refused_with_the_dequantize_route() -> None:
    with pytest.raises(SpecError, match=r"mxfp4.*no backward.*--quant none"):
        WorkloadSpec(quant="mxfp4", lora_rank=4)


TINY_OSS = dict(
    model_type="gpt_oss",
    architectures=["GptOssForCausalLM"],
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    vocab_size=500,
    max_position_embeddings=512,
    sliding_window=32,
    layer_types=["sliding_attention", "full_attention"],
    tie_word_embeddings=False,
    rope_scaling={"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 512},
)


def test_gpt_oss_mxfp4_trace_swaps_exactly_the_expert_bytes() -> None:
    """The trace's parameters drop by the bf16 expert weights and biases and gain the MXFP4
    tensors (each rounded to 512 B), nothing else; the parameter count is unchanged."""
    pytest.importorskip("transformers")
    from memfit.estimate.trace.engine import trace_hf

    wl = dict(mode="infer", batch_size=1, seq_len=16, precision="bf16-true")
    bf16 = trace_hf(TINY_OSS, WorkloadSpec(**wl), name="oss")
    mx = trace_hf(TINY_OSS, WorkloadSpec(**wl, quant="mxfp4"), name="oss")
    e, h, i, layers = 4, 128, 192, 2
    bf16_experts = layers * 2 * e * (2 * i * h + 2 * i + h * i + h)
    rounded = sum(-(-t.n_bytes // 512) * 512 for t in stored_expert_tensors("mxfp4", OSS))
    assert bf16.components["parameters"] - mx.components["parameters"] == pytest.approx(
        bf16_experts - layers * rounded, abs=layers * 4 * 512
    )
    assert mx.n_params == bf16.n_params
    assert any("MXFP4 blocks + E8M0 scales" in n for n in mx.notes)


@pytest.mark.slow
def test_lora_over_fp8_experts_trains_the_linear_adapters_and_says_so() -> None:
    """peft's all-linear also targets the experts' 3-D parameters; on quantized experts memfit
    keeps adapters on the Linear layers only: fewer trainable parameters than over bf16 experts."""
    pytest.importorskip("peft")
    from tests.estimate.analytic.configs import TINY

    from memfit.estimate.trace.engine import trace_hf

    wl = dict(batch_size=1, seq_len=16, precision="bf16-true", lora_rank=4)
    bf16 = trace_hf(TINY["qwen3_moe"], WorkloadSpec(**wl), name="moe")
    fp8 = trace_hf(TINY["qwen3_moe"], WorkloadSpec(**wl, quant="fp8"), name="moe")
    assert 0 < fp8.n_trainable_params < bf16.n_trainable_params
    assert fp8.components["parameters"] < bf16.components["parameters"]
    assert any("LoRA adapters on the quantized experts are not modelled" in n for n in fp8.notes)


def _mxfp4_checkpoint(tmp_path) -> str:
    import json

    q = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_OSS, quantization_config=q)))
    return str(tmp_path)


def test_a_flag_overrides_an_mxfp4_checkpoint_and_the_output_says_which_format(tmp_path) -> None:
    """The checkpoint's mxfp4 is used unless --quant names another; the notes say which format
    was used, why, and how the experts are stored under it."""
    pytest.importorskip("transformers")
    import memfit

    _mxfp4_checkpoint(tmp_path)
    wl = dict(mode="infer", batch_size=1, seq_len=16, precision="bf16-true")
    own = memfit.estimate(str(tmp_path), WorkloadSpec(**wl), engine="trace")
    flag = memfit.estimate(str(tmp_path), WorkloadSpec(**wl, quant="nf4"), engine="trace")
    assert own.workload["quant"] == "mxfp4" and flag.workload["quant"] == "nf4"
    assert any("quantization_config (mxfp4 experts) sets --quant mxfp4" in n for n in own.notes)
    assert (
        "--quant nf4 overrides the checkpoint's quantization_config (mxfp4 experts)" in flag.notes
    )
    assert any("routed experts stay in the model's dtype: quant 'nf4'" in n for n in flag.notes)


@pytest.mark.slow
def test_an_mxfp4_checkpoint_trains_dequantized(tmp_path) -> None:
    pytest.importorskip("peft")
    import memfit

    _mxfp4_checkpoint(tmp_path)
    train = memfit.estimate(
        str(tmp_path),
        WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true", lora_rank=4),
        engine="trace",
    )
    assert train.workload["quant"] == "none"
    assert any("dequantized to the model's dtype for training" in n for n in train.notes)

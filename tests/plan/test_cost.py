"""The roofline cost model: the 6N rule, recomputation, memory-bound decode, offload, sharding."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.hardware import get_gpu
from memfit.plan.cost import (
    COST_CONSTANTS,
    MFU_BY_ARCH,
    ModelFacts,
    Rates,
    infer_cost,
    mfu,
    train_step_cost,
)
from memfit.plan.space import Settings

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DATA = BENCHMARKS / "data" / "step_time_published.jsonl"

# A 7B-like decoder: 32 layers of d 4096, untied 32k vocabulary.
FACTS = ModelFacts(
    n_params=6_738_000_000,
    n_layers=32,
    d_model=4096,
    vocab_size=32000,
    kv_bytes_per_token_per_byte=2 * 32 * 32 * 128,
    tied_embeddings=False,
)
H100 = Rates.of(get_gpu("H100-80GB"))
BASE = Settings(precision="amp-bf16", optimizer="adamw-fused", micro_batch=8, grad_accum=4)


def _train(s: Settings, seq: int = 2048, trainable: float = 1.0) -> float:
    return train_step_cost(s, FACTS, H100, seq_len=seq, trainable_fraction=trainable).parts_s[
        "compute"
    ]


def test_full_training_compute_is_six_n_per_token_at_the_generation_mfu() -> None:
    seq = 128  # short: the attention term (2·n_layer·seq·d per token) is < 1 % of 2N
    tokens = BASE.micro_batch * BASE.grad_accum * seq
    assert mfu(H100) == MFU_BY_ARCH["hopper"]
    expected = 6 * FACTS.n_matmul_params * tokens / (H100.flops["bf16"] * mfu(H100))
    assert _train(BASE, seq) == pytest.approx(expected, rel=0.01)


def test_full_checkpointing_adds_one_forward_and_selective_only_attention() -> None:
    none, full = _train(BASE), _train(replace(BASE, checkpointing="full"))
    selective = _train(replace(BASE, checkpointing="selective"))
    assert full / none == pytest.approx(4 / 3, rel=0.01)  # 6N -> 8N
    assert none < selective < none * 1.1


def test_per_layer_checkpointing_reruns_the_forward_of_the_blocks_it_wraps() -> None:
    """torchtitan's per-layer SAC at its default (every 2nd of the 32 blocks): half a forward
    more, 6N -> 7N."""
    none, full = _train(BASE), _train(replace(BASE, checkpointing="full"))
    every_other = _train(replace(BASE, checkpointing="selective-layer"))
    assert every_other / none == pytest.approx(7 / 6, rel=0.01)
    assert none < every_other < full


def test_lora_skips_the_weight_gradient_matmuls() -> None:
    # short sequences: attention (no weights, so its backward stays 2 forwards) is negligible
    lora = _train(replace(BASE, lora_rank=16), seq=128, trainable=0.0)
    assert lora / _train(BASE, seq=128) == pytest.approx(4 / 6, rel=0.01)


def test_decode_is_memory_bound_and_4_bit_weights_read_fewer_bytes() -> None:
    infer = Settings(precision="bf16", micro_batch=1)
    bf16 = infer_cost(infer, FACTS, H100, seq_len=512, new_tokens=256)
    awq = infer_cost(
        replace(infer, quant="int4-awq"),
        FACTS,
        H100,
        seq_len=512,
        new_tokens=256,
        eager_overhead=False,
    )
    per_token = bf16.parts_s["decode"] / 256
    kv = FACTS.kv_bytes_per_token_per_byte * 2 * (512 + 128)
    weights_read = (2 * FACTS.n_params + kv) / (H100.memory_bps * COST_CONSTANTS["decode_mbu"][0])
    assert per_token == pytest.approx(weights_read, rel=0.05)
    # 3.6x fewer bytes, read at a lower share of the bandwidth (gpt-fast: int4 1.9x faster)
    assert awq.parts_s["decode"] < bf16.parts_s["decode"] / 2


def test_optimizer_offload_pays_pcie_and_a_cpu_step() -> None:
    gpu = replace(BASE, shard="zero2", offload="optimizer")
    on, off = (
        train_step_cost(s, FACTS, H100, seq_len=2048, trainable_fraction=1.0) for s in (BASE, gpu)
    )
    assert "offload_pcie" in off.parts_s and off.step_s > on.step_s


def test_zero3_communicates_more_than_ddp_on_a_pcie_link() -> None:
    pcie = Rates.of(get_gpu("L4"))
    ddp = replace(BASE, gpus=8, shard="ddp")
    z3 = replace(ddp, shard="zero3")
    comm = [
        train_step_cost(s, FACTS, pcie, seq_len=2048, trainable_fraction=1.0).parts_s[
            "communication"
        ]
        for s in (ddp, z3)
    ]
    assert comm[1] > comm[0] > 0


def test_every_cost_constant_cites_a_source() -> None:
    for name, (value, source) in COST_CONSTANTS.items():
        assert value > 0 and len(source) > 30, name


def test_a_gpu_without_published_rates_is_a_clear_error_not_a_division_by_zero() -> None:
    from memfit.errors import SpecError

    bare = replace(
        get_gpu("A10G"), name="Bare", bf16_dense_tflops=None, fp16_dense_tflops=None,
        fp32_tflops=None,
    )  # fmt: skip
    with pytest.raises(SpecError, match=r"Bare has no published compute rate"):
        Rates.of(bare)


# -- properties the planner's ranking rests on (issue 29) ---------------------------------------

# Llama-3.1-8B: 32 layers of d 4096, GQA 8 KV heads, untied 128k vocabulary.
LLAMA8B = ModelFacts(
    n_params=8_030_261_248,
    n_layers=32,
    d_model=4096,
    vocab_size=128256,
    kv_bytes_per_token_per_byte=2 * 32 * 8 * 128,
    tied_embeddings=False,
)


def _step(s: Settings, gpu: str, facts: ModelFacts = LLAMA8B, trainable: float = 1.0) -> float:
    rates = Rates.of(get_gpu(gpu))
    return train_step_cost(s, facts, rates, seq_len=2048, trainable_fraction=trainable).step_s


def test_param_offload_over_pcie_is_slower_than_qlora_on_one_gpu() -> None:
    """8B full fine-tune with ZeRO-3 parameter offload vs QLoRA, one 24 GB card: the offload
    streams 16 GB of weights over PCIe for every forward and backward of every micro-batch."""
    common = {"precision": "bf16-true", "checkpointing": "full", "micro_batch": 1, "grad_accum": 8}
    offload = Settings(optimizer="adamw", shard="zero3", offload="params", **common)
    qlora = Settings(optimizer="adamw", quant="nf4-dq", lora_rank=16, **common)
    for gpu in ("RTX-4090", "L4", "A10G"):
        t_off, t_q = _step(offload, gpu), _step(qlora, gpu, trainable=0.005)
        assert t_off > 2 * t_q, gpu


def test_param_offload_is_several_times_slower_than_the_same_job_on_the_gpu() -> None:
    on_gpu = Settings(precision="bf16-true", optimizer="adamw", shard="zero3", micro_batch=1)
    off = replace(on_gpu, offload="params")
    opt_off = replace(on_gpu, offload="optimizer")
    t_gpu, t_opt, t_par = (_step(s, "A100-80GB") for s in (on_gpu, opt_off, off))
    assert t_gpu < t_opt < t_par and t_par > 3 * t_gpu


def test_full_checkpointing_costs_about_a_third_more_step_time_when_compute_bound() -> None:
    s = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=8)
    ratio = _step(replace(s, checkpointing="full"), "H100-80GB") / _step(s, "H100-80GB")
    assert 1.25 < ratio < 4 / 3 + 0.01


def test_bf16_is_faster_than_fp32() -> None:
    s = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=4)
    assert _step(s, "A100-80GB") * 4 < _step(replace(s, precision="32-true"), "A100-80GB")


def test_a_newer_generation_is_faster() -> None:
    s16 = Settings(precision="16-mixed", optimizer="adamw", micro_batch=4)
    sbf = replace(s16, precision="bf16-mixed")
    volta, ampere, hopper = (
        _step(s16, "V100-32GB"),
        _step(sbf, "A100-80GB"),
        _step(sbf, "H100-80GB"),
    )
    assert volta > ampere > hopper


def test_eager_attention_is_slower_than_sdpa() -> None:
    s = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=4)
    assert _step(replace(s, attention="eager"), "A100-80GB") > _step(s, "A100-80GB")


def test_qlora_dequantization_makes_it_slower_than_lora_at_long_sequences() -> None:
    lora = Settings(precision="bf16-true", optimizer="adamw", lora_rank=16, micro_batch=4)
    qlora = replace(lora, quant="nf4")
    assert _step(qlora, "A100-80GB", trainable=0.005) > _step(lora, "A100-80GB", trainable=0.005)


def test_zero3_pays_its_collectives_per_micro_batch_and_ddp_once_per_step() -> None:
    pcie = Rates.of(get_gpu("L4"))
    ddp = Settings(precision="bf16-mixed", optimizer="adamw", gpus=8, shard="ddp", micro_batch=1)
    z3 = replace(ddp, shard="zero3")

    def comm(s: Settings) -> float:
        c = train_step_cost(s, LLAMA8B, pcie, seq_len=2048, trainable_fraction=1.0)
        return c.parts_s["communication"]

    assert comm(replace(ddp, grad_accum=8)) == pytest.approx(comm(ddp))
    assert comm(replace(z3, grad_accum=8)) == pytest.approx(8 * comm(z3))


def test_eager_host_overhead_is_opt_in_and_weighs_on_small_micro_batches() -> None:
    s = Settings(precision="bf16-true", micro_batch=1)
    eager = infer_cost(s, LLAMA8B, H100, seq_len=16, new_tokens=64, eager_overhead=True)
    assert eager.step_s > 2 * infer_cost(s, LLAMA8B, H100, seq_len=16, new_tokens=64).step_s
    split = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=1, grad_accum=8)
    whole = replace(split, micro_batch=8, grad_accum=1)
    rates = Rates.of(get_gpu("A100-80GB"))

    def step(x: Settings) -> float:
        return train_step_cost(
            x, LLAMA8B, rates, seq_len=128, trainable_fraction=1.0, eager_overhead=True
        ).step_s

    assert step(split) > 1.1 * step(whole)


def test_every_calibration_point_parses_and_names_its_source() -> None:
    lines = [json.loads(x) for x in DATA.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert len(lines) >= 20
    for p in lines:
        assert p["url"].startswith("https://"), p["id"]
        assert p["location"] and p["quote"] and p["value"] > 0 and p["unit"], p["id"]
        get_gpu(p["gpu"])  # a catalog GPU
        Settings(**p["settings"])  # valid settings
    archs = {get_gpu(p["gpu"]).arch for p in lines}
    assert {"volta", "ampere", "ada", "hopper"} <= archs
    techniques = {p["technique"] for p in lines}
    assert {"full", "lora", "qlora", "full-offload", "full-multi", "decode"} <= techniques


def test_the_shipped_constants_predict_the_published_points() -> None:
    """The calibration's figures: median |error| of the points it fits under 15 %, and pairs of
    one source ordered as measured (docs/accuracy.md "Step time (planner)")."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import step_time_calibration as cal  # noqa: PLC0415
    finally:
        sys.path.remove(str(BENCHMARKS))
    points = [p for p in cal.load_points() if p.implied_mfu() <= cal.PLAUSIBLE_MFU]
    errors = sorted(abs(math.expm1(p.log_ratio())) for p in points)
    assert errors[len(errors) // 2] < 0.15
    agree, total, _ = cal.ranking(cal.load_points())
    assert total >= 20 and agree / total >= 0.9

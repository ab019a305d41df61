"""The roofline cost model: the 6N rule, recomputation, memory-bound decode, offload, sharding."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memfit.hardware import get_gpu
from memfit.plan.cost import COST_CONSTANTS, ModelFacts, Rates, infer_cost, train_step_cost
from memfit.plan.space import Settings

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


def test_full_training_compute_is_six_n_per_token_at_the_assumed_mfu() -> None:
    seq = 128  # short: the attention term (2·n_layer·seq·d per token) is < 1 % of 2N
    tokens = BASE.micro_batch * BASE.grad_accum * seq
    expected = 6 * FACTS.n_matmul_params * tokens / (H100.flops["bf16"] * COST_CONSTANTS["mfu"][0])
    assert _train(BASE, seq) == pytest.approx(expected, rel=0.01)


def test_full_checkpointing_adds_one_forward_and_selective_only_attention() -> None:
    none, full = _train(BASE), _train(replace(BASE, checkpointing="full"))
    selective = _train(replace(BASE, checkpointing="selective"))
    assert full / none == pytest.approx(4 / 3, rel=0.01)  # 6N -> 8N
    assert none < selective < none * 1.1


def test_lora_skips_the_weight_gradient_matmuls() -> None:
    lora = _train(replace(BASE, lora_rank=16), trainable=0.0)
    assert lora / _train(BASE) == pytest.approx(4 / 6, rel=0.01)


def test_decode_is_memory_bound_and_4_bit_weights_read_fewer_bytes() -> None:
    infer = Settings(precision="bf16", micro_batch=1)
    bf16 = infer_cost(infer, FACTS, H100, seq_len=512, new_tokens=256)
    awq = infer_cost(replace(infer, quant="int4-awq"), FACTS, H100, seq_len=512, new_tokens=256)
    per_token = bf16.parts_s["decode"] / 256
    weights_read = 2 * FACTS.n_params / (H100.memory_bps * COST_CONSTANTS["mbu"][0])
    assert per_token == pytest.approx(weights_read, rel=0.05)
    assert awq.parts_s["decode"] < bf16.parts_s["decode"] / 3


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

"""FSDP-QLoRA: under FSDP / ZeRO-3 the packed 4-bit weights are bf16 ``quant_storage`` parameters
that each rank holds 1/N of (bitsandbytes docs ``fsdp_qlora.md``; Answer.AI fsdp_qlora train.py;
peft docs "Use PEFT QLoRA and FSDP"), the quant state (absmax, code) whole on every rank.

Expected bytes are computed here from the config's shapes and bitsandbytes' storage rules
(``quantize_4bit``: ``(n + 1) // 4`` bf16 rows; one fp32 absmax per 64 values; a 16-entry fp32
code), not read from the code under test. The difference against the same LoRA job without
quantization isolates the quantized layers: everything else (embedding, norms, lm_head,
adapters) is the same.
"""

from __future__ import annotations

import dataclasses

import pytest
from tests.conftest import TINY_LLAMA

from memfit.estimate.trace import quantized, step_memo
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec

H, FF, LAYERS = 256, 512, 2
CFG = dict(TINY_LLAMA, hidden_size=H, intermediate_size=FF, num_hidden_layers=LAYERS)
HD = H // CFG["num_attention_heads"]
KV = CFG["num_key_value_heads"] * HD
#: (out, in) of each quantized Linear of one block: q, k, v, o, gate, up, down (lm_head stays).
LINEARS = [(H, H), (KV, H), (KV, H), (H, H), (FF, H), (FF, H), (H, FF)]


def r512(n: int) -> int:
    return -(-n // 512) * 512


def estimate(gpus: int, quant: str, shard: str = "fsdp"):  # type: ignore[no-untyped-def]
    wl = WorkloadSpec(
        batch_size=1, seq_len=32, precision="bf16-true", gpus=gpus, shard=shard,
        lora_rank=8, quant=quant,
    )  # fmt: skip
    return trace_hf(dict(CFG), wl, name="tiny-llama")


def params_after_step(e) -> int:  # type: ignore[no-untyped-def]
    return e.phases["optimizer"].components["parameters"]


def quantized_layer_bytes(out_f: int, in_f: int, world: int) -> int:
    """Rank 0's bytes of one nf4 layer: its shard of the packed bf16 rows, the whole quant state."""
    rows = (out_f * in_f + 1) // 4
    shard = -(-rows // world) * 2
    absmax = -(-out_f * in_f // 64) * 4
    return r512(shard) + r512(absmax) + r512(16 * 4)


def dense_layer_bytes(out_f: int, in_f: int, world: int) -> int:
    return r512(-(-out_f // world) * in_f * 2)


@pytest.mark.parametrize("gpus", [2, 4])
def test_each_rank_holds_its_shard_of_the_packed_weights_and_the_whole_quant_state(
    gpus: int,
) -> None:
    qlora, lora = estimate(gpus, "nf4"), estimate(gpus, "none")
    expected = LAYERS * sum(
        quantized_layer_bytes(o, i, gpus) - dense_layer_bytes(o, i, gpus) for o, i in LINEARS
    )
    assert params_after_step(qlora) - params_after_step(lora) == expected
    # the logical parameter count is the model's, not the packed elements'
    assert qlora.n_params == lora.n_params


def test_the_dequantized_weight_is_still_counted_in_backward() -> None:
    e = estimate(2, "nf4")
    biggest = max(o * i for o, i in LINEARS) * 2  # one (N, K) bf16 dequantized weight
    assert e.phases["backward"].components["temporary"] >= biggest


def test_zero3_partitions_the_packed_weights_too() -> None:
    # wider: every packed weight holds >= 1e5 elements, so ZeRO-3 partitions it (DeepSpeed keeps
    # smaller parameters whole: stage3_param_persistence_threshold)
    h, ff = 1024, 2048
    kv = CFG["num_key_value_heads"] * (h // CFG["num_attention_heads"])
    cfg = dict(CFG, hidden_size=h, intermediate_size=ff, num_hidden_layers=1)
    linears = [(h, h), (kv, h), (kv, h), (h, h), (ff, h), (ff, h), (h, ff)]
    world = 4

    def run(quant: str):  # type: ignore[no-untyped-def]
        wl = WorkloadSpec(
            batch_size=1, seq_len=32, precision="bf16-mixed", gpus=world, shard="zero3",
            lora_rank=8, quant=quant,
        )  # fmt: skip
        return params_after_step(trace_hf(dict(cfg), wl, name="wide-llama"))

    expected = sum(
        r512(-(-((o * i + 1) // 4) // world) * 2)  # the packed bf16 partition
        + r512(-(-o * i // 64) * 4)  # absmax, whole
        + r512(16 * 4)  # the 4-bit code, whole
        - r512(-(-o * i // world) * 2)  # the bf16 weight's partition without quantization
        for o, i in linears
    )
    assert run("nf4") - run("none") == expected


def test_int8_stays_whole_and_says_so() -> None:
    wl = WorkloadSpec(batch_size=1, seq_len=32, gpus=2, shard="fsdp", lora_rank=8, quant="int8")
    assert not quantized.packs_as_parameter(wl)
    assert any("Int8Params" in n for n in quantized.notes(wl))
    assert quantized.packs_as_parameter(dataclasses.replace(wl, quant="nf4-dq"))


def test_a_zero2_trace_is_not_reused_for_zero3_when_zero3_packs_the_weights() -> None:
    """The step memo shares one traced step between ZeRO stages (only the rewrite reads
    ``shard``), except where the stage changes the model: packed 4-bit weights as parameters."""

    def key(quant: str, shard: str) -> str | None:
        wl = WorkloadSpec(batch_size=1, seq_len=32, gpus=2, shard=shard, lora_rank=8, quant=quant)
        return step_memo.key(dict(CFG), wl)

    assert key("nf4", "zero2") != key("nf4", "zero3")
    assert key("none", "zero2") == key("none", "zero3")

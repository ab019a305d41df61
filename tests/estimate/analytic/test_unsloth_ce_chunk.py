"""Unsloth's fused cross-entropy sizes its chunk from the GPU's free memory (issue 29):
unslothai/unsloth-zoo@ce232d6c ``get_chunk_size`` — target = min(half the free bytes at the
first call, 4 GiB); exact = tokens x vocab x 4 B / target; 1 chunk when exact <= 1, else
ceil(exact / 4) x 4. The expected counts below are worked by hand from that rule."""

from __future__ import annotations

import pytest
from benchmarks.unsloth_notebooks import context_gpu

from memfit.estimate import estimate
from memfit.estimate.analytic.loss import unsloth_ce_chunk_bytes, unsloth_ce_chunks
from memfit.flags import workload_kwargs
from memfit.spec import WorkloadSpec

GIB = 2**30
QWEN3_VOCAB, LLAMA3_VOCAB = 151936, 128256


@pytest.mark.parametrize(
    ("tokens", "vocab", "free", "chunks"),
    [
        # 4096 x 151936 x 4 B = 2.32 GiB under the 4 GiB cap: one chunk (Qwen3-32B notebook)
        (4096, QWEN3_VOCAB, None, 1),
        (4096, QWEN3_VOCAB, 40 * GIB, 1),
        # 16384 x 128256 x 4 B = 7.83 GiB over 4 GiB: exact 1.96 -> 4
        (16384, LLAMA3_VOCAB, None, 4),
        # 65536 x 151936 x 4 B = 37.1 GiB over 4 GiB: exact 9.27 -> 12
        (65536, QWEN3_VOCAB, None, 12),
        # 2 GiB free: a 1 GiB target; 2.32 GiB of fp32 logits: exact 2.32 -> 4
        (4096, QWEN3_VOCAB, 2 * GIB, 4),
        # 9 GiB free: half is 4.5 GiB, capped at 4: one chunk as with plenty
        (4096, QWEN3_VOCAB, 9 * GIB, 1),
        # nothing free: one row a chunk (Unsloth raises; the job does not fit anyway)
        (4096, QWEN3_VOCAB, 0, 4096),
    ],
)
def test_the_chunk_count_is_unsloth_zoos_rule(tokens, vocab, free, chunks) -> None:
    assert unsloth_ce_chunks(tokens, vocab, free) == chunks


def test_one_chunk_holds_its_bf16_logits_and_their_fp32_upcast() -> None:
    """Without a GPU the capped target: 4096 tokens of Qwen3 are one chunk of 4096 x 151936
    logits at 2 + 4 bytes (unsloth-zoo@d9fe1f43: "the full logits and their float32 upcast")."""
    assert unsloth_ce_chunk_bytes(4096, QWEN3_VOCAB, 2) == 4096 * QWEN3_VOCAB * 6
    # 16384 tokens of Llama 3: 4 chunks of 4096 rows
    assert unsloth_ce_chunk_bytes(16384, LLAMA3_VOCAB, 2) == 4096 * LLAMA3_VOCAB * 6


def _device_gib(kernels: str, vram_gb: int, seq: int = 2972) -> float:
    flags = {
        "mode": "train", "batch": 1, "seq": seq, "kernels": kernels, "precision": "bf16-true",
        "optimizer": "adamw-8bit", "checkpointing": "offload", "loss": "fused",
        "lora_rank": 32, "quant": "nf4-dq",
    }  # fmt: skip
    w = WorkloadSpec(**workload_kwargs(flags))
    est = estimate("llama-3.1-8b", w, gpu=context_gpu(vram_gb), engine="analytic")
    return est.device_used_bytes / GIB


def test_a_card_with_less_free_memory_gets_a_smaller_chunk() -> None:
    """Unsloth's README row (Llama-3.1-8B QLoRA, 2972 tokens on 8 GB): on an 8 GB card the
    free memory at the loss is ~1 GiB, so the chunk is a quarter of the logits; on an 80 GB card
    it is all of them (2972 x 128256 x 6 B = 2.13 GiB): the estimate differs by about the
    difference (the loss is this job's peak). Liger's chunk (``--kernels hf``) does not read the
    card. A memo that kept the first card's chunk for the second fails the first assertion."""
    small, large = _device_gib("unsloth", 8), _device_gib("unsloth", 80)
    assert large - small > 1.0, (small, large)
    whole = 2972 * LLAMA3_VOCAB * 6 / GIB
    assert large - small < whole
    assert _device_gib("hf", 8) == pytest.approx(_device_gib("hf", 80), abs=1e-9)

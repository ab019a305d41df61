"""upgrade --runtime vllm: the KV-cache concurrency item counts vLLM's KV blocks."""

from __future__ import annotations

from memfit.plan.upgrade import upgrade_verdict


def test_the_concurrency_item_uses_vllms_kv_cache_when_asked() -> None:
    v = upgrade_verdict(
        "llama-3.1-8b", gpu="L40S", mode="infer", seq_len=4096, concurrency=16, context=8192,
        recommend=False, runtime="vllm",
    )  # fmt: skip
    item = v.item("kv_cache_concurrency")
    assert item.status == "not_triggered"  # vLLM: ~24 requests of 8192 tokens on an L40S
    assert "Maximum concurrency".lower() in item.evidence.lower()
    assert item.numbers["max_concurrency"] >= 16
    many = upgrade_verdict(
        "llama-3.1-8b", gpu="L40S", mode="infer", seq_len=4096, concurrency=64, context=8192,
        recommend=False, runtime="vllm",
    )  # fmt: skip
    assert many.item("kv_cache_concurrency").status == "triggered"

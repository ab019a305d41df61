"""vLLM's own CUDA-graph estimate ("Estimated CUDA graph memory: X GiB total", 0.18+) against the
llm-d-planner v0.19.0 H100 logs' debug lines (benchmarks/data/vllm_startup_logs.jsonl,
``graph_samples``): first capture per mode, then ``(n - 1)`` x one per-graph sample."""

from __future__ import annotations

import pytest
from benchmarks.vllm_startup import compare, is_segment_outlier, load, spec_of

from memfit.serving.cudagraphs import (
    VLLM_MIN_PER_GRAPH_BYTES,
    estimate_sample_bytes,
    plan_cudagraphs,
)
from memfit.serving.startup import graph_shape
from memfit.units import MiB

#: PyTorch's CUDA caching allocator packs requests of 1-10 MiB into 20 MiB segments
#: (``kLargeBuffer``, c10/cuda/CUDACachingAllocator.cpp)
K_LARGE_BUFFER_MIB = 20


def _logged() -> list[dict]:
    return [r for r in load() if r.get("graph_samples")]


def test_the_estimate_is_within_20_percent_on_all_but_five_named_logs() -> None:
    # before this model (one fitted per-graph term for both modes): 27 of 38
    rows = [compare(r) for r in load()]
    errs = {
        c["id"]: 100 * (c["graph_est"][0] - c["graph_est"][1]) / c["graph_est"][1]
        for c in rows
        if c["graph_est"][1]
    }
    assert len(errs) == 38
    misses = {i for i, e in errs.items() if abs(e) > 20}
    # two sampled a new allocator segment, phi-4 / phi-2 sampled a page below memfit's mean, the
    # A5000 keeps FlashAttention 3's workspace as an allowance (docs/accuracy.md)
    assert misses <= {
        "pln_l31_8b_tp2",
        "pln_mistral_small_w8a8_tp2",
        "pln_phi4",
        "pln_phi2_2k",
        "lmcache3430_qwen3_8b_a5000",
    }
    assert len(misses) <= 5


def test_a_sample_far_over_the_typical_one_is_a_new_20_mib_segment() -> None:
    outliers = []
    for r in _logged():
        for mode in ("PIECEWISE", "FULL"):
            if mode in r["graph_samples"] and is_segment_outlier(r, mode):
                tp = int(r["flags"].get("tensor-parallel-size", 1))
                layers, moe, *_ = graph_shape(spec_of(r), tp=tp, pp=1, minor=19)
                mean = estimate_sample_bytes(mode, n_layers=layers, n_moe_layers=moe) / MiB
                excess = r["graph_samples"][mode]["per_graph_mib"] - mean
                outliers.append((r["id"], mode, excess))
    assert [o[:2] for o in outliers] == [
        ("pln_l31_8b_tp2", "PIECEWISE"),
        ("pln_mistral_small_w8a8_tp2", "PIECEWISE"),
    ]
    # one segment, within the typical samples' spread about memfit's mean (leave-one-out max
    # 5.2 MiB, benchmarks/results/vllm_startup.md)
    for _, _, excess in outliers:
        assert excess == pytest.approx(K_LARGE_BUFFER_MIB, abs=5.2)


def test_memfits_mean_sample_is_within_a_page_of_most_logged_samples() -> None:
    near = total = 0
    for r in _logged():
        tp = int(r["flags"].get("tensor-parallel-size", 1))
        pp = int(r["flags"].get("pipeline-parallel-size", 1))
        layers, moe, *_ = graph_shape(spec_of(r), tp=tp, pp=pp, minor=19)
        mla = layers if (spec_of(r).text or spec_of(r)).raw.get("kv_lora_rank") else 0
        for mode in ("PIECEWISE", "FULL"):
            if mode not in r["graph_samples"] or is_segment_outlier(r, mode):
                continue
            mean = estimate_sample_bytes(mode, n_layers=layers, n_moe_layers=moe, n_mla_layers=mla)
            total += 1
            near += abs(mean / MiB - r["graph_samples"][mode]["per_graph_mib"]) <= 2.0
    assert total >= 70 and near >= 0.75 * total


def test_a_short_stage_takes_vllms_one_mib_floor() -> None:
    # Llama-3.1-8B at PP 4 (8 layers a stage): "(51-1) × 1.00 MiB per-graph" for PIECEWISE
    assert (
        estimate_sample_bytes("PIECEWISE", n_layers=8, n_moe_layers=0) == VLLM_MIN_PER_GRAPH_BYTES
    )


def _plan(**kw: object) -> int:
    base: dict = dict(
        minor=19,
        engine="v1",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        n_layers=32,
        enforce_eager=False,
        n_heads_per_rank=32,
        head_dim_v=128,
        mlp_out_bytes_per_token=2 * 14336 * 2,
    )
    base.update(kw)
    return plan_cudagraphs(**base).estimate_bytes


def test_the_modes_first_captures_overlay_and_the_largest_counts() -> None:
    with_fa = _plan()
    # fp32 (TRITON_ATTN, no split workspace): the piecewise first capture is the largest
    no_fa = _plan(fa_dtype=False)
    assert with_fa - no_fa > 100 * MiB
    # the piecewise first capture grows with the MLP width only while it is the largest
    assert _plan(fa_dtype=False, mlp_out_bytes_per_token=4 * 14336 * 2) > no_fa
    assert _plan(mlp_out_bytes_per_token=2 * 14336 * 2 + 2) == with_fa


def test_float32_llama_estimate_matches_its_log_without_the_flashattention_workspace() -> None:
    r = next(r for r in load() if r["id"] == "pln_l31_8b_fp32")
    assert r["graph_samples"]["FULL"]["first_mib"] < 8  # no 256 MiB split workspace logged
    c = compare(r)
    assert c["graph_est"][0] == pytest.approx(0.80, rel=0.10)

"""SGLang's start-up accounting (memfit.serving.sglang): its defaults by GPU memory, the KV pool
formula of profile_max_num_token, the errors, and published logs."""

from __future__ import annotations

import json

import pytest
from benchmarks.sglang_logs import DATA as SGLANG_LOGS
from benchmarks.sglang_logs import check as check_log

from memfit.errors import SpecError
from memfit.estimate.answer import Answer
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.serving.sglang import (
    capture_batch_sizes,
    default_mem_fraction_static,
    gpu_memory_defaults,
    simulate_sglang,
)
from memfit.serving.sglang_fit import solve_sglang
from memfit.spec import SglangConfig
from memfit.units import GiB


def spec(name: str):  # type: ignore[no-untyped-def]
    s = resolve_model(name).spec
    assert s is not None
    return s


@pytest.mark.parametrize(
    ("mib", "tp", "chunk", "bs", "frac"),
    [
        # H100 80GB (nvidia-smi 81559 MiB): reserved 512 + 8192 x 1.5 + 256 x 2 + 128 = 13440
        (81559, 1, 8192, 256, 0.835),
        # L4 (23034 MiB): 512 + 2048 x 1.5 + 24 x 2 + 128 = 3760
        (23034, 1, 2048, 24, 0.837),
        # H200 (143771 MiB) TP 8: 512 + 12288 + 512 x 2 + 1024 = 14848
        (143771, 8, 8192, 512, 0.897),
    ],
)
def test_the_defaults_follow_handle_gpu_memory_settings(
    mib: int, tp: int, chunk: int, bs: int, frac: float
) -> None:
    assert gpu_memory_defaults(mib, tp) == (chunk, bs)
    assert default_mem_fraction_static(mib, SglangConfig(tp_size=tp), chunk, bs) == frac


def test_a_gpu_over_60_gib_reserves_at_least_10_gib() -> None:
    # 512 + 2048 x 1.5 + 8 x 2 + 128 = 3728 MiB, raised to the 10 GiB floor
    frac = default_mem_fraction_static(81559, SglangConfig(), 2048, 8)
    assert frac == round((81559 - 10240) / 81559, 3)


def test_the_captured_batch_sizes_are_sglangs_list() -> None:
    sizes = capture_batch_sizes(512)  # the 52 sizes sgl-project/sglang#11716 logs at TP 8
    assert sizes[:6] == (1, 2, 4, 8, 12, 16) and sizes[-3:] == (480, 496, 512)
    assert len(sizes) == 52
    assert capture_batch_sizes(24) == (1, 2, 4, 8, 12, 16, 24)


def test_the_kv_pool_is_rest_memory_over_the_cell_size() -> None:
    """profile_max_num_token by hand: Llama-3.1-8B, 32 layers x 8 K/V heads x 128 x 2 x bf16."""
    total, context = int(79.19 * GiB), int(0.75 * GiB)
    s = simulate_sglang(
        spec("llama-3.1-8b"), get_gpu("H100"), SglangConfig(mem_fraction_static=0.8),
        total_bytes=total, context_bytes=context,
    )  # fmt: skip
    before = total - context
    assert s.cell_size_bytes == 32 * 8 * 128 * 2 * 2
    assert s.max_total_num_tokens == int((before - s.loaded_bytes - before * 0.2) // 131072)
    assert s.kv_pool_bytes == (s.max_total_num_tokens + 1) * 131072
    assert s.starts and isinstance(s, Answer) and s.verdict is None


def test_mla_models_keep_one_latent_per_token_whatever_the_tp() -> None:
    s = simulate_sglang(spec("deepseek-v3"), get_gpu("H200"), SglangConfig(tp_size=8))
    assert s.kv_kind == "mla" and s.cell_size_bytes == (512 + 64) * 61 * 2
    assert any(line.startswith("KV Cache is allocated.") and "KV size" in line
               for line in s.log_lines())  # fmt: skip


def test_the_page_size_rounds_the_tokens_down() -> None:
    s = simulate_sglang(spec("llama-3.1-8b"), get_gpu("H100"), SglangConfig(page_size=64))
    assert s.max_total_num_tokens % 64 == 0


def test_weights_larger_than_the_gpu_fail_at_load() -> None:
    s = simulate_sglang(spec("llama-3.1-70b"), get_gpu("L4"), SglangConfig())
    assert not s.starts and s.error.startswith("torch.OutOfMemoryError")  # type: ignore[union-attr]


def test_a_small_mem_fraction_is_sglangs_not_enough_memory_error() -> None:
    s = simulate_sglang(
        spec("llama-3.1-8b"), get_gpu("L40S"), SglangConfig(mem_fraction_static=0.3)
    )
    assert not s.starts
    assert s.error == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.3"
    )
    assert s.smallest_mem_fraction_static is not None and s.smallest_mem_fraction_static > 0.3


def test_a_longer_context_than_the_models_is_refused_before_loading() -> None:
    s = simulate_sglang(spec("llama-3.1-8b"), get_gpu("H100"), SglangConfig(context_length=10**6))
    assert s.refused_layout and "greater than the derived context_length (131072)" in str(s.error)


def test_an_indivisible_tp_is_refused_before_loading() -> None:
    s = simulate_sglang(spec("llama-3.1-70b"), get_gpu("H100"), SglangConfig(tp_size=3))
    assert s.refused_layout and not s.starts


def test_fit_finds_the_longest_context_the_pool_holds() -> None:
    value, s = solve_sglang(spec("llama-3.1-8b"), get_gpu("L4"), SglangConfig())
    assert s is not None and s.starts and 0 < value <= s.max_total_num_tokens
    longer = simulate_sglang(
        spec("llama-3.1-8b"), get_gpu("L4"), SglangConfig(context_length=value + 1)
    )
    assert not longer.starts or longer.max_total_num_tokens < value + 1


def test_a_published_tp8_log_is_matched_within_3_percent() -> None:
    """sgl-project/sglang#11716: Llama-3.x-70B, 8 x H200 (139.80 GiB), "Load weight begin. avail
    mem=137.29 GB", "#tokens: 2795207". Tolerance: the issue's 3 % KV-token target (memfit also
    needs SGLang's default mem_fraction_static, which the excerpt omits)."""
    s = simulate_sglang(
        spec("llama-3.1-70b"), get_gpu("H200"), SglangConfig(tp_size=8),
        total_bytes=int((137.29 + 2.51) * GiB), context_bytes=int(2.51 * GiB),
    )  # fmt: skip
    assert abs(s.max_total_num_tokens - 2795207) / 2795207 < 0.03


#: Qwen/QwQ-32B (the Qwen2.5-32B architecture) as benchmarks/data/sglang_logs.jsonl records it.
QWQ_32B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120,
    "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
    "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05, "hidden_act": "silu",
}  # fmt: skip


def test_a_published_4_x_l4_log_is_matched_line_by_line() -> None:
    """didier-durand/llms-in-clouds docs/sglang.md (3e1df42): QwQ-32B, 4 x L4, TP 4,
    mem_fraction_static 0.85: "Load weight end … mem usage=15.54 GB", "#tokens: 46611",
    "Capture cuda graph end … mem usage=0.93 GB", chunked_prefill_size 2048, cuda_graph_max_bs
    80. Tolerances: weights 1 %, KV tokens 3 % (never more than 3 % over), graphs 20 % (the
    issue's targets)."""
    from memfit.models import ModelSpec

    s = simulate_sglang(
        ModelSpec.from_config(QWQ_32B), get_gpu("L4"),
        SglangConfig(tp_size=4, mem_fraction_static=0.85),
    )  # fmt: skip
    assert abs(s.loaded_bytes / GiB - 15.54) / 15.54 < 0.01
    assert -0.03 < (s.max_total_num_tokens - 46611) / 46611 < 0.03
    assert abs(s.cuda_graph_bytes / GiB - 0.93) / 0.93 < 0.2
    assert (s.chunked_prefill_size, s.cuda_graph_max_bs) == (2048, 80)


def test_gpt_oss_is_sized_with_its_mxfp4_experts_and_its_swa_pool() -> None:
    """The shared layout sizes MXFP4 experts (the vLLM work of issue 31); gpt-oss is one of
    SGLang's hybrid-SWA architectures, so the answer logs the split pool."""
    s = simulate_sglang(spec("gpt-oss-120b"), get_gpu("H100"), SglangConfig())
    assert s.starts and 60 * 2**30 < s.weights_bytes < 66 * 2**30
    assert any("Use sliding window memory pool" in n for n in s.notes)


def test_a_rope_scaled_context_is_sglangs_derived_one() -> None:
    """hf_transformers_utils.get_context_length: a linear factor scales the positions; llama3
    scaling keeps them."""
    from memfit.serving.sglang import sglang_context_length

    assert sglang_context_length(spec("llama-3.1-8b")) == 131072
    gemma = spec("gemma-3-27b")  # rope_scaling {"factor": 8.0, "rope_type": "linear"}
    assert sglang_context_length(gemma) == 131072 * 8


def test_gpt_oss_gets_sglangs_swa_pool_split_by_the_ratio() -> None:
    # set_num_tokens_hybrid_swa (sgl-project/sglang model_runner_kv_cache_mixin.py, 226149ac):
    # full = int(tokens x layers / (ratio x swa_layers + full_layers)), swa = int(full x ratio).
    oss = spec("gpt-oss-20b")
    plain = simulate_sglang(oss, get_gpu("H100"), SglangConfig(disable_hybrid_swa_memory=True))
    swa = simulate_sglang(oss, get_gpu("H100"), SglangConfig())
    # 12 sliding + 12 full layers at ratio 0.8: 24 / 21.6 more full-layer tokens
    assert swa.max_total_num_tokens == int(plain.max_total_num_tokens * 24 / 21.6)
    assert any("swa_layer_tokens=" in n for n in swa.notes)
    assert abs(swa.kv_pool_bytes - plain.kv_pool_bytes) / plain.kv_pool_bytes < 0.001
    half = simulate_sglang(oss, get_gpu("H100"), SglangConfig(swa_full_tokens_ratio=0.5))
    assert half.max_total_num_tokens > swa.max_total_num_tokens


def test_gemma_keeps_one_full_size_pool_as_sglang_does() -> None:
    s = simulate_sglang(spec("gemma-2-9b"), get_gpu("H100"), SglangConfig())
    assert not any("swa_layer_tokens" in n for n in s.notes)
    assert any("is_hybrid_swa_model" in n for n in s.notes)


def test_swa_ratio_out_of_range_is_refused_with_the_value() -> None:
    with pytest.raises(SpecError, match=r"--swa-full-tokens-ratio \(1\.5\) must be a number"):
        SglangConfig(swa_full_tokens_ratio=1.5)


@pytest.mark.parametrize(
    ("version", "mib", "tp", "frac", "chunk", "bs"),
    [
        # 0.4.0-0.4.6: a table by TP size whatever the GPU; 2048 / 8 below 25,000 MiB
        ("0.4.2", 24576, 1, 0.88, 2048, 8),
        ("0.4.4", 81559, 2, 0.87, 8192, 160),
        ("0.4.6", 24564, 4, 0.85, 2048, 80),
        ("0.4.1", 143771, 8, 0.81, 8192, 160),
        ("0.4.6", 81559, 16, 0.79, 8192, 160),
        # 0.4.7-0.5.2 (sgl-project/sglang#7054): (gpu - (2.8 + tp / 10) GiB) / gpu below 35 GiB;
        # the RTX 5080 log (16,303 MiB) implies 0.818, the 24 GB log 0.879
        ("0.4.10", 16303, 1, 0.818, 2048, 8),
        ("0.4.9", 24564, 1, 0.879, 2048, 8),
        ("0.5.2", 24564, 4, 0.867, 2048, 80),
        # (9.5 + tp / 2) GiB below 90 GiB, (12 + tp / 2) GiB below 160 GiB; from 35 GiB the
        # capture list's own ceiling (0.4.9 / 0.4.10 get_batch_sizes_to_capture): 160, 256 above
        # 90 GiB
        ("0.4.7", 81559, 1, 0.874, 8192, 160),
        ("0.5.0", 143771, 8, 0.886, 8192, 256),
    ],
)
def test_the_default_mem_fraction_follows_the_releases_rule(
    version: str, mib: int, tp: int, frac: float, chunk: int, bs: int
) -> None:
    config = SglangConfig(tp_size=tp, sglang_version=version)
    assert gpu_memory_defaults(mib, tp, config.series) == (chunk, bs)
    assert default_mem_fraction_static(mib, config, chunk, bs) == frac


def test_the_rtx_5080_log_needs_its_releases_rule() -> None:
    """Qwen3-0.6B on an RTX 5080 (16,303 MiB), SGLang of August 2025, default mem_fraction_static:
    "Load weight end. … avail mem=13.91 GB, mem usage=1.25 GB", "#tokens: 104273" (memfit code
    index file 47444754202; benchmarks/data/sglang_logs.jsonl). Modelled as 0.4.10 the tokens
    are within the issue's 3 %; with 0.5.3's rule (0.771) they would be 7 % short."""
    before = (13.91 + 1.25) * GiB
    runs = {
        v: simulate_sglang(
            spec("qwen3-0.6b"), get_gpu("RTX-4070-Ti-SUPER"), SglangConfig(sglang_version=v),
            total_bytes=int(before + 0.75 * GiB), context_bytes=int(0.75 * GiB),
            gpu_memory_mib=16303,
        )
        for v in ("0.4.10", "0.5")
    }  # fmt: skip
    assert runs["0.4.10"].mem_fraction_static == 0.818
    assert abs(runs["0.4.10"].max_total_num_tokens - 104273) / 104273 < 0.03
    assert runs["0.5"].max_total_num_tokens < 0.95 * 104273


def test_a_published_4_x_4090_tp4_log_is_matched_end_to_end() -> None:
    """Qwen3-14B on 4 x RTX 4090 (24,564 MiB), TP 4, --mem-fraction-static 0.80 (memfit code
    index file 55529353766, SGLang at commit ebaf86d4): "mem usage=7.08 GB", "#tokens:
    298447", max_running_requests=3730. Tolerances: the issue's 3 % on tokens, 1 % on weights;
    the PCIe TP 4 context is memfit's 0.75 GiB (no custom all-reduce buffers)."""
    s = simulate_sglang(
        spec("qwen3-14b"), get_gpu("RTX-4090"),
        SglangConfig(tp_size=4, mem_fraction_static=0.8),
        total_bytes=24564 * 2**20, gpu_memory_mib=24564,
    )  # fmt: skip
    assert abs(s.max_total_num_tokens - 298447) / 298447 < 0.03
    assert abs(s.loaded_bytes / GiB - 7.08) / 7.08 < 0.01
    assert s.max_running_requests == int(s.max_total_num_tokens / 40960 * 512)
    assert s.chunked_prefill_size == 2048


def test_every_comparable_published_log_is_never_over_by_more_than_3_percent() -> None:
    """benchmarks/data/sglang_logs.jsonl through benchmarks/sglang_logs.py: no prediction of
    max_total_num_tokens (end to end, or given the log's free memory) more than 3 % above the
    log (over-predicting the pool promises concurrency the server does not have), at least ten
    comparable logs, and no logged failure (the Qwen3-8B RTX 5060 Ti one) said to start."""
    rows = [json.loads(x) for x in SGLANG_LOGS.read_text().splitlines() if x.strip()]
    results = [check_log(r) for r in rows if "excluded" not in r]
    failures = [r for r in results if r.get("failed")]
    assert len(results) - len(failures) >= 10
    assert failures and not any(r["starts"] for r in failures)  # never "starts" for a failure
    for r in results:
        for key in ("tokens_e2e_err_pct", "tokens_given_avail_err_pct"):
            assert r.get(key, 0) <= 3, (r["id"], key, r[key])

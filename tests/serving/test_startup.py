"""memfit.serving: vLLM start-up accounting against the figures vLLM's own logs printed."""

from __future__ import annotations

import importlib.util

import pytest

from memfit.errors import NotModelledError, SpecError
from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec, resolve_model
from memfit.serving import VERSIONS, get_version, simulate_startup
from memfit.serving.command import serve_command
from memfit.serving.kv_cache import plan_kv
from memfit.serving.layout import LayerKV, pp_layer_counts
from memfit.spec.serving import VllmConfig
from memfit.units import GiB

H100_LOG_TOTAL = int(79.19 * GiB)  # "79.19 GiB" in the llm-d-planner v0.19.0 H100 logs


def _llama8b(**kw: object) -> object:
    kw.setdefault("vllm_version", "0.19")  # the llm-d-planner logs' release
    config = VllmConfig(gpu_memory_utilization=0.95, max_model_len=8192, **kw)  # type: ignore[arg-type]
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    return simulate_startup(spec, get_gpu("H100"), config, total_bytes=H100_LOG_TOTAL)


def test_llama_8b_kv_cache_matches_the_v0_19_log_within_half_a_percent() -> None:
    # llm-d-planner v0.19.0 report: weights 14.99 GiB, KV 58.11 GiB -> 476,016 tokens.
    s = _llama8b()
    assert s.weights_bytes / GiB == pytest.approx(14.99, abs=0.01)
    assert s.kv_cache_tokens == pytest.approx(476_016, rel=0.005)
    assert s.starts and s.error is None
    assert s.max_concurrency == pytest.approx(476_016 / 8192, rel=0.005)


def test_fp8_kv_cache_doubles_the_tokens_of_the_same_pool() -> None:
    auto, fp8 = _llama8b(), _llama8b(kv_cache_dtype="fp8")
    assert fp8.kv_cache_tokens == pytest.approx(2 * auto.kv_cache_tokens, rel=0.001)


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    one, two = _llama8b(), _llama8b(tensor_parallel_size=2)
    assert two.weights_bytes / GiB == pytest.approx(7.51, abs=0.01)  # log: 7.51 GiB per GPU
    assert two.kv_cache_tokens > 2 * one.kv_cache_tokens  # half the heads, more free memory


def test_online_fp8_keeps_embeddings_in_bf16() -> None:
    assert _llama8b(quantization="fp8").weights_bytes / GiB == pytest.approx(8.49, abs=0.01)


def test_a_model_too_big_for_the_gpu_fails_with_vllms_own_error() -> None:
    spec = resolve_model("llama-3.1-70b").spec
    assert spec is not None
    s = simulate_startup(spec, get_gpu("H100"), VllmConfig(max_model_len=16000))
    assert not s.starts
    assert s.error is not None and "No available memory for the cache blocks" in s.error
    assert s.smallest_gpu_memory_utilization is None  # 131 GiB of bf16 weights: no fraction fits


def test_too_long_a_context_fails_and_names_the_largest_that_starts() -> None:
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    s = simulate_startup(spec, get_gpu("L4"), VllmConfig())  # 131072 tokens on 22 GiB
    assert not s.starts
    assert s.error is not None and "estimated maximum model length" in s.error
    assert s.largest_max_model_len is not None and 0 < s.largest_max_model_len < 131072
    fits = simulate_startup(spec, get_gpu("L4"), VllmConfig(max_model_len=s.largest_max_model_len))
    assert fits.starts


def test_user_max_model_len_above_the_config_fails_like_vllm() -> None:
    spec = resolve_model("qwen3-0.6b").spec
    assert spec is not None
    s = simulate_startup(spec, get_gpu("H100"), VllmConfig(max_model_len=100_000))
    assert not s.starts and s.error is not None and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in s.error


def test_sliding_window_layers_cap_the_blocks_a_request_needs() -> None:
    full = [LayerKV(kind="full", bytes_per_token=1024)] * 4
    slide = [LayerKV(kind="sliding", bytes_per_token=1024, window=4096)] * 4
    args = dict(
        available_bytes=1 << 30,
        block_size=16,
        max_model_len=32768,
        max_num_batched_tokens=2048,
        hybrid_allocator=True,
        tokens_from_concurrency=False,
    )
    assert plan_kv(slide, **args).max_concurrency > 4 * plan_kv(full, **args).max_concurrency  # type: ignore[arg-type]


def test_hybrid_models_get_one_group_per_layer_kind() -> None:
    layers = [LayerKV(kind="full", bytes_per_token=1024)] * 2 + [
        LayerKV(kind="sliding", bytes_per_token=1024, window=512)
    ] * 2
    args = dict(
        available_bytes=1 << 30,
        block_size=16,
        max_model_len=8192,
        max_num_batched_tokens=2048,
        tokens_from_concurrency=False,
    )
    assert plan_kv(layers, hybrid_allocator=True, **args).n_groups == 2  # type: ignore[arg-type]
    assert plan_kv(layers, hybrid_allocator=False, **args).n_groups == 1  # type: ignore[arg-type]


def test_pipeline_stages_split_layers_as_get_pp_indices() -> None:
    assert pp_layer_counts(32, 3) == [11, 11, 10]  # remainder to the stages before the last
    assert pp_layer_counts(32, 4) == [8, 8, 8, 8]


def test_serve_command_uses_the_hub_id_of_a_bundled_model() -> None:
    cmd = serve_command("llama-3.1-8b", VllmConfig(tensor_parallel_size=2, kv_cache_dtype="fp8"))
    assert cmd == "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --kv-cache-dtype fp8"


def test_versions_resolve_to_their_rows_and_bad_ones_are_refused() -> None:
    assert get_version("v0.19.0").name == "0.19"
    assert get_version("0.10.1").name == "0.11"
    assert get_version("0.6.5").engine == "v0"
    with pytest.raises(SpecError, match=r"--vllm-version \('0.3'\): memfit models vLLM 0.4 to"):
        get_version("0.3")
    with pytest.raises(SpecError, match=r"--vllm-version \('latest'\) must be a version"):
        get_version("latest")
    with pytest.raises(NotModelledError, match=r"vLLM 1.0 is not modelled"):
        get_version("1.0")


def test_bad_flags_are_named() -> None:
    with pytest.raises(SpecError, match=r"--gpu-memory-utilization \(1.5\) must be in"):
        VllmConfig(gpu_memory_utilization=1.5)
    with pytest.raises(SpecError, match=r"--quantization \('hqq'\) is not modelled"):
        VllmConfig(quantization="hqq")


def test_encoder_decoder_models_are_said_not_modelled() -> None:
    spec = resolve_model("t5-small").spec
    assert spec is not None
    with pytest.raises(NotModelledError, match="encoder-decoder"):
        simulate_startup(spec, get_gpu("L4"), VllmConfig())


def test_an_unmodelled_checkpoint_format_is_refused() -> None:
    cfg = dict(resolve_model("llama-3.1-8b").config or {})
    cfg["quantization_config"] = {"quant_method": "hqq", "bits": 4}
    with pytest.raises(NotModelledError, match="hqq"):
        simulate_startup(ModelSpec.from_config(cfg), get_gpu("L4"), VllmConfig())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_constants_agree_with_the_installed_vllm() -> None:  # pragma: no cover
    from pathlib import Path

    import vllm.engine.arg_utils as arg_utils  # type: ignore[import-not-found]
    import vllm.model_executor.layers.vocab_parallel_embedding as vpe  # type: ignore[import-not-found]

    assert "UsageContext.OPENAI_API_SERVER: 8192" in Path(arg_utils.__file__).read_text()
    assert vpe.DEFAULT_VOCAB_PADDING_SIZE == 64
    assert set(VERSIONS) >= {"0.19"}


def test_mla_layers_cache_one_latent_per_token_unsplit_by_tp() -> None:
    from memfit.serving.layout import kv_layers

    cfg = dict(resolve_model("llama-3.1-8b").config or {})
    cfg.update(kv_lora_rank=512, qk_rope_head_dim=64)  # DeepSeek-V2/V3's MLA keys
    layers = kv_layers(ModelSpec.from_config(cfg), tp=8, kv_bytes=2)
    assert {x.kind for x in layers} == {"mla"}
    assert layers[0].bytes_per_token == (512 + 64) * 2

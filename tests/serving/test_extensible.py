"""vLLM 0.34's extensible KV cache (memfit.serving.extensible): the sizing after warmup as
``measure_kv_cache_bytes`` / ``blocks_within`` compute it (vllm/v1/worker/extensible_kv_cache.py in
the v0.34.0 sdist), the lines it logs, its errors, and the default version memfit models."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.serving import simulate_startup, versions
from memfit.serving.extensible import (
    KV_CACHE_MARGIN_FLOOR_BYTES,
    VMM_GRANULE_BYTES,
    size_extensible,
)
from memfit.serving.startup import VllmStartup
from memfit.spec.serving import VllmConfig
from memfit.units import GiB, MiB


def _run(model: str = "llama-3.1-8b", gpu: str = "H100", **kw: object) -> VllmStartup:
    spec = resolve_model(model).spec
    assert spec is not None
    kw.setdefault("vllm_version", "0.34.0")
    return simulate_startup(spec, get_gpu(gpu), VllmConfig(**kw))  # type: ignore[arg-type]


def _sizing(requested: int, activation: int) -> object:
    return size_extensible(
        total_bytes=80 * GiB,
        context_bytes=GiB // 2,
        requested_bytes=requested,
        weights_bytes=15 * GiB,
        non_torch_bytes=GiB // 4,
        activation_bytes=activation,
        graph_bytes=GiB,
        n_segments=32,
    )


def test_the_margin_is_a_gib_or_three_quarters_of_the_transient_whichever_is_larger() -> None:
    small, large = _sizing(80 * GiB, GiB // 2), _sizing(80 * GiB, 4 * GiB)
    assert small.margin_bytes == KV_CACHE_MARGIN_FLOOR_BYTES == GiB
    assert large.margin_bytes == 3 * GiB
    # all of the budget (utilization 1.0): the device's headroom less the margin and the transient
    headroom = 80 * GiB - GiB // 2 - 15 * GiB - GiB // 4 - GiB
    assert large.available_bytes == headroom - 3 * GiB - 4 * GiB
    assert large.free_bytes + large.committed_bytes == headroom
    assert large.committed_bytes == 32 * VMM_GRANULE_BYTES  # the null block of each layer


def test_a_utilization_below_one_caps_the_cache_at_the_requested_budget() -> None:
    s = _sizing(40 * GiB, GiB)
    used = 15 * GiB + GiB // 4 + GiB  # weights, non-torch, graphs
    assert s.available_bytes == 40 * GiB - used - GiB


def test_blocks_are_those_whose_granule_rounded_pages_fit() -> None:
    s = _sizing(80 * GiB, GiB)
    per_block = 8 * MiB  # 32 layers x 256 KiB: Llama-3.1-8B, 64 tokens, bf16
    n = s.blocks_within(per_block, 10**9)
    stride, g = per_block // 32, VMM_GRANULE_BYTES

    def pages(k: int) -> int:  # ExtensibleKVCache.physical_bytes_for
        return 32 * (-(-k * stride // g) * g)

    assert pages(n) <= s.available_bytes < pages(n + 1)
    assert s.blocks_within(per_block, 100) == 100  # at most the reserved capacity


def test_llama_8b_on_h100_uses_all_memory_left_after_warmup_with_64_token_blocks() -> None:
    s = _run(max_model_len=8192)
    ext = s.extensible
    assert ext is not None and s.starts
    assert (s.gpu_memory_utilization, s.block_size, s.cuda_graph_estimate_bytes) == (1.0, 64, 0)
    held = s.weights_bytes + s.non_torch_bytes + s.cuda_graph_bytes + s.context_bytes
    margin = max(GiB, int(0.75 * s.activation_peak_bytes))
    assert ext.available_bytes == s.total_bytes - held - margin - s.activation_peak_bytes
    assert ext.available_bytes - 32 * VMM_GRANULE_BYTES <= s.kv_cache_bytes
    assert s.kv_cache_bytes <= ext.available_bytes
    assert s.kv_cache_tokens == s.kv.num_blocks * 64  # one full-attention group
    # more KV cache than 0.33 at its 0.92 default, which takes the graph estimate from the budget
    assert s.kv_cache_bytes > _run(max_model_len=8192, vllm_version="0.33").kv_cache_bytes


def test_0_34_prints_its_own_lines_and_says_what_it_cannot_determine() -> None:
    lines = _run(max_model_len=8192).log_lines()
    text = "\n".join(lines)
    assert lines[1].startswith("Available KV cache memory: ")
    assert "Memory after warmup: " in text and "[not modelled] GiB of torch reservation" in text
    assert "Extended KV cache to " in text
    assert "GPU KV cache size: " in text and "Maximum concurrency for 8,192 tokens" in text
    assert "Estimated CUDA graph memory" not in text  # the estimate is 0 with this cache
    assert " 0 GiB of torch" not in text


def test_a_capacity_too_small_fails_before_warmup_with_vllms_hint() -> None:
    s = _run(gpu="L4")  # 131,072 tokens need 16 GiB of KV cache
    assert not s.starts and s.error is not None
    assert "max seq len (131072)" in s.error
    assert "already takes all device memory left after the model and its activations" in s.error
    assert not any(line.startswith("Memory after warmup") for line in s.log_lines())
    assert s.largest_max_model_len and _run(gpu="L4", max_model_len=s.largest_max_model_len).starts


def test_a_length_the_capacity_holds_but_warmup_leaves_no_room_for_fails_after_warmup() -> None:
    cap_len = 50_000  # within the capacity (est. 54,400), above what is left after graphs
    s = _run(gpu="L4", max_model_len=cap_len)
    assert not s.starts and s.error is not None
    assert "CUDA graphs and warmup" in s.error
    assert any(line.startswith("Memory after warmup") for line in s.log_lines())
    assert not any(line.startswith("Extended KV cache") for line in s.log_lines())


def test_gpt_oss_120b_starts_on_one_h100_at_full_context() -> None:
    s = _run("gpt-oss-120b")
    assert s.starts and s.max_model_len == 131072 and s.kv.max_concurrency >= 1


def test_the_installed_vllm_is_the_default_else_the_newest_modelled(monkeypatch) -> None:
    monkeypatch.setattr(versions, "_installed_vllm", lambda: None)
    assert versions.default_version() == versions.ModelledVersion(
        release=f"0.{versions.LATEST_MINOR}", source="newest modelled"
    )
    assert _run(vllm_version=None).version_source == "newest modelled"
    monkeypatch.setattr(versions, "_installed_vllm", lambda: "0.27.1")
    assert versions.default_version().release == "0.27.1"
    s = _run(vllm_version=None)
    assert (s.release, s.version_source, s.gpu_memory_utilization) == ("0.27.1", "installed", 0.92)
    monkeypatch.setattr(versions, "_installed_vllm", lambda: "0.99.0")
    d = versions.default_version()
    assert d.source == "newest modelled" and d.note and "installed vLLM 0.99.0" in d.note


def test_the_cli_says_which_version_it_modelled_and_why(monkeypatch, capsys) -> None:
    monkeypatch.setattr(versions, "_installed_vllm", lambda: None)
    assert main(["vllm", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vLLM 0.34 (V1 engine; newest modelled release)")
    assert main(["vllm", "llama-3.1-8b", "--gpu", "H100", "--vllm-version", "0.19", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["vllm_release"], data["vllm_version_source"]) == ("0.19", "--vllm-version")
    assert data["gpu_memory_utilization"] == 0.9 and not data["extensible_kv_cache"]


def test_an_explicit_utilization_below_one_still_uses_the_extensible_cache() -> None:
    full, capped = _run(max_model_len=8192), _run(max_model_len=8192, gpu_memory_utilization=0.9)
    assert capped.extensible is not None and capped.gpu_memory_utilization == 0.9
    assert capped.kv_cache_bytes < full.kv_cache_bytes


@pytest.mark.parametrize("flag", ["--block-size", "--gpu-memory-utilization"])
def test_unset_flags_stay_out_of_the_serve_command(flag: str, capsys) -> None:
    assert main(["vllm", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192", "--json"]) == 0
    assert flag not in json.loads(capsys.readouterr().out)["command"]

"""llama.cpp's buffers: placement by -ngl and -ts, the KV cache by -c / -np / cache types / SWA,
the compute buffer against published logs, and the largest -ngl and -c that fit."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.estimate.answer import Answer
from memfit.estimate.llamacpp import (
    LLAMACPP_FIT_TARGET_BYTES,
    estimate_llamacpp,
    largest_ctx,
    largest_ngl,
    llamacpp_headroom_bytes,
)
from memfit.hardware.catalog import get_gpu
from memfit.models.gguf import resolve_gguf
from memfit.serving.llamacpp import layer_devices
from memfit.spec.llamacpp import LlamaCppJob
from memfit.units import MiB

LLAMA_8B = resolve_gguf("llama-3.1-8b:Q4_K_M")


def mib(n: int) -> float:
    return round(n / MiB, 2)


def test_full_offload_matches_a_published_ollama_log_to_the_mib() -> None:
    """Llama-3.1-8B Q4_K_M, n_ctx 8192 (4 x 2048), flash attention off (benchmarks/data/
    llamacpp_logs.jsonl: llama31-8b-q4km-ollama-a): 4403.49 / 281.81 / 1024.00 / 560.00 MiB."""
    job = LlamaCppJob(ctx_size=8192, n_parallel=4, kv_unified=True, flash_attn="off")
    e = estimate_llamacpp(LLAMA_8B, job, get_gpu("RTX-4090"), solve=False)
    d = e.devices[0]
    assert (mib(d.model_bytes), mib(e.host_model_bytes)) == (4403.49, 281.81)
    assert (mib(d.kv_bytes), mib(d.compute_bytes)) == (1024.0, 560.0)
    assert "load_tensors:     CUDA0 model buffer size =    4403.49 MiB" in e.log_lines()


def test_ngl_counts_the_output_layer_first_as_llama_cpp_does() -> None:
    """-ngl 20 on 48 layers: the output and the last 19 repeating layers (lmstudio#1360's log:
    "offloading output layer to GPU / offloading 19 repeating layers to GPU")."""
    model = resolve_gguf("llama-3.1-8b:Q4_K_M")
    where = layer_devices(model, 20, LlamaCppJob())
    assert where[-1] == 0 and where.count(0) == 20 and where[:13] == [None] * 13
    assert layer_devices(model, 0, LlamaCppJob()) == [None] * 33


def test_the_token_embedding_stays_on_the_host_and_a_tied_one_is_copied_to_the_gpu() -> None:
    tied = resolve_gguf("llama-3.2-1b:Q4_K_M")
    e = estimate_llamacpp(tied, LlamaCppJob(ctx_size=4096), None)
    embd = tied.tensor_bytes("token_embd.weight")
    assert e.host_model_bytes == embd  # all layers offloaded: only the embedding on the host
    assert e.devices[0].model_bytes + e.host_model_bytes == tied.total_bytes + embd


def test_a_tensor_split_spreads_layers_by_cumulative_shares() -> None:
    """Two equal GPUs, 80 layers + output: 41 layers on the first (llama31-70b-q4_0-rpc's KV
    buffers 656 / 624 MiB)."""
    model = resolve_gguf("llama-3.1-70b:Q4_0")
    e = estimate_llamacpp(model, LlamaCppJob(ctx_size=4096, n_parallel=1, n_gpus=2), None)
    assert [d.n_layers for d in e.devices] == [41, 39]
    assert [mib(d.kv_bytes) for d in e.devices] == [656.0, 624.0]
    skew = estimate_llamacpp(model, LlamaCppJob(n_gpus=2, tensor_split=(3.0, 1.0)), None)
    assert skew.devices[0].n_layers > 2 * skew.devices[1].n_layers


def test_quantized_kv_is_ggml_row_sized_and_context_is_padded_to_256() -> None:
    f16 = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=8000), None)
    q8 = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=8000, cache_type_k="q8_0",
                                                  cache_type_v="q8_0"), None)  # fmt: skip
    assert f16.n_ctx == 8192  # GGML_PAD(8000, 256)
    assert q8.kv_k_bytes * 32 == f16.kv_k_bytes * 17  # q8_0: 34 bytes per 32 values vs 64


def test_slots_without_a_unified_cache_pad_each_slot() -> None:
    e = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=1000, n_parallel=3), None)
    assert (e.n_ctx_seq, e.n_ctx) == (512, 1536)  # GGML_PAD(1000 / 3, 256) x 3


def test_sliding_window_layers_hold_only_the_window() -> None:
    gemma = resolve_gguf("gemma-3-12b:Q4_K_M")
    e = estimate_llamacpp(gemma, LlamaCppJob(ctx_size=32768, n_parallel=1), None)
    assert e.n_swa_cells == 1536  # GGML_PAD(1024 + 512, 256)
    full = dataclasses.replace(gemma, n_swa=0, swa_layers=(False,) * gemma.n_layer)
    assert estimate_llamacpp(full, LlamaCppJob(ctx_size=32768, n_parallel=1), None).kv_k_bytes > (
        3 * e.kv_k_bytes
    )


def test_flash_attention_off_adds_the_quadratic_scores() -> None:
    on = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=32768, flash_attn="on"), None)
    off = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=32768, flash_attn="off"), None)
    scores = 32768 * 512 * 32 * 4
    assert off.devices[0].compute_bytes - on.devices[0].compute_bytes > scores * 0.9


def test_the_result_is_an_answer_judged_by_the_one_rule() -> None:
    e = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=8192), get_gpu("RTX-3060"))
    assert isinstance(e, Answer)
    assert e.verdict is not None and e.verdict.point_bytes == e.device_used_bytes
    assert e.verdict.capacity_bytes == get_gpu("RTX-3060").capacity_bytes


def test_largest_ngl_and_ctx_are_the_edges_of_fits() -> None:
    gpu = get_gpu("RTX-3060")
    model = resolve_gguf("qwen3-14b:Q8_0")
    job = LlamaCppJob(ctx_size=8192)
    ngl = largest_ngl(model, job, gpu)
    assert 0 < ngl < model.n_layer + 1
    fits = estimate_llamacpp(model, dataclasses.replace(job, n_gpu_layers=ngl), gpu, solve=False)
    over = estimate_llamacpp(model, dataclasses.replace(job, n_gpu_layers=ngl + 1), gpu,
                             solve=False)  # fmt: skip
    assert fits.fits and not over.fits
    ctx = largest_ctx(LLAMA_8B, LlamaCppJob(), gpu)
    at = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=ctx), gpu, solve=False)
    past = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=ctx + 256), gpu, solve=False)
    assert at.fits and not past.fits


@pytest.mark.parametrize("name", ["llama-3.1-8b:Q8_0", "qwen3-8b:Q4_K_M", "mistral-7b-v0.1:F16"])
def test_every_mix_gives_a_model_within_its_bits(name: str) -> None:
    m = resolve_gguf(name)
    n_params = sum(t.n_elements for t in m.tensors)
    bits = 8 * m.total_bytes / n_params
    assert {"Q8_0": 8.0 < bits < 8.6, "Q4_K_M": 4.5 < bits < 5.3, "F16": 15.9 < bits < 16.1}[
        name.split(":")[1]
    ], bits


def test_without_flash_attention_the_cuda_pool_holds_the_f16_scores() -> None:
    """ggml-cuda's batched cuBLAS kqv converts the softmaxed scores to f16 in its pool:
    n_kv x n_ubatch x n_head x 2 bytes, on top of the logged buffers."""
    off = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=8192, n_parallel=1, flash_attn="off"),
                            None)  # fmt: skip
    on = estimate_llamacpp(LLAMA_8B, LlamaCppJob(ctx_size=8192, n_parallel=1, flash_attn="on"),
                           None)  # fmt: skip
    assert off.devices[0].pool_bytes == 8192 * 512 * 32 * 2
    assert on.devices[0].pool_bytes == 0
    d = off.devices[0]
    assert d.total_bytes == d.model_bytes + d.kv_bytes + d.compute_bytes + d.pool_bytes + (
        d.context_bytes
    )
    quant = estimate_llamacpp(
        LLAMA_8B, LlamaCppJob(ctx_size=8192, n_parallel=1, cache_type_k="q8_0",
                              cache_type_v="q8_0", flash_attn="on"), None,
    )  # fmt: skip
    assert quant.devices[0].pool_bytes == 2 * 8192 * 1024 * 2  # one layer's K and V in f16


def test_the_verdict_keeps_llama_cpps_own_one_gib_fit_margin() -> None:
    """A 6 GiB GPU: 1 GiB (llama.cpp's --fit-target) exceeds 5 % of it; on an L4, 5 % is larger."""
    small = dataclasses.replace(get_gpu("RTX-3060"), name="6141 MiB GPU",
                                memory_bytes=6141 * 2**20, aliases=())  # fmt: skip
    e = estimate_llamacpp(resolve_gguf("qwen2.5-7b:Q4_K_M"),
                          LlamaCppJob(ctx_size=4096, n_parallel=1), small, solve=False)  # fmt: skip
    assert e.verdict is not None and e.verdict.headroom_bytes == LLAMACPP_FIT_TARGET_BYTES
    assert e.verdict.verdict == "tight"  # the buffers fit the GPU, not with llama.cpp's margin
    assert any("--fit margin" in n for n in e.notes)
    l4 = get_gpu("L4")
    five_percent = round(l4.capacity_bytes * 0.05)
    assert llamacpp_headroom_bytes(l4) == five_percent > LLAMACPP_FIT_TARGET_BYTES

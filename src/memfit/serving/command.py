"""The ``vllm serve`` command line of a configuration, with the model's hub id."""

from __future__ import annotations

import shlex

from memfit.models.bundled import find_bundled
from memfit.spec.serving import VllmConfig

__all__ = ["hub_id", "serve_command"]


def hub_id(model: str) -> str:
    """What ``vllm serve`` is given for ``model``: a bundled name becomes the hub id its config was
    taken from (``llama-3.1-8b`` -> ``meta-llama/Llama-3.1-8B``); anything else (a hub id, a local
    model dir) is passed as written."""
    bundled = find_bundled(model)
    return bundled.hf_id if bundled is not None else model


def serve_command(model: str, config: VllmConfig, *, max_model_len: int | None = None) -> str:
    """``vllm serve <hub id> …`` with every flag the configuration sets (unset ones are vLLM's
    defaults)."""
    parts = ["vllm", "serve", shlex.quote(hub_id(model))]
    if config.tensor_parallel_size > 1:
        parts += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.pipeline_parallel_size > 1:
        parts += ["--pipeline-parallel-size", str(config.pipeline_parallel_size)]
    if config.gpu_memory_utilization is not None:
        parts += ["--gpu-memory-utilization", f"{config.gpu_memory_utilization:g}"]
    length = max_model_len or config.max_model_len
    if length is not None:
        parts += ["--max-model-len", str(length)]
    for flag, value in (
        ("--max-num-seqs", config.max_num_seqs),
        ("--max-num-batched-tokens", config.max_num_batched_tokens),
    ):
        if value is not None:
            parts += [flag, str(value)]
    if config.block_size is not None:
        parts += ["--block-size", str(config.block_size)]
    if config.kv_cache_dtype != "auto":
        parts += ["--kv-cache-dtype", config.kv_cache_dtype]
    if config.dtype != "auto":
        parts += ["--dtype", config.dtype]
    if config.quantization is not None:
        parts += ["--quantization", config.quantization]
    if config.enforce_eager:
        parts.append("--enforce-eager")
    if config.max_cudagraph_capture_size is not None:
        parts += ["--max-cudagraph-capture-size", str(config.max_cudagraph_capture_size)]
    if config.cpu_offload_gb:
        parts += ["--cpu-offload-gb", f"{config.cpu_offload_gb:g}"]
    return " ".join(parts)

"""The serving job (torch-free): :class:`VllmConfig`, the ``vllm serve`` flags memfit models,
validated once (named as vLLM names them; ``dtype`` is vLLM's ``--dtype`` vocabulary, which the
simulation reads as the model's dtype). :mod:`memfit.serving` simulates its start-up."""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.spec.rules import MAX_GPUS

__all__ = ["DTYPES", "KV_CACHE_DTYPES", "QUANTIZATIONS", "VllmConfig"]

#: ``--kv-cache-dtype`` values (vllm/config/cache.py CacheDType) and their bytes per element;
#: "auto" is the model dtype.
KV_CACHE_DTYPES = {"auto": 0, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}
#: ``--dtype`` values and bytes per element ("auto": config.json's torch_dtype, fp32 cast down).
DTYPES = {
    "auto": 0,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "float": 4,
    "float32": 4,
}
#: ``--quantization`` methods memfit sizes (weights of the linear layers; embeddings and lm_head
#: stay in the model dtype, as vLLM's quantized linear methods leave them).
QUANTIZATIONS = (
    "fp8",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "compressed-tensors",
    "bitsandbytes",
    "int8",
)


@dataclass(frozen=True, kw_only=True)
class VllmConfig:
    """One ``vllm serve`` configuration (None: vLLM's default for the model / GPU / version:
    ``gpu_memory_utilization`` and ``block_size`` are the modelled release's, ``vllm_version``
    the installed vLLM's, else the newest modelled; memfit.serving.startup resolves them)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    cpu_offload_gb: float = 0.0
    vllm_version: str | None = None
    #: ``--max-cudagraph-capture-size`` (0.13+; None: vLLM's min(2 x max_num_seqs, 512))
    max_cudagraph_capture_size: int | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "block_size"):
            value = getattr(self, name)
            if value is None and name == "block_size":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"--{name.replace('_', '-')} ({value!r}) must be 1 or more")
            elif name != "block_size" and value > MAX_GPUS:
                problems.append(
                    f"--{name.replace('_', '-')} ({value:,}) must be at most {MAX_GPUS:,} GPUs "
                    "(memfit.spec.rules.MAX_GPUS)"
                )
        for name in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_cudagraph_capture_size",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"--{name.replace('_', '-')} ({value!r}) must be 1 or more")
        for name in ("gpu_memory_utilization", "cpu_offload_gb"):
            value = getattr(self, name)
            if value is None and name == "gpu_memory_utilization":
                continue
            if not isinstance(value, int | float) or not math.isfinite(value):
                problems.append(f"--{name.replace('_', '-')} ({value!r}) must be a finite number")
        if problems:
            raise SpecError.from_problems(problems)
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            problems.append(f"--gpu-memory-utilization ({util}) must be in (0, 1]")
        if self.block_size is not None and self.block_size not in (1, 8, 16, 32, 64, 128, 256):
            problems.append(
                f"--block-size ({self.block_size}) must be one of 1, 8, 16, 32, 64, 128, 256"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            problems.append(
                f"--kv-cache-dtype ({self.kv_cache_dtype!r}) must be one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            )
        if self.dtype not in DTYPES:
            problems.append(f"--dtype ({self.dtype!r}) must be one of {', '.join(DTYPES)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            problems.append(
                f"--quantization ({self.quantization!r}) is not modelled; memfit sizes "
                f"{', '.join(QUANTIZATIONS)}"
            )
        if self.cpu_offload_gb < 0:
            problems.append(f"--cpu-offload-gb ({self.cpu_offload_gb}) must be 0 or more")
        if self.vllm_version is not None and not isinstance(self.vllm_version, str):
            problems.append(f"--vllm-version ({self.vllm_version!r}) must be a version string")
        if problems:
            raise SpecError.from_problems(problems)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

"""The SGLang serving job (torch-free): :class:`SglangConfig`, the ``python -m
sglang.launch_server`` flags memfit models, validated once and named as SGLang names them
(``python/sglang/srt/server_args.py`` ``ServerArgs``). None means SGLang's own default, which
it computes from the GPU's memory and the TP size (``ServerArgs._handle_gpu_memory_settings``);
:mod:`memfit.serving.sglang` computes the same defaults and simulates the start-up."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.spec.rules import MAX_GPUS

__all__ = [
    "SGLANG_ATTENTION_BACKENDS",
    "SGLANG_DTYPES",
    "SGLANG_KV_CACHE_DTYPES",
    "SGLANG_QUANTIZATIONS",
    "SGLANG_VERSIONS",
    "SglangConfig",
    "sglang_series",
]

#: ``--kv-cache-dtype`` choices (server_args.py) and bytes per element; "auto": the model dtype.
SGLANG_KV_CACHE_DTYPES = {"auto": 0, "fp8_e5m2": 1, "fp8_e4m3": 1, "bf16": 2, "bfloat16": 2}
#: ``--dtype`` choices (SGLang takes vLLM's vocabulary) and bytes per element.
SGLANG_DTYPES = {"auto": 0, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
#: ``--quantization`` methods memfit sizes (of SGLang's QUANTIZATION_CHOICES): the weights of the
#: linear layers; embeddings and lm_head stay in the model dtype.
SGLANG_QUANTIZATIONS = (
    "fp8",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "marlin",
    "bitsandbytes",
    "w8a8_int8",
    "w8a8_fp8",
    "compressed-tensors",
)
#: ``--attention-backend`` choices whose CUDA-graph state memfit sizes
#: (memfit.serving.sglang_graphs); None: SGLang's default for the release and the GPU.
SGLANG_ATTENTION_BACKENDS = ("flashinfer", "fa3", "triton")
#: The SGLang release series whose start-up accounting memfit models (memfit.serving.sglang), named
#: by their first release: the rule that sets the default ``--mem-fraction-static`` changed twice
#: (memfit.serving.sglang_defaults): "0.4" = 0.4.0-0.4.6 (a table by TP size), "0.4.7" = 0.4.7-0.5.2
#: (sgl-project/sglang#7054: GPU memory less a reserve by memory tier), "0.5" = 0.5.3 and later
#: (sgl-project/sglang#10975: a reserve itemised from the prefill chunk and the graph batch).
SGLANG_VERSIONS = ("0.4", "0.4.7", "0.5")
#: ``--sglang-version``: a series name or a release such as 0.4.6.post2, 0.5.2, 0.5.9
_RELEASE_RE = re.compile(r"^0\.(4|5)(?:\.(\d+))?(?:(?:\.?post|rc|\.dev)\d*)?$")
#: the first patch release of each later series within its minor (0.4.7, 0.5.3)
_SERIES_FROM_PATCH = {4: (7, "0.4.7"), 5: (3, "0.5")}

_SIZES = ("tp_size", "dp_size", "ep_size", "page_size")
_OPTIONAL_COUNTS = (
    "context_length",
    "max_running_requests",
    "max_total_tokens",
    "cuda_graph_max_bs",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class SglangConfig:
    """One ``python -m sglang.launch_server`` configuration (None: SGLang's default for the
    model, the GPU and the TP size)."""

    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    enable_dp_attention: bool = False
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    kv_cache_dtype: str = "auto"
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    page_size: int = 1
    quantization: str | None = None
    dtype: str = "auto"
    sglang_version: str = "0.5"
    #: ``--swa-full-tokens-ratio`` (SGLang's default 0.8): sliding-window layers' token slots per
    #: full-attention slot, for the architectures with SGLang's SWA pool (gpt-oss, Llama 4 …)
    swa_full_tokens_ratio: float = 0.8
    #: ``--disable-hybrid-swa-memory``: one pool sized as full attention
    disable_hybrid_swa_memory: bool = False
    #: ``--attention-backend`` (:data:`SGLANG_ATTENTION_BACKENDS`); None: SGLang's default
    attention_backend: str | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in _SIZES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{_flag(name)} ({value!r}) must be 1 or more")
            elif name != "page_size" and value > MAX_GPUS:
                problems.append(
                    f"{_flag(name)} ({value:,}) must be at most {MAX_GPUS:,} GPUs "
                    "(memfit.spec.rules.MAX_GPUS)"
                )
        for name in _OPTIONAL_COUNTS:
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                problems.append(f"{_flag(name)} ({value!r}) must be 1 or more")
        chunk = self.chunked_prefill_size
        if chunk is not None and (not isinstance(chunk, int) or (chunk < 1 and chunk != -1)):
            problems.append(
                f"--chunked-prefill-size ({chunk!r}) must be 1 or more, or -1 (no chunking)"
            )
        swa = self.swa_full_tokens_ratio
        if (
            not isinstance(swa, int | float)
            or isinstance(swa, bool)
            or not math.isfinite(swa)
            or not 0 < swa <= 1
        ):
            problems.append(f"--swa-full-tokens-ratio ({swa!r}) must be a number in (0, 1]")
        frac = self.mem_fraction_static
        if frac is not None and (
            not isinstance(frac, int | float) or not math.isfinite(frac) or not 0 < frac < 1
        ):
            problems.append(f"--mem-fraction-static ({frac!r}) must be a number in (0, 1)")
        if problems:
            raise SpecError.from_problems(problems)
        problems += self._choice_problems()
        if self.tp_size % self.ep_size:
            problems.append(
                f"--ep-size ({self.ep_size}) must divide --tp-size ({self.tp_size}): SGLang's "
                "expert-parallel group is carved out of the tensor-parallel one"
            )
        if self.enable_dp_attention and self.tp_size % self.dp_size:
            problems.append(
                f"--dp-size ({self.dp_size}) must divide --tp-size ({self.tp_size}) with "
                "--enable-dp-attention (attention runs on tp/dp GPUs per replica)"
            )
        if problems:
            raise SpecError.from_problems(problems)

    def _choice_problems(self) -> list[str]:
        problems = []
        if self.kv_cache_dtype not in SGLANG_KV_CACHE_DTYPES:
            problems.append(
                f"--kv-cache-dtype ({self.kv_cache_dtype!r}) must be one of "
                f"{', '.join(SGLANG_KV_CACHE_DTYPES)}"
            )
        backend = self.attention_backend
        if backend is not None and backend not in SGLANG_ATTENTION_BACKENDS:
            problems.append(
                f"--attention-backend ({backend!r}) is not modelled; memfit sizes the CUDA-graph "
                f"state of {', '.join(SGLANG_ATTENTION_BACKENDS)} (leave it out for SGLang's "
                "default)"
            )
        if self.dtype not in SGLANG_DTYPES:
            problems.append(f"--dtype ({self.dtype!r}) must be one of {', '.join(SGLANG_DTYPES)}")
        if self.quantization is not None and self.quantization not in SGLANG_QUANTIZATIONS:
            problems.append(
                f"--quantization ({self.quantization!r}) is not modelled for SGLang; memfit "
                f"sizes {', '.join(SGLANG_QUANTIZATIONS)}"
            )
        if sglang_series(self.sglang_version) is None:
            problems.append(
                f"--sglang-version ({self.sglang_version!r}) must be an SGLang release from 0.4.0 "
                "on (0.4.x or 0.5.x, e.g. 0.4.6.post2 or 0.5.9) or a series name "
                f"({', '.join(SGLANG_VERSIONS)}): the start-up accounting memfit models"
            )
        return problems

    @property
    def series(self) -> str:
        """The release series of ``sglang_version`` (:data:`SGLANG_VERSIONS`)."""
        series = sglang_series(self.sglang_version)
        if series is None:  # unreachable: __post_init__ refused it
            raise SpecError(f"--sglang-version ({self.sglang_version!r}) is not modelled")
        return series

    @property
    def attn_tp_size(self) -> int:
        """GPUs one attention layer is split over: tp / dp with DP attention, else tp."""
        return self.tp_size // self.dp_size if self.enable_dp_attention else self.tp_size


def sglang_series(version: object) -> str | None:
    """The series (:data:`SGLANG_VERSIONS`) of an SGLang release: "0.4.6.post2" -> "0.4",
    "0.5.2" -> "0.4.7", "0.5.9" -> "0.5"; a series name maps to itself ("0.5": 0.5.3 and later);
    None for what memfit does not model (before 0.4, after 0.5)."""
    if not isinstance(version, str):
        return None
    if version in SGLANG_VERSIONS:
        return version
    match = _RELEASE_RE.match(version)
    if match is None:
        return None
    minor, patch = int(match.group(1)), match.group(2)
    first_patch, later = _SERIES_FROM_PATCH[minor]
    earlier = "0.4" if minor == 4 else "0.4.7"
    if patch is None:  # "0.4.post1"-like spellings are not releases
        return None
    return later if int(patch) >= first_patch else earlier

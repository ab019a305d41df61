"""The llama.cpp job (torch-free): :class:`LlamaCppJob`, the ``llama-server`` flags that change
memory, named and defaulted as llama.cpp names and defaults them (common/common.h
``common_params`` and tools/server/server.cpp, ggml-org/llama.cpp commit 001d906a):

=====================  ===========================  ============================================
field                  llama-server flag            default
=====================  ===========================  ============================================
``n_gpu_layers``       ``-ngl``, ``--n-gpu-layers``  ``"auto"`` (n_gpu_layers = -1); memfit
                                                    offloads every layer and answers the
                                                    largest count that fits; ``"all"``, or N
``ctx_size``           ``-c``, ``--ctx-size``       0: the model's trained context
``cache_type_k/_v``    ``-ctk`` / ``-ctv``          f16
``flash_attn``         ``-fa on|off|auto``          auto (on where the backend has it: CUDA)
``batch_size``         ``-b``, ``--batch-size``     2048
``ubatch_size``        ``-ub``, ``--ubatch-size``   512
``n_parallel``         ``-np``, ``--parallel``      None = auto: 4 slots sharing one unified KV
                       (Ollama:                     cache (server.cpp: "n_parallel is set to
                       ``OLLAMA_NUM_PARALLEL``)     auto, using n_parallel = 4 and kv_unified")
``kv_unified``         ``-kvu``                     None: on for auto slots, off otherwise
``tensor_split``       ``-ts``, ``--tensor-split``  None: even over ``n_gpus``
``n_gpus``             (memfit ``--gpus``)          1
``file_type``          ``MODEL:Q4_K_M``             for a bundled config: the llama-quantize
                                                    mix to size it as (None: Q4_K_M)
=====================  ===========================  ============================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.spec.rules import MAX_GPUS, MAX_SEQ_LEN

__all__ = ["FILE_TYPES", "FLASH_ATTN", "KV_CACHE_TYPES", "LlamaCppJob"]

#: ``-ctk`` / ``-ctv`` values llama.cpp accepts (common/arg.cpp ``kv_cache_types``).
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: llama-quantize file types memfit mixes for a bundled config (memfit.models.ggml_types).
FILE_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S",
    "Q4_0", "Q3_K_M",
)  # fmt: skip

FLASH_ATTN = ("on", "off", "auto")
_QUANTIZED_KV = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


@dataclass(frozen=True, kw_only=True)
class LlamaCppJob:
    """One ``llama-server`` (or Ollama runner) configuration on one host."""

    n_gpu_layers: int | str = "auto"
    ctx_size: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    batch_size: int = 2048
    ubatch_size: int = 512
    n_parallel: int | None = None
    kv_unified: bool | None = None
    tensor_split: tuple[float, ...] | None = None
    n_gpus: int = 1
    file_type: str | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        ngl = self.n_gpu_layers
        if isinstance(ngl, bool) or not (
            (isinstance(ngl, int) and ngl >= 0) or ngl in ("auto", "all")
        ):
            problems.append(f"-ngl ({ngl!r}) must be a layer count (0 or more), auto or all")
        if not _int_in(self.ctx_size, 0, MAX_SEQ_LEN):
            problems.append(
                f"-c ({self.ctx_size!r}) must be 0 (the model's trained context) or a token "
                f"count up to {MAX_SEQ_LEN:,}"
            )
        for flag, value in (("-b", self.batch_size), ("-ub", self.ubatch_size)):
            if not _int_in(value, 1, MAX_SEQ_LEN):
                problems.append(f"{flag} ({value!r}) must be 1 to {MAX_SEQ_LEN:,} tokens")
        if self.n_parallel is not None and not _int_in(self.n_parallel, 1, 4096):
            problems.append(f"-np ({self.n_parallel!r}) must be 1 to 4096 slots")
        if not _int_in(self.n_gpus, 1, MAX_GPUS):
            problems.append(f"--gpus ({self.n_gpus!r}) must be 1 to {MAX_GPUS}")
        for flag, kind in (("-ctk", self.cache_type_k), ("-ctv", self.cache_type_v)):
            if kind not in KV_CACHE_TYPES:
                problems.append(f"{flag} ({kind!r}) must be one of {', '.join(KV_CACHE_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            problems.append(f"-fa ({self.flash_attn!r}) must be on, off or auto")
        elif self.flash_attn == "off" and self.cache_type_v in _QUANTIZED_KV:
            problems.append(
                f"-ctv {self.cache_type_v} with -fa off: llama.cpp refuses a quantized V cache "
                'without flash attention ("V cache quantization requires flash_attn"); use '
                "-fa on or -ctv f16"
            )
        problems += self._split_problems()
        if self.file_type is not None and self.file_type.upper() not in FILE_TYPES:
            problems.append(
                f"file type ({self.file_type!r}) must be one of {', '.join(FILE_TYPES)}"
            )
        if problems:
            raise SpecError.from_problems(problems)

    def _split_problems(self) -> list[str]:
        ts = self.tensor_split
        if ts is None:
            return []
        if not ts or len(ts) > MAX_GPUS or any(
            not isinstance(v, int | float) or not math.isfinite(v) or v < 0 for v in ts
        ) or sum(ts) <= 0:  # fmt: skip
            return [f"-ts ({ts!r}) must be 1 to {MAX_GPUS} non-negative shares, not all 0"]
        if len(ts) != self.n_gpus:
            return [f"-ts has {len(ts)} shares for --gpus {self.n_gpus}: give one per GPU"]
        return []

    @property
    def slots(self) -> int:
        """Server slots: -np, or 4 when it is auto."""
        return 4 if self.n_parallel is None else self.n_parallel

    @property
    def unified(self) -> bool:
        """One KV cache shared by the slots (auto slots: yes; -np N: only with -kvu)."""
        if self.kv_unified is not None:
            return self.kv_unified
        return self.n_parallel is None


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

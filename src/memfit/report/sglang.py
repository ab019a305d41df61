"""What ``memfit sglang`` prints: SGLang's start-up lines, the verdict and the way out (text), or
one JSON record (torch-free)."""

from __future__ import annotations

from typing import Any

from memfit.errors import MemfitError
from memfit.hardware import get_gpu
from memfit.serving.sglang import SglangStartup
from memfit.units import GiB


def sglang_json(s: SglangStartup, command: str | None = None) -> dict[str, Any]:
    """The ``--json`` record of one SglangStartup, with its ``launch_server`` command line."""
    return {**s.to_json(), "command": command}


def render_sglang(s: SglangStartup, model: str) -> str:
    """The start-up lines, the verdict and what would start instead."""
    g = 1 / GiB
    out = [
        f"SGLang {s.version} serving {model} on {s.gpu} (per GPU: {s.total_bytes * g:.2f} GiB, "
        f"weights {s.weight_format}, mem_fraction_static {s.mem_fraction_static}):"
    ]
    if s.refused_layout:  # refused before it loads anything
        out.append(f"FAILS: {s.error}")
        return "\n".join(out + [f"note: {n}" for n in s.notes])
    out += [f"  {line}" for line in s.log_lines()]
    out.append(
        f"  [memfit] KV cell {s.cell_size_bytes:,} B/token ({s.kv_kind}, {s.kv_cache_dtype}), "
        f"req_to_token {s.req_to_token_bytes * g:.2f} GiB, CUDA graphs ~"
        f"{s.cuda_graph_bytes * g:.2f} GiB for bs up to "
        f"{max(s.capture_bs) if s.capture_bs else 0}; chunked_prefill_size "
        f"{s.chunked_prefill_size}, cuda_graph_max_bs {s.cuda_graph_max_bs}"
    )
    if s.starts:
        out.append(
            f"STARTS: {s.max_total_num_tokens:,} KV tokens, "
            f"{s.max_total_num_tokens // s.context_length} request(s) of the full "
            f"{s.context_length:,}-token context at once"
        )
    else:
        out.append(f"FAILS: {s.error}")
        if s.largest_context_length:
            out.append(f"  largest --context-length the pool holds: {s.largest_context_length}")
        if s.smallest_mem_fraction_static is not None:
            out.append(
                "  smallest --mem-fraction-static holding one full-context request: "
                f"{s.smallest_mem_fraction_static:.3f}"
            )
        else:
            out.append(
                "  no --mem-fraction-static holds the weights and one request: more GPUs "
                f"(--tp), {_smaller_weights(s.gpu)} or a shorter --context-length"
            )
    out += [f"note: {n}" for n in s.notes]
    return "\n".join(out)


def _smaller_weights(gpu: str) -> str:
    """The weight format to name for a GPU: online FP8 where it has FP8 tensor cores, else a
    4-bit AWQ / GPTQ checkpoint (FP8 is never proposed to a GPU without it)."""
    try:
        fp8 = bool(get_gpu(gpu).supports_fp8)
    except MemfitError:  # a GPU memfit's catalog does not name: the format every GPU runs
        fp8 = False
    return "--quantization fp8" if fp8 else "a 4-bit AWQ / GPTQ checkpoint (this GPU has no FP8)"

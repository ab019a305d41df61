"""A serving question memfit does not model for SGLang or llama.cpp: said as "not modelled"
(exit 1, not bad input), with the nearest answers memfit has — the same server on vLLM where
memfit models it, and the model's inference outside any server (``memfit estimate``)."""

from __future__ import annotations

from typing import Any

__all__ = ["not_modelled_json", "render_server_not_modelled"]


def _nearest(model: str, gpu: str, vllm: bool) -> list[str]:
    """``vllm``: memfit models the same model under vLLM (a generative decoder)."""
    out = [f"memfit estimate {model} --mode infer --gpu {gpu}"]
    if vllm:
        out.insert(0, f"memfit vllm {model} --gpu {gpu}")
    return out


def not_modelled_json(
    runtime: str, model: str, gpu: str, reason: str, *, vllm: bool
) -> dict[str, Any]:
    return {
        "kind": runtime,
        "modelled": False,
        "model": model,
        "gpu": gpu,
        "reason": reason,
        "nearest_commands": _nearest(model, gpu, vllm),
    }


def render_server_not_modelled(model: str, gpu: str, reason: str, *, vllm: bool) -> str:
    lines = [f"NOT MODELLED: {reason}"]
    lines += [f"  nearest answer memfit has: {c}" for c in _nearest(model, gpu, vllm)]
    return "\n".join(lines)

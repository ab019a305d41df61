"""Linear layers a quantized checkpoint leaves unquantized, from its ``quantization_config``.

vLLM skips the modules the config lists: ``ignored_layers`` (``Fp8Config``), ``ignore``
(compressed-tensors, entries ``re:<regex>`` or exact names), ``modules_to_not_convert``
(FBGEMM FP8, AWQ, MXFP4, bitsandbytes) — ``is_layer_skipped`` in
``vllm/model_executor/layers/quantization/utils/quant_utils.py`` matches a layer by its prefix,
and a fused layer (``qkv_proj``, ``gate_up_proj``) by its shards. A skipped linear stays in the
model dtype. Meta's Llama-3.1-405B-FP8 (``fbgemm_fp8``), for one, leaves every attention
projection in bf16; DeepSeek / Qwen FP8 checkpoints leave the router. Without this, memfit
costed those layers at one byte per weight.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from memfit.models import ModelSpec
from memfit.serving.params import attention_shape

__all__ = ["IGNORE_KEYS", "unquantized_linear_params"]

#: quantization_config keys that list modules left unquantized.
IGNORE_KEYS = ("ignored_layers", "ignore", "modules_to_not_convert")


def _entries(raw: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key in IGNORE_KEYS:
        value = raw.get(key)
        if isinstance(value, list | tuple):
            out += [str(x) for x in value if isinstance(x, str) and x]
    return out


def _matches(name: str, entry: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if "*" in entry or "?" in entry:
        return fnmatch.fnmatchcase(name, entry) or fnmatch.fnmatchcase(name, entry + ".*")
    dotted = f".{name}."
    return name == entry or name.startswith(entry + ".") or f".{entry}." in dotted


def _layer_modules(spec: ModelSpec, i: int) -> Iterable[tuple[str, int]]:
    """(module name, weight count) of layer ``i``'s attention and dense MLP linears."""
    text = spec.text or spec
    h = text.hidden_size or 0
    heads, kv, hd = attention_shape(text)
    q, k = (heads or 0) * (hd or 0), (kv or 0) * (hd or 0)
    inter = text.intermediate_size or 0
    prefix = f"model.layers.{i}"
    yield f"{prefix}.self_attn.q_proj", h * q
    yield f"{prefix}.self_attn.k_proj", h * k
    yield f"{prefix}.self_attn.v_proj", h * k
    yield f"{prefix}.self_attn.o_proj", q * h
    if not text.n_experts:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield f"{prefix}.mlp.{proj}", h * inter


def unquantized_linear_params(spec: ModelSpec) -> int:
    """Weights of the decoder layers' attention / dense MLP linears that the checkpoint's
    ``quantization_config`` leaves unquantized (0 without a list or a quantization_config)."""
    q = spec.quantization
    entries = _entries(dict(q.raw)) if q is not None else []
    n_layers = (spec.text or spec).n_layers or 0
    if not entries or not n_layers:
        return 0
    return sum(
        n
        for i in range(n_layers)
        for name, n in _layer_modules(spec, i)
        if any(_matches(name, e) for e in entries)
    )

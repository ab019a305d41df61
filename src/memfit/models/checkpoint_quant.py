"""The weight format a pre-quantized checkpoint's ``quantization_config`` sets (torch-free).

A GPTQ / AWQ / FP8 / bitsandbytes checkpoint stores its weights in that format whatever memfit's
``--quant`` default says; :func:`checkpoint_format` maps the config to memfit's ``--quant`` value
(and GPTQ/AWQ group size), or says why the format is not modelled. Keys as transformers' quantizer
configs spell them (``GPTQConfig``, ``AwqConfig``, ``FineGrainedFP8Config``, ``BitsAndBytesConfig``,
compressed-tensors' ``config_groups``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memfit.models.model_spec import QuantizationConfig


@dataclass(frozen=True, kw_only=True)
class CheckpointFormat:
    """``quant``: memfit's ``--quant`` value (None: not modelled, ``why`` says so);
    ``group_size``: GPTQ/AWQ's (None: memfit's default); ``described``: the config in words."""

    quant: str | None
    group_size: int | None
    described: str
    why: str | None = None
    #: False: transformers dequantizes the MoE experts at load (compressed-tensors)
    experts: bool = True


def checkpoint_format(q: QuantizationConfig | None) -> CheckpointFormat | None:
    """The format of a checkpoint's ``quantization_config``; None without one."""
    if q is None:
        return None
    method = (q.method or "").lower()
    raw = q.raw
    described = f"{method or 'unknown method'}, {q.bits}-bit" if q.bits else method or "unknown"
    if method in ("gptq", "awq") and q.bits == 4:
        return CheckpointFormat(
            quant=f"int4-{method}", group_size=_group(raw.get("group_size")), described=described
        )
    if method == "bitsandbytes" and raw.get("load_in_4bit"):
        kind = str(raw.get("bnb_4bit_quant_type") or "fp4")
        quant = "nf4-dq" if kind == "nf4" and raw.get("bnb_4bit_use_double_quant") else kind
        return CheckpointFormat(quant=quant, group_size=None, described=f"bitsandbytes {quant}")
    if method == "bitsandbytes" and raw.get("load_in_8bit"):
        return CheckpointFormat(quant="int8", group_size=None, described="bitsandbytes int8")
    if method == "fp8" or (method == "compressed-tensors" and _weights(raw) == ("float", 8)):
        block = raw.get("weight_block_size")
        blocks = ""
        if isinstance(block, list) and len(block) == 2:
            blocks = f", {block[0]}x{block[1]} blocks"
        kind = "fp8" if method == "fp8" else f"{method} fp8"
        return CheckpointFormat(
            quant="fp8", group_size=None, described=kind + blocks, experts=method == "fp8"
        )
    if method == "mxfp4":  # transformers Mxfp4Config: gpt-oss experts as blocks + E8M0 scales
        return CheckpointFormat(quant="mxfp4", group_size=None, described="mxfp4 experts")
    return CheckpointFormat(
        quant=None,
        group_size=None,
        described=described,
        why=(
            f"the checkpoint's quantization_config ({described}) is not a format memfit models; "
            "its weights are costed in the model's dtype (an over-estimate for fewer bits); pass "
            "--quant to choose the closest modelled format"
        ),
    )


def _group(value: Any) -> int | None:
    """GPTQ/AWQ ``group_size``; -1 (one scale per output column) is costed as memfit's default
    groups, slightly more scale bytes than the checkpoint holds."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _weights(raw: Mapping[str, Any]) -> tuple[str, int] | None:
    """compressed-tensors: the (type, num_bits) of the first config group's weights."""
    groups = raw.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    for group in groups.values():
        w = group.get("weights") if isinstance(group, Mapping) else None
        if isinstance(w, Mapping):
            return str(w.get("type")), int(w.get("num_bits") or 0)
    return None

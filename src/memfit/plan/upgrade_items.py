"""The vocabulary of ``memfit upgrade`` (:mod:`memfit.plan.upgrade`): its items, their statuses
and thresholds, :class:`CheckItem`, and the one item read from the config and the GPU alone
(:func:`precision_item`). The checks themselves: :mod:`memfit.plan.upgrade_checks`."""

from __future__ import annotations

from typing import Any, ClassVar

from memfit.models.model_spec import ModelSpec
from memfit.plan.checklist import CheckResult

#: Thresholds of the checklist, each a rule of thumb chosen here, with its reason.
UPGRADE_THRESHOLDS: dict[str, tuple[float, str]] = {
    "impractical_slowdown": (
        2.0,
        "a plan predicted to take twice the step time of the naive stack doubles the GPU-hours "
        "of the job; full recomputation alone costs one extra forward of the three passes "
        "(+33 %, Chen et al. 2016), so the bound is only reached with offload or several "
        "slowdowns stacked",
    ),
    "decode_floor_tokens_per_s": (
        10.0,
        "tokens/s each request must stream at to stay ahead of a reader: ~250 words/min at "
        "~1.3 tokens/word is ~5.5 tokens/s; memfit asks for about twice that",
    ),
}


def threshold(name: str) -> float:
    """The value of ``UPGRADE_THRESHOLDS[name]``."""
    return UPGRADE_THRESHOLDS[name][0]


#: ``unknown``: nothing estimated fits, but some combinations could not be estimated (the engine
#: does not model them yet), so they might fit; the verdict is then ``undetermined``.
STATUSES = ("triggered", "not_triggered", "not_applicable", "unknown")
ITEMS: dict[str, str] = {
    "plan_exceeds_vram": "the optimized plan still exceeds VRAM",
    "context_unreachable": "the required context cannot be reached",
    "throughput_target": "the largest batch is too small for the throughput target",
    "kv_cache_concurrency": "concurrent requests x context exhaust the KV cache",
    "impractical_recompute_offload": "only impractical recomputation / offload fits",
    "precision_support": "the GPU lacks a precision the model needs",
    "bandwidth": "memory bandwidth too low for interactive decode",
}


class CheckItem(CheckResult):
    """One checklist item: its status, the evidence in words, and the numbers behind it."""

    TITLES: ClassVar[dict[str, str]] = ITEMS
    STATUSES: ClassVar[tuple[str, ...]] = STATUSES
    FLAGGED: ClassVar[str] = "triggered"
    CLEAR: ClassVar[str] = "not_triggered"

    @property
    def triggered(self) -> bool:
        return self.flagged


def not_applicable(item_id: str, why: str) -> CheckItem:
    """The item ``item_id`` does not apply to this job, because ``why``."""
    return CheckItem(id=item_id, status="not_applicable", evidence=why)


def precision_item(model: ModelSpec | dict[str, Any] | None, gpu: Any) -> CheckItem:
    """bf16 weights on a GPU without bf16, fp8 weights on one without fp8 (catalog flags);
    ``model`` is a ModelSpec or its config.json dict."""
    spec = None if model is None else ModelSpec.of(model)
    needs = _needed_precisions(spec)
    if not needs:
        dtype = spec.dtype if spec is not None else None
        return not_applicable(
            "precision_support", f"the model's weights (torch_dtype {dtype}) need no bf16 or fp8"
        )
    have = {"bf16": gpu.supports_bf16, "fp8": gpu.supports_fp8}
    missing = [p for p in needs if not have[p]]
    numbers = {"needs": list(needs), "missing": missing, "arch": gpu.arch}
    if missing:
        text = (
            f"the model's weights are {'/'.join(missing)} and {gpu.name} ({gpu.arch}) has no "
            f"{'/'.join(missing)} tensor cores: "
        )
        text += "fp16 autocast can overflow on bf16-pretrained weights" if "bf16" in missing else ""
        text += "; " if len(missing) == 2 else ""
        text += "fp8 weights must be upcast (2x the memory)" if "fp8" in missing else ""
        return CheckItem(id="precision_support", status="triggered", evidence=text, numbers=numbers)
    text = f"{gpu.name} ({gpu.arch}) runs {'/'.join(needs)}, as the model's weights need"
    return CheckItem(id="precision_support", status="not_triggered", evidence=text, numbers=numbers)


def _needed_precisions(spec: ModelSpec | None) -> tuple[str, ...]:
    if spec is None:
        return ()
    dtype, quant = spec.text_field("dtype"), spec.text_field("quantization")
    needs = []
    if str(dtype or "").lower() in ("bfloat16", "bf16"):
        needs.append("bf16")
    if str(quant.method if quant else "").lower() == "fp8" or "float8" in str(dtype):
        needs.append("fp8")
    return tuple(needs)


__all__ = [
    "ITEMS",
    "STATUSES",
    "UPGRADE_THRESHOLDS",
    "CheckItem",
    "not_applicable",
    "precision_item",
    "threshold",
]

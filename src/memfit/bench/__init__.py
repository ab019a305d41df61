"""``memfit bench`` and the quantization quality gate: run a real small model on this machine.

>>> res = memfit.bench("opt-125m", techniques=["bf16", "lora"], steps=3)   # doctest: +SKIP
>>> res.row("lora").measured_peak_bytes < res.row("baseline").measured_peak_bytes
True

Modules: :mod:`~memfit.bench.data` (packaged text), :mod:`~memfit.bench.models` (packaged or
bundled models), :mod:`~memfit.bench.measure` (peak memory and step time),
:mod:`~memfit.bench.gate` (KL / top-1 / cosine and the gate), :mod:`~memfit.bench.runner`
(the rows), :mod:`~memfit.bench.render` (table, Markdown, PNG). Techniques are applied with
``memfit.apply_plan_`` / ``memfit.build_optimizer``.

This package's ``__init__`` does not import torch (``import memfit`` imports it); the names below
load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BASELINE": "runner",
    "COMBINED": "runner",
    "TECHNIQUES": "runner",
    "bench": "runner",
    "BenchResult": "result",
    "BenchRow": "result",
    "QualityResult": "gate",
    "QualityThresholds": "gate",
    "compare_outputs": "gate",
    "quality": "gate",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memfit.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"memfit.bench.{module}"), name)

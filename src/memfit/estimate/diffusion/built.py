"""What the composition reads of a built pipeline component besides its trace: its facts and its
weight layouts, each worked out once per process and kept under the trace cache's key rule.

A "what makes it fit" search (``plan/diffusion_infer.py``) estimates up to a dozen variants of
one pipeline: other offload modes, weight formats, VAE tiling. Each variant used to build every
component on the meta device again (``estimate flux.1-dev --mode infer --gpu L4``: 52 builds for
13 estimates, ~4.5 s of builds and ~2.5 s of dtype casts and layouts on a 2-core machine). None
of that depends on the offload mode or the GPU:

* :class:`ComponentFacts` (the parameter count that picks the text encoder to quantize, the
  modules the class keeps in fp32, whether it has ``set_attention_slice``) depend only on the
  component: its library, class and config;
* a :class:`~memfit.estimate.diffusion.weights.WeightLayout` depends on the component, its dtype,
  the pipeline switches applied to the built module before it is laid out (VAE slicing / tiling,
  attention slicing, transformers' fp32 modules under bitsandbytes) and the layout's own
  arguments (weight format, layerwise casting, compute dtype, blocks per offload group, modules
  not converted) — every one of them is in the key.

So a variant whose facts and layouts are known builds nothing (its traces are kept by
``pipelines._TRACES`` and the trace cache already); a missing one builds the component once, in
the same order of steps as before (build, dtype, switches, fp32 modules, layout, trace).
Both are also kept in the trace cache (:func:`memfit.estimate.trace_cache.cached_record`, THE
key rule: installed versions and memfit's source included), so another job or GPU on the same
pipeline reads them back instead of importing diffusers to build them. A kept record that does
not decode to plausible values (a field missing, a negative count) is worked out again and
replaced, never used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from memfit.estimate.diffusion.assemble import ComponentFacts
from memfit.estimate.diffusion.weights import LAYOUT_BYTES, WeightLayout, layout_from_record
from memfit.estimate.trace_cache import cached_record

#: In-process memos in front of the trace cache, by the canonical JSON of their key parts.
_FACTS: dict[str, ComponentFacts] = {}
_LAYOUTS: dict[str, WeightLayout] = {}


def _canonical(parts: dict[str, Any]) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def component_facts(component: list[Any], model: Callable[[], Any]) -> ComponentFacts:
    """The facts of ``component`` (``[library, class_name, config]``), from ``model()`` (the
    component built) only where neither this process nor the trace cache knows them."""
    parts = {"component": component, "facts": 1}
    key = _canonical(parts)
    if key not in _FACTS:
        record = cached_record(parts, lambda: _facts_record(model()), valid=_valid_facts)
        _FACTS[key] = ComponentFacts(
            n_params=int(record["n_params"]),
            keep_in_fp32=tuple(str(k) for k in record["keep_in_fp32"]),
            type_name=str(record["type_name"]),
            has_attention_slice=bool(record["has_attention_slice"]),
        )
    return _FACTS[key]


def component_layout(
    component: list[Any], options: dict[str, Any], run: Callable[[], WeightLayout]
) -> WeightLayout:
    """The layout of ``component`` under ``options`` (everything ``run`` depends on beyond the
    component: its dtype, the switches applied to it, the layout's arguments), from ``run()``
    only where neither this process nor the trace cache knows it."""
    parts = {"component": component, "layout": options}
    key = _canonical(parts)
    if key not in _LAYOUTS:
        record = cached_record(parts, lambda: _layout_record(run()), valid=_valid_layout)
        _LAYOUTS[key] = layout_from_record(record)
    return _LAYOUTS[key]


def _facts_record(model: Any) -> dict[str, Any]:
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    return {
        "n_params": sum(p.numel() for p in model.parameters()),
        "keep_in_fp32": [str(k) for k in keep],
        "type_name": type(model).__name__,
        "has_attention_slice": hasattr(model, "set_attention_slice"),
    }


def _valid_facts(r: dict[str, Any]) -> bool:
    return (
        type(r["n_params"]) is int
        and r["n_params"] >= 0
        and isinstance(r["keep_in_fp32"], list)
        and all(isinstance(k, str) for k in r["keep_in_fp32"])
        and isinstance(r["type_name"], str)
        and type(r["has_attention_slice"]) is bool
    )


def _layout_record(lay: WeightLayout) -> dict[str, Any]:
    record = asdict(lay)
    record["tensor_allocs"] = [[first, list(parts)] for first, parts in lay.tensor_allocs]
    return record


def _valid_layout(r: dict[str, Any]) -> bool:
    allocs = r["tensor_allocs"]
    return (
        all(type(r[f]) is int and r[f] >= 0 for f in LAYOUT_BYTES)
        and isinstance(r["storage"], str)
        and isinstance(allocs, list)
        and all(
            isinstance(a, list) and len(a) == 2 and type(a[0]) is int and a[0] >= 0
            and isinstance(a[1], list) and all(type(n) is int and n >= 0 for n in a[1])
            for a in allocs
        )
    )  # fmt: skip

"""generate() settings that change the KV cache: beam search and the static cache (both engines).

- ``num_beams`` K: ``GenerationMixin.generate`` expands ``input_ids`` (and the attention mask) to
  batch x K with ``_expand_inputs_for_generation`` *before* the prefill, so the prefill, every
  decode step and the cache run at batch x K. Each step's ``cache.reorder_cache(beam_idx)``
  rebuilds one layer's keys / values at a time (``index_select``), a transient no larger than the
  DynamicCache's ``torch.cat`` of one layer that the decode peak already holds. Estimated as the
  same job at batch x K (transformers 4.5x/5.x ``generation/utils.py``).
- ``cache_implementation="static"``: ``StaticCache`` preallocates every layer's keys and values for
  ``max_cache_len = generation_config.max_length - 1`` (prompt + new tokens - 1: the last token is
  never fed back; measured on CPU with transformers 5.x, tests/estimate/test_generation.py;
  sliding-window layers keep ``min(window, max_cache_len)``) when generation starts, zero-filled,
  and updates them in place: no growth, no cat. So the full cache is live from the prefill on.
  Estimated from the engine's own DynamicCache run: in every phase the dynamic cache bytes are
  replaced by the full static cache (the cat transient of the decode peak is kept, an over-estimate
  of at most one layer's cache).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from memfit.errors import NotModelledError
from memfit.estimate.result import MemoryEstimate, PhasePeak
from memfit.spec import PRECISION_RULES, WorkloadSpec

__all__ = ["with_generation"]

#: Bytes per cached element by precision: half-precision models cache in their dtype; fp32 and
#: autocast runs keep fp32 keys (rotary in fp32) and so fp32 values (``torch.cat`` promotes).
#: Bytes per cached K/V element: the parameters' dtype (a mixed run's fp32 weights give fp32
#: projections, as the trace records them).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def with_generation(
    source: Any, workload: WorkloadSpec, run: Callable[[WorkloadSpec], MemoryEstimate]
) -> MemoryEstimate:
    """``run`` (one engine) for ``workload`` with its beams and cache implementation applied."""
    beams, static = workload.num_beams, workload.cache_implementation == "static"
    if beams == 1 and not static:
        return run(workload)
    inner = dataclasses.replace(
        workload,
        batch_size=workload.batch_size * beams,
        num_beams=1,
        cache_implementation="dynamic",
    )
    est = run(inner)
    notes: list[str] = []
    if beams > 1:
        notes.append(
            f"beam search: generate() expands the inputs to batch x num_beams = "
            f"{inner.batch_size} before the prefill; estimated at that batch"
        )
    if static:
        est, note = _static(source, inner, est)
        notes.append(note)
    return dataclasses.replace(est, workload=workload.normalized(), notes=[*est.notes, *notes])


def _static_cache_bytes(source: Any, w: WorkloadSpec) -> int:
    if source.spec is None or source.spec.is_encoder_decoder:
        raise NotModelledError(
            "StaticCache is modelled for decoder-only config.json models (an encoder-decoder's "
            "EncoderDecoderCache or a factory model is not)",
            engine="both",
        )
    spec = source.spec.text or source.spec
    n_layers, kv, hd = spec.n_layers, spec.n_kv_heads, spec.head_dim
    if not (n_layers and kv and hd):
        raise NotModelledError(
            "StaticCache: the config gives no layer count, K/V heads or head_dim", engine="both"
        )
    max_len = w.seq_len + w.new_tokens - 1  # generate(): max_length - 1
    window = spec.sliding_window
    kinds = spec.layer_types or ()
    tokens = 0
    for i in range(n_layers):
        slides = window is not None and (not kinds or "sliding" in kinds[i % len(kinds)])
        tokens += min(window, max_len) if slides and window else max_len
    return (
        2 * w.batch_size * kv * hd * DTYPE_BYTES[PRECISION_RULES[str(w.precision)].params] * tokens
    )


def _static(source: Any, w: WorkloadSpec, est: MemoryEstimate) -> tuple[MemoryEstimate, str]:
    full = _static_cache_bytes(source, w)
    phases: dict[str, PhasePeak] = {}
    for name, ph in est.phases.items():
        comps = dict(ph.components)
        comps["kv_cache"] = max(comps.get("kv_cache", 0), full)
        phases[name] = PhasePeak(
            phase=name, peak_allocated_bytes=sum(comps.values()), components=comps
        )
    peak_phase = max(phases, key=lambda n: phases[n].peak_allocated_bytes)
    peak = phases[peak_phase].peak_allocated_bytes
    delta = peak - est.peak_allocated_bytes
    fits = est.fits
    if fits is not None:
        free = fits.free_bytes - delta
        fits = dataclasses.replace(fits, free_bytes=free, fits=free >= 0)
    ranges = {k: (lo + delta, hi + delta) for k, (lo, hi) in est.ranges.items()}
    est = dataclasses.replace(
        est,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=est.peak_reserved_bytes + delta,
        device_used_bytes=est.device_used_bytes + delta,
        peak_phase=peak_phase,
        components=dict(phases[peak_phase].components),
        phases=phases,
        fits=fits,
        ranges=ranges,
    )
    note = (
        f"StaticCache: {full / 2**30:.2f} GiB of keys/values preallocated for "
        f"{w.seq_len + w.new_tokens - 1} tokens from the prefill on (peak "
        f"+{delta / 2**30:.2f} GiB over the DynamicCache run)"
    )
    return est, note

"""The range around an estimate: what the engine cannot know, calibrated on measurements.

An estimate's number is a single allocation history; the real run differs by what memfit does not
see. The range splits the estimate into parts that are uncertain in different ways:

* **static** bytes — parameters, gradients, optimizer states, KV cache. Their layouts are exact
  (tests check them to the byte); what varies is what a runtime adds beside them (vLLM keeps a RoPE
  cache: +0.2 % of Llama-3.1-8B's weights).
* **dynamic** bytes — activations and temporaries. These depend on kernel choice, library
  versions (the HF-docs tables of PyTorch 2.2-era runs allocate up to 23 % more than today's stack)
  and autograd's exact saving decisions.
* **cache** bytes — reserved minus allocated: the caching allocator's rounding and fragmentation,
  which depend on the whole allocation order (simulated, not known).
* **context** bytes — the CUDA context and module images, measured on Hopper, estimated elsewhere.

Each part gets a lower and an upper fraction (:data:`BANDS`); the analytic engine adds its
documented error against the trace engine. The fractions are fitted by
``benchmarks/calibrate_uncertainty.py`` on the published and H200 measurements so that every
measurement falls inside its estimate's range; the same script reports leave-one-out coverage,
quoted in docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memfit.estimate.result import MemoryEstimate

#: The KV cache is static too: its size (layers x KV heads x head_dim x tokens) is exact.
STATIC_COMPONENTS = ("parameters", "gradients", "optimizer_states", "kv_cache")
DYNAMIC_COMPONENTS = ("activations", "temporary")


@dataclass(frozen=True)
class Band:
    """How far the truth may lie below (``low``) and above (``high``) a part, as fractions of it."""

    low: float
    high: float


#: Fitted by benchmarks/calibrate_uncertainty.py on 103 measurement points to cover 95 % of each
#: metric's points on each side (results and the points outside: benchmarks/results/uncertainty.md).
#: The wide upper dynamic band comes from the HF-docs training tables measured on PyTorch 2.2-era
#: stacks, which allocate up to 23 % more than the stack memfit traces; the context band is measured
#: on Hopper only.
BANDS = {
    "static": Band(low=0.0, high=0.01),
    "dynamic": Band(low=0.105, high=0.40),
    "cache": Band(low=0.62, high=0.0),
    "context": Band(low=0.02, high=0.0),
}
#: The analytic engine's documented worst error against the trace engine on its calibration grid
#: (docs/accuracy.md), applied to the whole allocated estimate on both sides.
ANALYTIC_BAND = Band(low=0.03, high=0.03)


def ranges(est: MemoryEstimate) -> dict[str, tuple[int, int]]:
    """``{metric: (low, high)}`` for peak allocated, peak reserved and device used."""
    static = sum(est.components.get(c, 0) for c in STATIC_COMPONENTS)
    dynamic = sum(est.components.get(c, 0) for c in DYNAMIC_COMPONENTS)
    cache = max(est.peak_reserved_bytes - est.peak_allocated_bytes, 0)
    context = max(est.device_used_bytes - est.peak_reserved_bytes, 0)

    def spread(end: str) -> float:
        out = getattr(BANDS["static"], end) * static + getattr(BANDS["dynamic"], end) * dynamic
        if est.engine == "analytic":
            out += getattr(ANALYTIC_BAND, end) * est.peak_allocated_bytes
        return out

    alloc_low = est.peak_allocated_bytes - spread("low")
    alloc_high = est.peak_allocated_bytes + spread("high")
    res_low = est.peak_reserved_bytes - spread("low") - BANDS["cache"].low * cache
    res_high = est.peak_reserved_bytes + spread("high") + BANDS["cache"].high * cache
    res_low = max(res_low, alloc_low)
    dev_low = res_low + context - BANDS["context"].low * context
    dev_high = res_high + context + BANDS["context"].high * context
    return {
        "peak_allocated_bytes": (_floor(alloc_low), _ceil(alloc_high)),
        "peak_reserved_bytes": (_floor(res_low), _ceil(res_high)),
        "device_used_bytes": (_floor(dev_low), _ceil(dev_high)),
    }


def _floor(x: float) -> int:
    return max(int(x), 0)


def _ceil(x: float) -> int:
    return int(-(-x // 1))

"""Per-rank memory of pipeline, context and expert parallelism: closed forms (torch-free).

- :mod:`.schedule`: the layers each pipeline rank holds and the micro-batches it keeps in flight
  under GPipe, 1F1B, interleaved 1F1B, ZBV and DualPipeV.
- :mod:`.shape`: a decoder LLM's dimensions and parameter counts.
- :mod:`.memory`: one GPU's parameters, gradients, optimizer states, activations and
  temporaries (ring attention K/V buffers, MoE dispatch / combine buffers).
- :mod:`.engine`: :func:`estimate_parallel`, the peak rank as a MemoryEstimate.
- :mod:`.layouts`: every dp x tp x pp x cp layout of N GPUs and its per-rank peak.
"""

from memfit.estimate.parallel.engine import (
    ENGINE,
    engine_reason,
    estimate_parallel,
    needs_parallel,
    per_rank,
)
from memfit.estimate.parallel.layouts import LayoutPeak, enumerate_layouts

__all__ = [
    "ENGINE",
    "LayoutPeak",
    "engine_reason",
    "enumerate_layouts",
    "estimate_parallel",
    "needs_parallel",
    "per_rank",
]

"""The analytic engine: closed-form estimates from config.json, without torch.

>>> from memfit.estimate.analytic import estimate_analytic, estimate_many, supports

Each supported family is a declaration over a small block vocabulary (``blocks.py``, ``mlp.py``:
what Hugging Face's code allocates and what autograd saves, op by op, with the rules of
``ops.py``), listed by model_type in ``registry.py``; ``decoder.py`` runs a declaration, and a
family whose code departs from the blocks subclasses its program. A tiny symbolic autograd
(``graph.py``) replays one embedding block, one layer and the head, forward and backward;
``compose.py`` (the public step composer) and ``engine.py`` compose them over the layers and the
phases of a training step or a generation. Every term is a byte count of a named tensor, so the
result splits into the same components and phases as the trace engine's, against which it is
calibrated (``benchmarks/analytic_vs_trace.py``, docs/accuracy.md).
"""

from memfit.estimate.analytic.api import estimate_analytic, estimate_many, supports

__all__ = ["estimate_analytic", "estimate_many", "supports"]

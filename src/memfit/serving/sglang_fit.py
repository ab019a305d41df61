"""``fit`` of an SGLang server: the largest ``--context-length`` or the most concurrent
full-length requests that start (torch-free; :mod:`memfit.serving.sglang` simulates each).

SGLang does not refuse a context longer than its KV pool (it caps a request's input at
``max_total_num_tokens - 1``), so "fits" here means: it starts and its pool holds the requests.
"""

from __future__ import annotations

from dataclasses import replace

from memfit.errors import SpecError
from memfit.hardware.catalog import GPU
from memfit.models import ModelSpec
from memfit.monotone import largest
from memfit.serving.sglang import SglangStartup, sglang_context_length, simulate_sglang
from memfit.spec.sglang import SglangConfig

__all__ = ["SGLANG_SOLVES", "solve_sglang"]

#: What ``fit`` of an SglangConfig solves.
SGLANG_SOLVES = ("context-length", "max-running-requests")


def solve_sglang(
    spec: ModelSpec, gpu: GPU, config: SglangConfig, *, solve: str = "context-length"
) -> tuple[int, SglangStartup | None]:
    """(value, the start-up at that value, or None when nothing starts)."""
    if solve == "context-length":
        return _largest_context(spec, gpu, config)
    if solve == "max-running-requests":
        s = simulate_sglang(spec, gpu, config)
        if not s.starts:
            return 0, None
        value = s.max_total_num_tokens // s.context_length
        if config.max_running_requests is not None:
            value = min(value, config.max_running_requests)
        return value, s
    raise SpecError(
        f"solve ({solve!r}) for an SglangConfig must be one of {', '.join(SGLANG_SOLVES)}"
    )


def _largest_context(
    spec: ModelSpec, gpu: GPU, config: SglangConfig
) -> tuple[int, SglangStartup | None]:
    """Binary search on ``--context-length`` up to the derived one: it starts and the pool
    holds one request of that length."""
    upper = config.context_length or sglang_context_length(spec) or 0

    def ok(length: int) -> SglangStartup | None:
        s = simulate_sglang(spec, gpu, replace(config, context_length=length))
        return s if s.starts and s.max_total_num_tokens >= length else None

    return largest(ok, upper)

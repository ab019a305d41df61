"""Rank 0's ZeRO-3 gathers on a hand-built timeline: DeepSpeed's prefetch takes the module that
crosses ``stage3_prefetch_bucket_size`` and walks the step's own fetch order
(deepspeed v0.13.1 ``partitioned_param_coordinator.py``)."""

from __future__ import annotations

from memfit.estimate.sharding import DEEPSPEED_DEFAULTS
from memfit.estimate.trace.rank_replay import strategy
from memfit.estimate.trace.rank_trace import Param, RankTrace
from memfit.spec import WorkloadSpec

BUCKET = DEEPSPEED_DEFAULTS["stage3_prefetch_bucket_size"]
ZERO3 = WorkloadSpec(gpus=2, shard="zero3")


def _trace(numels: dict[str, int], marks: list[tuple[str, str]]) -> RankTrace:
    """Frozen bf16 parameters, one per module, born first; then ``marks`` (kind, payload)."""
    names = list(numels)
    keys = range(1, len(names) + 1)
    return RankTrace(
        events=tuple(("a", k, numels[n] * 2) for k, n in zip(keys, names, strict=True)),
        marks=tuple((len(names), kind, payload) for kind, payload in marks),
        raw=tuple(numels[n] * 2 for n in names),
        ignored=frozenset(),
        owners={k: (n, "init", "parameters") for k, n in zip(keys, names, strict=True)},
        grad_keys=frozenset(),
        params={k: Param(numels[n], 2, False, n) for k, n in zip(keys, names, strict=True)},
        ddp_sizes=(),
    )


def _r512(n: int) -> int:
    return -(-n // 512) * 512


def _forward(*names: str) -> list[tuple[str, str]]:
    return [m for n in names for m in (("fwd_in", n), ("fwd_out", n))]


def _backward(*names: str) -> list[tuple[str, str]]:
    return [m for n in names for m in (("bwd_in", n), ("bwd_out", n))]


def _gathers(trace: RankTrace, name: str, phase: str) -> int:
    """How many times rank 0 all-gathers ``name`` in ``phase``."""
    tl = strategy(ZERO3, trace).run()
    bounds = [*tl.marks, (len(tl.events), "")]
    n = 0
    for (start, ph), (end, _) in zip(bounds, bounds[1:], strict=False):
        if ph == phase:
            n += sum(
                1
                for op, key, _ in tl.events[start:end]
                if op == "a" and tl.owner[key][1] == f"{name} (gathered)"
            )
    return n


def test_the_prefetch_takes_the_module_that_crosses_the_bucket() -> None:
    big = BUCKET + 10_000_000  # larger than the whole bucket
    trace = _trace(
        {"a": 10_000_000, "b": big, "c": 10_000_000},
        [("phase", "forward"), *_forward("a", "b", "c")],
    )
    tl = strategy(ZERO3, trace).run()
    partitions = sum(_r512(n // 2 * 2) for n in (10_000_000, big, 10_000_000))
    # at a's forward: a fetched, b prefetched although it alone exceeds the bucket
    gathered = _r512(10_000_000 * 2) + _r512(big * 2)
    assert tl.peaks["forward"].components["parameters"] == partitions + gathered


def test_the_prefetch_walks_into_the_backward_fetches() -> None:
    """``a`` is released at its forward's end; ``b``'s fetch prefetches it again, because the
    step's next fetch after ``b`` is ``a``'s backward (separate forward / backward orders, as
    memfit walked before, never crossed the turn)."""
    numels = {"a": 300_000_000, "b": 300_000_000}
    marks = [
        ("phase", "forward"),
        *_forward("a", "b"),
        ("phase", "backward"),
        *_backward("b", "a"),
    ]
    assert _gathers(_trace(numels, marks), "a", "forward") == 2

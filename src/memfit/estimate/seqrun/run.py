"""``memfit estimate --seq-dist``: reserved memory after a variable-length training run.

Traces the job at a few anchor lengths (:mod:`memfit.estimate.seqrun.replay`), samples the run's
step lengths (:mod:`memfit.estimate.seqrun.dist`) and replays them through the caching-allocator
model with ``expandable_segments`` off and on, next to the fixed-shape run at the longest length.
The alternatives it also replays (padding to a multiple of 64, grouping by length, packing:
every step at the longest length, i.e. the fixed-shape run) are how the growth is usually
avoided; each says whether it changes only memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import trace_cache
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.seqrun.dist import step_lengths
from memfit.estimate.seqrun.replay import (
    MAX_ANCHORS,
    StepTemplates,
    replay_run,
    run_events,
    same_steps,
    templates_from_traces,
)
from memfit.estimate.verdict import Verdict
from memfit.spec import WorkloadSpec
from memfit.spec.seqrun import SeqDist, StepPlan

#: The multiple tried when the run pads to the longest sample only (tensor-core friendly; the
#: value transformers' examples pass as ``pad_to_multiple_of`` for fp16 / bf16 is 8, 64 gives
#: the allocator far fewer distinct sizes).
TRY_PAD_MULTIPLE = 64
#: Growth over the fixed-shape figure below which no recommendation is made.
MATTERS_RATIO = 0.05


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One replayed run. ``memory_only``: the change leaves the model's math alone."""

    name: str
    reserved_bytes: int
    reserved_expandable_bytes: int
    memory_only: bool
    how: str
    n_ooms: int = 0
    n_ooms_expandable: int = 0
    #: torch's default settings replayed without a capacity: what the run reserves where
    #: nothing stops its cache from growing (``reserved_bytes`` where the capacity was never
    #: reached)
    reserved_unbounded_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class SeqRunEstimate:
    """The run as asked (``run``), the fixed-shape run at ``max_len`` (``fixed``), the
    alternatives replayed and the recommendations drawn from them."""

    n_steps: int
    seed: int
    max_len: int
    mean_step_len: float
    n_distinct_lengths: int
    anchors: tuple[int, ...]
    floor_len: int
    fixed: Variant
    run: Variant
    alternatives: tuple[Variant, ...]
    recommendations: tuple[str, ...]
    unmatched_frees: int
    #: the run's allocated peak (the replay as asked, torch's default allocator settings)
    peak_allocated_bytes: int = 0
    #: what the device holds outside the caching allocator (CUDA context), set by the caller
    #: that knows it (the fixed-shape estimate's device bytes minus its reserved bytes)
    overhead_bytes: int = 0
    #: THE verdict of the device bytes after the run on a budget (fit / plan --seq-dist)
    fits: Verdict | None = None

    @property
    def growth(self) -> float:
        """Reserved after the run over the fixed-shape reserved, minus one."""
        return self.run.reserved_bytes / max(self.fixed.reserved_bytes, 1) - 1

    # -- the Answer protocol (memfit.estimate.answer) -------------------------------------------
    @property
    def peak_reserved_bytes(self) -> int:
        """Reserved after the run as asked (the caching allocator only grows)."""
        return self.run.reserved_bytes

    @property
    def device_used_bytes(self) -> int:
        return self.overhead_bytes + self.run.reserved_bytes

    @property
    def need_bytes(self) -> int:
        """The device bytes the run needs, as THE verdict rule judges them: after the run (the
        replay capped at the GPU, whose cache flushes may keep it below the capacity); where the
        capped replay still ran out of memory, what the run reserves without a cap (above the
        capacity by construction: the replay is capped only where that peak exceeds it)."""
        if self.run.n_ooms:
            return self.overhead_bytes + max(self.run.reserved_unbounded_bytes,
                                             self.run.reserved_bytes)  # fmt: skip
        return self.device_used_bytes

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """No measured error range of its own (the fixed-shape estimate carries one)."""
        return {}

    @property
    def peak_components(self) -> dict[str, int]:
        """No components: the replay follows allocations, not what they hold (the fixed-shape
        estimate at the longest length has them)."""
        return {}

    @property
    def notes(self) -> tuple[str, ...]:
        return self.recommendations

    @property
    def engine(self) -> str:
        return "trace"

    @property
    def engine_reason(self) -> str:
        return "variable-length runs: traced at anchor lengths, replayed through the allocator"

    @property
    def verdict(self) -> Verdict | None:
        return self.fits

    def to_json(self) -> dict[str, Any]:
        return {
            "n_steps": self.n_steps,
            "seed": self.seed,
            "max_len": self.max_len,
            "mean_step_len": round(self.mean_step_len, 1),
            "n_distinct_lengths": self.n_distinct_lengths,
            "anchors": list(self.anchors),
            "floor_len": self.floor_len,
            "fixed": self.fixed.to_json(),
            "run": self.run.to_json(),
            "growth": round(self.growth, 4),
            "alternatives": [v.to_json() for v in self.alternatives],
            "recommendations": list(self.recommendations),
            "unmatched_frees": self.unmatched_frees,
        }


def estimate_seq_run(
    source: Any,
    workload: WorkloadSpec,
    dist: SeqDist,
    plan: StepPlan,
    *,
    gpu: Any = None,
    capacity_bytes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> SeqRunEstimate:
    """Replay the run ``plan`` samples from ``dist`` for ``source`` (a ``ModelSource``);
    ``capacity_bytes``: what the allocator may reserve (None: unlimited, reserved only grows);
    ``progress`` is called with a line before each slow stage.

    Kept in the trace cache (:func:`memfit.estimate.trace_cache.cached_answer`, its one key rule:
    the config, the job, the distribution, the step plan, the GPU and the capacity with the
    installed versions and memfit's source): a repeated run is a cache read, without a trace."""
    _check_job(source, workload)

    def run() -> SeqRunEstimate:
        return _estimate_seq_run(source, workload, dist, plan, gpu, capacity_bytes, progress)

    if not trace_cache.cacheable(source):
        return run()
    parts = {
        "seq_run": {"config": source.config, "workload": repr(workload), "dist": repr(dist),
                    "plan": repr(plan), "gpu": repr(gpu), "capacity_bytes": capacity_bytes},
    }  # fmt: skip
    est, _ = trace_cache.cached_answer(
        parts,
        run,
        encode=lambda e: trace_cache.encode_record(e, _KEPT),
        decode=_decode,
    )
    return est  # type: ignore[no-any-return]


#: The records a kept run holds (:func:`estimate_seq_run`).
_KEPT: dict[str, type] = {"SeqRunEstimate": SeqRunEstimate, "Variant": Variant}


def _decode(data: Any) -> SeqRunEstimate | None:
    """A kept run, None where it is not a plausible one (counts whole and non-negative)."""
    est = trace_cache.decode_record(data, SeqRunEstimate, _KEPT)
    if not isinstance(est, SeqRunEstimate) or est.fits is not None:
        return None
    variants = (est.fixed, est.run, *est.alternatives)
    if not all(isinstance(v, Variant) for v in variants):
        return None
    counts = [est.n_steps, est.max_len, est.floor_len, est.unmatched_frees,
              est.peak_allocated_bytes, est.overhead_bytes, *est.anchors]  # fmt: skip
    for v in variants:
        counts += [v.reserved_bytes, v.reserved_expandable_bytes, v.n_ooms, v.n_ooms_expandable,
                   v.reserved_unbounded_bytes]  # fmt: skip
    ok = all(type(c) is int and c >= 0 for c in counts)
    return est if ok and isinstance(est.recommendations, tuple) else None


def _check_job(source: Any, workload: WorkloadSpec) -> None:
    if not workload.is_train:
        raise SpecError("--seq-dist models training runs: use it with --mode train")
    if getattr(source, "origin", "") == "factory" or not getattr(source, "config", None):
        raise NotModelledError(
            "--seq-dist needs a config.json model (the trace engine)", engine="trace"
        )


def _estimate_seq_run(
    source: Any,
    workload: WorkloadSpec,
    dist: SeqDist,
    plan: StepPlan,
    gpu: Any,
    capacity_bytes: int | None,
    progress: Callable[[str], None] | None,
) -> SeqRunEstimate:
    say = progress or (lambda _line: None)
    runs = {"run": step_lengths(dist, plan)}
    if not plan.packing:
        if not plan.pad_to_multiple_of:
            runs["pad"] = step_lengths(
                dist, dataclasses.replace(plan, pad_to_multiple_of=TRY_PAD_MULTIPLE)
            )
        if not plan.group_by_length:
            runs["group"] = step_lengths(dist, dataclasses.replace(plan, group_by_length=True))
    k = plan.pad_to_multiple_of or 1
    top = -(-dist.max_len // k) * k
    # One repeated shape reaches its reserved peak by the third step (the steady step repeats
    # the second one exactly), so the fixed-shape run is replayed for three steps.
    runs["fixed"] = [top] * min(plan.n_steps, 3)
    say("tracing the step at a few lengths")
    templates, floor = _templates(
        source, workload, gpu, sorted({n for r in runs.values() for n in r})
    )
    say(f"replaying {plan.n_steps} steps through the caching-allocator model")
    runs = {name: [max(n, floor) for n in r] for name, r in runs.items()}
    lengths = runs["run"]
    run, allocated = _variant(templates, "run", runs.pop("run"), capacity_bytes)
    fixed, _ = _variant(templates, "fixed", runs.pop("fixed"), capacity_bytes)
    matters = run.reserved_bytes > fixed.reserved_bytes * (1 + MATTERS_RATIO)
    alternatives = (
        tuple(_variant(templates, n, r, capacity_bytes)[0] for n, r in runs.items())
        if matters
        else ()
    )
    if matters and not plan.packing:  # every step at MAX: the fixed-shape run itself
        how, memory_only = _HOW["packing"]
        alternatives += (
            dataclasses.replace(fixed, name="packing", how=how, memory_only=memory_only),
        )
    return SeqRunEstimate(
        n_steps=plan.n_steps,
        seed=plan.seed,
        max_len=top,
        mean_step_len=sum(lengths) / len(lengths),
        n_distinct_lengths=len(set(lengths)),
        anchors=templates.anchors,
        floor_len=floor,
        fixed=fixed,
        run=run,
        alternatives=alternatives,
        recommendations=tuple(_recommend(fixed, run, alternatives)),
        unmatched_frees=replay_run(templates, lengths[:4]).unmatched_frees,
        peak_allocated_bytes=allocated,
    )


def _anchors(lengths: list[int]) -> list[int]:
    if len(lengths) <= MAX_ANCHORS:
        return lengths
    n = len(lengths) - 1
    return sorted({lengths[round(i * n / (MAX_ANCHORS - 1))] for i in range(MAX_ANCHORS)})


#: Traces spent at most looking for the shortest length that runs the longest one's allocations.
MAX_BISECT_TRACES = 8


def _templates(
    source: Any, workload: WorkloadSpec, gpu: Any, lengths: list[int]
) -> tuple[StepTemplates, int]:
    """Templates at anchor lengths, and the floor: the shortest length whose step runs the same
    allocations as the longest (very short steps, e.g. one token, take other kernel paths).
    Steps below the floor are replayed at the floor (larger tensors: the safe direction)."""
    from memfit.estimate.trace.engine import trace_step_events

    def trace(n: int) -> Any:
        wl = dataclasses.replace(workload, seq_len=n)
        return trace_step_events(
            source.config, wl, gpu=gpu, trust_remote_code=source.trust_remote_code
        )

    traces = {n: trace(n) for n in _anchors(lengths)}
    top = traces[max(traces)]
    bad = [n for n in traces if not same_steps(traces[n], top)]
    floor = 1
    if bad:
        low = max(bad)
        high = min(n for n in traces if n > low and same_steps(traces[n], top))
        if any(n > high for n in bad):
            raise NotModelledError(
                f"the traced step at {max(bad)} tokens runs different allocations than at "
                f"{max(traces)}; --seq-dist cannot interpolate between them",
                engine="trace",
            )
        step = 1  # gallop up from the failing length (usually 1 token), then bisect
        for _ in range(MAX_BISECT_TRACES):
            if high - low <= 1:
                break
            mid = min(low + step, (low + high) // 2) if step else (low + high) // 2
            probe = trace(mid)
            if same_steps(probe, top):
                high, traces[mid], step = mid, probe, 0
            else:
                low, step = mid, step * 2
        floor = high
        traces = {n: t for n, t in traces.items() if n >= floor}
    workspaces = allocator_workspaces(gpu, training=True)
    return templates_from_traces(traces, workspaces), floor


_HOW = {
    "run": ("as asked", True),
    "fixed": ("every step at the longest length (the fixed-shape estimate)", True),
    "pad": (
        f"pad_to_multiple_of={TRY_PAD_MULTIPLE} in the data collator (padded tokens are masked)",
        True,
    ),
    "packing": (
        "packing=True (TRL SFTConfig: samples concatenated into MAX-token rows; every step "
        "is the fixed shape; changes the batches, and attention crosses samples unless the "
        "collator passes position_ids per sample)",
        False,
    ),
    "group": (
        "group_by_length=True (Trainer's LengthGroupedSampler: longest batch first; "
        "changes the order and the mix of samples in a batch)",
        False,
    ),
}


def _variant(
    templates: StepTemplates, name: str, lengths: list[int], capacity_bytes: int | None
) -> tuple[Variant, int]:
    """The replayed run and its allocated peak (default allocator settings)."""
    how, memory_only = _HOW[name]
    events = run_events(templates, lengths)  # laid out once for both settings
    default = replay_run(templates, lengths, capacity_bytes=capacity_bytes, events=events)
    expandable = replay_run(
        templates, lengths, expandable_segments=True, capacity_bytes=capacity_bytes,
        events=events,
    )  # fmt: skip
    variant = Variant(
        name=name,
        reserved_bytes=default.peak_reserved_bytes,
        reserved_expandable_bytes=expandable.peak_reserved_bytes,
        memory_only=memory_only,
        how=how,
        n_ooms=default.n_ooms,
        n_ooms_expandable=expandable.n_ooms,
        reserved_unbounded_bytes=int(default.unbounded_peak_reserved_bytes or 0),
    )
    return variant, default.peak_allocated_bytes


def _recommend(fixed: Variant, run: Variant, alternatives: tuple[Variant, ...]) -> list[str]:
    base = run.reserved_bytes
    if base <= fixed.reserved_bytes * (1 + MATTERS_RATIO):
        return []
    out = []
    if run.reserved_expandable_bytes < base * (1 - MATTERS_RATIO):
        out.append(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: reserved "
            f"{run.reserved_expandable_bytes / 2**30:.2f} GiB instead of {base / 2**30:.2f} GiB "
            "(memory-only change: same math, same results)"
        )
    for v in alternatives:
        if v.reserved_bytes < base * (1 - MATTERS_RATIO):
            label = "memory-only change" if v.memory_only else "not memory-only"
            out.append(f"{v.how}: reserved {v.reserved_bytes / 2**30:.2f} GiB ({label})")
    return out

"""The derived engine: the trace engine's answer at any batch size from three traces (torch-free
once a form is built).

A job's allocations are traced at batch sizes 1, 2 and 3; each allocation's size is solved as
``a0 + a1 * batch_size`` (exact, checked on the third trace) and the recorded events are kept
with their order (:mod:`memfit.estimate.derived.record`). An estimate at any batch size replays
them through the tracker's counting and the caching-allocator model
(:mod:`memfit.estimate.derived.form`): milliseconds to a fraction of a second, without torch, and
the same bytes the trace engine gives (tests compare them). Forms are cached on disk per config,
job variant and library versions (:mod:`memfit.estimate.derived.cache`). A deep stack of
identical layers is not traced at full depth: traces of 2-5 layers are grown event by event to the
model's depth and checked on a trace they were not learned from
(:mod:`memfit.estimate.derived.grown`); where that check fails, full traces as above.

What it models: a Hugging Face config.json model on one GPU or as rank 0 of a multi-GPU job —
DDP, DeepSpeed ZeRO-1/2/3, optimizer and parameter offload, FSDP2 and tensor parallelism. For
those the trace engine's answer is computed from rank 0's rewritten timeline
(:mod:`memfit.estimate.trace.rank_replay`; FSDP2 traced for real, ``tp`` a divided config), and
that timeline is what the form records: the partitions, buckets and ZeRO-3 gathers (with their
prefetch) as births of their own, the host peak (``host_memory_bytes``) among the run's
constants, the modules of a peak in the timeline's order. Every size the rewrite sets must not
depend on the batch size (checked). Such a form is grown from a few layers where the growth's
checks pass, else it comes from full traces. On an 8-layer Llama (tests/estimate/derived/
test_rank_grown.py) ZeRO-2 + optimizer offload, ZeRO-3 + optimizer or parameter offload
(checkpointing none: the peak's module order, by first layer-indexed birth, is grown as a second
link per birth and checked on the check trace) and tensor parallelism (whose second links
follow no rule: ordering by module, checked on every traced run) grow; DDP (its buckets),
ZeRO-1/2/3 without offload (partitions of the whole model on the device) and FSDP2 come from
full traces. Not modelled: paged optimizer states, a chunked prefill, factory models and
remote code — a NotModelledError naming the reason, and the engine policy
(:mod:`memfit.estimate.policy`) asks the trace engine.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

from memfit.errors import MemfitError, NotModelledError, TraceError
from memfit.estimate import cuda_reduce
from memfit.estimate.derived import cache
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.fsdp1 import fsdp2_twin
from memfit.estimate.pipeline import assemble, check_gpu, prepare_workload, with_notes
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace.flat import Flat, engine_result, extrapolated
from memfit.spec import WorkloadSpec

Progress = Callable[[str], None]

#: Forms loaded in this process, by key (a search evaluates one form many times).
_FORMS: dict[str, dict[str, Any]] = {}
#: Per form (by identity) and GPU workspaces: batch size -> (peak live bytes, reserved bytes) of
#: every exact replay in this process; a guide's reserved bytes scale the nearest one's ratio.
_EXACT: dict[tuple[int, tuple[int, ...], Any], dict[int, tuple[int, int]]] = {}


def refusal(source: Any, workload: WorkloadSpec) -> str | None:
    """Why the derived engine cannot model ``workload`` on ``source`` at all, or None."""
    if source.origin == "factory" or source.config is None:
        return "a factory model (pkg.mod:fn) has no config.json to derive a form from"
    if source.trust_remote_code:
        return "a model with remote code (its code is not part of the form's cache key)"
    # multi-GPU, ZeRO, offload and tp jobs are modelled: rank 0's rewritten timeline is recorded
    # (tests/estimate/derived/test_rank*.py compare every variant with the trace engine)
    if "paged" in str(workload.optimizer):
        return "paged optimizer states"
    if workload.optimizer_in_bwd:
        return "the optimizer step in backward (optimizer_in_bwd)"
    if workload.prefill_chunk_size is not None:
        return "a chunked prefill (prefill_chunk_size)"
    if workload.loss != "full":
        return f"the {workload.loss} cross-entropy (--loss {workload.loss})"
    if workload.checkpointing == "offload":
        return "checkpoints kept in host RAM (--checkpointing offload)"
    if workload.checkpointing == "selective-layer":
        # a form grows from a few identical layers; here every N-th one differs
        return "per-layer checkpointing (--checkpointing selective-layer): its layers differ"
    return None


def is_cached(source: Any, workload: WorkloadSpec) -> bool:
    """Whether a form (not a refusal) for this job's variant is in memory or on disk."""
    workload = fsdp2_twin(workload)  # an FSDP1 job is answered from its FSDP2 form (run_engine)
    if refusal(source, workload) is not None:
        return False
    key = cache.variant_key(source.config, workload)
    data = _FORMS.get(key) or cache.load(key)
    return data is not None and "refused" not in data


def estimate_derived(
    source: Any, workload: WorkloadSpec, *, gpu: Any = None, progress: Progress | None = None
) -> MemoryEstimate:
    """``source`` running ``workload`` on ``gpu``, from the job's derived form (built with three
    traces the first time, then cached). NotModelledError where no form models the job."""
    started = time.perf_counter()
    problems: list[str] = []  # corrupt cache entries met (cache.CORRUPT_NOTE), said in the notes
    form, built = _form(source, workload, progress, problems)
    try:
        est = _evaluate(form, source, workload, gpu, started=started, built=built)
    except _SHAPE_ERRORS as exc:
        if built or isinstance(exc, MemfitError):
            raise
        # a form from disk that passed its hash but that the evaluator cannot read: a corrupt
        # entry like any other, rebuilt (and its file replaced)
        key = cache.variant_key(source.config, workload)
        _FORMS.pop(key, None)
        cache.note_corrupt(problems, f"derived/{key}.json", "a form of the wrong shape")
        form, built = _form(source, workload, progress, problems, fresh=True)
        est = _evaluate(form, source, workload, gpu, started=started, built=built)
    return with_notes(est, problems)


#: What reading a form of the wrong shape raises (a MemfitError among them is the job's own).
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def estimate_first(
    source: Any,
    workload: WorkloadSpec,
    *,
    gpu: Any = None,
    settles: Callable[[MemoryEstimate], bool],
    progress: Progress | None = None,
) -> MemoryEstimate | None:
    """A search's first estimate (batch size 1) from batch 1's own traces, where no form of the
    job is kept and that estimate ``settles`` the search alone (a fit: batch 1 does not fit),
    without building the whole form (:mod:`memfit.estimate.derived.first`): the bytes the
    form's estimate at batch 1 gives. Kept on disk beside the forms (a batch-1 form, never used
    at another batch size). None where it does not settle or does not apply; the traces run
    are then the form's first ones (the caller builds the form with :func:`estimate_derived`)."""
    started = time.perf_counter()
    if workload.batch_size != 1 or workload.fsdp_version != 2:
        return None  # FSDP1 adds its terms to the FSDP2 answer (policy.run_engine)
    if refusal(source, workload) is not None:
        return None
    key = cache.variant_key(source.config, workload)
    if key in _FORMS or cache.load(key) is not None:
        return None  # a form (or its refusal) is kept: the search reads it as before
    w, prepared_notes = prepare_workload(source.config, workload)
    check_gpu(w, gpu)
    one_key = f"{key}-batch1"
    problems: list[str] = []
    form = _FORMS.get(one_key) or cache.load(one_key, problems=problems)
    built = form is None
    if form is None:
        from memfit.estimate.derived import first  # the trace engine's imports: torch

        def assemble_hint(result: Any) -> MemoryEstimate:
            return with_notes(assemble(result, w, gpu), prepared_notes)

        form = first.batch_one_form(
            source, workload, gpu=gpu, settles=settles, assemble=assemble_hint, progress=progress
        )
        if form is None:
            return None
        form["build_s"] = round(time.perf_counter() - started, 3)
    est = _evaluate(form, source, workload, gpu, started=started, built=built)
    if not settles(est):
        return None
    if built:
        cache.store(one_key, form)
    _FORMS[one_key] = form
    return with_notes(est, problems)


def guide_derived(source: Any, workload: WorkloadSpec, *, gpu: Any = None) -> MemoryEstimate:
    """A search's cheap probe, not an answer: the form's live-bytes peaks and breakdown at the
    workload's batch size (exact, the same arrays as :func:`estimate_derived`), with the reserved
    bytes not replayed but interpolated in the live peak between batch sizes of this form that
    were replayed exactly in this process (:func:`_guide_reserved`). Milliseconds where the
    allocator replay takes a tenth of a second; a search that probes with it replays its answer
    and the answer's neighbour exactly (:func:`memfit.plan.solve.largest_guided`).
    NotModelledError where the job's form is not loaded in this process (a guide never builds
    or reads one) or no batch size of it was replayed exactly on this GPU yet."""
    started = time.perf_counter()
    if refusal(source, workload) is not None or workload.fsdp_version != 2:
        raise NotModelledError("no guide: the derived engine does not model it", engine="derived")
    form = _FORMS.get(cache.variant_key(source.config, workload))
    if form is None or "refused" in form:  # a guide never builds a form
        raise NotModelledError("no guide: no form of this job is loaded", engine="derived")
    w, prepared_notes = prepare_workload(source.config, workload)
    check_gpu(w, gpu)
    workspaces = allocator_workspaces(gpu, training=w.is_train)
    device = cuda_reduce.device_for(gpu)
    seen = _EXACT.get((id(form), workspaces, device))
    if not seen:
        raise NotModelledError(
            "no guide yet: no batch size of this form was replayed exactly on this GPU",
            engine="derived",
        )
    flat = _flat(form, w.batch_size, workspaces, device, reserved=False)
    flat["reserved"], how = _guide_reserved(seen, w.batch_size, _peak_live(flat))
    guide = {"reserved": f"{how} (not replayed)"}
    return _result(form, source, w, gpu, flat, prepared_notes, started, False, guide=guide)


def estimate_many_derived(
    source: Any,
    workloads: Sequence[WorkloadSpec],
    *,
    gpu: Any = None,
    progress: Progress | None = None,
) -> list[MemoryEstimate]:
    """:func:`estimate_derived` for each workload (those of one variant share one form)."""
    return [estimate_derived(source, w, gpu=gpu, progress=progress) for w in workloads]


def _form(
    source: Any,
    workload: WorkloadSpec,
    progress: Progress | None,
    problems: list[str] | None = None,
    *,
    fresh: bool = False,
) -> tuple[dict[str, Any], bool]:
    """The job's form and whether it was built now; ``problems`` collects the notes of corrupt
    cache entries met; ``fresh``: build it, whatever is kept."""
    why = refusal(source, workload)
    if why is not None:
        raise NotModelledError(f"the derived engine does not model {why}", engine="derived")
    key = cache.variant_key(source.config, workload)
    data = None if fresh else (_FORMS.get(key) or cache.load(key, problems=problems))
    built = False
    if data is None:
        data = _build(source, workload, progress)
        cache.store(key, data)
        built = True
    _FORMS[key] = data
    if "refused" in data:
        raise NotModelledError(str(data["refused"]), engine="derived")
    return data, built


def _build(source: Any, workload: WorkloadSpec, progress: Progress | None) -> dict[str, Any]:
    for pkg in ("torch", "transformers"):
        if importlib.util.find_spec(pkg) is None:
            raise NotModelledError(
                f"the derived engine builds a form with the trace engine, but {pkg} is not "
                "installed: pip install 'memfit[trace]'",
                engine="derived",
            )
    from memfit.estimate.derived.record import record

    started = time.perf_counter()
    try:
        form, traced = record(source.config, workload, name=source.name, progress=progress)
    except NotModelledError as exc:
        if exc.engine != "derived":
            raise
        return {"refused": str(exc)}
    except TraceError as exc:
        return {"refused": f"no derived form for this job: the trace failed ({exc})"}
    form["build_s"] = round(time.perf_counter() - started, 3)
    for b, est in traced.items():
        mine = _evaluate(form, source, dataclasses.replace(workload, batch_size=b), None)
        got = (mine.peak_allocated_bytes, mine.peak_reserved_bytes)
        want = (est.peak_allocated_bytes, est.peak_reserved_bytes)
        if got != want:
            return {
                "refused": f"no derived form for this job: its replay at batch {b} gives "
                f"{got} (allocated, reserved) bytes, the trace {want}"
            }
    return form


def _evaluate(
    form: dict[str, Any],
    source: Any,
    workload: WorkloadSpec,
    gpu: Any,
    *,
    started: float | None = None,
    built: bool = False,
) -> MemoryEstimate:
    started = time.perf_counter() if started is None else started
    w, prepared_notes = prepare_workload(source.config, workload)
    check_gpu(w, gpu)
    workspaces = allocator_workspaces(gpu, training=w.is_train)
    flat = _flat(form, w.batch_size, workspaces, cuda_reduce.device_for(gpu))
    return _result(form, source, w, gpu, flat, prepared_notes, started, built)


#: A rank-0 timeline (multi-GPU / ZeRO / offload / tp) keeps the rewrite's sizes as traced, CUDA
#: reduction staging included (docs/accuracy.md §24): said with every such estimate.
_RANK_STAGING_NOTE = (
    "derived form of rank 0's timeline: CUDA reduction staging blocks are replayed as traced "
    "(batch sizes {points}, memfit's default device); where a bias or norm-weight gradient "
    "stages more at this batch size or on this GPU, up to one staging block is not counted "
    "(--engine trace counts it)"
)


def _result(
    form: dict[str, Any],
    source: Any,
    w: WorkloadSpec,
    gpu: Any,
    flat: Flat,
    prepared_notes: list[str],
    started: float,
    built: bool,
    *,
    guide: dict[str, str] | None = None,
) -> MemoryEstimate:
    derived: dict[str, Any] = {
        "built_now": built,
        "build_s": form.get("build_s"),
        "batch_points": form["points"],
        "exact_at": sorted(int(b) for b in form.get("exact", {})),
    }
    if guide is not None:
        derived["guide"] = guide
    if form.get("growth", {}).get("batch_one_only"):
        derived["batch_one_only"] = True  # estimate_first's form: batch 1's traces alone
    trace = {
        **form["trace"],
        "wall_s": round(time.perf_counter() - started, 4),
        "derived": derived,
    }
    notes = list(form["notes"])
    if any("fixed" in run for run in form["runs"]):
        notes.append(_RANK_STAGING_NOTE.format(points=tuple(form["points"])))
    result = engine_result(
        flat,
        name=source.name,
        trace=trace,
        notes=notes,
        environment=dict(form["environment"]),
        engine="derived",
    )
    return with_notes(assemble(result, w, gpu), prepared_notes)


def _flat(
    form: dict[str, Any],
    x: int,
    workspaces: tuple[int, ...],
    device: cuda_reduce.ReduceDevice | None,
    *,
    reserved: bool = True,
) -> Flat:
    """The form's flat numbers at batch size ``x``, its CUDA reduction staging sized for
    ``device`` (``cuda_reduce.device_for`` of the estimate's GPU, as the trace engine sizes it);
    without ``reserved``, no allocator replay (no ``reserved`` key). A batch size the trace
    could not run (``fails``): its TraceError."""
    failed = form.get("fails", {}).get(str(x))
    if failed is not None:
        raise TraceError(failed)
    chosen = form.get("exact", {}).get(str(x), form["runs"])
    runs = {_counts_key(r["counts"]): r for r in chosen}

    # numpy's evaluator: imported where a form is replayed, so that reading the caches (the
    # trace's answers, memfit.estimate.trace_cache) and the analytic engine import no numpy
    from memfit.estimate.derived.compiled import compile_run
    from memfit.estimate.derived.staging import staging_sizes

    def replay(run: dict[str, Any]) -> Flat:
        extra = staging_sizes(run, x, device)
        return compile_run(run).flat(x, workspaces, reserved=reserved, extra=extra)

    if len(runs) == 1:
        flat = replay(next(iter(runs.values())))
    else:
        period, prefix = _extrapolation_steps([r["counts"] for r in chosen])
        targets = dict(form["trace"]["layers"])

        def run(counts: dict[str, int]) -> Flat:
            return replay(runs[_counts_key(counts)])

        flat, _check = extrapolated(run, targets, period, prefix)
    if reserved:
        seen = _EXACT.setdefault((id(form), workspaces, device), {})
        seen[x] = (_peak_live(flat), int(flat["reserved"]))
    return flat


def _extrapolation_steps(counts: list[dict[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """The trace engine's period and prefix per stack from the layer counts it ran: the base
    (``prefix + 2 * period``) first, then runs that each add to one stack (a period, or two for
    the check); DeepSeek's dense prefix makes the base 5 layers with a period of 1."""
    base = counts[0]
    period: dict[str, int] = {}
    prefix: dict[str, int] = {}
    for k, v in base.items():
        steps = [
            c[k] - v
            for c in counts[1:]
            if c[k] > v and all(c[j] == base[j] for j in base if j != k)
        ]
        period[k] = min(steps) if steps else max(1, v // 2)
        prefix[k] = max(0, v - 2 * period[k])
    return period, prefix


def _guide_reserved(seen: dict[int, tuple[int, int]], x: int, peak: int) -> tuple[int, str]:
    """Reserved bytes at batch size ``x`` (live peak ``peak``) from the exact replays ``seen``
    (batch -> (peak, reserved)): on the line through the two nearest (the nearest below and
    above where both exist), as a function of the live peak; from one, its reserved / peak."""
    below = [b for b in seen if b <= x]
    above = [b for b in seen if b > x]
    if below and above:
        pair = [max(below), min(above)]
    else:
        pair = sorted(seen, key=lambda b: (abs(b - x), -b))[:2]
    if len(pair) == 2 and seen[pair[0]][0] != seen[pair[1]][0]:
        (p0, r0), (p1, r1) = seen[pair[0]], seen[pair[1]]
        got = r0 + (r1 - r0) * (peak - p0) / (p1 - p0)
        return max(int(got), peak), f"on the line through the exact replays at batch {pair}"
    p0, r0 = seen[pair[0]]
    return -(-peak * r0 // max(p0, 1)), f"scaled from the exact replay at batch {pair[0]}"


def _peak_live(flat: Flat) -> int:
    """The highest phase's live bytes in ``flat``."""
    peaks = (v for k, v in flat.items() if k.endswith("/peak") and k.count("/") == 2)
    return int(max((v for v in peaks), default=0))


def _counts_key(counts: dict[str, int]) -> str:
    return ",".join(f"{k}={counts[k]}" for k in sorted(counts))


__all__ = [
    "estimate_derived",
    "estimate_first",
    "estimate_many_derived",
    "guide_derived",
    "is_cached",
    "refusal",
]

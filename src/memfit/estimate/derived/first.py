"""A search's first answer at batch 1 from batch 1's traces alone, where it settles the search.

A cold ``fit --solve batch`` whose batch 1 does not fit asks one question, but building the
job's form first traces it eight times (a form grown from a few layers whose batch 1 runs other
kernels than batch 2: :mod:`memfit.estimate.derived.grown`). Batch 1's exact answer needs four
of them: batch 1 traced at 2, 3 and 4 layer units is grown to the model's depth by the rule the
three give (:func:`memfit.estimate.derived.grown.batch_one_run`, the run the whole form would
keep for batch 1, built by the same code from the same traces) and checked, event by event, on
batch 1's trace of 5 units, which it was not learned from. The grown form checks batch 1 no
more strictly than that: where its batch 1 follows batch 2's kernels, its run at batch 1 is the
same events grown by the same rule from the same three traces (tests compare the two estimates
field by field).

Which traces run first is a schedule, never an answer: the 2- and 3-unit traces at batch 1 are
the base and the step of the trace engine's own layer extrapolation
(:func:`memfit.estimate.trace.flat.affine`), and their line at the model's depth (the
extrapolated estimate, no check) says whether batch 1 probably settles the search. If so, the
4- and 5-unit traces follow and the answer is the grown run's, once its check passes and its
exact estimate settles the search too; if not, the 4-unit trace and batch 2's 3-unit trace,
which the whole form needs first. Every trace run here is left to the form's build
(:data:`memfit.estimate.derived.grown.KEPT`), so a search that needs the form traces nothing
twice. Where anything does not apply (no growth, rank 0's rewritten timeline, a trace that
fails, a check that differs), None: the caller builds the form as before, and the traces'
errors are raised there, by the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from memfit.errors import MemfitError, NotModelledError
from memfit.estimate.derived import cache, grown, workers
from memfit.estimate.derived.events import to_sequence
from memfit.estimate.derived.record import Recorder
from memfit.estimate.derived.staging import staged_payload
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace import build
from memfit.estimate.trace.flat import affine, engine_result
from memfit.spec import WorkloadSpec

#: Layer units of the first pair (the trace engine's extrapolation base and step), of the
#: batch-1 check, and of batch 2's first trace in a whole form.
FIRST_PAIR = (2, 3)
CHECK_UNITS = 5
#: Evaluates an estimate: whether it settles the search on its own (a fit: it does not fit).
Settles = Callable[[MemoryEstimate], bool]


class FlatRecorder(Recorder):
    """A form's :class:`~memfit.estimate.derived.record.Recorder`, also keeping each run's flat
    numbers (the trace engine's, before its estimate): the extrapolation that schedules."""

    def __init__(self) -> None:
        super().__init__()
        self.flats: list[dict[str, float]] = []

    def on_run(self, counts: dict[str, int], tracker: Any, flat: dict[str, float]) -> None:
        super().on_run(counts, tracker, flat)
        self.flats.append(dict(flat))


def batch_one_form(
    source: Any,
    workload: WorkloadSpec,
    *,
    gpu: Any,
    settles: Settles,
    assemble: Callable[[Any], MemoryEstimate],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """The form of ``workload`` (batch size 1) holding batch 1's run alone, checked (see the
    module docstring), where the trace engine's extrapolation from the first pair of traces
    ``settles``; None otherwise (its traces kept for the whole form's build). ``assemble``:
    the estimate of an engine result (the workload's and GPU's, as an estimate's)."""
    config = source.config or {}
    found = grown.applies(config, workload)
    if found is None or workload.batch_size != 1:
        return None
    var, units = found
    key = cache.variant_key(config, workload)
    parent = os.getpid()

    def trace(mb: tuple[int, int]) -> Any:
        shown = progress if os.getpid() == parent else None
        return grown.trace_units(
            config, workload, var, *mb, name=source.name, recorder=FlatRecorder, progress=shown
        )

    def attempt(mb: tuple[int, int]) -> Any:
        try:
            return trace(mb)
        except MemfitError:
            return None

    recs: dict[tuple[int, int], Any] = {}
    with workers.Pool(attempt) as pool:
        if pool.enabled:
            build.preload(config, workload)

        def run(keys: list[tuple[int, int]]) -> bool:
            """Trace ``keys`` (two at a time where a worker runs); False where one fails."""
            todo = [(mb, grown.layers_at(var, mb[0]) + 1.0) for mb in keys if mb not in recs]
            got = pool.run(todo) if pool.enabled and len(todo) > 1 else {}
            for mb, _cost in todo:
                rec = got.get(mb) or attempt(mb)
                if rec is None:
                    return False
                recs[mb] = grown.KEPT.setdefault(key, {})[mb] = rec
            return True

        if not run([(m, 1) for m in FIRST_PAIR]):
            return None
        if "order" in recs[FIRST_PAIR[0], 1].runs[0] or not settles(_line(recs, var, assemble)):
            run([(grown.UNITS[-1], 1), (grown.SOLVED_UNITS, 2)])  # what the form needs next
            return None
        if not run([(grown.UNITS[-1], 1), (CHECK_UNITS, 1)]):
            return None
    return _form(recs, var, units)


def _line(recs: dict[tuple[int, int], Any], var: build.LayerVar, assemble: Any) -> MemoryEstimate:
    """The trace engine's extrapolation of the first pair to the model's depth (no check)."""
    lo, hi = (recs[m, 1] for m in FIRST_PAIR)
    at_lo, at_hi = lo.flats[0], hi.flats[0]
    step = (FIRST_PAIR[1] - FIRST_PAIR[0]) * var.period
    slope = {k: (at_hi.get(k, 0) - at_lo.get(k, 0)) / step for k in set(at_lo) | set(at_hi)}
    n_lo = grown.layers_at(var, FIRST_PAIR[0])
    flat = affine(at_lo, {var.name: slope}, {var.name: n_lo}, {var.name: var.count})
    result = engine_result(
        flat, name="", trace={}, notes=[], environment=dict(lo.result.environment)
    )
    return assemble(result)


def _form(
    recs: dict[tuple[int, int], Any], var: build.LayerVar, units: int
) -> dict[str, Any] | None:
    """Batch 1's grown run, checked on its 5-unit trace, as a form; None where it differs."""
    from memfit.estimate.derived import layers

    seqs = {mb: staged_payload(to_sequence(r.runs[0]), r.runs[0]) for mb, r in recs.items()}
    runs = {mb: r.runs[0] for mb, r in recs.items()}

    def seq_at(m: int, b: int) -> Any:
        return seqs[m, b]

    try:
        rule1 = layers.learn(*(seq_at(m, 1)[0] for m in grown.UNITS), n0=grown.UNITS[0])
        run1 = grown.batch_one_run(var, units, runs, seq_at, rule1, check_m=CHECK_UNITS)
    except NotModelledError:
        return None
    result = recs[grown.SOLVED_UNITS, 1].result
    record = grown.form_record(var, result, (m for m, _b in recs), (CHECK_UNITS, 1))
    record["growth"]["batch_one_only"] = True
    return {"runs": [run1], "points": [1], **record}


__all__ = ["CHECK_UNITS", "FIRST_PAIR", "FlatRecorder", "Settles", "batch_one_form"]

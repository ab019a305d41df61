"""Build a derived form: trace the job at batch sizes 1, 2 and 3 and solve each allocation's size.

The trace engine runs exactly as for an estimate (same layer counts, same emulations); a
:class:`Recorder` set as its run observer swaps in a :class:`RecordingTracker`, which keeps every
storage's raw size (before the 512 B rounding), the phase changes between events and each
storage's component and module at the end of the run. The three traces must then agree on
everything but the sizes — the same events in the same order, the same owners, the same
parameter counts and kernel choices — and every size must be ``a0 + a1 * batch`` on all three
(two solve it, the third checks it). Otherwise the form is refused (NotModelledError), and the
policy asks the trace engine itself. The form at batch 3, replayed, must give the trace's own peak
and reserved bytes to the byte: a check of the replay, not only of the sizes.

A multi-GPU, ZeRO, offload or tensor-parallel job is traced with the distributed tracker
(:mod:`memfit.estimate.trace.distributed`), and its answer comes from rank 0's rewritten
timeline, not from the traced events: :func:`_rank_record` records that timeline (raw sizes of
the traced storages, the rewrite's own sizes as they are), so the replay gives what the trace
engine gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from memfit.errors import NotModelledError, TraceError
from memfit.estimate.derived.events import frees_in_order
from memfit.estimate.derived.staging import constant_stage, solve_stage
from memfit.estimate.trace import build
from memfit.estimate.trace.cuda_emulation import reduction_call, reduction_workspaces
from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf
from memfit.estimate.trace.tracker import OP_WORKSPACES, StorageTracker
from memfit.spec import WorkloadSpec

#: The batch sizes traced first: the first two solve each size, the last checks it.
POINTS = (1, 2, 3)


class RecordingTracker(StorageTracker):
    """The trace engine's tracker, also keeping raw sizes and phase changes per event, and every
    CUDA reduction that runs ``gpu_reduce_kernel`` (``stage``) with its staging births.

    The staging is a step function of the token count and of the GPU's SM count, not a line in
    the batch size: the recorded events hold a birth and a death of the buffer and of the
    semaphores for every such reduction, whether or not it stages at the traced batch size and
    GPU (a reduction that does not stage: placeholders in the recorded events only, never in the
    tracker's own events, which the trace engine's answer comes from), their raw sizes 0, and
    ``stage`` the reduction's arguments, from which an estimate sizes them
    (:mod:`memfit.estimate.derived.staging`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rec: list[tuple[str, int]] = []  # the recorded events: (op, key)
        self.raw: list[int] = []  # per recorded event: raw bytes of a birth, 0 for a death
        self.marks: list[tuple[int, str]] = []
        self._last_raw = 0
        # per reduction: [buffer birth (the semaphores' is the next), shape, strides, dims, acc]
        self.stage: list[list[Any]] = []
        self.placeholders: dict[int, str] = {}  # key -> module of a staging that did not stage
        self._n_births = 0
        self._staged: int | None = None

    def _rounded(self, n_bytes: int) -> int:
        self._last_raw = n_bytes
        return super()._rounded(n_bytes)

    def _copy_new_events(self, before: int) -> None:
        events = self.events or []
        for op, key, _n in events[before:]:
            self.rec.append((op, key))
            self.raw.append(self._last_raw if op == "a" else 0)
            self._n_births += op == "a"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self._staged = None
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if OP_WORKSPACES.get() is reduction_workspaces:
            call = reduction_call(func, args, kwargs or {})
            if call is not None:
                self._record_stage(call)
        self._staged = None
        return out

    def _workspaces(self, sizes: tuple[int, ...]) -> None:
        first = self._n_births  # CUDA reduction staging (cuda_emulation.reduction_workspaces)
        super()._workspaces(sizes)
        self._staged = first

    def _record_stage(self, call: tuple[Any, ...]) -> None:
        shape, strides, dims, acc_bytes = call
        first = self._staged
        if first is None:  # no staging at this batch size and GPU: the same events, 0 bytes
            module = self._module_stack[-1] if self._module_stack else self._outside_owner()
            buf, sem = next(self._counter), next(self._counter)
            self.placeholders[buf] = self.placeholders[sem] = module
            first = self._n_births
            for op, key in (("a", buf), ("a", sem), ("f", sem), ("f", buf)):
                self.rec.append((op, key))
                self.raw.append(0)
            self._n_births += 2
        self.stage.append([first, list(shape), list(strides), list(dims), acc_bytes])

    def _set_live(self, key: int, n_bytes: int) -> None:
        before = len(self.events or [])
        super()._set_live(key, n_bytes)
        self._copy_new_events(before)

    def _on_free(self, key: int) -> None:
        before = len(self.events or [])
        super()._on_free(key)
        self._copy_new_events(before)

    def ignored_keys(self) -> set[int]:
        """The keys :meth:`ignore` took out of the count."""
        return set(self._ignored)

    def set_phase(self, phase: str) -> None:
        self.marks.append((len(self.rec), phase))
        super().set_phase(phase)


class Recorder:
    """The trace engine's run observer (``engine.RUN_OBSERVER``) while a form is built."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.result: Any = None

    def new_tracker(self) -> StorageTracker:
        return RecordingTracker(device_type="cpu")

    def on_run(self, counts: dict[str, int], tracker: Any, flat: dict[str, float]) -> None:
        timeline = getattr(tracker, "timeline", None)  # a multi-GPU / offload job: rank 0's
        if timeline is not None:
            self.runs.append(_rank_record(counts, timeline, flat))
        else:
            self.runs.append(_run_record(counts, tracker, flat))

    def on_result(self, result: Any) -> None:
        self.result = result


def _run_record(counts: dict[str, int], t: RecordingTracker, flat: dict[str, float]) -> dict:
    comps: dict[str, int] = {}
    mods: dict[str, int] = {}
    key_comp: dict[int, int] = {}
    key_mod: dict[int, int] = {}
    owners = {k: (t.component_of(k), st.module) for k, st in t.storages.items()}
    owners.update({k: ("temporary", m) for k, m in t.placeholders.items()})
    for key in sorted(owners):  # the tracker's storages are born in key order
        comp, module = owners[key]
        mod = build.generic_module_name(module or "(top-level forward, e.g. the loss)")
        key_comp[key] = comps.setdefault(comp, len(comps))
        key_mod[key] = mods.setdefault(mod, len(mods))
    n_keys = max(owners, default=-1) + 1
    raw = [n for (op, _k), n in zip(t.rec, t.raw, strict=True) if op == "a"]
    for s in t.stage:  # sized by an estimate from the reduction's arguments (derived/staging.py)
        raw[s[0]] = raw[s[0] + 1] = 0
    return {
        "counts": dict(counts),
        "ev": frees_in_order([key << 1 | (op == "f") for op, key in t.rec], t.marks),
        "raw": raw,
        "marks": [list(m) for m in t.marks],
        "comps": list(comps),
        "mods": list(mods),
        "comp": [key_comp.get(k, 0) for k in range(n_keys)],
        # host-side scalars the tracker stopped counting: never in a breakdown, even at a peak
        # they were live for (as ``StorageTracker.breakdown`` counts them)
        "ignored": sorted(t.ignored_keys()),
        "mod": [key_mod.get(k, 0) for k in range(n_keys)],
        "const": {k: v for k, v in flat.items() if not k.startswith("phase/") and k != "reserved"},
        "stage": [list(s) for s in t.stage],  # solved by solve() (staging.solve_stage)
    }


def _rank_record(counts: dict[str, int], tl: Any, flat: dict[str, float]) -> dict[str, Any]:
    """A run record of rank 0's rewritten timeline (``rank_replay._Timeline``: the events the
    trace engine's peaks, breakdown and reserved bytes of a multi-GPU or offloaded job come
    from), keys renumbered from 0 in order of birth; ``fixed``: the births whose size the
    rewrite set (partitions, buckets, gathered parameters), which must not depend on the batch
    size (:func:`check_fixed`). The host peak is among the constants (``host_memory``)."""
    index: dict[int, int] = {}
    for _op, key, _n in tl.events:
        index.setdefault(key, len(index))
    comps: dict[str, int] = {}
    mods: dict[str, int] = {}
    comp = [0] * len(index)
    mod = [0] * len(index)
    for key, i in index.items():
        c, m = tl.owner[key]
        comp[i] = comps.setdefault(c, len(comps))
        mod[i] = mods.setdefault(build.generic_module_name(m), len(mods))
    # the timeline orders a peak's modules by the first birth of each (layer-indexed) module
    # name, where the tracker keeps its live storages' order: ``order`` per key says which
    first_of: dict[str, int] = {}
    order = [0] * len(index)
    for i, (op, key, _n) in enumerate(tl.events):
        if op == "a":
            order[index[key]] = first_of.setdefault(tl.owner[key][1], i)
    marks = [list(m) for m in tl.marks]
    ev = [index[key] << 1 | (op == "f") for op, key, _ in tl.events]
    return {
        "counts": dict(counts),
        "ev": frees_in_order(ev, marks),
        "raw": list(tl.raw),
        "fixed": [i for i, f in enumerate(tl.fixed) if f],
        "marks": marks,
        "comps": list(comps),
        "mods": list(mods),
        "comp": comp,
        "ignored": [],  # the rewrite drops the tracker's ignored keys from the timeline
        "mod": mod,
        "order": order,
        "const": {k: v for k, v in flat.items() if not k.startswith("phase/") and k != "reserved"},
    }


def check_fixed(a1: list[int], fixed: list[int]) -> None:
    """NotModelledError where a size the rank rewrite set (``fixed`` births) grows with the
    batch: the rewrite computes it from the traced size after rounding, which is not a line in
    the batch size (none does today: partitions, buckets and gathered parameters are sized by
    the parameters)."""
    moving = sum(1 for i in fixed if a1[i])
    if moving:
        raise _refuse(f"{moving} sizes set by the multi-GPU rewrite depend on the batch size")


def record(
    config: dict[str, Any],
    workload: WorkloadSpec,
    *,
    name: str,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[int, Any]]:
    """The solved form and the trace's estimates at each batch size traced.

    A deep stack of identical layers is traced on a few layers and grown event by event
    (:mod:`memfit.estimate.derived.grown`, checked on a trace it did not learn from); otherwise,
    or where that check fails, the job is traced at full depth: batch sizes 1, 2 and 3; where
    batch 1 runs other kernels than 2 and 3 (some models squeeze a batch of one), batch 1 is
    kept as it is and 4 is traced to check the line through 2 and 3; where batch 1 cannot run at
    all (the trace fails: PyTorch's BatchNorm refuses to train on one value per channel), the
    form keeps that error as its answer at batch 1 (``fails``) and is solved on 2, 3 and 4."""
    from memfit.estimate.derived.grown import applies, record_grown

    if applies(config, workload) is not None:
        try:
            return record_grown(
                config, workload, name=name, recorder=Recorder, progress=progress
            ), {}
        except NotModelledError as exc:
            if exc.engine != "derived":
                raise
            if progress is not None:
                progress(f"deriving the closed form from full traces ({exc})")
    traced: dict[int, Recorder] = {}
    estimates: dict[int, Any] = {}

    def trace(b: int) -> None:
        if progress is not None:
            progress(f"deriving the closed form: trace at batch {b}")
        rec = Recorder()
        token = RUN_OBSERVER.set(rec)
        try:
            estimates[b] = trace_hf(config, dataclasses.replace(workload, batch_size=b), name=name)
        finally:
            RUN_OBSERVER.reset(token)
        traced[b] = rec

    failed: dict[str, str] = {}
    try:
        trace(POINTS[0])
    except TraceError as exc:  # e.g. BatchNorm training on one value per channel (ValueError)
        failed[str(POINTS[0])] = str(exc)
    for b in POINTS[1:]:
        trace(b)  # a failure here is the job's: the form is refused with it
    if not failed and _same_structure(traced[1], traced[2]):
        form = solve([traced[b] for b in (1, 2, 3)], points=(1, 2, 3))
    else:
        trace(4)
        form = solve([traced[b] for b in (2, 3, 4)], points=(2, 3, 4))
        if failed:  # the trace's own answer at batch 1: its error, raised again there
            form["fails"] = failed
        else:
            form["exact"] = {"1": [_constant(run) for run in traced[1].runs]}
    for run in form["runs"]:
        check_fixed(run["a1"], run.get("fixed", []))
    return form, estimates


def _same_structure(a: Recorder, b: Recorder) -> bool:
    if len(a.runs) != len(b.runs):
        return False
    return all(
        all(ra[f] == rb[f] for f in _STRUCTURE) and _reductions(ra) == _reductions(rb)
        for ra, rb in zip(a.runs, b.runs, strict=True)
    )


def _reductions(run: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A run's CUDA reductions, their arguments aside: births, reduced dimensions, accumulator."""
    return [(s[0], tuple(s[3]), s[4]) for s in run.get("stage", [])]


#: What traces at two batch sizes must share for one form to describe both.
_STRUCTURE = ("counts", "ev", "marks", "comps", "mods", "comp", "mod", "ignored")


def _constant(run: dict[str, Any]) -> dict[str, Any]:
    """A run kept as traced: its sizes are its own (no batch term)."""
    sizes = run["raw"]
    stage = constant_stage(run.get("stage", []))
    return (
        {k: v for k, v in run.items() if k not in _NOT_KEPT}
        | {"a0": sizes, "a1": [0] * len(sizes)}
        | ({"stage": stage} if stage else {})
    )


def solve(recorded: list[Recorder], *, points: tuple[int, int, int]) -> dict[str, Any]:
    """Each run's sizes as ``a0 + a1 * batch`` from the first two ``points``, checked on the
    third; NotModelledError where the traces disagree."""
    first = recorded[0]
    x1, x2, x3 = points
    runs = []
    if any(len(rec.runs) != len(first.runs) for rec in recorded):
        raise _refuse(f"the traces at batch sizes {points} ran different layer counts")
    for r, run in enumerate(first.runs):
        others = [rec.runs[r] for rec in recorded[1:]]
        for o in others:
            for field in (*_STRUCTURE, "const"):
                if _comparable(o, field) != _comparable(run, field):
                    raise _refuse(f"the traces at batch sizes {points} differ in {field}")
        s1, s2, s3 = run["raw"], others[0]["raw"], others[1]["raw"]
        # s = a0 + a1 * x, exactly: a1 = (s2 - s1) / (x2 - x1) must be a whole number of bytes.
        a1 = [(b - a) // (x2 - x1) for a, b in zip(s1, s2, strict=True)]
        a0 = [a - d * x1 for a, d in zip(s1, a1, strict=True)]
        bad = [
            i
            for i, (c0, c1, v1, v2, v3) in enumerate(zip(a0, a1, s1, s2, s3, strict=True))
            if c1 < 0 or c0 + c1 * x2 != v2 or c0 + c1 * x3 != v3 or c0 + c1 * x1 != v1
        ]
        if bad:
            raise _refuse(_not_linear(run, bad, points))
        stage = solve_stage([rec.runs[r].get("stage", []) for rec in recorded], points)
        runs.append(
            {k: v for k, v in run.items() if k not in _NOT_KEPT}
            | {"a0": a0, "a1": a1}
            | ({"stage": stage} if stage else {})
        )
    result = first.result
    return {
        "runs": runs,
        "points": list(points),
        "trace": dict(result.trace),
        "notes": list(result.notes),
        "environment": dict(result.environment),
    }


#: What a recorded run holds that a form does not keep.
_NOT_KEPT = ("raw", "stage")


def _not_linear(run: dict[str, Any], bad: list[int], points: tuple[int, ...]) -> str:
    """Why the sizes ``bad`` (indices of births) of ``run`` refuse a form: how many, and where
    the first is (CUDA reduction staging is not among them: it is sized from the reduction's
    arguments, :mod:`memfit.estimate.derived.staging`)."""
    births = [e >> 1 for e in run["ev"] if not e & 1]
    where = run["mods"][run["mod"][births[bad[0]]]] if len(births) > bad[0] else "?"
    why = f"{len(bad)} allocation sizes are not linear in the batch size (traced at {points}"
    return why + f"; the first in {where})"


def _comparable(run: dict[str, Any], field: str) -> Any:
    """``run[field]``; the op count (it says how long the trace was, not what it allocated)
    left out of ``const``."""
    value = run[field]
    if field == "const":
        return {k: v for k, v in value.items() if k != "n_ops"}
    return value


def _refuse(why: str) -> NotModelledError:
    return NotModelledError(f"no derived form for this job: {why}", engine="derived")

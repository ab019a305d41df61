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
from memfit.estimate.trace import build
from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec

#: The batch sizes traced first: the first two solve each size, the last checks it.
POINTS = (1, 2, 3)


class RecordingTracker(StorageTracker):
    """The trace engine's tracker, also keeping raw sizes and phase changes per event."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raw: list[int] = []  # per event: raw bytes of a birth, 0 for a death
        self.marks: list[tuple[int, str]] = []
        self._last_raw = 0
        self.staging: list[int] = []  # births (indices into the raw sizes) of kernel workspaces
        self._n_births = 0

    def _rounded(self, n_bytes: int) -> int:
        self._last_raw = n_bytes
        return super()._rounded(n_bytes)

    def _copy_new_events(self, before: int) -> None:
        events = self.events or []
        for op, _key, _n in events[before:]:
            self.raw.append(self._last_raw if op == "a" else 0)
            self._n_births += op == "a"

    def _workspaces(self, sizes: tuple[int, ...]) -> None:
        first = self._n_births  # CUDA reduction staging (cuda_emulation.reduction_workspaces)
        super()._workspaces(sizes)
        self.staging.extend(range(first, self._n_births))

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
        self.marks.append((len(self.events or []), phase))
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
    events = t.events or []
    comps: dict[str, int] = {}
    mods: dict[str, int] = {}
    key_comp: dict[int, int] = {}
    key_mod: dict[int, int] = {}
    for key, st in t.storages.items():
        comp = t.component_of(key)
        mod = build.generic_module_name(st.module or "(top-level forward, e.g. the loss)")
        key_comp[key] = comps.setdefault(comp, len(comps))
        key_mod[key] = mods.setdefault(mod, len(mods))
    n_keys = max(t.storages, default=-1) + 1
    return {
        "counts": dict(counts),
        "ev": frees_in_order([key << 1 | (op == "f") for op, key, _ in events], t.marks),
        "raw": [n for (op, _k, _n), n in zip(events, t.raw, strict=True) if op == "a"],
        "marks": [list(m) for m in t.marks],
        "comps": list(comps),
        "mods": list(mods),
        "comp": [key_comp.get(k, 0) for k in range(n_keys)],
        # host-side scalars the tracker stopped counting: never in a breakdown, even at a peak
        # they were live for (as ``StorageTracker.breakdown`` counts them)
        "ignored": sorted(t.ignored_keys()),
        "mod": [key_mod.get(k, 0) for k in range(n_keys)],
        "const": {k: v for k, v in flat.items() if not k.startswith("phase/") and k != "reserved"},
        "staging": list(t.staging),  # read by solve() to say why sizes are not linear; not kept
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
    return all(ra[f] == rb[f] for ra, rb in zip(a.runs, b.runs, strict=True) for f in _STRUCTURE)


#: What traces at two batch sizes must share for one form to describe both.
_STRUCTURE = ("counts", "ev", "marks", "comps", "mods", "comp", "mod", "ignored")


def _constant(run: dict[str, Any]) -> dict[str, Any]:
    """A run kept as traced: its sizes are its own (no batch term)."""
    sizes = run["raw"]
    return {k: v for k, v in run.items() if k not in _NOT_KEPT} | {
        "a0": sizes,
        "a1": [0] * len(sizes),
    }


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
        runs.append({k: v for k, v in run.items() if k not in _NOT_KEPT} | {"a0": a0, "a1": a1})
    result = first.result
    return {
        "runs": runs,
        "points": list(points),
        "trace": dict(result.trace),
        "notes": list(result.notes),
        "environment": dict(result.environment),
    }


#: What a recorded run holds that a form does not keep.
_NOT_KEPT = ("raw", "staging")


def _not_linear(run: dict[str, Any], bad: list[int], points: tuple[int, ...]) -> str:
    """Why the sizes ``bad`` (indices of births) of ``run`` refuse a form: how many, and which
    of them are CUDA reduction staging buffers (not a polynomial in the batch size)."""
    staging = set(run.get("staging", ()))
    n_staging = sum(1 for i in bad if i in staging)
    births = [e >> 1 for e in run["ev"] if not e & 1]
    where = run["mods"][run["mod"][births[bad[0]]]] if len(births) > bad[0] else "?"
    why = f"{len(bad)} allocation sizes are not linear in the batch size (traced at {points}"
    why += f"; the first in {where})"
    if n_staging:
        why += (
            f": {n_staging} of them CUDA reduction staging buffers (gpu_reduce_kernel's "
            "global-memory blocks of a bias or norm-weight gradient summed over every token, "
            "sized by setReduceConfig: ceiling divisions of the token count capped by the "
            "GPU's SM count, a step function of the batch size, not a polynomial"
        )
        why += ")" if n_staging == len(bad) else f"), {len(bad) - n_staging} others"
    return why


def _comparable(run: dict[str, Any], field: str) -> Any:
    """``run[field]``; the op count (it says how long the trace was, not what it allocated)
    left out of ``const``."""
    value = run[field]
    if field == "const":
        return {k: v for k, v in value.items() if k != "n_ops"}
    return value


def _refuse(why: str) -> NotModelledError:
    return NotModelledError(f"no derived form for this job: {why}", engine="derived")

"""A derived form: a traced job's allocations as exact functions of the batch size (torch-free).

The form holds, for each traced run (one per layer count the trace engine ran), the event list of
the run — every storage born (``a``) and dead (``f``) in order, with the phase changes between
them — and for every birth its size as ``a0 + a1 * batch_size`` bytes, solved from traces at
batch sizes 1 and 2 and checked on 3 (:mod:`memfit.estimate.derived.record`). Each storage keeps
its component and owning module. Evaluating the form at a batch size replays the events: the
live total gives each phase's peak and its breakdown, exactly as the tracker counted it, and the
same events go through the caching-allocator model (:mod:`memfit.estimate.allocator.caching`) for
the reserved bytes. Runs at several layer counts are combined by the trace engine's own layer
extrapolation (:mod:`memfit.estimate.trace.flat`).

Stored as JSON: ``runs[i]`` = ``{"counts", "ev", "a0", "a1", "marks", "comp", "mod", "comps",
"mods", "ignored", "const"}``. ``ev`` holds ``key << 1 | is_free`` per event, ``a0``/``a1`` the
size coefficients per birth, in order, ``marks`` ``[event index, phase]`` pairs, ``comp``/``mod``
per storage key an index into ``comps``/``mods``, ``ignored`` the keys the tracker stopped
counting (host-side scalars: in a phase's peak, never in its breakdown), ``const`` the run's
numbers that do not depend on the batch size (parameter counts, kernel choices).
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.allocator.caching import simulate
from memfit.estimate.cuda_reduce import DEFAULT_DEVICE, ReduceDevice
from memfit.estimate.derived.staging import staging_sizes
from memfit.estimate.trace.flat import Flat

#: The caching allocator's block size: the tracker rounds every storage up to it.
BLOCK_BYTES = 512
#: Phases a trace records but does not report (before the step, after it).
UNREPORTED_PHASES = ("init", "end")


def sizes_at(run: dict[str, Any], x: int) -> list[int]:
    """Each birth's size at batch size ``x``, rounded up to the allocator's 512 B blocks."""
    r = BLOCK_BYTES
    return [-(-(a0 + a1 * x) // r) * r for a0, a1 in zip(run["a0"], run["a1"], strict=True)]


def phase_marks(run: dict[str, Any]) -> dict[int, list[str]]:
    """The run's phase marks by event index: every phase that starts there, in order (a rank
    rewrite's optimizer phase may start and end with no device event between)."""
    marks: dict[int, list[str]] = {}
    for i, p in run["marks"]:
        marks.setdefault(int(i), []).append(str(p))
    return marks


def replay_run(
    run: dict[str, Any],
    x: int,
    workspaces: tuple[int, ...],
    *,
    reserved: bool = True,
    device: ReduceDevice | None = DEFAULT_DEVICE,
) -> Flat:
    """The flat numbers of ``run`` at batch size ``x`` (as the trace engine's ``flatten_trace``
    and reserved replay give them), ``workspaces``: the GPU's cuBLAS workspace requests; without
    ``reserved``, no allocator replay (no ``reserved`` key); ``device``: the GPU the CUDA
    reduction staging is sized for (``derived/staging.py``; None: none is).

    This is the reference: an event-by-event replay, as the tracker counts. Estimates evaluate
    the same numbers with arrays (:mod:`memfit.estimate.derived.compiled`, tested against it)."""
    sizes = sizes_at(run, x)
    extra = staging_sizes(run, x, device)  # CUDA reduction staging on ``device``
    if extra is not None:
        sizes = [n + int(e) for n, e in zip(sizes, extra, strict=True)]
    ev: list[int] = run["ev"]
    marks = phase_marks(run)
    peaks = _phase_peaks(ev, sizes, marks)
    flat: Flat = dict(run["const"])
    comps, mods = run["comps"], run["mods"]
    key_comp, key_mod = run["comp"], run["mod"]
    ignored = set(run["ignored"])
    order = run.get("order")  # a rank rewrite's module order (derived/record.py)
    for phase, (total, live) in _snapshots(ev, sizes, marks, peaks).items():
        flat[f"phase/{phase}/peak"] = total
        for c in comps:
            flat.setdefault(f"phase/{phase}/comp/{c}", 0)
        items = (
            sorted(live.items(), key=lambda kv: order[kv[0]]) if order is not None else live.items()
        )
        for key, n in items:
            if key in ignored:
                n = 0
            ck = f"phase/{phase}/comp/{comps[key_comp[key]]}"
            flat[ck] += n
            mk = f"phase/{phase}/mod/{mods[key_mod[key]]}"
            flat[mk] = flat.get(mk, 0) + n
    if reserved:
        flat["reserved"] = _reserved(ev, sizes, workspaces)
    return flat


def _phase_peaks(ev: list[int], sizes: list[int], marks: dict[int, list[str]]) -> dict[str, tuple]:
    """Per phase: (peak live bytes, events replayed at it); the first instant wins a tie, as in
    the tracker (``StorageTracker._check_peak``)."""
    live: dict[int, int] = {}
    cur, phase, ai = 0, "init", 0
    peaks: dict[str, tuple[int, int]] = {}
    for i, e in enumerate(ev):
        for phase in marks.get(i, ()):
            if phase not in peaks or cur > peaks[phase][0]:
                peaks[phase] = (cur, i)
        key = e >> 1
        if e & 1:
            cur -= live.pop(key, 0)
            continue
        n = sizes[ai]
        ai += 1
        cur += n - live.get(key, 0)
        live[key] = n
        best = peaks.get(phase)
        if best is None or cur > best[0]:
            peaks[phase] = (cur, i + 1)
    end = len(ev)
    for phase in marks.get(end, ()):
        if phase not in peaks or cur > peaks[phase][0]:
            peaks[phase] = (cur, end)
    return {p: v for p, v in peaks.items() if p not in UNREPORTED_PHASES}


def _snapshots(
    ev: list[int], sizes: list[int], marks: dict[int, list[str]], peaks: dict[str, tuple]
) -> dict[str, tuple[int, dict[int, int]]]:
    """The live storages (key → bytes) at each phase's peak, in one more pass over the events."""
    wanted: dict[int, list[str]] = {}
    for phase, (_total, at) in peaks.items():
        wanted.setdefault(at, []).append(phase)
    out: dict[str, tuple[int, dict[int, int]]] = {}
    live: dict[int, int] = {}
    ai = 0
    for i in range(len(ev) + 1):
        for phase in wanted.get(i, ()):
            out[phase] = (peaks[phase][0], dict(live))
        if i == len(ev):
            break
        e = ev[i]
        if e & 1:
            live.pop(e >> 1, None)
        else:
            live[e >> 1] = sizes[ai]
            ai += 1
    return out


def _reserved(ev: list[int], sizes: list[int], workspaces: tuple[int, ...]) -> int:
    events: list[tuple[str, int, int]] = [("a", -1 - i, n) for i, n in enumerate(workspaces)]
    ai = 0
    empty: set[int] = set()  # keys born with 0 bytes: no event (the tracker records none)
    for e in ev:
        if e & 1:
            if e >> 1 not in empty:
                events.append(("f", e >> 1, 0))
        elif sizes[ai]:
            empty.discard(e >> 1)
            events.append(("a", e >> 1, sizes[ai]))
            ai += 1
        else:
            empty.add(e >> 1)
            ai += 1
    return simulate(events).peak_reserved_bytes

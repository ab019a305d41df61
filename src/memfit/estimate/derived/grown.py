"""A derived form from traces of a few layers: the full-depth run grown event by event.

The trace engine traces a model of up to ``FULL_TRACE_MAX_LAYERS`` layers in full, and a form
built from full traces at three batch sizes traces every layer three or four times (an 8B model:
36 layers, a minute on two cores). Here the stack is traced at 2, 3 and 4 layer units (a unit is
the layer pattern's period; a dense prefix such as DeepSeek's is kept whole in each) at batch 1,
once more at 3 units and batch 2 (each allocation's size as ``a0 + a1 * batch``), and the
event-level growth rule (:mod:`memfit.estimate.derived.layers`) inserts one unit's events until
the run has the model's depth. Before the form is kept, the run grown to 5 units is compared with
a trace of 5 units at batch 3 — not used to learn anything — event by event: the same births,
frees and phase marks in the same order, each size exact at batch 3, the same storage owners
(and, for rank 0's rewritten timeline, each birth's first birth of its layer-indexed module:
the order a peak lists its modules in), and the run's constants (parameter counts, kernel
choices) on the same line in the layer count.
Any difference, or a job this does not apply to (several stacks, frozen layers, a depth the
trace engine extrapolates itself, a depth that is not a whole number of units), and the caller
derives the form from full traces as before.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

from memfit.errors import NotModelledError, TraceError
from memfit.estimate.derived import cache, layers, workers
from memfit.estimate.derived.events import Item, Sequence, at_batch, from_sequence, to_sequence
from memfit.estimate.derived.staging import (
    constant_payload,
    stage_at,
    stage_line,
    stage_of,
    staged_payload,
)
from memfit.estimate.trace import build, step_memo
from memfit.spec import WorkloadSpec

#: Layer units traced at batch 1 (the rule is learned from the three), the unit count traced at
#: batch 2 as well (sizes solved there), and the check trace's units and batch size.
UNITS = (2, 3, 4)
SOLVED_UNITS = 3
CHECK = (5, 3)
#: Fewer units than this and full traces cost about as much: the caller traces in full.
MIN_UNITS = 7
#: The unit counts of the traces a grown form takes (batch 1 squeezed: more): 2, 3, 3 (batch
#: 2), 4 and the check; growth applies where they trace fewer layers than three full traces.
CHECK_TRACES = (2, 3, 3, 4, 5)


def applies(config: dict[str, Any], workload: WorkloadSpec) -> tuple[build.LayerVar, int] | None:
    """The stack to grow (its ``prefix`` and ``period`` those of :func:`layer_unit`) and its
    depth in whole units, or None where growth does not apply."""
    from memfit.estimate.trace.engine import FULL_TRACE_MAX_LAYERS

    if workload.freeze_layers:
        return None
    stacks = build.layer_plan(config, False)
    if len(stacks) != 1 or stacks[0].count > FULL_TRACE_MAX_LAYERS:
        return None
    var = stacks[0]
    unit = layer_unit(config, var.count)
    if unit is None:
        return None
    prefix, period = unit
    units = (var.count - prefix) // period
    fixed = prefix + (var.count - prefix) % period  # layers traced whole in every trace
    traced = len(CHECK_TRACES) * fixed + sum(CHECK_TRACES) * period
    if units < MIN_UNITS or traced >= 3 * var.count:
        return None
    return dataclasses.replace(var, prefix=prefix, period=period), units


def layer_unit(config: dict[str, Any], n_layers: int) -> tuple[int, int] | None:
    """``(prefix, period)`` of a stack of ``n_layers``: the layers' kinds (:func:`layer_kinds`)
    are the ``prefix`` first ones, then a pattern repeating every ``period`` layers (the last
    repeat may be cut short), at least twice. The pair with the fewest layers in all (a
    prefix and a period are traced whole each time), then the shorter period; None where the
    config cannot be read or nothing repeats."""
    kinds = layer_kinds(config, n_layers)
    if kinds is None:
        return None
    found: list[tuple[int, int, int]] = []
    for period in range(1, n_layers // 2 + 1):
        for prefix in range(n_layers - 2 * period + 1):
            body = kinds[prefix:]
            if all(body[i] == body[i % period] for i in range(len(body))):
                found.append((prefix + period, period, prefix))
                break
    if not found:
        return None
    _total, period, prefix = min(found)
    return prefix, period


#: Config fields listing the layers of one kind (an index is in the list or not).
_MEMBERSHIP = ("moe_layers", "mlp_only_layers", "rope_scaling_layers", "attn_layer_indices")
#: Config integers that make layer ``i`` of one kind or another, by rule.
_RULES: dict[str, Callable[[int, int], Any]] = {
    "decoder_sparse_step": lambda i, k: k > 0 and (i + 1) % k == 0,
    "first_k_dense_replace": lambda i, k: i >= k,
    "num_dense_layers": lambda i, k: i >= k,
    "moe_layer_start_index": lambda i, k: i >= k,
    "moe_layer_freq": lambda i, k: k > 0 and i % k == 0,
    "moe_layer_interval": lambda i, k: k > 0 and (i + 1) % k == 0,
    "n_layers_per_attn_res_block": lambda i, k: k > 0 and i % k == 0,
}


def layer_kinds(config: dict[str, Any], n_layers: int) -> list[tuple[Any, ...]] | None:
    """What makes each of ``n_layers`` layers unlike another, as transformers' config of
    ``config`` says: every field that is a list with one entry per layer (``layer_types``,
    ``mlp_layer_types``, ``no_rope_layers`` ...), the index lists of :data:`_MEMBERSHIP` and the
    rules of :data:`_RULES`. None where transformers cannot build the config."""
    try:
        fields = build.config_fields(config)
    except TraceError:  # the trace reports a bad config; here: no growth
        return None
    kinds: list[list[Any]] = [[] for _ in range(n_layers)]
    for key in sorted(fields):
        value = fields[key]
        if key in _MEMBERSHIP and isinstance(value, list | tuple):
            for i in range(n_layers):
                kinds[i].append((key, i in value))
        elif isinstance(value, list | tuple) and len(value) == n_layers:
            for i in range(n_layers):
                kinds[i].append((key, repr(value[i])))
        elif key in _RULES and isinstance(value, int) and not isinstance(value, bool):
            for i in range(n_layers):
                kinds[i].append((key, _RULES[key](i, value)))
    return [tuple(k) for k in kinds]


def _resized(config: dict[str, Any], var: build.LayerVar, n_layers: int) -> dict[str, Any]:
    """``config`` with ``n_layers`` layers: the trace's own resizing, and every other list with
    one entry per layer in config.json cut to the first ``n_layers`` (the kinds keep their
    pattern: a prefix, whole periods and the start of one)."""
    cfg = build.with_layer_counts(config, [var], {var.name: n_layers}, False)
    for key, value in config.items():
        if key in _MEMBERSHIP or key == "layer_types":
            continue
        if isinstance(value, list) and len(value) == var.count:
            cfg[key] = list(value[:n_layers])
    return cfg


#: Traces this process already ran for a form not built yet (``(units, batch)`` -> recorder), by
#: form key (:func:`memfit.estimate.derived.cache.variant_key`): :func:`record_grown` takes them
#: instead of tracing them again (:mod:`memfit.estimate.derived.first` leaves them here).
KEPT: dict[str, dict[tuple[int, int], Any]] = {}


def layers_at(var: build.LayerVar, m: int) -> int:
    """The layers a trace of ``m`` units of ``var`` has: the prefix, ``m`` periods, and what
    the model's depth leaves of a period (traced whole every time)."""
    return var.prefix + m * var.period + (var.count - var.prefix) % var.period


def form_record(
    var: build.LayerVar, result: Any, traced: Iterable[int], check: tuple[int, int]
) -> dict[str, Any]:
    """What a grown form keeps beside its runs: the trace engine's ``result`` at the solved
    depth (its trace facts at the model's depth, notes, environment) and how it grew
    (``traced``: the unit counts traced; ``check``: the units and batch of the check trace)."""
    return {
        "trace": {**dict(result.trace), "layers": {var.name: var.count}},
        "notes": list(result.notes),
        "environment": dict(result.environment),
        "growth": {
            "traced_layers": sorted({layers_at(var, m) for m in traced}),
            "checked_at": {"layers": layers_at(var, check[0]), "batch": check[1]},
            "unit": {
                "prefix": var.prefix,
                "period": var.period,
                "rest": (var.count - var.prefix) % var.period,
            },
        },
    }


def trace_units(
    config: dict[str, Any],
    workload: WorkloadSpec,
    var: build.LayerVar,
    m: int,
    b: int,
    *,
    name: str,
    recorder: Callable[[], Any],
    progress: Callable[[str], None] | None = None,
) -> Any:
    """One trace of a form built by growth: ``m`` units of the stack ``var`` (as
    :func:`applies` gives it) at batch ``b``, its run kept by a ``recorder()``; that recorder.
    NotModelledError (engine "derived") where the trace fails or runs more than once."""
    from memfit.estimate.trace.engine import RUN_OBSERVER, trace_hf

    n_layers = layers_at(var, m)
    if progress is not None:
        progress(f"deriving the closed form: trace of {n_layers} layers at batch {b}")
    cfg = _resized(config, var, n_layers)
    rec = recorder()
    token = RUN_OBSERVER.set(rec)
    try:
        trace_hf(cfg, dataclasses.replace(workload, batch_size=b), name=name, extrapolate=False)
    except TraceError as exc:
        raise NotModelledError(
            f"no layer growth: a trace of {n_layers} layers failed ({exc})", engine="derived"
        ) from exc
    finally:
        RUN_OBSERVER.reset(token)
    if len(rec.runs) != 1:
        raise NotModelledError("no layer growth: the trace ran several times", engine="derived")
    return rec


def record_grown(
    config: dict[str, Any],
    workload: WorkloadSpec,
    *,
    name: str,
    recorder: Callable[[], Any],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The form of ``workload`` on ``config`` from traces of a few layers (see the module
    docstring); NotModelledError (engine "derived") where the growth cannot be learned or the
    check trace disagrees. ``recorder``: makes the run observer that keeps a trace's events."""
    from memfit.estimate.trace.engine import memoized

    found = applies(config, workload)
    if found is None:
        raise NotModelledError("no layer growth for this job", engine="derived")
    var, units = found
    parent = os.getpid()

    def trace(mb: tuple[int, int]) -> Any:
        shown = progress if os.getpid() == parent else None
        return trace_units(config, workload, var, *mb, name=name, recorder=recorder, progress=shown)

    def attempt(mb: tuple[int, int]) -> Any:
        """A trace run ahead of its turn, with the steps it kept in the step memo (a worker's
        go to this process's memo: the next rank variant reuses them); None where it raises:
        :func:`seq_at` traces it again when its turn comes, so a failure is raised in the
        order a serial build meets it."""
        try:
            with step_memo.collecting() as made:
                return trace(mb), made
        except NotModelledError:
            return None

    runs: dict[tuple[int, int], dict[str, Any]] = {}
    seqs: dict[tuple[int, int], tuple[Sequence, list[Any]]] = {}
    results: dict[tuple[int, int], Any] = {}

    def keep(mb: tuple[int, int], rec: Any) -> None:
        runs[mb], results[mb] = rec.runs[0], rec.result
        seqs[mb] = staged_payload(to_sequence(rec.runs[0]), rec.runs[0])

    def seq_at(m: int, b: int) -> tuple[Sequence, list[Any]]:
        if (m, b) not in seqs:
            keep((m, b), trace((m, b)))
        return seqs[m, b]

    def in_memo(mb: tuple[int, int]) -> bool:
        cfg = _resized(config, var, layers_at(var, mb[0]))
        return memoized(cfg, dataclasses.replace(workload, batch_size=mb[1]))

    for mb, rec in KEPT.pop(cache.variant_key(config, workload), {}).items():
        keep(mb, rec)  # traced already in this process (derived/first.py), the same traces
    with workers.Pool(attempt) as pool:
        if pool.enabled:
            build.preload(config, workload)  # the worker, forked after, has the imports

        def ahead(keys: list[tuple[int, int]]) -> None:
            """Trace ``keys`` two at a time where a worker runs (:mod:`.workers`); a run the
            step memo holds (another rank variant's trace) is left to this process."""
            todo = [(mb, layers_at(var, mb[0]) + 1.0) for mb in keys if mb not in seqs]
            if pool.enabled:
                todo = [(mb, c) for mb, c in todo if not in_memo(mb)]
            if pool.enabled and len(todo) > 1:
                for mb, got in pool.run(todo).items():
                    if got is not None:
                        step_memo.adopt(got[1])
                        keep(mb, got[0])

        # what every outcome of the first pair needs, then what that outcome needs (the
        # serial order below then finds them traced)
        ahead([(SOLVED_UNITS, 1), (SOLVED_UNITS, 2)])
        if _same_structure(seq_at(SOLVED_UNITS, 1), seq_at(SOLVED_UNITS, 2)):
            ahead([(m, 1) for m in UNITS] + [(CHECK[0], CHECK[1])])
        else:
            ahead(
                [(SOLVED_UNITS, 3), *((m, 2) for m in UNITS), (CHECK[0], CHECK[1] + 1)]
                + [(m, 1) for m in UNITS]
            )
        return _grown_form(var, units, runs, results, seq_at)


def _grown_form(
    var: build.LayerVar,
    units: int,
    runs: dict[tuple[int, int], dict[str, Any]],
    results: dict[tuple[int, int], Any],
    seq_at: Callable[[int, int], tuple[Sequence, list[Any]]],
) -> dict[str, Any]:
    """The form from the traces ``seq_at`` gives (and keeps in ``runs`` and ``results``)."""
    # batch 1 on the line through 1 and 2 where it runs the same kernels, else its own run and
    # the line through 2 and 3 (some models squeeze a batch of one)
    squeezed = not _same_structure(seq_at(SOLVED_UNITS, 1), seq_at(SOLVED_UNITS, 2))
    x1 = 2 if squeezed else 1
    start, payload = _solved(seq_at(SOLVED_UNITS, x1), seq_at(SOLVED_UNITS, x1 + 1), x1)
    _same_consts(runs[SOLVED_UNITS, x1], runs[SOLVED_UNITS, x1 + 1])
    check_m, check_b = CHECK[0], CHECK[1] + x1 - 1
    # the plain rule, else the anchored one (layers.learn) where it grows another run
    rule = layers.learn(*(seq_at(m, x1)[0] for m in UNITS), n0=UNITS[0])
    anchored = False
    if not _grows_to(start, payload, rule, seq_at(check_m, check_b), check_m, check_b):
        alt = layers.learn(*(seq_at(m, x1)[0] for m in UNITS), n0=UNITS[0], anchored=True)
        if alt == rule or not _grows_to(
            start, payload, alt, seq_at(check_m, check_b), check_m, check_b
        ):
            raise NotModelledError(
                f"no layer growth: the run grown to {check_m} units differs from its trace",
                engine="derived",
            )
        rule, anchored = alt, True
    tables, want_fixed = runs[SOLVED_UNITS, x1], runs[check_m, check_b].get("fixed")
    if "fixed" in tables and _grown_fixed(start, tables["fixed"], rule, check_m) != want_fixed:
        raise NotModelledError(
            f"no layer growth: the run grown to {check_m} units sizes other births by the "
            "multi-GPU rewrite than its trace",
            engine="derived",
        )
    rules = [rule]  # the rules grown below (batch 1's own one too, where squeezed)
    consts = {m: runs[m, x1]["const"] for m in UNITS}
    const = _const_line(consts, runs[check_m, check_b]["const"], check_m, units)
    form: dict[str, Any] = {
        "runs": [_full(start, payload, rule, tables, var, units, const)],
        "points": [x1, x1 + 1],
    }
    if squeezed:
        rule1 = layers.learn(*(seq_at(m, 1)[0] for m in UNITS), n0=UNITS[0], anchored=anchored)
        rules.append(rule1)
        # batch 1 runs other kernels in every layer: its own rule, checked on its own trace
        check1 = None if _same_shape(rule1, rule) else check_m
        form["exact"] = {"1": [batch_one_run(var, units, runs, seq_at, rule1, check_m=check1)]}
    if "order" in runs[SOLVED_UNITS, x1]:  # rank 0's rewritten timeline (record.py)
        by_module = any(r.first_links is None for r in rules)
        _rank_checks(runs, payload, SOLVED_UNITS, x1, by_module=by_module)
    record = form_record(var, results[SOLVED_UNITS, 1], (m for m, _b in runs), (check_m, check_b))
    return {**form, **record}


def _grows_to(
    start: Sequence,
    payload: list[Any],
    rule: layers.Rule,
    want: tuple[Sequence, list[Any]],
    units: int,
    batch: int,
) -> bool:
    """Whether ``start`` (the run at ``SOLVED_UNITS``) grown by ``rule`` to ``units`` is the
    traced run ``want`` at ``batch``: the same items with the same sizes, links, module order
    (where grown) and reduction staging."""
    grown, pay = layers.grow(start, payload, rule, n=SOLVED_UNITS, to=units)
    return (
        grown.links == want[0].links
        and (grown.firsts is None or grown.firsts == want[0].firsts)
        and at_batch(grown, pay, batch) == want[0].items
        and stage_at(pay, batch) == stage_at(want[1], batch)
    )


def batch_one_run(
    var: build.LayerVar,
    units: int,
    runs: dict[tuple[int, int], dict[str, Any]],
    seq_at: Callable[[int, int], tuple[Sequence, list[Any]]],
    rule1: layers.Rule,
    *,
    check_m: int | None,
) -> dict[str, Any]:
    """Batch 1's run at the model's depth: its trace at :data:`SOLVED_UNITS` units grown by
    ``rule1`` (learned from the batch-1 traces at :data:`UNITS`), sizes as traced. With
    ``check_m``, first the run grown to ``check_m`` units is compared with batch 1's trace of
    ``check_m`` units, event by event (NotModelledError where they differ)."""
    start1, raw1 = seq_at(SOLVED_UNITS, 1)
    payload1 = [constant_payload(r) for r in raw1]
    check1 = UNITS[-1]
    if check_m is not None:
        check1 = check_m
        if not _grows_to(start1, payload1, rule1, seq_at(check_m, 1), check_m, 1):
            raise NotModelledError(
                f"no layer growth: batch 1's run grown to {check_m} units differs from its trace",
                engine="derived",
            )
    consts1 = {m: runs[m, 1]["const"] for m in UNITS}
    const1 = _const_line(consts1, runs[check1, 1]["const"], check1, units)
    return _full(start1, payload1, rule1, runs[SOLVED_UNITS, 1], var, units, const1)


def _same_shape(a: layers.Rule, b: layers.Rule) -> bool:
    """Whether two rules insert as many chunks, of the same lengths and links, at the same
    relative places (sizes aside): batch 1's rule, which no trace checks, against the checked
    one."""
    if len(a.chunks) != len(b.chunks) or len(a.retargets) != len(b.retargets):
        return False
    if _second_links(a) != _second_links(b):
        return False
    return all(
        ca[1] == cb[1]
        and [_shape(x) for x in ca[2]] == [_shape(x) for x in cb[2]]
        and (ta[1] - ta[0]) == (tb[1] - tb[0])
        for ca, cb, ta, tb in zip(a.chunks, b.chunks, a.template, b.template, strict=True)
    ) and all(
        ra[1] == rb[1] and _shape(ra[2]) == _shape(rb[2])
        for ra, rb in zip(a.retargets, b.retargets, strict=True)
    )


def _second_links(rule: layers.Rule) -> Any:
    """A rule's second links (a rank run's module order) without absolute old positions."""
    if rule.first_links is None:
        return None
    chunks = [[_shape(x) for x in c] for c in rule.first_links]
    return chunks, [(r[1], _shape(r[2])) for r in rule.first_retargets]


def _shape(link: tuple[Any, ...]) -> tuple[Any, ...]:
    """A link without the absolute position of an old event (batch 1's runs are a few events
    longer or shorter outside the layers), with its drift per layer."""
    return ("old", link[2]) if link[0] == "old" else link


def _full(
    start: Sequence,
    payload: list[Any],
    rule: layers.Rule,
    tables: dict[str, Any],
    var: build.LayerVar,
    units: int,
    const: dict[str, float],
) -> dict[str, Any]:
    full, full_pay = layers.grow(start, payload, rule, n=SOLVED_UNITS, to=units)
    run = from_sequence(full, full_pay, comps=tables["comps"], mods=tables["mods"])
    stage = stage_of(full, full_pay)
    if stage:
        run["stage"] = stage
    run["counts"] = {var.name: var.count}
    run["const"] = const
    if "order" in tables and "order" not in run:  # no second links grown: by module
        run["order"] = list(run["mod"])  # (checked on every traced run, _rank_checks)
    if "fixed" in tables:  # rank 0's timeline: the births the rewrite sized
        run["fixed"] = _grown_fixed(start, tables["fixed"], rule, units)
    return run


def _grown_fixed(start: Sequence, fixed: list[int], rule: layers.Rule, units: int) -> list[int]:
    """The births the rank rewrite sized (``fixed``: birth indices in ``start``'s run, the
    record's) in the run grown to ``units``, carried by the growth like the sizes."""
    keep, births_seen = set(fixed), 0
    flags: list[Any] = []
    for item in start.items:
        flags.append(item[0] == "a" and births_seen in keep)
        births_seen += item[0] == "a"
    grown, grown_flags = layers.grow(start, flags, rule, n=SOLVED_UNITS, to=units)
    births = [f for item, f in zip(grown.items, grown_flags, strict=True) if item[0] == "a"]
    return [k for k, f in enumerate(births) if f]


def _rank_checks(
    runs: dict[tuple[int, int], dict[str, Any]],
    payload: list[Any],
    m: int,
    x1: int,
    *,
    by_module: bool,
) -> None:
    """For runs of rank 0's rewritten timeline: the sizes the rewrite set do not move with the
    batch (``record.check_fixed``); and where the rule grows no second links (the module
    order, compared with the check trace's), that every traced run's peaks list their modules
    in the same order when each storage's place is its module's (what the grown run keeps)."""
    from memfit.estimate.derived.form import replay_run
    from memfit.estimate.derived.record import check_fixed

    check_fixed([p[1] for p in payload if p is not None], runs[m, x1].get("fixed", []))
    if not by_module:
        return
    for (units, b), run in runs.items():
        exact = {**run, "a0": run["raw"], "a1": [0] * len(run["raw"])}
        want = replay_run(exact, b, (), reserved=False)
        got = replay_run({**exact, "order": run["mod"]}, b, (), reserved=False)
        if list(got.items()) != list(want.items()):
            raise NotModelledError(
                f"no layer growth: at {units} units the modules' order depends on the layers",
                engine="derived",
            )


def _bare(item: Item) -> Item:
    return ("a", *item[2:]) if item[0] == "a" else item


def _same_structure(one: tuple[Sequence, list[Any]], two: tuple[Sequence, list[Any]]) -> bool:
    """Whether two runs are the same events, owners and phases in the same order (sizes aside):
    one line in the batch size can describe both."""
    (s1, _p1), (s2, _p2) = one, two
    return (
        s1.links == s2.links
        and s1.firsts == s2.firsts
        and [_bare(i) for i in s1.items] == [_bare(i) for i in s2.items]
    )


def _solved(
    one: tuple[Sequence, list[Any]], two: tuple[Sequence, list[Any]], x1: int
) -> tuple[Sequence, list[Any]]:
    """The run at batch ``x1`` (``one``) with each birth's size as ``(a0, a1)``, ``a0 + a1 *
    batch`` through ``x1`` and ``x1 + 1`` (``two``)."""
    if not _same_structure(one, two):
        raise NotModelledError(
            f"no layer growth: batch {x1} and {x1 + 1} run different events", engine="derived"
        )
    payload: list[Any] = []
    for r1, r2 in zip(one[1], two[1], strict=True):
        if r1 is None:
            payload.append(None)
            continue
        if isinstance(r1, tuple):  # a CUDA reduction's staging: its arguments as lines
            payload.append((0, 0, stage_line(r1, r2, x1)))
            continue
        if r2 < r1:
            raise NotModelledError(
                "no layer growth: a size shrinks with the batch", engine="derived"
            )
        payload.append((r1 - (r2 - r1) * x1, r2 - r1))
    return one[0], payload


def _same_consts(r1: dict[str, Any], r2: dict[str, Any]) -> None:
    a, b = ({k: v for k, v in r["const"].items() if k != "n_ops"} for r in (r1, r2))
    if a != b:
        raise NotModelledError(
            "no layer growth: the batch size changes the run's constants", engine="derived"
        )


def _const_line(
    consts: dict[int, dict[str, float]], check: dict[str, float], check_m: int, units: int
) -> dict[str, float]:
    """The run's constants at ``units``, each on the line through 3 and 4 units, checked at 2 and
    at the check trace (the op count, which depends on nothing the memory does, unchecked)."""
    c2, c3, c4 = (consts[m] for m in UNITS)
    if not set(c2) == set(c3) == set(c4) == set(check):
        raise NotModelledError("no layer growth: the runs' constants differ", engine="derived")
    out: dict[str, float] = {}
    for k, v3 in c3.items():
        step = c4[k] - v3
        if k != "n_ops" and (c2[k] != v3 - step or check[k] != v3 + (check_m - 3) * step):
            raise NotModelledError(
                f"no layer growth: {k} is not linear in the layer count", engine="derived"
            )
        out[k] = v3 + (units - 3) * step
    return out

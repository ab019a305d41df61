"""A rank run's module order through the layer growth (torch-free): rank 0's rewritten timeline
lists a peak's modules by the first birth of each layer-indexed module, which a run of generic
module names does not keep, so each birth carries a second link to that first birth
(``Sequence.firsts``), learned, grown and compared like the storage links."""

from __future__ import annotations

import re
from typing import Any

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.derived import layers
from memfit.estimate.derived.events import Sequence, from_sequence, to_sequence


def _zero3_step(n_layers: int) -> dict[str, Any]:
    """A ZeRO-3-like step: each layer gathers its weight in the forward (freed after it) and
    again in the backward (in reverse layer order), keeps an activation for the backward and
    gets a gradient; ``order`` per key as the recorder stores it (the event of the first birth
    of its layer-indexed module)."""
    ev: list[int] = []
    raw: list[int] = []
    marks: list[list[Any]] = []
    names: list[str] = []  # per key: its layer-indexed module

    def born(n: int, name: str) -> int:
        names.append(name)
        ev.append(len(names) - 1 << 1)
        raw.append(n)
        return len(names) - 1

    def free(key: int) -> None:
        ev.append(key << 1 | 1)

    marks.append([0, "forward"])
    kept = []
    for i in range(n_layers):
        w = born(4096, f"model.layers.{i}.mlp")
        kept.append(born(64, f"model.layers.{i}"))
        free(w)
    loss = born(4, "lm_head")
    marks.append([len(ev), "backward"])
    grads = []
    for i in reversed(range(n_layers)):
        w = born(4096, f"model.layers.{i}.mlp")
        grads.append(born(1024, f"model.layers.{i}.mlp"))
        free(kept[i])
        free(w)
    marks.append([len(ev), "optimizer"])
    for g in grads:
        free(g)
    free(loss)
    generic = [re.sub(r"\.\d+(\.|$)", r".*\1", n) for n in names]
    mods = list(dict.fromkeys(generic))
    first: dict[str, int] = {}
    order = [0] * len(names)
    for i, e in enumerate(ev):
        if not e & 1:
            order[e >> 1] = first.setdefault(names[e >> 1], i)
    return {"ev": ev, "raw": raw, "marks": marks, "comps": ["activations"],
            "comp": [0] * len(names), "mods": mods, "mod": [mods.index(g) for g in generic],
            "ignored": [], "order": order}  # fmt: skip


def _rule(runs: dict[int, dict[str, Any]]) -> tuple[layers.Rule, Sequence, list[Any]]:
    seqs = {n: to_sequence(runs[n]) for n in (2, 3, 4)}
    rule = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2)
    start, raw = seqs[3]
    return rule, start, [None if r is None else (r, 0) for r in raw]


def test_a_rank_runs_module_order_grows_with_its_layers() -> None:
    rule, start, payload = _rule({n: _zero3_step(n) for n in (2, 3, 4)})
    assert rule.first_links is not None
    for depth in (5, 12):
        grown, pay = layers.grow(start, payload, rule, n=3, to=depth)
        run = from_sequence(grown, pay, comps=["activations"], mods=_zero3_step(3)["mods"])
        want = _zero3_step(depth)
        assert run["order"] == want["order"]
        got_seq, _ = to_sequence({**run, "raw": run["a0"]})
        assert got_seq == to_sequence(want)[0]


def test_the_module_order_is_not_what_ordering_by_module_gives() -> None:
    """The case the second links are for: layer 0's gathered weight is born before layer 1's,
    both named ``model.layers.*.mlp``, so a key's place is not its generic module's."""
    run = _zero3_step(3)
    assert run["order"] != sorted(run["order"])  # the backward's gathers are no first births
    by_module: dict[int, int] = {}
    for k, m in enumerate(run["mod"]):
        by_module.setdefault(m, run["order"][k])
    assert any(run["order"][k] != by_module[m] for k, m in enumerate(run["mod"]))


def _misordered(n_layers: int) -> dict[str, Any]:
    """The step with its last birth (layer 0's gradient) tied to layer 0's activation's
    module instead of its own: the same events and storage links, another module order."""
    run = _zero3_step(n_layers)
    order = list(run["order"])
    last = max(k for k, e in enumerate(order) if e != 0)
    order[last] = order[1]
    return {**run, "order": order}


def test_layer_steps_that_change_the_module_order_differently_grow_no_module_order() -> None:
    """The storage links still make a rule; the module order does not, so the rule keeps none
    and the grown run has none (grown.py then checks ordering by module on every traced run,
    or refuses)."""
    runs = {2: _zero3_step(2), 3: _zero3_step(3), 4: _misordered(4)}
    rule, start, payload = _rule(runs)
    assert rule.first_links is None
    grown, _pay = layers.grow(start, payload, rule, n=3, to=5)
    assert grown.firsts is None
    assert grown.links == to_sequence(_zero3_step(5))[0].links


def test_a_check_trace_whose_module_order_differs_shows_in_the_second_links_only() -> None:
    """What grown.py compares with its check trace: the items and storage links alone would
    take this run for the grown one; its second links do not."""
    rule, start, payload = _rule({n: _zero3_step(n) for n in (2, 3, 4)})
    assert rule.first_links is not None
    grown, _pay = layers.grow(start, payload, rule, n=3, to=5)
    want = to_sequence(_misordered(5))[0]
    assert grown.items == want.items
    assert grown.links == want.links
    assert grown.firsts != want.firsts


def test_a_run_with_a_module_order_and_one_without_do_not_make_a_rule() -> None:
    two, three, four = (to_sequence(_zero3_step(n))[0] for n in (2, 3, 4))
    plain = Sequence(items=four.items, links=four.links)
    with pytest.raises(NotModelledError, match="module order"):
        layers.learn(two, three, plain, n0=2)

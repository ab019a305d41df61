"""Event-level layer growth on synthetic runs (torch-free): a rule learned from 2, 3 and 4 layers
reproduces the run of any depth, links (which free ends which birth) included."""

from __future__ import annotations

from typing import Any

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.derived import layers
from memfit.estimate.derived.events import Sequence, from_sequence, to_sequence


class _Run:
    """A recorded run in the form's layout, written event by event."""

    def __init__(self) -> None:
        self.ev: list[int] = []
        self.raw: list[int] = []
        self.marks: list[list[Any]] = []
        self.mod: list[int] = []
        self.mods: list[str] = []

    def born(self, n_bytes: int, mod: str) -> int:
        key = len(self.mod)
        if mod not in self.mods:
            self.mods.append(mod)
        self.mod.append(self.mods.index(mod))
        self.ev.append(key << 1)
        self.raw.append(n_bytes)
        return key

    def free(self, key: int) -> None:
        self.ev.append(key << 1 | 1)

    def phase(self, name: str) -> None:
        self.marks.append([len(self.ev), name])

    def record(self) -> dict[str, Any]:
        n = len(self.mod)
        return {"ev": self.ev, "raw": self.raw, "marks": self.marks, "comps": ["activations"],
                "comp": [0] * n, "mods": self.mods, "mod": self.mod, "ignored": []}  # fmt: skip


def _training_step(n_layers: int, batch: int = 1) -> dict[str, Any]:
    """A training step's shape: each layer keeps its input for backward (freed by the layer's
    backward, in reverse order), frees a temporary at once, and has an optimizer state; the
    loss's graph is dropped in one run of frees at the end."""
    r = _Run()
    r.phase("forward")
    h = r.born(64 * batch, "embed")
    kept = []
    for _ in range(n_layers):
        t = r.born(512 * batch, "layers.*.mlp")
        out = r.born(64 * batch, "layers.*")
        r.free(t)
        kept.append(h)
        h = out
    loss = r.born(4, "loss")
    r.phase("backward")
    grads = []
    for x in reversed(kept):
        g = r.born(256, "layers.*.grad")
        grads.append(g)
        r.free(x)
    r.free(h)
    r.phase("optimizer")
    for _ in range(n_layers):
        r.born(512, "layers.*.state")
    for g in grads:
        r.free(g)
    r.free(loss)
    return r.record()


def _two_kinds_freed_at_the_end(n_layers: int, batch: int = 1) -> dict[str, Any]:
    """A step in which each layer also keeps storages of two kinds (one made before the layers
    run, like a per-layer mask, and two inside the layer) until one run of frees after
    the backward: the run frees every storage of the first kind, then every one of the second
    (a run of frees is ordered by birth), so one more layer inserts frees at two places of one
    run."""
    r = _Run()
    r.phase("forward")
    h = r.born(64 * batch, "embed")
    masks = [r.born(32 * batch, "model") for _ in range(n_layers)]
    kept, saved = [], []
    for i in range(n_layers):
        t = r.born(512 * batch, "layers.*.mlp")
        saved += [r.born(128 * batch, "layers.*.attn"), r.born(16 * batch, "layers.*.attn")]
        if i == 0:  # the first layer runs one op more: a new layer is not the first
            r.free(r.born(8, "layers.*.mlp"))
        out = r.born(64 * batch, "layers.*")
        r.free(t)
        kept.append(h)
        h = out
    loss = r.born(4, "loss")
    r.phase("backward")
    for x in reversed(kept):
        g = r.born(256, "layers.*.grad")
        r.free(x)
        r.free(g)
    r.free(h)
    for k in (*masks, *saved):
        r.free(k)
    r.free(loss)
    return r.record()


def test_a_run_of_frees_of_two_kinds_grows_by_what_it_frees() -> None:
    seqs = {n: to_sequence(_two_kinds_freed_at_the_end(n)) for n in (2, 3, 4)}
    rule = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2)
    start, raw = seqs[3]
    payload = [None if r is None else (r, 0) for r in raw]
    mods = _two_kinds_freed_at_the_end(3)["mods"]
    for depth in (5, 9):
        grown, pay = layers.grow(start, payload, rule, n=3, to=depth)
        run = from_sequence(grown, pay, comps=["activations"], mods=mods)
        assert _canonical(run) == _canonical(_two_kinds_freed_at_the_end(depth))


def _canonical(run: dict[str, Any]) -> tuple[Sequence, list[Any]]:
    """A run as the growth sees it: frees in a row in one order (a replay cannot tell them
    apart), keys as links."""
    if "raw" not in run:
        run = {**run, "raw": run["a0"]}
    return to_sequence(run)


def test_a_rule_learned_on_two_to_four_layers_grows_the_run_of_any_depth() -> None:
    seqs = {n: to_sequence(_training_step(n)) for n in (2, 3, 4)}
    rule = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2)
    start, raw = seqs[3]
    payload = [None if r is None else (r, 0) for r in raw]
    for depth in (5, 12):
        grown, pay = layers.grow(start, payload, rule, n=3, to=depth)
        run = from_sequence(grown, pay, comps=["activations"], mods=_training_step(3)["mods"])
        want = _training_step(depth)
        assert _canonical(run) == _canonical(want)
        assert run["marks"] == want["marks"]
        assert len(run["ev"]) == len(want["ev"])


def test_a_run_that_changes_more_than_it_inserts_is_refused() -> None:
    two, three, four = (to_sequence(_training_step(n))[0] for n in (2, 3, 4))
    changed = Sequence(items=[("m", "other"), *four.items[1:]], links=four.links)
    with pytest.raises(NotModelledError, match="no layer growth"):
        layers.learn(two, three, changed, n0=2)


def test_growth_starts_from_the_run_the_rule_was_learned_next_to() -> None:
    seqs = {n: to_sequence(_training_step(n)) for n in (2, 3, 4)}
    rule = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2)
    with pytest.raises(ValueError, match="grow starts from"):
        layers.grow(seqs[4][0], seqs[4][1], rule, n=4, to=6)


def _zero3_forward(n_layers: int, batch: int = 1) -> dict[str, Any]:
    """ZeRO-3's forward as rank 0 sees it where the prefetch budget binds: each layer's MLP
    gathers the next layer's attention ahead of it, the last layer's gathers nothing, and each
    layer but the first frees the layer before's output (the first layer's input, the
    embedding, is kept): one more layer's events begin inside the last layer and link into the
    layer before it, which the first step finds in the first layer, an event shorter."""
    r = _Run()
    r.phase("forward")
    h = r.born(64 * batch, "embed")
    attn = r.born(300, "layers.*.attn (gathered)")
    prev, saved = None, []
    for i in range(n_layers):
        a = r.born(128 * batch, "layers.*.attn")
        r.free(attn)
        res = r.born(64 * batch, "layers.*")
        mlp = r.born(900, "layers.*.mlp (gathered)")
        if i + 1 < n_layers:
            attn = r.born(300, "layers.*.attn (gathered)")
        m = r.born(256 * batch, "layers.*.mlp")
        r.free(mlp)
        x1, x2 = r.born(64 * batch, "layers.*"), r.born(64 * batch, "layers.*")
        for k in ([] if prev is None else [prev]) + [res, m, x1]:
            r.free(k)
        saved.append(a)
        prev = x2
    loss = r.born(4, "loss")
    r.phase("backward")
    for a in reversed(saved):
        g = r.born(256, "layers.*.grad")
        r.free(a)
        r.free(g)
    for k in (prev, h, loss):
        r.free(k)
    return r.record()


def test_events_linking_into_the_unit_before_grow_with_the_chunk_that_holds_them() -> None:
    seqs = {n: to_sequence(_zero3_forward(n)) for n in (2, 3, 4)}
    start, raw = seqs[3]
    payload = [None if r is None else (r, 0) for r in raw]
    mods = _zero3_forward(3)["mods"]

    def grown(rule: layers.Rule, depth: int) -> tuple[Sequence, list[Any]]:
        seq, pay = layers.grow(start, payload, rule, n=3, to=depth)
        return _canonical(from_sequence(seq, pay, comps=["activations"], mods=mods))

    plain = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2)
    anchored = layers.learn(*(seqs[n][0] for n in (2, 3, 4)), n0=2, anchored=True)
    # the straight line through the first unit's place frees the wrong one of two twins
    assert grown(plain, 4) == _canonical(_zero3_forward(4))
    assert grown(plain, 5)[0].links != _canonical(_zero3_forward(5))[0].links
    for depth in (4, 5, 9):
        assert grown(anchored, depth) == _canonical(_zero3_forward(depth))

"""A recorded run as a sequence of aligned items, and back (torch-free).

A sequence is a list of items — ``("m", phase)`` phase marks, ``("a", size, component, module,
ignored)`` births, ``("f", component, module, ignored)`` frees — with ``links[i]``: the index of
the previous item on the same storage, or -1. A run of rank 0's rewritten timeline (its record has
an ``order``) has a second link per item, ``firsts[i]``: for a birth, the first birth of its
storage's layer-indexed module (itself where it is that birth), else -1 — the order a peak
lists its modules in, which the generic module names of a grown run do not keep. Runs of
consecutive frees are put in one canonical order (:func:`frees_in_order`), which no peak or
allocator state depends on. Used by the layer growth (:mod:`memfit.estimate.derived.layers`)
and by the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import NotModelledError

Item = tuple[Any, ...]


@dataclass(frozen=True, kw_only=True)
class Sequence:
    """A run as aligned items: ``items[i]`` (``"m"``, ``"a"`` or ``"f"`` first), ``links[i]``;
    ``firsts``: the second links of a rank run (see the module docstring), else None."""

    items: list[Item]
    links: list[int]
    firsts: list[int] | None = None


def to_sequence(run: dict[str, Any]) -> tuple[Sequence, list[Any]]:
    """A recorded run as aligned items and links, each birth's raw size as its payload (None
    for the other items)."""
    marks: dict[int, list[str]] = {}
    for i, phase in run["marks"]:
        marks.setdefault(int(i), []).append(str(phase))
    ignored = set(run["ignored"])
    comps, mods, comp, mod = run["comps"], run["mods"], run["comp"], run["mod"]
    items: list[Item] = []
    links: list[int] = []
    pay: list[Any] = []
    last: dict[int, int] = {}
    ev: list[int] = run["ev"]
    sizes = run["raw"]
    order: list[int] | None = run.get("order")  # per key: the event of its module's first birth
    item_of: dict[int, int] = {}  # event index → item index
    firsts: list[int] = []
    ai = 0
    for i in range(len(ev) + 1):
        for phase in marks.get(i, ()):
            items.append(("m", phase))
            links.append(-1)
            firsts.append(-1)
            pay.append(None)
        if i == len(ev):
            break
        key, is_free = ev[i] >> 1, ev[i] & 1
        link = last.get(key, -1)
        last[key] = len(items)
        links.append(link)
        item_of[i] = len(items)
        if is_free:
            born = items[link] if link >= 0 else ("a", 0, "", "", False)
            items.append(("f", *born[2:]))
            firsts.append(-1)
            pay.append(None)
            continue
        firsts.append(-1 if order is None else item_of[order[key]])
        size = sizes[ai]
        ai += 1
        items.append(("a", size, comps[comp[key]], mods[mod[key]], key in ignored))
        pay.append(size)
    return _frees_sorted(items, links, pay, firsts if order is not None else None)


def _frees_sorted(
    items: list[Item], links: list[int], pay: list[Any], firsts: list[int] | None = None
) -> tuple[Sequence, list[Any]]:
    """The sequence with each run of consecutive frees in one canonical order (by the birth
    of what they free). Frees with no birth or mark between them give the same live bytes at
    every instant that can be a peak and leave the allocator in the same state in any order
    (freed blocks merge with their free neighbours either way), but the order in which Python
    drops a graph's tensors differs between layer counts."""
    order: list[int] = []
    i = 0
    while i < len(items):
        if items[i][0] != "f":
            order.append(i)
            i += 1
            continue
        end = i
        while end < len(items) and items[end][0] == "f":
            end += 1
        order.extend(sorted(range(i, end), key=lambda k: links[k]))
        i = end
    where = {old: new for new, old in enumerate(order)}
    seq = Sequence(
        items=[items[k] for k in order],
        links=[where[links[k]] if links[k] >= 0 else -1 for k in order],
        firsts=None
        if firsts is None
        else [where[firsts[k]] if firsts[k] >= 0 else -1 for k in order],
    )
    return seq, [pay[k] for k in order]


def frees_in_order(ev: list[int], marks: list[Any]) -> list[int]:
    """A recorded run's events (``key << 1 | is_free``) with each run of consecutive frees (no
    birth or phase mark between them) in one canonical order: by where what they free was born.
    The same reordering as :func:`to_sequence`'s, on the record itself, so that traces at two
    batch sizes compare equal where only the order in which Python dropped a run of tensors
    differs (autocast's weight cache, cleared at once, frees its casts in hash order)."""
    cut = {int(m[0]) for m in marks}
    born: dict[int, int] = {}
    out = list(ev)
    i = 0
    while i < len(ev):
        if not ev[i] & 1:
            born[ev[i] >> 1] = i
            i += 1
            continue
        j = i + 1
        while j < len(ev) and ev[j] & 1 and j not in cut:
            j += 1
        out[i:j] = sorted(ev[i:j], key=lambda e: born.get(e >> 1, -1))
        i = j
    return out


def at_batch(seq: Sequence, pay: list[Any], b: int) -> list[Item]:
    """``seq``'s items with each birth's size at batch ``b`` (payloads ``(a0, a1)``)."""
    out = []
    for item, p in zip(seq.items, pay, strict=True):
        out.append(("a", p[0] + p[1] * b, *item[2:]) if item[0] == "a" else item)
    return out


def from_sequence(
    seq: Sequence, pay: list[Any], *, comps: list[str], mods: list[str]
) -> dict[str, Any]:
    """The run record (:mod:`memfit.estimate.derived.form`'s layout) of a grown sequence; with
    ``firsts``, each key's ``order`` too (the event of its module's first birth)."""
    comp_ix = {c: i for i, c in enumerate(comps)}
    mod_ix = {m: i for i, m in enumerate(mods)}
    key_of: list[int] = []
    ev: list[int] = []
    a0: list[int] = []
    a1: list[int] = []
    marks: list[list[Any]] = []
    comp: list[int] = []
    mod: list[int] = []
    ignored: list[int] = []
    firsts = seq.firsts
    ev_of: list[int] = []  # per item: its event index (a mark: the next event's)
    order: dict[int, int] = {}
    for j, (item, link, p) in enumerate(zip(seq.items, seq.links, pay, strict=True)):
        ev_of.append(len(ev))
        if item[0] == "m":
            marks.append([len(ev), item[1]])
            key_of.append(-1)
            continue
        if link >= 0:
            key = key_of[link]
        else:
            key = len(comp)
            comp.append(comp_ix[item[2]] if item[0] == "a" else 0)
            mod.append(mod_ix[item[3]] if item[0] == "a" else 0)
            if item[0] == "a" and item[4]:
                ignored.append(key)
        key_of.append(key)
        ev.append(key << 1 | (item[0] == "f"))
        if item[0] == "a":
            a0.append(p[0])
            a1.append(p[1])
            if firsts is not None:
                f = firsts[j]
                if not 0 <= f <= j or seq.items[f][0] != "a":
                    raise NotModelledError(
                        "a grown run's module order links a birth to no earlier birth",
                        engine="derived",
                    )
                order.setdefault(key, ev_of[f])
    out: dict[str, Any] = {
        "ev": ev,
        "a0": a0,
        "a1": a1,
        "marks": marks,
        "comps": list(comps),
        "mods": list(mods),
        "comp": comp,
        "mod": mod,
        "ignored": ignored,
    }
    if firsts is not None:
        out["order"] = [order.get(k, 0) for k in range(len(comp))]
    return out

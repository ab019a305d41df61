"""A recorded run as a sequence of aligned items, and back (torch-free).

A sequence is a list of items — ``("m", phase)`` phase marks, ``("a", size, component, module,
ignored)`` births, ``("f", component, module, ignored)`` frees — with ``links[i]``: the index of
the previous item on the same storage, or -1. Runs of consecutive frees are put in one canonical
order (:func:`frees_in_order`), which no peak or allocator state depends on. Used by the layer
growth (:mod:`memfit.estimate.derived.layers`) and by the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Item = tuple[Any, ...]


@dataclass(frozen=True, kw_only=True)
class Sequence:
    """A run as aligned items: ``items[i]`` (``"m"``, ``"a"`` or ``"f"`` first), ``links[i]``."""

    items: list[Item]
    links: list[int]


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
    ai = 0
    for i in range(len(ev) + 1):
        for phase in marks.get(i, ()):
            items.append(("m", phase))
            links.append(-1)
            pay.append(None)
        if i == len(ev):
            break
        key, is_free = ev[i] >> 1, ev[i] & 1
        link = last.get(key, -1)
        last[key] = len(items)
        links.append(link)
        if is_free:
            born = items[link] if link >= 0 else ("a", 0, "", "", False)
            items.append(("f", *born[2:]))
            pay.append(None)
            continue
        size = sizes[ai]
        ai += 1
        items.append(("a", size, comps[comp[key]], mods[mod[key]], key in ignored))
        pay.append(size)
    return _frees_sorted(items, links, pay)


def _frees_sorted(
    items: list[Item], links: list[int], pay: list[Any]
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
    """The run record (:mod:`memfit.estimate.derived.form`'s layout) of a grown sequence."""
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
    for item, link, p in zip(seq.items, seq.links, pay, strict=True):
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
    return {
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

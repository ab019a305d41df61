"""Layer growth at the event level: a traced run of n + 1 layers is the run of n layers with
one layer's events inserted, at the same places each time (torch-free).

A stack of identical layers repeats its events with a fixed stride: each layer's forward, its
backward, its share of every optimizer pass, each at its own place in the run. Aligning the run
of ``n`` layers with the run of ``n + 1`` (``difflib``: the longer one must be the shorter one
with events inserted, nothing changed or removed) gives the inserted *chunks* and, for every
event, which earlier event it is linked to (a free to its storage's birth, a re-birth to the
free before it): inside its own chunk, inside another chunk of the same step, or an event of the
shorter run. Learned on two steps (``n → n + 1`` and ``n + 1 → n + 2``), each chunk must have the
same content both times and every position must move by a fixed amount per step; the rule then
grows the run to any layer count by inserting the chunks again. The caller checks the grown run
against a trace it did not learn from (one more layer, another batch size), to the event.

The sequences are :mod:`memfit.estimate.derived.events`' (items and links). A rank run's second
links (``firsts``: each birth's first birth of its layer-indexed module) are learned, drifted and
grown the same way as the first ones, with the chunks the first ones place; where they do not
follow a rule there (the chunks took one layer's events for new in one place and another
layer's in another), the rule has none (``Rule.first_links`` None) and grows none.

Where the plain rule fails its check, the caller learns the *anchored* one (:func:`learn`): an
old event that the second step finds inside the first step's chunk moves with that chunk. The
first step's runs start from the first unit, which can differ from the others (under ZeRO-3 the
first layer frees no earlier layer's output: an event shorter), so a straight line through both
steps can land one event off from the third step on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memfit.errors import NotModelledError
from memfit.estimate.derived.events import Item, Sequence


@dataclass(frozen=True, kw_only=True)
class _Step:
    chunks: list[tuple[int, int, int, list[tuple[Any, ...]]]]  # (at, start, end in new, links)
    retargets: list[tuple[int, tuple[Any, ...]]]  # (old index, link)
    first_links: list[list[tuple[Any, ...]]] | None = None  # per chunk: second link per item
    first_retargets: list[tuple[int, tuple[Any, ...]]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Rule:
    """How a run grows by one layer unit, learned at ``n0`` and ``n0 + 1`` (see the module
    docstring). Positions are ``value + (n - n0) * drift``."""

    n0: int
    chunks: list[tuple[int, int, list[tuple[Any, ...]]]]  # (at, drift, link per chunk item)
    retargets: list[tuple[int, int, tuple[Any, ...]]]  # (old index, drift, link)
    template: list[tuple[int, int]]  # per chunk: (start, end) in the sequence at n0 + 1
    #: the second links (``Sequence.firsts``) where the runs have them: per chunk item, and
    #: the old events whose second link changes (old index, drift, link)
    first_links: list[list[tuple[Any, ...]]] | None = None
    first_retargets: list[tuple[int, int, tuple[Any, ...]]] = field(default_factory=list)


def _refuse(why: str) -> NotModelledError:
    return NotModelledError(f"no layer growth for this job: {why}", engine="derived")


#: Items that must follow an insertion in both runs for it to count as found.
_SYNC = 16


def _inserts(a: Sequence, b: Sequence) -> list[tuple[int, int, int]]:
    """Where ``b`` is ``a`` with items inserted: ``(at, start, end)`` per chunk (``at`` in
    ``a``, ``start:end`` in ``b``); NotModelledError where it is not.

    Greedy: walk both runs while they agree; where they part, the shortest insertion after
    which the next ``_SYNC`` items agree again (else the one after which most agree). Any
    choice among repeats gives the same items; which one is meant is settled by
    :func:`_oriented`, and a wrong choice shows in the check trace."""
    x, y = a.items, b.items
    left = len(y) - len(x)
    chunks: list[tuple[int, int, int]] = []
    i = j = 0
    while i < len(x):
        if j < len(y) and x[i] == y[j]:
            i, j = i + 1, j + 1
            continue
        w = min(_SYNC, len(x) - i)
        want = x[i : i + w]
        best, best_run = 0, -1
        for d in range(1, left + 1):
            if y[j + d : j + d + w] == want:
                best = d
                break
            run = _agree(x, i, y, j + d, w)
            if run > best_run:
                best, best_run = d, run
        if best == 0:
            raise _refuse("one more layer changes events of the shorter run")
        chunks.append((i, j, j + best))
        j, left = j + best, left - best
    if left:
        chunks.append((len(x), j, j + left))
    return chunks


def _agree(x: list[Item], i: int, y: list[Item], j: int, w: int) -> int:
    n = 0
    while n < w and j + n < len(y) and x[i + n] == y[j + n]:
        n += 1
    return n


def _slid(b: Sequence, chunks: list[tuple[int, int, int]], k: int, way: int) -> tuple:
    """Chunk ``k`` slid as far right as it goes over items equal to its own (the same sequence
    ``b``, another choice of which items are the inserted ones), then with ``way`` -1 back left
    by whole copies of itself as far as they repeat."""
    at, j1, j2 = chunks[k]
    lo = chunks[k - 1][2] if k > 0 else 0
    hi = chunks[k + 1][1] if k + 1 < len(chunks) else len(b.items)
    items = b.items
    while j2 < hi and items[j1] == items[j2]:
        at, j1, j2 = at + 1, j1 + 1, j2 + 1
    if way < 0:  # then back by whole copies: the block keeps its phase
        d = j2 - j1
        while j1 - d >= lo and items[j1 - d : j1] == items[j1:j2]:
            at, j1, j2 = at - d, j1 - d, j2 - d
    return at, j1, j2


def _step(a: Sequence, b: Sequence, chunks: list[tuple[int, int, int]]) -> _Step:
    inserted: dict[int, tuple[int, int]] = {}
    for k, (_at, j1, j2) in enumerate(chunks):
        for o, j in enumerate(range(j1, j2)):
            inserted[j] = (k, o)
    new_of = [j for j in range(len(b.items)) if j not in inserted]
    old_of = {j: i for i, j in enumerate(new_of)}

    def link(j: int) -> tuple[Any, ...]:
        if j < 0:
            return ("none",)
        if j in inserted:
            return ("new", *inserted[j])
        return ("old", old_of[j])

    def changed(old: list[int], new: list[int]) -> list[tuple[int, tuple[Any, ...]]]:
        out = []
        for i, target in enumerate(old):
            expected = new_of[target] if target >= 0 else -1
            got = new[new_of[i]]
            if got != expected:
                out.append((i, link(got)))
        return out

    out = [(at, j1, j2, [link(b.links[j]) for j in range(j1, j2)]) for at, j1, j2 in chunks]
    if a.firsts is None or b.firsts is None:
        return _Step(chunks=out, retargets=changed(a.links, b.links))
    bf = b.firsts
    return _Step(
        chunks=out,
        retargets=changed(a.links, b.links),
        first_links=[[link(bf[j]) for j in range(j1, j2)] for _at, j1, j2 in chunks],
        first_retargets=changed(a.firsts, bf),
    )


def _by_phase(b: Sequence, chunks: list[tuple[int, int, int]]) -> list[int]:
    """A first choice of ends: a chunk in a backward pass, or of frees whose storages were born
    in one, runs in reverse layer order (the new layer comes first: -1); any other in layer
    order (+1)."""
    phase_at: list[str] = []
    phase = "init"
    for item in b.items:
        if item[0] == "m":
            phase = str(item[1])
        phase_at.append(phase)
    ends = []
    for _at, j1, j2 in chunks:
        where = {phase_at[j] for j in range(j1, j2)}
        if all(b.items[j][0] == "f" for j in range(j1, j2)):
            where = {phase_at[b.links[j]] for j in range(j1, j2) if b.links[j] >= 0}
        ends.append(-1 if where == {"backward"} else 1)
    return ends


def _oriented(
    pairs: list[tuple[Sequence, Sequence, list[tuple[int, int, int]]]],
) -> list[_Step]:
    """The steps with each chunk slid to one end of its run of repeats, the ends chosen (the
    same for every step) so that the fewest old events change what they link to: a layer's
    forward appended at the end of the stack pairs with its backward at the start."""
    n = len(pairs[0][2])
    ends = _by_phase(pairs[0][1], pairs[0][2])

    def steps(choice: list[int]) -> list[_Step]:
        out = []
        for a, b, chunks in pairs:
            slid = list(chunks)
            for k in range(n):
                slid[k] = _slid(b, slid, k, choice[k])
            out.append(_step(a, b, _relinked(a, b, slid)))
        return out

    best = steps(ends)
    cost = _cost(best)
    for _sweep in range(2):
        improved = False
        for k in range(n):
            if cost == (0, 0, 0):
                return best
            trial = [*ends[:k], -ends[k], *ends[k + 1 :]]
            got = steps(trial)
            c = _cost(got)
            if c < cost:
                ends, best, cost, improved = trial, got, c, True
        if not improved:
            break
    return best


def _cost(steps: list[_Step]) -> tuple[int, int, int]:
    """How far a choice of ends is from a rule: first whether the steps insert chunks of the
    same lengths, then how much their retarget counts differ (a rule needs the same chunks and
    retargets at every step), then how many retargets there are."""
    shapes = {tuple(j2 - j1 for _at, j1, j2, _l in s.chunks) for s in steps}
    counts = [len(s.retargets) for s in steps]
    return len(shapes) - 1, max(counts) - min(counts), sum(counts)


def _relinked(
    a: Sequence, b: Sequence, chunks: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """``chunks`` with each run of frees in ``b`` re-aligned by what its frees free: an old
    free is the one of ``b``'s run that frees the same (mapped) birth, the others are inserted.

    Frees are equal items whatever they free, so the diff can take one layer unit's frees for
    another's, or merge two insertions that meet in one run (a run freeing one storage per
    unit of two kinds: the new unit's first kind comes after the old first kinds, its second
    kind after the old second kinds). Where a run does not line up by its links, the diff's
    choice stays."""
    nb = len(b.items)
    inserted = [False] * nb
    for _at, j1, j2 in chunks:
        for j in range(j1, j2):
            inserted[j] = True
    new_of = [j for j in range(nb) if not inserted[j]]
    old_of = {j: i for i, j in enumerate(new_of)}
    changed = False
    j = 0
    while j < nb:
        if b.items[j][0] != "f":
            j += 1
            continue
        r1 = j
        while j < nb and b.items[j][0] == "f":
            j += 1
        if not any(inserted[r1:j]):
            continue
        by_link = {b.links[k]: k for k in range(r1, j)}
        want = []
        for k in range(r1, j):
            if inserted[k]:
                continue
            born = a.links[old_of[k]]
            want.append(by_link.get(new_of[born], -1) if born >= 0 else -1)
        if -1 in want or want != sorted(set(want)):
            continue
        for k in range(r1, j):
            inserted[k] = False
        keep = set(want)
        for k in range(r1, j):
            inserted[k] = k not in keep
        changed = True
    if not changed:
        return chunks
    out: list[tuple[int, int, int]] = []
    old = 0
    for k in range(nb):
        if not inserted[k]:
            old += 1
        elif out and out[-1][2] == k:
            out[-1] = (out[-1][0], out[-1][1], k + 1)
        else:
            out.append((old, k, k + 1))
    return out


def learn(s0: Sequence, s1: Sequence, s2: Sequence, *, n0: int, anchored: bool = False) -> Rule:
    """The growth rule from runs of ``n0``, ``n0 + 1`` and ``n0 + 2`` layer units;
    NotModelledError where the two steps disagree.

    ``anchored``: an old event the second step links to (or retargets) that lies in a chunk
    the first step inserted moves with that chunk (its drift the chunk's), whatever the first
    step linked to: a unit's events that link into the unit before it, where the chunk starts
    inside a unit (ZeRO-3's last layer prefetches nothing, so the inserted events begin at the
    prefetch), reach the first unit in the first step and the previous chunk from then on — the
    first unit is shorter (it frees no earlier unit's output) and the plain rule, a straight
    line through both steps, lands one event off from the third step on."""
    c1, c2 = _inserts(s0, s1), _inserts(s1, s2)
    if [e - j for _a, j, e in c1] != [e - j for _a, j, e in c2]:
        raise _refuse("the two layer steps insert different chunks")
    first, second = _oriented([(s0, s1, c1), (s1, s2, c2)])
    if _cost([first, second])[:2] != (0, 0):
        raise _refuse("the two layer steps insert different chunks")
    drift = _Drift(first, second, anchored=anchored)
    chunks = []
    for (at1, j1, e1, l1), (at2, j2, e2, l2) in zip(first.chunks, second.chunks, strict=True):
        if s1.items[j1:e1] != s2.items[j2:e2]:
            raise _refuse("a chunk differs between the two layer steps")
        chunks.append((at1, at2 - at1, [drift.link(x, y) for x, y in zip(l1, l2, strict=True)]))
    retargets = []
    for (i1, r1), (i2, r2) in zip(first.retargets, second.retargets, strict=True):
        retargets.append((*drift.place(i1, i2), drift.link(r1, r2)))
    template = [(j1, e1) for _at, j1, e1, _l in first.chunks]
    if (s0.firsts is None) != (s2.firsts is None) or (s1.firsts is None) != (s2.firsts is None):
        raise _refuse("some layer runs have a module order and some do not")
    plain = Rule(n0=n0, chunks=chunks, retargets=retargets, template=template)
    if first.first_links is None or second.first_links is None:
        return plain
    # the second links with the chunks the storage links placed; where they do not grow by a
    # rule (the chunks took another layer's place for new), the rule keeps no module order
    if len(first.first_retargets) != len(second.first_retargets):
        return plain
    try:
        return _with_second_links(plain, first, second, drift)
    except NotModelledError:
        return plain


def _with_second_links(plain: Rule, first: _Step, second: _Step, drift: _Drift) -> Rule:
    assert first.first_links is not None and second.first_links is not None
    first_links = [
        [drift.link(x, y) for x, y in zip(l1, l2, strict=True)]
        for l1, l2 in zip(first.first_links, second.first_links, strict=True)
    ]
    first_retargets = [
        (*drift.place(i1, i2), drift.link(r1, r2))
        for (i1, r1), (i2, r2) in zip(first.first_retargets, second.first_retargets, strict=True)
    ]
    return dataclasses.replace(plain, first_links=first_links, first_retargets=first_retargets)


class _Drift:
    """How an old event's index moves per layer step, from where it is in the two steps: a
    straight line through both; ``anchored``, with the drift of the first step's chunk that
    holds it in the second step's shorter run (:func:`learn`)."""

    def __init__(self, first: _Step, second: _Step, *, anchored: bool) -> None:
        # the first step's chunks in the run both steps share (its longer, the second's
        # shorter run) and how far each moves per step
        self.spans = (
            [
                (j1, e1, at2 - at1)
                for (at1, j1, e1, _l1), (at2, _j2, _e2, _l2) in zip(
                    first.chunks, second.chunks, strict=True
                )
            ]
            if anchored
            else []
        )

    def place(self, i1: int, i2: int) -> tuple[int, int]:
        """``(index at the first step, drift)`` of an old event at ``i1`` then ``i2``."""
        for j1, e1, d in self.spans:
            if j1 <= i2 < e1:
                return i2 - d, d
        return i1, i2 - i1

    def link(self, first: tuple[Any, ...], second: tuple[Any, ...]) -> tuple[Any, ...]:
        if first[0] != second[0] or (first[0] == "new" and first != second):
            raise _refuse("an event links differently in the two layer steps")
        if first[0] == "old":
            return ("old", *self.place(first[1], second[1]))
        return first


def grow(
    seq: Sequence, payload: list[Any], rule: Rule, *, n: int, to: int
) -> tuple[Sequence, list[Any]]:
    """``seq`` (the run at ``n`` layer units, ``payload[i]`` carried with ``items[i]``) grown to
    ``to`` units. The chunks' items and payloads are those of the run at ``rule.n0 + 1``, which
    is ``seq`` when ``n == rule.n0 + 1``.

    Each step is whole-array work (numpy) on where each item comes from (an item of ``seq``
    or of a chunk) and on the links; the items and payloads are looked up once at the end. The
    run of an 8B model grown to 36 layers is tens of thousands of events per step: an
    item-by-item loop took 0.08-0.15 s per growth (several per form)."""
    if n != rule.n0 + 1:
        raise ValueError("grow starts from the run the rule's template comes from")
    lens = np.array([e - s for s, e in rule.template], dtype=np.int64)
    # where each item comes from: seq's items, then each chunk's (its span of seq, by template)
    from_seq = np.arange(len(seq.items), dtype=np.int64)
    chunk_src = np.concatenate([from_seq[s:e] for s, e in rule.template] or [from_seq[:0]])
    chunk_offset = np.concatenate([np.arange(k, dtype=np.int64) for k in lens] or [from_seq[:0]])
    chunk_links, chunk_firsts = _link_tables(rule)
    # a rule without second links grows none (the caller checks the order another way)
    grows_firsts = seq.firsts is not None and rule.first_links is not None
    src, links = from_seq, np.asarray(seq.links, dtype=np.int64)
    firsts = np.asarray(seq.firsts, dtype=np.int64) if grows_firsts else None
    for step in range(n, to):
        d = step - rule.n0
        size = len(src)
        at = np.array([a + d * drift for a, drift, _l in rule.chunks], dtype=np.int64)
        if len(at) and (at.min() < 0 or at.max() > size):
            raise _refuse("a chunk would be inserted outside the run")
        start, new_of = _placed(at, lens, size)
        n_out = size + int(lens.sum())
        old_at = new_of[:size]
        out_src = np.empty(n_out, dtype=np.int64)
        out_src[old_at] = src
        out_src[np.repeat(start, lens) + chunk_offset] = chunk_src
        out_links = _moved(links, old_at, new_of, n_out)
        chunk_links.place(out_links, start, new_of, d, size)
        _retarget(out_links, rule.retargets, start, new_of, d, size)
        if firsts is not None:
            out_firsts = _moved(firsts, old_at, new_of, n_out)
            chunk_firsts.place(out_firsts, start, new_of, d, size)
            _retarget(out_firsts, rule.first_retargets, start, new_of, d, size)
            firsts = out_firsts
        src, links = out_src, out_links
    picks = src.tolist()
    grown = Sequence(
        items=[seq.items[i] for i in picks],
        links=links.tolist(),
        firsts=None if firsts is None else firsts.tolist(),
    )
    return grown, [payload[i] for i in picks]


def _link_tables(rule: Rule) -> tuple[_LinkTable, _LinkTable]:
    """The rule's chunk links and second links as arrays, made once per rule (a form's build
    grows the same rule several times: its check runs, the full run, the sized births)."""
    hit = _TABLES.get(id(rule))
    if hit is None or hit[0] is not rule:
        if len(_TABLES) >= 16:
            _TABLES.clear()
        chunks = _LinkTable.of([links for _at, _drift, links in rule.chunks])
        hit = _TABLES[id(rule)] = (rule, chunks, _LinkTable.of(rule.first_links or []))
    return hit[1], hit[2]


def _placed(at: np.ndarray, lens: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each chunk starts once all are inserted (chunk k of ``lens[k]`` items before old
    item ``at[k]``; chunks at one place in chunk order) and each old item's new index (``size +
    1`` entries: the end too)."""
    order = np.lexsort((np.arange(len(at)), at))
    cum = np.concatenate(([0], np.cumsum(lens[order])))
    start = np.empty(len(at), dtype=np.int64)
    start[order] = at[order] + cum[:-1]
    inserted = cum[np.searchsorted(at[order], np.arange(size + 1), side="right")]
    return start, np.arange(size + 1, dtype=np.int64) + inserted


def _moved(links: np.ndarray, old_at: np.ndarray, new_of: np.ndarray, n_out: int) -> np.ndarray:
    """The old items' links at their new places (-1 elsewhere and where they link nothing)."""
    out = np.full(n_out, -1, dtype=np.int64)
    out[old_at] = np.where(links >= 0, new_of[np.maximum(links, 0)], -1)
    return out


def _resolved(link: tuple[Any, ...], start: np.ndarray, new_of: np.ndarray, d: int,
              size: int) -> int:  # fmt: skip
    """One link's index in the grown run: none, an item of a chunk inserted now, or an old
    item (``index + d * drift`` in the run before)."""
    if link[0] == "none":
        return -1
    if link[0] == "new":
        return int(start[link[1]]) + link[2]
    old = link[1] + d * link[2]
    if not 0 <= old < size:
        raise _refuse("an event would link outside the run")
    return int(new_of[old])


def _retarget(out: np.ndarray, retargets: list[tuple[int, int, tuple[Any, ...]]],
              start: np.ndarray, new_of: np.ndarray, d: int, size: int) -> None:  # fmt: skip
    """The old events whose link changes when a unit is inserted (few: one at a time)."""
    for i, drift, link in retargets:
        old = i + d * drift
        if not 0 <= old < size:
            raise _refuse("a retargeted event lies outside the run")
        out[new_of[old]] = _resolved(link, start, new_of, d, size)


@dataclass(frozen=True)
class _LinkTable:
    """The chunks' links as arrays: per link its chunk, its offset in the chunk, its kind (0
    none, 1 an item of a chunk inserted now, 2 an old item) and its two numbers."""

    chunk: np.ndarray
    offset: np.ndarray
    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray

    @classmethod
    def of(cls, per_chunk: list[list[tuple[Any, ...]]]) -> _LinkTable:
        rows = [
            (k, o, _KINDS[link[0]], *(link[1:] if link[0] != "none" else (0, 0)))
            for k, links in enumerate(per_chunk)
            for o, link in enumerate(links)
        ]
        cols = np.array(rows, dtype=np.int64).reshape(len(rows), 5)
        return cls(*(np.ascontiguousarray(cols[:, j]) for j in range(5)))

    def place(self, out: np.ndarray, start: np.ndarray, new_of: np.ndarray, d: int,
              size: int) -> None:  # fmt: skip
        """Write each link's index in the grown run at its item's place in ``out``."""
        got = np.full(len(self.kind), -1, dtype=np.int64)
        new = self.kind == 1
        got[new] = start[self.a[new]] + self.b[new]
        old = self.kind == 2
        index = self.a[old] + d * self.b[old]
        if index.size and (index.min() < 0 or index.max() >= size):
            raise _refuse("an event would link outside the run")
        got[old] = new_of[index]
        out[start[self.chunk] + self.offset] = got


_KINDS = {"none": 0, "new": 1, "old": 2}
_TABLES: dict[int, tuple[Rule, _LinkTable, _LinkTable]] = {}  # id(rule) -> its link tables

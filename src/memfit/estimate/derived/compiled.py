"""A derived form's run compiled to integer arrays: the same numbers as the event-by-event replay
of :mod:`memfit.estimate.derived.form`, evaluated with numpy (torch-free).

Compiling a run reads its structure (no sizes) with array sorts, not an event-by-event loop
(~7 ms for 22k events where the loop took ~70 ms): each birth's event index and the event that
ends it (the next event under its key: its free, or a later birth), each phase's candidate
instants (its marks, and every birth inside it), and the order the tracker's dicts keep. At a
batch size, the sizes are one array expression, the live total at every instant one cumulative
sum, each phase's peak one argmax over its instants (the first instant wins a tie, as in the
tracker), and the breakdown at a peak one mask over the births live there. The reserved bytes
come from the caching-allocator model fed the same events (:func:`reserved_bytes`): compiled
(numba, :mod:`memfit.estimate.allocator.jit`), all events in one call; in Python pool by
pool, since without a capacity the allocator never gives a segment back, so its peak is the
sum of the two pools' segments, and a pool whose events did not change since the last replay
is not replayed again. ``tests/estimate/derived/test_compiled.py`` compares every
number with the reference replay.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from memfit.estimate.allocator.fast import (
    compiled_replay,
    count_python_replay,
    simulate_default_arrays,
)
from memfit.estimate.trace.flat import Flat
from memfit.hardware.cuda_allocator import SMALL_SIZE_BYTES

#: The caching allocator's block size: the tracker rounds every storage up to it.
BLOCK_BYTES = 512
#: Phases a trace records but does not report (before the step, after it).
UNREPORTED_PHASES = ("init", "end")

_COMPILED: dict[int, tuple[dict[str, Any], Compiled]] = {}


def compile_run(run: dict[str, Any]) -> Compiled:
    """``run`` compiled (once per run object in this process)."""
    hit = _COMPILED.get(id(run))
    if hit is not None and hit[0] is run:
        return hit[1]
    c = Compiled(run)
    _COMPILED[id(run)] = (run, c)
    return c


class Compiled:
    """One run's structure as arrays (see the module docstring)."""

    def __init__(self, run: dict[str, Any]) -> None:
        ev = np.asarray(run["ev"], dtype=np.int64)
        n = len(ev)
        birth_ev, death_ev, chain = _lifetimes(ev)
        keys = ev[birth_ev] >> 1
        self.phases = _phase_instants(run, birth_ev, n)
        self.n_events = n
        self.a0 = np.asarray(run["a0"], dtype=np.int64)
        self.a1 = np.asarray(run["a1"], dtype=np.int64)
        self.birth_ev = birth_ev
        self.death_ev = death_ev
        self.dies = np.flatnonzero(self.death_ev < n)
        self.chain = chain
        if "order" in run and len(keys):  # a rank rewrite's module order (derived/record.py)
            self.chain = np.asarray(run["order"], dtype=np.int64)[keys]
        self.comp = np.asarray(run["comp"], dtype=np.int64)[keys] if len(keys) else keys
        self.mod = np.asarray(run["mod"], dtype=np.int64)[keys] if len(keys) else keys
        ignored = np.zeros(len(run["comp"]), dtype=bool)
        if len(run["ignored"]):  # a list, or an array where the form came from its sidecar
            ignored[np.asarray(run["ignored"], dtype=np.int64)] = True
        self.counted = ~ignored[keys] if len(keys) else np.zeros(0, dtype=bool)
        self.comps: list[str] = list(run["comps"])
        self.mods: list[str] = list(run["mods"])
        self.const: Flat = dict(run["const"])
        self._pool_memo: dict[bool, tuple[bytes, int]] = {}
        # every birth and death in event order (a death at event i sorts before a birth there)
        at = np.concatenate([self.birth_ev * 2 + 1, self.death_ev[self.dies] * 2])
        who = np.concatenate([np.arange(len(self.birth_ev), dtype=np.int64), self.dies])
        order = np.argsort(at, kind="stable")
        self._order_who = who[order]
        self._order_born = (at[order] & 1).astype(np.uint8)
        self._event_heads: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._death_at = self.death_ev[self.dies]
        # the births in the order a peak's breakdown lists them (by chain, then birth order)
        by_chain = np.argsort(self.chain, kind="stable")
        self._by_chain = by_chain
        self._chain_birth = self.birth_ev[by_chain]
        self._chain_death = self.death_ev[by_chain]
        self._chain_comp = self.comp[by_chain]
        self._chain_mod = self.mod[by_chain]
        self._chain_counted = self.counted[by_chain]
        self._keys: dict[str, tuple[list[str], list[str]]] = {}  # phase -> its comp, mod keys

    # ------------------------------------------------------------------ sizes and peaks
    def sizes(self, x: int) -> np.ndarray:
        """Each birth's size at batch size ``x``, rounded up to 512 B blocks."""
        # (v + 511) & -512 == -(-v // 512) * 512 for every int64 v (a power of two; no division)
        return (self.a0 + self.a1 * x + (BLOCK_BYTES - 1)) & -BLOCK_BYTES

    def live_totals(self, sizes: np.ndarray) -> np.ndarray:
        """Live bytes at every instant 0..n (instant t: after t events)."""
        delta = np.zeros(self.n_events, dtype=np.int64)
        delta[self.birth_ev] = sizes
        delta[self._death_at] -= sizes[self.dies]
        out = np.zeros(self.n_events + 1, dtype=np.int64)
        np.cumsum(delta, out=out[1:])
        return out

    def peaks(self, totals: np.ndarray) -> list[tuple[str, int, int]]:
        """Per reported phase, in the tracker's order: (phase, peak bytes, instant)."""
        out = []
        for phase, at in self.phases:
            vals = totals[at]
            j = int(np.argmax(vals))
            out.append((phase, int(vals[j]), int(at[j])))
        return out

    def peak_live_bytes(self, x: int) -> int:
        """The largest live total of any reported phase at batch size ``x``."""
        peaks = self.peaks(self.live_totals(self.sizes(x)))
        return max((p for _phase, p, _at in peaks), default=0)

    # ------------------------------------------------------------------ the flat numbers
    def flat(
        self,
        x: int,
        workspaces: tuple[int, ...],
        *,
        reserved: bool = True,
        extra: np.ndarray | None = None,
    ) -> Flat:
        """The flat numbers at batch size ``x`` (those of ``form.replay_run``); without
        ``reserved`` the allocator replay is left out (no ``reserved`` key). ``extra``: bytes
        added to each birth's size (CUDA reduction staging, ``derived/staging.py``)."""
        sizes = self.sizes(x) if extra is None else self.sizes(x) + extra
        peaks = self.peaks(self.live_totals(sizes))
        flat: Flat = dict(self.const)
        order = sorted(range(len(peaks)), key=lambda k: peaks[k][2])  # stable: ties keep order
        chain_sizes = np.where(self._chain_counted, sizes[self._by_chain], 0)
        for k in order:
            phase, total, t = peaks[k]
            flat[f"phase/{phase}/peak"] = total
            comp_keys, mod_keys = self._phase_keys(phase)
            # the births live at t, by chain (the tracker's dict order), then birth order
            live = np.flatnonzero((self._chain_birth < t) & (t <= self._chain_death))
            n = chain_sizes[live]
            comp_sum = np.zeros(len(comp_keys), dtype=np.int64)
            np.add.at(comp_sum, self._chain_comp[live], n)
            flat.update(zip(comp_keys, comp_sum.tolist(), strict=True))
            mods = self._chain_mod[live]
            mod_sum = np.zeros(len(mod_keys), dtype=np.int64)
            np.add.at(mod_sum, mods, n)
            sums = mod_sum.tolist()
            for m in _first_appearance(mods, len(mod_keys)).tolist():
                flat[mod_keys[m]] = sums[m]
        if reserved:
            flat["reserved"] = self.reserved_bytes(sizes, workspaces)
        return flat

    def _phase_keys(self, phase: str) -> tuple[list[str], list[str]]:
        """The flat keys of ``phase``'s breakdown: per component, per module (made once)."""
        keys = self._keys.get(phase)
        if keys is None:
            keys = self._keys[phase] = (
                [f"phase/{phase}/comp/{name}" for name in self.comps],
                [f"phase/{phase}/mod/{name}" for name in self.mods],
            )
        return keys

    # ------------------------------------------------------------------ the allocator
    def reserved_bytes(self, sizes: np.ndarray, workspaces: tuple[int, ...]) -> int:
        """``simulate(workspaces + events).peak_reserved_bytes``, pool by pool (the compiled
        replay of every event at once where numba is installed; else pool by pool in Python,
        a pool whose events did not change since the last call not replayed again)."""
        events = self._all_events(sizes, workspaces)
        got = compiled_replay(*events)
        if got is not None:
            return got.peak_reserved_bytes
        count_python_replay(len(events[1]))  # the pools' replays below count as this one
        small = (sizes > 0) & (sizes <= SMALL_SIZE_BYTES)  # sizes are whole 512 B blocks
        large = sizes > SMALL_SIZE_BYTES
        total = 0
        for is_small, mask in ((True, small), (False, large)):
            ws = tuple(w for w in workspaces if w > 0 and (w <= SMALL_SIZE_BYTES) == is_small)
            sig = hashlib.blake2b(
                repr(ws).encode() + mask.tobytes() + sizes[mask].tobytes(), digest_size=16
            ).digest()
            memo = self._pool_memo.get(is_small)
            if memo is not None and memo[0] == sig:
                total += memo[1]
                continue
            got = simulate_default_arrays(*self._pool_events(mask, sizes, ws), compiled=False)
            self._pool_memo[is_small] = (sig, got.peak_reserved_bytes)
            total += got.peak_reserved_bytes
        return total

    def _all_events(
        self, sizes: np.ndarray, workspaces: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """:meth:`_pool_events` of both pools in one list: each pool sees its own workspaces
        first, then its events in order, as in its own list; zero-byte births allocate
        nothing. Without a capacity nothing is given back, so the peak reserved is the sum of
        the pools' (and :meth:`reserved_bytes` the same number either way)."""
        n_births, n_ws = len(self.birth_ev), len(workspaces)
        head = self._event_heads.get(n_ws)
        if head is None:
            is_alloc = np.concatenate([np.ones(n_ws, dtype=np.uint8), self._order_born])
            keys = np.arange(n_births, n_births + n_ws, dtype=np.int64)
            head = self._event_heads[n_ws] = (is_alloc, np.concatenate([keys, self._order_who]))
        n_bytes = np.empty(n_ws + len(self._order_who), dtype=np.int64)
        n_bytes[:n_ws] = workspaces
        np.take(sizes, self._order_who, out=n_bytes[n_ws:])
        return head[0], head[1], n_bytes, n_births + n_ws

    def _pool_events(
        self, mask: np.ndarray, sizes: np.ndarray, workspaces: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The pool's events in order, as arrays (malloc?, key, bytes, number of keys): its
        workspaces, then each birth of ``mask`` and its death, keyed by birth (a key born again
        while live is freed first, as the tracker records it); workspace i has key
        ``n_births + i``."""
        keep = mask[self._order_who]
        who = self._order_who[keep]
        born = self._order_born[keep]
        n_births = len(self.birth_ev)
        n_ws = len(workspaces)
        is_alloc = np.concatenate([np.ones(n_ws, dtype=np.uint8), born])
        keys = np.concatenate([np.arange(n_births, n_births + n_ws, dtype=np.int64), who])
        n_bytes = np.concatenate(
            [np.asarray(workspaces, dtype=np.int64), np.where(born, sizes[who], 0)]
        )
        return is_alloc, keys, n_bytes, n_births + n_ws


def _first_appearance(values: np.ndarray, n_values: int) -> np.ndarray:
    """The distinct ``values`` (each in ``0..n_values-1``) in the order each first appears."""
    first = np.full(n_values, len(values), dtype=np.int64)
    np.minimum.at(first, values, np.arange(len(values), dtype=np.int64))
    present = np.flatnonzero(first < len(values))
    return present[np.argsort(first[present])]


def _lifetimes(ev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per birth (``ev[i]`` with the free bit clear, in event order): its event index, the event
    that ends it (the next event under its key: its free, or a birth that replaces it; ``n``
    if none) and its chain (the event index of the first birth of its run of births under one
    key with no free between: where the tracker's live dict keeps the key's entry)."""
    n = len(ev)
    keys = ev >> 1
    by_key = np.argsort(keys, kind="stable")  # each key's events, in event order
    k_sorted = keys[by_key]
    same_next = np.zeros(n, dtype=bool)
    if n:
        same_next[:-1] = k_sorted[1:] == k_sorted[:-1]
    next_ev = np.full(n, n, dtype=np.int64)
    next_ev[by_key[:-1][same_next[:-1]]] = by_key[1:][same_next[:-1]]
    born_sorted = (ev[by_key] & 1) == 0
    # a birth continues its chain when the event before it under its key is a birth
    continues = np.zeros(n, dtype=bool)
    if n:
        continues[1:] = same_next[:-1] & born_sorted[:-1] & born_sorted[1:]
    starts = np.where(continues, 0, np.arange(n, dtype=np.int64))
    np.maximum.accumulate(starts, out=starts)
    chain_ev = np.empty(n, dtype=np.int64)
    chain_ev[by_key] = by_key[starts]
    birth_ev = np.flatnonzero((ev & 1) == 0).astype(np.int64)
    return birth_ev, next_ev[birth_ev], chain_ev[birth_ev]


def _phase_instants(
    run: dict[str, Any], birth_ev: np.ndarray, n: int
) -> list[tuple[str, np.ndarray]]:
    """Each reported phase's candidate instants, in the order the tracker first saw each phase
    (its dict order): the instant of each of its marks and the instant after each birth while it
    is the current phase (the last one marked at or before the birth), in event order (a mark
    at event i before the birth there)."""
    marks = sorted(((int(i), str(p)) for i, p in run["marks"]), key=lambda m: m[0])
    marks = [(i, p) for i, p in marks if 0 <= i <= n]
    names: dict[str, int] = {}
    for _i, p in marks:
        names.setdefault(p, len(names))
    at_mark = np.asarray([i for i, _p in marks], dtype=np.int64)
    mark_pid = np.asarray([names[p] for _i, p in marks], dtype=np.int64)
    # the phase current at each birth (-1: "init", before any mark)
    last = np.searchsorted(at_mark, birth_ev, side="right") - 1
    birth_pid = np.where(last >= 0, mark_pid[np.maximum(last, 0)], -1) if len(at_mark) else last
    order_key = np.concatenate([2 * at_mark, 2 * birth_ev + 1])
    pid = np.concatenate([mark_pid, birth_pid])
    instant = np.concatenate([at_mark, birth_ev + 1])
    seq = np.argsort(order_key, kind="stable")
    pid, instant = pid[seq], instant[seq]
    grouped = np.argsort(pid, kind="stable")
    pid, instant = pid[grouped], instant[grouped]
    bounds = np.searchsorted(pid, np.arange(len(names) + 1, dtype=np.int64))
    return [
        (p, instant[bounds[k] : bounds[k + 1]])
        for p, k in names.items()
        if p not in UNREPORTED_PHASES
    ]

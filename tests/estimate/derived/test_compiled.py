"""The compiled evaluator gives the reference replay's flat numbers, key for key and in order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from memfit.estimate.derived import form
from memfit.estimate.derived.compiled import compile_run
from memfit.units import MiB

WORKSPACES = (8 * MiB + 512 * 1024, 1 * MiB)


def _run(seed: int, n_events: int = 600, *, rebirths: bool = False) -> dict[str, Any]:
    """A random recorded run: births and frees of up to 40 keys, sizes a0 + a1 * batch from a
    few bytes to tens of MiB, phase marks (one phase twice), ignored keys, repeated mods; with
    ``rebirths``, also births of live keys and frees of dead ones (the tracker's counting
    handles them, the allocator replay refuses them)."""
    rng = random.Random(seed)
    ev: list[int] = []
    a0: list[int] = []
    a1: list[int] = []
    live: set[int] = set()
    marks: list[list[Any]] = []
    phases = ["forward", "backward", "optimizer", "forward", "backward", "end"]
    cut = sorted(rng.sample(range(1, n_events), len(phases)))
    for i in range(n_events):
        while cut and cut[0] == i:
            cut.pop(0)
            marks.append([len(ev), phases[len(marks)]])
        key = rng.randrange(40)
        if key in live and (not rebirths or rng.random() < 0.7):
            ev.append(key << 1 | 1)
            live.discard(key)
            continue
        if rebirths and key not in live and rng.random() < 0.1:
            ev.append(key << 1 | 1)  # a free of a key that is not live: counted as nothing
            continue
        ev.append(key << 1)
        live.add(key)
        big = rng.random() < 0.4
        a0.append(rng.randrange(0, 24 * MiB if big else 600 * 1024))
        a1.append(rng.choice([0, 0, rng.randrange(1, 3 * MiB if big else 4096)]))
    comps = ["parameters", "activations", "temporary"]
    return {
        "counts": {"layers": 2},
        "ev": ev,
        "a0": a0,
        "a1": a1,
        "marks": marks,
        "comps": comps,
        "mods": ["m.a", "m.b", "m.c", "loss"],
        "comp": [rng.randrange(len(comps)) for _ in range(40)],
        "mod": [rng.randrange(4) for _ in range(40)],
        "ignored": sorted(rng.sample(range(40), 3)),
        "const": {"n_params": 123, "n_trainable": 7, "n_ops": 5},
    }


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_replay_gives_the_reference_flat_numbers_in_the_same_order(
    seed: int,
) -> None:
    run = _run(seed)
    for x in (1, 2, 7, 33):
        want = form.replay_run(run, x, WORKSPACES)
        got = compile_run(run).flat(x, WORKSPACES)
        assert got == want
        assert list(got) == list(want)  # the breakdown's module order follows the tracker's


@pytest.mark.parametrize("seed", range(6))
def test_a_key_born_again_while_live_peaks_as_the_tracker_counts_it(seed: int) -> None:
    run = _run(seed, rebirths=True)
    c = compile_run(run)
    for x in (1, 5):
        sizes = form.sizes_at(run, x)
        want = form._phase_peaks(run["ev"], sizes, form.phase_marks(run))
        got = {p: (v, at) for p, v, at in c.peaks(c.live_totals(c.sizes(x)))}
        assert got == want
        flat = c.flat(x, WORKSPACES, reserved=False)
        assert "reserved" not in flat
        want_flat = form.replay_run(run, x, WORKSPACES, reserved=False)
        assert flat == want_flat and list(flat) == list(want_flat)


@pytest.mark.parametrize("seed", range(6))
def test_phases_marked_at_one_instant_and_at_the_end_peak_as_the_tracker_counts_them(
    seed: int,
) -> None:
    run = _run(seed, rebirths=True)
    n = len(run["ev"])
    at = sorted(random.Random(seed).sample(range(1, n), 2))
    # a rank rewrite's optimizer phase starts and ends with no event between (two marks at one
    # instant), a phase marked at the very end, one marked at event 0
    run["marks"] = sorted(
        [*run["marks"], [0, "warmup"], [at[0], "optim"], [at[0], "after"], [n, "last"]],
        key=lambda m: m[0],
    )
    c = compile_run(run)
    for x in (1, 6):
        sizes = form.sizes_at(run, x)
        want = form._phase_peaks(run["ev"], sizes, form.phase_marks(run))
        got = {p: (v, t) for p, v, t in c.peaks(c.live_totals(c.sizes(x)))}
        assert got == want and list(got) == list(want)
        flat = c.flat(x, WORKSPACES, reserved=False)
        want_flat = form.replay_run(run, x, WORKSPACES, reserved=False)
        assert flat == want_flat and list(flat) == list(want_flat)


def test_an_unchanged_pool_is_not_replayed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_NO_JIT", "1")  # the Python replay's memo (compiled: one call)
    run = _run(3)
    c = compile_run(run)
    first = c.flat(4, WORKSPACES)["reserved"]
    calls: list[int] = []
    from memfit.estimate.derived import compiled as module

    real = module.simulate_default_arrays
    monkeypatch.setattr(
        module, "simulate_default_arrays", lambda *ev, **kw: calls.append(1) or real(*ev, **kw)
    )
    assert c.flat(4, WORKSPACES)["reserved"] == first
    assert calls == []  # both pools' events are those of the last replay
    c.flat(5, WORKSPACES)
    assert 1 <= len(calls) <= 2


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_replay_of_all_events_at_once_gives_the_pool_by_pool_reserved_bytes(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("numba")
    from memfit.estimate.allocator import fast as allocator_fast
    from memfit.estimate.allocator import jit as allocator_jit

    assert allocator_jit.load_kernel() is not None
    run = _run(seed, n_events=3000)
    for x in (1, 2, 7, 33):
        before = allocator_fast.REPLAYS["compiled"]
        got = compile_run(run).flat(x, (*WORKSPACES, 0, 4096))
        assert allocator_fast.REPLAYS["compiled"] == before + 1
        monkeypatch.setenv("MEMFIT_NO_JIT", "1")
        assert got == form.replay_run(run, x, (*WORKSPACES, 0, 4096))
        monkeypatch.delenv("MEMFIT_NO_JIT")

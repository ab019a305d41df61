"""A form's arrays beside its JSON load back as the same form, and are trusted only while they
match the JSON file."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfit.estimate.derived import cache, sidecar
from memfit.estimate.derived.compiled import Compiled
from memfit.estimate.derived.entry import write_entry

WORKSPACES = (8 * 1024 * 1024, 1024 * 1024)


def _run(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ev, a0, a1, live = [], [], [], set()
    for _ in range(400):
        key = rng.randrange(30)
        if key in live:
            ev.append(key << 1 | 1)
            live.discard(key)
        else:
            ev.append(key << 1)
            live.add(key)
            a0.append(rng.randrange(1, 8 << 20))
            a1.append(rng.choice([0, rng.randrange(1, 1 << 20)]))
    return {
        "counts": {"layers": 2}, "ev": ev, "a0": a0, "a1": a1,
        "marks": [[0, "forward"], [150, "backward"], [300, "optimizer"]],
        "comps": ["parameters", "activations"], "mods": ["m.a", "m.b", "loss"],
        "comp": [rng.randrange(2) for _ in range(30)], "mod": [rng.randrange(3) for _ in range(30)],
        "ignored": [3, 7], "order": list(range(30))[::-1], "stage": [[5, [1, 2], [0]]],
        "const": {"n_params": 10, "n_trainable": 2, "n_ops": 3},
    }  # fmt: skip


def _form() -> dict[str, Any]:
    return {"runs": [_run(1)], "exact": {"1": [_run(2)]}, "points": [1, 2, 3], "notes": ["n"]}


def _record(path: Path) -> Any:
    """The record an entry holds (the JSON after its header line)."""
    return json.loads(path.read_bytes().partition(b"\n")[2])


def _plain(x: Any) -> Any:
    """``x`` with arrays as lists (to compare a loaded form with the stored one)."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    cache.store("k1", _form())
    return tmp_path / "derived" / "k1.json"


def test_a_stored_form_loads_back_from_its_arrays_as_the_same_form(store: Path) -> None:
    assert sidecar.path_for(store).exists()
    want = _record(store)
    got = cache.load("k1")
    assert got is not None and isinstance(got["runs"][0]["ev"], np.ndarray)
    assert isinstance(got["exact"]["1"][0]["order"], np.ndarray)
    assert _plain(got) == want and list(got) == list(want)
    for w, g in ((want["runs"][0], got["runs"][0]), (want["exact"]["1"][0], got["exact"]["1"][0])):
        assert list(g) == list(w)
        for x in (1, 9):
            flat, flat_from_arrays = (
                Compiled(w).flat(x, WORKSPACES),
                Compiled(g).flat(x, WORKSPACES),
            )
            assert flat == flat_from_arrays and list(flat) == list(flat_from_arrays)


def test_arrays_that_no_longer_match_the_json_are_ignored_and_written_again(store: Path) -> None:
    data = _record(store)
    data["runs"][0]["a0"][0] += 512  # the JSON changes after the sidecar was written
    payload = json.dumps(data).encode()  # the JSON alone rewritten, as a valid entry
    write_entry(store, payload, kind="derived", key="k1", fmt=cache.FORMAT)
    os.utime(store, ns=(1, 1))
    got = cache.load("k1")
    assert got is not None and got["runs"][0]["a0"][0] == data["runs"][0]["a0"][0]
    assert isinstance(got["runs"][0]["a0"], list)  # read from the JSON
    again = cache.load("k1")  # from the sidecar written by that load
    assert again is not None and isinstance(again["runs"][0]["a0"], np.ndarray)
    assert _plain(again) == data


def test_an_unreadable_sidecar_is_ignored_with_a_note_and_written_again(store: Path) -> None:
    sidecar.path_for(store).write_bytes(b"not a zip file")
    problems: list[str] = []
    got = cache.load("k1", problems=problems)
    assert got is not None and _plain(got) == _record(store)
    assert problems == [
        "cache entry derived/k1.arrays.npz was corrupt (not a memfit cache entry): rebuilt"
    ]
    again = cache.load("k1", problems=problems)  # from the sidecar that load wrote again
    assert again is not None and isinstance(again["runs"][0]["ev"], np.ndarray)
    assert len(problems) == 1


def test_lists_that_are_not_int64_integers_stay_in_the_json_text(store: Path) -> None:
    data = _form()
    data["runs"][0]["a0"][0] = 1 << 70  # beyond int64
    data["runs"][0]["a1"][0] = 0.5  # not an integer
    cache.store("k2", data)
    got = cache.load("k2")
    assert got is not None and isinstance(got["runs"][0]["a0"], list)
    assert isinstance(got["runs"][0]["a1"], list) and isinstance(got["runs"][0]["ev"], np.ndarray)
    assert _plain(got) == _record(store.parent / "k2.json")


def test_a_refusal_has_no_sidecar(store: Path) -> None:
    cache.store("k3", {"refused": "a factory model"})
    assert not sidecar.path_for(store.parent / "k3.json").exists()
    assert cache.load("k3") == {"refused": "a factory model", "format": cache.FORMAT, "key": "k3"}

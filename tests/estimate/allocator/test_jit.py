"""The compiled (numba) default-configuration replay gives the Python replay's result, field for
field: on random event lists of many shapes, on lists the kernel hands back to Python (malformed,
too large, odd keys), and on the derived forms of a real (tiny) model, whole estimates included."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfit.errors import SpecError
from memfit.estimate.allocator import fast as allocator_fast
from memfit.estimate.allocator import jit as allocator_jit
from memfit.estimate.allocator.caching import CachingAllocatorSim, simulate
from memfit.estimate.allocator.fast import simulate_default, simulate_default_python
from memfit.units import GiB, MiB

numba = pytest.importorskip("numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    """The kernel compiled (or loaded) in this process first: a command's replay never compiles
    it in the foreground (``test_a_command_never_waits_for_the_first_compile``)."""
    allocator_jit.load_kernel(wait=True)


Events = list[tuple[str, int, int]]


def _events(seed: int, n: int, *, lo: float, hi: float, p_free: float, keys: str) -> Events:
    """Random births and frees of sizes 2**uniform(lo, hi) bytes (a few exactly 0 B), frees of
    random live keys; ``keys``: "dense" (0, 1, 2, ...), "sparse" (large and negative ints) or
    "reused" (a freed key is born again)."""
    rng = random.Random(seed)
    live: list[int] = []
    dead: list[int] = []
    events: Events = []
    for i in range(n):
        if live and rng.random() < p_free:
            key = live.pop(rng.randrange(len(live)))
            events.append(("f", key, 0))
            dead.append(key)
            continue
        if keys == "reused" and dead and rng.random() < 0.5:
            key = dead.pop(rng.randrange(len(dead)))
        elif keys == "sparse":
            key = rng.choice((-1, 1)) * (i * 7919 + rng.randrange(1 << 40))
        else:
            key = i
        size = 0 if rng.random() < 0.02 else int(2 ** rng.uniform(lo, hi))
        events.append(("a", key, size))
        live.append(key)
    return events


def _general(events: Events) -> object:
    sim = CachingAllocatorSim()
    for kind, key, n in events:
        if kind == "a":
            sim.malloc(key, n)
        else:
            sim.free(key)
    return sim.result()


SHAPES = {
    "mixed": dict(lo=4, hi=26, p_free=0.45),  # both pools, own segments, 20 MiB segments
    "small": dict(lo=4, hi=20, p_free=0.4),  # the small pool only: hundreds of free blocks
    "large": dict(lo=20.1, hi=28, p_free=0.45),  # the large pool only (> 1 MiB)
    "split": dict(lo=20, hi=23.3, p_free=0.5),  # 1-10 MiB: 20 MiB segments split and merged
    "growing": dict(lo=9, hi=24, p_free=0.3),  # a live set that keeps growing
}


@pytest.mark.parametrize("keys", ["dense", "sparse", "reused"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_replay_matches_the_python_replay_on_random_events(
    seed: int, shape: str, keys: str
) -> None:
    events = _events(seed, 3000, keys=keys, **SHAPES[shape])
    got = allocator_jit.replay_events(events)
    assert got is not None, "the kernel did not answer"
    assert got == simulate_default_python(events) == _general(events)


@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_replay_matches_where_its_tables_grow_many_times(seed: int) -> None:
    # 40k events of the small pool: thousands of blocks and free blocks (the tables start at
    # 256 rows and double)
    events = _events(seed, 40_000, keys="dense", lo=9, hi=19, p_free=0.42)
    assert allocator_jit.replay_events(events) == simulate_default_python(events)


def test_a_process_loads_the_kernel_after_a_few_long_python_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = _events(0, allocator_fast.JIT_MIN_EVENTS, keys="dense", **SHAPES["mixed"])
    want = simulate_default_python(events)
    monkeypatch.setattr(allocator_jit, "_KERNEL", [])  # this process has not loaded it
    monkeypatch.setitem(allocator_fast.REPLAYS, "python_long", 0)
    for _ in range(allocator_fast.JIT_AFTER_LONG_REPLAYS):
        before = dict(allocator_fast.REPLAYS)
        assert simulate(events) == want
        assert allocator_fast.REPLAYS["python"] == before["python"] + 1
        assert simulate(events[:10]) == simulate_default_python(events[:10])  # short: Python
    assert not allocator_jit.kernel_loaded()
    before = dict(allocator_fast.REPLAYS)
    assert simulate(events) == want
    assert allocator_fast.REPLAYS["compiled"] == before["compiled"] + 1
    assert allocator_jit.kernel_loaded()  # loaded now: short lists take it too
    assert simulate(events[:10]) == simulate_default_python(events[:10])
    assert allocator_fast.REPLAYS["compiled"] == before["compiled"] + 2


def test_memfit_no_jit_forces_the_python_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    events = _events(1, 3000, keys="dense", **SHAPES["mixed"])
    monkeypatch.setenv("MEMFIT_NO_JIT", "1")
    assert allocator_jit.load_kernel() is None and allocator_jit.replay_events(events) is None
    before = dict(allocator_fast.REPLAYS)
    assert simulate_default(events) == _general(events)
    assert allocator_fast.REPLAYS["python"] == before["python"] + 1
    assert allocator_fast.REPLAYS["compiled"] == before["compiled"]
    monkeypatch.setenv("MEMFIT_NO_JIT", "0")  # 0 (or empty) leaves it on
    assert allocator_jit.load_kernel() is not None


def test_a_malformed_list_raises_the_python_replays_error_with_the_kernel_loaded() -> None:
    assert allocator_jit.load_kernel() is not None
    pad = [("a", 100 + i, 4096) for i in range(allocator_fast.JIT_MIN_EVENTS)]
    with pytest.raises(SpecError, match=r"malloc of key 1 at event 2001: the key is still"):
        simulate_default([*pad, ("a", 1, 10), ("a", 1, 10)])
    with pytest.raises(SpecError, match=r"free of key 3 at event 2000: the key is not allocated"):
        simulate_default([*pad, ("f", 3, 0)])
    with pytest.raises(SpecError, match=r"event 2000 has kind 'x': use 'a' \(allocate\) or 'f'"):
        simulate_default([*pad, ("x", 1, 10)])
    with pytest.raises(SpecError, match=r"allocation size \(-1\) must be >= 0 bytes"):
        simulate_default([*pad, ("a", 1, -1)])


def test_requests_beyond_the_kernels_range_are_replayed_in_python() -> None:
    # 1 TiB and more: the kernel's packed free-list keys stop there; past int64 too
    events = [("a", 1, 600 * GiB), ("a", 2, 600 * GiB), ("f", 1, 0), ("a", 3, 2**63)]
    assert allocator_jit.replay_events(events) is None
    big = [*events, *(("a", 10 + i, 512) for i in range(allocator_fast.JIT_MIN_EVENTS))]
    before = dict(allocator_fast.REPLAYS)
    assert simulate_default(big) == _general(big)
    assert allocator_fast.REPLAYS["python"] == before["python"] + 1
    # keys that are not plain integers go to Python too (its dict tells 1 from "1")
    assert allocator_jit.replay_events([("a", "1", 10), ("a", 1, 10)]) is None


def test_array_events_with_keys_outside_the_table_are_refused_by_the_kernel() -> None:
    ones = np.ones(2, dtype=np.uint8)
    assert allocator_jit.replay_arrays(ones, np.array([0, 5]), np.array([10, 10]), 2) is None
    got = allocator_fast.simulate_default_arrays(ones, np.array([0, 5]), np.array([10, 10]), 2)
    assert got == _general([("a", 0, 10), ("a", 5, 10)])


# -- derived forms of a real model -------------------------------------------------------------

TINY_GRANITE = dict(
    model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=64,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def granite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers")
    from memfit.models import resolve_model

    folder = tmp_path_factory.mktemp("granite-jit")
    (folder / "config.json").write_text(json.dumps(TINY_GRANITE))
    return resolve_model(str(folder))


def _train(b: int, **kw: Any) -> Any:
    from memfit.spec import WorkloadSpec

    return WorkloadSpec(mode="train", batch_size=b, seq_len=64, precision="bf16-true", **kw)


def test_a_real_forms_flat_numbers_are_the_same_with_and_without_the_compiled_replay(
    granite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.derived import cache, estimate_derived
    from memfit.estimate.derived.compiled import Compiled

    estimate_derived(granite, _train(1))  # builds the form, or reads the one built before
    form = cache.load(cache.variant_key(granite.config, _train(1)))
    assert form is not None and form["runs"]
    workspaces = (8 * MiB + 512 * 1024, 1 * MiB, 4096)
    assert allocator_jit.load_kernel() is not None
    for run in form["runs"]:
        compiled_flat = [Compiled(run).flat(x, workspaces) for x in (1, 3, 17, 250)]
        monkeypatch.setenv("MEMFIT_NO_JIT", "1")
        python_flat = [Compiled(run).flat(x, workspaces) for x in (1, 3, 17, 250)]
        monkeypatch.delenv("MEMFIT_NO_JIT")
        assert compiled_flat == python_flat


def test_whole_estimates_are_the_same_with_and_without_the_compiled_replay(
    granite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.derived import estimate_derived
    from memfit.hardware import get_gpu

    gpu = get_gpu("L4")
    estimate_derived(granite, _train(1), gpu=gpu)  # builds the form (its traces replay too)
    assert allocator_jit.load_kernel() is not None  # loaded: short lists take it too

    def run(b: int) -> Any:  # the estimate, less its timing
        e = estimate_derived(granite, _train(b), gpu=gpu)
        return dataclasses.replace(e, trace={**e.trace, "wall_s": None})

    before = allocator_fast.REPLAYS["compiled"]
    compiled = [run(b) for b in (2, 5, 9)]
    assert allocator_fast.REPLAYS["compiled"] > before
    monkeypatch.setenv("MEMFIT_NO_JIT", "1")
    before = allocator_fast.REPLAYS["python"]
    python = [run(b) for b in (2, 5, 9)]
    assert allocator_fast.REPLAYS["python"] > before
    assert compiled == python


def test_import_memfit_does_not_import_numba() -> None:
    code = "import sys, memfit, memfit.estimate.allocator.fast; print('numba' in sys.modules)"
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.strip() == "False"


def test_loading_the_kernel_does_not_import_scipy_linalg_and_leaves_it_importable() -> None:
    code = (
        "import sys\n"
        "from memfit.estimate.allocator import jit as allocator_jit\n"
        "assert allocator_jit.load_kernel() is not None\n"
        "print('scipy.linalg' in sys.modules, 'scipy.linalg.cython_blas' in sys.modules)\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('scipy') is not None:\n"
        "    import scipy.linalg.cython_blas\n"
        "print('ok')\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.split() == ["False", "False", "ok"]


def test_a_command_never_waits_for_the_first_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the machine code is not on disk yet, a replay starts the compile in a background
    process and answers with the Python replay (the same bytes) meanwhile."""
    events = _events(3, 3000, keys="dense", **SHAPES["mixed"])
    started: list[int] = []
    monkeypatch.setattr(allocator_jit, "_KERNEL", [])
    monkeypatch.setattr(allocator_jit, "_WARMING", [])
    monkeypatch.setattr(allocator_jit, "kernel_ready", lambda: False)
    monkeypatch.setattr(
        allocator_jit, "warm_in_background", lambda: started.append(1) or "compiling elsewhere"
    )
    assert allocator_jit.replay_events(events) is None  # no compile here
    assert allocator_jit.replay_events(events) is None
    assert started == [1]  # one background compile per process
    assert simulate_default(events) == simulate_default_python(events)
    assert allocator_jit.describe() == "python (compiling elsewhere)"
    assert not allocator_jit.kernel_loaded()


def test_the_background_compile_marks_the_kernel_ready() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memfit.estimate.allocator.jit"], capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert allocator_jit.kernel_ready()

"""Caches checked, not trusted (issue 33): a damaged, foreign or special file where an entry
should be is a miss, rebuilt with the right answer and one note; never used, never a hang or a
traceback."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TINY_LLAMA

from memfit.estimate import trace_cache
from memfit.estimate.derived import cache, sidecar
from memfit.estimate.derived.entry import CorruptEntry, read_entry, write_entry
from memfit.estimate.policy import run_engine
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace_cache import cacheable as REAL_CACHEABLE
from memfit.estimate.trace_cache import cached_trace, trace_key
from memfit.hardware import get_gpu
from memfit.models.source import ModelSource
from memfit.spec import WorkloadSpec

TRAIN = WorkloadSpec(mode="train", batch_size=2, seq_len=32, precision="bf16-true", lora_rank=4)
#: No case may take longer (a FIFO opened for reading without O_NONBLOCK waits forever).
HANG_S = 20


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"a cache read hung for over {HANG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Both caches on (tests/conftest.py turns the trace cache off), in this test's folder."""
    monkeypatch.setattr(trace_cache, "cacheable", REAL_CACHEABLE)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    return tmp_path


def _source() -> ModelSource:
    return ModelSource(name="tiny-llama", origin="path", config=dict(TINY_LLAMA), source_url=None,
                       config_path=None, safetensors=None, factory=None)  # fmt: skip


@pytest.fixture(scope="module")
def answer() -> MemoryEstimate:
    """A real answer to keep (the analytic engine's: milliseconds, the same record type)."""
    return run_engine("analytic", _source(), TRAIN, get_gpu("L4"))


def _edit_a_number(path: Path) -> None:
    """One digit of the stored peak changed, same length (the fuzz's edit: 2.37 GiB read back
    as 1.37)."""
    data = path.read_bytes()
    peak = str(json.loads(data.partition(b"\n")[2])["estimate"]["peak_allocated_bytes"])
    edited = str(int(peak[0]) % 9 + 1) + peak[1:]
    field = b'"peak_allocated_bytes":'
    assert field + peak.encode() in data
    path.write_bytes(data.replace(field + peak.encode(), field + edited.encode(), 1))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _wrong_shape(path: Path) -> None:
    """A well-framed entry (right key, right hash) whose record is not an answer."""
    key = path.name.removesuffix(".json")
    payload = json.dumps({"format": trace_cache.FORMAT, "key": key, "estimate": [1, 2]}).encode()
    write_entry(path, payload, kind="trace", key=key, fmt=trace_cache.FORMAT)


def _negative(path: Path) -> None:
    """A well-framed answer with a negative activation (what the fuzz's edit printed)."""
    key = path.name.removesuffix(".json")
    record = json.loads(path.read_bytes().partition(b"\n")[2])
    record["estimate"]["components"]["activations"] = -(10**9)
    record["estimate"]["components"]["parameters"] += 10**9  # components still sum to the peak
    payload = json.dumps(record).encode()
    write_entry(path, payload, kind="trace", key=key, fmt=trace_cache.FORMAT)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _foreign(path: Path) -> None:
    """Another program's file with the entry's name (valid JSON, no header)."""
    path.write_text(json.dumps({"format": trace_cache.FORMAT, "key": path.stem, "estimate": {}}))


def _other_key(path: Path) -> None:
    """A valid entry of another key copied to this name."""
    payload = path.read_bytes().partition(b"\n")[2]
    write_entry(path, payload, kind="trace", key="0" * 32, fmt=trace_cache.FORMAT)


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "edited number": (_edit_a_number, "its content does not match its sha256"),
    "truncated": (_truncate, "bytes where its header says"),
    "wrong shape": (_wrong_shape, "a record of the wrong shape"),
    "negative activation": (_negative, "a record of the wrong shape"),
    "fifo": (_fifo, "a FIFO (named pipe)"),
    "symlink to /dev/zero": (_dev_zero, "a character device"),
    "foreign file": (_foreign, "not a memfit cache entry"),
    "another key's entry": (_other_key, "its header names another entry"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_trace_answer_is_rebuilt_with_the_right_answer_and_one_note(
    on: Path, answer: MemoryEstimate, damage: str
) -> None:
    gpu = get_gpu("L4")
    runs: list[int] = []

    def run() -> MemoryEstimate:
        runs.append(1)
        return answer

    cached_trace(_source(), TRAIN, gpu, run)
    path = on / "trace" / f"{trace_key(_source(), TRAIN, gpu, extrapolate=None)}.json"
    edit, why = DAMAGE[damage]
    edit(path)
    got = cached_trace(_source(), TRAIN, gpu, run)
    assert len(runs) == 2  # rebuilt, not read
    assert got.peak_allocated_bytes == answer.peak_allocated_bytes
    assert got.components == answer.components
    notes = [n for n in got.notes if n.startswith("cache entry")]
    assert len(notes) == 1 and why in notes[0] and notes[0].endswith(": rebuilt")
    assert f"trace/{path.name}" in notes[0]
    kept = cached_trace(_source(), TRAIN, gpu, run)  # the file was replaced: read, no note
    assert len(runs) == 2 and kept.trace["cached"] is True
    assert dataclasses.replace(kept, trace=answer.trace) == answer


def _form() -> dict[str, Any]:
    run = {"ev": [0, 2, 1, 3], "a0": [512, 1024], "a1": [0, 512], "comp": [0, 0], "mod": [0, 0],
           "order": [0, 1], "ignored": [], "marks": [[0, "forward"]]}  # fmt: skip
    return {"runs": [run], "points": [1, 2, 3], "notes": []}


@pytest.mark.parametrize("damage", ["edited digit", "truncated", "fifo", "symlink to /dev/zero",
                                    "foreign file"])  # fmt: skip
def test_a_damaged_derived_form_is_a_miss_with_one_note(on: Path, damage: str) -> None:
    cache.store("k1", _form())
    path = on / "derived" / "k1.json"
    sidecar.path_for(path).unlink()  # the JSON itself is read
    if damage == "edited digit":  # 1024 -> 1025: one changed digit, same length
        path.write_bytes(path.read_bytes().replace(b"1024", b"1025"))
    else:
        {"truncated": _truncate, "fifo": _fifo, "symlink to /dev/zero": _dev_zero,
         "foreign file": _foreign}[damage](path)  # fmt: skip
    problems: list[str] = []
    assert cache.load("k1", problems=problems) is None
    assert len(problems) == 1 and problems[0].startswith("cache entry derived/k1.json was corrupt")
    cache.store("k1", _form())  # the rebuild replaces it
    got = cache.load("k1", problems=problems)
    assert got is not None and got["runs"][0]["a0"].tolist() == [512, 1024]
    assert len(problems) == 1


@pytest.mark.parametrize("damage", ["edited", "fifo", "symlink to /dev/zero"])
def test_a_damaged_sidecar_is_not_used_and_the_json_answers(on: Path, damage: str) -> None:
    cache.store("k1", _form())
    arrays = sidecar.path_for(on / "derived" / "k1.json")
    if damage == "edited":
        data = bytearray(arrays.read_bytes())
        data[-40] ^= 1
        arrays.write_bytes(bytes(data))
    else:
        {"fifo": _fifo, "symlink to /dev/zero": _dev_zero}[damage](arrays)
    problems: list[str] = []
    got = cache.load("k1", problems=problems)
    assert got is not None and got["runs"][0]["a0"] == [512, 1024]  # from the JSON
    assert problems == [problems[0]] and "derived/k1.arrays.npz was corrupt" in problems[0]


def test_an_entry_over_its_size_cap_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    write_entry(path, b"x" * 4096, kind="trace", key="k", fmt=1)
    with pytest.raises(CorruptEntry, match="larger than 1,024 bytes"):
        read_entry(path, kind="trace", key="k", fmt=1, max_bytes=1024)
    assert read_entry(path, kind="trace", key="k", fmt=2, max_bytes=8192) is None  # stale
    assert read_entry(tmp_path / "absent.json", kind="trace", key="k", fmt=1, max_bytes=1) is None


def test_a_write_leaves_no_temporary_file_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    assert write_entry(path, b"one", kind="trace", key="k", fmt=1)
    assert write_entry(path, b"two", kind="trace", key="k", fmt=1)
    assert read_entry(path, kind="trace", key="k", fmt=1, max_bytes=1024) == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]


#: A model type with no analytic program, two layers: its form is traced in full (~2 s).
TINY_GRANITE = dict(
    model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=64,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize("damage", ["edited digit", "wrong shape"])
def test_a_damaged_form_on_disk_is_rebuilt_by_the_derived_engine_with_a_note(
    on: Path, tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    from memfit.estimate import derived
    from memfit.models import resolve_model

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_GRANITE))
    granite, gpu = resolve_model(str(tmp_path / "model")), get_gpu("L4")
    work = WorkloadSpec(mode="train", batch_size=2, seq_len=64, precision="bf16-true")
    monkeypatch.setattr(derived, "_FORMS", {})  # no form another test loaded
    fresh = derived.estimate_derived(granite, work, gpu=gpu)
    assert fresh.trace["derived"]["built_now"] is True
    key = cache.variant_key(granite.config, work)
    path = on / "derived" / f"{key}.json"
    derived._FORMS.pop(key)  # a new process: the form comes from disk
    if damage == "edited digit":
        head, _, payload = path.read_bytes().partition(b"\n")
        i = payload.index(b'"a0":[') + 6  # the first allocation's size: one digit changed
        digit = payload[i : i + 1]
        path.write_bytes(
            head + b"\n" + payload[:i] + (b"2" if digit != b"2" else b"3") + payload[i + 1 :]
        )
        why = "its content does not match its sha256"
    else:
        write_entry(path, json.dumps({"format": cache.FORMAT, "key": key}).encode(),
                    kind="derived", key=key, fmt=cache.FORMAT)  # fmt: skip
        sidecar.path_for(path).unlink()
        why = "a form of the wrong shape"
    got = derived.estimate_derived(granite, work, gpu=gpu)
    assert got.trace["derived"]["built_now"] is True
    assert (got.peak_allocated_bytes, got.peak_reserved_bytes) == (
        fresh.peak_allocated_bytes, fresh.peak_reserved_bytes)  # fmt: skip
    notes = [n for n in got.notes if n.startswith("cache entry")]
    assert notes == [f"cache entry derived/{key}.json was corrupt ({why}): rebuilt"]
    derived._FORMS.pop(key)
    again = derived.estimate_derived(granite, work, gpu=gpu)  # the rebuilt file: read, no note
    assert again.trace["derived"]["built_now"] is False
    assert not [n for n in again.notes if n.startswith("cache entry")]

"""The trace cache: a traced answer is kept on disk, read back exactly, keyed by what it needs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TINY_LLAMA

from memfit.errors import NotModelledError, SpecError, TraceError
from memfit.estimate import trace_cache
from memfit.estimate.derived import cache
from memfit.estimate.derived.entry import write_entry
from memfit.estimate.policy import run_engine
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace_cache import cacheable as REAL_CACHEABLE
from memfit.estimate.trace_cache import cached_trace, decode, encode, trace_key
from memfit.hardware import get_gpu
from memfit.models.source import ModelSource
from memfit.spec import WorkloadSpec

TRAIN = WorkloadSpec(mode="train", batch_size=2, seq_len=32, precision="bf16-true", lora_rank=4)
INFER = WorkloadSpec(mode="infer", batch_size=2, seq_len=32, new_tokens=8, precision="bf16-true")


@pytest.fixture
def on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache on (tests/conftest.py turns it off), in a directory of this test's own."""
    monkeypatch.setattr(trace_cache, "cacheable", REAL_CACHEABLE)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    return tmp_path / "trace"


def _source(config: dict[str, Any] | None = None, **kw: Any) -> ModelSource:
    config = config or dict(TINY_LLAMA)
    return ModelSource(name="tiny-llama", origin="path", config=config, source_url=None,
                       config_path=None, safetensors=None, factory=None, **kw)  # fmt: skip


def _uncached(est: MemoryEstimate) -> MemoryEstimate:
    return dataclasses.replace(est, trace={k: v for k, v in est.trace.items() if k != "cached"})


def _never() -> MemoryEstimate:
    raise AssertionError("traced although the answer is kept")


@pytest.mark.parametrize("workload", [TRAIN, INFER], ids=["train", "infer"])
def test_a_kept_answer_equals_the_fresh_trace_field_for_field(on: Path, workload: WorkloadSpec):
    pytest.importorskip("transformers")
    src, gpu = _source(), get_gpu("L4")
    fresh = run_engine("trace", src, workload, gpu)
    assert len(list(on.glob("*.json"))) == 1 and "cached" not in fresh.trace
    kept = cached_trace(src, workload, gpu, _never)
    assert kept.trace["cached"] is True
    assert _uncached(kept) == fresh
    assert [(f.name, getattr(_uncached(kept), f.name)) for f in dataclasses.fields(kept)] == [
        (f.name, getattr(fresh, f.name)) for f in dataclasses.fields(fresh)
    ]
    assert kept.to_json() == {**fresh.to_json(), "trace": {**fresh.trace, "cached": True}}
    elsewhere = cached_trace(dataclasses.replace(src, name="/other/config.json"), workload, gpu,
                             _never)  # fmt: skip
    assert _uncached(elsewhere) == dataclasses.replace(fresh, model_name="/other/config.json")


def test_the_key_changes_with_the_workload_the_config_the_gpu_and_the_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src, l4 = _source(), get_gpu("L4")
    base = trace_key(src, TRAIN, l4, extrapolate=None)
    assert base == trace_key(_source(), TRAIN, get_gpu("L4"), extrapolate=None)  # stable
    changed = [
        trace_key(src, dataclasses.replace(TRAIN, batch_size=3), l4, extrapolate=None),
        trace_key(src, dataclasses.replace(TRAIN, grad_accum=4), l4, extrapolate=None),
        trace_key(src, dataclasses.replace(TRAIN, lora_rank=8), l4, extrapolate=None),
        trace_key(_source({**TINY_LLAMA, "num_hidden_layers": 4}), TRAIN, l4, extrapolate=None),
        trace_key(src, TRAIN, get_gpu("H100-80GB"), extrapolate=None),
        trace_key(src, TRAIN, None, extrapolate=None),
        trace_key(src, TRAIN, l4, extrapolate=False),
    ]
    monkeypatch.setattr(cache, "versions", lambda extra=(): {"transformers": "9.9.9"})
    changed.append(trace_key(src, TRAIN, l4, extrapolate=None))
    assert len({base, *changed}) == len(changed) + 1


def test_an_edited_memfit_file_is_a_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = trace_key(_source(), TRAIN, None, extrapolate=None)
    monkeypatch.setattr(trace_cache, "source_fingerprint", lambda: "another checkout")
    assert trace_key(_source(), TRAIN, None, extrapolate=None) != before


def test_a_refusal_is_kept_and_raised_again_without_a_run(on: Path) -> None:
    def refuse() -> MemoryEstimate:
        raise NotModelledError("the trace engine does not model x yet", engine="trace")

    with pytest.raises(NotModelledError, match="does not model x"):
        cached_trace(_source(), TRAIN, None, refuse)
    with pytest.raises(NotModelledError, match="does not model x") as kept:
        cached_trace(_source(), TRAIN, None, _never)
    assert kept.value.engine == "trace"


def test_a_failed_trace_is_not_kept(on: Path) -> None:
    calls = []

    def fail() -> MemoryEstimate:
        calls.append(1)
        raise TraceError("could not run LlamaForCausalLM on fake tensors: RuntimeError: boom")

    for _ in range(2):
        with pytest.raises(TraceError, match="boom"):
            cached_trace(_source(), TRAIN, None, fail)
    assert len(calls) == 2 and not list(on.glob("*.json"))


def test_factories_and_remote_code_are_never_kept(on: Path) -> None:
    factory = ModelSource(name="m:f", origin="factory", config=None, source_url=None,
                          config_path=None, safetensors=None, factory="m:f")  # fmt: skip
    assert not trace_cache.cacheable(factory)
    assert not trace_cache.cacheable(_source(trust_remote_code=True))
    assert trace_cache.cacheable(_source())


def test_no_cache_neither_reads_nor_writes(on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError, match="bad"), cache.disabled():
        cached_trace(_source(), TRAIN, None, lambda: (_ for _ in ()).throw(SpecError("bad")))
    assert not on.exists()
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    assert not trace_cache.cacheable(_source())


def test_an_unreadable_file_is_ignored_and_replaced(on: Path) -> None:
    key = trace_key(_source(), TRAIN, None, extrapolate=None)
    on.mkdir(parents=True)
    (on / f"{key}.json").write_text("{not json")
    with pytest.raises(SpecError, match="fresh"):
        cached_trace(_source(), TRAIN, None, lambda: (_ for _ in ()).throw(SpecError("fresh")))
    assert _record(on / f"{key}.json")["refusal"]["message"] == "fresh"
    bad = json.dumps({"format": 1, "key": key, "estimate": {"x": 1}}).encode()
    write_entry(on / f"{key}.json", bad, kind="trace", key=key, fmt=trace_cache.FORMAT)
    with pytest.raises(SpecError, match="again"):  # a record it cannot read: traced again
        cached_trace(_source(), TRAIN, None, lambda: (_ for _ in ()).throw(SpecError("again")))


def _record(path: Path) -> Any:
    """The record an entry holds (the JSON after its header line)."""
    return json.loads(path.read_bytes().partition(b"\n")[2])


def test_the_codec_refuses_values_json_cannot_hold_exactly() -> None:
    with pytest.raises(TypeError, match="cannot keep a set"):
        trace_cache._enc({"a": {1, 2}})
    assert trace_cache._dec(trace_cache._enc({"t": (1, [2, (3,)])})) == {"t": (1, [2, (3,)])}
    with pytest.raises(ValueError, match="differ from MemoryEstimate"):
        decode({"model_name": "x"})
    assert callable(encode)


def test_a_snapshot_recording_runs_the_trace(on: Path) -> None:
    from memfit.estimate.history import recording

    with recording():
        assert not trace_cache.cacheable(_source())  # --snapshot needs the run's history
    assert trace_cache.cacheable(_source())


def test_a_variable_length_run_is_kept_and_read_back(on: Path, monkeypatch: pytest.MonkeyPatch):
    """estimate_seq_run keeps the whole run under the one key rule: the same run again is read
    back equal without replaying; another distribution, a corrupt entry or --no-cache replay."""
    from memfit.estimate.seqrun import run as seqrun
    from memfit.spec.seqrun import SeqDist, StepPlan

    calls: list[int] = []

    def fake_run(source, workload, dist, plan, gpu, capacity_bytes, progress):
        calls.append(plan.n_steps)
        v = seqrun.Variant(name="run", reserved_bytes=3 * 2**30, reserved_expandable_bytes=2**31,
                           memory_only=True, how="as asked", n_ooms=0)  # fmt: skip
        return seqrun.SeqRunEstimate(
            n_steps=plan.n_steps, seed=plan.seed, max_len=dist.max_len, mean_step_len=300.5,
            n_distinct_lengths=7, anchors=(2, 128, 256), floor_len=2,
            fixed=dataclasses.replace(v, name="fixed"), run=v, alternatives=(v,),
            recommendations=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",),
            unmatched_frees=0, peak_allocated_bytes=2**30,
        )  # fmt: skip

    monkeypatch.setattr(seqrun, "_estimate_seq_run", fake_run)
    source, dist, plan = _source(), SeqDist(max_len=256, mean=100, std=50), StepPlan(batch_size=2)
    first = seqrun.estimate_seq_run(source, TRAIN, dist, plan, gpu=get_gpu("L4"))
    again = seqrun.estimate_seq_run(source, TRAIN, dist, plan, gpu=get_gpu("L4"))
    assert again == first and calls == [1000]
    seqrun.estimate_seq_run(source, TRAIN, dataclasses.replace(dist, max_len=512), plan)
    assert len(calls) == 2
    for entry in on.glob("*.json"):
        entry.write_text("{not json")
    assert seqrun.estimate_seq_run(source, TRAIN, dist, plan, gpu=get_gpu("L4")) == first
    assert len(calls) == 3
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    seqrun.estimate_seq_run(source, TRAIN, dist, plan, gpu=get_gpu("L4"))
    assert len(calls) == 4

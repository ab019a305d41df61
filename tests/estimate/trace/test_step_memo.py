"""The rank variants of one job (DDP aside: ZeRO-1/2/3 and their offload at one tp) trace the same
single-GPU step: within a process the step is traced once and every variant's rewrite reads it
(memfit.estimate.trace.step_memo), giving exactly what a trace of its own gives."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.conftest import TINY_LLAMA
from tests.estimate.derived.test_rank import WIDE

from memfit.estimate.derived import cache
from memfit.estimate.derived.record import record
from memfit.estimate.trace import rank_trace, step_memo
from memfit.estimate.trace.engine import memoized, trace_hf
from memfit.spec import WorkloadSpec

#: One layer of WIDE: ZeRO-3 still partitions and gathers its projections.
ONE = {**WIDE, "num_hidden_layers": 1}


def _job(b: int = 1, **kw: Any) -> WorkloadSpec:
    return WorkloadSpec(mode="train", batch_size=b, seq_len=32, precision="bf16-mixed", **kw)


def _answer(est: Any) -> dict[str, Any]:
    out = est.to_json()
    out["trace"] = {k: v for k, v in out["trace"].items() if k != "wall_s"}
    return out


def _plain(config: dict[str, Any], w: WorkloadSpec) -> dict[str, Any]:
    """The trace engine's answer with the memo off (a trace of its own)."""
    step_memo.clear()
    with cache.disabled():
        return _answer(trace_hf(config, w, name="m"))


VARIANTS = (
    dict(shard="zero1"),
    dict(shard="zero3", gpus=2),
    dict(shard="zero2", offload="optimizer"),
    dict(shard="zero3", offload="params"),
)


@pytest.mark.slow
def test_rank_variants_take_one_step_and_give_each_its_own_traces_answer(
    fake_steps: list[int],
) -> None:
    got = {}
    for v in VARIANTS:
        got[json.dumps(v)] = _answer(trace_hf(WIDE, _job(**v), name="m"))
    assert fake_steps[0] == 1, "every ZeRO variant after the first reuses the traced step"
    for v in VARIANTS:
        assert got[json.dumps(v)] == _plain(WIDE, _job(**v)), v


def test_a_forms_second_rank_variant_runs_no_fake_step_and_is_the_same_form(
    fake_steps: list[int],
) -> None:
    first, second = _job(shard="zero2", offload="optimizer"), _job(shard="zero3", offload="params")
    record(ONE, first, name="m")
    before = fake_steps[0]
    assert before >= 3  # full traces at batch 1, 2 and 3 (one layer: no growth)
    form, _ = record(ONE, second, name="m")
    assert fake_steps[0] == before, "the second variant's form ran a fake step"
    step_memo.clear()
    with cache.disabled():
        plain, _ = record(ONE, second, name="m")
    assert fake_steps[0] > before
    for f in (form, plain):
        f["trace"].pop("wall_s")
    assert json.dumps(form, sort_keys=True) == json.dumps(plain, sort_keys=True)


def test_ddp_and_zero_trace_different_steps(fake_steps: list[int]) -> None:
    """``bf16-mixed`` under DeepSpeed ZeRO runs a bf16 model, under DDP fp32 weights with
    autocast: the precision as run is part of the key."""
    trace_hf(TINY_LLAMA, _job(shard="ddp", gpus=2), name="m")
    trace_hf(TINY_LLAMA, _job(shard="zero2"), name="m")
    assert fake_steps[0] == 2
    trace_hf(TINY_LLAMA, _job(shard="ddp", gpus=4), name="m")
    assert fake_steps[0] == 2


def test_fsdp_and_a_single_gpu_are_never_taken_from_the_memo(fake_steps: list[int]) -> None:
    trace_hf(TINY_LLAMA, _job(shard="zero2"), name="m")
    assert memoized(TINY_LLAMA, _job(shard="zero3", offload="optimizer"))
    assert not memoized(TINY_LLAMA, _job(shard="fsdp", gpus=2))
    assert not memoized(TINY_LLAMA, _job())
    trace_hf(TINY_LLAMA, _job(), name="m")
    assert fake_steps[0] == 2
    assert step_memo.n_entries() == 1


def test_a_zero_job_naming_adamw_fused_takes_the_adamw_step(fake_steps: list[int]) -> None:
    """ZeRO traces ``adamw-fused`` as ``adamw`` (sharding.traced_step_workload): one step."""
    trace_hf(TINY_LLAMA, _job(shard="zero2"), name="m")
    fused = _job(shard="zero3", offload="optimizer", optimizer="adamw-fused")
    assert memoized(TINY_LLAMA, fused)
    trace_hf(TINY_LLAMA, fused, name="m")
    assert fake_steps[0] == 1


def test_no_cache_turns_the_memo_off(
    fake_steps: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    with cache.disabled():
        trace_hf(TINY_LLAMA, _job(shard="zero2"), name="m")
        trace_hf(TINY_LLAMA, _job(shard="zero3"), name="m")
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    trace_hf(TINY_LLAMA, _job(shard="zero3", offload="params"), name="m")
    assert fake_steps[0] == 3
    assert step_memo.n_entries() == 0


def test_a_step_another_process_kept_serves_this_one(fake_steps: list[int]) -> None:
    """What a forked trace worker hands back (pickled) is as good as a step traced here."""
    with step_memo.collecting() as made:
        trace_hf(WIDE, _job(shard="zero2"), name="m")
    assert len(made) == 1
    sent = pickle.dumps(made)
    step_memo.clear()
    step_memo.adopt(pickle.loads(sent))  # noqa: S301 - this test's own bytes
    got = _answer(trace_hf(WIDE, _job(shard="zero3", offload="optimizer"), name="m"))
    assert fake_steps[0] == 1
    assert got == _plain(WIDE, _job(shard="zero3", offload="optimizer"))


def _entry(n_events: int) -> step_memo.Entry:
    events = tuple(("a", i, 512) for i in range(n_events))
    trace = rank_trace.RankTrace(
        events=events, marks=(), raw=(512,) * n_events, ignored=frozenset(),
        owners={i: ("m", "forward", "activations") for i in range(n_events)},
        grad_keys=frozenset(), params={}, ddp_sizes=(),
    )  # fmt: skip
    return step_memo.Entry(trace=trace, flat={"n_params": 1})


def test_the_memo_keeps_the_most_recently_used_steps_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(step_memo, "MAX_ENTRIES", 3)
    monkeypatch.setattr(step_memo, "MAX_EVENTS", 100)
    for k in "abc":
        step_memo.put(k, _entry(10))
    assert step_memo.get("a") is not None  # used: now the most recent
    step_memo.put("d", _entry(10))
    assert [k for k in "abcd" if step_memo.get(k, touch=False)] == ["a", "c", "d"]
    step_memo.put("e", _entry(85))  # 30 + 85 > 100: the least recent go until it fits
    assert [k for k in "acde" if step_memo.get(k, touch=False)] == ["d", "e"]
    step_memo.put("f", _entry(101))  # larger than the whole memo: not kept
    assert step_memo.get("f") is None


def test_the_key_ignores_what_only_the_rewrite_reads() -> None:
    def key(config: dict[str, Any], w: WorkloadSpec, task: str = "causal-lm") -> str | None:
        return step_memo.key(config, w, task=task)

    base = key(WIDE, _job(shard="zero2"))
    assert base == key(WIDE, _job(shard="zero3", offload="params", gpus=4, grad_accum=8))
    assert base != key(WIDE, _job(2, shard="zero2"))
    assert base != key(WIDE, _job(shard="zero2", checkpointing="full"))
    assert base != key(WIDE, _job(shard="zero2", gpus=2, tp=2))
    assert base != key({**WIDE, "hidden_size": 256}, _job(shard="zero2"))
    assert base != key(WIDE, _job(shard="zero2"), task="x")

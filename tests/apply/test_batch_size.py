"""find_batch_size on CPU: memfit's exact tensor tracker plays a device of ``memory_limit_bytes``
and raises ``torch.OutOfMemoryError`` beyond it, as a full GPU would."""

from __future__ import annotations

import pytest
import torch
from tests.apply.conftest import VOCAB, build
from tests.conftest import TINY_LLAMA

import memfit
from memfit.apply import AmpStep, training_step
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec

SEQ = 64
PLAN = WorkloadSpec(batch_size=1, seq_len=SEQ, precision="fp32", optimizer="adamw-fused")


def _estimated_peak(batch_size: int) -> int:
    w = WorkloadSpec(**{**PLAN.__dict__, "batch_size": batch_size})
    est = trace_hf(TINY_LLAMA, w, name="t", extrapolate=False, emulate_cuda=False)
    return est.peak_allocated_bytes - sum(allocator_workspaces(None, training=True))


def _setup():
    model = memfit.apply_plan_(build(TINY_LLAMA), PLAN)
    opt = memfit.build_optimizer(model, PLAN)
    amp = AmpStep(PLAN, device_type="cpu")
    seqs: list[int] = []

    def step(batch: dict) -> None:
        seqs.append(batch["input_ids"].shape[1])
        training_step(model, batch, opt, amp)

    def make_batch(b: int, s: int) -> dict:
        ids = torch.randint(0, VOCAB, (b, s))
        return {"input_ids": ids, "labels": ids}

    return model, opt, step, make_batch, seqs


@pytest.fixture(scope="module")
def limit_for_four() -> int:
    """A device on which batch 4 fits and batch 5 does not, by memfit's estimate."""
    four, five = _estimated_peak(4), _estimated_peak(5)
    return (four + five) // 2


def test_the_estimate_is_confirmed_at_the_worst_case_length_and_matches(
    limit_for_four: int,
) -> None:
    model, opt, step, make_batch, seqs = _setup()
    r = memfit.find_batch_size(
        step,
        make_batch=make_batch,
        model=model,
        optimizer=opt,
        plan=PLAN,
        memory_limit_bytes=limit_for_four,
    )
    assert r.estimated_batch_size == 4 and r.batch_size == 4
    assert set(seqs) == {SEQ}  # every trial at the plan's (worst-case) length
    assert [(a.batch_size, a.mode, a.ok) for a in r.attempts] == [
        (4, "train", True),
        (4, "eval", True),
    ]
    # the applied plan's measured peak is the estimate, to the byte (same tracker, same step)
    assert r.measured_peak_bytes == r.estimated_peak_bytes == _estimated_peak(4)
    assert r.gap == 0.0
    assert 0 < r.measured_eval_peak_bytes < r.measured_peak_bytes


def test_an_oom_backs_off_to_the_largest_batch_that_runs(limit_for_four: int) -> None:
    model, opt, step, make_batch, _ = _setup()
    r = memfit.find_batch_size(
        step,
        make_batch=make_batch,
        model=model,
        optimizer=opt,
        plan=PLAN,
        memory_limit_bytes=limit_for_four,
        start_batch_size=16,
    )
    assert r.batch_size == 4 and r.estimated_batch_size is None
    tried = [(a.batch_size, a.ok) for a in r.attempts if a.mode == "train"]
    assert tried == [(16, False), (8, False), (4, True), (6, False), (5, False)]
    assert "capacity" in next(a.error for a in r.attempts if not a.ok)
    # the failed trials left nothing behind: the model still trains
    training_step(model, make_batch(2, 8), opt, AmpStep(PLAN, device_type="cpu"))


def test_probe_up_grows_past_a_pessimistic_start(limit_for_four: int) -> None:
    model, opt, step, make_batch, _ = _setup()
    r = memfit.find_batch_size(
        step,
        make_batch=make_batch,
        model=model,
        optimizer=opt,
        plan=PLAN,
        memory_limit_bytes=limit_for_four,
        start_batch_size=1,
        probe_up=True,
        check_eval=False,
    )
    assert r.batch_size == 4
    assert [a.batch_size for a in r.attempts] == [1, 2, 4, 8, 6, 5]


def test_evaluation_memory_can_lower_the_answer(limit_for_four: int) -> None:
    model, opt, step, make_batch, _ = _setup()

    def eval_fn(batch: dict) -> None:
        if batch["input_ids"].shape[0] > 2:  # e.g. full-vocabulary logits kept for metrics
            raise torch.OutOfMemoryError("eval needs more")

    r = memfit.find_batch_size(
        step,
        make_batch=make_batch,
        model=model,
        optimizer=opt,
        plan=PLAN,
        memory_limit_bytes=limit_for_four,
        eval_fn=eval_fn,
    )
    assert r.batch_size == 2
    assert (4, "eval", False) in [(a.batch_size, a.mode, a.ok) for a in r.attempts]


def test_cpu_needs_a_capacity_to_simulate() -> None:
    model, opt, step, make_batch, _ = _setup()
    with pytest.raises(memfit.SpecError, match="memory_limit_bytes is required off CUDA"):
        memfit.find_batch_size(step, make_batch=make_batch, model=model, plan=PLAN)


def test_the_cuda_cap_puts_back_the_users_own_fraction_even_after_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cap is a process-wide allocator setting: the search must leave the user's value."""
    import types

    from memfit.apply import batch_size as bs

    fraction = {"value": 0.7}  # what the user set before calling find_batch_size
    monkeypatch.setattr(
        torch.cuda, "get_per_process_memory_fraction", lambda device=None: fraction["value"]
    )
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda f, device=None: fraction.update(value=f),
    )
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=100)
    )
    with pytest.raises(KeyError), bs._cuda_cap(torch.device("cuda:0"), 25):
        assert fraction["value"] == 0.25
        raise KeyError("the user's step failed")
    assert fraction["value"] == 0.7

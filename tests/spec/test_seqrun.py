"""The variable-length run: SeqRun joins a training step to its lengths and step plan."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.spec import SeqDist, SeqRun, WorkloadSpec


def test_the_step_plan_takes_the_workloads_batch_and_the_longest_step_is_padded() -> None:
    job = SeqRun(
        workload=WorkloadSpec(batch_size=4), dist=SeqDist(mean=100, std=50, max_len=1000),
        pad_to_multiple_of=64, n_steps=10,
    )  # fmt: skip
    assert job.steps.batch_size == 4 and job.steps.n_steps == 10
    assert job.longest_step == 1024


def test_a_run_of_an_inference_job_is_refused() -> None:
    with pytest.raises(SpecError, match=r"workload.mode \('infer'\): a variable-length run"):
        SeqRun(workload=WorkloadSpec(mode="infer"), dist=SeqDist(mean=10, std=1, max_len=64))


def test_a_bad_step_plan_is_refused_with_its_field() -> None:
    with pytest.raises(SpecError, match=r"n_steps \(0\) must be >= 1"):
        SeqRun(workload=WorkloadSpec(), dist=SeqDist(mean=10, std=1, max_len=64), n_steps=0)

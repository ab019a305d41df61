"""The diffusion job records: torch-free, the shared precision names, every problem together."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memfit.errors import SpecError
from memfit.spec.diffusion import DiffusionJob, DiffusionTrainJob


def test_the_job_records_import_without_torch() -> None:
    code = "import memfit.spec.diffusion, memfit.spec, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("given", "held"),
    [("bf16", "bf16"), ("bf16-true", "bf16"), ("16-true", "fp16"), ("fp16", "fp16"),
     ("32-true", "fp32"), ("32", "fp32"), ("BF16", "bf16")],
)  # fmt: skip
def test_a_pipeline_takes_the_shared_precision_names_and_holds_the_dtype(
    given: str, held: str
) -> None:
    assert DiffusionJob(precision=given).precision == held
    assert DiffusionJob(vae_precision=given).vae_precision == held


def test_a_mixed_precision_is_not_an_inference_pipelines() -> None:
    with pytest.raises(SpecError, match=r"precision 'bf16-mixed' is not a diffusion inference"):
        DiffusionJob(precision="bf16-mixed")


def test_a_pipeline_job_reports_every_problem_together() -> None:
    rules = r"3 problems: steps must be a positive.*height must be a multiple.*quant 'q9' is not"
    with pytest.raises(SpecError, match=rules) as err:
        DiffusionJob(height=100, steps=0, quant="q9")
    assert len(err.value.problems) == 3


def test_a_training_run_resolves_the_shared_names_for_training() -> None:
    assert DiffusionTrainJob(precision="bf16").precision == "bf16-mixed"
    assert DiffusionTrainJob(precision="fp16").mixed_precision == "fp16"
    assert DiffusionTrainJob(precision="fp32").mixed_precision == "no"


def test_a_training_run_refuses_a_true_half_precision_naming_accelerates_flag() -> None:
    with pytest.raises(SpecError, match=r"precision 'bf16-true': the scripts run accelerate's"):
        DiffusionTrainJob(precision="bf16-true")


def test_a_training_run_reports_every_problem_together() -> None:
    with pytest.raises(SpecError, match=r"2 problems: resolution must be a multiple.*optimizer"):
        DiffusionTrainJob(resolution=1000, optimizer="lion")

"""MediaSpec is a field of the job; the estimate reads it without the CLI's context."""

from __future__ import annotations

import pytest

import memfit
from memfit.errors import SpecError
from memfit.spec import MediaSpec, WorkloadSpec


def test_a_workload_holds_its_media_and_its_json_leaves_it_to_the_inputs_record() -> None:
    w = WorkloadSpec(media=MediaSpec(image_size=384))
    assert w.media.image_size == 384
    assert "media" not in w.normalized()


def test_a_workload_refuses_media_that_is_not_a_media_spec() -> None:
    with pytest.raises(SpecError, match=r"media \(384\) must be a MediaSpec"):
        WorkloadSpec(media=384)  # type: ignore[arg-type]


def test_the_library_estimate_takes_the_jobs_image_size() -> None:
    w = WorkloadSpec(mode="infer", media=MediaSpec(image_size=384))
    est = memfit.estimate("vit-base-patch16-224", w, engine="analytic")
    inputs = est.workload["inputs"]
    assert inputs["image_size"] == 384 and inputs["patches"] == 576

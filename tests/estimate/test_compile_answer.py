"""``compile_answer``: a ``--compile`` job under ``auto`` is the analytic engine's compiled step;
where that is tight, the eager step's precise answer (an upper bound: compile keeps 0.69-1.0 of
eager's activations where measured) answers if its range ends lower; where the analytic engine
cannot model the compiled step, the eager step answers with a note."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.policy import compile_answer, run_engine
from memfit.hardware.catalog import get_gpu
from memfit.models.source import resolve_model
from memfit.spec import WorkloadSpec

JOB = dict(batch_size=1, seq_len=1024, precision="bf16-true", checkpointing="full", lora_rank=16)


@pytest.fixture(scope="module")
def answers():
    source = resolve_model("qwen2.5-7b")
    gpu = get_gpu("L4")
    compiled = run_engine("analytic", source, WorkloadSpec(**JOB, compile=True), gpu)
    smaller = run_engine("analytic", source, WorkloadSpec(**{**JOB, "seq_len": 256}), gpu)
    larger = run_engine("analytic", source, WorkloadSpec(**{**JOB, "batch_size": 4}), gpu)
    assert compiled.fits is not None and compiled.fits.verdict == "tight"  # the case at hand
    return compiled, smaller, larger


def _never():
    raise AssertionError("the eager step is not asked for")


def test_a_settled_compiled_answer_stands_alone(answers) -> None:
    compiled, _, _ = answers
    fits = dataclasses.replace(compiled, fits=dataclasses.replace(compiled.fits, verdict="fits"))
    assert compile_answer(lambda: fits, _never) is fits


def test_a_tight_compiled_answer_gives_way_to_a_lower_eager_bound(answers) -> None:
    compiled, smaller, _ = answers
    out = compile_answer(lambda: compiled, lambda: smaller)
    assert out.device_used_bytes == smaller.device_used_bytes
    assert out.notes[0].startswith("--compile: answered by the eager step's analytic estimate")
    assert "tight on L4" in out.notes[0]


def test_a_higher_eager_bound_leaves_the_compiled_answer(answers) -> None:
    compiled, _, larger = answers
    assert compile_answer(lambda: compiled, lambda: larger) is compiled


def test_an_unmodelled_compiled_step_is_answered_by_the_eager_step(answers) -> None:
    _, smaller, _ = answers

    def refuse():
        raise NotModelledError("not measured here", engine="analytic")

    out = compile_answer(refuse, lambda: smaller)
    assert out.notes[0].startswith("--compile not modelled here (not measured here)")
    assert out.device_used_bytes == smaller.device_used_bytes

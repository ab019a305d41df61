"""benchmarks/practice.py: its job list loads, every job carries a source, a quote and a catalog
GPU, and its memfit commands parse with memfit's own parser (not that memfit's advice passes:
that is what the benchmark measures)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.practice import KINDS, all_jobs, plan_argv, recipe_argv

from memfit.cli.entry import build_parser
from memfit.hardware import get_gpu

ROOT = Path(__file__).resolve().parents[2]
JOBS = all_jobs()


def test_the_benchmark_has_at_least_thirty_jobs_with_unique_ids() -> None:
    assert len(JOBS) >= 30
    assert len({j.id for j in JOBS}) == len(JOBS)


def test_the_jobs_come_from_every_framework_issue_29_names() -> None:
    frameworks = {j.framework for j in JOBS}
    wanted = {"litgpt", "torchtune", "axolotl", "unsloth", "trl", "diffusers", "vllm"}
    assert wanted <= frameworks, wanted - frameworks
    assert any(j.framework == "torchtune" and j.model == "llama-3.1-8b" for j in JOBS)


def test_unsloth_jobs_say_which_of_unsloths_techniques_memfit_models() -> None:
    """Its offloaded checkpoints and fused CE are run as memfit's --checkpointing offload and
    --loss fused; its fused LoRA kernels are not modelled, and the notes say both."""
    for job in (j for j in JOBS if j.framework == "unsloth"):
        assert any(
            "--checkpointing offload" in n and "--loss fused" in n and "not modelled" in n
            for n in job.notes
        ), job.id


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.id)
def test_every_job_names_its_source_quote_and_a_catalog_gpu(job) -> None:
    assert job.kind in KINDS
    assert job.source and ("http" in job.source or "@" in job.source), job.source
    assert job.quote
    assert get_gpu(job.gpu).name == job.gpu
    if job.file is not None:
        assert (ROOT / job.file).is_file()


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.id)
def test_every_job_is_a_memfit_command_line_that_parses(job) -> None:
    parser = build_parser()
    args = parser.parse_args(recipe_argv(job))
    assert args.command == ("vllm" if job.kind == "vllm" else "estimate")
    assert args.model == job.model
    if job.kind == "train":
        plan = parser.parse_args(plan_argv(job))
        assert (plan.command, plan.model, plan.gpu) == ("plan", job.model, job.gpu)
    else:
        assert plan_argv(job) == []

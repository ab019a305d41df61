"""benchmarks/practice.py: its job list loads, every job carries a source, a quote and a catalog
GPU, and its memfit commands parse with memfit's own parser (not that memfit's advice passes:
that is what the benchmark measures)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.practice import (
    FAIL,
    KINDS,
    KNOWN,
    PASS,
    all_jobs,
    closest_verdict,
    expected_outcome,
    plan_argv,
    recipe_argv,
    summary,
)

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
    --loss fused, its layer kernels as --kernels unsloth (issue 29): the recipe and the plan
    both run the job as Unsloth runs it, and the notes say so."""
    for job in (j for j in JOBS if j.framework == "unsloth"):
        assert any(
            "--checkpointing offload" in n and "--loss fused" in n and "--kernels unsloth" in n
            for n in job.notes
        ), job.id
        for flags in (job.recipe, job.plan):
            assert "--kernels" in flags, job.id
            assert flags[flags.index("--kernels") + 1] == "unsloth", job.id


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


# -- jobs whose documented GPU the evidence contradicts (issue 29 practice helper) ---------------
GIB = 2**30


def _plan(point_gib: float, need_gib: float) -> dict:
    """A plan JSON where nothing fits: its closest option's point and upper end on a 16 GiB
    card with a 1 GiB headroom."""
    budget = {"capacity_bytes": 16 * GIB, "limit_bytes": 15 * GIB}
    closest = {"device_used_bytes": int(point_gib * GIB), "need_bytes": int(need_gib * GIB)}
    return {"budget": budget, "closest": closest}


def _job(job_id: str):
    return next(j for j in JOBS if j.id == job_id)


def test_the_closest_plan_is_judged_by_the_one_verdict_rule() -> None:
    assert closest_verdict(_plan(14, 17)) == "tight"  # point within 16, upper end over 15
    assert closest_verdict(_plan(17, 19)) == "does not fit"
    assert closest_verdict({"budget": {}, "closest": {}}) is None


def test_a_job_without_an_expectation_where_nothing_fits_fails() -> None:
    job = _job("litgpt-llama-3.1-8b-lora")
    assert job.expect is None
    assert expected_outcome(job, "nothing fits", "tight") == (FAIL, "nothing fits")


def test_the_axolotl_lora_8b_recipe_is_known_not_to_fit_its_documented_11_gb() -> None:
    """memfit's answer is right (the hand check in the job's expectation): the row says so,
    and a memfit that answered 'tight' (an under-count of the trained copies) would FAIL."""
    job = _job("axolotl-llama-3-lora-8b")
    assert job.expect is not None and job.expect.verdict == "does not fit"
    assert "copy.deepcopy" in job.expect.why and "optim_bits 32" in job.expect.why
    assert expected_outcome(job, "x", "does not fit")[0] == KNOWN
    status, why = expected_outcome(job, "x", "tight")
    assert status == FAIL and "expected the closest plan does not fit, memfit: tight" in why


def test_the_unsloth_qwen3_14b_notebook_is_known_to_run_at_the_edge_of_a_t4() -> None:
    job = _job("unsloth-qwen3-14b-alpaca")
    assert job.expect is not None and job.expect.verdict == "tight"
    assert "14.508" in job.expect.why  # its r32 sibling's printed peak, 98.4 % of the card
    assert expected_outcome(job, "x", "tight")[0] == KNOWN
    assert expected_outcome(job, "x", "does not fit")[0] == FAIL
    others = [j.id for j in JOBS if j.expect is not None]
    assert sorted(others) == ["axolotl-llama-3-lora-8b", "unsloth-qwen3-14b-alpaca"]


def test_the_summary_counts_known_apart_from_fail() -> None:
    row = {k: (PASS, "") for k in "bcd"}
    rows = [{**row, "a": (KNOWN, "")}, {**row, "a": (FAIL, "")}]
    assert summary(rows).startswith("2 jobs: (a) 0 pass, 1 FAIL, 1 known, 0 n/a; (b) 2 pass")


def _recipe_estimate(job_id: str) -> dict:
    from benchmarks.practice import analytic, run_cli

    rc, est, err = run_cli(analytic(recipe_argv(_job(job_id))))
    assert est is not None, (rc, err)
    return est


def test_the_figures_the_axolotl_expectation_quotes_are_memfits_current_ones() -> None:
    est = _recipe_estimate("axolotl-llama-3-lora-8b")
    parts = {k: f"{v / GIB:.2f}" for k, v in est["components"].items()}
    why = _job("axolotl-llama-3-lora-8b").expect.why
    assert f"parameters {parts['parameters']} GiB" in why
    assert f"optimizer states {parts['optimizer_states']} GiB" in why
    # the hand check's own arithmetic: 128256 x 4096 per matrix, bf16 copies, 8 B + 2 B states
    n = 128256 * 4096
    assert f"{n / 1e6:.1f} M parameters" in why
    assert f"copies {2 * n * 2 / GIB:.2f} GiB" in why
    assert f"{(n * 8 + n * 2) / GIB:.2f} GiB (embed copy" in why


def test_the_figures_the_unsloth_expectation_quotes_are_memfits_current_ones() -> None:
    est = _recipe_estimate("unsloth-qwen3-14b-alpaca")
    why = _job("unsloth-qwen3-14b-alpaca").expect.why
    assert f"{est['device_used_bytes'] / GIB:.2f} GiB on the device at mb 2" in why
    assert est["fits"]["verdict"] == "tight"

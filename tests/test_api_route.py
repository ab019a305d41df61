"""memfit.estimate / fit / plan route every job kind: to the answer the CLI gives (the same
bytes as its --json), or to a NotModelledError that names the kind and the next step."""

from __future__ import annotations

import json
import re

import pytest

import memfit
from memfit import api
from memfit.cli import main
from memfit.errors import NotModelledError, SpecError
from memfit.plan import PlanRequest
from memfit.spec import (
    DiffusionJob,
    DiffusionTrainJob,
    EstimateOptions,
    LlamaCppJob,
    SeqDist,
    SeqRun,
    SglangConfig,
    VllmConfig,
    WorkloadSpec,
)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main([*argv, "--json"])
    return capsys.readouterr().out


def timeless(text: str) -> str:
    """The JSON text with each engine's wall time left out (the one field two runs differ in)."""
    return re.sub(r'"wall_s": [0-9.e-]+', '"wall_s": 0', text)


def test_a_text_step_routes_to_what_memfit_estimate_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = cli_json(capsys, "estimate", "gpt2", "--engine", "analytic", "--gpu", "T4")
    est = memfit.estimate("gpt2", WorkloadSpec(), gpu="T4",
                          options=EstimateOptions(engine="analytic"))  # fmt: skip
    assert timeless(json.dumps(est.to_json(), indent=2) + "\n") == timeless(out)


def test_the_old_keywords_give_the_same_answer_as_the_options() -> None:
    old = memfit.estimate("gpt2", WorkloadSpec(batch_size=2), engine="analytic")
    new = api.estimate("gpt2", WorkloadSpec(batch_size=2),
                       options=EstimateOptions(engine="analytic"))  # fmt: skip
    assert timeless(json.dumps(old.to_json())) == timeless(json.dumps(new.to_json()))


def test_options_and_the_old_keywords_together_are_refused() -> None:
    with pytest.raises(SpecError, match=r"engine: give them in options"):
        memfit.estimate("gpt2", engine="trace", options=EstimateOptions())


def test_a_serving_job_routes_to_what_memfit_vllm_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memfit.cli.vllm import startup_json
    from memfit.serving.command import serve_command

    out = cli_json(capsys, "vllm", "llama-3.1-8b", "--gpu", "H100")
    startup = memfit.estimate("llama-3.1-8b", VllmConfig(), gpu="H100")
    command = serve_command("llama-3.1-8b", VllmConfig())
    assert json.dumps(startup_json(startup, command), indent=2) + "\n" == out


def test_a_serving_job_is_fitted_and_planned_by_the_serving_solvers() -> None:
    value, startup = memfit.fit("llama-3.1-8b", VllmConfig(max_model_len=8192), gpu="H100")
    assert value > 1 and startup.starts
    options = memfit.plan("llama-3.1-8b", VllmConfig(max_model_len=8192), gpu="H100",
                          concurrency=4)  # fmt: skip
    assert options and options[0].gpu == "H100-80GB"


def test_a_diffusion_pipeline_routes_to_what_memfit_estimate_prints(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_wan import _tree

    root = _tree(tmp_path)
    argv = ["estimate", str(root), "--mode", "infer", "--height", "32", "--width", "48"]
    out = cli_json(capsys, *argv, "--num-frames", "6", "--precision", "fp32")
    job = DiffusionJob(height=32, width=48, num_frames=6, precision="32-true")
    est = memfit.estimate(str(root), job)
    assert json.dumps({**est.to_json(), "fits": None}, indent=2) + "\n" == out


@pytest.mark.parametrize(
    ("verb", "job", "says"),
    [
        ("plan", WorkloadSpec(), "plan does not take a fixed WorkloadSpec: .*PlanRequest"),
        ("estimate", PlanRequest(), "estimate does not take a PlanRequest.*WorkloadSpec"),
        ("fit", PlanRequest(), "fit does not take a PlanRequest"),
    ],
)
def test_a_kind_without_a_planner_says_so_and_the_next_step(verb: str, job: object,
                                                            says: str) -> None:  # fmt: skip
    with pytest.raises(NotModelledError, match=says):
        getattr(memfit, verb)("flux.1-dev", job, gpu="H100")


def test_every_kind_has_an_answer_or_a_reason_for_every_verb() -> None:
    kinds = {WorkloadSpec, PlanRequest, SeqRun, DiffusionJob, DiffusionTrainJob, VllmConfig,
             SglangConfig, LlamaCppJob}  # fmt: skip
    assert set(api.ROUTES) == kinds
    assert all(len(row) == len(api.VERBS) for row in api.ROUTES.values())


def test_a_value_that_is_no_job_is_refused_with_the_kinds() -> None:
    with pytest.raises(SpecError, match=r"job \('serve'\) must be one of WorkloadSpec, "):
        api.estimate("gpt2", "serve")


def test_the_old_workload_hint_is_kept_for_a_mode_string() -> None:
    with pytest.raises(SpecError, match=r"pass memfit.WorkloadSpec\(mode='train'\)"):
        memfit.estimate("gpt2", "train")


def test_a_seq_run_fit_solves_the_batch_only() -> None:
    job = SeqRun(workload=WorkloadSpec(), dist=SeqDist(mean=100, std=10, max_len=256))
    with pytest.raises(NotModelledError, match=r"fit of a SeqRun solves batch, not 'seq'"):
        memfit.fit("gpt2", job, gpu="T4", solve="seq")


def test_an_sglang_job_routes_to_what_memfit_sglang_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memfit.report.sglang import sglang_json
    from memfit.serving.sglang_command import launch_command

    out = cli_json(capsys, "sglang", "llama-3.1-8b", "--gpu", "H100")
    startup = memfit.estimate("llama-3.1-8b", SglangConfig(), gpu="H100")
    command = launch_command("llama-3.1-8b", SglangConfig())
    assert json.dumps(sglang_json(startup, command), indent=2) + "\n" == out


def test_an_sglang_job_is_fitted_and_its_plan_names_the_next_step() -> None:
    value, startup = memfit.fit("llama-3.1-8b", SglangConfig(), gpu="L4")
    assert startup is not None and startup.starts and value > 0
    with pytest.raises(NotModelledError, match=r"plan of an SglangConfig is not modelled.*fit it"):
        memfit.plan("llama-3.1-8b", SglangConfig(), gpu="L4")


def test_a_llamacpp_job_routes_to_what_memfit_llama_server_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memfit.cli.llamacpp import server_command
    from memfit.report.llamacpp import llamacpp_json

    out = cli_json(capsys, "llama-server", "llama-3.1-8b:Q4_K_M", "-c", "8192", "--gpu", "L4")
    job = LlamaCppJob(ctx_size=8192)
    e = memfit.estimate("llama-3.1-8b:Q4_K_M", job, gpu="L4")
    command = server_command("llama-3.1-8b:Q4_K_M", job)
    assert json.dumps(llamacpp_json(e, command), indent=2) + "\n" == out


def test_a_llamacpp_job_is_fitted_and_plan_names_fit() -> None:
    ngl, e = memfit.fit("llama-3.1-70b:Q4_K_M", LlamaCppJob(ctx_size=8192), gpu="RTX-4090")
    assert 0 < ngl < 81 and e.n_gpu_layers == ngl and e.fits
    ctx, e = memfit.fit("llama-3.1-8b", LlamaCppJob(), gpu="RTX-3060", solve="ctx-size")
    assert ctx % 256 == 0 and e.n_ctx == ctx and e.fits
    with pytest.raises(NotModelledError, match=r"plan does not take a LlamaCppJob.*fit"):
        memfit.plan("llama-3.1-8b", LlamaCppJob(), gpu="L4")
    with pytest.raises(SpecError, match=r"solve \('batch'\) for a LlamaCppJob"):
        memfit.fit("llama-3.1-8b", LlamaCppJob(), gpu="L4", solve="batch")

"""The parallel closed form as memfit answers with it: routing, reason, per-rank JSON, CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.estimate.parallel import ENGINE, estimate_parallel
from memfit.estimate.policy import EnginePolicy
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]
CONFIG_405B = ROOT / "benchmarks" / "configs" / "llama-3.1-405b" / "config.json"


def job(**kw):
    base = dict(gpus=64, tp=8, pp=4, seq_len=4096, grad_accum=8, attention="flash")
    return WorkloadSpec(**{**base, **kw})


@pytest.mark.parametrize("engine", ["auto", "analytic", "trace"])
def test_any_engine_hands_a_pipeline_job_to_the_closed_form_and_says_why(engine):
    est = EnginePolicy(engine=engine).estimate(resolve_model("llama-3.1-8b"), job(), None)
    assert est.engine == ENGINE
    assert "pp 4" in (est.engine_reason or "")


def test_the_answer_is_the_rank_that_peaks_and_json_lists_every_rank():
    est = estimate_parallel(resolve_model("llama-3.1-70b"), job())
    par = est.to_json()["trace"]["parallel"]
    peaks = [r["peak_allocated_bytes"] for r in par["ranks"]]
    assert len(peaks) == 4
    assert est.peak_allocated_bytes == max(peaks)
    assert par["ranks"][par["peak_pp_rank"]]["peak_allocated_bytes"] == max(peaks)
    assert par["ranks"][0]["embedding"] and par["ranks"][-1]["head"]


def test_more_pipeline_stages_hold_fewer_bytes_per_gpu():
    src = resolve_model("llama-3.1-70b")
    pp2 = estimate_parallel(src, job(gpus=16, pp=2, grad_accum=16)).peak_allocated_bytes
    pp8 = estimate_parallel(src, job(gpus=64, pp=8, grad_accum=16)).peak_allocated_bytes
    assert pp8 < pp2


def test_ep_on_a_dense_model_and_experts_not_divisible_are_refused():
    with pytest.raises(SpecError, match=r"ep \(2\) needs a mixture-of-experts model"):
        estimate_parallel(resolve_model("llama-3.1-8b"), job(gpus=16, tp=1, pp=1, ep=2))
    with pytest.raises(SpecError, match=r"ep \(16\) must divide the routed experts \(8\)"):
        estimate_parallel(resolve_model("mixtral-8x7b"), job(gpus=16, tp=1, pp=1, ep=16))


def test_dualpipev_needs_two_micro_batches_per_rank():
    with pytest.raises(SpecError, match=r"needs at least 2 x pp \(8\)"):
        estimate_parallel(resolve_model("llama-3.1-8b"), job(pp_schedule="dualpipev", grad_accum=4))


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "memfit", "estimate", *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        check=False,
    )


def test_cli_405b_in_4d_answers_with_per_rank_json():
    done = _cli(
        str(CONFIG_405B),
        *[
            "--gpus",
            "1024",
            "--tp",
            "8",
            "--pp",
            "8",
            "--cp",
            "2",
            "--seq",
            "8192",
            "--grad-accum",
            "16",
            "--shard",
            "fsdp",
        ],
        *["--checkpointing", "full", "--attention", "flash", "--gpu", "H100", "--json"],
    )
    assert done.returncode in (0, 1), done.stderr  # ok, or a valid "does not fit"
    out = json.loads(done.stdout)
    assert (done.returncode == 0) == out["fits"]["fits"]
    assert out["engine"] == ENGINE
    assert out["workload"]["pp"] == 8 and out["workload"]["cp"] == 2
    assert len(out["trace"]["parallel"]["ranks"]) == 8


def test_cli_bad_layout_is_one_line_and_exit_2():
    done = _cli("llama-3.1-8b", "--gpus", "8", "--pp", "3")
    assert done.returncode == 2
    assert "must divide gpus (8)" in done.stderr
    assert "Traceback" not in done.stderr

"""`memfit estimate --seq-dist`: bad input exits 2; a run reports reserved against fixed shape."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def test_a_bad_distribution_exits_2_with_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "gpt2", "--seq-dist", "900,10,512"])
    assert rc == 2
    assert "mean (900.0) must be between 1 and max (512)" in capsys.readouterr().err


def test_a_missing_histogram_exits_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "gpt2", "--seq-dist", str(tmp_path / "lengths.json")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_inference_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "gpt2", "--mode", "infer", "--seq-dist", "100,10,512"])
    assert rc == 2
    assert "--seq-dist models training runs" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
def test_json_run_of_a_tiny_llama_matches_the_fixed_estimate_at_max(
    tmp_path, tiny_llama, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama))
    hist = tmp_path / "lengths.csv"
    hist.write_text("64,3\n128,1\n")
    argv = ["estimate", str(tmp_path), "--precision", precision, "--lora-rank", "4", "--json"]
    argv += ["--engine", "trace"]  # the run replays the trace: compare like with like
    rc = main([*argv, "--seq-dist", str(hist), "--run-steps", "20"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    run = out["seq_dist"]
    # 64 or, when the shorter step runs other kernels (CUDA's reduction staging depends on the
    # size), the shortest length that runs the longest one's allocations
    assert 64 <= run["anchors"][0] < 128 and run["anchors"][-1] == 128 and run["max_len"] == 128
    # one repeated shape replayed over the run = the fixed-shape estimate's reserved at max
    assert run["fixed"]["reserved_bytes"] == out["peak_reserved_bytes"]
    assert run["run"]["reserved_expandable_bytes"] <= run["run"]["reserved_bytes"]
    assert run["unmatched_frees"] == 0


def test_plan_refuses_a_run_of_inference(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "gpt2", "--gpu", "a100-80gb", "--mode", "infer", "--seq-dist", "100,10,512"])
    assert rc == 2
    assert "--seq-dist models training runs, not --mode infer" in capsys.readouterr().err


def test_plan_refuses_a_run_with_recommend_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", "gpt2", "--recommend-gpu", "--seq-dist", "100,10,512"])
    assert rc == 2
    assert "--seq-dist plans one GPU's training run" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_replays_its_recommended_job_over_the_run(
    tmp_path, tiny_llama, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama))
    argv = ["plan", str(tmp_path), "--gpu", "rtx-4090", "--precision", "bf16-mixed"]
    rc = main(
        [*argv, "--lora-rank", "4", "--confirm", "none", "--json"]
        + ["--seq-dist", "200,120,256", "--run-steps", "20"]
    )
    out = json.loads(capsys.readouterr().out)
    run = out["seq_dist"]
    assert rc == 0 and out["fits"] and run["fits_after_run"]
    assert out["request"]["seq_len"] == 256 == run["max_len"]
    limit = out["budget"]["limit_bytes"]
    assert run["run"]["reserved_bytes"] + run["overhead_bytes"] <= limit

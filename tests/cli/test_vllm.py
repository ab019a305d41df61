"""`memfit vllm`: the lines vLLM prints, the verdict as an exit code, JSON, pasted flags."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def test_a_setup_that_starts_prints_vllms_lines_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["vllm", "llama-3.1-8b", "--gpu", "L40S", "--max-model-len", "8192"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Model loading took" in out and "Available KV cache memory:" in out
    assert "Maximum concurrency for 8,192 tokens per request:" in out and "STARTS" in out


def test_a_setup_that_fails_exits_1_with_the_way_out(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["vllm", "llama-3.1-8b", "--gpu", "L4"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILS: ValueError: To serve at least one request" in out
    assert "largest --max-model-len that starts:" in out


def test_without_max_model_len_the_nearest_configuration_is_still_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No --max-model-len (the model's own 131,072 tokens) and weights that fill one T4: the
    answer names a configuration that starts at that length (it was left out: the planner
    refused a job without its length)."""
    rc = main(["vllm", "qwen2.5-7b", "--gpu", "T4", "--json"])
    nearest = json.loads(capsys.readouterr().out)["nearest_start"]
    assert rc == 1 and nearest is not None and nearest["gpus"] > 1
    assert "--max-model-len 131072" in nearest["command"]
    flags = nearest["command"].split()[3:]
    rc = main(["vllm", "qwen2.5-7b", "--gpu", "T4", *flags])
    assert rc == 0 and "STARTS" in capsys.readouterr().out


def test_a_model_too_large_for_the_gpu_names_the_nearest_configuration_that_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """issue 29: no --gpu-memory-utilization rescues a 70B model on one L40S; the answer names
    the serving planner's nearest configuration, and that configuration does start."""
    rc = main(["vllm", "llama-3.1-70b", "--gpu", "L40S", "--max-model-len", "8192"])
    out = capsys.readouterr().out
    assert rc == 1 and "nearest change that starts: " in out
    main(["vllm", "llama-3.1-70b", "--gpu", "L40S", "--max-model-len", "8192", "--json"])
    nearest = json.loads(capsys.readouterr().out)["nearest_start"]
    assert nearest["gpus"] > 1 and nearest["command"].startswith("vllm serve")
    flags = nearest["command"].split()[3:]
    rc = main(["vllm", "llama-3.1-70b", "--gpu", "L40S", *flags])
    assert rc == 0 and "STARTS" in capsys.readouterr().out


def test_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "vllm",
            "qwen2.5-7b",
            "--gpu",
            "H100",
            "-tp",
            "2",
            "--json",
            "--port",
            "8000",
            "--enable-prefix-caching",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in (
        "weights_bytes",
        "activation_peak_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "kv_cache_bytes",
        "kv_cache_tokens",
        "max_concurrency",
        "starts",
    ):
        assert key in data
    assert data["command"].startswith("vllm serve Qwen/Qwen2.5-7B --tensor-parallel-size 2")


def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["vllm", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory-utilization", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--gpu-memory-utilization (2.0) must be in (0, 1]" in err
    assert main(["vllm", "llama-3.1-8b", "--gpu", "H100", "--gpus", "3", "--tp", "2"]) == 2


def test_fit_runtime_vllm_solves_concurrency_like_vllms_log_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["fit", "llama-3.1-8b", "--gpu", "L40S", "--solve", "concurrency", "--mode", "infer",
            "--seq", "8192", "--runtime", "vllm", "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_value"] == int(data["max_concurrency"]) > 9  # generate() holds 9
    assert data["command"] == "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192"


def test_fit_runtime_vllm_solves_the_largest_max_model_len(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["fit", "llama-3.1-8b", "--gpu", "L4", "--solve", "max-model-len", "--runtime", "vllm",
            "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    n = data["max_value"]
    assert 0 < n < 131072 and data["starts"] and data["max_concurrency"] >= 1
    assert main(["vllm", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", str(n + 64)]) == 1


def test_max_model_len_without_the_vllm_runtime_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["fit", "llama-3.1-8b", "--gpu", "L4", "--solve", "max-model-len"]
    assert main(args) == 2
    assert "--runtime vllm" in capsys.readouterr().err


def test_plan_runtime_vllm_emits_a_serve_command_that_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "llama-3.1-8b", "--gpu", "L40S", "--mode", "infer", "--seq", "8192",
            "--runtime", "vllm", "--concurrency", "64", "--json"]  # fmt: skip
    assert main(args) == 0
    option = json.loads(capsys.readouterr().out)["options"][0]
    assert option["max_concurrency"] >= 64 and option["starts"]
    command = option["command"].split()
    assert command[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    assert main(["vllm", "llama-3.1-8b", "--gpu", "L40S", *command[3:]]) == 0


def test_plan_runtime_vllm_says_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "llama-3.1-70b", "--gpu", "T4", "--mode", "infer", "--seq", "8192",
            "--runtime", "vllm", "--concurrency", "8"]  # fmt: skip
    assert main(args) == 1
    assert "NOTHING FITS" in capsys.readouterr().out


def test_fit_runtime_vllm_serves_one_replica_over_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "llama-3.1-70b", "--gpu", "H100", "--solve", "concurrency", "--mode", "infer",
            "--seq", "8192", "--runtime", "vllm", "--gpus", "4", "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert "--tensor-parallel-size 4" in data["command"] and data["max_value"] > 8


def test_a_quantization_the_gpu_is_too_old_for_is_refused_as_vllm_refuses_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """issue 33 item 7: fp8 needs compute capability 8.0 in vLLM (Fp8Config.get_min_capability);
    a V100 (7.0) is refused before any memory line, an L40S (8.9) starts."""
    rc = main(["vllm", "llama-3.1-8b", "--gpu", "V100-32GB", "--quantization", "fp8"])
    out = capsys.readouterr().out
    assert rc == 1 and "Minimum capability: 80. Current capability: 70." in out
    assert "Model loading took" not in out
    assert main(["vllm", "llama-3.1-8b", "--gpu", "L40S", "--quantization", "fp8"]) == 0

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

"""`memfit check` hands a `vllm serve` command line or config to the serving model."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def run(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "text",
    [
        "# start the server\nvllm serve meta-llama/Llama-3.1-8B \\\n  --max-model-len 16384 "
        "--gpu-memory-utilization 0.85 --port 8000\n",
        "model: meta-llama/Llama-3.1-8B\nmax_model_len: 16384\ngpu_memory_utilization: 0.85\n"
        "enforce_eager: false\n",
    ],
    ids=["command-line", "config-yaml"],
)
def test_a_vllm_serve_job_is_answered_as_memfit_vllm_answers_it(tmp_path, capsys, text):
    f = tmp_path / "serve.yaml"
    f.write_text(text)
    code, checked = run(capsys, "check", str(f), "--gpu", "L40S")
    direct_code, direct = run(
        capsys,
        "vllm",
        "meta-llama/Llama-3.1-8B",
        "--max-model-len",
        "16384",
        "--gpu-memory-utilization",
        "0.85",
        "--gpu",
        "L40S",
    )
    assert (code, checked) == (direct_code, direct)
    assert checked["kv_cache_tokens"] > 0 and "starts" in checked


def test_a_broken_command_line_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "serve.sh"
    f.write_text('vllm serve "unterminated\n')
    assert main(["check", str(f)]) == 2
    assert "cannot be split" in capsys.readouterr().err

"""`memfit check` on a torchtune recipe or a LitGPT config: which code path answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memfit
from memfit.cli import main
from memfit.estimate.trace import frameworks

EXAMPLES = Path(__file__).parent / "examples"
LITGPT = EXAMPLES / "litgpt-llama-3.1-8b-qlora.yaml"
TORCHTUNE = EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml"
TRL = EXAMPLES / "trl-sft-config.yaml"


@pytest.fixture
def framework_calls(monkeypatch):
    """Record the framework engine's calls; answer with the analytic estimate (the trace of an
    8B model is tests/estimate/trace/frameworks' and the benchmark's business, not routing's)."""
    calls = []

    def fake(framework, data, workload, *, gpu=None, **options):
        calls.append((framework, data, workload))
        return memfit.estimate("meta-llama/Llama-3.1-8B", workload, gpu=gpu, engine="analytic")

    monkeypatch.setattr(frameworks, "estimate_with_framework", fake)
    return calls


def check(capsys, *argv):
    code = main(["check", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("path", "framework", "answered"),
    [
        (LITGPT, "litgpt", "LitGPT's model + finetune step"),
        (TORCHTUNE, "torchtune", "torchtune's model + recipe step"),
    ],
)
def test_an_installed_framework_answers_for_its_own_config(
    capsys, monkeypatch, framework_calls, path, framework, answered
):
    monkeypatch.setattr(frameworks, "missing", lambda name: None)
    _, out = check(capsys, path, "--gpu", "A100-80GB")
    assert out["answered_by"] == answered and out["note"] is None
    ((called, data, workload),) = framework_calls
    assert called == framework
    assert data == json.loads(json.dumps(data))  # the parsed file, handed over as it is
    assert workload.seq_len == out["workload"]["seq_len"]


def test_without_the_framework_transformers_answers_and_says_what_to_install(
    capsys, monkeypatch, framework_calls
):
    monkeypatch.setattr(
        frameworks, "missing", lambda name: f"{name} is not installed: pip install 'memfit[{name}]'"
    )
    _, out = check(capsys, LITGPT, "--gpu", "A100-80GB")
    assert framework_calls == []
    assert out["answered_by"] == "transformers' model, the framework's settings (analytic engine)"
    assert "pip install 'memfit[litgpt]'" in out["note"]


def test_engine_framework_without_the_package_is_exit_2_naming_the_extra(capsys, monkeypatch):
    monkeypatch.setattr(
        frameworks,
        "missing",
        lambda name: f"{name} is not installed: pip install 'memfit[{name}]' to trace the job",
    )
    assert main(["check", str(TORCHTUNE), "--engine", "framework"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'memfit[torchtune]'" in err and "Traceback" not in err


def test_an_explicit_engine_keeps_transformers_model(capsys, monkeypatch, framework_calls):
    monkeypatch.setattr(frameworks, "missing", lambda name: None)
    _, out = check(capsys, LITGPT, "--engine", "analytic")
    assert framework_calls == []
    assert out["answered_by"].startswith("transformers' model, the framework's settings")


def test_engine_framework_on_a_hugging_face_config_is_a_clear_error(capsys):
    assert main(["check", str(TRL), "--engine", "framework"]) == 2
    assert "needs a torchtune recipe or a LitGPT config" in capsys.readouterr().err


def test_frameworks_memfit_cannot_run_here_say_why():
    assert "transformers<=5.17.0" in frameworks.missing("unsloth")
    assert "torchtitan" in frameworks.missing("torchtitan")


def test_routing_imports_neither_torch_nor_a_framework():
    import subprocess
    import sys

    code = (
        "import sys; from memfit.estimate.trace import frameworks as f; f.missing('litgpt'); "
        "print(sorted(m for m in ('torch', 'litgpt', 'torchtune') if m in sys.modules))"
    )
    src = str(Path(memfit.__file__).resolve().parents[1])  # this checkout's memfit
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "[]"

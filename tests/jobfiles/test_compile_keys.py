"""A job file's torch.compile switch is read as memfit's ``compile`` field (HF / TRL and axolotl
``torch_compile``, torchtune ``compile``) instead of a "not modelled" warning; the CUDA-graph
compile modes and other backends stay "not modelled"."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.jobfiles.files import read_job
from memfit.jobfiles.job import workload_of

PRACTICE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "practice"
TRL = (
    "model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 1024\n"
    "per_device_train_batch_size: 2\nbf16: true\n"
)


def _job(path: Path):
    job = read_job([path])
    return job, workload_of(job, overrides={"seq_len": 1024})


def _warned(job) -> set[str]:
    return {w.key for w in job.warnings} | {k for _, k in job.unknown()}


@pytest.mark.parametrize(("value", "on"), [("true", True), ("false", False)])
def test_hf_torch_compile_is_the_compile_field(tmp_path, value, on) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text(TRL + f"torch_compile: {value}\n")
    job, w = _job(path)
    assert w.compile is on
    assert "torch_compile" not in _warned(job)


def test_a_cuda_graph_compile_mode_is_not_modelled(tmp_path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text(
        TRL + "torch_compile: true\ntorch_compile_mode: reduce-overhead\n"
        "torch_compile_backend: inductor\n"
    )
    job, w = _job(path)
    assert w.compile is True
    assert _warned(job) >= {"torch_compile_mode"}
    assert "torch_compile_backend" not in _warned(job)


def test_axolotl_torch_compile(tmp_path) -> None:
    text = (PRACTICE / "axolotl-llama-3-lora-8b.yml").read_text()
    path = tmp_path / "cfg.yml"
    path.write_text(text + "torch_compile: true\n")
    job, w = _job(path)
    assert w.compile is True
    assert "torch_compile" not in _warned(job)


def test_torchtune_compile(tmp_path) -> None:
    text = (PRACTICE / "torchtune-llama3_1-8B_lora_single_device.yaml").read_text()
    assert "\ncompile: False" in text
    path = tmp_path / "tt.yaml"
    path.write_text(text.replace("\ncompile: False", "\ncompile: True"))
    job, w = _job(path)
    assert w.compile is True
    assert "compile" not in _warned(job)
    path.write_text(text)
    assert _job(path)[1].compile is False


def test_an_autocast_switch_over_a_half_load_in_another_file_is_one_precision(tmp_path) -> None:
    """accelerate's ``mixed_precision: bf16`` beside a TRL file that loads the model in bfloat16
    is pure bf16 training (autocast over bf16 weights), not a disagreement: the edit memfit's
    own check fix writes (``dtype: bfloat16``) must read back."""
    examples = Path(__file__).parent / "examples"
    trl = tmp_path / "sft.yaml"
    trl.write_text((examples / "trl-sft-config.yaml").read_text() + "dtype: bfloat16\n")
    acc = tmp_path / "accelerate.yaml"
    acc.write_text((examples / "accelerate-fsdp2.yaml").read_text())
    job = read_job([trl, acc])
    assert job.fields["precision"].value == "bf16-true"
    assert job.fields["precision"].key == "dtype"


def test_check_prints_the_estimates_caveats_not_the_engines_description(capsys, monkeypatch):
    """``check`` prints the estimate's notes less the engine's description of itself ("answered
    by" names the engine); a caveat of the same engine (an installed library version other
    than the one its programs were written against) is printed."""
    from memfit.cli import main
    from memfit.estimate.analytic import api

    caveat = "analytic engine: installed torch 9.9 differs from 2.13, the version its programs"
    monkeypatch.setattr(api, "version_notes", lambda: (caveat,))
    examples = Path(__file__).parent / "examples"
    argv = ["check", str(examples / "trl-sft-config.yaml"), "--gpu", "H100", "--engine", "analytic"]
    main(argv)
    out = capsys.readouterr().out
    assert f"note: {caveat}" in out
    assert f"note: {api.DESCRIPTION_START}" not in out

"""The command line: output contract, exit codes, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.cli import main

JSON_KEYS = {
    "model",
    "workload",
    "engine",
    "environment",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "cuda_context_bytes",
    "device_used_bytes",
    "peak_phase",
    "components",
    "phases",
    "top_modules",
    "fits",
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    # the trace engine's answer (the default engine answers this validated job analytically,
    # whose environment names memfit's model readers instead of torch / transformers / peft)
    code, out, _ = run(
        capsys,
        *("estimate", "gpt2", "--batch", "2", "--seq", "128", "--json", "--gpu", "A100-80GB"),
        *("--engine", "trace"),
    )
    data = json.loads(out)
    assert code == 0
    assert set(data) >= JSON_KEYS
    assert set(data["model"]) == {"name", "n_params", "n_trainable_params"}
    assert data["model"]["n_params"] == 124_439_808
    assert sum(data["components"].values()) == data["peak_allocated_bytes"]
    assert set(data["components"]) == {
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "kv_cache",
        "temporary",
    }
    assert data["peak_phase"] in data["phases"]
    assert data["fits"]["gpu"] == "A100-80GB" and data["fits"]["fits"] is True
    assert data["device_used_bytes"] >= data["peak_reserved_bytes"] >= data["peak_allocated_bytes"]
    assert {"torch", "transformers", "peft"} <= set(data["environment"])
    assert data["workload"]["optimizer"] == "adamw"


def test_human_output_shows_components_peak_phase_modules_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the trace names the modules at the peak (the analytic engine, auto's answer on a T4 now,
    # has no module attribution)
    code, out, _ = run(
        capsys, "estimate", "gpt2", "--seq", "128", "--gpu", "T4", "--engine", "trace"
    )
    assert code == 0
    for text in (
        "parameters",
        "optimizer_states",
        "peak allocated",
        "device used",
        "top modules at the peak",
        "verdict: FITS on T4",
    ):
        assert text in out


def test_does_not_fit_exits_1_with_the_shortfall(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-2-7b", "--seq", "256", "--gpu", "T4")
    assert code == 1
    # the T4's capacity: torch's 14.563 GiB (current drivers), not nvidia-smi's 15.00 GiB
    assert "DOES NOT FIT on T4" in out and "GiB more than its 14.56 GiB" in out


def test_inference_reports_the_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "estimate", "gpt2", "--mode", "infer", "--seq", "256", "--new-tokens", "8", "--json"
    )
    data = json.loads(out)
    assert code == 0
    assert set(data["phases"]) == {"prefill", "decode"}
    # GPT-2: 12 layers × 2 (K, V) × 263 tokens × 768 × 2 bytes (bf16) after the last decode step
    assert data["phases"]["decode"]["components"]["kv_cache"] >= 12 * 2 * 263 * 768 * 2
    assert "optimizer" not in data["workload"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "no-such-model-xyz"], "unknown model"),
        (["estimate", "gpt2", "--batch", "0"], r"batch_size \(0\) must be a positive integer"),
        (["estimate", "gpt2", "--batch", "-3"], r"batch_size \(-3\) must be a positive integer"),
        (["estimate", "gpt2", "--seq", "999999999"], r"seq_len \(999999999\) is beyond"),
        (["estimate", "gpt2", "--gpu", "A1000"], "did you mean"),
        (["estimate", "gpt2", "--mode", "infer", "--optimizer", "adamw"], "contradicts mode"),
        (["estimate", "gpt2", "--new-tokens", "5"], "only applies to mode 'infer'"),
        (["estimate", "gpt2", "--precision", "fp8"], "invalid choice"),
        (["estimate", "gpt2", "--batch", "two"], "expected a whole number"),
        (["estimate", "gpt2", "--lora-rank", "0"], r"lora_rank \(0\)"),
        (["estimate", "gpt2", "--freeze", "40"], r"freeze_layers \(40\) exceeds"),
        (
            ["estimate", "clip-vit-large-patch14", "--seq", "77", "--freeze", "2"],
            r"CLIPModel has no single input embedding",
        ),
        (["estimate", "gpt2", "--seq", "4096"], r"exceeds gpt2's 1024 learned positions"),
        (["estimate", "clip-vit-large-patch14"], r"seq_len \(512\) exceeds clip's 77 text"),
        (["estimate", "gpt2", "--gpus", "4", "--tp", "3"], r"tp \(3\) must divide gpus \(4\)"),
        (["estimate", "gpt2", "--gpus", "2", "--tp", "2"], r"model_type 'gpt2'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc_info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert exc_info.value.code == 2
    assert err.startswith("memfit: error:") and err.count("\n") == 1
    assert "Traceback" not in err
    import re

    assert re.search(message, err), err


def test_malformed_and_truncated_config_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 4096, "num_hid')
    code, _, err = run(capsys, "estimate", str(bad))
    assert code == 2 and "config.json" in err and err.count("\n") == 1
    bad.write_text('{"hidden_size": 4096}')
    code, _, err = run(capsys, "estimate", str(bad))
    assert code == 2 and "model_type" in err


def test_the_models_table_keeps_its_columns_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """A name longer than the old fixed column (vit-base-patch16-224-in21k) ran into its family."""
    code, out, _ = run(capsys, "models")
    rows = json.loads(run(capsys, "models", "--json")[1])
    table = out.split("\n\ndiffusion pipelines")[0].splitlines()[1:]
    assert code == 0 and len(table) == len(rows)
    for line, row in zip(table, rows, strict=True):
        assert line.split()[:3] == [row["name"], row["family"], row["task"]]


def test_models_and_gpus_list_the_catalogs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models", "--json")
    models = json.loads(out)
    assert code == 0 and len(models) >= 25
    assert all(m["source_url"].startswith("https://huggingface.co/") for m in models)
    code, out, _ = run(capsys, "gpus", "--json")
    names = {g["name"] for g in json.loads(out)}
    assert {
        "V100-16GB",
        "V100-32GB",
        "T4",
        "A10G",
        "L4",
        "A2",
        "A30",
        "A100-40GB",
        "A100-80GB",
        "RTX-3090",
        "RTX-4090",
        "RTX-6000-Ada",
        "L40S",
        "H100-80GB",
        "H200",
    } <= names
    rows = {g["name"]: g for g in json.loads(out)}
    t4, b200 = rows["T4"], rows["B200"]
    assert t4["capacity_measured"] and t4["capacity_bytes"] < t4["memory_bytes"] == 15360 * 2**20
    assert not b200["capacity_measured"] and b200["capacity_bytes"] < b200["memory_bytes"]


def test_gpus_table_shows_capacity_and_marks_estimates(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "capacity" in out.splitlines()[0]
    lines = {line.split()[0]: line for line in out.splitlines() if line and line[0] != " "}
    assert "14.6 GiB " in lines["T4"] and "178.3 GiB~" in lines["B200"]


def test_python_dash_m_and_help_end_with_examples() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memfit", "estimate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "examples:" in proc.stdout and "--lora-targets" in proc.stdout


def test_paged_optimizer_reports_unified_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import TINY_LLAMA

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY_LLAMA, "vocab_size": 1000}))
    argv = ["estimate", str(config), "--seq", "32", "--engine", "trace", "--json"]
    code, out, _ = run(capsys, *argv, "--optimizer", "paged-adamw-8bit")
    data = json.loads(out)
    # bitsandbytes pages the states of the 128 000-element embedding (fp32, HF Trainer's 32-bit
    # override) and LM head (uint8); the smaller matrices' states stay in ordinary device memory.
    assert code == 0 and data["unified_memory_bytes"] == 2 * 128_000 * 4 + 2 * 128_000
    assert any("paged" in note for note in data["notes"])
    _, out, _ = run(capsys, *argv, "--optimizer", "adamw-8bit")
    plain = json.loads(out)
    assert plain["unified_memory_bytes"] == 0
    assert plain["components"]["optimizer_states"] == data["components"]["optimizer_states"]


def test_qlora_estimate_stores_the_base_in_4_bits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "gpt2", "--lora-rank", "8", "--seq", "64", "--json"]
    code, out, _ = run(capsys, *argv)
    plain = json.loads(out)
    code_q, out_q, _ = run(capsys, *argv, "--quant", "nf4")
    nf4 = json.loads(out_q)
    assert code == code_q == 0
    assert nf4["workload"]["quant"] == "nf4"
    assert nf4["model"]["n_params"] == plain["model"]["n_params"]
    # 72 decoder linears go from 2 bytes to 4.5 bits per weight; embeddings (tied lm_head) stay
    assert nf4["components"]["parameters"] < 0.75 * plain["components"]["parameters"]


def test_fp8_on_a_gpu_without_fp8_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "gpt2", "--mode", "infer", "--quant", "fp8", "--gpu", "T4"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1
    assert "quant 'fp8' cannot run on T4 (compute capability 7.5)" in err


def test_gpus_and_shard_give_per_gpu_memory_and_host_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import TINY_LLAMA

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    argv = ["estimate", str(config), "--seq", "32", "--engine", "trace", "--json"]
    _, out, _ = run(capsys, *argv)
    one = json.loads(out)
    code, out, _ = run(capsys, *argv, "--gpus", "4", "--shard", "fsdp", "--offload", "params")
    fsdp = json.loads(out)
    assert code == 0 and fsdp["workload"]["gpus"] == 4 and fsdp["workload"]["shard"] == "fsdp"
    assert fsdp["components"]["optimizer_states"] == 0
    # sharded params, grads and AdamW states (bf16) in host RAM: at least a quarter of the model's
    assert fsdp["host_memory_bytes"] >= one["model"]["n_params"] * 2 * 4 // 4
    assert any("FSDP2 traced" in note for note in fsdp["notes"])


def test_torchs_user_warnings_are_not_shown_to_a_cli_user(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A UserWarning torch raises while memfit traces a model (a dtype mismatch that "cannot
    dispatch to fused implementation") is about a kernel the trace never runs: not printed;
    MEMFIT_DEBUG=1 keeps it, and other libraries' warnings are untouched."""
    import warnings

    def warned(*, debug: bool) -> list[str]:
        if debug:
            monkeypatch.setenv("MEMFIT_DEBUG", "1")
        else:
            monkeypatch.delenv("MEMFIT_DEBUG", raising=False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            assert main(["gpus", "--json"]) == 0
            for module in ("torch.nn.functional", "peft.tuners"):
                warnings.warn_explicit("w", UserWarning, "f.py", 1, module=module)
        capsys.readouterr()
        return sorted(str(w.filename) + ":" + str(w.message) for w in seen)

    assert len(warned(debug=False)) == 1  # peft's, not torch's
    assert len(warned(debug=True)) == 2

"""``memfit check``'s fix that changes the result (QLoRA, ``--allow quant``) and a bf16 file on a
GPU without bf16 (the fix writes fp16): memfit.cli.check_options / memfit.cli.check_bf16."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.cli.check_bf16 import TRANSFORMERS_REFUSAL
from memfit.cli.check_fix import CheckFix, recipe_request
from memfit.cli.check_options import Price, _slower
from memfit.jobfiles import read_job, workload_of
from memfit.models import resolve_model
from memfit.plan import plan
from memfit.spec import WorkloadSpec

EXAMPLES = Path(__file__).parent / "examples"
#: LLaMA-Factory's examples/train_lora/llama3_lora_sft.yaml on Llama-3.1-8B (LoRA r8, bf16).
LF_LORA = "llamafactory-llama3-lora-sft.yaml"


def _check(capsys, paths, gpu, *extra) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    argv = ["check", *map(str, paths), "--gpu", gpu, "--engine", "analytic", "--json", *extra]
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def _copy(tmp_path: Path, name: str, edit: tuple[str, str] | None = None) -> Path:
    path = tmp_path / name
    shutil.copy(EXAMPLES / name, path)
    if edit is not None:
        path.write_text(path.read_text().replace(*edit))
    return path


def test_an_8b_lora_file_on_a_t4_names_qlora_in_its_own_key_and_writes_nothing(tmp_path, capsys):
    path = _copy(tmp_path, LF_LORA)
    original = path.read_text()
    code, out = _check(capsys, [path], "T4", "--write")
    fix = out["fix"]
    assert code == 1 and not fix["diff"] and fix["message"].startswith("no change")
    # the planner's memory-only nearest (ZeRO-3 parameter offload) is shown with its step time
    assert "offload params" in fix["message"] and "s/step" in fix["message"]
    qlora = fix["other"]
    assert {"file": str(path), "key": "quantization_bit", "old": None, "new": 4} in qlora["keys"]
    assert qlora["changes"]["quant"] == "nf4-dq" and qlora["verdict"] == "fits"
    assert any(c.startswith("nf4-dq base weights (4-bit") for c in qlora["changes_result"])
    assert qlora["price"]["step_s"] > 0 and qlora["price"]["usd_per_million_tokens"] > 0
    assert "--allow quant --write" in fix["why"]
    assert path.read_text() == original and not list(tmp_path.glob("*.memfit-orig"))


def test_allow_quant_writes_qlora_and_the_written_file_fits(tmp_path, capsys):
    path = _copy(tmp_path, LF_LORA)
    code, out = _check(capsys, [path], "T4", "--allow", "quant", "--write")
    assert code == 0 and out["fix"]["written_verdict"] == "fits"
    text = path.read_text()
    assert "quantization_bit: 4" in text and "fp16: true" in text and "bf16: false" in text
    code, again = _check(capsys, [path], "T4")
    assert code == 0 and again["fix"] is None and again["not_runnable"] is None
    assert again["workload"]["quant"] == "nf4-dq"
    assert again["workload"]["lora_rank"] == 8 and again["workload"]["precision"] == "16-true"


def test_check_and_plan_agree_on_the_quantized_base(tmp_path):
    """``memfit plan --allow quant`` on the same job recommends a 4-bit base over ZeRO-3
    parameter offload (one GPU: offload last), and check's QLoRA fix is that base."""
    path = _copy(tmp_path, LF_LORA, ("bf16: true", "fp16: true"))
    job = read_job([path])
    source = resolve_model("meta-llama/Llama-3.1-8B")
    w = workload_of(job)
    memory_only = plan(source, recipe_request(w), gpu="T4").recommended
    asked = replace(recipe_request(w), allow_quant=True, allow=frozenset({"quant"}))
    rec = plan(source, asked, gpu="T4").recommended
    assert memory_only is not None and memory_only.settings.offload == "params"
    assert rec is not None and rec.settings.quant == "nf4-dq" and rec.settings.offload == "none"
    assert rec.cost.step_s * 2 < memory_only.cost.step_s
    main(["check", str(path), "--gpu", "T4", "--engine", "analytic", "--json"])


def test_check_names_the_planners_quantized_base(tmp_path, capsys):
    path = _copy(tmp_path, LF_LORA, ("bf16: true", "fp16: true"))
    job = read_job([path])
    w = workload_of(job)
    asked = replace(recipe_request(w), allow_quant=True, allow=frozenset({"quant"}))
    rec = plan(resolve_model("meta-llama/Llama-3.1-8B"), asked, gpu="T4").recommended
    _, out = _check(capsys, [path], "T4")
    other = out["fix"]["other"]
    assert rec is not None and other["changes"]["quant"] == rec.settings.quant
    assert other["price"]["step_s"] == pytest.approx(rec.cost.step_s, rel=0.05)


def _fix(step_s: float, **workload: object) -> CheckFix:
    w = WorkloadSpec(mode="train", lora_rank=8, **workload)  # type: ignore[arg-type]
    return CheckFix(edits=[object()], workload=w, price=Price(step_s=step_s, usd_per_mtok=None))  # type: ignore[list-item]


def test_memory_only_first_unless_several_times_slower_or_offloaded_on_one_gpu():
    quant = _fix(10.0)
    assert _slower(_fix(20.0), quant) is None  # 2x: the memory-only fix stays first
    assert "3.0x the step time" in str(_slower(_fix(30.0), quant))
    assert "host RAM on one GPU" in str(
        _slower(_fix(12.0, offload="optimizer", shard="zero2"), quant)
    )
    assert _slower(CheckFix(message="none"), quant) == "no memory-only change fits"


# -- bf16 on a GPU without bf16 ---------------------------------------------------------------

SMALL = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B")


def test_a_bf16_file_does_not_run_as_written_on_a_t4_and_the_fix_writes_fp16(tmp_path, capsys):
    path = _copy(tmp_path, LF_LORA, SMALL)
    code, out = _check(capsys, [path], "T4")
    assert code == 1 and TRANSFORMERS_REFUSAL in out["not_runnable"]
    assert out["workload"]["precision"] == "16-true"  # estimated as the fix writes it
    keys = {(k["key"], k["old"], k["new"]) for k in out["fix"]["keys"]}
    assert keys == {("bf16", True, False), ("fp16", None, True)}
    code, wrote = _check(capsys, [path], "T4", "--write")
    assert code == 0 and wrote["fix"]["written_verdict"] == "fits"
    code, again = _check(capsys, [path], "T4")
    assert code == 0 and again["not_runnable"] is None and again["fix"] is None


def test_the_same_bf16_file_runs_as_written_on_a_gpu_with_bf16(tmp_path, capsys):
    path = _copy(tmp_path, LF_LORA, SMALL)
    code, out = _check(capsys, [path], "L4")
    assert code == 0 and out["not_runnable"] is None and out["fix"] is None
    assert out["workload"]["precision"] == "bf16-true"


def test_a_full_fine_tune_loaded_in_bf16_is_written_as_fp32_weights_under_fp16(tmp_path, capsys):
    """fp16 trainable weights stop the Trainer's GradScaler ("Attempting to unscale FP16
    gradients"): a full fine-tune's bfloat16 load dtype becomes float32."""
    path = tmp_path / "sft.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 1\n"
        "max_length: 512\nbf16: true\ndtype: bfloat16\noutput_dir: out\n"
    )
    code, out = _check(capsys, [path], "T4")
    keys = {(k["key"], k["new"]) for k in out["fix"]["keys"]}
    assert {("bf16", False), ("fp16", True), ("dtype", "float32")} <= keys
    assert out["workload"]["precision"] == "16-mixed"


def test_the_refusal_quoted_is_the_installed_transformers_text():
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.skip("transformers is not installed")
    source = (Path(spec.origin).parent / "training_args.py").read_text()
    first, second = TRANSFORMERS_REFUSAL.split(" You need Ampere+")
    assert f'"{first}"' in source and '" You need Ampere+' + second + '"' in source


def test_an_accelerate_config_naming_bf16_is_switched_with_the_training_arguments(tmp_path, capsys):
    """Files that disagree on the precision do not combine: the launcher's mixed_precision
    is written fp16 with the Trainer's flags, and the edited pair reads back as one job."""
    args = tmp_path / "args.yaml"
    args.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 1\n"
        "max_length: 512\nbf16: true\nuse_peft: true\nlora_r: 8\noutput_dir: out\n"
    )
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n")
    code, out = _check(capsys, [args, acc], "T4", "--write")
    keys = {(Path(k["file"]).name, k["key"], k["new"]) for k in out["fix"]["keys"]}
    assert ("accelerate.yaml", "mixed_precision", "fp16") in keys
    assert ("args.yaml", "fp16", True) in keys
    assert code == 0 and "mixed_precision: fp16" in acc.read_text()


def test_a_result_changing_label_says_its_kind_once(tmp_path, capsys):
    """The report prefixes each result-changing change with its kind: the label must not say
    it again ("changes the result: nf4-dq base weights (changes the result: ...)")."""
    main(["check", str(_copy(tmp_path, LF_LORA)), "--gpu", "T4"])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "changes the result: " in ln]
    assert lines, out
    assert not [ln for ln in lines if ln.count("changes the result") > 1], lines

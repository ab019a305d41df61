"""`memfit check`'s fix keeps the kernels the files run (issue 29): a LLaMA-Factory file with
``use_unsloth: true`` is planned with Unsloth's kernels, its offloaded checkpoints and fused CE
(the request every described job takes, memfit.plan.request.job_request), and neither the
printed fix nor the written files drop them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from memfit.cli import main
from memfit.cli.check_fix import kept_fields, recipe_request
from memfit.jobfiles import read_job, workload_of
from memfit.plan import plan
from memfit.plan.space import Settings

EXAMPLES = Path(__file__).parent / "examples"
UNSLOTH = "llamafactory-qwen3-lora-sft-unsloth.yaml"


def _copy(tmp_path: Path, name: str = UNSLOTH) -> Path:
    shutil.copy(EXAMPLES / name, tmp_path / name)
    return tmp_path / name


def _check(capsys, path: Path, gpu: str, *extra: str) -> tuple[int, dict]:
    code = main(["check", str(path), "--gpu", gpu, "--engine", "analytic", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def _kernels(path: Path) -> tuple[str, str, str]:
    w = workload_of(read_job([path]))
    return w.kernels, w.checkpointing, w.loss


def test_the_fix_of_an_unsloth_file_is_planned_and_written_with_unsloths_kernels(
    tmp_path, capsys
) -> None:
    path = _copy(tmp_path)
    assert _kernels(path) == ("unsloth", "offload", "fused")
    code, out = _check(capsys, path, "RTX-4090")
    fix = out["fix"]
    assert code == 1 and fix["verdict"] == "fits"
    # the plan it comes from runs Unsloth's kernels and checkpoints (not peft's layers)
    assert "unsloth kernels" in fix["plan"] and "ckpt offload" in fix["plan"]
    assert "use_unsloth" not in fix["diff"] and "gradient_checkpointing" not in fix["diff"]
    assert set(fix["changes"]) <= {"batch_size", "grad_accum", "attention", "optimizer"}
    code, wrote = _check(capsys, path, "RTX-4090", "--write")
    assert code == 0 and wrote["fix"]["written_verdict"] == "fits"
    assert _kernels(path) == ("unsloth", "offload", "fused")  # the written file, read again
    assert "use_unsloth: true" in path.read_text()


def test_the_fix_request_carries_the_files_kernels_by_the_shared_rule() -> None:
    w = workload_of(read_job([EXAMPLES / UNSLOTH]))
    r = recipe_request(w)
    assert (r.kernels, r.checkpointing, r.loss) == ("unsloth", "offload", "fused")
    assert r.lora_asked and r.lora_ranks == (8,) and r.keep_full_finetune is False
    plain = workload_of(read_job([EXAMPLES / "llamafactory-qwen3-lora-sft-otfq.yaml"]))
    assert recipe_request(plain).kernels == "hf"


def test_use_unsloth_holds_the_checkpointing_in_every_plan_of_the_fix() -> None:
    """LLaMA-Factory's Unsloth path checkpoints to host RAM whatever the file says: the fix's
    planner keeps ``offload`` (a plan changing it would edit a key with no effect)."""
    w = workload_of(read_job([EXAMPLES / UNSLOTH]))
    result = plan("qwen3-8b", recipe_request(w, keep_checkpointing=True), gpu="L40S")
    shown = [result.recommended, *result.alternatives]
    assert shown[0] is not None
    assert {(o.settings.kernels, o.settings.checkpointing) for o in shown} == {
        ("unsloth", "offload")
    }
    free = plan("qwen3-8b", recipe_request(w), gpu="L40S")
    ckpts = {o.settings.checkpointing for o in [free.recommended, *free.alternatives] if o}
    assert {o.settings.kernels for o in [free.recommended, *free.alternatives] if o} == {"unsloth"}
    assert ckpts - {"offload"}  # without the hold the planner does try the others


def test_a_plan_that_swaps_the_kernels_is_a_change_the_fix_never_offers() -> None:
    w = workload_of(read_job([EXAMPLES / UNSLOTH]))
    base = {
        "precision": w.precision, "attention": w.attention, "optimizer": w.optimizer,
        "lora_rank": w.lora_rank, "lora_targets": w.lora_targets, "loss": w.loss,
        "checkpointing": w.checkpointing, "micro_batch": 1, "grad_accum": 16,
    }  # fmt: skip
    assert kept_fields(Settings(**base, kernels="hf"), w) == {"kernels": "hf"}
    assert kept_fields(Settings(**base, kernels="unsloth"), w) == {}

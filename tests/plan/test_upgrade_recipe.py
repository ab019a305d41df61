"""``memfit upgrade`` answers the job as asked, recipe included (issue 29): ``--lora-rank``,
``--quant``, ``--kernels`` ... are plan's own flag rows (memfit.flags), read by one function
(memfit.cli.plan.recipe_fields), so a LoRA / QLoRA / Unsloth job is never checked as a full
fine-tune, and the GPUs upgrade names are the ones ``plan --recommend-gpu`` names for the job."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main
from memfit.flags import flags_for

JOB = ["llama-3.1-8b", "--seq", "4096", "--lora-rank", "16", "--engine", "analytic"]
#: the recipe flags upgrade takes, as plan takes them
RECIPE = (
    "--lora-rank", "--lora-targets", "--lora-modules-to-save", "--lora-dropout", "--quant",
    "--kernels", "--loss", "--prepare-kbit", "--optimizer-in-bwd", "--precision", "--optimizer",
    "--attention",
)  # fmt: skip


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_upgrade_takes_plans_own_flag_rows_not_a_parallel_set() -> None:
    upgrade = {f.name: f for f in flags_for("upgrade", *RECIPE)}
    plan = {f.name: f for f in flags_for("plan", *RECIPE)}
    assert all(upgrade[name] is plan[name] for name in RECIPE)  # the same row objects


def test_a_lora_job_stays_lora_and_its_gpus_are_plan_recommend_gpus(capsys) -> None:
    code, up = _json(capsys, "upgrade", *JOB, "--gpu", "T4")
    assert code == 1 and up["verdict"] == "upgrade"
    request = up["request"]
    assert request["lora_asked"] is True and request["lora_ranks"] == [16]
    assert "LoRA r16" in up["recommended_plan"]
    resolving = up["resolving_gpus"]
    assert resolving and all("LoRA r16" in a["plan"] for a in resolving)
    # one verdict: each GPU (and count) upgrade names is plan --recommend-gpu's, with its plan
    code, rec = _json(capsys, "plan", *JOB, "--recommend-gpu", "--allow-offload",
                      "--max-quality-risk", "medium")  # fmt: skip
    assert code == 0
    listed = {(a["gpu"], a["gpus"]): a for a in rec["gpus"]}
    for a in resolving:
        same = listed[(a["gpu"], a["gpus"])]
        assert (same["plan"], same["need_bytes"]) == (a["plan"], a["need_bytes"]), a["gpu"]


def test_a_qlora_unsloth_job_keeps_its_base_and_kernels_in_every_plan(capsys) -> None:
    code, up = _json(capsys, "upgrade", *JOB, "--quant", "nf4", "--kernels", "unsloth",
                     "--gpu", "T4", "--no-recommend")  # fmt: skip
    assert code in (0, 1)
    request = up["request"]
    assert (request["quant"], request["kernels"], request["lora_ranks"]) == ("nf4", "unsloth", [16])
    # Unsloth's defaults by the rule plan and estimate share (spec.with_kernel_defaults)
    assert (request["checkpointing"], request["loss"]) == ("offload", "fused")
    assert any("Unsloth's defaults" in n for n in up["notes"])
    plans = [up["recommended_plan"]] + [
        i["evidence"]
        for i in up["items"]
        if "plan" in i["evidence"] and i["status"] != "not_applicable"
    ]
    for text in plans:
        assert "QLoRA r16" in text and "unsloth kernels" in text, text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--mode", "infer"), "lora_rank is a training technique"),
        (("--quant", "int4-bogus"), "invalid choice"),
    ],
)
def test_upgrade_refuses_a_recipe_its_mode_cannot_run(capsys, extra, message) -> None:
    with pytest.raises(SystemExit) as exc:
        code = main(["upgrade", *JOB, "--gpu", "T4", *extra])
        raise SystemExit(code)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_upgrade_kernels_with_mode_infer_is_bad_input(capsys) -> None:
    code = main(["upgrade", "llama-3.1-8b", "--gpu", "T4", "--mode", "infer", "--kernels",
                 "unsloth", "--engine", "analytic"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "kernels ('unsloth')" in err and "infer" in err

"""`--from FILE` on estimate / fit / plan: the file's job as defaults, flags override it."""

from __future__ import annotations

import json
from pathlib import Path

from memfit.cli import main

EXAMPLES = Path(__file__).parent / "examples"
AXOLOTL = str(EXAMPLES / "axolotl-llama3-qlora.yml")


def out_json(capsys, *argv: str) -> dict:
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_estimate_from_a_file_is_the_check_estimate(capsys):
    est = out_json(capsys, "estimate", "--from", AXOLOTL, "--engine", "analytic", "--gpu", "L4")
    check = out_json(capsys, "check", AXOLOTL, "--gpu", "L4")["estimate"]
    for d in (est, check):
        d["trace"]["analytic"].pop("wall_s")
    est.pop("nearest_fit", None)  # estimate names the nearest plan; check prints its own fix
    assert est == check
    assert est["workload"]["seq_len"] == 4096 and est["workload"]["lora_rank"] == 32


def test_flags_on_the_command_line_override_the_file(capsys):
    est = out_json(
        capsys,
        "estimate",
        "--from",
        AXOLOTL,
        "--engine",
        "analytic",
        "--seq",
        "1024",
        "--lora-rank",
        "8",
    )
    assert est["workload"]["seq_len"] == 1024 and est["workload"]["lora_rank"] == 8
    assert est["workload"]["batch_size"] == 2  # still the file's micro_batch_size


def test_fit_and_plan_take_the_files_job_as_their_defaults():
    from memfit.cli.from_files import job_defaults

    fit = job_defaults("fit", [AXOLOTL])
    assert fit["model"] == "meta-llama/Llama-3.1-8B"
    assert (fit["batch"], fit["seq"], fit["lora_rank"], fit["quant"]) == (2, 4096, 32, "nf4-dq")
    # axolotl casts prepare_model_for_kbit_training's fp32 upcast back: not prepare_kbit
    assert fit["grad_accum"] == 4 and not fit.get("prepare_kbit")
    plan = job_defaults("plan", [AXOLOTL])
    assert plan["global_batch"] == 2 * 4 and "batch" not in plan  # the planner splits it


def test_without_model_or_from_it_is_a_clear_error(capsys):
    assert main(["estimate"]) == 2
    assert "needs MODEL (or --from FILE" in capsys.readouterr().err


LLAMAFACTORY = str(EXAMPLES / "llamafactory-qwen3-lora-sft-otfq.yaml")


def test_plans_as_asked_is_the_files_job_with_checks_verdict(capsys):
    """``plan --from FILE``: "as asked" is the file's job — its micro-batch x accumulation and
    its checkpointing (LLaMA-Factory: 1 x 8, checkpointing on by default) — with the verdict
    and need ``check`` gives the same file, not the global batch at once without checkpointing
    (77.9 GiB, does not fit, where check said it fits)."""
    check = out_json(capsys, "check", LLAMAFACTORY, "--gpu", "L4")["estimate"]
    plan = out_json(capsys, "plan", "--from", LLAMAFACTORY, "--gpu", "L4", "--confirm", "none")
    assert plan["request"]["asked_micro_batch"] == 1
    assert plan["request"]["checkpointing"] == check["workload"]["checkpointing"] == "full"
    assert plan["as_asked"]["verdict"] == check["fits"]["verdict"] == "fits"
    # the planner holds the earlier micro-batches' LoRA gradients through the accumulation
    # (zero_grad_set_to_none=False), which check's estimate notes it leaves out: a few MB
    plan_need, check_need = plan["as_asked"]["need_bytes"], check["fits"]["need_bytes"]
    assert check_need <= plan_need <= check_need * 1.01
    # a --global-batch over the file's asks another job: the planner's recipe (whole batch)
    other = out_json(
        capsys, "plan", "--from", LLAMAFACTORY, "--gpu", "T4", "--confirm", "none",
        "--global-batch", "4",
    )  # fmt: skip
    assert "asked_micro_batch" not in other["request"]

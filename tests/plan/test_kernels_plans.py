"""``memfit plan --kernels unsloth`` (issue 29): every plan keeps the job's kernels, and the
recipe runs Unsloth's defaults (host-RAM checkpoints, fused CE) by the rule estimate applies."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.flags import workload_kwargs
from memfit.plan.nearest import request_of
from memfit.plan.request import PlanRequest
from memfit.plan.space import SpaceOptions, candidates, recipe
from memfit.spec import KERNELS, UNSLOTH_DEFAULTS, WorkloadSpec, with_kernel_defaults

QLORA_T4 = [
    "plan", "llama-3.1-8b", "--gpu", "T4", "--seq", "2048", "--global-batch", "8",
    "--lora-rank", "16", "--quant", "nf4-dq", "--optimizer", "adamw-8bit",
    "--precision", "16-true", "--engine", "analytic", "--confirm", "none",
]  # fmt: skip


def _plan_json(capsys, *extra: str) -> tuple[int, dict]:
    rc = main([*QLORA_T4, "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_plan_keeps_unsloth_kernels_in_the_recommendation_and_every_alternative(capsys) -> None:
    rc, out = _plan_json(capsys, "--kernels", "unsloth", "--alternatives", "6")
    assert rc == 0
    shown = [out["recommended"], *out["alternatives"]]
    assert len(shown) > 1
    for p in shown:
        assert p["settings"]["kernels"] == "unsloth"
        assert p["settings"]["lora_rank"] == 16
    # the recipe runs Unsloth's defaults, as estimate does, and the plan says so
    assert any("Unsloth's defaults" in n for n in out["notes"])
    export = out["settings_export"]
    assert "--kernels unsloth" in export["memfit"]
    assert "use_gradient_checkpointing" in export["unsloth"]
    assert out["request"]["kernels"] == "unsloth"


def test_plan_without_kernels_says_none(capsys) -> None:
    rc, out = _plan_json(capsys)
    assert rc == 0
    assert "kernels" not in out["recommended"]["settings"]
    assert "kernels" not in out["request"] and "unsloth" not in out["settings_export"]


def test_plan_kernels_unsloth_on_a_lora_job_answers_and_reads_in_the_text(capsys) -> None:
    rc = main([*QLORA_T4, "--kernels", "unsloth"])
    text = capsys.readouterr().out
    assert rc in (0, 1)
    assert "unsloth kernels" in text and "--kernels unsloth" in text


def test_plan_kernels_unsloth_with_mode_infer_is_bad_input(capsys) -> None:
    rc = main([
        "plan", "llama-3.1-8b", "--gpu", "A100-80GB", "--mode", "infer", "--kernels", "unsloth",
        "--engine", "analytic", "--confirm", "none",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "kernels" in err and "infer" in err


def test_plan_recipe_is_what_estimate_runs_for_the_same_flags() -> None:
    """The plan's 'as asked' is the workload estimate builds from the same flags."""
    kw = workload_kwargs({"kernels": "unsloth", "lora_rank": 16, "loss": None})
    req = PlanRequest(
        **with_kernel_defaults({"kernels": "unsloth", "loss": None, "checkpointing": None}),
        lora_ranks=(16,),
        lora_asked=True,
    )
    assert (req.checkpointing, req.loss) == (kw["checkpointing"], kw["loss"])
    assert req.kernel_defaults == kw["kernel_defaults"] == UNSLOTH_DEFAULTS


def test_an_asked_loss_beats_unslots_default() -> None:
    fields = with_kernel_defaults({"kernels": "unsloth", "loss": "chunked"})
    assert fields["loss"] == "chunked" and fields["checkpointing"] == "offload"
    assert with_kernel_defaults({"kernels": "hf"}) == {"kernels": "hf"}
    assert "loss" not in with_kernel_defaults({"kernels": "unsloth", "mode": "infer"})


def test_the_python_api_and_the_cli_agree_through_the_helper() -> None:
    api = WorkloadSpec(**with_kernel_defaults({"kernels": "unsloth", "lora_rank": 16}))
    cli = WorkloadSpec(**workload_kwargs({"kernels": "unsloth", "lora_rank": 16}))
    assert api == cli
    assert (api.checkpointing, api.loss) == ("offload", "fused")


def _options(**kw) -> SpaceOptions:
    base = dict(
        mode="train", per_rank_batch=8, fixed_micro_batch=False, gpus=1, n_layers=32,
        supports_bf16=True, supports_fp8=False, lora_asked=True, lora_ranks=(16,),
    )  # fmt: skip
    return SpaceOptions(**{**base, **kw})


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("lora_asked", [True, False])
def test_no_candidate_changes_the_kernels(kernels: str, gpus: int, lora_asked: bool) -> None:
    """Property: whatever else a candidate changes (checkpointing, loss, quantization, LoRA,
    sharding, offload, batch split), its kernels are the job's."""
    o = _options(
        kernels=kernels, gpus=gpus, per_rank_batch=8 * gpus, lora_asked=lora_asked,
        allow_offload=True, keep_full_finetune=False,
    )  # fmt: skip
    found = candidates(o)
    assert len(found) > 10
    assert {s.kernels for s in found} == {kernels}
    assert recipe(o).kernels == kernels
    # and the workload each one is estimated as
    assert {s.workload("train", 512).kernels for s in found[:50]} == {kernels}


def test_the_recipe_takes_the_jobs_checkpointing() -> None:
    assert recipe(_options(kernels="unsloth", checkpointing="offload")).checkpointing == "offload"
    assert recipe(_options()).checkpointing == "none"


def test_request_refuses_unknown_kernels_and_checkpointing() -> None:
    with pytest.raises(SpecError, match=r"kernels \('triton'\)"):
        PlanRequest(kernels="triton")
    with pytest.raises(SpecError, match=r"checkpointing \('sometimes'\)"):
        PlanRequest(checkpointing="sometimes")


def test_doctor_and_nearest_ask_the_planner_with_the_jobs_kernels() -> None:
    w = WorkloadSpec(**with_kernel_defaults({"kernels": "unsloth", "lora_rank": 16}))
    r = request_of(w)
    assert (r.kernels, r.checkpointing, r.loss) == ("unsloth", "offload", "fused")
    assert request_of(WorkloadSpec(lora_rank=16)).kernels == "hf"


def test_doctors_plan_commands_keep_the_kernels(capsys) -> None:
    main([
        "doctor", "qwen3-14b", "--gpu", "T4", "--batch", "2", "--seq", "2048", "--grad-accum",
        "4", "--lora-rank", "16", "--quant", "nf4-dq", "--kernels", "unsloth",
        "--engine", "analytic",
    ])  # fmt: skip
    plans = [ln for ln in capsys.readouterr().out.splitlines() if "memfit plan " in ln]
    assert plans and all("--kernels unsloth" in ln for ln in plans)


def test_the_web_page_carries_kernels_to_plan_instead_of_naming_them_not_taken() -> None:
    from memfit.cli.entry import build_parser
    from memfit.web.query import build_job

    query = [("model", "llama-3.1-8b"), ("gpu", "T4"), ("lora-rank", "16")]
    job = build_job(
        build_parser(), "plan", [*query, ("kernels", "unsloth")], pasted=None, allow_paths=False
    )
    assert "--kernels=unsloth" in job.argv and job.not_taken == ()


def _layouts(**kw: object) -> set[tuple[str, str]]:
    base: dict[str, object] = dict(
        mode="train", per_rank_batch=2, fixed_micro_batch=False, n_layers=4,
        supports_bf16=True, supports_fp8=False, lora_asked=True, lora_ranks=(16,),
    )  # fmt: skip
    base.update(kw)
    return {(s.shard, s.offload) for s in candidates(SpaceOptions(**base))}  # type: ignore[arg-type]


def test_unsloths_kernels_are_never_planned_under_deepspeed_zero3_or_its_param_offload() -> None:
    """Unsloth's fused LoRA kernels read the projections' weights without their forward, where
    ZeRO-3 gathers them (rules.KERNEL_EXCLUDED_SHARDS): no ZeRO-3 layout, on one GPU or several;
    the other layouts stay, and transformers' kernels keep ZeRO-3."""
    for gpus in (1, 4):
        hf = _layouts(gpus=gpus, kernels="hf")
        unsloth = _layouts(gpus=gpus, kernels="unsloth")
        assert ("zero3", "params") in hf and ("zero3", "optimizer") in hf
        assert not {shard for shard, _ in unsloth} & {"zero3"}
        assert unsloth == {(s, o) for s, o in hf if s != "zero3"}
    assert ("fsdp", "none") in _layouts(gpus=4, kernels="unsloth")


@pytest.mark.parametrize("gpu,gpus", [("T4", "1"), ("L4", "2")])
def test_a_plan_with_unsloth_kernels_proposes_no_layout_unsloth_cannot_run(
    capsys, gpu: str, gpus: str
) -> None:
    rc = main([
        "plan", "llama-3.1-8b", "--gpu", gpu, "--gpus", gpus, "--seq", "4096",
        "--lora-rank", "16", "--kernels", "unsloth", "--engine", "analytic",
        "--confirm", "none", "--alternatives", "12", "--json",
    ])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)
    shown = [p for p in [out["recommended"], *out["alternatives"]] if p]
    assert shown
    assert all(p["settings"].get("shard") != "zero3" for p in shown)
    assert any("no ZeRO-3 layouts" in n for n in out["notes"])


def test_upgrade_with_unsloth_kernels_judges_no_zero3_offload_plan(capsys) -> None:
    """The T4 job whose 'only impractical offload fits' came from a ZeRO-3 parameter-offload
    plan with Unsloth's kernels (issue 29)."""
    rc = main([
        "upgrade", "llama-3.1-8b", "--gpu", "T4", "--seq", "4096", "--lora-rank", "16",
        "--kernels", "unsloth", "--json",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert "zero3" not in out and "offload params" not in out

"""The upgrade checklist: each item triggered and not triggered by a constructed job, the verdict,
the GPUs that resolve it, and the CLI's exit codes and JSON.

The estimator is the closed-form stand-in of conftest.py (1 M parameters; activations 2000 B per
token, KV cache 512 B per token), so every number below follows from its formulas and the GPU's
memory, which the tests set by replacing a catalog row's ``memory_bytes``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TINY_LLAMA
from tests.plan.conftest import closed_form_estimate

from memfit import cli
from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.hardware import GPU, get_gpu
from memfit.plan import upgrade
from memfit.plan.upgrade import UPGRADE_THRESHOLDS, precision_item, upgrade_verdict
from memfit.spec import WorkloadSpec
from memfit.units import GiB, MiB

#: a synthetic card whose capacity is its memory_bytes (observed reservation 0)
CARD = "test card: capacity = memory_bytes"


def _gpu(name: str = "L4", memory_bytes: int | None = None, **changes: Any) -> GPU:
    g = get_gpu(name)
    if memory_bytes is not None:
        changes.update(memory_bytes=memory_bytes, driver_reserved_bytes=0, capacity_source=CARD)
    return dataclasses.replace(g, **changes)


def _model(tmp_path: Path, **config: Any) -> str:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**TINY_LLAMA, **config}))
    return str(d)


def _verdict(model: str, gpu: GPU, **kw: Any) -> upgrade.UpgradeVerdict:
    kw.setdefault("recommend", False)
    return upgrade_verdict(model, gpu=gpu, estimator=closed_form_estimate, **kw)


# -- (a) the optimized plan still exceeds VRAM ---------------------------------------------------
def test_plan_exceeds_vram_when_not_even_qlora_fits(tmp_path: Path) -> None:
    v = _verdict(_model(tmp_path), _gpu(memory_bytes=1 * MiB), seq_len=512, global_batch=8)
    item = v.item("plan_exceeds_vram")
    assert item.status == "triggered" and v.verdict == "upgrade"
    assert item.evidence.startswith("no plan of ") and "over by" in item.evidence
    limit = 1 * MiB - round(1 * MiB * 0.05)
    assert item.numbers["limit_bytes"] == limit
    assert item.numbers["over_bytes"] == item.numbers["closest_need_bytes"] - limit > 0


def test_plan_exceeds_vram_not_triggered_names_the_plan_and_its_memory(tmp_path: Path) -> None:
    v = _verdict(_model(tmp_path), _gpu(memory_bytes=64 * MiB), seq_len=512, global_batch=8)
    item = v.item("plan_exceeds_vram")
    assert item.status == "not_triggered"
    assert item.numbers["need_bytes"] <= item.numbers["limit_bytes"]
    assert v.plan.recommended is not None
    assert v.plan.recommended.settings.describe() in item.evidence


# -- (b) the required context cannot be reached --------------------------------------------------
def test_context_unreachable_reports_the_longest_sequence_that_fits(tmp_path: Path) -> None:
    # 131072 tokens: the stand-in's leanest stack (host checkpoints and a fused loss, 4 % of the
    # activations) still needs more than the 8 MiB GPU
    model = _model(tmp_path, max_position_embeddings=1 << 20)
    v = _verdict(model, _gpu(memory_bytes=8 * MiB), seq_len=131072, batch_size=1)
    item = v.item("context_unreachable")
    assert item.status == "triggered"
    most = item.numbers["max_context_tokens"]
    assert 0 < most < 131072 and most % 64 == 0
    assert f"the longest that fits is {most} tokens" in item.evidence
    # the stand-in's leanest stack at batch 1: the answer fits and 64 more tokens do not
    lean = v.item("context_unreachable").evidence
    assert "even one sample of 131072 tokens does not fit" in lean


def test_context_reachable_when_one_sample_fits(tmp_path: Path) -> None:
    model = _model(tmp_path, max_position_embeddings=1 << 20)
    v = _verdict(model, _gpu(memory_bytes=64 * MiB), seq_len=4096, batch_size=1)
    item = v.item("context_unreachable")
    assert item.status == "not_triggered"
    assert item.numbers["max_context_tokens"] >= 4096


def test_a_context_beyond_the_models_own_limit_is_not_a_gpu_problem(tmp_path: Path) -> None:
    v = _verdict(_model(tmp_path), _gpu(memory_bytes=64 * MiB), seq_len=4096)
    item = v.item("context_unreachable")
    assert item.status == "not_applicable"
    assert "model's own context limit (2048" in item.evidence


# -- (c) the batch is too small for a throughput target ------------------------------------------
@pytest.mark.parametrize(("target", "status"), [(1e15, "triggered"), (1.0, "not_triggered")])
def test_throughput_target_compares_the_largest_batch_with_the_target(
    tmp_path: Path, target: float, status: str
) -> None:
    v = _verdict(
        _model(tmp_path), _gpu(memory_bytes=64 * MiB), seq_len=512, global_batch=8,
        throughput_target=target,
    )  # fmt: skip
    item = v.item("throughput_target")
    assert item.status == status
    n = item.numbers
    assert n["max_batch"] > 0 and n["target_tokens_per_s"] == target
    assert (n["tokens_per_s"] < target) == (status == "triggered")
    assert f"is {n['max_batch']}: predicted" in item.evidence


def test_throughput_target_is_not_applicable_without_a_target(tmp_path: Path) -> None:
    v = _verdict(_model(tmp_path), _gpu(memory_bytes=64 * MiB), seq_len=512)
    assert v.item("throughput_target").status == "not_applicable"


# -- (d) concurrent requests x context exhaust the KV cache --------------------------------------
@pytest.mark.parametrize(("concurrency", "status"), [(64, "triggered"), (2, "not_triggered")])
def test_kv_cache_concurrency_counts_requests_of_the_full_context(
    tmp_path: Path, concurrency: int, status: str
) -> None:
    v = _verdict(
        _model(tmp_path), _gpu(memory_bytes=16 * MiB), mode="infer", seq_len=1024,
        context=2048, concurrency=concurrency,
    )  # fmt: skip
    item = v.item("kv_cache_concurrency")
    assert item.status == status
    n = item.numbers
    assert n["kv_cache_bytes_per_request"] == 2048 * 512  # the stand-in: 512 B per token
    assert n["kv_cache_bytes_requested"] == concurrency * 2048 * 512
    assert (n["max_concurrency"] < concurrency) == (status == "triggered")
    assert f"{n['max_concurrency']} concurrent requests of 2048 tokens fit" in item.evidence


def test_kv_cache_item_does_not_apply_to_training(tmp_path: Path) -> None:
    v = _verdict(_model(tmp_path), _gpu(memory_bytes=64 * MiB), seq_len=512)
    assert v.item("kv_cache_concurrency").status == "not_applicable"


# -- (e) only impractical recomputation / offload fits -------------------------------------------
def _only_fits_with(pred: Any) -> Any:
    """The stand-in, plus 1 GiB of parameters unless ``pred(workload)``."""

    def est(w: WorkloadSpec) -> MemoryEstimate:
        e = closed_form_estimate(w)
        if pred(w):
            return e
        comps = dict(e.components, parameters=e.components["parameters"] + GiB)
        peak = sum(comps.values())
        return dataclasses.replace(
            e, components=comps, peak_allocated_bytes=peak, peak_reserved_bytes=peak,
            device_used_bytes=peak, ranges={},
        )  # fmt: skip

    return est


# Predicates monotone in the planner's memory order (it skips stacks that keep more than one
# that did not fit), excluding LoRA and freezing (the planner compares those only among equals).
def _full_finetune_offloaded(w: WorkloadSpec) -> bool:
    # frozen layers keep less than none frozen (the planner prunes by that order), so a stand-in
    # where full fine-tuning fits must let freezing fit too
    return w.lora_rank is None and w.offload != "none"


def _full_finetune_recomputed(w: WorkloadSpec) -> bool:
    return w.lora_rank is None and w.checkpointing == "full"  # freezing too: see above


def test_only_offload_fitting_is_impractical(tmp_path: Path) -> None:
    # fast compute and memory behind a PCIe 4 link: the transfers and the CPU step dominate
    fast = _gpu(
        memory_bytes=64 * MiB, memory_bandwidth_gbps=1e5, bf16_dense_tflops=1e4,
        fp16_dense_tflops=1e4,
    )  # fmt: skip
    v = upgrade_verdict(
        _model(tmp_path), gpu=fast, seq_len=64, batch_size=1, recommend=False,
        estimator=_only_fits_with(_full_finetune_offloaded),
    )  # fmt: skip
    item = v.item("impractical_recompute_offload")
    assert v.plan.recommended is not None and v.plan.recommended.settings.offload != "none"
    assert item.status == "triggered" and "offload of the" in item.evidence
    assert item.numbers["slowdown"] >= UPGRADE_THRESHOLDS["impractical_slowdown"][0]
    assert item.numbers["slowdown"] == pytest.approx(
        item.numbers["step_s"] / item.numbers["unconstrained_step_s"]
    )


def test_full_recomputation_alone_stays_below_the_bound(tmp_path: Path) -> None:
    v = upgrade_verdict(
        _model(tmp_path), gpu=_gpu(memory_bytes=64 * MiB), seq_len=512, batch_size=8,
        recommend=False, estimator=_only_fits_with(_full_finetune_recomputed),
        max_quality_risk="none",  # no freezing: the plan recomputes the full fine-tune
    )  # fmt: skip
    item = v.item("impractical_recompute_offload")
    assert "full recomputation" in item.evidence
    assert item.status == "not_triggered"
    assert 1.0 < item.numbers["slowdown"] < UPGRADE_THRESHOLDS["impractical_slowdown"][0]


def test_an_impractical_offload_plan_names_the_riskier_plan_that_fits_the_gpu() -> None:
    """A 14B LoRA on a 24 GiB card: within the default quality risk only ZeRO-3 with the
    parameters in host RAM fits (~7x the step time); QLoRA fits the same card at a fraction of
    that, and the item says so (a practitioner tries it before buying a GPU)."""
    kw: dict[str, Any] = dict(gpu="RTX-4090", seq_len=2048, recommend=False,
                              recipe={"lora_ranks": (16,), "lora_asked": True})  # fmt: skip
    item = upgrade_verdict("qwen3-14b", **kw).item("impractical_recompute_offload")
    assert item.status == "triggered"
    assert "a riskier plan fits this GPU without offload: " in item.evidence
    riskier = item.evidence.split("a riskier plan fits this GPU without offload: ")[1]
    assert "QLoRA r16" in riskier and "offload" not in riskier.split(" s/step")[0]
    assert "--max-quality-risk high" in riskier
    assert item.numbers["riskier_step_s"] < item.numbers["step_s"]
    # where the riskiest plans already count, the fastest plan is the riskier one itself
    high = upgrade_verdict("qwen3-14b", max_quality_risk="high", **kw)
    assert "a riskier plan" not in high.item("impractical_recompute_offload").evidence


# -- (f) precision support and bandwidth ---------------------------------------------------------
def test_bf16_weights_on_a_gpu_without_bf16_trigger_the_precision_item() -> None:
    config = {**TINY_LLAMA, "torch_dtype": "bfloat16"}
    t4 = precision_item(config, get_gpu("T4"))
    assert t4.status == "triggered" and "T4 (turing) has no bf16 tensor cores" in t4.evidence
    assert precision_item(config, get_gpu("L4")).status == "not_triggered"
    assert precision_item(TINY_LLAMA, get_gpu("T4")).status == "not_applicable"


def test_fp8_weights_need_ada_or_hopper() -> None:
    config = {**TINY_LLAMA, "quantization_config": {"quant_method": "fp8"}}
    a100 = precision_item(config, get_gpu("A100-80GB"))
    assert a100.status == "triggered" and a100.numbers["missing"] == ["fp8"]
    assert precision_item(config, get_gpu("H100-80GB")).status == "not_triggered"


def test_decode_below_the_floor_triggers_the_bandwidth_item(tmp_path: Path) -> None:
    slow = _gpu(memory_bytes=64 * MiB, memory_bandwidth_gbps=0.001)
    kw: dict[str, Any] = dict(mode="infer", seq_len=256, new_tokens=64, concurrency=1)
    v_slow = _verdict(_model(tmp_path), slow, **kw)
    v_fast = _verdict(_model(tmp_path), _gpu(memory_bytes=64 * MiB), **kw)
    floor = UPGRADE_THRESHOLDS["decode_floor_tokens_per_s"][0]
    slow_item, fast_item = v_slow.item("bandwidth"), v_fast.item("bandwidth")
    assert slow_item.status == "triggered" and slow_item.numbers["tokens_per_s_per_request"] < floor
    assert fast_item.status == "not_triggered"
    assert fast_item.numbers["tokens_per_s_per_request"] >= floor
    assert "at 0.001 GB/s" in slow_item.evidence
    assert _verdict(_model(tmp_path), slow, seq_len=256).item("bandwidth").status == (
        "not_applicable"
    )


# -- the verdict and the resolving GPUs ------------------------------------------------------------
def test_verdict_is_stay_when_the_naive_stack_fits_and_optimize_first_when_only_a_plan_does(
    tmp_path: Path,
) -> None:
    model = _model(tmp_path)
    # naive (AMP + AdamW, batch 8 at once) fits 64 MiB; at 18 MiB only a micro-batch split with
    # checkpointing does (1.2x the step). At 12 MiB only ZeRO-3 parameter offload (3x, priced
    # over PCIe by the calibrated step-time model) or LoRA fits: that is the upgrade case.
    stay = _verdict(model, _gpu(memory_bytes=64 * MiB), seq_len=512, global_batch=8)
    optimize = _verdict(model, _gpu(memory_bytes=18 * MiB), seq_len=512, global_batch=8)
    assert stay.verdict == "stay" and not stay.upgrade
    assert optimize.verdict == "optimize_first" and not optimize.upgrade
    assert optimize.plan.baseline.fits is False and optimize.plan.recommended is not None


def test_resolving_gpus_fix_every_triggered_item(tmp_path: Path) -> None:
    model = _model(tmp_path, torch_dtype="bfloat16")
    v = upgrade_verdict(
        model, gpu="T4", seq_len=512, global_batch=8, estimator=closed_form_estimate
    )
    assert [i.id for i in v.items if i.triggered] == ["precision_support"]
    assert v.resolving, v.notes
    for advice in v.resolving:
        assert get_gpu(advice.gpu).supports_bf16
    costs = [a.usd_per_million_tokens for a in v.resolving]  # cheapest per token first
    priced = [c for c in costs if c is not None]
    assert priced == sorted(priced) and costs[: len(priced)] == priced
    assert v.to_json()["resolving_gpus"][0]["gpu"] == v.resolving[0].gpu


def test_unestimated_combinations_leave_the_verdict_undetermined(tmp_path: Path) -> None:
    def no_quant(w: WorkloadSpec) -> MemoryEstimate:
        if w.quant != "none" or w.offload != "none":
            raise SpecError(f"the stand-in does not model quant={w.quant!r} yet")
        return closed_form_estimate(w)

    v = upgrade_verdict(
        _model(tmp_path), gpu=_gpu(memory_bytes=3 * MiB), seq_len=512, global_batch=8,
        recommend=False, estimator=no_quant,
    )  # fmt: skip
    item = v.item("plan_exceeds_vram")
    assert item.status == "unknown" and "could not be estimated" in item.evidence
    assert v.verdict == "undetermined" and "--trace-fallbacks" in v.summary


def test_bad_input_is_refused_with_every_problem(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"2 problems: .*inference settings; throughput_target \(0"):
        _verdict(_model(tmp_path), _gpu(), mode="train", concurrency=4, throughput_target=0)
    with pytest.raises(SpecError, match=r"context \(100\) must be >= seq_len \(512\)"):
        _verdict(_model(tmp_path), _gpu(), mode="infer", seq_len=512, context=100)


# -- the CLI ------------------------------------------------------------------------------------
@pytest.fixture
def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        upgrade._Engine, "for_gpu", lambda self, gpu, trace=True: closed_form_estimate
    )


@pytest.mark.usefixtures("_stand_in")
def test_cli_upgrade_exits_0_to_stay_and_1_to_upgrade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _model(tmp_path)
    assert cli.main(["upgrade", plain, "--gpu", "L4", "--seq", "512", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "stay" and data["upgrade"] is False
    assert {i["id"] for i in data["items"]} == set(upgrade.ITEMS)
    assert set(data["items"][0]) == {"id", "title", "status", "evidence", "numbers"}
    assert data["thresholds"]["impractical_slowdown"] == 2.0

    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text(json.dumps({**TINY_LLAMA, "torch_dtype": "bfloat16"}))
    code = cli.main(["upgrade", str(bf16), "--gpu", "T4", "--no-recommend"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[x] the GPU lacks a precision the model needs: triggered" in out
    assert "verdict: upgrade: 1 item(s) triggered (precision_support)" in out


@pytest.mark.usefixtures("_stand_in")
def test_cli_upgrade_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["upgrade", _model(tmp_path), "--gpu", "L4", "--concurrency", "4"])
    assert code == 2 and "inference settings" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["upgrade", _model(tmp_path), "--seq", "512"])  # --gpu is required
    assert exc.value.code == 2


def test_a_gpu_resolves_impractical_offload_only_with_a_plan_without_it() -> None:
    """issue 29: a job that fits a T4 only with offload (Llama-3.2-3B full fine-tune at 2048
    tokens: ZeRO-3 parameter offload, 4.5x the step); larger GPUs that fit only with the same
    offload were listed as resolving the item. (Llama-3.1-8B at 4096 tokens, the issue's case,
    has no plan that fits a T4 under the per-path bands: no offload item to resolve there.)"""
    from memfit.plan.upgrade_checks import recompute_or_offload

    v = upgrade_verdict("llama-3.2-3b", gpu="T4", seq_len=2048)
    assert v.item("impractical_recompute_offload").triggered
    assert v.resolving  # the large-memory GPUs fit without offload
    for a in v.resolving:
        assert recompute_or_offload(a.best.settings) == [], (a.gpu, a.best.settings.describe())


def test_no_resolving_gpu_runs_the_job_only_impractically() -> None:
    """issue 29, the issue's own case: Llama-3.1-8B at 4096 tokens on a T4 triggers only the
    precision item (nothing fits the T4, so the offload item does not apply there); the GPUs that
    resolve it must not be GPUs on which the job runs only with offload or full recomputation
    past the slowdown bound (one RTX 5090 with ZeRO-3 parameter offload was listed). A GPU whose
    one-GPU plan is impractical is offered at the next count where it is not."""
    from memfit.plan.upgrade_checks import recompute_or_offload
    from memfit.plan.upgrade_items import threshold

    v = upgrade_verdict("llama-3.1-8b", gpu="T4", seq_len=4096)
    assert v.item("precision_support").triggered
    assert v.resolving
    bound = threshold("impractical_slowdown")
    for a in v.resolving:
        slow = a.best.cost.step_s / a.plan.baseline.cost.step_s
        assert not (recompute_or_offload(a.best.settings) and slow >= bound), a.gpu
    assert any(a.gpus > 1 for a in v.resolving)  # several smaller GPUs, sharded, are a way out

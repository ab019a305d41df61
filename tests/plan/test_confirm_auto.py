"""``confirm="auto"`` (issue 32): the plan's answer is the analytic engine's; the trace confirms
the recommended plan only where the analytic engine's validated error band could change its
verdict, and the plan says whether it was confirmed."""

from __future__ import annotations

from memfit.estimate.policy import run_engine
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan import PlanRequest, plan
from memfit.plan.budget import fits
from memfit.plan.engines import CachedEstimator
from memfit.report.plan import render_plan
from memfit.spec import WorkloadSpec

SOURCE = resolve_model("llama-3.1-8b")


def _stand_in_trace() -> CachedEstimator:
    """The confirming engine, counted (the analytic engine itself: no trace in the test run)."""
    gpu = get_gpu("L4")

    def estimate(w: WorkloadSpec):  # type: ignore[no-untyped-def]
        return run_engine("analytic", SOURCE, w, gpu)

    return CachedEstimator(estimate, "stand-in-trace")


def test_a_plan_that_fits_even_at_the_top_of_the_band_is_not_traced() -> None:
    confirm = _stand_in_trace()
    p = plan(SOURCE, PlanRequest(seq_len=512, global_batch=2, lora_ranks=(16,), lora_asked=True),
             gpu="H100", confirm=confirm)  # fmt: skip
    assert p.recommended is not None
    assert confirm.n_calls == 0 and p.n_confirmed == 0
    assert p.confirmed is False
    assert "fits even at the top of the analytic engine's validated band" in p.confirmed_why
    assert "confirmed: no (" in render_plan(p)
    assert p.to_json()["confirmed"] is False


def test_the_recommended_plan_is_traced_where_the_band_could_change_its_verdict() -> None:
    """README's example: the QLoRA plan needs 18.4 GiB at the analytic engine's median reserved
    ratio and 24.4 GiB at the top of its measured range (no grid job is quantized: the wide
    band), over L4's 21.4 GiB limit: the trace
    (here a stand-in) confirms that plan, and only it."""
    confirm = _stand_in_trace()
    request = PlanRequest(seq_len=4096, global_batch=16, lora_ranks=(16,), lora_asked=True,
                          allow=frozenset({"quant"}))  # fmt: skip
    p = plan(SOURCE, request, gpu="L4", confirm=confirm)
    assert p.recommended is not None and p.recommended.confirmed_by == "stand-in-trace"
    band_top = run_engine("analytic", SOURCE, p.recommended.workload, get_gpu("L4"),
                          reserved_end="band")  # fmt: skip
    assert not fits(band_top, p.budget)  # why it was confirmed
    # a quantized job: the grid has no band of its own for it, the wide one applies
    assert "the wide band of every job" in p.confirmed_why
    # and, before it, the one tight plan faster than any that fit (search.MAX_TIGHT_CONFIRMS)
    assert p.n_tight_checked == 1
    assert confirm.n_calls == 1 + p.n_tight_checked and p.n_confirmed == confirm.n_calls
    assert all(o.confirmed_by is None for o in p.alternatives)
    assert p.confirmed is True and "the band could change the verdict" in p.confirmed_why
    assert "confirmed: yes (the stand-in-trace engine checked" in render_plan(p)


def test_confirm_shown_still_confirms_every_plan_shown() -> None:
    confirm = _stand_in_trace()
    request = PlanRequest(seq_len=512, global_batch=2, lora_ranks=(16,), lora_asked=True,
                          n_alternatives=2, confirm="shown")  # fmt: skip
    p = plan(SOURCE, request, gpu="H100", confirm=confirm)
    shown = [p.recommended, *p.alternatives]
    assert all(o is not None and o.confirmed_by == "stand-in-trace" for o in shown)
    assert confirm.n_calls == len(shown) and p.confirmed is True
    assert "--confirm shown" in p.confirmed_why


def test_the_job_classs_own_band_settles_a_plan_the_wide_band_would_trace() -> None:
    """gemma-2-9b, LoRA with checkpointing under gradient accumulation (``lora_ckpt_held``):
    at the top of the wide band (allocated x 1.278) the recommended plan overflows L40S's
    limit, at the top of its job class's band (fitted to the grid's rows of that job,
    benchmarks/reserved_bands.py) it fits: no trace, and the plan names the class."""
    source = resolve_model("gemma-2-9b")
    gpu = get_gpu("L40S")

    def estimate(w: WorkloadSpec):  # type: ignore[no-untyped-def]
        return run_engine("analytic", source, w, gpu)

    confirm = CachedEstimator(estimate, "stand-in-trace")
    request = PlanRequest(seq_len=2048, global_batch=16, lora_ranks=(16,), lora_asked=True)
    p = plan(source, request, gpu="L40S", confirm=confirm)
    # the recommended plan is not traced; only a faster tight one was (search._settle_tight)
    assert p.recommended is not None and confirm.n_calls == p.n_tight_checked <= 1
    assert p.confirmed is False
    assert "job class 'lora_ckpt_held'" in p.confirmed_why
    assert "fits even at the top of the analytic engine's validated band" in p.confirmed_why
    wide = run_engine("analytic", source, p.recommended.workload, gpu, reserved_end="high")
    assert not fits(wide, p.budget)  # the wide band would have traced it

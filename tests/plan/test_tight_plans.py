"""A plan the search engine leaves *tight* (its point fits, the upper end of its range does not)
gets the verdict ``memfit estimate`` gives its job (issue 29, one verdict): the fast answer
``memfit estimate`` shows first, and where that is tight too, the trace's — checked before the
search falls back to a plan that changes the result. Where plans are not confirmed
(``confirm="none"``: the nearest change of a job that does not fit), the tight plan is shown
beside the recommendation instead of dropped.

The job: qwen3-8b, LoRA r16 on a bf16 base, 1024 tokens, on an L4. Without checkpointing it
needs ~30 GiB; with full checkpointing the analytic engine's point is ~20 GiB of L4's 22.2 GiB,
and the upper end of its range is over the 21.05 GiB limit (tight), so before this the planner
recommended an fp8 base (changes the result) over checkpointing (memory-only)."""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.estimate.policy import run_engine
from memfit.estimate.trace.refusals import refusal
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan import PlanRequest, plan
from memfit.plan.budget import verdict
from memfit.plan.engines import CachedEstimator
from memfit.plan.nearest import _answer
from memfit.plan.search import MAX_TIGHT_CONFIRMS, RUN_DECIDES, SLOWDOWN_LIMIT
from memfit.spec import WorkloadSpec

SOURCE = resolve_model("qwen3-8b")
GPU = get_gpu("L4")


def _request(**kw: Any) -> PlanRequest:
    return PlanRequest(seq_len=1024, global_batch=1, lora_ranks=(16,), lora_asked=True,
                       precision="bf16-true", **kw)  # fmt: skip


def _stand_in(cache_fraction: float) -> CachedEstimator:
    """The confirming engine (no trace in the test run): the analytic engine's allocated bytes,
    with ``cache_fraction`` of them held in the allocator's cache on top where the job keeps a
    16-bit base (none where it is quantized)."""

    def estimate(w: WorkloadSpec) -> Any:
        est = run_engine("analytic", SOURCE, w, GPU)
        context = est.device_used_bytes - est.peak_reserved_bytes
        cached = cache_fraction if w.quant == "none" else 0.0
        reserved = int(est.peak_allocated_bytes * (1 + cached))
        return dataclasses.replace(
            est,
            engine="stand-in-trace",
            peak_reserved_bytes=reserved,
            device_used_bytes=reserved + context,
            ranges={},  # the calibrated range of these bytes, not the analytic engine's
        )

    return CachedEstimator(estimate, "stand-in-trace")


def _ckpt_job() -> WorkloadSpec:
    return WorkloadSpec(mode="train", batch_size=1, seq_len=1024, precision="bf16-true",
                        checkpointing="full", lora_rank=16)  # fmt: skip


def test_the_checkpointed_job_is_tight_for_the_search_engine() -> None:
    """The premise: the analytic engine's answer for the memory-only plan is tight."""
    p = plan(SOURCE, _request(confirm="none"), gpu="L4")
    est = run_engine("analytic", SOURCE, _ckpt_job(), GPU)
    assert verdict(est, p.budget).verdict == "tight"


def test_a_tight_memory_only_plan_is_traced_before_a_result_changing_one() -> None:
    confirm = _stand_in(cache_fraction=0.0)  # the trace finds no cached blocks: it fits
    p = plan(SOURCE, _request(), gpu="L4", confirm=confirm)
    rec = p.recommended
    assert rec is not None
    assert not rec.changes_result and rec.settings.quant == "none"
    assert rec.settings.techniques.checkpointing != "none"
    assert rec.confirmed_by == "stand-in-trace"
    assert 1 <= confirm.n_calls <= MAX_TIGHT_CONFIRMS + 1  # + the recommendation's own check
    assert p.tight is None


def test_a_tight_plan_the_trace_overrules_stays_out() -> None:
    # the trace's allocator cache overflows the limit for every plan with a bf16 base
    confirm = _stand_in(cache_fraction=0.25)
    p = plan(SOURCE, _request(), gpu="L4", confirm=confirm)
    rec = p.recommended
    assert rec is not None
    assert rec.changes_result  # the tight checkpointed plan did not fit: the fallback stands
    assert confirm.n_calls <= MAX_TIGHT_CONFIRMS + 1


def test_without_confirmation_the_tight_plan_is_shown_beside_the_recommendation() -> None:
    p = plan(SOURCE, _request(confirm="none"), gpu="L4")
    assert p.recommended is not None and p.recommended.changes_result
    assert p.tight is not None and not p.tight.changes_result
    assert p.tight.settings.techniques.checkpointing != "none"
    assert p.to_json()["tight"]["settings"] == p.tight.to_json()["settings"]
    assert any(n.startswith("tight (memory-only): ") for n in p.notes)
    line = _answer(p, "memfit plan ...").text()
    assert "\nmay fit instead (tight): " in line
    assert "(memory-only; estimate " in line.split("\n")[1]


# -- a result-changing tight plan beside a slow offload recommendation --------------------------
# gemma-3-27b, LoRA r16 on a bf16 base, 2048 tokens, on an RTX 4090 (24 GiB): only ZeRO-3 with
# its parameters in host RAM fits outright (~15 s/step); QLoRA with a fused cross-entropy and
# checkpoints in host RAM is tight (its point fits, the upper end of its range is ~0.2 GiB over)
# at ~4 s/step. The trace engine cannot run a fused cross-entropy, so nothing but a run settles
# that plan: it is shown beside the recommendation, and no trace is spent on it.
GEMMA = resolve_model("gemma-3-27b")


def _gemma_request(**kw: Any) -> PlanRequest:
    return PlanRequest(seq_len=2048, global_batch=1, lora_ranks=(16,), lora_asked=True,
                       precision="bf16-true", allow=frozenset({"quant"}), **kw)  # fmt: skip


def test_a_fast_tight_qlora_plan_is_shown_beside_a_slow_offload_recommendation() -> None:
    p = plan(GEMMA, _gemma_request(confirm="none"), gpu="RTX-4090")
    rec = p.recommended
    assert rec is not None and rec.settings.offload != "none" and not rec.changes_result
    tight = p.tight
    assert tight is not None and tight.changes_result and tight.settings.quant != "none"
    assert tight.cost.step_s * SLOWDOWN_LIMIT <= rec.cost.step_s
    assert verdict(tight.estimate, p.budget).verdict == "tight"
    note = next(n for n in p.notes if n.startswith("tight (changes the result): "))
    assert RUN_DECIDES in note and "cross-entropy" in note
    line = _answer(p, "memfit plan ...").text()
    assert "\nmay fit instead (tight): " in line and "checks it" not in line


def test_the_tight_check_is_not_spent_on_a_job_the_trace_refuses() -> None:
    seen: list[WorkloadSpec] = []

    def trace(w: WorkloadSpec) -> Any:
        seen.append(w)
        if (refused := refusal(w)) is not None:
            raise refused  # as the trace engine does, before any model is built
        est = run_engine("analytic", GEMMA, w, get_gpu("RTX-4090"))
        return dataclasses.replace(est, engine="trace", ranges={})

    confirm = CachedEstimator(trace, "trace")
    p = plan(GEMMA, _gemma_request(), gpu="RTX-4090", confirm=confirm)
    assert p.recommended is not None
    # the tight QLoRA plans all fuse the cross-entropy: none is sent to the trace
    assert not [w for w in seen if w.quant != "none" and refusal(w) is not None]
    assert p.tight is not None and p.tight.changes_result


def test_the_tight_check_is_not_spent_on_a_plan_that_offloads() -> None:
    """llama-3.1-8b, full fine-tune, 4096 tokens, global batch 16 on an L4: the tight plans are
    ZeRO-3 with the parameters in host RAM; the trace's own range there is the wide band of other
    frameworks, so a trace would not settle them (it cost ~8-15 s of a cold `plan` for nothing):
    none is traced (the recommendation's own confirmation may still be asked)."""
    source = resolve_model("llama-3.1-8b")
    seen: list[WorkloadSpec] = []

    def trace(w: WorkloadSpec) -> Any:
        seen.append(w)
        if (refused := refusal(w)) is not None:
            raise refused
        est = run_engine("analytic", source, w, GPU)
        return dataclasses.replace(est, engine="trace", ranges={})

    confirm = CachedEstimator(trace, "trace")
    req = PlanRequest(seq_len=4096, global_batch=16)
    p = plan(source, req, gpu="L4", confirm=confirm)
    rec = p.recommended
    assert rec is not None and rec.settings.offload != "none"
    tight_checked = [w for w in seen if w.offload != "none" and w != rec.workload]
    assert not tight_checked, [(w.loss, w.checkpointing, w.batch_size) for w in tight_checked]

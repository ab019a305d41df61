"""The request is the recipe: properties of the recipe-first planner and of THE verdict rule.

The planner runs on the closed-form estimator of ``tests/plan/conftest.py`` (instant, monotone in
every technique) so hypothesis can try many GPUs; the verdict test runs the real analytic engine
on a bundled model, as every command does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.plan.conftest import closed_form_plan

from memfit.errors import SpecError
from memfit.plan.recipe import ALLOW, parse_allow
from memfit.plan.search import RANK_TIE_FRACTION, TIER_ORDER
from memfit.units import MiB

CAPACITY = st.integers(min_value=2 * MiB, max_value=60 * MiB)
SUITE = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SUITE
@given(capacity=CAPACITY)
def test_when_the_job_fits_as_asked_the_plan_changes_no_result_changing_setting(
    tiny_llama_dir: Path, capacity: int
) -> None:
    p = closed_form_plan(tiny_llama_dir, capacity, allow=frozenset(ALLOW))
    assert p.as_asked is not None
    if p.as_asked.fits:
        assert p.recommended is not None and p.tier == TIER_ORDER[0]
        assert not p.recommended.changes_result
        assert p.recommended.risk_level == 0 and p.recommended.risk_reasons == ()
        s, asked = p.recommended.settings, p.baseline.settings
        same = ("precision", "optimizer", "lora_rank", "freeze_layers", "quant")
        assert all(getattr(s, k) == getattr(asked, k) for k in same if k != "optimizer")
        assert s.optimizer in ("adamw", "adamw-fused")


@SUITE
@given(
    capacity=CAPACITY,
    fewer=st.sets(st.sampled_from(sorted(ALLOW))),
    more=st.sets(st.sampled_from(sorted(ALLOW))),
)
def test_more_allowed_techniques_never_give_a_worse_plan(
    tiny_llama_dir: Path, capacity: int, fewer: set[str], more: set[str]
) -> None:
    p1 = closed_form_plan(tiny_llama_dir, capacity, allow=frozenset(fewer))
    p2 = closed_form_plan(tiny_llama_dir, capacity, allow=frozenset(fewer | more))
    if p1.recommended is None:
        return
    assert p2.recommended is not None
    assert p2.tier_rank is not None and p1.tier_rank is not None
    assert p2.tier_rank <= p1.tier_rank
    if p1.tier_rank < len(TIER_ORDER) - 1:  # found without falling back: at least as fast
        limit = p1.recommended.cost.step_s * (1 + RANK_TIE_FRACTION)
        assert p2.recommended.cost.step_s <= limit


def test_a_plan_that_must_change_the_result_says_so_and_prefers_the_least_risk(
    tiny_llama_dir: Path,
) -> None:
    p = closed_form_plan(tiny_llama_dir, 3 * MiB)
    assert p.as_asked is not None and not p.as_asked.fits
    assert p.recommended is not None and p.tier == TIER_ORDER[-1]
    assert p.recommended.changes_result
    fallback = [a for a in p.alternatives if a.changes_result]
    assert all(p.recommended.risk_level <= a.risk_level for a in fallback)
    allowed = closed_form_plan(tiny_llama_dir, 3 * MiB, allow=frozenset(ALLOW))
    assert allowed.tier == TIER_ORDER[1]  # allowed families rank with the memory-only ones


def test_allow_takes_families_presets_and_refuses_unknown_names() -> None:
    assert parse_allow(["quant,lora", "freeze"]) == {"quant", "lora", "freeze"}
    assert parse_allow("any") == set(ALLOW)
    assert parse_allow(None) == parse_allow("none") == frozenset()
    with pytest.raises(SpecError, match=r"allow \(qlora\) must name quant, lora"):
        parse_allow("qlora")


# -- one verdict, every command -------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(batch=st.integers(min_value=1, max_value=48), seq=st.sampled_from([256, 1024]))
def test_the_same_job_gets_the_same_verdict_from_every_command(batch: int, seq: int) -> None:
    import memfit
    from memfit.plan import PlanRequest, fit, plan
    from memfit.plan.doctor import doctor

    def analytic(w: memfit.WorkloadSpec) -> memfit.MemoryEstimate:
        return memfit.estimate("gpt2", w, gpu="T4", engine="analytic")

    w = memfit.WorkloadSpec(batch_size=batch, seq_len=seq, precision="bf16-mixed")
    est = analytic(w)
    assert est.fits is not None
    verdict = est.fits.verdict
    report = doctor("gpt2", w, gpu="T4", estimator=analytic)
    assert report.verdict is not None and report.verdict.verdict == verdict
    assert report.exit_code == (0 if verdict == "fits" else 1)
    request = PlanRequest(seq_len=seq, batch_size=batch, n_alternatives=0, confirm="none")
    p = plan("gpt2", request, gpu="T4", estimator=analytic)
    assert p.as_asked is not None and p.as_asked.verdict == verdict
    solved = fit("gpt2", w, solve="batch", gpu="T4", estimator=analytic, kv_table=False)
    assert (batch <= solved.max_value) == (verdict == "fits")

"""THE verdict rule: fits / tight / does not fit, the margin, and one exit code per verdict."""

from __future__ import annotations

import pytest

from memfit.estimate.verdict import (
    DEFAULT_HEADROOM,
    DOES_NOT_FIT,
    FITS,
    TIGHT,
    judge,
    upper_device_bytes,
)
from memfit.units import GiB


def _v(point: float, upper: float, capacity: float = 24, headroom: float = 1):
    return judge(
        point_bytes=int(point * GiB),
        need_bytes=int(upper * GiB),
        capacity_bytes=int(capacity * GiB),
        headroom_bytes=int(headroom * GiB),
    )


@pytest.mark.parametrize(
    ("point", "upper", "verdict", "code"),
    [
        (10, 12, FITS, 0),  # 12 + 1 <= 24
        (10, 23, FITS, 0),  # exactly the limit
        (20, 23.5, TIGHT, 1),  # the upper end eats the headroom, the point fits
        (23.9, 30, TIGHT, 1),  # the point fits the raw capacity only
        (24.5, 30, DOES_NOT_FIT, 1),
    ],
)
def test_the_verdict_judges_the_upper_end_with_headroom_then_the_point(
    point: float, upper: float, verdict: str, code: int
) -> None:
    v = _v(point, upper)
    assert (v.verdict, v.exit_code, v.fits) == (verdict, code, verdict == FITS)
    assert v.margin_bytes == int(24 * GiB) - int(1 * GiB) - int(upper * GiB)


def test_the_verdict_text_shows_the_margin_or_the_shortfall() -> None:
    assert "margin 11.00 GiB" in _v(10, 12).text("L4")
    tight = _v(20, 23.5).text("L4")
    assert tight.startswith("TIGHT on L4") and "may run out of memory" in tight
    assert "512.00 MiB more than its 24.00 GiB" in _v(24.5, 30).text("L4")


def test_an_estimate_carries_the_verdict_and_tight_raises() -> None:
    import memfit
    from memfit.errors import DoesNotFitError

    w = memfit.WorkloadSpec(batch_size=1, seq_len=128, precision="bf16-mixed")
    est = memfit.estimate("gpt2", w, gpu="T4", engine="analytic")
    assert est.fits is not None and est.fits.verdict == FITS
    assert est.fits.to_json()["margin_bytes"] > 0
    big = memfit.estimate("llama-3.1-8b", w, gpu="L4", engine="analytic")
    assert big.fits is not None and big.fits.verdict == DOES_NOT_FIT
    with pytest.raises(DoesNotFitError, match=r"DOES NOT FIT on L4: needs .* more than its"):
        big.raise_if_not_fit()


def _paged(point: float, upper: float, paged: float, capacity: float = 24, headroom: float = 1):
    return judge(
        point_bytes=int(point * GiB),
        need_bytes=int(upper * GiB),
        capacity_bytes=int(capacity * GiB),
        headroom_bytes=int(headroom * GiB),
        evictable_bytes=int(paged * GiB),
    )


@pytest.mark.parametrize(
    ("point", "upper", "paged", "verdict", "evicted"),
    [
        (10, 12, 4, FITS, 0),  # all of it fits with the paged states resident
        (30, 32, 15, FITS, 9),  # the rest (17) fits: 9 of the 15 paged GiB go to host RAM
        (30, 32, 8, TIGHT, 8),  # the rest (24) is over the limit, its point (22) fits
        (40, 44, 8, DOES_NOT_FIT, 8),  # the rest (32) does not fit at all
    ],
)
def test_paged_optimizer_states_are_evictable_and_the_rest_is_judged(
    point: float, upper: float, paged: float, verdict: str, evicted: float
) -> None:
    v = _paged(point, upper, paged)
    assert v.verdict == verdict
    assert v.need_bytes == int(upper * GiB) - int(paged * GiB)  # one "needs" figure: resident
    assert v.point_bytes == int(point * GiB) - int(paged * GiB)
    assert v.evicted_bytes == int(evicted * GiB)
    assert v.to_json()["paged_bytes"] == int(paged * GiB)


def test_the_text_says_how_much_the_driver_evicts_to_host_ram() -> None:
    assert "9.00 GiB of the 15.00 GiB paged optimizer states" in _paged(30, 32, 15).text("L4")
    assert "which fit" in _paged(10, 12, 4).text("L4")
    assert "paged" not in _v(10, 12).text("L4")  # no paged states: the text as before
    assert "paged_bytes" not in _v(10, 12).to_json()


def test_an_estimate_with_paged_states_has_one_need_on_every_surface() -> None:
    """A full fine-tune with bitsandbytes' PagedAdamW8bit on a 48 GB card: the paged states do
    not all fit beside the rest, which does; estimate, its JSON, the planner's charge and the
    web table give the same verdict and need (the resident bytes)."""
    import memfit
    from memfit.hardware.catalog import get_gpu
    from memfit.plan.budget import Budget
    from memfit.plan.budget import need_bytes as plan_need
    from memfit.plan.budget import verdict as plan_verdict
    from memfit.spec import WorkloadSpec
    from memfit.web.gpu_table import gpu_table

    w = WorkloadSpec(
        batch_size=2, seq_len=2048, precision="bf16-true", checkpointing="full",
        optimizer="paged-adamw-8bit", optimizer_in_bwd=True,
    )  # fmt: skip
    est = memfit.estimate("llama-3.1-8b", w, gpu="RTX-A6000", engine="analytic")
    v = est.verdict
    assert v is not None and v.fits and v.evicted_bytes > 0
    assert v.paged_bytes == est.unified_memory_bytes > 0
    assert v.need_bytes + v.paged_bytes == upper_device_bytes(est)  # resident: paged left out
    assert est.to_json()["fits"]["need_bytes"] == v.need_bytes == plan_need(est)
    budget = Budget.of(get_gpu("RTX-A6000"), headroom=DEFAULT_HEADROOM)
    assert plan_verdict(est, budget) == v
    high = est.ranges["device_used_bytes"][1]
    row = next(
        r
        for r in gpu_table(est.device_used_bytes, high, est.unified_memory_bytes)
        if r["gpu"] == "RTX-A6000"
    )
    assert (row["verdict"], row["need_bytes"]) == (v.verdict, v.need_bytes)
    assert any("paged" in n and "host RAM" in n for n in est.notes)

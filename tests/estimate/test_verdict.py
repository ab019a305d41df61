"""THE verdict rule: fits / tight / does not fit, the margin, and one exit code per verdict."""

from __future__ import annotations

import pytest

from memfit.estimate.verdict import DOES_NOT_FIT, FITS, TIGHT, judge
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

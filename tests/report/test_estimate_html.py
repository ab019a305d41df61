"""`estimate --html` / `plan --html` pages and the notebook views (`_repr_html_`)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.estimate import estimate
from memfit.report.estimate_html import estimate_page
from memfit.report.plan_html import fit_fragment
from memfit.spec import WorkloadSpec
from memfit.units import format_bytes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_estimate_html_holds_the_answer_the_command_and_the_versions(tmp_path: Path) -> None:
    page = tmp_path / "est.html"
    code, out, err = run(
        ["estimate", "gpt2", "--engine", "analytic", "--precision", "bf16", "--batch", "2",
         "--gpu", "T4", "--html", str(page), "--json"]
    )  # fmt: skip
    est = json.loads(out)  # --html leaves stdout to the answer
    assert code == 0 and f"wrote {page}" in err
    html = page.read_text()
    assert "fits on T4" in html
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes"):
        assert format_bytes(est[key]) in html
        assert format_bytes(est[key + "_high"]) in html  # the range
    for component in est["components"]:
        assert component in html
    assert (
        "memfit estimate gpt2 --mode train --batch 2 --seq 512 --precision bf16-mixed --gpu T4 "
        in (html)
    )
    assert re.search(r"<td>memfit</td><td>\d", html)
    assert "<script" not in html and not re.search(r'(src|href)="https?:', html)


def test_the_estimate_page_says_when_no_module_breakdown_exists() -> None:
    est = estimate("gpt2", WorkloadSpec(precision="bf16"), engine="analytic").to_json()
    assert "does not attribute bytes to modules" in estimate_page(est, command="memfit x")


def test_plan_html_leads_with_the_job_as_asked(tmp_path: Path) -> None:
    page = tmp_path / "plan.html"
    code, _, err = run(
        ["plan", "gpt2", "--gpu", "T4", "--seq", "256", "--confirm", "none", "--html", str(page)]
    )
    html = page.read_text()
    assert code == 0 and f"wrote {page}" in err
    assert html.index("as asked") < html.index("recommended")
    assert "memfit plan gpt2 --gpu T4 --seq 256 --confirm none" in html


def test_notebook_views_are_small_self_contained_html() -> None:
    est = estimate("gpt2", WorkloadSpec(precision="bf16"), gpu="T4", engine="analytic")
    view = est._repr_html_()
    assert view.startswith('<div class="memfit-est">') and "fits on T4" in view
    assert len(view) < 20_000 and "<script" not in view
    from memfit.plan import PlanRequest, plan

    p = plan("gpt2", PlanRequest(mode="train", seq_len=256, confirm="none"), gpu="T4")
    assert "as asked" in p._repr_html_() and "recommended" in p._repr_html_()
    fit = {"solve": "batch", "max_batch": 7, "gpu": "T4", "limit_bytes": 10**9, "estimate": None}
    assert "max_batch = 7" in fit_fragment(fit)


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt install chromium)")
def test_the_estimate_page_draws_offline_in_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    page_file = tmp_path / "est.html"
    run(["estimate", "gpt2", "--engine", "analytic", "--html", str(page_file)])
    fetched: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.route(
            "**/*",
            lambda r: (
                r.continue_()
                if r.request.url.startswith("file:")
                else (fetched.append(r.request.url), r.abort())
            ),
        )
        page.goto(page_file.as_uri())
        n_bars = page.locator("svg rect").count()
        browser.close()
    assert fetched == [] and n_bars >= 6  # the peak and each phase, by component


def test_the_pages_draw_every_component_in_the_estimates_order() -> None:
    from memfit.estimate.result import COMPONENTS
    from memfit.report.style import COMPONENT_COLORS

    assert tuple(COMPONENT_COLORS) == COMPONENTS

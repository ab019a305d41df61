"""The calculator page in a real browser (headless Chromium through Playwright): load a URL,
change a field, read the numbers back from the DOM and compare them with the CLI's --json for the
same job. Skipped where Chromium or Playwright is missing (.ci/run installs Chromium)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from tests.web.conftest import cli_error, cli_json

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt install chromium)")
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        # Offline: any request that leaves the test server fails the test.
        outside: list[str] = []
        context.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith(server)
                else (outside.append(route.request.url), route.abort())
            ),
        )
        p = context.new_page()
        yield p
        browser.close()
        assert outside == [], f"the page fetched from elsewhere: {outside}"


def wait_done(page: Any) -> None:
    page.wait_for_selector("#status[data-state]", timeout=60_000)


def shown(page: Any, element_id: str) -> int:
    return int(page.get_attribute(f"#{element_id}", "data-bytes"))


def test_a_link_shows_the_cli_numbers_and_a_changed_field_updates_them(
    page: Any, server: str
) -> None:
    page.goto(f"{server}/?model=gpt2&batch=2&seq=256&precision=bf16&gpu=T4")
    wait_done(page)
    _, want = cli_json(
        "estimate", "gpt2", "--engine", "analytic", "--batch", "2", "--seq", "256",
        "--precision", "bf16", "--gpu", "T4",
    )  # fmt: skip
    assert shown(page, "peak-allocated") == want["peak_allocated_bytes"]
    assert shown(page, "peak-reserved") == want["peak_reserved_bytes"]
    assert shown(page, "device-used") == want["device_used_bytes"]
    bars = page.eval_on_selector_all(
        "#chart-components rect", "rs => rs.map(r => [r.dataset.component, +r.dataset.bytes])"
    )
    assert dict(bars) == {k: v for k, v in want["components"].items() if v > 0}
    assert "fits on T4" in page.inner_text("#verdict")
    assert page.get_attribute("#gpu-table tr[data-gpu=T4]", "data-fits") == "true"

    page.fill("#f-batch", "8")  # typing fires the input event: the page asks again
    page.wait_for_function("() => location.search.includes('batch=8')")
    page.wait_for_function(
        "n => document.getElementById('peak-allocated').dataset.bytes !== String(n)",
        arg=want["peak_allocated_bytes"],
    )
    wait_done(page)
    _, want8 = cli_json(
        "estimate", "gpt2", "--engine", "analytic", "--batch", "8", "--seq", "256",
        "--precision", "bf16", "--gpu", "T4",
    )  # fmt: skip
    assert shown(page, "peak-allocated") == want8["peak_allocated_bytes"]
    assert page.inner_text("#command") == (
        "memfit estimate gpt2 --gpu T4 --engine analytic --mode train --batch 8 --seq 256 "
        "--precision bf16"
    )


def test_bad_input_shows_the_cli_message_in_the_page(page: Any, server: str) -> None:
    page.goto(f"{server}/?model=gpt2&batch=0&precision=bf16")
    page.wait_for_selector("#error:not([hidden])", timeout=60_000)
    expected = cli_error("estimate", "gpt2", "--engine", "analytic", "--batch", "0")
    assert page.inner_text("#error") == expected


def test_every_flag_of_the_table_is_a_form_field(page: Any, server: str) -> None:
    from memfit.flags import flags_for

    page.goto(f"{server}/?model=gpt2")
    wait_done(page)
    for f in flags_for("estimate"):
        assert page.locator(f"#f-{f.name[2:]}").count() == 1, f.name


def test_the_plan_view_in_the_url_shows_the_as_asked_verdict_first(page: Any, server: str) -> None:
    page.goto(f"{server}/?model=gpt2&seq=256&precision=bf16&gpu=T4&view=plan")
    page.wait_for_selector("#plan[data-state=done]", timeout=120_000)
    headings = page.eval_on_selector_all("#plan h3", "hs => hs.map(h => h.textContent)")
    assert headings[:2] == ["As asked", "Recommended plan"]
    _, plan = cli_json(
        "plan", "gpt2", "--gpu", "T4", "--seq", "256", "--precision", "bf16", "--confirm", "none"
    )
    assert page.inner_text("#plan-recommended").startswith(plan["recommended"]["summary"])


@pytest.mark.slow  # one trace of a tiny model (tens of seconds on a loaded 2-core machine)
def test_the_trace_button_runs_the_trace_engine_with_progress(
    page: Any, server: str, tmp_path
) -> None:
    import json
    import urllib.parse

    from tests.conftest import TINY_GPT2

    text = json.dumps(TINY_GPT2)
    query = urllib.parse.urlencode({"config": text, "precision": "bf16", "seq": "64"})
    page.goto(f"{server}/?{query}")
    wait_done(page)
    page.click("#run-trace")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('tracing')"
    )
    page.wait_for_function(
        "() => document.getElementById('engine').textContent === 'trace'", timeout=300_000
    )
    (tmp_path / "config.json").write_text(text)
    _, want = cli_json(
        "estimate", str(tmp_path), "--engine", "trace", "--precision", "bf16", "--seq", "64"
    )
    assert shown(page, "peak-allocated") == want["peak_allocated_bytes"]
    assert shown(page, "peak-reserved") == want["peak_reserved_bytes"]


@pytest.mark.parametrize("gpu", ["T4", "RTX-4090"])
def test_the_banner_the_table_and_the_plan_give_one_verdict_and_one_figure(
    page: Any, server: str, gpu: str
) -> None:
    """issue 29: "does not fit on RTX-4090 as asked" above a table that said it fits, and a plan
    request without the form's quant and checkpointing."""
    from memfit.units import format_bytes

    job = {"seq": "2048", "lora-rank": "16", "quant": "nf4", "checkpointing": "full"}
    query = "&".join(f"{k}={v}" for k, v in job.items())
    page.goto(f"{server}/?model=llama-3.1-8b&gpu={gpu}&precision=bf16-mixed&{query}&view=plan")
    page.wait_for_selector("#plan[data-state=done]", timeout=120_000)
    _, est = cli_json(
        "estimate", "llama-3.1-8b", "--gpu", gpu, "--engine", "analytic", "--precision",
        "bf16-mixed", *[w for k, v in job.items() for w in (f"--{k}", v)],
    )  # fmt: skip
    want = (est["fits"]["verdict"], str(est["fits"]["need_bytes"]))
    row = f"#gpu-table tr[data-gpu={gpu}]"
    for where in ("#verdict", row):
        got = (
            page.get_attribute(where, "data-verdict"),
            page.get_attribute(where, "data-need-bytes"),
        )
        assert got == want, where
    assert page.get_attribute("#as-asked", "data-verdict") == want[0]
    assert f"{format_bytes(est['fits']['need_bytes'])}" in page.inner_text("#verdict")
    not_taken = page.inner_text("#not-taken")  # the fields in the URL's order
    assert "memfit plan does not take " in not_taken
    assert "quant=nf4" not in not_taken and "checkpointing=full" in not_taken

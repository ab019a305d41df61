"""Screenshots of the `memfit web` page for docs/web.md, in headless Chromium.

    PYTHONPATH=src python benchmarks/web_screenshots.py            # writes docs/web/*.png

Starts the server on a free loopback port, opens each page state (the URL holds it) in
/usr/bin/chromium through Playwright (no browser download: the system Chromium is used), waits
for the answer and saves a full-page PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from memfit.cli import build_parser
from memfit.cli import main as memfit_main
from memfit.web.serve import running


def main_quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return memfit_main(argv)


CHROMIUM = "/usr/bin/chromium"
OUT = Path(__file__).resolve().parent.parent / "docs" / "web"
#: (file, query, what to wait for after the estimate).
SHOTS = (
    ("estimate.png", "model=llama-3.2-1b&batch=4&seq=2048&gpu=A100-40GB", None),
    (
        "plan.png",
        "model=llama-3.1-8b&seq=4096&gpu=L4&lora-rank=16&view=plan",
        "#plan[data-state]",
    ),
    ("error.png", "model=llama-3.2-1b&batch=0", None),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        running(run=memfit_main, parser_factory=build_parser) as base,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, query, wait in SHOTS:
            page.goto(f"{base}/?{query}")
            page.wait_for_selector("#status[data-state]", timeout=60_000)
            if wait:
                page.wait_for_selector(wait, timeout=120_000)
            page.screenshot(path=str(args.out / name), full_page=True)
            print(f"wrote {args.out / name}")
        # The page `memfit estimate ... --html FILE` writes (opened from disk, offline).
        with tempfile.TemporaryDirectory() as tmp:
            html = Path(tmp) / "estimate.html"
            argv = ["estimate", "llama-3.2-1b", "--engine", "analytic", "--precision", "bf16"]
            argv += ["--batch", "4", "--seq", "2048", "--gpu", "A100-40GB", "--html", str(html)]
            main_quiet(argv)
            page.goto(html.as_uri())
            page.screenshot(path=str(args.out / "estimate-html.png"), full_page=True)
            print(f"wrote {args.out / 'estimate-html.png'}")
        browser.close()


if __name__ == "__main__":
    main()

"""The HTML (and PNG) report of a run log: content, offline, crash-tolerant, drawn in Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.report import runlogs

from memfit.errors import SpecError
from memfit.monitor.log import read_log
from memfit.report.html import render_html_report, simple_leak_reading
from memfit.report.svg import COLORS

GiB = runlogs.GiB


def test_report_shows_timeline_receipt_oom_and_leak(tmp_path: Path) -> None:
    log = runlogs.write(tmp_path / "run.jsonl", runlogs.training_run(leak_per_step=64 * 1024**2))
    html = render_html_report(log, tmp_path / "r.html").read_text()
    assert html.count("<svg") >= 5  # two memory charts, estimate bars, step time, throughput
    assert "Memory per step" in html and "Memory over time" in html
    assert COLORS["allocated"] in html and COLORS["reserved"] in html and COLORS["device"] in html
    # receipt: the estimate from the start record against the measured peaks
    assert "15.00 GiB" in html and "18.83 GiB" in html and "-20.3%" in html
    assert "OOM at step 60" in html and "halve the batch" in html
    assert re.search(r"<b>leak</b>", html)
    assert "no end record" not in html


def test_html_is_self_contained(tmp_path: Path) -> None:
    log = runlogs.write(tmp_path / "run.jsonl", runlogs.training_run())
    html = render_html_report(log, tmp_path / "r.html").read_text()
    resource = re.compile(r"""(?:src|href|action)\s*=|url\(|@import""", re.IGNORECASE)
    assert resource.search('<img src="x.png">') and resource.search("a{background:url(x)}")
    assert resource.findall(html) == []
    assert not re.search(r"https?://", html)
    assert "<script" not in html and "<link" not in html and "<iframe" not in html


def test_a_crash_mid_write_is_tolerated_and_a_bad_line_is_named(tmp_path: Path) -> None:
    recs = runlogs.training_run(with_oom=False)[:-1]  # no end record: the process died
    log = runlogs.write(tmp_path / "crash.jsonl", recs, tail='{"type": "step", "time": 17600')
    run = read_log(log)
    assert run.truncated_last_line and run.end is None and len(run.steps) == 60
    html = render_html_report(log, tmp_path / "r.html").read_text()
    assert "no end record: the process was killed or crashed" in html
    bad = runlogs.write(
        tmp_path / "bad.jsonl", recs[:3] + [{"type": "step", "time": 1.0}] + recs[3:]
    )
    with pytest.raises(SpecError, match=r"bad\.jsonl:4: step record lacks 'step'"):
        render_html_report(bad, tmp_path / "r.html")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(json.dumps(recs[0]) + "\nnot json\n" + json.dumps(recs[1]) + "\n")
    with pytest.raises(SpecError, match=r"garbage\.jsonl:2 is not a JSON record"):
        read_log(garbage)


def test_a_log_of_only_an_oom_record_is_still_a_report(tmp_path: Path) -> None:
    # what oom_guard(log=...) writes when no Monitor runs: one oom record, no start
    recs = [r for r in runlogs.training_run() if r["type"] == "oom"]
    log = runlogs.write(tmp_path / "oom.jsonl", recs)
    html = render_html_report(log, tmp_path / "r.html").read_text()
    assert "OOM at step 60" in html and "halve the batch" in html and "no end record" in html


def test_simple_leak_reading_separates_growth_from_noise(tmp_path: Path) -> None:
    leak = read_log(
        runlogs.write(tmp_path / "a.jsonl", runlogs.training_run(leak_per_step=64 * 1024**2))
    )
    flat = read_log(runlogs.write(tmp_path / "b.jsonl", runlogs.training_run()))
    got = simple_leak_reading(leak)
    assert got["verdict"] == "leak" and 60 * 1024**2 < got["bytes_per_step"] < 70 * 1024**2
    assert simple_leak_reading(flat)["verdict"] == "steady"


def test_cli_report_writes_html_and_png_and_rejects_bad_logs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log = runlogs.write(tmp_path / "run.jsonl", runlogs.training_run())
    est = tmp_path / "est.json"
    est.write_text(json.dumps(runlogs.estimate_json()))
    cmd = [sys.executable, "-m", "memfit", "report", str(log), "--estimate", str(est)]
    out = subprocess.run(cmd + ["-o", str(tmp_path / "r.html"), "--png", str(tmp_path / "r.png")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "wrote" in out.stdout
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "r.png").stat().st_size > 20_000
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "start"}\n{}\n')
    res = subprocess.run(cmd[:4] + [str(bad)], capture_output=True, text=True)
    assert res.returncode == 2 and "bad.jsonl:1: start record needs a numeric 'time'" in res.stderr


# -- in a real browser -------------------------------------------------------------------------

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)


def _screenshot(html: Path, png: Path) -> list[tuple[int, int, int]]:
    Image = pytest.importorskip("PIL.Image")
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", "--window-size=1200,1300", html.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    with Image.open(png) as im:
        raw = im.convert("RGB").tobytes()
    return [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]  # type: ignore[misc]


def _count(pixels: list[tuple[int, int, int]], hex_color: str, tol: int = 12) -> int:
    want = tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return sum(1 for p in pixels if all(abs(a - b) <= tol for a, b in zip(p, want, strict=True)))


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")
def test_chromium_draws_the_memory_series_offline(tmp_path: Path) -> None:
    recs = [r for r in runlogs.training_run() if r["type"] != "start"]  # no estimate lines
    recs.insert(0, runlogs.start(None))
    page = render_html_report(runlogs.write(tmp_path / "run.jsonl", recs), tmp_path / "r.html")
    pixels = _screenshot(page, tmp_path / "shot.png")
    for name in ("allocated", "reserved", "device"):
        assert _count(pixels, COLORS[name]) > 1500, name  # 2 charts x ~900 px of 2.5 px lines
    # control: a log with samples only has no step series, so none of their colours
    samples = [runlogs.start(None)] + [r for r in runlogs.training_run() if r["type"] == "sample"]
    page = render_html_report(runlogs.write(tmp_path / "s.jsonl", samples), tmp_path / "s.html")
    pixels = _screenshot(page, tmp_path / "shot2.png")
    assert _count(pixels, COLORS["allocated"]) < 50
    assert _count(pixels, COLORS["sample"]) > 500

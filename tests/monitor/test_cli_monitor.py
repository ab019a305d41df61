"""`memfit monitor -- CMD` and `memfit diagnose`: exit codes, the log, and the printed summary."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from tests.monitor.conftest import make_estimate, read_records

from memfit.cli import main
from memfit.monitor.device import Nvml

#: Touches 60 MB (so it is resident), holds it a moment, exits with code 3.
CHILD = "x = b'x' * 60_000_000; import time; time.sleep(0.4); raise SystemExit(3)"


def test_monitor_runs_the_command_logs_its_memory_and_exits_with_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    argv = ["monitor", "--log", str(log), "--interval", "0.05", "--"]
    code = main([*argv, sys.executable, "-c", CHILD])
    assert code == 3
    records = read_records(log)
    start, end = records[0], records[-1]
    assert start["argv"] == [sys.executable, "-c", CHILD] and start["pid"] > 0
    samples = [r for r in records if r["type"] == "sample"]
    assert len(samples) >= 2
    assert end["summary"]["exit_code"] == 3 and end["summary"]["outcome"] == "error"
    assert end["summary"]["peak_rss_bytes"] >= 60_000_000
    if Nvml.open(0) is None:  # this machine: the CPU path, RSS stands for device use
        assert start["device"] == "cpu"
        assert max(s["process_used_bytes"] for s in samples) == end["summary"]["peak_rss_bytes"]
    err = capsys.readouterr().err
    assert re.search(r"memfit monitor: exit code 3, ran \d+\.\d s", err) and f"log: {log}" in err


def test_monitor_json_carries_the_receipt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    est_file = tmp_path / "est.json"
    est_file.write_text(json.dumps(make_estimate(parameters=10**9).to_json()))
    log = tmp_path / "run.jsonl"
    code = main(
        [
            "monitor",
            "--log",
            str(log),
            "--estimate",
            str(est_file),
            "--json",
            "--",
            sys.executable,
            "-c",
            "pass",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["exit_code"] == 0 and out["summary"]["outcome"] == "ok"
    assert out["receipt"]["peak_allocated"] == {
        "predicted_bytes": 10**9,
        "measured_bytes": None,
        "error_pct": None,
    }  # the allocator's counters live inside the child
    assert read_records(log)[0]["estimate"]["peak_allocated_bytes"] == 10**9


def test_monitor_writes_the_html_report(tmp_path: Path, capsys) -> None:
    pytest.importorskip("memfit.report.html")
    log, report = tmp_path / "run.jsonl", tmp_path / "run.html"
    argv = ["monitor", "--log", str(log), "--report", str(report), "--json", "--"]
    assert main([*argv, sys.executable, "-c", "pass"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == str(report)
    assert report.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["monitor"], "no command to run"),
        (["monitor", "--", "/nonexistent/program"], "cannot run '/nonexistent/program'"),
        (["monitor", "--interval", "0", "--", "true"], r"--interval \(0.0\) must be positive"),
        (["diagnose", "missing.jsonl"], "run log 'missing.jsonl' does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str], argv, message
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error:") and len(err.strip().splitlines()) == 1
    assert re.search(message, err)


def test_monitor_estimate_must_be_estimate_json(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert main(["monitor", "--estimate", str(bad), "--", "true"]) == 2
    assert "is not the output of `memfit estimate --json`" in capsys.readouterr().err


def test_diagnose_prints_the_verdict_and_json(tmp_path: Path, capsys) -> None:
    from tests.monitor.test_diagnose import _write_log

    log = _write_log(tmp_path / "r.jsonl", [(1000 + 4096 * i, 10**6) for i in range(12)])
    assert main(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memfit diagnose: leak (12 steps)")
    assert "+4096 B/step, R² 1.000" in out
    assert main(["diagnose", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "leak" and data["allocated"]["slope_bytes_per_step"] == 4096
    assert data["allocated"]["growth_bytes"] == 4096 * 9

"""Run logs from several processes stay valid and merge; reading is streamed, and values no writer
makes (NaN, Infinity, huge integers, deep nesting) are skipped with a count, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memfit.cli import main
from memfit.monitor import reader
from memfit.monitor.log import RunLog, rank_log_path, record
from memfit.monitor.reader import rank_logs, read_log
from memfit.units import MiB

ROOT = Path(__file__).resolve().parents[2]


def _start() -> dict[str, Any]:
    return record(
        "start", memfit_version="0", device="cpu", device_name="cpu", device_total_bytes=None,
        pid=1, argv=[], estimate=None,
    )  # fmt: skip


def _step(n: int, allocated: int) -> dict[str, Any]:
    return record(
        "step", step=n, step_time_s=0.1, tokens=None, samples=None, tokens_per_s=None,
        samples_per_s=None, allocated_bytes=allocated, peak_allocated_bytes=allocated,
        reserved_bytes=allocated, peak_reserved_bytes=allocated, device_used_bytes=None,
        utilization_pct=None, rss_bytes=None,
    )  # fmt: skip


def _write_run(path: Path, allocated: list[int]) -> Path:
    log = RunLog(path)
    log.write(_start())
    for n, a in enumerate(allocated, 1):
        log.write(_step(n, a))
    log.close()
    return path


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"RANK": "1", "WORLD_SIZE": "4"}, "run.rank1.jsonl"),
        ({"LOCAL_RANK": "3"}, "run.rank3.jsonl"),
        ({"RANK": "0", "WORLD_SIZE": "1"}, "run.jsonl"),  # a single process keeps the name
        ({}, "run.jsonl"),
        ({"RANK": "x"}, "run.jsonl"),
    ],
)
def test_each_rank_writes_its_own_file(env: dict[str, str], name: str) -> None:
    assert rank_log_path("logs/run.jsonl", env) == Path("logs") / name


def test_a_second_monitor_on_a_claimed_file_writes_beside_it_not_over_it(tmp_path: Path) -> None:
    first = RunLog(tmp_path / "run.jsonl")
    first.write(_start())
    second = RunLog(tmp_path / "run.jsonl")  # the same path, while the first still writes
    second.write(_start())
    first.write(_step(1, MiB))
    first.close()
    second.close()
    assert second.path == tmp_path / "run.1.jsonl"
    assert read_log(tmp_path / "run.jsonl").n_steps == 1  # not truncated, not interleaved


def test_ranks_in_one_process_env_write_their_files_and_diagnose_merges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.monitor.conftest import FakeCuda

    import memfit

    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        fake = FakeCuda()
        with memfit.Monitor(tmp_path / "run.jsonl", device=fake, verbose=False) as mon:
            for i in range(12):
                grow = (i + 1) * MiB if rank == 1 else 0
                fake.set(MiB + grow, MiB + grow, 4 * MiB + grow, 4 * MiB + grow)
                mon.step()
        assert mon.log_path == tmp_path / f"run.rank{rank}.jsonl"
    assert main(["diagnose", str(tmp_path / "run.jsonl")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memfit diagnose: merged 2 rank logs (run.rank0.jsonl, run.rank1.jsonl)")
    assert "run.rank1.jsonl: leak" in out and "run.rank0.jsonl: cache" in out
    assert main(["diagnose", str(tmp_path / "run.rank0.jsonl")]) == 0  # one file: one rank
    assert capsys.readouterr().out.startswith("memfit diagnose: cache")


@pytest.mark.slow
def test_torchrun_like_ranks_write_valid_logs_that_diagnose_merges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = (
        "import memfit, torch\n"
        "keep = []\n"
        f"with memfit.Monitor({str(tmp_path / 'run.jsonl')!r}, device='cpu', verbose=False) as m:\n"
        "    for i in range(12):\n"
        "        if memfit.monitor.log.rank_log_path('x').name.endswith('rank1'):\n"
        "            keep.append(torch.ones(64 * 1024))\n"
        "        m.step()\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "RANK": str(r), "WORLD_SIZE": "2"},
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert [p.name for p in rank_logs(tmp_path / "run.jsonl")] == [
        "run.rank0.jsonl",
        "run.rank1.jsonl",
    ]
    assert main(["diagnose", str(tmp_path / "run.jsonl")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memfit diagnose: merged 2 rank logs (run.rank0.jsonl, run.rank1.jsonl)")
    assert "run.rank1.jsonl: leak" in out  # rank 1 keeps 256 KiB per step
    assert main(["diagnose", str(tmp_path / "run.jsonl"), "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["merged_logs"] == 2 and merged["verdict"] == "leak"
    assert [r["rank"] for r in merged["ranks"]] == [1, 0]  # worst first


def test_report_merges_ranks_and_shows_the_highest_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path / "run.rank0.jsonl", [MiB] * 8)
    _write_run(tmp_path / "run.rank1.jsonl", [3 * MiB] * 8)
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run.jsonl"), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "merged 2 rank logs" in said and "shown: run.rank1.jsonl" in said
    assert "merged 2 rank logs" in out.read_text()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"type":"step","time":NaN}', "NaN is not a usable value"),
        ('{"type":"step","time":1,"x":Infinity}', "Infinity is not a usable value"),
        ('{"type":"step","time":1e999}', "inf is not a usable value"),
        ('{"type":"step","time":1,"x":' + "9" * 30 + "}", "an integer beyond 64 bits"),
        ('{"type":"step","time":1,"x":' + "9" * 5000 + "}", "digits"),
        ('{"type":"step","time":1,"x":' + "[" * 100 + "]" * 100 + "}", "nested deeper"),
        ('{"type":"step","time":1,"x":' + "[" * 100000 + "]" * 100000 + "}", "nested"),
    ],
)
def test_unusable_values_are_skipped_with_a_count_and_said(
    tmp_path: Path, line: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_run(tmp_path / "run.jsonl", [MiB] * 8)
    with log.open("a") as f:
        f.write(line + "\n")
    run = read_log(log)
    assert run.n_skipped_lines == 1 and reason in (run.skipped_reason or "")
    assert run.n_steps == 8
    assert main(["diagnose", str(log)]) == 0
    assert "skipped 1 unusable lines" in capsys.readouterr().out


def test_a_log_of_only_unusable_lines_is_a_clear_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text('{"type":"start","time":NaN}\n')
    assert main(["diagnose", str(log)]) == 2
    err = capsys.readouterr().err
    assert "has no record (1 lines skipped, line 1: NaN is not a usable value)" in err
    assert "Traceback" not in err


def test_the_writer_never_writes_what_the_reader_refuses(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run.jsonl")
    rec = _step(1, MiB)
    rec["utilization_pct"] = float("nan")
    rec["rss_bytes"] = 10**30
    log.write(rec)
    log.close()
    step = read_log(tmp_path / "run.jsonl").steps[0]
    assert step["utilization_pct"] is None and step["rss_bytes"] is None


def test_a_long_log_keeps_bounded_evenly_spaced_steps_and_exact_peaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_KEPT_RECORDS", 100)
    n = 1234
    allocated = [MiB + (i % 97) for i in range(n)]
    allocated[567] = 7 * MiB  # a peak between kept points
    run = read_log(_write_run(tmp_path / "run.jsonl", allocated))
    assert run.n_steps == n and len(run.steps) <= 100 + 1
    assert run.steps[-1]["step"] == n  # the last step is always kept
    assert run.peak("peak_allocated_bytes") == 7 * MiB
    gaps = {b["step"] - a["step"] for a, b in zip(run.steps[:-2], run.steps[1:-1])}
    assert len(gaps) == 1  # evenly spaced

"""Generated malformed snapshots, run logs and output paths (issue 33, the last pieces): every
case ends with exit 0 / 2 as its class allows, one ``memfit: error:`` line for 2, never a
traceback, within :data:`~tests.fuzz.cases.CASE_TIME_LIMIT_S`. The default run takes every
``FAST_STRIDE``-th case of each class; ``-m slow`` runs them all (over 2,000 cases).

``memfit.Monitor(log=FIFO)`` runs in a subprocess under a timeout and a memory limit: before,
opening the FIFO blocked the user's script before its loop.
"""

from __future__ import annotations

import os
import pickle
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.fuzz.cases import (
    BASE_SNAPSHOT,
    CLASSES,
    ESTIMATE,
    Case,
    _log,
    _start,
    _step,
    make_special_files,
    run_case,
    subset,
)

from memfit.userfiles import UserFileError
from memfit.userwrites import check_output

SRC = Path(__file__).resolve().parents[2] / "src"


def _check_all(cases: list[Case], root: Path) -> None:
    make_special_files(root)
    failed = []
    for case in cases:
        problem = run_case(case, root).problem(case, root)
        if problem is not None:
            failed.append(f"{case.name}: {problem}")
    assert not failed, f"{len(failed)} of {len(cases)} cases failed:\n" + "\n".join(failed[:10])


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_fixed_subset_of_each_class_is_handled_in_one_line(name: str, tmp_path: Path) -> None:
    cases = subset(CLASSES[name](), slow=False)
    assert len(cases) >= 3  # the subset reaches the class, not an empty list
    _check_all(cases, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_generated_case_of_each_class_is_handled_in_one_line(
    name: str, tmp_path: Path
) -> None:
    _check_all(CLASSES[name](), tmp_path)


def test_the_slow_mode_generates_over_2000_cases() -> None:
    assert sum(len(make()) for make in CLASSES.values()) >= 2000


@pytest.mark.parametrize("argv", [["snapshot", "{dir}/s.pickle"], ["report", "{dir}/run.jsonl"]])
def test_the_unaltered_snapshot_and_run_log_are_read_with_exit_0(
    argv: list[str], tmp_path: Path
) -> None:
    """The cases alter a valid input: each would be refused for the alteration, not the base."""
    files = {
        "s.pickle": pickle.dumps(BASE_SNAPSHOT, protocol=4),
        "run.jsonl": _log([_start(ESTIMATE), *[_step(i) for i in range(6)]]),
    }
    case = Case("base", [*argv, *(["-o", "{dir}/o.html"] if argv[0] == "report" else [])], files)
    outcome = run_case(case, tmp_path)
    assert outcome.rc == 0, outcome


# -- the messages, one per class ---------------------------------------------------------------
def _one(case: Case, root: Path) -> str:
    make_special_files(root)
    outcome = run_case(case, root)
    assert outcome.problem(case, root) is None, outcome
    return outcome.stderr


def test_a_snapshot_field_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    snap = {"segments": [{"device": "x", "total_size": 1, "blocks": []}], "device_traces": []}
    err = _one(
        Case("device", ["snapshot", "{dir}/s.pickle"], {"s.pickle": pickle.dumps(snap)}, (2,)),
        tmp_path,
    )
    assert "segment's 'device' is 'x', not a 64-bit integer" in err


def test_a_non_numeric_estimate_in_a_run_logs_start_record_is_named(tmp_path: Path) -> None:
    log = _log([_start({**ESTIMATE, "peak_allocated_bytes": "5 GiB"}), _step(0), _step(1)])
    argv = ["report", "{dir}/run.jsonl", "-o", "{dir}/o.html"]
    err = _one(Case("text", argv, {"run.jsonl": log}, (2,)), tmp_path)
    assert "start record: peak_allocated_bytes is '5 GiB', not a byte count" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"NaN", "NaN is not valid JSON"),  # the JSON reader refuses it first
        (b"1" + b"0" * 30, f"peak_allocated_bytes is 1{'0' * 30}, not a byte count"),
        (b"-1", "peak_allocated_bytes is -1, not a byte count"),
        (b"[1]", "peak_allocated_bytes is [1], not a byte count"),
    ],
)
def test_a_nan_overflowing_or_negative_estimate_file_is_named(
    text: bytes, message: str, tmp_path: Path
) -> None:
    est = b'{"peak_allocated_bytes": ' + text + b"}"
    log = _log([_start(None), _step(0), _step(1)])
    argv = ["report", "{dir}/run.jsonl", "-o", "{dir}/o.html", "--estimate", "{dir}/e.json"]
    err = _one(Case("big", argv, {"run.jsonl": log, "e.json": est}, (2,)), tmp_path)
    assert message in err


def test_a_fifo_output_is_refused_before_the_work(tmp_path: Path) -> None:
    argv = ["report", "{dir}/run.jsonl", "-o", "{dir}/fifo"]  # run.jsonl is missing: not read
    err = _one(Case("fifo", argv, {}, (2,)), tmp_path)
    assert "is a FIFO (named pipe)" in err and "-o/--output" in err


def test_a_png_named_html_is_refused_naming_the_suffix_to_use(tmp_path: Path) -> None:
    argv = ["report", "{dir}/run.jsonl", "--png", "{dir}/x.html"]
    err = _one(Case("png", argv, {}, (2,)), tmp_path)
    assert "ends in .html (HTML), but memfit writes PNG there: name a file ending in .png" in err


def test_check_output_takes_a_new_file_and_an_unknown_suffix(tmp_path: Path) -> None:
    check_output(tmp_path / "new.html", what="--html", fmt="HTML")
    check_output(tmp_path / "report.out", what="--png", fmt="PNG")
    with pytest.raises(UserFileError, match=r"ends in \.json \(JSON\)"):
        check_output(tmp_path / "x.json", what="--png", fmt="PNG")


# -- the monitor: a FIFO log must not block the user's script ----------------------------------
MONITOR_SCRIPT = textwrap.dedent(
    """
    import sys, memfit
    with memfit.Monitor(log=sys.argv[1]) as m:
        for _ in range(3):
            m.step()
    print("LOOP DONE")
    """
)


def _limit_memory() -> None:
    limit = 4 * 1024**3  # torch's import maps ~2 GB of address space; the loop adds nothing
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("target", ["fifo", "/dev/null", "sock", "link-to-fifo"])
def test_a_monitor_on_a_special_log_path_warns_and_runs_the_loop(
    target: str, tmp_path: Path
) -> None:
    make_special_files(tmp_path)
    path = target if target.startswith("/") else str(tmp_path / target)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", MONITOR_SCRIPT, path],
        capture_output=True,
        text=True,
        timeout=120,  # a blocked open would hang here
        env=env,
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LOOP DONE" in proc.stdout
    assert "memfit writes only regular files" in proc.stderr and "no log" in proc.stderr
    assert "Traceback" not in proc.stderr

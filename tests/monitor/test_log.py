"""The run log's one reader: what the writer writes reads back; a crash mid-write is tolerated and
said; anything else wrong is a SpecError naming the file, the line and the problem."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.monitor import RunData, read_log
from memfit.monitor.log import RECORD_FIELDS, RunLog, record
from memfit.userfiles import UserFileError


def _records() -> list[dict[str, Any]]:
    """One record of each type, through the monitor's own constructor (so in its schema)."""
    step = {key: 1 for key in RECORD_FIELDS["step"][2:]} | {"device_used_bytes": None}
    return [
        record("start", memfit_version="0", device="cuda:0", device_name="x",
               device_total_bytes=80 << 30, pid=1, argv=["train.py"], estimate=None),
        record("step", **step),
        record("sample", device_used_bytes=3 << 30, utilization_pct=None, process_used_bytes=None),
        record("oom", step=1, requested_bytes=1 << 30, message="CUDA out of memory",
               live_bytes={"activations": 5 << 30, "cache": None}, advice=["halve the batch"],
               report=None),
        record("error", where="sampler", message="RuntimeError: x"),
        record("end", summary={"outcome": "oom"},
               receipt={"peak_allocated": {"predicted_bytes": 2, "measured_bytes": None,
                                           "error_pct": None}}),
    ]  # fmt: skip


def _write(path: Path, records: list[Any], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def test_what_the_writer_writes_reads_back_whole_and_by_type(tmp_path: Path) -> None:
    written = _records()
    log = RunLog(tmp_path / "run.jsonl")
    for rec in written:
        log.write(rec)
    log.close()
    run = read_log(tmp_path / "run.jsonl")
    assert isinstance(run, RunData) and run.path == tmp_path / "run.jsonl"
    assert list(run.records) == written and not run.truncated_last_line
    assert run.start == written[0] and run.end == written[-1]
    by_type = (run.steps, run.samples, run.ooms, run.errors)
    assert by_type == ([written[1]], [written[2]], [written[3]], [written[4]])
    assert run.t0 == written[0]["time"] and run.peak("allocated_bytes") == 1
    assert run.peak("device_used_bytes") is None  # null in every step: unknown, not 0


def test_keys_beyond_the_schema_are_kept(tmp_path: Path) -> None:
    recs = _records()
    recs[1]["added_in_a_later_version"] = 7
    assert read_log(_write(tmp_path / "run.jsonl", recs)).steps[0]["added_in_a_later_version"] == 7


def test_a_last_line_cut_short_is_dropped_and_reported(tmp_path: Path) -> None:
    recs = _records()[:-1]  # no end record: the process died
    run = read_log(_write(tmp_path / "crash.jsonl", recs, tail='{"type": "step", "time": 17'))
    assert run.truncated_last_line and list(run.records) == recs and run.end is None
    # cut inside a multi-byte character: still the crash, not a decoding error
    cut = tmp_path / "cut.jsonl"
    partial = '{"type": "error", "message": "é'.encode()[:-1]
    cut.write_bytes(_write(cut, recs).read_bytes() + partial)
    assert read_log(cut).truncated_last_line


def test_a_bad_last_line_with_its_newline_is_not_a_crash(tmp_path: Path) -> None:
    log = _write(tmp_path / "r.jsonl", _records()[:2], tail='{"type": "step", "ti\n')
    with pytest.raises(SpecError, match=r"r\.jsonl:3 is not a JSON record \(Unterminated string"):
        read_log(log)


def test_bad_json_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    recs = _records()
    log = _write(tmp_path / "bad.jsonl", recs[:2])
    log.write_text(log.read_text() + "not json\n" + json.dumps(recs[2]) + "\n")
    with pytest.raises(SpecError, match=r"bad\.jsonl:3 is not a JSON record \(Expecting value\)"):
        read_log(log)
    log.write_bytes(b'{"type": "start"}\xff\n' + log.read_bytes())
    with pytest.raises(SpecError, match=r"bad\.jsonl:1 is not UTF-8 text \(invalid start byte"):
        read_log(log)


def test_a_missing_field_is_named_with_its_record_type(tmp_path: Path) -> None:
    recs = _records()
    del recs[1]["allocated_bytes"], recs[1]["reserved_bytes"]
    with pytest.raises(SpecError, match=r"m\.jsonl:2: step record lacks 'allocated_bytes', "
                                        r"'reserved_bytes'$"):  # fmt: skip
        read_log(_write(tmp_path / "m.jsonl", recs))
    recs = _records()
    del recs[0]["time"]
    with pytest.raises(SpecError, match=r"m\.jsonl:1: start record needs a numeric 'time' "
                                        r"\(unix seconds\)$"):  # fmt: skip
        read_log(_write(tmp_path / "m.jsonl", recs))


@pytest.mark.parametrize(
    ("record_type", "key", "value", "expected"),
    [
        (
            "start",
            "time",
            "noon",
            "start record needs a numeric 'time' (unix seconds), got \"noon\"",
        ),
        ("step", "step", None, "step record's 'step' must be a number, got null"),
        (
            "step",
            "allocated_bytes",
            "1 GiB",
            'must be a number or null, got "1 GiB"',
        ),
        (
            "step",
            "peak_reserved_bytes",
            True,
            "'peak_reserved_bytes' must be a number or null, got true",
        ),
        ("oom", "live_bytes", {"a": "5"}, "'live_bytes' must be an object of byte counts or null"),
        (
            "oom",
            "advice",
            "halve it",
            'must be an array or null, got "halve it"',
        ),
        (
            "end",
            "receipt",
            {"peak_allocated": 3},
            "'receipt' must be an object of {predicted_bytes",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_named(
    tmp_path: Path, record_type: str, key: str, value: Any, expected: str
) -> None:
    recs = _records()
    line, rec = next((i, r) for i, r in enumerate(recs, 1) if r["type"] == record_type)
    rec[key] = value
    with pytest.raises(SpecError, match=rf"v\.jsonl:{line}: .*{re.escape(expected)}"):
        read_log(_write(tmp_path / "v.jsonl", recs))


KNOWN = "one of start, step, sample, oom, error, end; is this a `memfit monitor` run log?"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            {"type": "checkpoint", "time": 1.0},
            f'u.jsonl:3: record type "checkpoint" is not {KNOWN}',
        ),
        ({"type": ["step"], "time": 1.0}, 'u.jsonl:3: record type ["step"] is not one of start'),
        ({"time": 1.0}, f"u.jsonl:3: no 'type', which must be {KNOWN}"),
        ([1, 2], "u.jsonl:3 is a JSON array, not a run record (an object)"),
        ("step", "u.jsonl:3 is a JSON string, not a run record (an object)"),
    ],
)
def test_a_line_that_is_not_a_known_record_is_an_error(
    tmp_path: Path, line: Any, expected: str
) -> None:
    recs = _records()
    with pytest.raises(SpecError, match=re.escape(expected)):
        read_log(_write(tmp_path / "u.jsonl", recs[:2] + [line] + recs[2:]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"has no record \(the file is empty\): give a log written by memfit\.Monitor"),
        ("\n  \n", r"has no record \(the file is empty\)"),
        ('{"type": "start", "ti', r"has no record \(its only line was cut short mid-write\)"),
    ],
)
def test_a_log_without_a_record_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "e.jsonl").write_text(text)
    with pytest.raises(SpecError, match=r"run log '.*e\.jsonl' " + message):
        read_log(tmp_path / "e.jsonl")


def test_a_missing_or_unreadable_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserFileError, match=r"run log '.*nope\.jsonl' does not exist"):
        read_log(tmp_path / "nope.jsonl")
    with pytest.raises(UserFileError, match=r"run log '.*' is a directory"):
        read_log(tmp_path)


@pytest.mark.parametrize("command", ["diagnose", "report"])
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"has no record \(the file is empty\)"),
        (json.dumps(_records()[0]) + "\n{oops\n", r"bad\.jsonl:2 is not a JSON record"),
        ('{"type": "sample", "time": 1}\n', r"bad\.jsonl:1: sample record lacks 'device_used_"),
        ('{"type": "span", "time": 1}\n', r"bad\.jsonl:1: record type \"span\" is not one of"),
    ],
)  # fmt: skip
def test_clis_that_read_a_log_exit_2_with_one_line_naming_file_and_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, message: str
) -> None:
    (tmp_path / "bad.jsonl").write_text(text)
    argv = [command, str(tmp_path / "bad.jsonl")]
    assert main(argv + (["-o", str(tmp_path / "r.html")] if command == "report" else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error:") and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert not (tmp_path / "r.html").exists()

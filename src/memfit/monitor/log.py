"""The run log: JSON Lines, one record per line, flushed as it is written (a crash loses nothing).

Every record has ``"type"`` and ``"time"`` (unix seconds). :data:`RECORD_FIELDS` is the schema, the
one docs/monitoring.md documents; tests check every record the monitor writes against it.
:class:`RunLog` writes it; :func:`read_log` is the one reader (``memfit report``, ``memfit
diagnose``, ``memfit doctor --log``), checking each record against the same schema.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from memfit.errors import SpecError

#: The keys of each record type, in the order they are written.
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "start": (
        "type",
        "time",
        "memfit_version",
        "device",
        "device_name",
        "device_total_bytes",
        "pid",
        "argv",
        "estimate",
    ),
    "step": (
        "type",
        "time",
        "step",
        "step_time_s",
        "tokens",
        "samples",
        "tokens_per_s",
        "samples_per_s",
        "allocated_bytes",
        "peak_allocated_bytes",
        "reserved_bytes",
        "peak_reserved_bytes",
        "device_used_bytes",
        "utilization_pct",
        "rss_bytes",
    ),
    "sample": ("type", "time", "device_used_bytes", "utilization_pct", "process_used_bytes"),
    "oom": (
        "type",
        "time",
        "step",
        "requested_bytes",
        "message",
        "live_bytes",
        "advice",
        "report",
    ),
    "error": ("type", "time", "where", "message"),
    "end": ("type", "time", "summary", "receipt"),
}


def record(kind: str, **fields: Any) -> dict[str, Any]:
    """A record of type ``kind`` stamped with the current time; the fields must match the schema."""
    rec = {"type": kind, "time": time.time(), **fields}
    expected = RECORD_FIELDS[kind]
    if set(rec) != set(expected):
        raise ValueError(f"{kind} record has keys {sorted(rec)}, the schema says {expected}")
    return {key: rec[key] for key in expected}


class RunLog:
    """Append records to ``path`` (truncated on open), one flushed line each; thread-safe.

    ``fsync``: also ask the OS to put each line on disk (survives a machine crash, costs
    milliseconds per record on slow disks; flushing alone survives a process crash).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, mode: str = "w"):
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (closed in close())

    def write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":"), default=_json_default) + "\n"
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


def _json_default(value: Any) -> Any:
    """numpy / torch scalars that slipped into a record become plain numbers."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return str(value)


# -- reading it back ----------------------------------------------------------------------------

#: Checked values, by record type: the keys a reader computes with and what each must hold. Every
#: key of RECORD_FIELDS must be present; keys beyond it are kept (a newer memfit may add some).
#: Memory and rates may be null ("unknown"), as docs/monitoring.md says.
_VALUE_KINDS: dict[str, dict[str, str]] = {
    "start": {"device_total_bytes": "number?", "argv": "list?", "estimate": "object?"},
    "step": {
        key: "number" if key == "step" else "number?"
        for key in RECORD_FIELDS["step"]
        if key not in ("type", "time")
    },
    "sample": {key: "number?" for key in RECORD_FIELDS["sample"] if key not in ("type", "time")},
    "oom": {
        "step": "number?",
        "requested_bytes": "number?",
        "message": "text?",
        "live_bytes": "bytes by name?",
        "advice": "list?",
        "report": "text?",
    },
    "error": {"where": "text?", "message": "text?"},
    "end": {"summary": "object?", "receipt": "receipt?"},
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_receipt(value: Any) -> bool:
    """``{metric: {"predicted_bytes", "measured_bytes", "error_pct"}}``, each a number or null."""
    keys = ("predicted_bytes", "measured_bytes", "error_pct")
    return isinstance(value, dict) and all(
        isinstance(row, dict) and all(row.get(k) is None or _is_number(row[k]) for k in keys)
        for row in value.values()
    )


#: kind -> (test, what the error message says the value must be).
_KIND_TESTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "number": (_is_number, "a number"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "list": (lambda v: isinstance(v, list), "an array"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "bytes by name": (
        lambda v: isinstance(v, dict) and all(x is None or _is_number(x) for x in v.values()),
        "an object of byte counts",
    ),
    "receipt": (_is_receipt, "an object of {predicted_bytes, measured_bytes, error_pct}"),
}

_JSON_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


@dataclass(frozen=True, kw_only=True)
class RunData:
    """A run log read back by :func:`read_log`: its records in file order, and views by type."""

    path: Path
    records: tuple[dict[str, Any], ...]
    #: The last line was cut short (the process died mid-write) and was dropped.
    truncated_last_line: bool = False

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [rec for rec in self.records if rec["type"] == kind]

    @cached_property
    def steps(self) -> list[dict[str, Any]]:
        return self.of_type("step")

    @cached_property
    def samples(self) -> list[dict[str, Any]]:
        return self.of_type("sample")

    @cached_property
    def ooms(self) -> list[dict[str, Any]]:
        return self.of_type("oom")

    @cached_property
    def errors(self) -> list[dict[str, Any]]:
        return self.of_type("error")

    @cached_property
    def start(self) -> dict[str, Any] | None:
        """The (last) start record, or None."""
        return next((r for r in reversed(self.records) if r["type"] == "start"), None)

    @cached_property
    def end(self) -> dict[str, Any] | None:
        """The (last) end record; None when the process was killed or crashed."""
        return next((r for r in reversed(self.records) if r["type"] == "end"), None)

    @property
    def t0(self) -> float:
        """The run's first timestamp (the start record's, else the first record's)."""
        first = self.start or self.records[0]
        return float(first["time"])

    def peak(self, key: str) -> int | None:
        """The largest non-null ``key`` over the step records, or None."""
        values = [s[key] for s in self.steps if s.get(key) is not None]
        return max(values) if values else None


def read_log(path: str | os.PathLike[str]) -> RunData:
    """Read a run log back, every record checked against the schema.

    A last line without its newline that does not parse is the record the process was writing
    when it died: it is dropped, and ``truncated_last_line`` says so. Anything else raises a
    :class:`SpecError` naming the file, the line and the problem: a line that is not UTF-8 or not
    JSON, a value that is not an object, a record type not in :data:`RECORD_FIELDS`, a key of the
    schema missing, a value of the wrong kind (see ``_VALUE_KINDS``), or a file with no record.
    """
    p = Path(path)
    data = _read_bytes(p)
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")  # the writer ends every whole line with its newline
    records: list[dict[str, Any]] = []
    truncated = False
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rec = _parse(f"{p}:{number}", raw, may_be_cut=number == len(lines) and not complete)
        if rec is None:
            truncated = True
            break
        records.append(_check(f"{p}:{number}", rec))
    if not records:
        what = "its only line was cut short mid-write" if truncated else "the file is empty"
        raise SpecError(
            f"run log {str(p)!r} has no record ({what}): give a log written by memfit.Monitor "
            "or `memfit monitor`"
        )
    return RunData(path=p, records=tuple(records), truncated_last_line=truncated)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"run log {str(path)!r} does not exist") from None
    except OSError as exc:
        raise SpecError(f"cannot read run log {str(path)!r}: {exc.strerror or exc}") from None


def _parse(where: str, raw: bytes, *, may_be_cut: bool) -> Any:
    """The JSON value of one line; None for a last line cut short (``may_be_cut``)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        if may_be_cut:
            return None
        raise SpecError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        if may_be_cut:
            return None
        raise SpecError(f"{where} is not a JSON record ({exc.msg})") from None


def _check(where: str, rec: Any) -> dict[str, Any]:
    """``rec`` if it is a run record of a known type with the schema's keys and kinds of value."""
    if not isinstance(rec, dict):
        raise SpecError(f"{where} is a JSON {_json_name(rec)}, not a run record (an object)")
    kind = rec.get("type")
    if not isinstance(kind, str) or kind not in RECORD_FIELDS:
        what = f"record type {_short(kind)} is not" if "type" in rec else "no 'type', which must be"
        raise SpecError(
            f"{where}: {what} one of {', '.join(RECORD_FIELDS)}; "
            "is this a `memfit monitor` run log?"
        )
    if not _is_number(rec.get("time")):
        got = f", got {_short(rec['time'])}" if "time" in rec else ""
        raise SpecError(f"{where}: {kind} record needs a numeric 'time' (unix seconds){got}")
    missing = [key for key in RECORD_FIELDS[kind] if key not in rec]
    if missing:
        raise SpecError(f"{where}: {kind} record lacks {', '.join(map(repr, missing))}")
    for key, rule in _VALUE_KINDS[kind].items():
        value, nullable = rec[key], rule.endswith("?")
        test, must_be = _KIND_TESTS[rule.rstrip("?")]
        if not (test(value) or (nullable and value is None)):
            must_be += " or null" if nullable else ""
            got = _short(value)
            raise SpecError(f"{where}: {kind} record's {key!r} must be {must_be}, got {got}")
    return rec


def _json_name(value: Any) -> str:
    return _JSON_NAMES.get(type(value), "number")


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."

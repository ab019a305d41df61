"""A run log (``memfit monitor``'s JSON Lines) read into series for the HTML and PNG reports.

The schema is docs/monitoring.md's: every record has ``type`` and ``time`` (unix seconds); types
``start``, ``step``, ``sample``, ``oom``, ``error``, ``end``. A last line cut short (the process
died mid-write) is dropped; any other bad line raises a :class:`SpecError` naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import SpecError

RECORD_TYPES = ("start", "step", "sample", "oom", "error", "end")

#: Fields a report needs from each record type, and whether each may be null.
_REQUIRED: dict[str, dict[str, bool]] = {
    "step": {
        "step": False,
        "step_time_s": True,
        "allocated_bytes": True,
        "peak_allocated_bytes": True,
        "reserved_bytes": True,
        "peak_reserved_bytes": True,
    },
    "sample": {"device_used_bytes": True},
    "oom": {"message": True},
    "error": {"message": True},
}


@dataclass
class RunData:
    """The records of one run, by type, in file order."""

    path: Path
    start: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    ooms: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    truncated_last_line: bool = False

    @property
    def t0(self) -> float:
        """The run's first timestamp (the start record's, else the first record's)."""
        for rec in (self.start, *self.steps[:1], *self.samples[:1], *self.ooms[:1]):
            if rec is not None:
                return float(rec["time"])
        return 0.0

    def peak(self, key: str) -> int | None:
        values = [s[key] for s in self.steps if s.get(key) is not None]
        return max(values) if values else None


def _check(path: Path, number: int, rec: Any) -> dict[str, Any]:
    where = f"{path}:{number}"
    if not isinstance(rec, dict):
        raise SpecError(f"{where} is a JSON {type(rec).__name__}, not a run record (an object)")
    kind = rec.get("type")
    if kind not in RECORD_TYPES:
        raise SpecError(
            f"{where}: record type {kind!r} is not one of {', '.join(RECORD_TYPES)}; "
            "is this a `memfit monitor` run log?"
        )
    if not isinstance(rec.get("time"), (int, float)) or isinstance(rec.get("time"), bool):
        raise SpecError(f"{where}: {kind} record needs a numeric 'time' (unix seconds)")
    for key, nullable in _REQUIRED.get(kind, {}).items():
        if key not in rec:
            raise SpecError(f"{where}: {kind} record lacks {key!r}")
        value = rec[key]
        if value is None and nullable:
            continue
        if key != "message" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise SpecError(f"{where}: {kind} record's {key!r} must be a number, got {value!r}")
    return rec


def read_run(path: str | Path) -> RunData:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"run log {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read run log {str(path)!r}: {exc}") from None
    lines = text.split("\n")
    complete = text.endswith("\n")
    run = RunData(path=path)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not complete:
                run.truncated_last_line = True  # the writer died mid-line
                break
            raise SpecError(f"{path}:{number} is not a JSON record ({exc.msg})") from None
        rec = _check(path, number, rec)
        kind = rec["type"]
        if kind == "start":
            run.start = rec
        elif kind == "end":
            run.end = rec
        else:
            {"step": run.steps, "sample": run.samples, "oom": run.ooms, "error": run.errors}[
                kind
            ].append(rec)
    if run.start is None and not run.steps and not run.samples:
        raise SpecError(f"{path}: no start, step or sample record; is this a `memfit monitor` log?")
    return run

"""The run log: JSON Lines, one record per line, flushed as it is written (a crash loses nothing).

Every record has ``"type"`` and ``"time"`` (unix seconds). :data:`RECORD_FIELDS` is the schema, the
same one docs/monitoring.md documents and ``memfit report`` reads; tests check every record the
monitor writes against it.
"""

from __future__ import annotations

import json
import os
import threading
import time
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


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a run log. A last line cut short (the process died mid-write) is dropped; any
    other unreadable line raises a SpecError naming the file and line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SpecError(f"run log {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read run log {str(p)!r}: {exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # a crash mid-write
            raise SpecError(f"{p}:{number} is not a JSON record ({exc.msg})") from None
        if not isinstance(rec, dict) or rec.get("type") not in RECORD_FIELDS:
            raise SpecError(
                f"{p}:{number} is not a memfit run record (type must be one of "
                f"{', '.join(RECORD_FIELDS)}): is this a `memfit monitor` log?"
            )
        records.append(rec)
    return records

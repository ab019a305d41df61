"""The run log's schema: the record types, their keys in order, and :func:`record`.

docs/monitoring.md documents it; the writer (log.py) and the reader (reader.py) both use it.
"""

from __future__ import annotations

import time
from typing import Any

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

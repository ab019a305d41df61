"""Read run logs back, streamed: one line in memory at a time, aggregates kept as they go.

:func:`read_log` reads one file through :func:`memfit.userfiles.iter_lines` (regular files only,
a per-line cap) and keeps: every start / end / oom / error record (errors and ooms up to
:data:`MAX_KEPT_RECORDS`), at most :data:`MAX_KEPT_RECORDS` step and sample records evenly spaced
over the run (every k-th, k doubling as the run grows, the last one always kept), and the exact
peak of every numeric field over *all* records. So a 200 MB log costs a few MB whatever its length
(measured: docs/monitoring.md). Charts and the leak line are drawn through the kept points; the
peaks and counts are exact.

A line that is JSON but not a usable record value — NaN, Infinity, an integer beyond int64, nesting
deeper than a writer makes — is skipped and counted (:attr:`RunData.n_skipped_lines`, the first
reason in :attr:`RunData.skipped_reason`); anything else wrong (not UTF-8, not JSON, not a record
of the schema) raises a :class:`SpecError` naming file and line (exit 2 in the CLI).

:func:`rank_logs` finds the per-rank files of a multi-process run from its base path.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.monitor.schema import RECORD_FIELDS
from memfit.userfiles import iter_lines, open_regular

#: Step and sample records kept per log (evenly spaced); also the cap on errors and ooms kept.
MAX_KEPT_RECORDS = 10_000
#: Nesting deeper than this is no record memfit writes (the estimate object is ~4 deep).
MAX_DEPTH = 32
MAX_INT = 2**63 - 1

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


_NUMBER_TYPES = (int, float)


def _is_number(value: Any) -> bool:
    return type(value) in _NUMBER_TYPES or (
        isinstance(value, (int, float)) and not isinstance(value, bool)
    )


def _is_receipt(value: Any) -> bool:
    keys = ("predicted_bytes", "measured_bytes", "error_pct")
    return isinstance(value, dict) and all(
        isinstance(row, dict) and all(row.get(k) is None or _is_number(row[k]) for k in keys)
        for row in value.values()
    )


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


class _Kept:
    """At most ``cap`` records evenly spaced over a stream (stride doubles), plus the last."""

    def __init__(self, cap: int) -> None:
        self.cap, self.stride, self.n = cap, 1, 0
        self.items: list[tuple[int, dict[str, Any]]] = []
        self.last: tuple[int, dict[str, Any]] | None = None

    def add(self, line: int, rec: dict[str, Any]) -> None:
        if self.n % self.stride == 0:
            self.items.append((line, rec))
            if len(self.items) > self.cap:
                self.items = self.items[::2]
                self.stride *= 2
        self.n += 1
        self.last = (line, rec)

    def done(self) -> list[tuple[int, dict[str, Any]]]:
        if self.last is not None and (not self.items or self.items[-1][0] != self.last[0]):
            return [*self.items, self.last]
        return self.items


@dataclass(frozen=True, kw_only=True)
class RunData:
    """A run log read back by :func:`read_log`: its kept records in file order, views by type,
    exact peaks and counts over every record."""

    path: Path
    records: tuple[dict[str, Any], ...]
    #: The last line was cut short (the process died mid-write) and was dropped.
    truncated_last_line: bool = False
    #: Records of each type in the file (all of them, kept or not).
    n_records: dict[str, int] = field(default_factory=dict)
    #: Largest value of each numeric key, per record type, over every record.
    maxima: dict[str, dict[str, float]] = field(default_factory=dict)
    n_skipped_lines: int = 0
    skipped_reason: str | None = None
    #: What a reader combined to give this run (several rank logs), said in reports.
    note: str | None = None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [rec for rec in self.records if rec["type"] == kind]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self._view("step")

    @property
    def samples(self) -> list[dict[str, Any]]:
        return self._view("sample")

    @property
    def ooms(self) -> list[dict[str, Any]]:
        return self._view("oom")

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self._view("error")

    def _view(self, kind: str) -> list[dict[str, Any]]:
        cache = self.__dict__.setdefault("_views", {})
        if kind not in cache:
            cache[kind] = self.of_type(kind)
        return list(cache[kind])

    @property
    def start(self) -> dict[str, Any] | None:
        """The (last) start record, or None."""
        return next((r for r in reversed(self.records) if r["type"] == "start"), None)

    @property
    def end(self) -> dict[str, Any] | None:
        """The (last) end record; None when the process was killed or crashed."""
        return next((r for r in reversed(self.records) if r["type"] == "end"), None)

    @property
    def n_steps(self) -> int:
        return self.n_records.get("step", 0)

    @property
    def t0(self) -> float:
        """The run's first timestamp (the start record's, else the first record's)."""
        first = self.start or self.records[0]
        return float(first["time"])

    def peak(self, key: str, kind: str = "step") -> int | None:
        """The largest non-null ``key`` over every ``kind`` record (all of them, not only the
        kept ones), or None."""
        value = self.maxima.get(kind, {}).get(key)
        if value is None:
            values = [s[key] for s in self._view(kind) if s.get(key) is not None]
            return max(values) if values else None
        return int(value) if float(value).is_integer() else value  # type: ignore[return-value]


def read_log(path: str | os.PathLike[str]) -> RunData:
    """Read a run log back, streamed, every record checked against the schema (module docstring).

    A last line without its newline that does not parse is the record the process was writing
    when it died: it is dropped, and ``truncated_last_line`` says so.
    """
    p = Path(path)
    kept = {kind: _Kept(MAX_KEPT_RECORDS) for kind in ("step", "sample", "oom", "error")}
    others: list[tuple[int, dict[str, Any]]] = []
    counts: dict[str, int] = {}
    maxima: dict[str, dict[str, float]] = {}
    skipped, reason = 0, None
    failed: SpecError | None = None  # a line that does not parse: an error unless it is the last
    for number, raw in iter_lines(p, what="run log"):
        if not raw.strip():
            continue
        if failed is not None:
            raise failed
        where = f"{p}:{number}"
        try:
            rec = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except UnicodeDecodeError as exc:
            failed = SpecError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        except _Unusable as exc:
            skipped, reason = skipped + 1, reason or f"line {number}: {exc}"
            continue
        except RecursionError:
            skipped, reason = skipped + 1, reason or f"line {number}: nested too deeply"
            continue
        except ValueError as exc:  # JSONDecodeError, or an integer of thousands of digits
            if not isinstance(exc, json.JSONDecodeError):
                skipped, reason = skipped + 1, reason or f"line {number}: {exc}"
                continue
            failed = SpecError(f"{where} is not a JSON record ({exc.msg})")
            continue
        bad = _unusable_value(rec, 0)
        if bad is not None:
            skipped, reason = skipped + 1, reason or f"line {number}: {bad}"
            continue
        rec = _check(where, rec)
        kind = rec["type"]
        counts[kind] = counts.get(kind, 0) + 1
        _fold_maxima(maxima.setdefault(kind, {}), rec)  # after the check: numbers are plain
        (kept[kind].add if kind in kept else lambda n, r: others.append((n, r)))(number, rec)
    truncated = False
    if failed is not None:
        if _ends_with_newline(p):
            raise failed
        truncated = True
    records = sorted(
        [item for k in kept.values() for item in k.done()] + others, key=lambda item: item[0]
    )
    if not records:
        what = "its only line was cut short mid-write" if truncated else "the file is empty"
        if skipped:
            what = f"{skipped} lines skipped, {reason}"
        raise SpecError(
            f"run log {str(p)!r} has no record ({what}): give a log written by memfit.Monitor "
            "or `memfit monitor`"
        )
    return RunData(
        path=p,
        records=tuple(rec for _, rec in records),
        truncated_last_line=truncated,
        n_records=counts,
        maxima=maxima,
        n_skipped_lines=skipped,
        skipped_reason=reason,
    )


class _Unusable(ValueError):
    """A JSON value no memfit writer produces (NaN, Infinity)."""


def _no_constant(name: str) -> Any:
    raise _Unusable(f"{name} is not a usable value")


def _unusable_value(value: Any, depth: int) -> str | None:
    """Why ``value`` cannot be computed with (a non-finite number, an integer beyond int64,
    nesting deeper than MAX_DEPTH), or None."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict) and depth == 0:  # the record itself: a flat loop, fast
        for child in value.values():
            kind = type(child)
            if kind is str or child is None:
                continue
            if kind is int:
                if not -MAX_INT <= child <= MAX_INT:
                    return "an integer beyond 64 bits"
                continue
            if kind is float:
                if child - child != 0.0:  # inf - inf and nan - nan are nan
                    return f"{child} is not a usable value"
                continue
            why = _unusable_value(child, 1)
            if why is not None:
                return why
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a usable value"
    if isinstance(value, int) and not isinstance(value, bool):
        return None if -MAX_INT <= value <= MAX_INT else "an integer beyond 64 bits"
    children: Iterable[Any] = ()
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list):
        children = value
    for child in children:
        why = _unusable_value(child, depth + 1)
        if why is not None:
            return why
    return None


def _fold_maxima(into: dict[str, float], rec: dict[str, Any]) -> None:
    for key, value in rec.items():
        if type(value) in _NUMBER_TYPES and key != "time":
            old = into.get(key)
            if old is None or value > old:
                into[key] = value


def _ends_with_newline(p: Path) -> bool:
    with open_regular(p, what="run log") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return True
        f.seek(size - 1)
        return f.read(1) == b"\n"


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


# -- several ranks ------------------------------------------------------------------------------

_RANK_FILE = re.compile(r"\.rank(\d+)$")


def rank_logs(path: str | os.PathLike[str]) -> list[Path]:
    """The files of one run: ``run.rank0.jsonl``, ``run.rank1.jsonl``, ... when ``path`` is the
    base name of a multi-process run (sorted by rank), else ``[path]``."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    found: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return [p]
    for entry in entries:
        name = Path(entry.name)
        if name.suffix != p.suffix:
            continue
        m = _RANK_FILE.search(name.stem)
        if m and name.stem[: m.start()] == p.stem and entry.is_file():
            found.append((int(m.group(1)), parent / entry.name))
    return [q for _, q in sorted(found)] or [p]


def rank_of(path: Path) -> int | None:
    m = _RANK_FILE.search(path.stem)
    return int(m.group(1)) if m else None


def read_runs(paths: Iterable[str | os.PathLike[str]]) -> list[RunData]:
    """Every file of the run(s) named: each path expanded by :func:`rank_logs`, each file once."""
    seen: dict[Path, None] = {}
    for path in paths:
        for q in rank_logs(path):
            seen.setdefault(q, None)
    return [read_log(q) for q in seen]


def binding_rank(runs: list[RunData]) -> tuple[RunData, str | None]:
    """The run a one-run view shows for several rank logs: the rank with the highest peak
    (allocated, else device used, else RSS) — the one that runs out of memory first — and a
    sentence saying so; ``(run, None)`` for a single log."""
    if len(runs) == 1:
        return runs[0], None

    def peak(run: RunData) -> float:
        for key, kind in (
            ("peak_allocated_bytes", "step"),
            ("process_used_bytes", "sample"),
            ("device_used_bytes", "sample"),
            ("rss_bytes", "step"),
        ):
            value = run.peak(key, kind)
            if value is not None:
                return float(value)
        return 0.0

    shown = max(runs, key=peak)
    names = ", ".join(r.path.name for r in runs)
    note = (
        f"merged {len(runs)} rank logs ({names}); shown: {shown.path.name}, the highest peak "
        f"({', '.join(f'{r.path.name} {_gib(peak(r))}' for r in runs)})"
    )
    return shown, note


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"

"""A derived form's large integer lists kept beside its JSON file as arrays, read instead of the
JSON: the same form, loaded in a few milliseconds rather than tens (a warm `plan` loads ~20).

The JSON file stays the form (:mod:`memfit.estimate.derived.cache`); ``{key}.arrays.npz`` next
to it is derived from it and only used while it matches it: it records the JSON file's size
and modification time (ns), and the form's key and format, and is ignored (then written again)
when any differs. It is framed and hashed as every cache entry
(:mod:`memfit.estimate.derived.entry`: header line with key, format, length and sha256, read
through the bounded reader); a sidecar that fails those checks is corrupt (a note, rebuilt).
It holds each run's ``ev``, ``a0``, ``a1``, ``comp``,
``mod``, ``order`` and ``ignored`` as int64 arrays (a list that is empty or not all int64
integers stays in the JSON) and the rest of the form as JSON text; numpy reads it with
``allow_pickle=False``. A form loaded from it has those fields as arrays, which every reader of a
loaded form takes (the compiled evaluator, :mod:`memfit.estimate.derived.staging`, the reference
replay of :mod:`memfit.estimate.derived.form`).
"""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

from memfit.estimate.derived.entry import CorruptEntry, read_entry, write_entry

#: The fields of a run kept as arrays.
ARRAY_FIELDS = ("ev", "a0", "a1", "comp", "mod", "order", "ignored")
#: The cache kind in a sidecar's header (:mod:`memfit.estimate.derived.entry`).
KIND = "arrays"
#: The most a sidecar may hold (read through the bounded reader); a larger one is not written.
MAX_BYTES = 256 * 1024 * 1024
#: The sidecar's name: the JSON file's with this suffix for ``.json``.
SUFFIX = ".arrays.npz"


def path_for(json_path: Path) -> Path:
    """The sidecar of ``json_path`` (``{key}.json`` -> ``{key}.arrays.npz``)."""
    return json_path.with_name(json_path.name.removesuffix(".json") + SUFFIX)


def read(json_path: Path, key: str, fmt: int) -> dict[str, Any] | None:
    """The form from the sidecar of ``json_path``, or None where it is absent or no longer
    matches the JSON file (its size and modification time: a stale sidecar, written again).
    :class:`~memfit.estimate.derived.entry.CorruptEntry` where the file is there but is not a
    verified sidecar of this form (framed and hashed as every cache entry, read through the
    bounded reader: edited, truncated, foreign, not a regular file, or of the wrong shape)."""
    try:
        stat = json_path.stat()
    except OSError:
        return None
    payload = read_entry(path_for(json_path), kind=KIND, key=key, fmt=fmt, max_bytes=MAX_BYTES)
    if payload is None:
        return None
    import numpy as np  # here, not at the top: an answer that reads no form imports no numpy

    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            if [int(v) for v in z["stat"]] != [stat.st_size, stat.st_mtime_ns]:
                return None
            data = json.loads(bytes(z["form"]).decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != fmt or data.get("key") != key:
                raise CorruptEntry("its form names another entry")
            for name in z.files:
                if name.startswith("run/"):
                    _, where, field = name.split("/", 2)
                    _run_at(data, where)[field] = z[name]
            runs = [
                *data.get("runs", []),
                *(r for rs in data.get("exact", {}).values() for r in rs),
            ]
            if any(run.get(field, 0) is None for run in runs for field in ARRAY_FIELDS):
                raise CorruptEntry("a run without its arrays")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            zipfile.BadZipFile) as exc:  # fmt: skip
        if isinstance(exc, CorruptEntry):
            raise
        raise CorruptEntry(f"arrays of the wrong shape: {type(exc).__name__}") from None
    return data


def write(json_path: Path, data: dict[str, Any]) -> None:
    """Write the sidecar of ``json_path`` (holding ``data``, as stored) atomically; skipped
    where it cannot be written or ``data`` has no run to keep (a refusal)."""
    import numpy as np  # here, not at the top: an answer that writes no form imports no numpy

    arrays: dict[str, Any] = {}  # Any: numpy's savez stub would type them as its allow_pickle

    def strip(run: dict[str, Any], where: str) -> dict[str, Any]:
        kept = dict(run)
        for field in ARRAY_FIELDS:
            values = run.get(field)
            if not isinstance(values, list) or not values:
                continue
            try:
                arr = np.asarray(values)
            except (ValueError, OverflowError, TypeError):
                continue
            if arr.dtype != np.int64 or arr.ndim != 1:
                continue  # not plain int64 integers: left in the JSON text
            arrays[f"run/{where}/{field}"] = arr
            kept[field] = None  # its place in the run's keys: filled back on reading
        return kept

    skeleton = dict(data)
    if "runs" in data:
        skeleton["runs"] = [strip(r, f"runs.{i}") for i, r in enumerate(data["runs"])]
    if "exact" in data:
        skeleton["exact"] = {
            b: [strip(r, f"exact.{b}.{i}") for i, r in enumerate(runs)]
            for b, runs in data["exact"].items()
        }
    key, fmt = data.get("key"), data.get("format")
    if not arrays or not isinstance(key, str) or not isinstance(fmt, int):
        return
    with contextlib.suppress(OSError, ValueError):
        stat = json_path.stat()
        form = np.frombuffer(json.dumps(skeleton, separators=(",", ":")).encode(), np.uint8)
        buf = io.BytesIO()
        np.savez(buf, stat=np.asarray([stat.st_size, stat.st_mtime_ns]), form=form, **arrays)
        payload = buf.getvalue()
        if len(payload) <= MAX_BYTES:
            write_entry(path_for(json_path), payload, kind=KIND, key=key, fmt=fmt)


def _run_at(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The run at ``where`` (``runs.i`` or ``exact.<batch>.i``) of a form."""
    head, rest = where.split(".", 1)
    if head == "runs":
        run: dict[str, Any] = data["runs"][int(rest)]
        return run
    batch, i = rest.rsplit(".", 1)
    run = data["exact"][batch][int(i)]
    return run

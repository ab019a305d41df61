"""A derived form's large integer lists kept beside its JSON file as arrays, read instead of the
JSON: the same form, loaded in a few milliseconds rather than tens (a warm `plan` loads ~20).

The JSON file stays the form (:mod:`memfit.estimate.derived.cache`); ``{key}.arrays.npz`` next
to it is derived from it and only trusted while it matches it: it records the JSON file's size
and modification time (ns), and the form's key and format, and is ignored (then written again)
when any differs or it cannot be read. It holds each run's ``ev``, ``a0``, ``a1``, ``comp``,
``mod``, ``order`` and ``ignored`` as int64 arrays (a list that is empty or not all int64
integers stays in the JSON) and the rest of the form as JSON text; numpy reads it with
``allow_pickle=False``. A form loaded from it has those fields as arrays, which every reader of a
loaded form takes (the compiled evaluator, :mod:`memfit.estimate.derived.staging`, the reference
replay of :mod:`memfit.estimate.derived.form`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

#: The fields of a run kept as arrays.
ARRAY_FIELDS = ("ev", "a0", "a1", "comp", "mod", "order", "ignored")
#: The sidecar's name: the JSON file's with this suffix for ``.json``.
SUFFIX = ".arrays.npz"


def path_for(json_path: Path) -> Path:
    """The sidecar of ``json_path`` (``{key}.json`` -> ``{key}.arrays.npz``)."""
    return json_path.with_name(json_path.name.removesuffix(".json") + SUFFIX)


def read(json_path: Path, key: str, fmt: int) -> dict[str, Any] | None:
    """The form from the sidecar of ``json_path``, or None where it is absent, unreadable, or
    does not match the JSON file (its size and modification time) or the form's key and
    format."""
    try:
        stat = json_path.stat()
        with np.load(path_for(json_path), allow_pickle=False) as z:
            if [int(v) for v in z["stat"]] != [stat.st_size, stat.st_mtime_ns]:
                return None
            data = json.loads(bytes(z["form"]).decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != fmt or data.get("key") != key:
                return None
            for name in z.files:
                if name.startswith("run/"):
                    _, where, field = name.split("/", 2)
                    _run_at(data, where)[field] = z[name]
            runs = [
                *data.get("runs", []),
                *(r for rs in data.get("exact", {}).values() for r in rs),
            ]
            if any(run.get(field, 0) is None for run in runs for field in ARRAY_FIELDS):
                return None  # a placeholder without its array
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile):
        return None
    return data


def write(json_path: Path, data: dict[str, Any]) -> None:
    """Write the sidecar of ``json_path`` (holding ``data``, as stored) atomically; skipped
    where it cannot be written or ``data`` has no run to keep (a refusal)."""
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
    if not arrays:
        return
    with contextlib.suppress(OSError, ValueError):
        stat = json_path.stat()
        form = np.frombuffer(json.dumps(skeleton, separators=(",", ":")).encode(), np.uint8)
        fd, tmp = tempfile.mkstemp(dir=json_path.parent, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, stat=np.asarray([stat.st_size, stat.st_mtime_ns]), form=form, **arrays)
            os.replace(tmp, path_for(json_path))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _run_at(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The run at ``where`` (``runs.i`` or ``exact.<batch>.i``) of a form."""
    head, rest = where.split(".", 1)
    if head == "runs":
        run: dict[str, Any] = data["runs"][int(rest)]
        return run
    batch, i = rest.rsplit(".", 1)
    run = data["exact"][batch][int(i)]
    return run

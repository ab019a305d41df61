"""One cache entry on disk, framed and checked: a header line, then the payload.

The header (one line of JSON) names the cache (``kind``), the entry's key, the stored format, and
the payload's length and sha256. :func:`read_entry` reads a file through memfit's one bounded
reader (:mod:`memfit.userfiles`: regular files only, size-capped, so a FIFO or a link to
``/dev/zero`` is refused at once, never waited on or read without end) and returns the payload
only where every one of them matches; anything else is :class:`CorruptEntry`, which the caches
treat as a miss. :func:`write_entry` writes atomically (a temporary file in the same folder, then
``os.replace``), as memfit's other writers do. Used by the derived forms
(:mod:`memfit.estimate.derived.cache`), their arrays (:mod:`memfit.estimate.derived.sidecar`)
and the trace engine's answers (:mod:`memfit.estimate.trace_cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from memfit.userfiles import UserFileError, read_bytes

#: The first bytes of every entry: a header line (JSON: this tag, the cache's kind, the key, the
#: format, the payload's length and sha256), then the payload (the record as compact JSON).
MAGIC = "memfit-cache"


class CorruptEntry(ValueError):
    """A cache file that is not the entry its name says: edited, truncated, foreign, of the
    wrong shape or not a regular file. Always a miss, never used."""


def frame(kind: str, key: str, fmt: int, payload: bytes) -> bytes:
    """An entry's bytes: the header line naming ``kind``, ``key``, ``fmt`` and the payload's
    length and sha256, then ``payload``."""
    header = {
        "magic": MAGIC,
        "kind": kind,
        "key": key,
        "format": fmt,
        "n_bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def unframe(data: bytes, *, kind: str, key: str, fmt: int) -> bytes | None:
    """The payload of an entry framed by :func:`frame`; None for an entry of another format
    (a stale one: a plain miss); :class:`CorruptEntry` naming what is wrong for anything else
    (no header, another key or kind, a length or sha256 that differs: edited or truncated)."""
    head, sep, payload = data.partition(b"\n")
    try:
        header = json.loads(head) if sep and len(head) < 4096 else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise CorruptEntry("not a memfit cache entry")
    if header.get("kind") != kind or header.get("key") != key:
        raise CorruptEntry("its header names another entry")
    if header.get("format") != fmt:
        return None
    if header.get("n_bytes") != len(payload):
        raise CorruptEntry(f"{len(payload)} bytes where its header says {header.get('n_bytes')}")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise CorruptEntry("its content does not match its sha256")
    return payload


def read_entry(path: Path, *, kind: str, key: str, fmt: int, max_bytes: int) -> bytes | None:
    """The verified payload of the entry at ``path``: None where there is none (or it is of
    another format); :class:`CorruptEntry` where the file is not a regular file, is over
    ``max_bytes``, or fails :func:`unframe`. Read through memfit's one bounded reader."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptEntry(exc.strerror or "unreadable") from None
    try:
        data = read_bytes(path, what="cache entry", max_bytes=max_bytes, timeout_s=30.0)
    except UserFileError as exc:
        raise CorruptEntry(_why(str(exc), str(path))) from None
    return unframe(data, kind=kind, key=key, fmt=fmt)


def _why(message: str, path: str) -> str:
    """A bounded reader's message without the path and the advice (the note names the entry)."""
    why = message.replace(f"cache entry {path!r} ", "").split(":")[0]
    return why.removeprefix("is ")


def write_entry(path: Path, payload: bytes, *, kind: str, key: str, fmt: int) -> bool:
    """Write ``payload`` framed (:func:`frame`) to ``path`` atomically (a temporary file in the
    same folder, then ``os.replace``); False where it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(frame(kind, key, fmt, payload))
        os.replace(tmp, path)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)

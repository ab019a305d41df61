"""Where derived forms are kept: one JSON file per model config, job variant and library versions.

``$MEMFIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/memfit``, else ``~/.cache/memfit``; forms under
``derived/``. The key hashes the config.json (canonical JSON), the workload with its batch size (the
form's variable) and its micro-batch count (not traced) left out, the versions of memfit, torch,
transformers and peft installed (read from package metadata: no import) and a fingerprint of
memfit's own source files (:func:`source_fingerprint`). A new version of any of them, or an edited
checkout, is a new key: the form follows the installed code and is derived again. A refusal is
cached too, so a job the form cannot model costs its three traces once.

**Checked, not trusted** (issue 33): each file is a header line naming the cache, the key, the
format and the payload's length and sha256, then the payload (:func:`frame`); it is read through
memfit's one bounded reader (:mod:`memfit.userfiles`: regular files only, size-capped, so a FIFO
or a link to ``/dev/zero`` is refused at once) and used only where all of these match. Anything
else at an entry's name (an edited number, a truncated file, a record of the wrong shape, a
foreign file) is a miss: rebuilt, the file replaced, and one note on the answer
(:data:`CORRUPT_NOTE`). The hash detects damage, not a forger who rewrites the hash too: the
folder is the user's own. Writes are atomic (a temporary file in the folder, then
``os.replace``). Beside each form, its large integer lists as arrays
(:mod:`memfit.estimate.derived.sidecar`, ``{key}.arrays.npz``, checked against the JSON file):
loading reads them instead of the JSON, a few milliseconds rather than tens.

The same rules keep the trace engine's answers (:mod:`memfit.estimate.trace_cache`, under
``trace/``). One switch turns both off: ``--no-cache`` on the command line (:func:`disabled`), or
``MEMFIT_NO_CACHE=1`` in the environment; nothing is then read or written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from memfit import userfiles
from memfit.estimate.derived import sidecar
from memfit.estimate.derived.entry import CorruptEntry, read_entry, write_entry
from memfit.estimate.sharding import traced_step_workload
from memfit.spec import WorkloadSpec
from memfit.version import __version__

#: Bumped when the stored layout or the replay changes: older files are then ignored.
#: 2: generation traces pass generate()'s (B, S) position_ids (batch-sized rotary tables).
#: 3: runs of frees in canonical order at record time, MoE/MLA/alternating stacks grown (jobs
#: refused before, such as bf16-mixed + full checkpointing, are derived again).
#: 4: multi-GPU / offload / tensor-parallel jobs recorded from rank 0's rewritten timeline
#: (``order``, ``fixed``; several phase marks may share an instant).
#: 5: a batch size the trace cannot run (ResNet training at batch 1) kept as its error, the rest
#: solved (refused before).
#: 6: CUDA reduction staging recorded as the reductions' arguments (``stage``), sized at the
#: estimate's batch size and GPU (derived/staging.py), not as sizes a0 + a1 * batch.
FORMAT = 6
#: The libraries whose versions are part of the key.
VERSIONED = ("torch", "transformers", "peft")


_OFF: ContextVar[bool] = ContextVar("memfit_no_cache", default=False)


def enabled() -> bool:
    """Whether the disk caches are read and written (not under :func:`disabled`, nor with
    ``MEMFIT_NO_CACHE`` set to anything but empty or ``0``)."""
    return not _OFF.get() and os.environ.get("MEMFIT_NO_CACHE", "") in ("", "0")


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Neither read nor write a disk cache inside the block (what ``--no-cache`` sets)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def cache_dir(kind: str = "derived") -> Path:
    """The directory of one cache, ``kind`` "derived" (forms) or "trace" (created on store)."""
    root = os.environ.get("MEMFIT_CACHE_DIR")
    if root:
        return Path(root) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "memfit" / kind


def versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """memfit's and the traced libraries' installed versions ("not installed" where absent);
    ``extra``: more packages whose versions a key depends on."""
    return dict(_versions(extra))


@functools.cache
def _versions(extra: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    # read once per process: a search asks for a key per estimate, and package metadata is slow
    out = {"memfit": __version__}
    for pkg in (*VERSIONED, *extra):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return tuple(out.items())


@functools.cache
def source_fingerprint() -> str:
    """A hash of memfit's installed Python files (relative path, size, modification time):
    an edited checkout, an upgrade or a reinstall changes it (about 20 ms, once per process).
    Part of both caches' keys, so a change to the code a form or a trace answer came from
    never reads an old one (``FORMAT`` is still bumped for a change of the stored layout)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            st = os.stat(path)
            h.update(f"{os.path.relpath(path, root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def variant_key(config: dict[str, Any], workload: WorkloadSpec) -> str:
    """The form's key: config, the workload but its batch size and its micro-batch count, the
    library versions. ``grad_accum`` is left out exactly: a trace runs one micro-batch and never
    reads it (the gradients earlier micro-batches leave are ``zero_grad_set_to_none=False``,
    which the key keeps), and the notes it adds are the workload's, added at each estimate, not
    stored in the form; so a plan's splits of one stack (mb 8 x 4, mb 4 x 8, ...) share one
    form."""
    # a ZeRO job's adamw-fused is traced as adamw (sharding.traced_step_workload): one form
    variant = dataclasses.replace(traced_step_workload(workload), batch_size=1, grad_accum=1)
    text = json.dumps(
        {
            "format": FORMAT,
            "config": config,
            "workload": repr(variant),
            "versions": versions(),
            "memfit_source": source_fingerprint(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: The most a form's file may hold (read through :mod:`memfit.userfiles`, size-capped); a
#: larger form is not kept (it would be rebuilt on every read).
MAX_ENTRY_BYTES = 256 * 1024 * 1024
#: What a corrupt entry adds to the answer's notes.
CORRUPT_NOTE = "cache entry {name} was corrupt ({why}): rebuilt"


def note_corrupt(problems: list[str] | None, name: str, why: str) -> None:
    """Add the corrupt-entry note for ``name`` to ``problems`` (once)."""
    note = CORRUPT_NOTE.format(name=name, why=why)
    if problems is not None and note not in problems:
        problems.append(note)


def load(
    key: str, *, kind: str = "derived", fmt: int = FORMAT, problems: list[str] | None = None
) -> dict[str, Any] | None:
    """The stored form (or refusal) of ``key``, None if absent, of another format ``fmt``, not
    a verified entry, or with the caches off. ``kind``: which cache (:func:`cache_dir`). A file
    that is there but is not the entry (edited, truncated, foreign, of the wrong shape, not a
    regular file) is a miss too, and adds :data:`CORRUPT_NOTE` to ``problems``: the caller
    rebuilds it, and its :func:`store` replaces the file."""
    if not enabled():
        return None
    path = cache_dir(kind) / f"{key}.json"
    name = f"{kind}/{path.name}"
    if kind == "derived":  # the form's arrays beside it, where they match it
        try:
            got = sidecar.read(path, key, fmt)
        except CorruptEntry as exc:
            note_corrupt(problems, f"{kind}/{sidecar.path_for(path).name}", str(exc))
            got = None
        if got is not None:
            return got
    try:
        payload = read_entry(path, kind=kind, key=key, fmt=fmt, max_bytes=MAX_ENTRY_BYTES)
        if payload is None:
            return None
        data = userfiles.parse_json(payload.decode("utf-8"), what="cache entry", source=name)
    except CorruptEntry as exc:
        note_corrupt(problems, name, str(exc))
        return None
    except (UnicodeDecodeError, userfiles.UserFileError):
        note_corrupt(problems, name, "not JSON")
        return None
    if not isinstance(data, dict) or data.get("format") != fmt or data.get("key") != key:
        note_corrupt(problems, name, "a record of the wrong shape")
        return None
    if kind == "derived":
        sidecar.write(path, data)
    return data


def store(key: str, data: dict[str, Any], *, kind: str = "derived", fmt: int = FORMAT) -> None:
    """Write ``data`` under ``key`` atomically, framed with its key and sha256 (:func:`frame`);
    a cache that cannot be written is skipped, a record over :data:`MAX_ENTRY_BYTES` is not
    kept, and nothing is written with the caches off."""
    if not enabled():
        return
    path = cache_dir(kind) / f"{key}.json"
    record = {**data, "format": fmt, "key": key}
    # one string by the C encoder: json.dump streams through the Python one (5x slower on a
    # form; the same text)
    payload = json.dumps(record, separators=(",", ":")).encode()
    if len(payload) > MAX_ENTRY_BYTES:
        return
    if write_entry(path, payload, kind=kind, key=key, fmt=fmt) and kind == "derived":
        sidecar.write(path, record)

"""The run log: JSON Lines, one record per line, each written whole by one ``write`` (a crash loses
nothing that was written; there is no buffer to lose).

Every record has ``"type"`` and ``"time"`` (unix seconds). :data:`RECORD_FIELDS` (schema.py) is the
schema, the one docs/monitoring.md documents. :class:`RunLog` writes it; :func:`read_log`
(reader.py) is the one reader, streamed.

**One writer per file** (docs/decisions.md "Run logs from several processes"): under torchrun /
``torch.distributed`` launchers (``RANK`` or ``LOCAL_RANK`` set, a world of more than one)
``run.jsonl`` becomes ``run.rank1.jsonl`` for rank 1 (:func:`rank_log_path`); a writer claims its
file with an advisory lock (``fcntl.flock``) and, within one process, in a table of the paths
its writers hold (so the rule holds where the file system has no locks). A second writer that
finds the file claimed (two monitors on one path, in one process or two) writes the first free of
``run.1.jsonl``, ``run.2.jsonl``, ... instead (as ranks get their own file), with one warning,
rather than truncating or interleaving the first one's records. Appenders
(``oom_guard(log=...)``) append whole lines with ``O_APPEND``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memfit.monitor.schema import RECORD_FIELDS, record
from memfit.userfiles import UserFileError
from memfit.userwrites import check_output

logger = logging.getLogger("memfit.monitor")

__all__ = ["RECORD_FIELDS", "RunData", "RunLog", "rank_log_path", "read_log", "record"]

#: Integers beyond this are written as null: no reader can take them as memory or counts.
MAX_INT = 2**63 - 1


def _rank(env: Mapping[str, str]) -> str | None:
    """This process's rank when a launcher started several (torchrun sets RANK, WORLD_SIZE)."""
    rank = env.get("RANK") or env.get("LOCAL_RANK")
    if rank is None or not rank.strip().isdigit():
        return None
    world = env.get("WORLD_SIZE") or env.get("LOCAL_WORLD_SIZE")
    if world is not None and world.strip().isdigit() and int(world) <= 1:
        return None
    return str(int(rank))


def rank_log_path(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Path:
    """``run.jsonl`` → ``run.rank1.jsonl`` in rank 1 of a multi-process launch, else unchanged."""
    p = Path(path)
    rank = _rank(os.environ if env is None else env)
    if rank is None or p.name.startswith(("/dev/", "-")) or not p.name:
        return p
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


#: The files this process's writers hold (real paths), beside the advisory locks.
_HELD: set[str] = set()
_HELD_LOCK = threading.Lock()
#: Writers on one path that get their own file before the next one is refused (OSError).
MAX_SIBLINGS = 1000


def sibling_path(p: Path, n: int) -> Path:
    """The ``n``-th writer's file beside ``p``: ``run.jsonl`` -> ``run.1.jsonl`` (0: ``p``)."""
    return p if n == 0 else p.with_name(f"{p.stem}.{n}{p.suffix}")


def _claim_first_free(p: Path) -> tuple[int, Path, str | None]:
    """Open and claim ``p`` or its first free sibling: (fd, path, key held in :data:`_HELD`)."""
    for n in range(MAX_SIBLINGS):
        path = sibling_path(p, n)
        key = os.path.realpath(path)
        with _HELD_LOCK:
            if key in _HELD:
                continue
            fd = _open_fd(path)
            claimed = _claim(fd)
            if claimed and _is_regular(fd):
                _HELD.add(key)
                return fd, path, key
        if claimed:  # a device or a FIFO: nothing to claim
            return fd, path, None
        os.close(fd)
    raise OSError(f"{MAX_SIBLINGS} writers already hold {p} and its siblings")


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _open_fd(p: Path) -> int:
    """Open the run log for appending; an OSError (the monitor warns and runs without a log) for
    a FIFO, device, socket or kernel file: opening a FIFO would block the user's script before
    its loop, and none of them is a log (userwrites.check_output, as every output flag)."""
    try:
        check_output(p, what="run log")
    except UserFileError as exc:
        raise OSError(str(exc)) from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(p, flags, 0o644)  # O_NONBLOCK: a FIFO made since the check fails, never blocks
    if not _is_regular(fd):
        os.close(fd)
        raise OSError(f"run log {str(p)!r} is not a regular file: memfit writes only regular files")
    os.set_blocking(fd, True)
    return fd


def _claim(fd: int) -> bool:
    """An exclusive advisory lock on a regular file; True when this writer holds it (or the file
    system has no locks). Not a regular file (``/dev/null``, a FIFO): nothing to claim."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return True
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer per rank still holds
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without flock (some NFS): write without the claim
        return True
    return True


class RunLog:
    """Write records to ``path``, one whole line per ``write`` call; thread-safe.

    ``mode="w"``: claim the file (see the module docstring) and start it empty; ``"a"``: append.
    ``fsync``: also ask the OS to put each line on disk (survives a machine crash, costs
    milliseconds per record on slow disks; a process crash loses nothing either way).
    Raises ``OSError`` when the file cannot be opened (the monitor turns that into a warning).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False, mode: str = "w"):
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._held: str | None = None
        if mode != "w":
            fd = _open_fd(self.path)
        else:
            fd, path, self._held = _claim_first_free(self.path)
            if path != self.path:
                logger.warning(
                    "memfit monitor: %s is being written by another monitor; writing %s instead",
                    self.path,
                    path,
                )
                self.path = path
            with contextlib.suppress(OSError):  # a device or FIFO: nothing to truncate
                os.ftruncate(fd, 0)
        self._fd: int | None = fd

    def write(self, rec: dict[str, Any]) -> None:
        data = encode(rec)
        with self._lock:
            if self._fd is None:
                return
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.close(fd)  # closing releases the claim
                finally:
                    if self._held is not None:
                        with _HELD_LOCK:
                            _HELD.discard(self._held)
                        self._held = None

    @property
    def closed(self) -> bool:
        return self._fd is None


def encode(rec: dict[str, Any]) -> bytes:
    """One JSON line; non-finite floats and integers beyond int64 become null (strict JSON)."""
    return (json.dumps(_plain(rec), separators=(",", ":"), allow_nan=False) + "\n").encode()


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars that slipped into a record
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


from memfit.monitor.reader import RunData, read_log  # noqa: E402 (re-exported; reader needs no log)

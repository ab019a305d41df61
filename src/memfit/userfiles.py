"""The one bounded reader of user files: configs, run logs, snapshots, saved estimates, price files.

Every file a user names goes through here, so that no path can exhaust the machine or hang it:

- **regular files only**: the file is opened non-blocking (a FIFO cannot hang the ``open``) and
  ``fstat``-ed *after* opening (a symlink to ``/dev/zero`` is seen as the device it points at);
  directories, devices, FIFOs and sockets are refused;
- **a size cap checked while reading**, not from ``st_size`` (0 for devices, stale for growing
  files): at most ``max_bytes`` are ever read, one chunk at a time;
- **a time bound** between chunks (slow network file systems);
- **streaming** for logs: :func:`iter_lines` yields one line at a time with a per-line cap, so a
  200 MB log costs one line of memory.

Failures raise :class:`UserFileError` (a :class:`~memfit.errors.MemfitError`: exit 2 in the CLI)
naming the file, what it was read as, what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from memfit.errors import MemfitError

MiB = 1024 * 1024
#: Caps by kind of file (callers may pass their own).
CONFIG_MAX_BYTES = 16 * MiB  # a config.json, model_index.json, YAML, price file
JSON_MAX_BYTES = 64 * MiB  # a saved estimate / plan
SNAPSHOT_MAX_BYTES = 4096 * MiB  # a CUDA memory snapshot pickle (streamed by its reader)
LOG_LINE_MAX_BYTES = 4 * MiB  # one JSON line of a run log
DEFAULT_TIMEOUT_S = 120.0
CHUNK_BYTES = 1 * MiB


class UserFileError(MemfitError):
    """A user file that is missing, not a regular file, too large, too slow, or undecodable."""


def describe_mode(mode: int) -> str:
    """What a file that is not a regular file is ("a FIFO (named pipe)"…), from its st_mode."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


#: Kernel pseudo-filesystems: their "regular" files can block or never end (devices under
#: /dev are refused by their type, named).
PSEUDO_ROOTS = ("/proc/", "/sys/")


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike[str], *, what: str, kernel_file: bool = False
) -> Iterator[IO[bytes]]:
    """Open ``path`` for binary reading if (after following links) it is a regular file, and
    not a kernel pseudo-file (/proc, /sys: ``/proc/kmsg`` reads as a regular file and
    blocks until the kernel logs)."""
    p = Path(path)
    real = os.path.realpath(p)
    if real.startswith(PSEUDO_ROOTS) and not kernel_file:
        raise UserFileError(
            f"{what} {str(p)!r} is a kernel pseudo-file ({real}): memfit reads only regular "
            "files (copy the content to a file)"
        )
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserFileError(f"{what} {str(p)!r} does not exist: check the path") from None
    except IsADirectoryError:
        raise UserFileError(f"{what} {str(p)!r} is a directory, not a file") from None
    except OSError as exc:
        raise UserFileError(f"{what} {str(p)!r} cannot be opened: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserFileError(
                f"{what} {str(p)!r} is {describe_mode(mode)}: memfit reads only regular files "
                "(copy the content to a file)"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def _too_large(path: Path, what: str, max_bytes: int) -> UserFileError:
    return UserFileError(
        f"{what} {str(path)!r} is larger than {max_bytes:,} bytes, the most memfit reads for "
        "this kind of file: is it the right file?"
    )


def read_bytes(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = CONFIG_MAX_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kernel_file: bool = False,
) -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` bytes (``kernel_file``: a
    /proc file memfit names itself, see :func:`open_regular`)."""
    p = Path(path)
    deadline = time.monotonic() + timeout_s
    parts: list[bytes] = []
    total = 0
    with open_regular(p, what=what, kernel_file=kernel_file) as f:
        while True:
            chunk = f.read(min(CHUNK_BYTES, max_bytes + 1 - total))
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise _too_large(p, what, max_bytes)
            if time.monotonic() > deadline:
                raise UserFileError(
                    f"reading {what} {str(p)!r} took over {timeout_s:.0f} s: "
                    "copy it to a local disk"
                )
    return b"".join(parts)


def read_text(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = CONFIG_MAX_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kernel_file: bool = False,
) -> str:
    """The content of a UTF-8 text file (BOM tolerated)."""
    data = read_bytes(
        path, what=what, max_bytes=max_bytes, timeout_s=timeout_s, kernel_file=kernel_file
    )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserFileError(
            f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start}): is it the right file?"
        ) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str, *, what: str, source: str) -> Any:
    """Strict JSON (no NaN / Infinity, bounded nesting), errors naming ``source``."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise UserFileError(f"{what} {source!r} is nested too deeply to be a real file") from None
    except ValueError as exc:
        raise UserFileError(f"{what} {source!r} is not valid JSON: {exc}") from None


def read_json(path: str | os.PathLike[str], *, what: str, max_bytes: int = CONFIG_MAX_BYTES) -> Any:
    """A JSON file, parsed strictly (see :func:`parse_json`)."""
    return parse_json(read_text(path, what=what, max_bytes=max_bytes), what=what, source=str(path))


def iter_lines(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_line_bytes: int = LOG_LINE_MAX_BYTES,
    max_bytes: int | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(line_number, line)`` for each line (without its newline), streamed. A line longer than
    ``max_line_bytes`` raises; ``max_bytes`` (default unbounded) caps the whole file."""
    p = Path(path)
    total = 0
    with open_regular(p, what=what) as raw:
        f = os.fdopen(os.dup(raw.fileno()), "rb", buffering=CHUNK_BYTES)
        with f:
            number = 0
            while True:
                line = f.readline(max_line_bytes + 1)
                if not line:
                    return
                number += 1
                total += len(line)
                if max_bytes is not None and total > max_bytes:
                    raise _too_large(p, what, max_bytes)
                if len(line) > max_line_bytes and not line.endswith(b"\n"):
                    raise UserFileError(
                        f"{what} {str(p)!r} line {number} is longer than {max_line_bytes:,} bytes: "
                        "is it the right file?"
                    )
                yield number, line.rstrip(b"\r\n")


class HeadReader:
    """The first bytes of a regular file, read on demand (a file format's header: a GGUF file's
    metadata and tensor table, never its tensor data). Every :meth:`read` counts against
    ``max_bytes`` and the deadline; a file that ends early raises (a truncated header)."""

    def __init__(self, handle: IO[bytes], path: Path, *, what: str, max_bytes: int,
                 timeout_s: float) -> None:  # fmt: skip
        self._f = handle
        self._path = path
        self._what = what
        self._max_bytes = max_bytes
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._buf = b""
        self._pos = 0
        self.offset = 0  # bytes consumed so far

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes (raises when the file or the cap ends first)."""
        if self.offset + n > self._max_bytes:
            raise UserFileError(
                f"{self._what} {str(self._path)!r}: its header runs past {self._max_bytes:,} "
                "bytes, more than any real file's: is it the right file?"
            )
        while len(self._buf) - self._pos < n:
            chunk = self._f.read(max(CHUNK_BYTES, n))
            if not chunk:
                raise UserFileError(
                    f"{self._what} {str(self._path)!r} ends inside its header (at byte "
                    f"{self.offset + len(self._buf) - self._pos:,}): a truncated or partial "
                    "download?"
                )
            self._buf, self._pos = self._buf[self._pos :] + chunk, 0
            if time.monotonic() > self._deadline:
                raise UserFileError(
                    f"reading {self._what} {str(self._path)!r} took over "
                    f"{self._timeout_s:.0f} s: copy it to a local disk"
                )
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        self.offset += n
        return out


@contextlib.contextmanager
def read_head(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int = JSON_MAX_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Iterator[HeadReader]:
    """A :class:`HeadReader` on a regular file (see :func:`open_regular`): the bounded way to
    read a binary header whose length is known only while reading it."""
    p = Path(path)
    with open_regular(p, what=what) as handle:
        yield HeadReader(handle, p, what=what, max_bytes=max_bytes, timeout_s=timeout_s)

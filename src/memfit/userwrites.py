"""The one writer of user-named files: ``check --write`` edits, ``--html`` / ``--png`` / ``-o``
outputs. A write either completes or leaves every file as it was:

- **atomic replace**: the new content goes to a temp file in the same folder
  (``.NAME.memfit-tmp.PID.RANDOM``), is flushed and ``fsync``-ed, then ``os.replace``-d over the
  file. A kill, a full disk or a file-size limit at any point leaves the file as it was (at
  worst a stray temp file beside it); never a truncated file;
- **the original kept** (``backup=True``, used by ``check --write``): before the first replace,
  the file's bytes are copied (atomically, through a temp) to ``NAME.memfit-orig``. An existing
  backup is never overwritten: if it holds other bytes, ``NAME.memfit-orig.1``, ``.2``… is used;
- **mode and owner kept**: the new file gets the old one's permission bits (and owner and group
  where the process may set them); a new file gets ``0666`` less the umask, as ``open`` would;
- **symlinks written through**: the file a link points at is replaced; the link stays a link.
  (A second *hard* link keeps the old content, as with every editor that saves by rename);
- **regular files only**, checked before anything is written: FIFOs, devices, sockets,
  directories and anything under ``/proc``, ``/sys`` or ``/dev`` are refused, and so is a
  read-only file (its write permission bits all clear, or not writable by this user);
- **several files, all or nothing**: every temp (and backup) is written first, then the files
  are replaced one after the other; if one replace fails, those already replaced are put back.
  Only a kill *between* two renames (microseconds, after every byte is on disk) can leave some
  files new and some old; the backups then hold the originals;
- **failures are one line**: an ``OSError`` (ENOSPC, EFBIG from ``ulimit -f`` — SIGXFSZ is
  ignored during the write so the limit is an error, not a kill — EROFS, EACCES…) becomes a
  :class:`~memfit.userfiles.UserFileError` (exit 2) naming the file, the reason and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memfit.userfiles import JSON_MAX_BYTES, UserFileError, describe_mode, read_bytes

BACKUP_SUFFIX = ".memfit-orig"
#: Numbered backups tried (``NAME.memfit-orig.1`` …) before asking the user to tidy up.
MAX_BACKUPS = 100
#: Kernel file systems: their "regular" files are not files (``/proc/kmsg`` blocks).
VIRTUAL_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
BOM = b"\xef\xbb\xbf"

#: What to do, by errno, when a write fails.
HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run again",
    errno.EDQUOT: "the disk quota is exhausted: free some space and run again",
    errno.EFBIG: "the file-size limit (ulimit -f) is below the new file's size: raise it",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "no permission to write the folder (memfit writes a temp file beside the "
    "file, then renames it): check the folder's permissions",
    errno.EPERM: "the operation is not permitted here: check the folder's permissions",
    errno.ENOENT: "the folder does not exist: create it first",
    errno.ENOTDIR: "a part of the path is not a folder: check the path",
}


@dataclass(frozen=True, kw_only=True)
class Written:
    """One file written: where (after links), and the backup of its original (None: none)."""

    path: str
    backup: str | None


@dataclass
class _Pending:
    asked: str  # the path as the user named it
    real: Path  # after symlinks
    st: os.stat_result | None  # None: a new file
    data: bytes
    original: bytes | None = None
    tmp: Path | None = None
    backup_tmp: Path | None = None
    backup: Path | None = None
    replaced: bool = False


#: File suffixes and the format they name: an output flag refuses a suffix naming another format
#: (``--png x.html``); a suffix not listed here (or none) is taken as the user wrote it.
FORMAT_OF_SUFFIX = {
    ".html": "HTML",
    ".htm": "HTML",
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".svg": "SVG",
    ".pdf": "PDF",
    ".json": "JSON",
    ".jsonl": "JSON Lines",
    ".md": "Markdown",
    ".pickle": "pickle",
    ".pkl": "pickle",
    ".csv": "CSV",
    ".yaml": "YAML",
    ".yml": "YAML",
}


def check_output(path: str | os.PathLike[str], *, what: str, fmt: str | None = None) -> None:
    """Before any work: a UserFileError (exit 2) if ``path`` could not be written by
    :func:`write_files` (a FIFO, device, socket, folder, kernel file or read-only file), or if
    its suffix names a format other than ``fmt`` (``--png x.html``). Writes nothing."""
    _check(path, b"", what=what)
    suffix = Path(path).suffix.lower()
    named = FORMAT_OF_SUFFIX.get(suffix)
    if fmt is not None and named is not None and named != fmt:
        wanted = next((k for k, v in FORMAT_OF_SUFFIX.items() if v == fmt), "")
        raise UserFileError(
            f"{what} {str(path)!r} ends in {suffix} ({named}), but memfit writes {fmt} there: "
            f"name a file ending in {wanted or 'another suffix'}"
        )


def write_text(path: str | os.PathLike[str], text: str, *, what: str) -> Written:
    """Write one output file (``--html``, ``-o``…) atomically, without a backup."""
    return write_files([(path, text)], what=what)[0]


def write_files(
    contents: Sequence[tuple[str | os.PathLike[str], str | bytes]],
    *,
    what: str,
    backup: bool = False,
    expected: Sequence[str | None] | None = None,
) -> list[Written]:
    """Replace each ``(path, content)`` all or nothing (see the module docstring).
    ``backup``: keep each existing file's original as ``NAME.memfit-orig``; ``expected``: the
    text each file held when memfit read it — a file changed since is refused (not overwritten)."""
    pending = [_check(path, data, what=what) for path, data in contents]
    seen: set[Path] = set()
    for p in pending:
        if p.real in seen:
            raise UserFileError(
                f"{what} {p.asked!r} is named twice (or through a link): name it once"
            )
        seen.add(p.real)
    with _sigxfsz_ignored():
        try:
            for i, p in enumerate(pending):
                old = expected[i] if expected else None
                keep = backup or old is not None or len(pending) > 1  # to restore on failure
                _prepare(p, what=what, backup=backup, keep=keep, expected=old)
            for p in pending:
                _place_backup(p, what=what)
            for p in pending:
                _replace(p, what=what, pending=pending)
        finally:
            for p in pending:
                for tmp in (p.tmp, p.backup_tmp):
                    if tmp is not None:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp)
    for folder in {p.real.parent for p in pending}:
        _fsync_dir(folder)
    return [Written(path=str(p.real), backup=str(p.backup) if p.backup else None) for p in pending]


def _check(path: str | os.PathLike[str], data: str | bytes, *, what: str) -> _Pending:
    asked = str(path)
    real = Path(os.path.realpath(path))  # links written through
    named = Path(os.path.abspath(path))  # /dev/stdout resolves to wherever stdout goes
    if any(p == root or root in p.parents for root in VIRTUAL_ROOTS for p in (named, real)):
        raise UserFileError(
            f"{what} {asked!r} is a kernel or device file ({real}): memfit writes only regular "
            "files — name a file path"
        )
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _failed(asked, what, exc) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserFileError(
            f"{what} {asked!r} is {describe_mode(st.st_mode)}: memfit writes only regular files — "
            "name a file path"
        )
    if st is not None and (not st.st_mode & 0o222 or not os.access(real, os.W_OK)):
        raise UserFileError(
            f"{what} {asked!r} is read-only (mode {stat.S_IMODE(st.st_mode):04o}): make it "
            "writable (chmod u+w) to let memfit change it; nothing was written"
        )
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    return _Pending(asked=asked, real=real, st=st, data=raw)


def _prepare(p: _Pending, *, what: str, backup: bool, keep: bool, expected: str | None) -> None:
    """Read the original (``keep``: for the backup, an undo and the changed-since check), write
    the temps."""
    if p.st is not None and keep:
        p.original = read_bytes(p.real, what=what, max_bytes=JSON_MAX_BYTES)
        if expected is not None and p.original.decode("utf-8-sig", "replace") != expected:
            raise UserFileError(
                f"{what} {p.asked!r} changed since memfit read it: run the command again; "
                "nothing was written"
            )
        if p.original.startswith(BOM) and not p.data.startswith(BOM):
            p.data = BOM + p.data
    try:
        p.tmp = _write_temp(p.real, p.data, p.st)
        if backup and p.original is not None:
            p.backup_tmp = _write_temp(p.real, p.original, p.st)
    except OSError as exc:
        raise _failed(p.asked, what, exc) from None


def _write_temp(real: Path, data: bytes, st: os.stat_result | None) -> Path:
    """A fully written, fsync-ed temp file beside ``real`` with ``st``'s mode and owner."""
    import secrets  # ~0.02 s of imports (hmac, hashlib): paid by a command that writes a file

    tmp = real.parent / f".{real.name}.memfit-tmp.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, st.st_uid, st.st_gid)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _place_backup(p: _Pending, *, what: str) -> None:
    """Link the backup temp to ``NAME.memfit-orig`` (or the first free numbered name); an
    existing backup holding the same bytes is kept as it is."""
    if p.backup_tmp is None or p.original is None:
        return
    for n in range(MAX_BACKUPS):
        name = p.real.with_name(p.real.name + BACKUP_SUFFIX + (f".{n}" if n else ""))
        try:
            os.link(p.backup_tmp, name)  # never replaces an existing file
        except FileExistsError:
            with contextlib.suppress(UserFileError):
                if read_bytes(name, what="backup", max_bytes=JSON_MAX_BYTES) == p.original:
                    p.backup = name
                    return
            continue
        except OSError as exc:
            raise _failed(p.asked, what, exc) from None
        p.backup = name
        return
    raise UserFileError(
        f"{what} {p.asked!r} has {MAX_BACKUPS} backups ({p.real.name}{BACKUP_SUFFIX}.*): remove "
        "the old ones; nothing was written"
    )


def _replace(p: _Pending, *, what: str, pending: list[_Pending]) -> None:
    assert p.tmp is not None  # written by _prepare
    try:
        os.replace(p.tmp, p.real)
    except OSError as exc:
        undone = _undo(pending)
        raise _failed(p.asked, what, exc, undone=undone) from None
    p.tmp = None
    p.replaced = True


def _undo(pending: list[_Pending]) -> bool:
    """Put back the files already replaced; False if one could not be."""
    ok = True
    for q in pending:
        if not q.replaced:
            continue
        try:
            if q.st is None:
                os.unlink(q.real)
            elif q.original is None:
                ok = False
                continue
            else:
                os.replace(_write_temp(q.real, q.original, q.st), q.real)
            q.replaced = False
        except OSError:
            ok = False
    return ok


def _failed(asked: str, what: str, exc: OSError, *, undone: bool = True) -> UserFileError:
    reason = exc.strerror or str(exc)
    hint = HINTS.get(exc.errno or 0, "check the path and the disk")
    state = (
        "nothing was changed"
        if undone
        else "some files were changed: their backups " + (f"({BACKUP_SUFFIX}) hold the originals")
    )
    return UserFileError(f"cannot write {what} {asked!r}: {reason} — {hint}; {state}")


@contextlib.contextmanager
def _sigxfsz_ignored() -> Iterator[None]:
    """With SIGXFSZ ignored, a write past ``ulimit -f`` fails with EFBIG instead of killing."""
    sig = getattr(signal, "SIGXFSZ", None)
    if sig is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(sig, old)


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

"""Where the compiled allocator kernel's machine code may be kept: a folder only memfit writes.

numba's on-disk cache is pickle (``numba.core.caching``: the index file is ``pickle.loads``-ed),
so whoever can write the folder it reads can run code in memfit's process (issue 33: a planted
index file ran code, even with ``--no-cache``). numba's own places are not used
(``NUMBA_CACHE_DIR``, ``~/.cache/numba``, memfit's answers folder); the kernel's cache is one of
these folders, the first that passes :func:`problem`:

1. ``__pycache__/numba-kernel`` next to this file: as trusted as memfit's code itself (whoever can
   write it can edit memfit);
2. ``numba-kernel`` in memfit's cache directory (:func:`memfit.estimate.derived.cache.cache_dir`).

memfit creates the folder with mode 0700 and, before numba may read it, checks that it is a real
directory (not a link) owned by this user with no access for group or others, that every entry
in it belongs to this user and is a plain file or folder (no links, FIFOs or devices), and that
no folder above it can be written by another user (unless sticky, as ``/tmp``). Where none
passes, the kernel is not loaded and the Python replay runs (the same bytes; the reason is in
:func:`memfit.estimate.allocator.jit.describe`). A folder that fails is never "fixed" (no chmod,
no delete): another user's files are not memfit's to touch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The name of the kernel's cache folder (new in the fix of issue 33: a folder an older memfit
#: or numba itself made, with the process's umask, is never reused).
FOLDER_NAME = "numba-kernel"
#: The most entries a cache folder may hold before it is refused (the kernel writes ~10 files).
MAX_ENTRIES = 10_000
#: Group / other permission bits: none allowed on the folder itself.
_NOT_PRIVATE = 0o077


def candidates() -> list[Path]:
    """The folders tried, in order (see the module docstring)."""
    from memfit.estimate.derived.cache import cache_dir  # derived imports the allocator

    return [Path(__file__).resolve().parent / "__pycache__" / FOLDER_NAME, cache_dir(FOLDER_NAME)]


def folder() -> tuple[Path | None, str]:
    """The first candidate that passes :func:`problem` (created if absent), and ``""``; or
    None and why none does."""
    reasons = []
    for path in candidates():
        why = problem(path)
        if why is None:
            return path, ""
        reasons.append(f"{path} {why}")
    return None, "no private folder for numba's machine code: " + "; ".join(reasons)


def problem(path: Path) -> str | None:
    """Why numba must not read ``path`` as the kernel's cache (created with mode 0700 if
    absent), or None where it may."""
    path = path.parent.resolve() / path.name  # the folder itself is not followed if a link
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot be created ({exc.strerror})"
    me = os.geteuid()
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder (a link or a file)"
    if st.st_uid != me:
        return f"belongs to user {st.st_uid}, not to this user ({me})"
    if st.st_mode & _NOT_PRIVATE:
        return f"has mode {st.st_mode & 0o777:o}: only its owner may have access (700)"
    return _parents_problem(path, me) or _entries_problem(path, me)


def _parents_problem(path: Path, me: int) -> str | None:
    """Why a folder above ``path`` lets another user replace it, or None."""
    for parent in path.parents:
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"has a parent {parent} that cannot be read ({exc.strerror})"
        if st.st_uid not in (me, 0):
            return f"has a parent {parent} that belongs to user {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"has a parent {parent} that others can write (mode {st.st_mode & 0o777:o})"
    return None


def _entries_problem(path: Path, me: int) -> str | None:
    """Why an entry inside ``path`` may not be numba's (another owner, a link, a FIFO...)."""
    n = 0
    for here, dirs, files in os.walk(path):  # links are not followed
        for name in (*dirs, *files):
            n += 1
            if n > MAX_ENTRIES:
                return f"holds over {MAX_ENTRIES} entries"
            st = os.lstat(os.path.join(here, name))
            if st.st_uid != me:
                return f"holds {name!r}, which belongs to user {st.st_uid}"
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                return f"holds {name!r}, which is not a plain file or folder"
    return None

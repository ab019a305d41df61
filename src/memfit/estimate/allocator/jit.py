"""The default-configuration caching-allocator replay of
:mod:`memfit.estimate.allocator.fast`, compiled with numba (the optional ``fast`` extra).

Same rules, same integers: one loop over the events with the blocks as rows of an int64 table
(address, size, previous / next block in the segment, allocated, pool; a row merged away is
reused) and each pool's free list as a sorted run of int64 keys packing (size, address), the
order of the Python replay's ``size << 64 | address`` keys, beside the blocks they name: best
fit is the first key not below ``(size, 0)``; an insert or a removal moves the shorter side of
the run by one, and a split's remainder (or a freed block merged with a free neighbour) takes
over the entry of the block it came from, moved only as far as its new key needs (most often
not at all). Both tables start small and grow when full (a table sized for every event
would cost more in page faults than the replay itself). Arithmetic is int64, exact because the
kernel stops (and the Python replay answers) when a request or the reserved bytes reach 1 TiB
(beyond any GPU, though a search may probe such sizes). Keys are dense (0..n_keys-1): the live
table is an array.

With a capacity (``replay_arrays(..., capacity_bytes=)``) the kernel follows
``CachingAllocatorSim(capacity_bytes=...)``: a new segment above the capacity is refused, the
whole free segments of both pools are given back and the segment asked for again, and a request
that still fails is an OOM (counted, not allocated; its key's free does nothing);
``tests/estimate/allocator/test_jit_capacity.py`` compares every field with the sim.

The kernel does not raise: on a malformed list (a key allocated twice, a free of a key that is
not live, a negative size) it returns a status, and the caller replays the events in Python,
which raises the error with its message. ``tests/estimate/allocator/test_jit.py`` compares
every field with the Python replay on random event lists and on derived forms.

numba is imported only when a replay is compiled or loaded (:func:`load_kernel`), never on
``import memfit``. The compiled machine code is cached on disk (numba's ``cache=True``) in a
folder only memfit writes, checked before numba reads it, as numba's cache is pickle
(:mod:`memfit.estimate.allocator.kernel_cache`); where no such folder passes, or with the disk
caches off (``--no-cache``), the Python replay runs (compiling costs ~17 s of CPU, more than a
process saves). ``MEMFIT_NO_JIT=1`` forces the Python replay.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memfit.estimate.allocator import kernel_cache
from memfit.estimate.allocator.caching import AllocatorResult

#: Environment switch: set to 1 (or any value but 0 / empty) to force the Python replay.
NO_JIT_ENV = "MEMFIT_NO_JIT"

_KERNEL: list[Any] = []  # [compiled function] once loaded; [None] when numba is unavailable
_EXPANDABLE: list[Any] = []  # [the expandable-segments replay], loaded with _KERNEL
_WHY = [""]  # why not, then


def jit_disabled() -> bool:
    """True when ``MEMFIT_NO_JIT`` asks for the Python replay."""
    return os.environ.get(NO_JIT_ENV, "").strip() not in ("", "0")


def kernel_loaded() -> bool:
    """Whether the compiled replay is loaded in this process (and not switched off)."""
    return bool(_KERNEL) and _KERNEL[0] is not None and not jit_disabled()


def describe() -> str:
    """Which replay runs here: "compiled (numba X)" or "python (why)"."""
    if jit_disabled():
        return f"python ({NO_JIT_ENV} is set)"
    if load_kernel(wait=False) is None:
        return f"python ({_WHY[0]})"
    import numba

    return f"compiled (numba {numba.__version__})"


def load_kernel(*, wait: bool = True) -> Any:
    """The compiled replay, or None without numba (or with ``MEMFIT_NO_JIT``). With the disk
    caches off (``--no-cache``, ``MEMFIT_NO_CACHE``) numba's on-disk machine code is not read
    either: the Python replay runs unless this process loaded the kernel already.

    ``wait`` False (every replay a command asks for): where the machine code of this kernel,
    numba and Python is not on disk yet (:func:`kernel_ready`), the kernel is compiled by a
    background process (:func:`warm_in_background`) and this process answers with the Python
    replay (the same bytes) instead of waiting ~12-17 s for the compile; a later process loads
    it. ``wait`` True compiles here (``python -m memfit.estimate.allocator.jit``, the tests)."""
    if jit_disabled():
        return None
    if not _KERNEL:
        if not _disk_cache_on():
            _WHY[0] = "--no-cache: numba's machine code on disk is not read"
            return None
        if not wait and not kernel_ready():  # checked again at each replay (one stat)
            if not _WARMING:
                _WARMING.append(warm_in_background())
            _WHY[0] = _WARMING[0]
            return None  # once the background compile is done, the next replay loads it
        _KERNEL.append(_compile())
        if _KERNEL[0] is not None:
            _mark_ready()
    return _KERNEL[0]


_WARMING: list[str] = []  # [why the Python replay answers] once a background compile is asked


#: The modules the compiled replays are made of (their machine code depends on them).
_KERNEL_FILES = ("kernel.py", "kernel_expandable.py")


def _stamp() -> str:
    """What the kernels' machine code depends on: :data:`_KERNEL_FILES` (size, mtime), numba,
    Python."""
    import importlib.metadata
    import platform

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        files = [os.stat(os.path.join(here, name)) for name in _KERNEL_FILES]
        numba_version = importlib.metadata.version("numba")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return ""
    text = "-".join(f"{st.st_size}-{st.st_mtime_ns}" for st in files)
    text = f"{text}-{numba_version}-{platform.python_version()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _marker(prefix: str) -> str | None:
    if not _FOLDER_STAMP:  # once per process: a replay may ask many times
        path, _why = kernel_cache.folder()
        _FOLDER_STAMP.append((path, _stamp()))
    path, stamp = _FOLDER_STAMP[0]
    return None if path is None or not stamp else str(path / f"{prefix}-{stamp}")


_FOLDER_STAMP: list[tuple[Path | None, str]] = []  # the kernel's folder and stamp, once known


def kernel_ready() -> bool:
    """Whether a process compiled this kernel (this kernel.py, numba and Python) into memfit's
    private folder: loading it then takes well under a second."""
    marker = _marker("ready")
    return marker is not None and os.path.isfile(marker)


def _mark_ready() -> None:
    marker = _marker("ready")
    if marker is not None:
        with contextlib.suppress(OSError), open(marker, "w", encoding="utf-8") as f:
            f.write("compiled\n")


#: A background compile younger than this (seconds) is not started again.
WARM_LOCK_S = 600


def warm_in_background() -> str:
    """Start ``python -m memfit.estimate.allocator.jit`` (compile the kernel into memfit's
    private folder) detached from this process, unless numba is missing or one started less
    than :data:`WARM_LOCK_S` ago; returns why the Python replay answers meanwhile."""
    import importlib.util
    import subprocess
    import time

    if importlib.util.find_spec("numba") is None:
        return "numba is not installed: pip install 'memfit[fast]'"
    lock = _marker("warming")
    if lock is None:
        return kernel_cache.folder()[1] or "no folder for numba's machine code"
    with contextlib.suppress(OSError):
        if time.time() - os.stat(lock).st_mtime < WARM_LOCK_S:
            return "the compiled replay is being compiled by a background process"
    with contextlib.suppress(OSError), open(lock, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    root = str(Path(__file__).resolve().parents[3])  # the folder memfit is imported from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        subprocess.Popen(
            [sys.executable, "-m", "memfit.estimate.allocator.jit"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return f"could not start the background compile ({exc.strerror})"
    return "the compiled replay is being compiled by a background process (first use)"


def _disk_cache_on() -> bool:
    from memfit.estimate.derived import cache  # derived imports this module

    return cache.enabled()


def replay_arrays(
    is_alloc: np.ndarray,
    keys: np.ndarray,
    n_bytes: np.ndarray,
    n_keys: int,
    *,
    capacity_bytes: int | None = None,
    expandable_segments: bool = False,
) -> AllocatorResult | None:
    """The replay of events given as arrays (``is_alloc``: malloc or free; ``keys`` dense in
    ``0..n_keys-1``; ``n_bytes``: the request, ignored on a free), with ``capacity_bytes`` the
    bytes the allocator may reserve (None: unlimited) and ``expandable_segments`` (the rules of
    ``CachingAllocatorSim(capacity_bytes=..., expandable_segments=...)``, no
    ``max_split_size``), or None where the kernel cannot answer: no numba, ``MEMFIT_NO_JIT``, a
    request or reserved bytes (with expandable segments: a mapped address) of 1 TiB or more (the
    kernel's packed free-list keys hold addresses below it), keys outside the range, or a
    malformed list (the caller's Python replay then answers, or raises the error)."""
    kernel = load_kernel(wait=False)
    if kernel is None:
        return None
    if expandable_segments:
        if not _EXPANDABLE:  # loaded apart from _compile (a test's stand-in): not this replay
            return None
        kernel = _EXPANDABLE[0]
    n = len(keys)
    if len(is_alloc) != n or len(n_bytes) != n:
        raise ValueError(f"event arrays differ in length: {len(is_alloc)}, {n}, {len(n_bytes)}")
    if n and (int(keys.min()) < 0 or int(keys.max()) >= n_keys):
        return None  # the kernel's live table is indexed by key
    if capacity_bytes is not None and capacity_bytes < 0:
        return None  # the Python replay names the error
    # a capacity of 1 TiB or more is never reached: the kernel stops (TOO_LARGE) before
    capacity = -1 if capacity_bytes is None or capacity_bytes >= _LIMIT_BYTES else capacity_bytes
    out = np.zeros(_N_OUT, dtype=np.int64)
    kernel(
        np.ascontiguousarray(is_alloc, dtype=np.uint8),
        np.ascontiguousarray(keys, dtype=np.int64),
        np.ascontiguousarray(n_bytes, dtype=np.int64),
        int(n_keys),
        int(capacity),
        out,
    )
    status, _at, peak_allocated, reserved, n_segments, peak_at = (int(v) for v in out[:6])
    if status != 0:
        return None
    if capacity_bytes is None and not expandable_segments:
        return AllocatorResult.unbounded(
            peak_allocated=peak_allocated, reserved=reserved, n_segments=n_segments, peak_at=peak_at
        )
    peak_reserved, n_ooms, first_oom = (int(v) for v in out[6:9])
    return AllocatorResult(
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
        final_reserved_bytes=reserved,
        n_segments=n_segments,
        n_ooms=n_ooms,
        peak_reserved_at_event=peak_at,
        first_oom_at_event=None if first_oom < 0 else first_oom,
    )


# kernel.N_OUT and kernel.LIMIT_BYTES, written out: kernel.py imports numba (loaded lazily)
_N_OUT = 9
_LIMIT_BYTES = 1 << 40


def replay_events(events: list[tuple]) -> AllocatorResult | None:
    """:func:`replay_arrays` of ``("a", key, n_bytes)`` / ``("f", key[, 0])`` tuples (any
    integer keys), or None where it cannot answer (as there, or a kind other than "a" / "f", or
    keys or sizes that are not int64)."""
    if load_kernel(wait=False) is None:
        return None
    try:
        kinds = [e[0] for e in events]
        is_alloc = np.fromiter((k == "a" for k in kinds), dtype=np.uint8, count=len(kinds))
        if int(is_alloc.sum()) + kinds.count("f") != len(kinds):
            return None  # an unknown kind: the Python replay names it
        raw_keys = np.asarray([e[1] for e in events])
        n_bytes = np.asarray([e[2] if e[0] == "a" else 0 for e in events])
    except (OverflowError, TypeError, ValueError, IndexError):
        return None
    if len(events) and (raw_keys.dtype.kind not in "iu" or n_bytes.dtype.kind not in "iu"):
        return None  # not plain integers (or beyond int64): the Python replay's dict handles them
    if raw_keys.dtype == np.uint64 or n_bytes.dtype == np.uint64:
        return None
    if len(raw_keys) == 0:
        return replay_arrays(is_alloc, raw_keys, n_bytes, 0)
    uniq, dense = np.unique(raw_keys, return_inverse=True)
    return replay_arrays(is_alloc, dense.reshape(-1), n_bytes, len(uniq))


def _compile() -> Any:
    try:
        from memfit.estimate.allocator import kernel as allocator_kernel
        from memfit.estimate.allocator import kernel_expandable
    except ImportError:
        _WHY[0] = "numba is not installed: pip install 'memfit[fast]'"
        return None
    except RuntimeError as e:  # allocator_kernel.NoCacheError: nowhere to keep the machine code
        _WHY[0] = str(e)[:500]
        return None
    kernel = allocator_kernel.replay_default
    from numba.core.errors import NumbaError

    expandable = kernel_expandable.replay_expandable
    try:
        with _no_scipy_blas_probe():  # load (or compile) the machine code now, not at first use
            for replay in (kernel, expandable):
                replay(
                    np.ones(1, dtype=np.uint8),
                    np.zeros(1, dtype=np.int64),
                    np.ones(1, dtype=np.int64),
                    1,
                    -1,
                    np.zeros(_N_OUT, dtype=np.int64),
                )
    except (NumbaError, KeyError, TypeError) as e:  # a numba that cannot compile the kernel
        _WHY[0] = f"numba could not compile the replay ({type(e).__name__}: {e})"[:300]
        return None
    except _BROKEN_CACHE as e:  # a damaged file in memfit's own folder (a crash mid-write)
        # the folder is memfit's own (checked private): emptied, compiled again by the next run
        if allocator_kernel._FOLDER is not None:
            shutil.rmtree(allocator_kernel._FOLDER, ignore_errors=True)
        _WHY[0] = f"numba's cached machine code was damaged ({type(e).__name__}): removed"
        return None
    _EXPANDABLE[:] = [expandable]
    return kernel


#: What numba raises reading a damaged cache file (``pickle.loads`` of a truncated index...).
_BROKEN_CACHE = (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError,
                 IndexError, OSError)  # fmt: skip


#: The module numba's numpy support imports to probe for a BLAS when it first compiles or loads
#: machine code (``numba.np.arraymath._check_blas``): importing it imports ``scipy.linalg``.
_BLAS_PROBE = "scipy.linalg.cython_blas"


@contextlib.contextmanager
def _no_scipy_blas_probe() -> Iterator[None]:
    """Inside the block, importing :data:`_BLAS_PROBE` fails at once (a ``None`` entry in
    ``sys.modules``), unless it is imported already. Loading the kernel otherwise imports
    scipy.linalg (~0.25 s of a ~0.75 s load) for a probe whose only effect is whether numba's
    ``np.correlate`` / ``np.convolve`` call BLAS (this kernel calls neither); numba's linear
    algebra imports it itself when it compiles. The entry is removed on leaving."""
    if _BLAS_PROBE in sys.modules:
        yield
        return
    sys.modules[_BLAS_PROBE] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if _BLAS_PROBE in sys.modules and sys.modules[_BLAS_PROBE] is None:
            del sys.modules[_BLAS_PROBE]


def main() -> int:
    """Compile (or load) the kernel into memfit's private folder, then remove the
    background-compile lock: what :func:`warm_in_background` runs."""
    try:
        ok = load_kernel(wait=True) is not None
    finally:
        lock = _marker("warming")
        if lock is not None:
            with contextlib.suppress(OSError):
                os.remove(lock)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Independent traces of one form build run two at a time: this process and one forked worker.

A grown form (:mod:`memfit.estimate.derived.grown`) takes five to eight shallow traces, each a
few seconds of single-threaded Python on fake tensors; on a machine with two or more cores the
ones that do not depend on each other run side by side. The worker is a ``fork`` of this
process made after the trace engine's imports (torch, transformers, peft: the larger part of a
cold run's own start-up), so it starts in milliseconds and runs exactly the code this process
would; each job's answer comes back pickled and is used as if this process had traced it.

Nothing depends on the worker: where it cannot be made (no ``fork``, one core,
``MEMFIT_TRACE_WORKERS=1``), dies, hangs past a generous limit, or its job raises, that job is
run again here, so an error is raised by the same code, in the same process, as a serial build
raises it. Results do not depend on which process traced: a trace is a function of its config
and workload (tests compare a parallel build with a serial one byte for byte).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from memfit import progress

#: ``MEMFIT_TRACE_WORKERS``: ``1`` traces in this process only, ``2`` forks a worker where two
#: cores exist; unset: a worker where a second core is free (:func:`wanted`).
ENV = "MEMFIT_TRACE_WORKERS"
#: A worker's job that takes this many times as long as the slowest job this process ran
#: (plus the slack) is given up, and traced here.
HANG_FACTOR = 6.0
HANG_SLACK_S = 120.0


#: How long :func:`idle_cores` watches the machine when the load average alone says no core
#: is free (the average lags: a command run in the minute before still counts in it).
IDLE_WINDOW_S = 0.2
#: The worker may run where at least this many cores sat idle over that window. This process
#: sleeps while it watches, so its own core counts as idle: two idle cores are its own and the
#: worker's; the half core is slack for the clock-tick counting and short-lived neighbours.
IDLE_CORES_NEEDED = 1.5


def wanted() -> bool:
    """Whether a build may fork a worker: Linux (``fork`` after torch's import is what
    PyTorch's own DataLoader does there), two usable cores, and one of them free: the 1-minute
    load average at most the cores less one, else (the average lags behind a command that
    has just ended) :func:`idle_cores` over :data:`IDLE_WINDOW_S` at least
    :data:`IDLE_CORES_NEEDED`. Measured on a shared 2-core machine, a worker without a free
    core only adds its own start-up (benchmarks/results/cold_build_profile.md). :data:`ENV`
    ``1`` switches it off, ``2`` on wherever ``fork`` and two cores exist."""
    setting = os.environ.get(ENV, "").strip()
    if setting in ("0", "1") or not sys.platform.startswith("linux"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores < 2:
        return False
    if setting == "2" or os.getloadavg()[0] <= cores - 1:
        return True
    now = time.monotonic()
    if _IDLE_SEEN and now - _IDLE_SEEN[0] < IDLE_ANSWER_S:
        return _IDLE_SEEN[1]
    idle = idle_cores(IDLE_WINDOW_S)
    _IDLE_SEEN[:] = [time.monotonic(), idle is not None and idle >= IDLE_CORES_NEEDED]
    return _IDLE_SEEN[1]


#: How long the idle cores seen by :func:`wanted` answer for the builds after it: a plan builds
#: a form every few seconds, and its own traces keep the load average up (each new look would
#: cost the window's wait again).
IDLE_ANSWER_S = 30.0
_IDLE_SEEN: list[Any] = []  # [when (monotonic s), the answer] of the last look


def idle_cores(window_s: float) -> float | None:
    """How many of the cores this process may run on were idle (or waiting on I/O) over the
    next ``window_s`` seconds, from the kernel's per-CPU tick counts in ``/proc/stat``; None
    where they cannot be read."""
    try:
        mine = {f"cpu{n}" for n in os.sched_getaffinity(0)}
    except (AttributeError, OSError):
        mine = None  # every CPU the file lists

    def ticks() -> tuple[int, int, int] | None:
        """(all ticks, idle ticks, CPUs counted) over this process's CPUs."""
        total = idle = n_cpus = 0
        try:
            with open("/proc/stat", encoding="ascii") as f:
                for line in f:
                    name, *fields = line.split()
                    if not name.startswith("cpu") or name == "cpu":
                        continue
                    if mine is not None and name not in mine:
                        continue
                    # user nice system idle iowait irq softirq steal (guest time is in user)
                    values = [int(v) for v in fields[:8]]
                    total, idle, n_cpus = (
                        total + sum(values),
                        idle + values[3] + values[4],
                        n_cpus + 1,
                    )
        except (OSError, ValueError, IndexError):
            return None
        return (total, idle, n_cpus) if n_cpus else None

    first = ticks()
    time.sleep(window_s)
    second = ticks()
    if first is None or second is None or second[0] <= first[0] or second[2] != first[2]:
        return None
    return second[2] * (second[1] - first[1]) / (second[0] - first[0])


class Pool:
    """Run ``job(key)`` for keys in this process and, where :func:`wanted`, in one forked worker
    made on the first :meth:`run` of two or more keys and kept until :meth:`close`."""

    def __init__(self, job: Callable[[Any], Any], *, enabled: bool | None = None) -> None:
        self._job = job
        self._enabled = wanted() if enabled is None else enabled
        self._proc: Any = None
        self._conn: Any = None
        self._slowest_s = 0.0
        #: Keys the worker traced (a test's view of what ran where).
        self.by_worker: list[Any] = []

    @property
    def enabled(self) -> bool:
        """Whether a worker may run (or runs) jobs: :func:`wanted`, and none has failed."""
        return self._enabled

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:  # e.g. Ctrl-C: the worker's job is not waited for
            self._stop()
        else:
            self.close()

    def run(self, keys: Iterable[tuple[Hashable, float]]) -> dict[Any, Any]:
        """``{key: job(key)}`` for ``keys`` given as ``(key, cost)``: the worker takes the
        costliest first, this process the next, each the next costliest when it is free."""
        todo = [k for k, _c in sorted(keys, key=lambda kc: -kc[1])]
        done: dict[Any, Any] = {}
        if len(todo) > 1:
            self._start()
        sent: Any = None
        while todo or sent is not None:
            if sent is None and todo and self._conn is not None:
                sent = todo.pop(0)
                if not self._send(sent):
                    todo.insert(0, sent)
                    sent = None
            if sent is not None and (not todo or self._ready()):
                got = self._receive(sent)
                done[sent] = got[0] if got else self._here(sent)
                sent = None
                continue
            if todo:
                key = todo.pop(0)
                done[key] = self._here(key)
        return done

    def _here(self, key: Any) -> Any:
        started = time.perf_counter()
        out = self._job(key)
        self._slowest_s = max(self._slowest_s, time.perf_counter() - started)
        return out

    def _start(self) -> None:
        if self._conn is not None or not self._enabled:
            return
        try:
            ctx = multiprocessing.get_context("fork")
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(self._job, theirs, mine), daemon=True)
            proc.start()
            theirs.close()
        except (OSError, ValueError, RuntimeError):
            self._enabled = False
            return
        self._proc, self._conn = proc, mine

    def _send(self, key: Any) -> bool:
        try:
            self._conn.send(key)
            return True
        except (OSError, ValueError, EOFError):
            self._stop()
            return False

    def _ready(self) -> bool:
        try:
            return bool(self._conn.poll(0))
        except (OSError, ValueError, EOFError):
            return True  # _receive sees the failure

    def _receive(self, key: Any) -> tuple[Any, ...]:
        """``(answer,)``: the worker's answer for ``key``; ``()`` where the worker failed (it is
        stopped) or the job raised there (the caller runs it here)."""
        limit = HANG_SLACK_S + HANG_FACTOR * self._slowest_s
        try:
            if not self._conn.poll(limit):
                self._stop()
                return ()
            status, got_key, value = self._conn.recv()
        except (OSError, ValueError, EOFError, ImportError, AttributeError, TypeError):
            self._stop()
            return ()
        if status != "ok" or got_key != key:
            return ()
        self.by_worker.append(key)
        return (value,)

    def _stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(5)
        self._proc = self._conn = None
        self._enabled = False

    def close(self) -> None:
        """Tell the worker to exit and wait for it."""
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            if self._proc is not None:
                self._proc.join(10)
        self._stop()


def _serve(job: Callable[[Any], Any], conn: Any, parents: Any) -> None:
    """The worker: answer keys until a None (or the pipe closes). Its output goes nowhere: the
    parent reports progress, and a warning is printed there when the job is traced there."""

    parents.close()
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the worker's whole life
    sys.stdout = sys.stderr = devnull
    with progress.reporting(None):  # the parent's display lives in the parent
        _answer(job, conn)


def _answer(job: Callable[[Any], Any], conn: Any) -> None:
    while True:
        try:
            key = conn.recv()
        except (EOFError, OSError):
            return
        if key is None:
            return
        try:
            conn.send(("ok", key, job(key)))
        except BaseException as exc:  # noqa: BLE001 - any failure: the parent traces it itself
            try:
                conn.send(("error", key, f"{type(exc).__name__}: {exc}"))
            except (OSError, ValueError):
                return

"""Worker processes that run ``memfit`` commands for the web server.

Each request's job (:class:`memfit.web.query.Job`) runs one command line in a separate,
long-lived process, its stdout and stderr captured: the answer is byte for byte what the command
line prints, and a job cannot hold the server. The command line itself comes from the caller
(``memfit web`` passes :func:`memfit.cli.entry.main` and :func:`memfit.cli.entry.build_parser`):
this package sits below the CLI and imports nothing from it. Processes rather than threads
because only a process can be stopped: a job that runs past its time is killed and its worker
replaced.

Workers are not daemonic processes: a job runs exactly as ``memfit`` on the command line runs it,
and the derived engine forks its own trace worker (:mod:`memfit.estimate.derived.workers`), which
Python refuses from inside a daemon ("daemonic processes are not allowed to have children").
A worker still never outlives the server: it ends when its pipe closes (the server gone, killed
included), and :meth:`WorkerPool.close` (also registered with :mod:`atexit`, so that an exit
without it cannot wait on a worker forever) stops every one.

A job goes to the worker that last ran the same command line where that worker is idle (else
to any idle one): what a worker keeps in memory (the nearest change that fits of a job that does
not fit, ``memfit.plan.nearest``; the analytic engine's blocks and the planner's candidate
tables) answers a repeated request without a second search; the trace cache on disk is shared.

Bounds: ``n_workers`` processes (two by default, the machine's cores), of which at most
``n_heavy`` run a heavy job (a trace or a planner search) at once, so an analytic estimate always
finds a worker; a job waits at most ``wait_s`` for one (then :class:`Busy`), and runs at most
``light_timeout_s`` / ``heavy_timeout_s`` (then :class:`TimedOut`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import multiprocessing
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from memfit.errors import MemfitError

#: What a worker answers for one job.
EXIT_INTERNAL = 70
#: Command lines whose last worker the pool remembers (least recently run forgotten first).
MAX_AFFINITIES = 4096  # sysexits' EX_SOFTWARE: a memfit bug, not the user's input


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What ``memfit ARGV`` did: its exit code and what it printed."""

    exit_code: int
    stdout: str
    stderr: str
    wall_s: float

    @property
    def error_line(self) -> str:
        """The message the CLI printed for a bad input (its last stderr line)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"memfit exited {self.exit_code}"


class Busy(MemfitError):
    """Every worker (or every heavy slot) stayed busy for the whole wait."""


class TimedOut(MemfitError):
    """The job ran past its time and its worker was stopped."""


class WorkerDied(MemfitError):
    """The worker process ended during the job (killed for memory, a crash); it was replaced."""


class CommandLine(Protocol):
    """Runs one ``memfit`` command line and returns its exit code (:func:`memfit.cli.main`).
    A top-level function, so that it reaches the spawned workers (pickled by name)."""

    def __call__(self, argv: Sequence[str], *, parser: argparse.ArgumentParser) -> int: ...


#: Builds the command line's parser (:func:`memfit.cli.build_parser`); a top-level function too.
ParserFactory = Callable[[], argparse.ArgumentParser]


def run_cli(
    argv: list[str], *, run: CommandLine, parser: argparse.ArgumentParser
) -> tuple[int, str, str]:
    """``run(argv)`` with its output captured (in the worker process). ``parser``: built once
    per worker (argparse keeps no state between parse_args calls)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run(argv, parser=parser)
        except SystemExit as exc:  # argparse: a bad option (exit 2, message on stderr)
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # a memfit bug: the server must answer, not die
            print(f"memfit: internal error: {type(exc).__name__}: {exc}", file=err)
            code = EXIT_INTERNAL
    return code, out.getvalue(), err.getvalue()


def _serve(conn: Connection, run: CommandLine, parser_factory: ParserFactory) -> None:
    """The worker's loop: receive argv, answer (exit code, stdout, stderr), until None."""
    parser = parser_factory()
    while True:
        try:
            argv = conn.recv()
        except EOFError:
            return
        if argv is None:
            return
        conn.send(run_cli(argv, run=run, parser=parser))


class _Worker:
    def __init__(self, ctx: Any, run: CommandLine, parser_factory: ParserFactory) -> None:
        self.conn, child = ctx.Pipe()
        # not a daemon: a job may fork (the derived engine's trace worker); see the docstring
        self.process = ctx.Process(target=_serve, args=(child, run, parser_factory), daemon=False)
        self.process.start()
        child.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=2)
        self.conn.close()


class WorkerPool:
    """A fixed set of worker processes, each running ``run`` on the parser ``parser_factory``
    builds; :meth:`run` blocks the calling thread until done."""

    def __init__(
        self,
        *,
        run: CommandLine,
        parser_factory: ParserFactory,
        n_workers: int = 2,
        n_heavy: int = 1,
        wait_s: float = 30.0,
        light_timeout_s: float = 20.0,
        heavy_timeout_s: float = 300.0,
    ) -> None:
        if not 1 <= n_heavy <= n_workers:
            raise ValueError(f"n_heavy ({n_heavy}) must be 1 to n_workers ({n_workers})")
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a threaded server
        self._command = (run, parser_factory)
        self._idle = [_Worker(self._ctx, *self._command) for _ in range(n_workers)]
        self._all = list(self._idle)
        self._cond = threading.Condition()
        self._heavy = threading.BoundedSemaphore(n_heavy)
        #: command line -> the worker that last ran it (module docstring)
        self._ran: OrderedDict[tuple[str, ...], _Worker] = OrderedDict()
        self.wait_s = wait_s
        self.light_timeout_s = light_timeout_s
        self.heavy_timeout_s = heavy_timeout_s
        atexit.register(self.close)  # before multiprocessing's own exit hook joins the workers

    def run(self, argv: tuple[str, ...], *, heavy: bool) -> Outcome:
        """Run ``memfit ARGV`` on a free worker; raises Busy or TimedOut."""
        if heavy and not self._heavy.acquire(timeout=self.wait_s):
            raise Busy(
                "another trace or plan is running and this server runs one at a time: "
                "try again when it finishes (or ask the analytic engine)"
            )
        try:
            worker = self._take(argv)
            start = time.perf_counter()
            timeout = self.heavy_timeout_s if heavy else self.light_timeout_s
            try:
                worker.conn.send(list(argv))
                if not worker.conn.poll(timeout):
                    raise TimedOut(
                        f"the job ran past {timeout:g} s and was stopped: try "
                        "--engine analytic, a smaller model or fewer alternatives"
                    )
                code, out, err = worker.conn.recv()
            except TimedOut:
                worker = self._replace(worker)
                raise
            except (EOFError, OSError):
                worker = self._replace(worker)
                raise WorkerDied(
                    "the worker running this job ended (out of host memory?); it was restarted"
                ) from None
            finally:
                self._give(worker, argv)
            return Outcome(
                exit_code=code, stdout=out, stderr=err, wall_s=time.perf_counter() - start
            )
        finally:
            if heavy:
                self._heavy.release()

    def _take(self, argv: tuple[str, ...]) -> _Worker:
        """An idle worker: the one that last ran ``argv`` if it is idle, else the last freed."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._idle), timeout=self.wait_s):
                raise Busy(f"every worker stayed busy for {self.wait_s:g} s: try again")
            ran = self._ran.get(tuple(argv))
            if ran is not None and ran in self._idle:
                self._idle.remove(ran)
                return ran
            return self._idle.pop()

    def _give(self, worker: _Worker, argv: tuple[str, ...] | None = None) -> None:
        with self._cond:
            if argv is not None:
                self._ran[tuple(argv)] = worker
                self._ran.move_to_end(tuple(argv))
                while len(self._ran) > MAX_AFFINITIES:
                    self._ran.popitem(last=False)
            self._idle.append(worker)
            self._cond.notify()

    def _replace(self, worker: _Worker) -> _Worker:
        worker.process.kill()
        worker.stop()
        fresh = _Worker(self._ctx, *self._command)
        with self._cond:
            self._all[self._all.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        with self._cond:
            workers, self._all, self._idle = self._all, [], []
        for w in workers:
            w.stop()
        atexit.unregister(self.close)

"""Progress of slow work (a trace, deriving a form, a search, a confirmation): one callback.

Engines and searches call :func:`report` with a short message ("tracing llama (batch 4, seq
2048)"); nothing is shown unless a display is installed with :func:`reporting`. The command line
installs :class:`TerminalLine` — one updating line on stderr, after the work has run for
``DELAY_S`` — only when stderr is a terminal and neither ``--quiet`` nor ``--json`` to a pipe
asks for silence (:func:`wanted`). Library callers may install any ``Callable[[str], None]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO, cast

Callback = Callable[[str], None]

#: Work shorter than this shows nothing (the project's rule: progress for anything over 2 s).
DELAY_S = 2.0
#: How often the line is redrawn (its clock moves while one trace runs).
REFRESH_S = 0.5

_CALLBACK: contextvars.ContextVar[Callback | None] = contextvars.ContextVar(
    "memfit_progress", default=None
)


def report(message: str) -> None:
    """Tell the installed display (if any) what is running now."""
    callback = _CALLBACK.get()
    if callback is not None:
        callback(message)


@contextlib.contextmanager
def reporting(callback: Callback | None) -> Iterator[None]:
    """Install ``callback`` for the work inside (None: silence)."""
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def wanted(*, quiet: bool, json_out: bool, stream: TextIO | None = None) -> bool:
    """Whether a command shows progress: stderr is a terminal, no ``--quiet``, and not
    ``--json`` written to a pipe or file."""
    err = stream or sys.stderr
    if quiet or not _isatty(err):
        return False
    return not (json_out and not _isatty(sys.stdout))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class TerminalLine:
    """One updating stderr line (tqdm's status line): the latest message and the seconds since
    the work began, redrawn every ``REFRESH_S`` by a daemon thread (a trace reports once and
    then runs for seconds), shown from ``delay_s`` on, cleared on :meth:`close`."""

    def __init__(self, *, delay_s: float | None = None, stream: TextIO | None = None) -> None:
        self.delay_s = DELAY_S if delay_s is None else delay_s
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self._bar: Any = None
        self._last = "working"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def __call__(self, message: str) -> None:
        self._last = message
        self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._draw()

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed < self.delay_s:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=None, bar_format="{desc}", file=self.stream, leave=False,
                    dynamic_ncols=True,
                )  # fmt: skip
            self._bar.set_description_str(f"memfit: {self._last} [{elapsed:.0f} s]", refresh=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


class _ClosesTheLine:
    """stdout while a :class:`TerminalLine` is shown: the first write closes (clears) the line,
    so the answer starts on a clean line instead of after ``memfit: ... [13 s]``; the rest of
    the command's output follows unchanged. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO, line: TerminalLine) -> None:
        self._stream, self._line = stream, line

    def write(self, text: str) -> int:
        if text:
            self._line.close()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def terminal(*, quiet: bool, json_out: bool) -> Iterator[None]:
    """The command line's progress: :class:`TerminalLine` where :func:`wanted`, else silence.
    The line is cleared before the command prints its answer (the first write to stdout) and
    when the work ends, whichever comes first: every command prints inside this context."""
    if not wanted(quiet=quiet, json_out=json_out):
        with reporting(None):
            yield
        return
    line = TerminalLine()
    try:
        out = cast(TextIO, _ClosesTheLine(sys.stdout, line))
        with reporting(line), contextlib.redirect_stdout(out):
            yield
    finally:
        line.close()


__all__ = ["DELAY_S", "TerminalLine", "report", "reporting", "terminal", "wanted"]

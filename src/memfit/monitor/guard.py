"""The guarded boundary: what memfit runs inside a user's process goes through a :class:`Guard`.

``memfit.Monitor``, the transformers and Lightning callbacks and the OOM guard run memfit code in
the middle of someone's training loop. The rule (docs/monitoring.md "Guarantees"): a failure of
memfit's own code is logged **once per place** — a ``logging`` warning on the ``memfit.monitor``
logger and, where a run log is open, an ``error`` record — and the user's code continues. Only
``Exception`` is caught: ``KeyboardInterrupt`` / ``SystemExit`` are the user's, and the user's own
exceptions never pass through a guard (memfit code runs *after* the user's op, or around it, never
instead of it).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("memfit.monitor")


def warn(message: str, *args: Any) -> None:
    """A ``logging`` warning that cannot fail (a closed ``sys.stderr`` breaks logging's last-resort
    handler with a ValueError it does not catch)."""
    with contextlib.suppress(Exception):  # nowhere left to say it
        logger.warning(message, *args)


def safe_print(text: str) -> None:
    """Print to stderr unless it is closed or missing (pythonw, a closed pipe)."""
    with contextlib.suppress(Exception):  # the summary is also in the end record
        stream = sys.stderr
        if stream is not None:
            print(text, file=stream)


class Guard:
    """Runs memfit code for one owner (a monitor, a callback); failures are reported once per
    ``where``. ``record_error(where, message)`` writes the ``error`` record (the owner's log)."""

    def __init__(self, owner: str, record_error: Callable[[str, str], None] | None = None) -> None:
        self.owner = owner
        self.record_error = record_error
        self.failures: dict[str, str] = {}
        self._lock = threading.Lock()

    def call(self, where: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, or None after reporting its exception."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — memfit must never break the user's loop
            self.report(where, exc)
            return None

    def report(self, where: str, problem: BaseException | str) -> None:
        """Say once that ``where`` failed (a warning and, when possible, an ``error`` record)."""
        message = problem if isinstance(problem, str) else f"{type(problem).__name__}: {problem}"
        with self._lock:
            if where in self.failures:
                return
            self.failures[where] = message
        warn("memfit %s: %s failed (%s); the run continues", self.owner, where, message)
        if self.record_error is not None:
            with contextlib.suppress(Exception):  # the warning above already said it
                self.record_error(where, message)

    @property
    def n_errors(self) -> int:
        return len(self.failures)

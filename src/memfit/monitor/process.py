"""``memfit monitor -- CMD``: run any command and watch its memory from outside.

The child's whole process tree (DataLoader workers, torchrun ranks) is followed: NVML's per-process
device memory summed over the tree's pids, the device-level used bytes and utilization, and the
tree's RSS. Without NVML (no GPU) the log is a CPU one: ``process_used_bytes`` in each sample is
the tree's RSS. There are no step records: the allocator's counters live inside the child (use
``memfit.Monitor`` in the script for them).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import subprocess
import threading
import time
from typing import Any

from memfit.errors import SpecError
from memfit.monitor.device import Nvml, host_memory_bytes, process_tree, rss_bytes
from memfit.monitor.guard import safe_print
from memfit.monitor.log import RunLog, record
from memfit.monitor.summary import RunStats, receipt
from memfit.version import __version__


def _exit_code(returncode: int) -> int:
    """A child killed by signal N exits as 128 + N, as shells report it."""
    return 128 - returncode if returncode < 0 else returncode


class _ChildLog:
    """The run log of ``memfit monitor``: a failed write is said once on stderr and the log stops;
    the command keeps running (it is the user's job; the log is memfit's)."""

    def __init__(self, log: RunLog) -> None:
        self.log: RunLog | None = log
        self.failure: str | None = None

    def write(self, rec: dict[str, Any]) -> None:
        if self.log is None:
            return
        try:
            self.log.write(rec)
        except (OSError, ValueError) as exc:
            self.failure = getattr(exc, "strerror", None) or str(exc)
            path, self.log = self.log.path, None
            safe_print(
                f"memfit: warning: cannot write the run log {str(path)!r} ({self.failure}); "
                "the command keeps running and its summary is printed at the end"
            )

    def close(self) -> None:
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.close()


class _ForwardSignals:
    """While the child runs, SIGTERM / SIGHUP sent to memfit go to the child, and memfit waits for
    it (a scheduler killing memfit must not leave the job running as an orphan)."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.saved: dict[int, Any] = {}
        self.received: int | None = None

    def _forward(self, signum: int, _frame: Any) -> None:
        self.received = signum
        with contextlib.suppress(OSError):
            self.proc.send_signal(signum)

    def __enter__(self) -> _ForwardSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                with contextlib.suppress(OSError, ValueError):
                    self.saved[sig] = signal.signal(sig, self._forward)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.saved.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)


def monitor_command(
    argv: list[str],
    log_path: str | os.PathLike[str],
    *,
    interval_s: float = 0.5,
    device_index: int = 0,
    estimate: dict[str, Any] | None = None,
    fsync: bool = False,
) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """Run ``argv`` to completion while sampling it; returns (exit code, summary, receipt).

    A log that cannot be opened stops memfit before the command starts (SpecError, exit 2); one
    that fails later (disk full) is a warning and the command runs on. The command is never left
    running on its own: memfit waits for it on every path, forwarding Ctrl-C, SIGTERM and SIGHUP.
    """
    if not argv:
        raise SpecError(
            "no command to run: write it after `--`, e.g. memfit monitor -- python x.py"
        )
    if not interval_s > 0 or not math.isfinite(interval_s):
        raise SpecError(f"--interval ({interval_s}) must be positive (a finite number of seconds)")
    nvml = Nvml.open(device_index)
    device = f"cuda:{device_index}" if nvml is not None else "cpu"
    try:
        run_log = RunLog(log_path, fsync=fsync)
    except OSError as exc:
        raise SpecError(
            f"cannot write the run log {str(log_path)!r} ({exc.strerror or exc}): "
            "give a writable --log; the command was not started"
        ) from None
    log = _ChildLog(run_log)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        log.close()
        raise SpecError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    with _ForwardSignals(proc) as forwarded:
        try:
            code, stats, interrupted = _watch(proc, nvml, device, argv, estimate, log, interval_s)
        except BaseException:
            log.close()
            raise
        finally:
            _wait_for(proc)
    signalled = forwarded.received is not None
    outcome = "interrupted" if interrupted or signalled else ("ok" if code == 0 else "error")
    summary = stats.summary(outcome=outcome, duration_s=time.perf_counter() - t0, n_errors=0)
    summary["exit_code"] = code
    summary["n_errors"] = int(log.failure is not None)
    rec = None if estimate is None else receipt(estimate, summary, device=device)
    log.write(record("end", summary=summary, receipt=rec))
    log.close()
    return code, summary, rec


def _watch(
    proc: subprocess.Popen[bytes],
    nvml: Nvml | None,
    device: str,
    argv: list[str],
    estimate: dict[str, Any] | None,
    log: _ChildLog,
    interval_s: float,
) -> tuple[int, RunStats, bool]:
    log.write(
        record(
            "start",
            memfit_version=__version__,
            device=device,
            device_name=nvml.name if nvml is not None else platform.machine() or "cpu",
            device_total_bytes=nvml.total_bytes if nvml is not None else host_memory_bytes(),
            pid=proc.pid,
            argv=list(argv),
            estimate=estimate,
        )
    )
    stats = RunStats()
    interrupted = False
    sampling_failed = False
    while True:
        try:
            _sample(proc.pid, nvml, stats, log)
        except Exception as exc:  # noqa: BLE001 — a sampling failure must not stop the watch
            if not sampling_failed:
                sampling_failed = True
                safe_print(f"memfit: warning: sampling failed ({exc}); the command keeps running")
        try:
            proc.wait(timeout=interval_s)
            break
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # the child got the terminal's SIGINT too; let it finish
            interrupted = True
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)
    return _exit_code(proc.returncode), stats, interrupted


def _wait_for(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the child whatever happened to memfit (Ctrl-C again: it is forwarded again)."""
    while proc.poll() is None:
        try:
            proc.wait()
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)


def _sample(pid: int, nvml: Nvml | None, stats: RunStats, log: _ChildLog) -> None:
    pids = process_tree(pid)
    rss = rss_bytes(pids)
    stats.peak("peak_rss_bytes", rss)
    if nvml is not None:
        s = nvml.sample(set(pids))
        rec = record(
            "sample",
            device_used_bytes=s.device_used_bytes,
            utilization_pct=s.utilization_pct,
            process_used_bytes=s.process_used_bytes,
        )
        stats.add_sample(rec)
    else:
        rec = record("sample", device_used_bytes=None, utilization_pct=None, process_used_bytes=rss)
    log.write(rec)

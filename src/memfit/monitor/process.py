"""``memfit monitor -- CMD``: run any command and watch its memory from outside.

The child's whole process tree (DataLoader workers, torchrun ranks) is followed: NVML's per-process
device memory summed over the tree's pids, the device-level used bytes and utilization, and the
tree's RSS. Without NVML (no GPU) the log is a CPU one: ``process_used_bytes`` in each sample is
the tree's RSS. There are no step records: the allocator's counters live inside the child (use
``memfit.Monitor`` in the script for them).
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import time
from typing import Any

from memfit.errors import SpecError
from memfit.monitor.device import Nvml, host_memory_bytes, process_tree, rss_bytes
from memfit.monitor.log import RunLog, record
from memfit.monitor.summary import RunStats, receipt


def _exit_code(returncode: int) -> int:
    """A child killed by signal N exits as 128 + N, as shells report it."""
    return 128 - returncode if returncode < 0 else returncode


def monitor_command(
    argv: list[str],
    log_path: str | os.PathLike[str],
    *,
    interval_s: float = 0.5,
    device_index: int = 0,
    estimate: dict[str, Any] | None = None,
    fsync: bool = False,
) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """Run ``argv`` to completion while sampling it; returns (exit code, summary, receipt)."""
    if not argv:
        raise SpecError(
            "no command to run: write it after `--`, e.g. memfit monitor -- python x.py"
        )
    if not interval_s > 0:
        raise SpecError(f"--interval ({interval_s}) must be positive")
    nvml = Nvml.open(device_index)
    device = f"cuda:{device_index}" if nvml is not None else "cpu"
    log = RunLog(log_path, fsync=fsync)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv)
    except (FileNotFoundError, PermissionError) as exc:
        log.close()
        raise SpecError(f"cannot run {argv[0]!r}: {exc.strerror}") from None
    from memfit import __version__

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
    while True:
        _sample(proc.pid, nvml, stats, log)
        try:
            proc.wait(timeout=interval_s)
            break
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # the child got the terminal's SIGINT too; let it finish
            interrupted = True
            proc.send_signal(signal.SIGINT)
    code = _exit_code(proc.returncode)
    outcome = "interrupted" if interrupted else ("ok" if code == 0 else "error")
    summary = stats.summary(outcome=outcome, duration_s=time.perf_counter() - t0, n_errors=0)
    summary["exit_code"] = code
    rec = None if estimate is None else receipt(estimate, summary, device=device)
    log.write(record("end", summary=summary, receipt=rec))
    log.close()
    return code, summary, rec


def _sample(pid: int, nvml: Nvml | None, stats: RunStats, log: RunLog) -> None:
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

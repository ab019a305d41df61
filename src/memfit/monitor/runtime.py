"""``memfit.Monitor``: watch a training loop's memory step by step and write it to a run log.

::

    with memfit.Monitor("run.jsonl", estimate=est) as mon:
        mon.watch(optimizer, tokens_per_step=batch * seq)   # or call mon.step(tokens=...) yourself
        for batch in loader:
            ...

Per step: the allocator's allocated / reserved bytes and their peaks since the previous step (the
peak counters are reset each step), the latest NVML reading (device used bytes, utilization; a
background thread samples every ``sample_interval_s``), host RSS, step time and throughput. At exit:
an ``end`` record with the run's summary and, given an estimate, the receipt (predicted vs
measured peaks), also printed to stderr. An OOM inside the block is analysed like
:func:`memfit.oom_guard` does and re-raised.

The monitor never raises into the user's loop: a failure inside it (a device query, the sampler
thread, the log) is logged once per place as an ``error`` record and a ``logging`` warning, and the
run goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

from memfit.errors import SpecError
from memfit.monitor.device import CpuQuery, DeviceQuery, DeviceSample, TensorMemory, open_device
from memfit.monitor.guard import Guard, safe_print, warn
from memfit.monitor.log import RunLog, rank_log_path, record
from memfit.monitor.summary import RunStats, receipt, render_summary
from memfit.version import __version__


def estimate_json(estimate: Any = None, plan: Any = None) -> dict[str, Any] | None:
    """The JSON form of a MemoryEstimate (or of a plan's ``.estimate``); a dict passes through."""
    if plan is not None:
        estimate = getattr(plan, "estimate", None)
        if estimate is None:
            raise SpecError("plan has no .estimate: pass estimate= (a MemoryEstimate) instead")
    if estimate is None or isinstance(estimate, dict):
        return estimate
    to_json = getattr(estimate, "to_json", None)
    if not callable(to_json):
        raise SpecError(
            "estimate must be a MemoryEstimate or its to_json() dict, "
            f"got {type(estimate).__name__}"
        )
    out: dict[str, Any] = to_json()
    return out


class _Sampler(threading.Thread):
    """Reads NVML every ``interval_s`` and hands each reading to ``on_sample``."""

    def __init__(self, query: Callable[[], None], interval_s: float) -> None:
        super().__init__(name="memfit-monitor-sampler", daemon=True)
        self._query = query
        self._interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            self._query()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=min(MAX_JOIN_S, max(1.0, 2 * self._interval_s)))


#: Longer intervals (``inf`` included) mean no sampler thread: a sample is read at each step.
MAX_SAMPLER_INTERVAL_S = 3600.0
MAX_JOIN_S = 10.0

#: Monitors entered and not yet exited, closed at interpreter exit (their end record written).
_OPEN: weakref.WeakSet[Monitor] = weakref.WeakSet()


@atexit.register
def _close_open_monitors() -> None:
    for mon in list(_OPEN):
        mon.close(outcome="exit")


def _numbers_only(estimate: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """The estimate with non-numeric byte values set to None, and the keys that were."""
    if estimate is None:
        return None, []
    bad = [
        k
        for k, v in estimate.items()
        if k.endswith("_bytes") and v is not None and (isinstance(v, bool) or not _is_num(v))
    ]
    return ({**estimate, **dict.fromkeys(bad)} if bad else estimate), bad


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


class Monitor:
    """Context manager around a training (or inference) loop; see the module docstring.

    ``device``: "cuda:N", "cpu", or None (the current CUDA device, else the CPU, where tensor bytes
    come from memfit's exact tensor tracker). ``model`` / ``optimizer``: registered so an OOM can be
    split into parameters, gradients, optimizer states and activations (``watch(optimizer)`` also
    registers it). ``oom_report``: where to write the HTML report on an OOM (None: no file, the
    ``oom`` record is still logged). ``fsync``: put every record on disk, not only flush it.
    """

    def __init__(
        self,
        log: str | os.PathLike[str] = "run.jsonl",
        *,
        estimate: Any = None,
        plan: Any = None,
        sample_interval_s: float = 1.0,
        device: str | DeviceQuery | None = None,
        model: Any = None,
        optimizer: Any = None,
        oom_report: str | os.PathLike[str] | None = None,
        fsync: bool = False,
        verbose: bool = True,
    ) -> None:
        if not sample_interval_s > 0:  # NaN too
            raise SpecError(
                f"sample_interval_s ({sample_interval_s}) must be positive "
                "(seconds; inf: sample at each step only)"
            )
        self.log_path = log
        self.estimate, self._bad_estimate_keys = _numbers_only(estimate_json(estimate, plan))
        self.sample_interval_s = sample_interval_s
        self.model, self.optimizer = model, optimizer
        self.oom_report = oom_report
        self.fsync, self.verbose = fsync, verbose
        self._device_arg = device
        self.device: DeviceQuery = CpuQuery(track_tensors=False)
        self.summary: dict[str, Any] | None = None
        self.receipt: dict[str, dict[str, Any]] | None = None
        self._log: RunLog | None = None
        self._stats = RunStats()
        self._guard = Guard("monitor", self._write_error)
        self._entered = False
        self._hooks: list[Any] = []
        self._sampler: _Sampler | None = None
        self._lock = threading.Lock()
        self._interval_used: int | None = None  # max device-used bytes since the last step
        self._interval_util: list[float] = []
        self._last_sample: DeviceSample | None = None
        self._n_steps = 0
        self._t0 = self._last_t = 0.0

    # ------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Monitor:
        """Start watching; never raises (a failure is a warning and the run goes on)."""
        if self._entered:
            return self
        self._entered = True
        self._stats = RunStats()
        self._guard.call("log", self._open_log)
        device = self._guard.call("open_device", open_device, self._device_arg)
        if device is not None:
            self.device = device
        self._guard.call("device.start", self.device.start)
        self._guard.call("reset_peak", self.device.reset_peak)
        if self.model is not None and isinstance(self.device, CpuQuery):
            self._guard.call("track_model", self.device.track, self.model.parameters())
        self._guard.call("start", self._write_start)
        if self._bad_estimate_keys:
            self._guard.report(
                "estimate",
                f"estimate values {', '.join(self._bad_estimate_keys)} are not numbers: "
                "left out of the receipt",
            )
        self._t0 = self._last_t = time.perf_counter()
        if self.device.can_sample:
            self._take_sample()
            if self.sample_interval_s <= MAX_SAMPLER_INTERVAL_S:
                self._sampler = _Sampler(self._take_sample, self.sample_interval_s)
                self._guard.call("sampler", self._sampler.start)
        _OPEN.add(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        """Stop watching and write the end record; never raises, never swallows the user's
        exception (it propagates unchanged)."""
        from memfit.monitor.oom import is_oom

        if exc is None:
            outcome = "ok"
        elif self._guard.call("is_oom", is_oom, exc):
            outcome = "oom"
            self._guard.call("oom", self._on_oom, exc)
        else:
            outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
        self.close(outcome=outcome)
        return False

    def close(self, *, outcome: str = "ok") -> None:
        """Undo everything the monitor installed and write the end record; safe to call twice
        (the second call does nothing) and from any thread."""
        with self._lock:
            if not self._entered:
                return
            self._entered = False
        _OPEN.discard(self)
        self._finish(outcome)

    def _open_log(self) -> None:
        path = rank_log_path(self.log_path)
        try:
            self._log = RunLog(path, fsync=self.fsync)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise OSError(f"cannot write the run log {str(path)!r} ({why}): no log") from None
        self.log_path = self._log.path

    def _write_start(self) -> None:
        self._write(
            record(
                "start",
                memfit_version=__version__,
                device=self.device.device,
                device_name=self.device.name,
                device_total_bytes=self.device.total_bytes,
                pid=os.getpid(),
                argv=list(sys.argv),
                estimate=self.estimate,
            )
        )

    def _finish(self, outcome: str) -> None:
        """Each undo step on its own, so one failing cannot skip the next; the end record last."""
        g = self._guard
        if self._sampler is not None:
            g.call("sampler.stop", self._sampler.stop)
            self._sampler = None
        for handle in self._hooks:
            g.call("hooks", handle.remove)
        self._hooks.clear()
        mem = g.call("tensor_memory", self.device.tensor_memory)
        if mem is not None:  # the tail after the last step (or a run with no steps)
            self._stats.peak("peak_allocated_bytes", mem.peak_allocated_bytes)
            self._stats.peak("peak_reserved_bytes", mem.peak_reserved_bytes)
        problem = g.call("counting", getattr(self.device, "counting_problem", lambda: None))
        if problem:
            g.report("tensor counter", problem)
        note = g.call("compile_note", getattr(self.device, "compile_note", lambda: None))
        if note:  # not a failure: said once, in the log (an "error" record: its only note kind)
            warn("memfit monitor: %s", note)
            self._write_error("torch.compile", note)
        g.call("device.stop", self.device.stop)
        duration_s = time.perf_counter() - self._t0
        self.summary = g.call(
            "summary", self._stats.summary, outcome=outcome, duration_s=duration_s, n_errors=0
        ) or {"outcome": outcome, "duration_s": round(duration_s, 6), "n_steps": self._n_steps}
        self.summary["n_errors"] = g.n_errors
        self.receipt = None
        if self.estimate is not None:
            self.receipt = g.call(
                "receipt", receipt, self.estimate, self.summary, device=self.device.device
            )
        self._write(record("end", summary=self.summary, receipt=self.receipt))
        if self._log is not None:
            g.call("log.close", self._log.close)
        if self.verbose:
            text = g.call("render_summary", render_summary, self.summary, self.receipt)
            if text:
                safe_print(text)

    # ------------------------------------------------------------------------------ steps
    def step(self, *, tokens: int | None = None, samples: int | None = None) -> None:
        """Record one step (call it after ``optimizer.step()``); never raises."""
        if self._entered:
            self._guard.call("step", self._step, tokens, samples)

    def watch(
        self,
        optimizer: Any,
        *,
        tokens_per_step: int | None = None,
        samples_per_step: int | None = None,
    ) -> Monitor:
        """Record a step after every ``optimizer.step()`` (a step post-hook); also registers the
        optimizer for OOM analysis. Removed when the monitor exits."""

        def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
            self.step(tokens=tokens_per_step, samples=samples_per_step)

        handle = self._guard.call("watch", optimizer.register_step_post_hook, hook)
        if handle is not None:
            self._hooks.append(handle)
        if self.optimizer is None:
            self.optimizer = optimizer
        return self

    def _step(self, tokens: int | None, samples: int | None) -> None:
        now = time.perf_counter()
        step_time_s = now - self._last_t
        self._last_t = now
        mem: TensorMemory = self.device.tensor_memory()
        self.device.reset_peak()
        if self.device.can_sample and self._sampler is None:  # no sampler thread: read at steps
            self._take_sample()
        with self._lock:
            used, utils = self._interval_used, self._interval_util
            self._interval_used, self._interval_util = None, []
            last = self._last_sample
        if used is None and last is not None:
            used = last.device_used_bytes
        if not utils and last is not None and last.utilization_pct is not None:
            utils = [last.utilization_pct]
        self._n_steps += 1
        rec = record(
            "step",
            step=self._n_steps,
            step_time_s=step_time_s,
            tokens=tokens,
            samples=samples,
            tokens_per_s=None if tokens is None or step_time_s <= 0 else tokens / step_time_s,
            samples_per_s=None if samples is None or step_time_s <= 0 else samples / step_time_s,
            allocated_bytes=mem.allocated_bytes,
            peak_allocated_bytes=mem.peak_allocated_bytes,
            reserved_bytes=mem.reserved_bytes,
            peak_reserved_bytes=mem.peak_reserved_bytes,
            device_used_bytes=used,
            utilization_pct=sum(utils) / len(utils) if utils else None,
            rss_bytes=self.device.rss_bytes(),
        )
        self._stats.add_step(rec)
        self._write(rec)

    def _take_sample(self) -> None:
        self._guard.call("sampler", self._sample_once)

    def _sample_once(self) -> None:
        s = self.device.sample()
        rec = record(
            "sample",
            device_used_bytes=s.device_used_bytes,
            utilization_pct=s.utilization_pct,
            process_used_bytes=s.process_used_bytes,
        )
        with self._lock:  # written under the lock: a step's reading follows its samples in the log
            self._last_sample = s
            if s.device_used_bytes is not None:
                self._interval_used = max(self._interval_used or 0, s.device_used_bytes)
            if s.utilization_pct is not None:
                self._interval_util.append(s.utilization_pct)
            self._stats.add_sample(rec)
            self._write(rec)

    # ------------------------------------------------------------------------------ OOM
    def _on_oom(self, exc: BaseException) -> None:
        from memfit.monitor.oom import add_note, analyse_oom, oom_record, write_oom_report

        analysis = analyse_oom(
            exc,
            self.device,
            model=self.model,
            optimizer=self.optimizer,
            estimate=self.estimate,
            step=self._n_steps + 1,
        )
        report = None if self.oom_report is None else write_oom_report(analysis, self.oom_report)
        self._write(oom_record(analysis, report))
        add_note(exc, analysis, report)

    # ------------------------------------------------------------------------------ failures
    def _write(self, rec: dict[str, Any]) -> None:
        log = self._log
        if log is None or log.closed:
            return
        try:
            log.write(rec)
        except Exception as exc:  # noqa: BLE001 — disk full, unserialisable value, ...
            self._log = None  # a half-written line must not be followed by more
            self._guard.report("log", f"{type(exc).__name__}: {exc}; the log stops here")
            with contextlib.suppress(OSError):
                log.close()

    def _write_error(self, where: str, message: str) -> None:
        self._write(record("error", where=where, message=message))

    # kept for callers of the former private helper (tests): same contract as Guard.call
    def _safely(self, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._guard.call(where, fn, *args)

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

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from memfit.errors import SpecError
from memfit.monitor.device import CpuQuery, DeviceQuery, DeviceSample, TensorMemory, open_device
from memfit.monitor.log import RunLog, record
from memfit.monitor.summary import RunStats, receipt, render_summary

logger = logging.getLogger("memfit.monitor")


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
        self.join(timeout=max(1.0, 2 * self._interval_s))


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
        if not sample_interval_s > 0:
            raise SpecError(f"sample_interval_s ({sample_interval_s}) must be positive")
        self.log_path = log
        self.estimate = estimate_json(estimate, plan)
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
        self._errors: set[str] = set()
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
        self._log = RunLog(self.log_path, fsync=self.fsync)
        self._stats = RunStats()
        device = self._safely("open_device", open_device, self._device_arg)
        if device is not None:
            self.device = device
        self._safely("device.start", self.device.start)
        self._safely("reset_peak", self.device.reset_peak)
        if self.model is not None and isinstance(self.device, CpuQuery):
            self._safely("track_model", self.device.track, self.model.parameters())
        self._write_start()
        self._t0 = self._last_t = time.perf_counter()
        if self.device.can_sample:
            self._take_sample()
            self._sampler = _Sampler(self._take_sample, self.sample_interval_s)
            self._sampler.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        from memfit.monitor.oom import is_oom

        if exc is None:
            outcome = "ok"
        elif is_oom(exc):
            outcome = "oom"
            self._safely("oom", self._on_oom, exc)
        else:
            outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
        self._safely("exit", self._finish, outcome)
        if self._log is not None and not self._log.closed:
            self._log.close()
        return False

    def _write_start(self) -> None:
        from memfit import __version__

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
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        mem = self._safely("tensor_memory", self.device.tensor_memory)
        if mem is not None:  # the tail after the last step (or a run with no steps)
            self._stats.peak("peak_allocated_bytes", mem.peak_allocated_bytes)
            self._stats.peak("peak_reserved_bytes", mem.peak_reserved_bytes)
        self._safely("device.stop", self.device.stop)
        self.summary = self._stats.summary(
            outcome=outcome,
            duration_s=time.perf_counter() - self._t0,
            n_errors=len(self._errors),
        )
        self.receipt = None
        if self.estimate is not None:
            self.receipt = receipt(self.estimate, self.summary, device=self.device.device)
        self._write(record("end", summary=self.summary, receipt=self.receipt))
        if self._log is not None:
            self._log.close()
        if self.verbose:
            print(render_summary(self.summary, self.receipt), file=sys.stderr)

    # ------------------------------------------------------------------------------ steps
    def step(self, *, tokens: int | None = None, samples: int | None = None) -> None:
        """Record one step (call it after ``optimizer.step()``); never raises."""
        self._safely("step", self._step, tokens, samples)

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

        self._hooks.append(optimizer.register_step_post_hook(hook))
        if self.optimizer is None:
            self.optimizer = optimizer
        return self

    def _step(self, tokens: int | None, samples: int | None) -> None:
        now = time.perf_counter()
        step_time_s = now - self._last_t
        self._last_t = now
        mem: TensorMemory = self.device.tensor_memory()
        self.device.reset_peak()
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
        self._safely("sampler", self._sample_once)

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
        if self._log is None or self._log.closed:
            return
        try:
            self._log.write(rec)
        except (OSError, ValueError, TypeError) as exc:  # disk full, unserialisable value
            self._report_error("log", exc, write=False)

    def _safely(self, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 — memfit must never break the user's loop
            self._report_error(where, exc)
            return None

    def _report_error(self, where: str, exc: BaseException, *, write: bool = True) -> None:
        """Log a monitor failure once per place: a warning and an ``error`` record."""
        if where in self._errors:
            return
        self._errors.add(where)
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("memfit monitor: %s failed (%s); the run continues", where, message)
        if write:
            self._write(record("error", where=where, message=message))

"""The one place the monitor asks a device how much memory it uses: torch.cuda, NVML, RSS.

Everything else in :mod:`memfit.monitor` talks to a :class:`DeviceQuery`; tests drive the CUDA and
NVML code paths by passing a fake one (``Monitor(device=fake)``) and mock nothing else.

- :class:`CudaQuery`: the caching allocator's counters (``allocated`` / ``reserved``, current and
  peak, read in one ``memory_stats_as_nested_dict`` call) and, through :class:`Nvml`, what the
  driver reports: device-level used bytes, utilization, and this process's own used bytes.
- :class:`CpuQuery`: process RSS, and the exact tensor bytes from memfit's ``StorageTracker`` (a
  ``TorchDispatchMode`` that sees every storage born and dying), rounded to 512 B like CUDA's
  allocator so CPU numbers compare with estimates. There is no caching allocator on CPU:
  ``reserved`` equals ``allocated``.

torch, pynvml and psutil are imported when a query is built, never at import time.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from memfit.errors import SpecError

#: Every value the CUDA allocator rounds a request to (``kMinBlockSize`` in CUDACachingAllocator).
ALLOCATOR_ROUND_BYTES = 512


@dataclass(frozen=True, kw_only=True)
class TensorMemory:
    """The allocator's counters; peaks since the last ``reset_peak()``."""

    allocated_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int


@dataclass(frozen=True, kw_only=True)
class DeviceSample:
    """One NVML reading. ``process_used_bytes`` is the watched processes' own use (None when the
    driver cannot attribute memory to them, e.g. inside a container's PID namespace)."""

    device_used_bytes: int | None
    utilization_pct: float | None
    process_used_bytes: int | None


class DeviceQuery(Protocol):
    """What the monitor needs from a device. ``can_sample``: ``sample()`` reads the driver."""

    device: str
    name: str
    total_bytes: int | None
    can_sample: bool

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def tensor_memory(self) -> TensorMemory: ...
    def reset_peak(self) -> None: ...
    def sample(self) -> DeviceSample: ...
    def rss_bytes(self) -> int | None: ...
    def memory_snapshot(self) -> dict[str, Any] | None: ...


NO_SAMPLE = DeviceSample(device_used_bytes=None, utilization_pct=None, process_used_bytes=None)


# ------------------------------------------------------------------------------------ NVML
class Nvml:
    """One GPU seen through NVML (nvidia-ml-py). ``open()`` returns None where NVML is absent."""

    def __init__(self, pynvml: Any, index: int) -> None:
        self._nvml = pynvml
        self.index = index
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(self._handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.total_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).total)

    @classmethod
    def open(cls, index: int) -> Nvml | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return cls(pynvml, index)
        except pynvml.NVMLError:  # no driver, no such device
            return None

    @staticmethod
    def device_count() -> int:
        try:
            import pynvml
        except ImportError:
            return 0
        try:
            pynvml.nvmlInit()
            return int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError:
            return 0

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except self._nvml.NVMLError:  # NotSupported on some boards, or a lost device
            return None

    def sample(self, pids: Collection[int]) -> DeviceSample:
        mem = self._try(self._nvml.nvmlDeviceGetMemoryInfo)
        util = self._try(self._nvml.nvmlDeviceGetUtilizationRates)
        return DeviceSample(
            device_used_bytes=None if mem is None else int(mem.used),
            utilization_pct=None if util is None else float(util.gpu),
            process_used_bytes=self.process_used_bytes(pids),
        )

    def process_used_bytes(self, pids: Collection[int]) -> int | None:
        """Sum of ``usedGpuMemory`` over ``pids`` (compute and graphics contexts, once per pid)."""
        seen: dict[int, int] = {}
        for getter in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            for proc in self._try(getattr(self._nvml, getter)) or ():
                used = getattr(proc, "usedGpuMemory", None)
                if proc.pid in pids and used is not None:
                    seen[proc.pid] = max(seen.get(proc.pid, 0), int(used))
        return sum(seen.values()) if seen else None


# ------------------------------------------------------------------------------------ host RAM
def rss_bytes(pids: Collection[int]) -> int | None:
    """Resident set size summed over ``pids`` (psutil, else /proc/PID/statm); None if unknown."""
    total, found = 0, False
    for pid in pids:
        n = _rss_of(pid)
        if n is not None:
            total, found = total + n, True
    return total if found else None


def own_rss_bytes() -> int | None:
    """This process's RSS, with the psutil handle kept between calls (a step reads it)."""
    global _OWN_PROCESS
    if _OWN_PROCESS is None or _OWN_PROCESS[0] != os.getpid():  # re-made after a fork
        try:
            import psutil

            _OWN_PROCESS = (os.getpid(), psutil.Process())
        except ImportError:
            _OWN_PROCESS = (os.getpid(), None)
    proc = _OWN_PROCESS[1]
    return _rss_of(os.getpid()) if proc is None else int(proc.memory_info().rss)


_OWN_PROCESS: tuple[int, Any] | None = None


def _rss_of(pid: int) -> int | None:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def host_memory_bytes() -> int | None:
    """Installed RAM (psutil, else sysconf)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (psutil, else a /proc scan); gone processes are skipped."""
    try:
        import psutil
    except ImportError:
        return _process_tree_proc(pid)
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _process_tree_proc(pid: int) -> list[int]:
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                parent_of[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, p in parent_of.items() if p == parent]
        tree += children
        frontier += children
    return tree


# ------------------------------------------------------------------------------------ CUDA
class CudaQuery:
    """The caching allocator's counters for one CUDA device, plus NVML when it is available."""

    can_sample: bool

    def __init__(self, index: int, nvml: Nvml | None = None) -> None:
        import torch

        self._torch = torch
        self.index = index
        self.device = f"cuda:{index}"
        self.name = torch.cuda.get_device_name(index)
        self.total_bytes: int | None = int(torch.cuda.get_device_properties(index).total_memory)
        self._nvml = nvml if nvml is not None else Nvml.open(_nvml_index(torch, index))
        self.can_sample = self._nvml is not None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def tensor_memory(self) -> TensorMemory:
        stats = self._torch.cuda.memory_stats_as_nested_dict(self.index)
        alloc = stats.get("allocated_bytes", {}).get("all", {})
        res = stats.get("reserved_bytes", {}).get("all", {})
        return TensorMemory(
            allocated_bytes=int(alloc.get("current", 0)),
            peak_allocated_bytes=int(alloc.get("peak", 0)),
            reserved_bytes=int(res.get("current", 0)),
            peak_reserved_bytes=int(res.get("peak", 0)),
        )

    def reset_peak(self) -> None:
        if self._torch.cuda.is_initialized():
            self._torch.cuda.reset_peak_memory_stats(self.index)

    def sample(self) -> DeviceSample:
        return NO_SAMPLE if self._nvml is None else self._nvml.sample([os.getpid()])

    def rss_bytes(self) -> int | None:
        return own_rss_bytes()

    def memory_snapshot(self) -> dict[str, Any] | None:
        """The allocator's segments and blocks (with stack frames when the user enabled
        ``torch.cuda.memory._record_memory_history()``)."""
        if not self._torch.cuda.is_initialized():
            return None
        snap: dict[str, Any] = self._torch.cuda.memory._snapshot(self.index)
        return snap


def _nvml_index(torch: Any, index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    try:
        return int(torch.cuda._get_nvml_device_index(index))
    except (AttributeError, RuntimeError, ValueError):
        return index


# ------------------------------------------------------------------------------------ CPU
class CpuQuery:
    """Process RSS and, with ``track_tensors``, exact CPU tensor bytes from a dispatch-mode counter.

    The counter sees storages born while the monitor is entered, and the model's parameters once
    registered (``Monitor(model=...)``) or touched in place (the optimizer step).
    """

    can_sample = False
    device = "cpu"
    total_bytes: int | None = None

    def __init__(self, *, track_tensors: bool = True) -> None:
        import platform

        self.name = platform.processor() or platform.machine() or "cpu"
        self.total_bytes = host_memory_bytes()
        self._counter = _make_counter() if track_tensors else None

    def start(self) -> None:
        if self._counter is not None:
            self._compiled_at_start = _compiled_frames()
            self._counter.__enter__()

    def stop(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)

    def compile_note(self) -> str | None:
        """Says that torch.compile compiled while the tensor counter ran (it compiles as it
        would without memfit, the counter off while compiling: memfit/monitor/counter.py)."""
        if self._counter is None:
            return None
        n = _compiled_frames() - getattr(self, "_compiled_at_start", 0)
        if n <= 0:
            return None
        return (
            f"torch.compile compiled {n} frame(s) during the run; memfit's CPU tensor counter "
            "stepped aside while it compiled (your computation is unchanged) and counts only the "
            "tensors the compiled code makes through PyTorch's dispatcher"
        )

    def counting_problem(self) -> str | None:
        """What the tensor counter could not count, if anything (reported once by the monitor)."""
        c = self._counter
        if c is None or (not c.n_failures and not c.n_skipped):
            return None
        parts = []
        if c.n_skipped:
            parts.append(f"{c.n_skipped} tensors without a storage (e.g. mkldnn) were not counted")
        if c.n_failures:
            first = c.first_failure
            parts.append(
                f"{c.n_failures} ops could not be counted (first: {type(first).__name__}: {first})"
            )
        return "; ".join(parts)

    def track(self, tensors: Any) -> None:
        """Count tensors that already existed when the monitor started (the model's weights)."""
        if self._counter is not None:
            self._counter.label(tensors, "parameters")

    def tensor_memory(self) -> TensorMemory:
        if self._counter is None:
            return TensorMemory(
                allocated_bytes=0, peak_allocated_bytes=0, reserved_bytes=0, peak_reserved_bytes=0
            )
        now, peak = self._counter.current_bytes, self._counter.peak_bytes
        return TensorMemory(
            allocated_bytes=now,
            peak_allocated_bytes=peak,
            reserved_bytes=now,
            peak_reserved_bytes=peak,
        )

    def reset_peak(self) -> None:
        if self._counter is not None:
            self._counter.peak_bytes = self._counter.current_bytes

    def sample(self) -> DeviceSample:
        return NO_SAMPLE

    def rss_bytes(self) -> int | None:
        return own_rss_bytes()

    def memory_snapshot(self) -> dict[str, Any] | None:
        return None


def _compiled_frames() -> int:
    from memfit.monitor.counter import compiled_frames

    return compiled_frames()


def _make_counter() -> Any:
    """The monitor's tensor counter (memfit/monitor/counter.py: guarded, bounded, every layout)."""
    from memfit.monitor.counter import TensorCounter

    return TensorCounter(round_to=ALLOCATOR_ROUND_BYTES)


def open_device(device: str | DeviceQuery | None) -> DeviceQuery:
    """``None``: the current CUDA device when CUDA is available, else the CPU; ``"cuda:1"``,
    ``"cpu"``; or a ready :class:`DeviceQuery` (tests pass fakes)."""
    if device is not None and not isinstance(device, str):
        return device
    import torch

    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaQuery(dev.index if dev.index is not None else torch.cuda.current_device())
    if dev.type == "cpu":
        return CpuQuery()

    raise SpecError(f"device {device!r} is not supported by the monitor: use 'cuda:N' or 'cpu'")

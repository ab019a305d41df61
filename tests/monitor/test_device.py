"""The device-query layer itself: NVML readings (through a stand-in pynvml), RSS, process trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from memfit.monitor import device
from memfit.monitor.device import Nvml, process_tree, rss_bytes


class FakePynvml:
    """The handful of pynvml calls Nvml makes; graphics processes are NotSupported here."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, util_supported: bool = True) -> None:
        self.util_supported = util_supported

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=150_000_000_000, used=40_000_000_000)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        if not self.util_supported:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=87)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=10, usedGpuMemory=1000),
            SimpleNamespace(pid=11, usedGpuMemory=2000),
            SimpleNamespace(pid=99, usedGpuMemory=5000),  # someone else's job
            SimpleNamespace(pid=12, usedGpuMemory=None),  # not attributable (WDDM)
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        raise self.NVMLError("Not Supported")


def test_nvml_sums_the_watched_pids_and_reads_the_device() -> None:
    nvml = Nvml(FakePynvml(), 0)
    assert nvml.name == "NVIDIA H200" and nvml.total_bytes == 150_000_000_000
    s = nvml.sample({10, 11})
    assert s.process_used_bytes == 3000
    assert s.device_used_bytes == 40_000_000_000 and s.utilization_pct == 87.0


def test_nvml_says_unknown_rather_than_zero() -> None:
    nvml = Nvml(FakePynvml(util_supported=False), 0)
    s = nvml.sample({12, 13})  # in a container the driver sees other pids
    assert s.process_used_bytes is None and s.utilization_pct is None


def test_without_a_driver_nvml_is_absent() -> None:
    if Nvml.open(0) is not None:
        pytest.skip("this machine has an NVIDIA driver")
    assert Nvml.device_count() == 0


def test_rss_and_the_process_tree_of_a_real_child() -> None:
    code = "import subprocess, time; subprocess.Popen(['sleep', '5']); time.sleep(5)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(tree := process_tree(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree[0] == child.pid and len(tree) == 2
        assert sorted(device._process_tree_proc(child.pid)) == sorted(tree)  # no-psutil path
        assert rss_bytes(tree) > rss_bytes([child.pid]) > 0
    finally:
        for pid in reversed(process_tree(child.pid)):
            os.kill(pid, 9)
        child.wait()


def test_own_rss_matches_statm() -> None:
    with open("/proc/self/statm") as f:
        statm = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    own = device.own_rss_bytes()
    assert own is not None
    assert abs(own - statm) < 64 * 2**20

"""The capacity every verdict judges against: the torch-visible total where published, else an
estimate below ``memory.total`` (memfit.hardware.gpu, docs/accuracy.md "GPU capacity")."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.hardware import get_gpu, list_gpus
from memfit.hardware.gpu import (
    ESTIMATED_RESERVED_MIN_BYTES,
    ESTIMATED_RESERVED_MIN_FRACTION,
    GPU,
)
from memfit.serving.startup import vllm_total_bytes
from memfit.units import GiB, MiB

#: ``round(total_memory / 1024**3, 3)`` as the Unsloth notebooks print it (most common output per
#: GPU; unslothai/notebooks@bdda2efc, docs/accuracy.md) and vLLM's logged total for the H100.
PUBLISHED_TORCH_TOTAL_GIB = {
    "T4": 14.563,
    "L4": 22.161,
    "A10G": 22.184,
    "A100-40GB": 39.494,
    "A100-80GB": 79.251,
    "H100-80GB": 79.19,
}


@pytest.mark.parametrize(("name", "gib"), sorted(PUBLISHED_TORCH_TOTAL_GIB.items()))
def test_capacity_is_the_published_torch_visible_total(name, gib):
    gpu = get_gpu(name)
    assert gpu.capacity_measured
    assert round(gpu.capacity_bytes / GiB, 3 if gib * 1000 % 10 else 2) == gib


def test_no_verdict_judges_against_the_raw_nvidia_smi_total():
    for gpu in list_gpus():
        assert gpu.capacity_bytes < gpu.memory_bytes, gpu.name


def test_the_estimate_rule_is_the_catalogs_own_extremes():
    """Largest observed reservation and smallest observed share of memory.total. V100 rows are left
    out of the share: their memory.total is an old driver's, already net of the reservation."""
    measured = [g for g in list_gpus() if g.capacity_measured]
    assert len(measured) >= 15
    assert max(g.driver_reserved_bytes for g in measured) == ESTIMATED_RESERVED_MIN_BYTES
    shares = [g.driver_reserved_bytes / g.memory_bytes for g in measured if g.arch != "volta"]
    assert min(shares) == ESTIMATED_RESERVED_MIN_FRACTION


def test_an_unmeasured_gpu_loses_the_larger_of_the_two_bounds():
    h100_pcie, b200 = get_gpu("H100-PCIe"), get_gpu("B200")
    assert not h100_pcie.capacity_measured and not b200.capacity_measured
    assert h100_pcie.memory_bytes - h100_pcie.capacity_bytes == ESTIMATED_RESERVED_MIN_BYTES
    assert 81920 * MiB - int(79.251 * GiB) == ESTIMATED_RESERVED_MIN_BYTES  # A100-80GB, 766 MiB
    share = b200.memory_bytes - b200.capacity_bytes
    assert share > ESTIMATED_RESERVED_MIN_BYTES
    assert share == pytest.approx(b200.memory_bytes * 616 / 143771, abs=1)  # H200's 0.43 %


def test_vllm_reads_the_same_capacity_and_keeps_the_h100_total_of_its_logs():
    for gpu in list_gpus():
        assert vllm_total_bytes(gpu) == gpu.capacity_bytes, gpu.name
    assert vllm_total_bytes(get_gpu("H100-80GB")) == int(79.19 * GiB)


def test_every_observed_reservation_names_its_source():
    for gpu in list_gpus():
        assert (gpu.capacity_source is not None) == gpu.capacity_measured, gpu.name


def _row(**fields):
    base = {
        "name": "X",
        "aliases": (),
        "memory_bytes": 16 * GiB,
        "vendor": "nvidia",
        "arch": "ampere",
        "compute_capability": (8, 0),
        "memory_bandwidth_gbps": None,
        "bf16_dense_tflops": None,
        "supports_bf16": True,
        "supports_fp8": False,
        "source": "https://example.com",
    }
    return GPU(**(base | fields))


def test_a_reservation_without_its_source_is_refused():
    with pytest.raises(SpecError, match=r"X: driver_reserved_bytes and capacity_source go"):
        _row(driver_reserved_bytes=300 * MiB)


def test_a_reservation_of_the_whole_memory_is_refused():
    with pytest.raises(SpecError, match=r"driver_reserved_bytes \(17179869184\) must be in \[0, "):
        _row(driver_reserved_bytes=16 * GiB, capacity_source="a log")

"""Device overhead: context estimates with ranges, workspaces in the caching allocator."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.hardware import device_overhead
from memfit.hardware.catalog import ARCHS, list_gpus
from memfit.hardware.overhead import OVERHEAD_TABLE
from memfit.units import KiB, MiB


def test_every_architecture_has_an_ordered_context_range():
    assert set(OVERHEAD_TABLE) == set(ARCHS)
    for arch in ARCHS:
        overhead = device_overhead(arch, training=True)
        assert 0 < overhead.cuda_context_low_bytes <= overhead.cuda_context_bytes
        assert overhead.cuda_context_bytes <= overhead.cuda_context_high_bytes <= 2048 * MiB
        assert overhead.source, arch


def test_every_catalog_gpu_has_an_overhead_row():
    for gpu in list_gpus():
        assert device_overhead(gpu.arch, training=False).n_cublas_handles == 1


def test_hopper_and_blackwell_use_32_mib_cublas_workspaces():
    assert device_overhead("hopper", training=True).cublas_workspace_bytes == 32 * MiB
    assert device_overhead("blackwell", training=True).cublas_workspace_bytes == 32 * MiB


def test_older_gpus_use_the_4096_2_16_8_workspace_default():
    overhead = device_overhead("ampere", training=True)
    assert overhead.cublas_workspace_bytes == (2 * 4096 + 8 * 16) * KiB == 8_519_680


def test_training_uses_a_second_handle_for_the_autograd_thread():
    train = device_overhead("hopper", training=True)
    infer = device_overhead("hopper", training=False)
    assert (train.n_cublas_handles, infer.n_cublas_handles) == (2, 1)
    assert train.workspace_bytes == 2 * infer.workspace_bytes == 2 * (32 + 1) * MiB
    assert train.total_bytes == train.cuda_context_bytes + train.workspace_bytes


def test_workspaces_count_in_reserved_so_only_the_context_is_outside_the_allocator():
    overhead = device_overhead("hopper", training=True)
    assert overhead.workspaces_in_allocator
    assert overhead.outside_allocator_bytes == overhead.cuda_context_bytes
    assert overhead.workspace_allocations == (32 * MiB, 1 * MiB, 32 * MiB, 1 * MiB)


def test_no_architecture_means_a_generic_ampere_default():
    assert device_overhead(None, training=False) == device_overhead("ampere", training=False)


def test_architecture_names_are_case_insensitive():
    assert device_overhead("Hopper", training=True) == device_overhead("hopper", training=True)


def test_unknown_architecture_lists_the_known_ones():
    with pytest.raises(SpecError, match=r"unknown GPU architecture 'kepler': use one of volta, "):
        device_overhead("kepler", training=True)

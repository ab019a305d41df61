"""CUDA's reduction staging blocks (``gpu_reduce_kernel``), against an H200's allocation history."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.estimate.cuda_reduce import (
    DEFAULT_DEVICE,
    ReduceDevice,
    device_for,
    reduce_device,
    reduce_staging_bytes,
)
from memfit.hardware.catalog import get_gpu

H200 = ReduceDevice(n_sms=132, max_threads_per_sm=2048)
TRACES = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_h200_alloc_traces.tgz"
)


def _staging_pairs(case: str) -> Counter[tuple[int, int]]:
    """(buffer, semaphores) request sizes of every allocation directly followed by another in the
    real history (``gpu_reduce_kernel`` allocates its buffer, then its semaphores)."""
    with tarfile.open(TRACES) as tar:
        member = tar.extractfile(f"./{case}.alloc.json")
        assert member is not None
        events = json.load(io.TextIOWrapper(member))
    return Counter(
        (a[2], b[2]) for a, b in zip(events, events[1:], strict=False) if a[0] == b[0] == "a"
    )


def test_bias_gradients_take_the_staging_blocks_the_h200_allocated() -> None:
    # BERT-base, 32 x 512 tokens, 12 layers, 2 steps: per layer five 768-wide biases (q, k, v,
    # attention output, output dense) and one 3072-wide (intermediate dense)
    real = _staging_pairs("bert-train-seqcls")
    narrow = reduce_staging_bytes((32 * 512, 768), (0,), device=H200)
    wide = reduce_staging_bytes((32, 512, 3072), (0, 1), device=H200)
    assert narrow == (100663296, 24) and wide == (138412032, 96)
    assert real[narrow] == 5 * 12 * 2
    assert real[wide] == 12 * 2


def test_rmsnorm_weight_gradients_take_the_staging_blocks_the_h200_allocated() -> None:
    # Llama-3.2-1B, 2 x 1024 tokens, hidden 2048: two RMSNorms per layer (16) plus the final one
    real = _staging_pairs("llama1b-train-bf16")
    staging = reduce_staging_bytes((2, 1024, 2048), (0, 1), device=H200)
    assert staging == (33554432, 64)
    assert real[staging] == (2 * 16 + 1) * 2


def test_reductions_that_fit_one_block_per_output_allocate_nothing() -> None:
    assert reduce_staging_bytes((2, 1024, 2048), (2,), device=H200) == (0, 0)  # mean(-1)
    assert reduce_staging_bytes((128, 64), (0,), device=H200) == (0, 0)  # few rows


def test_the_staging_grows_with_the_sm_count_until_the_rows_bound_it() -> None:
    a100 = device_for(get_gpu("A100-80GB"))
    assert a100 == DEFAULT_DEVICE
    # 3072 outputs: ctas_per_output = ceil(SMs x 16 / 24 blocks) -> 72 on an A100, 88 on an H200
    assert reduce_staging_bytes((16384, 3072), (0,), device=a100)[0] == 4 * 3072 * 72 * 128
    # 768 outputs: ceil(rows / 4 / 16) = 256 blocks per output on both
    assert reduce_staging_bytes((16384, 768), (0,), device=a100)[0] == 4 * 768 * 256 * 128


def test_the_current_device_follows_the_gpu_and_rocm_has_no_rule() -> None:
    with reduce_device(get_gpu("H200")):
        assert reduce_staging_bytes((16384, 3072), (0,))[0] == 138412032
    with reduce_device(get_gpu("MI300X")):
        assert reduce_staging_bytes((16384, 3072), (0,)) == (0, 0)


def test_a_device_without_sms_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"n_sms \(0\) must be a positive integer"):
        ReduceDevice(n_sms=0, max_threads_per_sm=2048)

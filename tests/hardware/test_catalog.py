"""The GPU catalog: lookups by any spelling, helpful errors, and rows that hold together."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError, UnknownGPUError
from memfit.hardware import GPU, get_gpu, list_gpus
from memfit.hardware.catalog import ARCHS
from memfit.units import GiB, MiB

REQUIRED = (
    *("V100-16GB", "V100-32GB", "T4", "A10G", "A10", "A2", "A30", "A40", "A100-40GB", "A100-80GB"),
    *("RTX-3090", "RTX-4090", "RTX-5090", "RTX-6000-Ada", "L4", "L40S", "H100-80GB", "H100-PCIe"),
    *("H200", "B200", "MI300X"),
)


def test_catalog_holds_every_required_gpu():
    names = [gpu.name for gpu in list_gpus()]
    assert set(REQUIRED) <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100 80gb", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("nvidia a100-sxm4-40gb", "A100-40GB"),
        ("h100", "H100-80GB"),
        ("H100", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("h100_pcie", "H100-PCIe"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("rtx4090", "RTX-4090"),
        ("Tesla T4", "T4"),
        ("rtx 6000 ada", "RTX-6000-Ada"),
        ("NVIDIA H200", "H200"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_lookup_ignores_case_spaces_dashes_and_vendor_words(spelling, name):
    assert get_gpu(spelling).name == name


def test_unknown_gpu_error_lists_close_matches_and_the_next_step():
    with pytest.raises(
        UnknownGPUError, match=r"unknown GPU 'A1000': did you mean A100-40GB, A100-80GB"
    ) as info:
        get_gpu("A1000")
    assert info.value.close_matches[:2] == ["A100-40GB", "A100-80GB"]
    assert "run `memfit gpus` for the list" in str(info.value)


def test_ambiguous_family_name_suggests_each_member():
    with pytest.raises(
        UnknownGPUError, match=r"unknown GPU 'a100': did you mean A100-40GB, A100-80GB\?"
    ):
        get_gpu("a100")


def test_name_with_nothing_close_still_says_where_the_list_is():
    with pytest.raises(
        UnknownGPUError, match=r"^unknown GPU 'zzz': run `memfit gpus` for the list$"
    ) as info:
        get_gpu("zzz")
    assert info.value.close_matches == []


def test_unknown_gpu_error_is_a_lookup_error():
    with pytest.raises(LookupError, match="unknown GPU"):
        get_gpu("tpu-v5")


def test_no_alias_names_two_gpus():
    from memfit.hardware.catalog import _normalize

    seen: dict[str, str] = {}
    for gpu in list_gpus():
        for spelling in (gpu.name, *gpu.aliases):
            key = _normalize(spelling)
            assert seen.setdefault(key, gpu.name) == gpu.name, spelling


def test_every_row_is_sourced_and_within_sane_bounds():
    for gpu in list_gpus():
        assert gpu.source.startswith("https://"), gpu.name
        assert gpu.arch in ARCHS
        assert gpu.memory_bytes % MiB == 0, gpu.name
        assert 14 * GiB <= gpu.memory_bytes <= 200 * GiB, gpu.name
        assert gpu.supports_bf16 == (gpu.arch not in ("volta", "turing")), gpu.name
        assert gpu.supports_fp8 == (gpu.arch in ("ada", "hopper", "blackwell", "cdna3")), gpu.name
        if gpu.bf16_dense_tflops is not None:
            assert gpu.supports_bf16 and 10 < gpu.bf16_dense_tflops < 5000, gpu.name
        if gpu.vendor == "nvidia":
            assert gpu.compute_capability is not None, gpu.name


def test_reported_memory_is_below_the_marketing_size_for_gddr_with_ecc():
    assert get_gpu("A10").memory_bytes == 23028 * MiB < 24 * GiB
    assert get_gpu("A100-80GB").memory_bytes == 80 * GiB
    assert get_gpu("H100").memory_bytes == 81559 * MiB


def test_cuda_visible_memory_subtracts_the_measured_driver_reservation():
    assert get_gpu("H200").cuda_visible_bytes == 150_109_880_320 // MiB * MiB
    assert get_gpu("A100-80GB").cuda_visible_bytes is None


def test_gpu_rows_are_validated_with_every_problem_named():
    with pytest.raises(SpecError, match=r"2 problems: X: memory_bytes \(0\) must be > 0; X: arch"):
        GPU(
            name="X",
            aliases=(),
            memory_bytes=0,
            vendor="nvidia",
            arch="kepler",
            compute_capability=(3, 5),
            memory_bandwidth_gbps=None,
            bf16_dense_tflops=None,
            supports_bf16=False,
            supports_fp8=False,
            source="https://example.com",
        )


def test_hardware_and_allocator_modules_import_without_torch():
    import os
    import subprocess
    import sys

    code = (
        "import sys, memfit.hardware, memfit.estimate.trace.allocator; "
        "sys.exit('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0

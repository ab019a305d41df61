"""The GPU catalog: lookups by any spelling, helpful errors, and rows that hold together."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError, UnknownGPUError
from memfit.hardware import GPU, get_gpu, list_gpus
from memfit.hardware.catalog import ARCHS, FORM_FACTORS, TENSOR_PRECISIONS
from memfit.units import GiB, MiB

REQUIRED = (
    *("V100-16GB", "V100-32GB", "T4", "A10G", "A10", "A2", "A30", "A40", "A100-40GB", "A100-80GB"),
    *("RTX-3090", "RTX-4090", "RTX-5090", "RTX-6000-Ada", "L4", "L40S", "H100-80GB", "H100-PCIe"),
    *("H200", "B200", "MI300X"),
)


def test_catalog_holds_every_required_gpu_and_at_least_25_rows():
    names = [gpu.name for gpu in list_gpus()]
    assert set(REQUIRED) <= set(names)
    assert len(names) == len(set(names))
    assert len(names) >= 25


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
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA RTX A5000", "RTX-A5000"),
        ("NVIDIA GeForce RTX 4080", "RTX-4080"),
        ("AMD Instinct MI325X", "MI325X"),
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
        UnknownGPUError,
        match=r"unknown GPU 'a100': did you mean A100-40GB, A100-80GB, A100-PCIe-40GB, "
        r"A100-PCIe-80GB\?",
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
        assert 12 * GiB <= gpu.memory_bytes <= 300 * GiB, gpu.name  # RTX 3060: 12 GiB
        assert gpu.supports_bf16 == (gpu.arch not in ("volta", "turing")), gpu.name
        fp8_archs = ("ada", "hopper", "blackwell", "cdna3", "cdna4")
        assert gpu.supports_fp8 == (gpu.arch in fp8_archs), gpu.name
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
    assert get_gpu("A100-80GB").cuda_visible_bytes == int(79.251 * GiB)  # notebook outputs (2026)
    assert get_gpu("B200").cuda_visible_bytes is None  # nobody published B200's torch total


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


RATE_FIELDS = (
    "bf16_dense_tflops",
    "fp16_dense_tflops",
    "fp8_dense_tflops",
    "int8_dense_tops",
    "fp32_tflops",
)


def test_rates_and_links_are_in_sane_units():
    for gpu in list_gpus():
        if gpu.rate_source is not None:
            assert gpu.rate_source.startswith("https://"), gpu.name
        if gpu.memory_bandwidth_gbps is not None:  # GB/s, not TB/s or bytes/s
            assert 100 <= gpu.memory_bandwidth_gbps <= 10_000, gpu.name
        for field in RATE_FIELDS:
            value = getattr(gpu, field)
            assert value is None or 1 <= value <= 10_000, (gpu.name, field)
        if gpu.interconnect_gbps is not None:  # PCIe 3.0 x16 (32) up to NVLink 5 (1800)
            assert 16 <= gpu.interconnect_gbps <= 2000, gpu.name
            assert gpu.interconnect and f"{gpu.interconnect_gbps:g} GB/s" in gpu.interconnect
        assert gpu.form_factor is None or gpu.form_factor in FORM_FACTORS, gpu.name
        assert gpu.tdp_w is None or 40 <= gpu.tdp_w <= 1500, gpu.name


def test_tensor_rates_exceed_fp32_and_fp16_matches_bf16():
    for gpu in list_gpus():
        if gpu.bf16_dense_tflops is not None and gpu.fp32_tflops is not None:
            assert gpu.bf16_dense_tflops >= gpu.fp32_tflops, gpu.name
        if gpu.bf16_dense_tflops is not None:  # every vendor here quotes one rate for both
            assert gpu.fp16_dense_tflops == gpu.bf16_dense_tflops, gpu.name
        if gpu.int8_dense_tops is not None and gpu.fp16_dense_tflops is not None:
            assert gpu.int8_dense_tops >= gpu.fp16_dense_tflops, gpu.name


def test_dense_fp8_is_twice_dense_bf16_where_vendors_publish_both():
    # The datasheets round independently: the L40S's 733 / 362.05 is 2.02.
    checked = []
    for gpu in list_gpus():
        if gpu.fp8_dense_tflops is not None and gpu.bf16_dense_tflops is not None:
            assert gpu.fp8_dense_tflops == pytest.approx(2 * gpu.bf16_dense_tflops, rel=0.03)
            checked.append(gpu.arch)
    assert {"ada", "hopper", "blackwell", "cdna3"} <= set(checked)


def test_dense_rates_are_half_the_sparse_datasheet_figures():
    assert get_gpu("H100").bf16_dense_tflops == pytest.approx(1979 / 2, abs=0.15)
    assert get_gpu("H100").fp8_dense_tflops == 3958 / 2
    assert get_gpu("L4").fp8_dense_tflops == 485 / 2
    assert get_gpu("B200").fp8_dense_tflops == 72_000 / 8 / 2


def test_precisions_follow_the_architecture():
    assert get_gpu("V100-32GB").precisions == ("fp32", "fp16")
    assert get_gpu("T4").precisions == ("fp32", "fp16", "int8")
    assert "bf16" in get_gpu("A100-80GB").precisions
    assert "fp8" not in get_gpu("A100-80GB").precisions
    assert "fp8" in get_gpu("L4").precisions and "fp8" in get_gpu("MI300X").precisions
    for gpu in list_gpus():
        formats = TENSOR_PRECISIONS[gpu.arch]
        assert gpu.supports_fp8 == ("fp8" in formats), gpu.name
        assert gpu.fp8_dense_tflops is None or gpu.supports_fp8, gpu.name
        assert gpu.int8_dense_tops is None or "int8" in formats, gpu.name


def test_sxm_parts_talk_over_nvlink_and_pcie_cards_over_pcie():
    assert get_gpu("H100").interconnect_gbps == 900
    assert get_gpu("B200").interconnect_gbps == 1800
    assert get_gpu("A100-80GB").interconnect_gbps == 600
    assert get_gpu("A100-PCIe-80GB").interconnect_gbps == 64  # the NVLink bridge joins pairs
    assert get_gpu("H100-NVL").interconnect_gbps == 128
    assert get_gpu("MI300X").interconnect_gbps == 7 * 128


def _row(**overrides):
    fields = dict(
        name="X",
        aliases=(),
        memory_bytes=1,
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1000.0,
        bf16_dense_tflops=100.0,
        supports_bf16=True,
        supports_fp8=False,
        source="https://example.com",
    )
    return GPU(**{**fields, **overrides})


def test_a_rate_the_architecture_cannot_run_is_rejected():
    with pytest.raises(
        SpecError, match=r"X: fp8_dense_tflops \(200.0\) must be None: ampere has no fp8 tensor"
    ):
        _row(fp8_dense_tflops=200.0)
    with pytest.raises(SpecError, match=r"X: bf16_dense_tflops \(100.0\) must be None: volta"):
        _row(arch="volta", supports_bf16=False)


def test_precision_flags_must_agree_with_the_architecture():
    with pytest.raises(SpecError, match=r"X: supports_fp8 \(True\) disagrees with arch ampere"):
        _row(supports_fp8=True)


def test_rates_links_and_power_must_be_positive_and_named():
    with pytest.raises(SpecError, match=r"X: memory_bandwidth_gbps \(0.0\) must be > 0"):
        _row(memory_bandwidth_gbps=0.0)
    with pytest.raises(SpecError, match=r"X: interconnect_gbps needs interconnect"):
        _row(interconnect_gbps=64.0)
    with pytest.raises(SpecError, match=r"X: form_factor \('mxm'\) must be one of sxm, pcie"):
        _row(form_factor="mxm")
    with pytest.raises(SpecError, match=r"X: tdp_w \(-1\) must be > 0"):
        _row(tdp_w=-1)
    with pytest.raises(SpecError, match=r"X: rate_source \('www.nvidia.com'\) must be an https"):
        _row(rate_source="www.nvidia.com")


def test_gpus_table_shows_rates_within_100_columns(capsys):
    from memfit.cli import main

    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        *("name", "capacity", "arch", "mem", "GB/s", "bf16", "TF", "fp8", "TF"),
        *("link", "GB/s", "form", "$/h", "plan"),
    ]
    assert max(len(line) for line in lines) <= 100
    h100 = next(line for line in lines if line.startswith("H100-80GB "))
    assert h100.split()[1:] == [
        *("79.2", "GiB", "hopper", "3350", "989", "1979", "900", "sxm", "3.78", "yes")
    ]  # capacity: vLLM's logged 79.19 GiB, not nvidia-smi's 79.65
    rows = [line for line in lines[1:] if not line.startswith(("note:", "  "))]
    assert len(rows) == len(list_gpus())
    assert all(line.endswith(" yes") for line in rows)  # every GPU listed can be planned


def test_gpus_json_prints_every_field(capsys):
    import dataclasses
    import json

    from memfit.cli import main

    assert main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    extra = {"price", "plan_ready", "plan_not_ready_reason", "capacity_bytes", "capacity_measured"}
    assert set(rows[0]) == {field.name for field in dataclasses.fields(GPU)} | extra
    l40s = next(row for row in rows if row["name"] == "L40S")
    assert (l40s["fp8_dense_tflops"], l40s["interconnect_gbps"], l40s["tdp_w"]) == (733, 64, 350)
    assert l40s["price"]["source"].startswith("https://") and l40s["price"]["as_of"]
    assert all(row["plan_ready"] for row in rows)


def test_gpus_with_a_bad_price_file_is_one_line_and_exit_2(tmp_path, capsys):
    from memfit.cli import main

    bad = tmp_path / "prices.json"
    bad.write_text('{"H100": -2}')
    assert main(["gpus", "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usd_per_hour (-2) must be > 0" in err
    good = tmp_path / "ok.json"
    good.write_text('{"H100": 2.25}')
    assert main(["gpus", "--prices", str(good)]) == 0
    out = capsys.readouterr().out
    assert next(x for x in out.splitlines() if x.startswith("H100-80GB ")).split()[-2] == "2.25"


def test_hardware_and_allocator_modules_import_without_torch():
    import os
    import subprocess
    import sys

    code = (
        "import sys, memfit.hardware, memfit.estimate.allocator.caching; "
        "sys.exit('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0

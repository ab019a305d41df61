"""The data-centre GPUs large training runs use: memory as the framework sees it, fp4 support
following the architecture, and the scale-up fabric (issue 30)."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.hardware import GPU, get_gpu, list_gpus
from memfit.hardware.catalog import TENSOR_PRECISIONS
from memfit.units import GiB


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA B300 SXM6 AC", "B300"),  # torch.cuda.get_device_name() on a B300
        ("NVIDIA GB300", "GB300"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA GB200", "GB200"),
    ],
)
def test_new_data_centre_gpus_are_found_by_their_device_names(spelling: str, name: str) -> None:
    assert get_gpu(spelling).name == name


def test_memory_is_the_marketed_size_as_the_runtime_reports_it_in_gib() -> None:
    # ROCm reports 192 GB as 191.98 GiB, 256 GB as 255.98 GiB; 288 GB the same way
    assert get_gpu("MI355X").memory_bytes / GiB == pytest.approx(287.98, abs=0.01)
    assert get_gpu("MI300X").memory_bytes / GiB == pytest.approx(191.98, abs=0.01)
    # B300 holds 1.5x the B200's HBM3e
    assert get_gpu("B300").memory_bytes == pytest.approx(1.5 * get_gpu("B200").memory_bytes, 1e-5)


def test_fp4_follows_the_architecture_on_every_row() -> None:
    for gpu in list_gpus():
        assert gpu.supports_fp4 == ("fp4" in TENSOR_PRECISIONS[gpu.arch]), gpu.name
    assert {g.name for g in list_gpus() if g.supports_fp4} >= {"B200", "B300", "GB300", "MI355X"}
    assert not get_gpu("MI300X").supports_fp4 and not get_gpu("H100").supports_fp4


def test_scale_up_domains_are_8_gpu_platforms_or_nvl72_racks() -> None:
    assert get_gpu("GB200").scale_up_gpus == get_gpu("GB300").scale_up_gpus == 72
    for name in ("B200", "B300", "MI300X", "MI325X", "MI355X"):
        assert get_gpu(name).scale_up_gpus == 8, name
    assert get_gpu("MI355X").interconnect_gbps == pytest.approx(7 * 153.6)


def test_a_row_claiming_fp4_on_hopper_is_refused() -> None:
    h100 = get_gpu("H100")
    fields = {f: getattr(h100, f) for f in h100.__dataclass_fields__}
    fields.update(name="H100-fp4", supports_fp4=True)
    with pytest.raises(SpecError, match=r"supports_fp4 \(True\) disagrees with arch hopper"):
        GPU(**fields)

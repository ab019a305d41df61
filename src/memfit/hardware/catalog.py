"""GPUs as data: memory, architecture, headline rates and links, each row with its vendor source.

Memory
------
``memory_bytes`` is the total that ``nvidia-smi`` prints (``memory.total``), not the marketing
size: HBM parts report their full binary size (A100-80GB: 81920 MiB), GDDR parts with ECC on
report less (A10: 23028 MiB with ECC on, 24564 MiB with it off). Each value is one seen in
published ``nvidia-smi`` output; where none was found the comment says how it was derived.
On recent drivers CUDA (``cudaMemGetInfo``, ``torch.cuda.get_device_properties().total_memory``)
sees ``memory.total`` minus ``memory.reserved``: measured on an H200 (driver 580.159.04, torch
2.11): 143771 - 616 = 143155 MiB (torch: 150,109,880,320 B). ``driver_reserved_bytes`` holds
that reservation where it was measured.

Rates
-----
All from the vendor datasheet or architecture whitepaper named in ``source`` (or ``rate_source``
where the rates, power and links come from a second document); None where the vendor publishes
none or the GPU lacks the unit.

- ``memory_bandwidth_gbps``: peak memory bandwidth in GB/s (10^9 B/s).
- ``bf16_dense_tflops``, ``fp16_dense_tflops``, ``fp8_dense_tflops``: tensor-core TFLOPS,
  **dense** (no 2:4 sparsity) with **FP32 accumulate**. Datasheets mostly print the sparse
  figure (marked "with sparsity"); those are halved here and the comment says so. GeForce cards
  run FP32-accumulate tensor math at half their FP16-accumulate rate; the whitepapers list both
  and the FP32-accumulate one is kept. ``int8_dense_tops``: dense INT8 tensor TOPS.
- ``fp32_tflops``: FP32 on the CUDA cores / vector units (no tensor cores, no TF32).
- ``supports_bf16`` / ``supports_fp8`` follow the architecture (``TENSOR_PRECISIONS``): bf16
  tensor cores from Ampere and CDNA2, fp8 from Ada, Hopper and CDNA3; rows are checked against it.

Links
-----
``interconnect`` names the links in words; ``interconnect_gbps`` is the GPU-to-GPU bandwidth, in
GB/s, that every GPU of a multi-GPU server has, as vendors quote it (both directions together):
NVLink through NVSwitch for SXM parts, Infinity Fabric for OAM parts, PCIe for PCIe cards. NVLink
*bridges* join only pairs (or fours) of PCIe cards, so they are named in ``interconnect`` but not
counted. PCIe x16 link rates as NVIDIA's datasheets state them: Gen3 32, Gen4 64, Gen5 128 GB/s.
A communication model that wants one direction halves ``interconnect_gbps``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from memfit.errors import SpecError, UnknownGPUError
from memfit.units import MiB

ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna3")
VENDORS = ("nvidia", "amd")
FORM_FACTORS = ("sxm", "pcie", "oam", "superchip")

#: Number formats the tensor cores / matrix cores of each architecture run (FP32 always runs on
#: the CUDA cores). Volta: fp16 tensor cores only (V100 datasheet); Turing adds int8 (T4
#: datasheet); Ampere adds bf16 (A100 datasheet); Ada and Hopper add fp8 (Ada whitepaper, H100
#: datasheet); Blackwell keeps them (and adds fp4/fp6, not modelled); CDNA3: fp16, bf16, fp8, int8
#: (MI300X datasheet).
TENSOR_PRECISIONS: dict[str, tuple[str, ...]] = {
    "volta": ("fp16",),
    "turing": ("fp16", "int8"),
    "ampere": ("fp16", "bf16", "int8"),
    "ada": ("fp16", "bf16", "fp8", "int8"),
    "hopper": ("fp16", "bf16", "fp8", "int8"),
    "blackwell": ("fp16", "bf16", "fp8", "int8"),
    "cdna3": ("fp16", "bf16", "fp8", "int8"),
}

#: Rate fields, the precision each needs (None: always available), for validation.
_RATE_FIELDS: tuple[tuple[str, str | None], ...] = (
    ("memory_bandwidth_gbps", None),
    ("fp32_tflops", None),
    ("fp16_dense_tflops", "fp16"),
    ("bf16_dense_tflops", "bf16"),
    ("fp8_dense_tflops", "fp8"),
    ("int8_dense_tops", "int8"),
    ("interconnect_gbps", None),
)


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One GPU model. ``name`` is canonical ("A100-80GB"); ``aliases`` are other spellings,
    including the device name torch and nvidia-smi print ("NVIDIA A100-SXM4-80GB")."""

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    vendor: str
    arch: str
    compute_capability: tuple[int, int] | None
    memory_bandwidth_gbps: float | None
    bf16_dense_tflops: float | None
    supports_bf16: bool
    supports_fp8: bool
    source: str
    driver_reserved_bytes: int | None = None  # nvidia-smi memory.reserved, where measured
    fp16_dense_tflops: float | None = None
    fp8_dense_tflops: float | None = None
    int8_dense_tops: float | None = None
    fp32_tflops: float | None = None
    interconnect: str | None = None
    interconnect_gbps: float | None = None
    form_factor: str | None = None
    tdp_w: int | None = None
    rate_source: str | None = None  # where rates, power or links are not in ``source``

    def __post_init__(self) -> None:
        problems = []
        if self.memory_bytes <= 0:
            problems.append(f"{self.name}: memory_bytes ({self.memory_bytes}) must be > 0")
        if self.arch not in ARCHS:
            problems.append(f"{self.name}: arch ({self.arch!r}) must be one of {', '.join(ARCHS)}")
        if self.vendor not in VENDORS:
            problems.append(f"{self.name}: vendor ({self.vendor!r}) must be one of {VENDORS}")
        for field_name in ("source", "rate_source"):
            url = getattr(self, field_name)
            if url is not None and not url.startswith("https://"):
                problems.append(f"{self.name}: {field_name} ({url!r}) must be an https:// URL")
        problems += self._rate_problems()
        if self.form_factor is not None and self.form_factor not in FORM_FACTORS:
            problems.append(
                f"{self.name}: form_factor ({self.form_factor!r}) must be one of "
                f"{', '.join(FORM_FACTORS)}"
            )
        if self.tdp_w is not None and self.tdp_w <= 0:
            problems.append(f"{self.name}: tdp_w ({self.tdp_w}) must be > 0")
        if self.interconnect_gbps is not None and not self.interconnect:
            problems.append(f"{self.name}: interconnect_gbps needs interconnect (the link's name)")
        if problems:
            raise SpecError.from_problems(problems)

    def _rate_problems(self) -> list[str]:
        """Rates are positive and present only for formats the architecture's tensor cores run;
        ``supports_bf16`` / ``supports_fp8`` agree with the architecture."""
        problems = []
        formats = TENSOR_PRECISIONS.get(self.arch)
        for flag, fmt in (("supports_bf16", "bf16"), ("supports_fp8", "fp8")):
            if formats is not None and getattr(self, flag) != (fmt in formats):
                problems.append(
                    f"{self.name}: {flag} ({getattr(self, flag)}) disagrees with arch "
                    f"{self.arch} (tensor formats: {', '.join(formats)})"
                )
        for field_name, needs in _RATE_FIELDS:
            value = getattr(self, field_name)
            if value is None:
                continue
            if value <= 0:
                problems.append(f"{self.name}: {field_name} ({value}) must be > 0")
            if needs is not None and formats is not None and needs not in formats:
                problems.append(
                    f"{self.name}: {field_name} ({value}) must be None: {self.arch} has no "
                    f"{needs} tensor cores"
                )
        return problems

    @property
    def precisions(self) -> tuple[str, ...]:
        """Number formats this GPU computes in: fp32, then its tensor-core formats."""
        return ("fp32", *TENSOR_PRECISIONS.get(self.arch, ()))

    @property
    def cuda_visible_bytes(self) -> int | None:
        """Memory CUDA can hand out (total minus the driver's reservation); None if unmeasured."""
        if self.driver_reserved_bytes is None:
            return None
        return self.memory_bytes - self.driver_reserved_bytes


_H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200_DATASHEET = "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
_A100_DATASHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_V100_DATASHEET = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_ADA_WHITEPAPER = (
    "https://images.nvidia.com/aem-dam/Solutions/Data-Center/l4/"
    "nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf"
)
_GA102_WHITEPAPER = (
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
)
_BLACKWELL_RTX_WHITEPAPER = (
    "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
    "nvidia-rtx-blackwell-gpu-architecture.pdf"
)
_AMD_DATASHEETS = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/"

# PCIe x16 links as NVIDIA datasheets quote them (both directions together).
_PCIE3 = "PCIe 3.0 x16 32 GB/s"
_PCIE4 = "PCIe 4.0 x16 64 GB/s"
_PCIE5 = "PCIe 5.0 x16 128 GB/s"

_CATALOG: tuple[GPU, ...] = (
    # ---- Volta -----------------------------------------------------------------------------
    # V100 datasheet: SXM2 15.7 FP32 / 125 tensor TFLOPS, 300 W, NVLink 300 GB/s; PCIe 14 / 112,
    # 250 W, PCIe 32 GB/s; 900 GB/s HBM2 for both. Volta tensor cores: fp16 only.
    GPU(
        name="V100-16GB",
        aliases=("v100 16gb", "Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        memory_bytes=16160 * MiB,  # torch prints total_memory=16160MB for Tesla V100-SXM2-16GB
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,  # no bf16 tensor cores on Volta
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
        fp16_dense_tflops=125.0,  # "Tensor Performance" (mixed fp16/fp32), no sparsity on Volta
        fp32_tflops=15.7,
        interconnect="NVLink 2 300 GB/s",
        interconnect_gbps=300.0,
        form_factor="sxm",
        tdp_w=300,
    ),
    GPU(
        name="V100-32GB",
        aliases=("v100 32gb", "Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        memory_bytes=32510 * MiB,  # nvidia-smi: 32510MiB (V100-SXM2-32GB and V100-PCIE-32GB)
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
        fp16_dense_tflops=125.0,
        fp32_tflops=15.7,
        interconnect="NVLink 2 300 GB/s",
        interconnect_gbps=300.0,
        form_factor="sxm",
        tdp_w=300,
    ),
    GPU(
        name="V100-PCIe-16GB",
        aliases=("Tesla V100-PCIE-16GB", "v100 pcie 16gb"),
        memory_bytes=16384 * MiB,  # nvidia-smi: 16384MiB (current drivers)
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
        fp16_dense_tflops=112.0,
        fp32_tflops=14.0,
        interconnect=_PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    GPU(
        name="V100-PCIe-32GB",
        # The V100S (1134 GB/s, higher clocks) shares this row: its rates here are a lower bound.
        aliases=("Tesla V100-PCIE-32GB", "v100 pcie 32gb", "Tesla V100S-PCIE-32GB"),
        memory_bytes=32510 * MiB,  # nvidia-smi: 32510MiB
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
        fp16_dense_tflops=112.0,
        fp32_tflops=14.0,
        interconnect=_PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    # ---- Turing ----------------------------------------------------------------------------
    GPU(
        name="T4",
        aliases=("Tesla T4", "NVIDIA T4", "t4 16gb"),
        memory_bytes=15360 * MiB,  # nvidia-smi: 15360MiB (16 GiB GDDR6, ECC on)
        vendor="nvidia",
        arch="turing",
        compute_capability=(7, 5),
        memory_bandwidth_gbps=320.0,
        bf16_dense_tflops=None,  # Turing tensor cores have fp16, not bf16
        supports_bf16=False,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
            "t4-tensor-core-datasheet-951643.pdf"
        ),
        fp16_dense_tflops=65.0,  # "Mixed precision (FP16/FP32)"; no sparsity on Turing
        int8_dense_tops=130.0,
        fp32_tflops=8.1,
        interconnect=_PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=70,
    ),
    # ---- Ampere ----------------------------------------------------------------------------
    GPU(
        name="A10G",
        aliases=("NVIDIA A10G", "a10g 24gb"),
        memory_bytes=23028 * MiB,  # nvidia-smi on AWS g5: 23028MiB (ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=600.0,
        # AWS-only part: neither NVIDIA nor AWS publish its tensor or FP32 rates, power or link.
        bf16_dense_tflops=None,
        supports_bf16=True,
        supports_fp8=False,
        source="https://aws.amazon.com/ec2/instance-types/g5/",
    ),
    GPU(
        name="A10",
        aliases=("NVIDIA A10", "a10 24gb"),
        memory_bytes=23028 * MiB,  # nvidia-smi: 23028MiB with ECC on (24564MiB with ECC off)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=600.0,
        bf16_dense_tflops=125.0,  # datasheet 125 | 250 with sparsity
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/"
            "datasheet-new/nvidia-a10-datasheet.pdf"
        ),
        fp16_dense_tflops=125.0,
        int8_dense_tops=250.0,  # 250 | 500 with sparsity
        fp32_tflops=31.2,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=150,
    ),
    GPU(
        name="A2",
        aliases=("NVIDIA A2", "a2 16gb"),
        memory_bytes=15356 * MiB,  # nvidia-smi: 15356MiB (ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=200.0,
        bf16_dense_tflops=18.0,  # datasheet 18 | 36 with sparsity
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/solutions/data-center/a2/pdf/a2-datasheet.pdf"
        ),
        fp16_dense_tflops=18.0,
        int8_dense_tops=36.0,  # 36 | 72 with sparsity
        fp32_tflops=4.5,
        # Datasheet: "PCIe Gen4 x8"; 32 GB/s derived as half the x16 rate NVIDIA quotes (64 GB/s).
        interconnect="PCIe 4.0 x8 32 GB/s",
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=60,  # configurable 40-60 W
    ),
    GPU(
        name="A30",
        aliases=("NVIDIA A30", "a30 24gb", "A30-24GB"),
        # Derived: 24 GiB HBM2, which (as on the A100) nvidia-smi reports in full (24576MiB);
        # one nvidia-smi listing of a 165 W MIG-capable card showed exactly that.
        memory_bytes=24576 * MiB,
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=933.0,
        bf16_dense_tflops=165.0,  # datasheet 165 | 330 with sparsity
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/"
            "pdf/a30-datasheet.pdf"
        ),
        fp16_dense_tflops=165.0,
        int8_dense_tops=330.0,  # 330 | 661 with sparsity
        fp32_tflops=10.3,
        interconnect=f"{_PCIE4}; NVLink 3 bridge 200 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=165,
    ),
    GPU(
        name="A40",
        aliases=("NVIDIA A40", "a40 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (48 GiB GDDR6, ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=696.0,
        bf16_dense_tflops=149.7,  # datasheet 149.7 | 299.4 with sparsity
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
        ),
        fp16_dense_tflops=149.7,
        int8_dense_tops=299.3,  # 299.3 | 598.6 with sparsity
        fp32_tflops=37.4,
        interconnect=f"{_PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    # A100 datasheet: FP32 19.5, BF16/FP16 312 | 624 with sparsity, INT8 624 | 1248 with
    # sparsity; SXM 400 W with NVLink 600 GB/s; PCIe 250 W (40GB) / 300 W (80GB) with PCIe Gen4
    # 64 GB/s and an NVLink bridge for 2 GPUs at 600 GB/s.
    GPU(
        name="A100-40GB",
        aliases=("a100 40gb", "a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", "a100 40g"),
        memory_bytes=40960 * MiB,  # nvidia-smi: 40960MiB on current drivers (older: 40536MiB)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1555.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect="NVLink 3 600 GB/s",
        interconnect_gbps=600.0,
        form_factor="sxm",
        tdp_w=400,
    ),
    GPU(
        name="A100-PCIe-40GB",
        aliases=("NVIDIA A100-PCIE-40GB", "a100 pcie 40gb", "a100 40gb pcie"),
        memory_bytes=40960 * MiB,  # nvidia-smi: 40960MiB
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1555.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect=f"{_PCIE4}; NVLink 3 bridge 600 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    GPU(
        name="A100-80GB",
        aliases=("a100 80gb", "a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", "a100 80g"),
        memory_bytes=81920 * MiB,  # nvidia-smi: 81920MiB
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=2039.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect="NVLink 3 600 GB/s",
        interconnect_gbps=600.0,
        form_factor="sxm",
        tdp_w=400,
    ),
    GPU(
        name="A100-PCIe-80GB",
        aliases=("NVIDIA A100 80GB PCIe", "a100 pcie 80gb", "a100 80gb pcie"),
        memory_bytes=81920 * MiB,  # nvidia-smi: 81920MiB
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1935.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect=f"{_PCIE4}; NVLink 3 bridge 600 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    GPU(
        name="RTX-A5000",
        aliases=("NVIDIA RTX A5000", "rtx a5000", "a5000"),
        memory_bytes=24564 * MiB,  # nvidia-smi: 24564MiB (ECC off, the workstation default)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=768.0,
        # Datasheet "Tensor Performance 222.2 TFLOPS" (with sparsity): the FP16/BF16 FP32-
        # accumulate rate, as on the RTX A6000 (309.7 there = 2 x 154.8 in the GA102 whitepaper).
        bf16_dense_tflops=111.1,
        supports_bf16=True,
        supports_fp8=False,
        source="https://www.nvidia.com/en-us/design-visualization/rtx-a5000/",
        fp16_dense_tflops=111.1,
        int8_dense_tops=None,  # not published for the A5000
        fp32_tflops=27.8,
        interconnect=f"{_PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=230,
    ),
    GPU(
        name="RTX-A6000",
        aliases=("NVIDIA RTX A6000", "rtx a6000", "a6000"),
        # nvidia-smi: 49140MiB (ECC off, the workstation default; ECC on reports less)
        memory_bytes=49140 * MiB,
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=768.0,
        bf16_dense_tflops=154.8,  # GA102 whitepaper: 154.8 | 309.7 with sparsity (FP32 acc.)
        supports_bf16=True,
        supports_fp8=False,
        source="https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
        fp16_dense_tflops=154.8,
        int8_dense_tops=309.7,  # 309.7 | 619.4 with sparsity
        fp32_tflops=38.7,
        interconnect=f"{_PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
        rate_source=_GA102_WHITEPAPER,
    ),
    GPU(
        name="RTX-3090",
        aliases=("NVIDIA GeForce RTX 3090", "rtx 3090", "3090"),
        memory_bytes=24576 * MiB,  # nvidia-smi: 24576MiB on current drivers (older: 24268MiB)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=936.0,
        bf16_dense_tflops=71.0,  # GeForce: FP32-accumulate tensor rate is half the fp16 rate
        supports_bf16=True,
        supports_fp8=False,
        source=_GA102_WHITEPAPER,
        fp16_dense_tflops=71.0,  # 71 | 142 with sparsity (FP32 accumulate; 142 with FP16 acc.)
        int8_dense_tops=284.0,  # 284 | 568 with sparsity
        fp32_tflops=35.6,
        interconnect=f"{_PCIE4}; NVLink 3 bridge 112.5 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=350,
    ),
    # ---- Ada Lovelace ----------------------------------------------------------------------
    # Ada whitepaper appendix: dense | sparse, FP32 accumulate; GeForce at half the FP16-
    # accumulate rate, RTX 6000 Ada and the L-series at full rate.
    GPU(
        name="RTX-4080",
        aliases=("NVIDIA GeForce RTX 4080", "rtx 4080", "4080"),
        memory_bytes=16376 * MiB,  # nvidia-smi --query-gpu=memory.total: 16376 (MiB)
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=716.8,
        bf16_dense_tflops=97.5,  # 97.5 | 194.9 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_ADA_WHITEPAPER,
        fp16_dense_tflops=97.5,
        fp8_dense_tflops=194.9,  # 194.9 | 389.9 with sparsity
        int8_dense_tops=389.9,  # 389.9 | 779.8 with sparsity
        fp32_tflops=48.7,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=320,
    ),
    GPU(
        name="RTX-4090",
        aliases=("NVIDIA GeForce RTX 4090", "rtx 4090", "4090"),
        memory_bytes=24564 * MiB,  # nvidia-smi: 24564MiB
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=1008.0,
        bf16_dense_tflops=165.2,  # 165.2 | 330.4 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_ADA_WHITEPAPER,
        fp16_dense_tflops=165.2,
        fp8_dense_tflops=330.3,  # 330.3 | 660.6 with sparsity
        int8_dense_tops=660.6,  # 660.6 | 1321.2 with sparsity
        fp32_tflops=82.6,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=450,
    ),
    GPU(
        name="RTX-6000-Ada",
        aliases=("NVIDIA RTX 6000 Ada Generation", "rtx 6000 ada", "6000 ada"),
        # nvidia-smi: 49140MiB (ECC off, the workstation default); torch.cuda.mem_get_info total
        # was 50,865,307,648 B (48509 MiB) in one published run (unsloth-zoo PR #1053).
        memory_bytes=49140 * MiB,
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=960.0,
        bf16_dense_tflops=364.2,  # 364.2 | 728.4 with sparsity, full-rate FP32 accumulate
        supports_bf16=True,
        supports_fp8=True,
        source=_ADA_WHITEPAPER,
        fp16_dense_tflops=364.2,
        fp8_dense_tflops=728.5,  # 728.5 | 1457 with sparsity
        int8_dense_tops=728.5,  # 728.5 | 1457 with sparsity
        fp32_tflops=91.1,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    GPU(
        name="L4",
        aliases=("NVIDIA L4", "l4 24gb"),
        memory_bytes=23034 * MiB,  # nvidia-smi: 23034MiB (ECC on)
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=300.0,
        bf16_dense_tflops=121.0,  # datasheet 242 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
        fp16_dense_tflops=121.0,  # 242 with sparsity
        fp8_dense_tflops=242.5,  # 485 with sparsity
        int8_dense_tops=242.5,  # 485 with sparsity
        fp32_tflops=30.3,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=72,
    ),
    GPU(
        name="L40",
        aliases=("NVIDIA L40", "l40 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (48 GiB GDDR6, ECC on)
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=864.0,
        bf16_dense_tflops=181.05,  # datasheet 181.05 | 362.1 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/data-center/l40/",
        fp16_dense_tflops=181.05,
        fp8_dense_tflops=362.0,  # 362 | 724 with sparsity
        int8_dense_tops=362.0,  # 362 | 724 with sparsity
        fp32_tflops=90.5,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    GPU(
        name="L40S",
        aliases=("NVIDIA L40S", "l40s 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (ECC on)
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=864.0,
        bf16_dense_tflops=362.05,  # datasheet 362.05 | 733 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
        fp16_dense_tflops=362.05,
        fp8_dense_tflops=733.0,  # 733 | 1466 with sparsity
        int8_dense_tops=733.0,  # 733 | 1466 with sparsity
        fp32_tflops=91.6,
        interconnect=_PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=350,
    ),
    # ---- Hopper ----------------------------------------------------------------------------
    # H100 datasheet (sparse figures, halved here): SXM BF16 1979, FP8 and INT8 3958, FP32 67,
    # 700 W, NVLink 900 GB/s; PCIe BF16 1513, FP8/INT8 3026, FP32 51, 350 W; NVL BF16 1671,
    # FP8/INT8 3341, FP32 60, 350-400 W, 94 GB at 3.9 TB/s. PCIe and NVL: PCIe Gen5 128 GB/s,
    # NVLink bridge 600 GB/s.
    GPU(
        name="H100-80GB",
        aliases=(
            "h100",
            "h100 sxm",
            "h100-sxm",
            "h100 80gb",
            "h100-sxm5-80gb",
            "NVIDIA H100 80GB HBM3",
        ),
        memory_bytes=81559 * MiB,  # nvidia-smi: 81559MiB
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=3350.0,
        bf16_dense_tflops=989.4,  # datasheet 1979 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_H100_DATASHEET,
        fp16_dense_tflops=989.4,
        fp8_dense_tflops=1979.0,
        int8_dense_tops=1979.0,
        fp32_tflops=67.0,
        interconnect="NVLink 4 900 GB/s",
        interconnect_gbps=900.0,
        form_factor="sxm",
        tdp_w=700,
    ),
    GPU(
        name="H100-PCIe",
        aliases=("NVIDIA H100 PCIe", "h100 pcie", "h100-pcie-80gb"),
        memory_bytes=81559 * MiB,  # nvidia-smi: 81559MiB
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=2000.0,
        bf16_dense_tflops=756.0,  # datasheet 1513 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_H100_DATASHEET,
        fp16_dense_tflops=756.0,
        fp8_dense_tflops=1513.0,
        int8_dense_tops=1513.0,
        fp32_tflops=51.0,
        interconnect=f"{_PCIE5}; NVLink bridge 600 GB/s (pairs)",
        interconnect_gbps=128.0,
        form_factor="pcie",
        tdp_w=350,
    ),
    GPU(
        name="H100-NVL",
        aliases=("NVIDIA H100 NVL", "h100 nvl", "h100 nvl 94gb"),
        memory_bytes=95830 * MiB,  # nvidia-smi: 95830MiB
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=3900.0,
        bf16_dense_tflops=835.5,  # datasheet 1671 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_H100_DATASHEET,
        fp16_dense_tflops=835.5,
        fp8_dense_tflops=1670.5,  # 3341 with sparsity
        int8_dense_tops=1670.5,
        fp32_tflops=60.0,
        interconnect=f"{_PCIE5}; NVLink bridge 600 GB/s (pairs)",
        interconnect_gbps=128.0,
        form_factor="pcie",
        tdp_w=400,  # configurable 350-400 W
    ),
    # H200 datasheet (sparse figures, halved here): SXM BF16 1979, FP8/INT8 3958, FP32 67, 700 W,
    # NVLink 900 GB/s; NVL BF16 1671, FP8/INT8 3341, FP32 60, 600 W, 2- or 4-way NVLink bridge
    # 900 GB/s; both 141 GB at 4.8 TB/s, PCIe Gen5 128 GB/s.
    GPU(
        name="H200",
        aliases=("NVIDIA H200", "h200 sxm", "h200 141gb"),
        # Measured here (driver 580.159.04): nvidia-smi memory.total 143771 MiB, memory.reserved
        # 616 MiB; torch total_memory 150,109,880,320 B (= total - reserved).
        memory_bytes=143771 * MiB,
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=4800.0,
        bf16_dense_tflops=989.4,  # same compute as the H100 SXM
        supports_bf16=True,
        supports_fp8=True,
        source=_H200_DATASHEET,
        driver_reserved_bytes=616 * MiB,
        fp16_dense_tflops=989.4,
        fp8_dense_tflops=1979.0,
        int8_dense_tops=1979.0,
        fp32_tflops=67.0,
        interconnect="NVLink 4 900 GB/s",
        interconnect_gbps=900.0,
        form_factor="sxm",
        tdp_w=700,
    ),
    GPU(
        name="H200-NVL",
        aliases=("NVIDIA H200 NVL", "h200 nvl"),
        memory_bytes=143771 * MiB,  # nvidia-smi: 143771MiB
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=4800.0,
        bf16_dense_tflops=835.5,  # datasheet 1671 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=_H200_DATASHEET,
        fp16_dense_tflops=835.5,
        fp8_dense_tflops=1670.5,  # 3341 with sparsity
        int8_dense_tops=1670.5,
        fp32_tflops=60.0,
        interconnect=f"{_PCIE5}; NVLink bridge 900 GB/s (2 or 4 GPUs)",
        interconnect_gbps=128.0,
        form_factor="pcie",
        tdp_w=600,
    ),
    GPU(
        name="GH200",
        # The Hopper GPU of a Grace Hopper superchip, 96 GB HBM3 version (nvidia-smi names it
        # after the superchip's total memory: 480GB or 120GB of LPDDR5X plus the 96 GB).
        aliases=("NVIDIA GH200 480GB", "NVIDIA GH200 120GB", "gh200 96gb"),
        memory_bytes=97871 * MiB,  # nvidia-smi: 97871MiB (GH200 480GB and GH200 120GB)
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=4000.0,  # 96 GB HBM3 version (the 144 GB HBM3e one: 4.9 TB/s)
        bf16_dense_tflops=989.5,  # datasheet 1979 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
        fp16_dense_tflops=989.5,
        fp8_dense_tflops=1979.0,  # 3958 with sparsity
        int8_dense_tops=1979.0,
        fp32_tflops=67.0,
        interconnect="NVLink 4 900 GB/s; NVLink-C2C 900 GB/s to the Grace CPU",
        interconnect_gbps=900.0,
        form_factor="superchip",
        tdp_w=None,  # NVIDIA quotes 450-1000 W for the whole superchip (CPU + GPU + memory)
    ),
    # ---- Blackwell -------------------------------------------------------------------------
    GPU(
        name="RTX-5090",
        aliases=("NVIDIA GeForce RTX 5090", "rtx 5090", "5090"),
        memory_bytes=32607 * MiB,  # nvidia-smi: 32607MiB
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(12, 0),
        memory_bandwidth_gbps=1792.0,
        bf16_dense_tflops=209.5,  # 209.5 | 419 with sparsity, FP32 accumulate (GeForce half rate)
        supports_bf16=True,
        supports_fp8=True,
        source=_BLACKWELL_RTX_WHITEPAPER,
        fp16_dense_tflops=209.5,
        fp8_dense_tflops=419.0,  # 419 | 838 with sparsity, FP32 accumulate
        int8_dense_tops=838.0,  # 838 | 1676 with sparsity
        fp32_tflops=104.8,
        interconnect=_PCIE5,
        interconnect_gbps=128.0,
        form_factor="pcie",
        tdp_w=575,
    ),
    GPU(
        name="RTX-PRO-6000-Blackwell",
        aliases=(
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "rtx pro 6000",
            "rtx pro 6000 blackwell",
        ),
        memory_bytes=97887 * MiB,  # nvidia-smi: 97887MiB (all three editions)
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(12, 0),
        memory_bandwidth_gbps=1792.0,
        # The three editions share memory and bandwidth but not clocks or power (600 W, 600 W,
        # 300 W Max-Q); NVIDIA quotes tensor throughput only as FP4 "AI TOPS" with sparsity and
        # FP32 per edition (125 TFLOPS for the Workstation Edition), so the row leaves rates out.
        bf16_dense_tflops=None,
        supports_bf16=True,
        supports_fp8=True,
        source=(
            "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/"
            "rtx-pro-6000/"
        ),
        interconnect=_PCIE5,
        interconnect_gbps=128.0,
        form_factor="pcie",
    ),
    GPU(
        name="B200",
        aliases=("NVIDIA B200", "b200 180gb"),
        memory_bytes=183359 * MiB,  # nvidia-smi: 183359MiB
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(10, 0),
        memory_bandwidth_gbps=8000.0,  # datasheet: 64 TB/s for 8 GPUs
        # DGX B200 datasheet, 8 GPUs with sparsity: FP16/BF16 36 PFLOPS, FP8 72 PFLOPS, INT8
        # 72 POPS; per GPU dense = / 8 / 2. FP32 and per-GPU power are not on it.
        bf16_dense_tflops=2250.0,
        supports_bf16=True,
        supports_fp8=True,
        source="https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet",
        fp16_dense_tflops=2250.0,
        fp8_dense_tflops=4500.0,
        int8_dense_tops=4500.0,
        interconnect="NVLink 5 1800 GB/s",
        interconnect_gbps=1800.0,  # datasheet: 14.4 TB/s aggregate NVLink for 8 GPUs
        form_factor="sxm",
    ),
    GPU(
        name="GB200",
        # One Blackwell GPU of a GB200 superchip (2 GPUs + 1 Grace CPU); nvidia-smi lists each.
        aliases=("NVIDIA GB200", "gb200 186gb"),
        memory_bytes=189471 * MiB,  # nvidia-smi: 189471MiB
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(10, 0),
        # GB200 NVL72 page: 72 GPUs, 576 TB/s HBM3e bandwidth, 130 TB/s NVLink; per superchip
        # (2 GPUs) with sparsity FP16/BF16 10 PFLOPS, FP8 20 PFLOPS, INT8 20 POPS. Per GPU
        # dense = / 2 / 2. FP32 and per-GPU power are not on it.
        memory_bandwidth_gbps=8000.0,
        bf16_dense_tflops=2500.0,
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
        fp16_dense_tflops=2500.0,
        fp8_dense_tflops=5000.0,
        int8_dense_tops=5000.0,
        interconnect="NVLink 5 1800 GB/s; NVLink-C2C 900 GB/s to the Grace CPU",
        interconnect_gbps=1800.0,
        form_factor="superchip",
    ),
    # ---- AMD CDNA3 -------------------------------------------------------------------------
    # Data sheets: dense peak FP16/BF16 1307.4 TFLOPS, FP8 2614.9 TFLOPS, INT8 2614.9 TOPS (each
    # doubled with sparsity), FP32 vector 163.4 TFLOPS; 7 Infinity Fabric links x 128 GB/s peak,
    # PCIe Gen5 x16 128 GB/s; OAM module.
    GPU(
        name="MI300X",
        aliases=("AMD Instinct MI300X", "mi300x 192gb", "AMD Instinct MI300X OAM"),
        # Derived: ROCm torch reports "total capacity of 191.98 GiB" (hipMemGetInfo) in
        # published OOM messages; 191.98 GiB = 196588 MiB (+-5 MiB from the rounding).
        memory_bytes=196588 * MiB,
        vendor="amd",
        arch="cdna3",
        compute_capability=None,  # gfx942; CUDA compute capabilities do not apply
        memory_bandwidth_gbps=5300.0,
        bf16_dense_tflops=1307.4,
        supports_bf16=True,
        supports_fp8=True,
        source=f"{_AMD_DATASHEETS}data-sheets/amd-instinct-mi300x-data-sheet.pdf",
        fp16_dense_tflops=1307.4,
        fp8_dense_tflops=2614.9,
        int8_dense_tops=2614.9,
        fp32_tflops=163.4,
        interconnect="Infinity Fabric 7 x 128 GB/s = 896 GB/s; PCIe 5.0 x16 128 GB/s",
        interconnect_gbps=896.0,
        form_factor="oam",
        tdp_w=750,
    ),
    GPU(
        name="MI325X",
        aliases=("AMD Instinct MI325X", "mi325x 256gb", "AMD Instinct MI325X OAM"),
        # Derived: ROCm torch reports "total capacity of 255.98 GiB" in a published HIP OOM
        # message (vLLM on a 256 GB part); 255.98 GiB = 262124 MiB (+-5 MiB from the rounding).
        memory_bytes=262124 * MiB,
        vendor="amd",
        arch="cdna3",
        compute_capability=None,  # gfx942
        memory_bandwidth_gbps=6000.0,
        bf16_dense_tflops=1307.4,  # same compute as the MI300X
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
        fp16_dense_tflops=1307.4,
        fp8_dense_tflops=2614.9,
        int8_dense_tops=2614.9,
        fp32_tflops=163.4,
        interconnect="Infinity Fabric 7 x 128 GB/s = 896 GB/s; PCIe 5.0 x16 128 GB/s",
        interconnect_gbps=896.0,
        form_factor="oam",
        tdp_w=1000,
    ),
)

# Vendor and product-line words that carry no information for matching a name.
_NOISE_WORDS = {"nvidia", "tesla", "geforce", "amd", "instinct", "gpu"}


def _normalize(name: str) -> str:
    """Lower case, vendor words dropped, spaces, dashes and underscores removed."""
    words = re.split(r"[\s_\-]+", name.strip().lower())
    return "".join(word for word in words if word not in _NOISE_WORDS)


def _build_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _CATALOG:
        for spelling in (gpu.name, *gpu.aliases):
            key = _normalize(spelling)
            other = index.get(key)
            if other is not None and other is not gpu:  # pragma: no cover - guarded by a test
                raise RuntimeError(f"GPU alias {spelling!r} names both {other.name} and {gpu.name}")
            index[key] = gpu
    return index


_INDEX = _build_index()


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order (by vendor and generation)."""
    return list(_CATALOG)


def get_gpu(name: str) -> GPU:
    """Look a GPU up by name or alias, ignoring case, spaces, dashes and vendor words.

    ``"h100"`` alone means the H100 SXM (``H100-80GB``). An unknown or ambiguous name raises
    :class:`UnknownGPUError` with the closest catalog names.
    """
    gpu = _INDEX.get(_normalize(name))
    if gpu is not None:
        return gpu
    matches = _close_matches(name)
    hint = f"did you mean {', '.join(matches)}? " if matches else ""
    raise UnknownGPUError(
        f"unknown GPU {name!r}: {hint}run `memfit gpus` for the list", close_matches=matches
    )


def _close_matches(name: str, *, n_matches: int = 3, n_family: int = 6) -> list[str]:
    """Canonical names that ``name`` starts (a family such as "a100": up to ``n_family``),
    else up to ``n_matches`` look-alikes."""
    query = _normalize(name)
    if not query:
        return []
    prefixed = sorted({gpu.name for key, gpu in _INDEX.items() if key.startswith(query)})
    if prefixed:
        return prefixed[:n_family]
    scores: dict[str, float] = {}
    for key, gpu in _INDEX.items():
        score = difflib.SequenceMatcher(None, query, key).ratio()
        if score >= 0.75:
            scores[gpu.name] = max(score, scores.get(gpu.name, 0.0))
    return sorted(scores, key=lambda gpu_name: (-scores[gpu_name], gpu_name))[:n_matches]

"""GPUs as data: memory, architecture, headline rates and links, each row with its vendor source.

Memory
------
``memory_bytes`` is the total that ``nvidia-smi`` prints (``memory.total``), not the marketing
size: HBM parts report their full binary size (A100-80GB: 81920 MiB), GDDR parts with ECC on
report less (A10: 23028 MiB with ECC on, 24564 MiB with it off). Each value is one seen in
published ``nvidia-smi`` output; where none was found the comment says how it was derived.
On recent drivers CUDA (``cudaMemGetInfo``, ``torch.cuda.get_device_properties().total_memory``)
sees ``memory.total`` minus ``memory.reserved``: measured on an H200 (driver 580.159.04, torch
2.11): 143771 - 616 = 143155 MiB (torch: 150,109,880,320 B).

Capacity
--------
``capacity_bytes`` -- what a process can allocate, the figure every verdict judges against -- is
the torch-visible total. ``driver_reserved_bytes`` = ``memory.total`` - that total where it was
observed: the most common published value of ``total_memory`` (Unsloth notebooks' saved outputs
print it), of a PyTorch OOM message's "X GiB total capacity" / "a total capacity of X GiB", or of
a vLLM log's ``mem_get_info`` total; ``capacity_source`` names them and the row's comment gives
the range (drivers differ: newer ones reserve more). Older drivers printed a ``memory.total``
that already left the reservation out (V100 rows): there the reservation is 0.
Where nothing was observed the reservation is estimated (``capacity_measured`` False) by
``ESTIMATED_RESERVED_MIN_BYTES`` / ``ESTIMATED_RESERVED_MIN_FRACTION``, so no verdict uses the
raw ``memory.total``. docs/accuracy.md lists every GPU's figures.

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
- ``supports_bf16`` / ``supports_fp8`` / ``supports_fp4`` follow the architecture
  (``TENSOR_PRECISIONS``): bf16 tensor cores from Ampere and CDNA2, fp8 from Ada, Hopper and
  CDNA3, fp4 from Blackwell and CDNA4; rows are checked against it.

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

import math
from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.units import GiB, MiB

ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4")
VENDORS = ("nvidia", "amd")
FORM_FACTORS = ("sxm", "pcie", "oam", "superchip")

#: Number formats the tensor cores / matrix cores of each architecture run (FP32 always runs on
#: the CUDA cores). Volta: fp16 tensor cores only (V100 datasheet); Turing adds int8 (T4
#: datasheet); Ampere adds bf16 (A100 datasheet); Ada and Hopper add fp8 (Ada whitepaper, H100
#: datasheet); Blackwell adds fp4 (NVFP4 / MXFP4: Blackwell architecture technical brief; B200,
#: B300 and RTX 50 tensor cores alike); CDNA3: fp16, bf16, fp8, int8 (MI300X datasheet); CDNA4 adds
#: MXFP4 / MXFP6 (AMD CDNA 4 architecture whitepaper, MI355X product page). fp6 is not listed:
#: no memfit path computes in it.
TENSOR_PRECISIONS: dict[str, tuple[str, ...]] = {
    "volta": ("fp16",),
    "turing": ("fp16", "int8"),
    "ampere": ("fp16", "bf16", "int8"),
    "ada": ("fp16", "bf16", "fp8", "int8"),
    "hopper": ("fp16", "bf16", "fp8", "int8"),
    "blackwell": ("fp16", "bf16", "fp8", "int8", "fp4"),
    "cdna3": ("fp16", "bf16", "fp8", "int8"),
    "cdna4": ("fp16", "bf16", "fp8", "int8", "fp4"),
}

#: The reservation of a GPU whose torch-visible total nobody published: the larger of the largest
#: reservation observed on a catalog GPU (A100-80GB: 81920 MiB - 79.251 GiB = 766 MiB) and the
#: smallest observed share of ``memory.total`` (H200: 616 / 143771 MiB = 0.43 %), an estimate that
#: says "at least what the GPUs measured so far lost". tests/hardware/test_capacity.py checks both
#: against the catalog's measured rows.
ESTIMATED_RESERVED_MIN_BYTES = 81920 * MiB - int(79.251 * GiB)
ESTIMATED_RESERVED_MIN_FRACTION = 616 / 143771


def reserved_below(memory_total_bytes: int, torch_total_gib: float) -> int:
    """``driver_reserved_bytes`` from a torch-visible total printed in GiB (``total_memory /
    2**30``, as notebooks, OOM messages and vLLM logs print it): ``memory.total`` less it."""
    return memory_total_bytes - int(torch_total_gib * GiB)


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
    #: ``memory.total`` - the torch-visible total, where one was observed (module docstring)
    driver_reserved_bytes: int | None = None
    fp16_dense_tflops: float | None = None
    fp8_dense_tflops: float | None = None
    int8_dense_tops: float | None = None
    fp32_tflops: float | None = None
    interconnect: str | None = None
    interconnect_gbps: float | None = None
    form_factor: str | None = None
    tdp_w: int | None = None
    rate_source: str | None = None  # where rates, power or links are not in ``source``
    # -- multi-GPU training (par-a, issue 30) --
    #: fp4 tensor / matrix cores (NVFP4 / MXFP4): follows the architecture like bf16 / fp8
    supports_fp4: bool = False
    #: GPUs one ``interconnect_gbps`` fabric joins: 8 in an HGX / DGX / OAM platform, 72 in an
    #: NVL72 rack (NVLink Switch); None where the GPU is not sold in such a platform
    scale_up_gpus: int | None = None
    #: where ``driver_reserved_bytes`` was observed (URLs, repo+path+commit); None where unmeasured
    capacity_source: str | None = None

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
        if self.scale_up_gpus is not None and self.scale_up_gpus < 1:
            problems.append(f"{self.name}: scale_up_gpus ({self.scale_up_gpus}) must be >= 1")
        if self.driver_reserved_bytes is not None and not (
            0 <= self.driver_reserved_bytes < self.memory_bytes
        ):
            problems.append(
                f"{self.name}: driver_reserved_bytes ({self.driver_reserved_bytes}) must be in "
                f"[0, memory_bytes ({self.memory_bytes}))"
            )
        if (self.driver_reserved_bytes is None) != (self.capacity_source is None):
            problems.append(
                f"{self.name}: driver_reserved_bytes and capacity_source go together (an "
                "observed torch-visible total names its source)"
            )
        if self.interconnect_gbps is not None and not self.interconnect:
            problems.append(f"{self.name}: interconnect_gbps needs interconnect (the link's name)")
        if problems:
            raise SpecError.from_problems(problems)

    def _rate_problems(self) -> list[str]:
        """Rates are positive and present only for formats the architecture's tensor cores run;
        ``supports_bf16`` / ``supports_fp8`` agree with the architecture."""
        problems = []
        formats = TENSOR_PRECISIONS.get(self.arch)
        for flag, fmt in (
            ("supports_bf16", "bf16"),
            ("supports_fp8", "fp8"),
            ("supports_fp4", "fp4"),
        ):
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

    @property
    def capacity_measured(self) -> bool:
        """Whether ``capacity_bytes`` is an observed torch-visible total (else estimated)."""
        return self.driver_reserved_bytes is not None

    @property
    def estimated_reserved_bytes(self) -> int:
        """The reservation assumed where none was observed (``ESTIMATED_RESERVED_MIN_*``)."""
        share = math.ceil(self.memory_bytes * ESTIMATED_RESERVED_MIN_FRACTION)
        return max(ESTIMATED_RESERVED_MIN_BYTES, share)

    @property
    def capacity_bytes(self) -> int:
        """What a process can allocate, the capacity every verdict judges against: the
        torch-visible total where it was observed, else ``memory.total`` less the estimated
        reservation (never the raw ``memory.total``)."""
        if self.cuda_visible_bytes is not None:
            return self.cuda_visible_bytes
        return self.memory_bytes - self.estimated_reserved_bytes


# Sources and link names shared by the catalog's row modules (datacenter.py, desktop.py).
H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
H200_DATASHEET = "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
A100_DATASHEET = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
V100_DATASHEET = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
ADA_WHITEPAPER = (
    "https://images.nvidia.com/aem-dam/Solutions/Data-Center/l4/"
    "nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf"
)
GA102_WHITEPAPER = (
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
)
BLACKWELL_RTX_WHITEPAPER = (
    "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
    "nvidia-rtx-blackwell-gpu-architecture.pdf"
)
AMD_DATASHEETS = "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/"

# PCIe x16 links as NVIDIA datasheets quote them (both directions together).
PCIE3 = "PCIe 3.0 x16 32 GB/s"
PCIE4 = "PCIe 4.0 x16 64 GB/s"
PCIE5 = "PCIe 5.0 x16 128 GB/s"

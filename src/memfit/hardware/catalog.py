"""GPUs as data: memory, architecture and headline rates, each row with its vendor source.

``memory_bytes`` is the total that ``nvidia-smi`` prints (``memory.total``), not the marketing
size: HBM parts report their full binary size (A100-80GB: 81920 MiB), GDDR parts with ECC on
report less (A10: 23028 MiB with ECC on, 24564 MiB with it off). Each value is one seen in
published ``nvidia-smi`` output; where none was found the comment says how it was derived.
On recent drivers CUDA (``cudaMemGetInfo``, ``torch.cuda.get_device_properties().total_memory``)
sees ``memory.total`` minus ``memory.reserved``: measured on an H200 (driver 580.159.04, torch
2.11): 143771 - 616 = 143155 MiB (torch: 150,109,880,320 B). ``driver_reserved_bytes`` holds
that reservation where it was measured.

Rates: ``memory_bandwidth_gbps`` in GB/s (10^9 B/s) and ``bf16_dense_tflops`` (dense, no 2:4
sparsity, FP32 accumulate) from the vendor datasheet or architecture whitepaper named in
``source``; None where the vendor publishes none or the GPU has no bf16 tensor cores.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from memfit.errors import SpecError, UnknownGPUError
from memfit.units import MiB

ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna3")
VENDORS = ("nvidia", "amd")


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

    def __post_init__(self) -> None:
        problems = []
        if self.memory_bytes <= 0:
            problems.append(f"{self.name}: memory_bytes ({self.memory_bytes}) must be > 0")
        if self.arch not in ARCHS:
            problems.append(f"{self.name}: arch ({self.arch!r}) must be one of {', '.join(ARCHS)}")
        if self.vendor not in VENDORS:
            problems.append(f"{self.name}: vendor ({self.vendor!r}) must be one of {VENDORS}")
        if not self.source.startswith("https://"):
            problems.append(f"{self.name}: source ({self.source!r}) must be an https:// URL")
        if problems:
            raise SpecError.from_problems(problems)

    @property
    def cuda_visible_bytes(self) -> int | None:
        """Memory CUDA can hand out (total minus the driver's reservation); None if unmeasured."""
        if self.driver_reserved_bytes is None:
            return None
        return self.memory_bytes - self.driver_reserved_bytes


_H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
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

_CATALOG: tuple[GPU, ...] = (
    GPU(
        name="V100-16GB",
        aliases=("v100 16gb", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB", "v100-sxm2-16gb"),
        memory_bytes=16160 * MiB,  # torch prints total_memory=16160MB for Tesla V100-SXM2-16GB
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,  # no bf16 tensor cores on Volta
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
    ),
    GPU(
        name="V100-32GB",
        aliases=(
            "v100 32gb",
            "Tesla V100-SXM2-32GB",
            "Tesla V100-PCIE-32GB",
            "Tesla V100S-PCIE-32GB",
        ),
        memory_bytes=32510 * MiB,  # nvidia-smi: 32510MiB (V100-SXM2-32GB and V100-PCIE-32GB)
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=_V100_DATASHEET,
    ),
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
    ),
    GPU(
        name="A10G",
        aliases=("NVIDIA A10G", "a10g 24gb"),
        memory_bytes=23028 * MiB,  # nvidia-smi on AWS g5: 23028MiB (ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=600.0,
        bf16_dense_tflops=None,  # AWS-only part; neither NVIDIA nor AWS publish its tensor rate
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
        bf16_dense_tflops=125.0,
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/"
            "datasheet-new/nvidia-a10-datasheet.pdf"
        ),
    ),
    GPU(
        name="A2",
        aliases=("NVIDIA A2", "a2 16gb"),
        memory_bytes=15356 * MiB,  # nvidia-smi: 15356MiB (ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=200.0,
        bf16_dense_tflops=18.0,
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/solutions/data-center/a2/pdf/a2-datasheet.pdf"
        ),
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
        bf16_dense_tflops=165.0,
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/"
            "pdf/a30-datasheet.pdf"
        ),
    ),
    GPU(
        name="A40",
        aliases=("NVIDIA A40", "a40 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (48 GiB GDDR6, ECC on)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=696.0,
        bf16_dense_tflops=149.7,
        supports_bf16=True,
        supports_fp8=False,
        source=(
            "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
        ),
    ),
    GPU(
        name="A100-40GB",
        aliases=(
            "a100 40gb",
            "a100-sxm4-40gb",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-PCIE-40GB",
            "a100 40g",
        ),
        memory_bytes=40960 * MiB,  # nvidia-smi: 40960MiB on current drivers (older: 40536MiB)
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1555.0,  # SXM4; PCIe 40GB: 1555 as well
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
    ),
    GPU(
        name="A100-80GB",
        aliases=(
            "a100 80gb",
            "a100-sxm4-80gb",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100 80GB PCIe",
            "a100 80g",
        ),
        memory_bytes=81920 * MiB,  # nvidia-smi: 81920MiB
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=2039.0,  # SXM4 (PCIe: 1935)
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=_A100_DATASHEET,
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
        source=(
            "https://www.nvidia.com/content/PDF/"
            "nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
        ),
    ),
    GPU(
        name="RTX-4090",
        aliases=("NVIDIA GeForce RTX 4090", "rtx 4090", "4090"),
        memory_bytes=24564 * MiB,  # nvidia-smi: 24564MiB
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=1008.0,
        bf16_dense_tflops=165.2,  # FP32 accumulate (GeForce half rate)
        supports_bf16=True,
        supports_fp8=True,
        source=_ADA_WHITEPAPER,
    ),
    GPU(
        name="RTX-5090",
        aliases=("NVIDIA GeForce RTX 5090", "rtx 5090", "5090"),
        memory_bytes=32607 * MiB,  # nvidia-smi: 32607MiB
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(12, 0),
        memory_bandwidth_gbps=1792.0,
        bf16_dense_tflops=209.5,  # FP32 accumulate (GeForce half rate)
        supports_bf16=True,
        supports_fp8=True,
        source=(
            "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
            "nvidia-rtx-blackwell-gpu-architecture.pdf"
        ),
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
        bf16_dense_tflops=364.2,  # 142 SMs x 2.505 GHz x 1024 FLOP/clk, full-rate FP32 accumulate
        supports_bf16=True,
        supports_fp8=True,
        source=_ADA_WHITEPAPER,
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
    ),
    GPU(
        name="L40S",
        aliases=("NVIDIA L40S", "l40s 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (ECC on)
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=864.0,
        bf16_dense_tflops=362.05,  # datasheet 733 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
    ),
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
    ),
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
        source="https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446",
        driver_reserved_bytes=616 * MiB,
    ),
    GPU(
        name="B200",
        aliases=("NVIDIA B200", "b200 180gb"),
        memory_bytes=183359 * MiB,  # nvidia-smi: 183359MiB
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(10, 0),
        memory_bandwidth_gbps=8000.0,
        bf16_dense_tflops=2250.0,  # datasheet 4.5 PFLOPS bf16 per GPU with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source="https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet",
    ),
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
        source=(
            "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
            "amd-instinct-mi300x-data-sheet.pdf"
        ),
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


def _close_matches(name: str, *, n_matches: int = 3) -> list[str]:
    """Canonical names that ``name`` starts (a family such as "a100"), else look-alikes."""
    query = _normalize(name)
    if not query:
        return []
    prefixed = sorted({gpu.name for key, gpu in _INDEX.items() if key.startswith(query)})
    if prefixed:
        return prefixed[:n_matches]
    scores: dict[str, float] = {}
    for key, gpu in _INDEX.items():
        score = difflib.SequenceMatcher(None, query, key).ratio()
        if score >= 0.75:
            scores[gpu.name] = max(score, scores.get(gpu.name, 0.0))
    return sorted(scores, key=lambda gpu_name: (-scores[gpu_name], gpu_name))[:n_matches]

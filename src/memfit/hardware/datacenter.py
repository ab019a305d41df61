"""Data-center GPUs of the catalog (NVIDIA Tesla/Hopper/Blackwell, AMD Instinct): one GPU record
per row, each with its vendor source. The field conventions are in :mod:`memfit.hardware.gpu`."""

from __future__ import annotations

from memfit.hardware.gpu import (
    A100_DATASHEET,
    AMD_DATASHEETS,
    GPU,
    H100_DATASHEET,
    H200_DATASHEET,
    PCIE3,
    PCIE4,
    PCIE5,
    V100_DATASHEET,
    reserved_below,
)
from memfit.units import MiB

DATACENTER_GPUS: tuple[GPU, ...] = (
    # ---- Volta -----------------------------------------------------------------------------
    # V100 datasheet: SXM2 15.7 FP32 / 125 tensor TFLOPS, 300 W, NVLink 300 GB/s; PCIe 14 / 112,
    # 250 W, PCIe 32 GB/s; 900 GB/s HBM2 for both. Volta tensor cores: fp16 only.
    GPU(
        name="V100-16GB",
        aliases=("v100 16gb", "Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        memory_bytes=16160 * MiB,  # torch prints total_memory=16160MB for Tesla V100-SXM2-16GB
        # capacity estimated: no published torch total with a source was found
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,  # no bf16 tensor cores on Volta
        supports_bf16=False,
        supports_fp8=False,
        source=V100_DATASHEET,
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
        # torch: 31.74 GiB total capacity (two OOM messages), 31.75 (one): old drivers, whose
        # memory.total (32510 MiB = 31.748 GiB) already left the reservation out
        driver_reserved_bytes=reserved_below(32510 * MiB, 31.74),
        capacity_source=(
            "https://github.com/hiyouga/LlamaFactory/issues/182 (31.75 GiB); "
            "https://github.com/haotian-liu/LLaVA/issues/812 (31.74 GiB); "
            "https://github.com/liucongg/ChatGLM-Finetuning/issues/73 (31.74 GiB)"
        ),
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=V100_DATASHEET,
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
        source=V100_DATASHEET,
        fp16_dense_tflops=112.0,
        fp32_tflops=14.0,
        interconnect=PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    GPU(
        name="V100-PCIe-32GB",
        # The V100S (1134 GB/s, higher clocks) shares this row: its rates here are a lower bound.
        aliases=("Tesla V100-PCIE-32GB", "v100 pcie 32gb", "Tesla V100S-PCIE-32GB"),
        memory_bytes=32510 * MiB,  # nvidia-smi: 32510MiB
        # as V100-32GB (the sources name a V100 32GB, not its form factor): torch 31.74 GiB
        # total capacity (two OOM messages), 31.75 (one), of memory.total 32510 MiB
        driver_reserved_bytes=reserved_below(32510 * MiB, 31.74),
        capacity_source=(
            "https://github.com/hiyouga/LlamaFactory/issues/182 (31.75 GiB); "
            "https://github.com/haotian-liu/LLaVA/issues/812 (31.74 GiB); "
            "https://github.com/liucongg/ChatGLM-Finetuning/issues/73 (31.74 GiB)"
        ),
        vendor="nvidia",
        arch="volta",
        compute_capability=(7, 0),
        memory_bandwidth_gbps=900.0,
        bf16_dense_tflops=None,
        supports_bf16=False,
        supports_fp8=False,
        source=V100_DATASHEET,
        fp16_dense_tflops=112.0,
        fp32_tflops=14.0,
        interconnect=PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    # ---- Turing ----------------------------------------------------------------------------
    GPU(
        name="T4",
        aliases=("Tesla T4", "NVIDIA T4", "t4 16gb"),
        memory_bytes=15360 * MiB,  # nvidia-smi: 15360MiB (16 GiB GDDR6, ECC on)
        # torch total_memory 14.741 GiB in 142 Colab notebook outputs; 14.748 (96), 14.563 (20, the
        # 2026 notebooks); OOM messages 14.56-14.58 GiB (driver 535, memory.total 15360 MiB). The
        # current drivers' figure is used (the older ones reserved less): the safe side
        driver_reserved_bytes=reserved_below(15360 * MiB, 14.563),
        capacity_source=(
            "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 "
            "nb/All_MiniLM_L6_v2.ipynb (14.741), nb/CodeGemma_(7B)-Conversational.ipynb (14.748), "
            "nb/Gemma4_(E2B)-Audio.ipynb (14.563); "
            "https://github.com/Zheng-Chong/CatVTON/issues/133 (14.56 GiB); "
            "https://github.com/mbzuai-oryx/GeoPixel/issues/5 (14.58 GiB)"
        ),
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
        interconnect=PCIE3,
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=70,
    ),
    # ---- Ampere ----------------------------------------------------------------------------
    GPU(
        name="A10G",
        aliases=("NVIDIA A10G", "a10g 24gb"),
        memory_bytes=23028 * MiB,  # nvidia-smi on AWS g5: 23028MiB (ECC on)
        # torch total_memory 22.184 GiB (4 notebook outputs, AWS g5)
        driver_reserved_bytes=reserved_below(23028 * MiB, 22.184),
        capacity_source=(
            "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 "
            "nb/Llama3.2_(1B)-RAFT.ipynb (22.184)"
        ),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=600.0,
        # AWS-only part: NVIDIA publishes no datasheet and AWS no tensor rate. Rates from
        # Baseten's A10-vs-A10G comparison (``rate_source``): FP16/BF16 tensor 70 TFLOPS, FP32
        # 35 TFLOPS; the stored copy of that page read here showed the article but not its table,
        # so the figures are the article's as recalled, not re-read (docs/decisions.md). They
        # match a GA102 with 80 SMs at 1.71 GHz running FP32-accumulate tensor math at half rate
        # (80 x 1.71 GHz x 512 = 70 TFLOPS), as GeForce GA102 cards do. Link and power unknown.
        bf16_dense_tflops=70.0,
        supports_bf16=True,
        supports_fp8=False,
        source="https://aws.amazon.com/ec2/instance-types/g5/",
        fp16_dense_tflops=70.0,
        fp32_tflops=35.0,
        form_factor="pcie",
        rate_source="https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
    ),
    GPU(
        name="A10",
        aliases=("NVIDIA A10", "a10 24gb"),
        memory_bytes=23028 * MiB,  # nvidia-smi: 23028MiB with ECC on (24564MiB with ECC off)
        # torch: 21.99 GiB total capacity (Lambda A10, ECC on); ECC off: 23.70 GiB of 24564 MiB
        driver_reserved_bytes=reserved_below(23028 * MiB, 21.99),
        capacity_source=(
            "https://github.com/zai-org/CogVLM/issues/236 (21.99 GiB); "
            "https://github.com/tatsu-lab/stanford_alpaca/issues/76 (23.70 GiB, ECC off)"
        ),
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
        interconnect=PCIE4,
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
        # torch: 23.53 GiB total capacity (one OOM message)
        driver_reserved_bytes=reserved_below(24576 * MiB, 23.53),
        capacity_source=("https://github.com/google/RB-Modulation/issues/5 (23.53 GiB)"),
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
        interconnect=f"{PCIE4}; NVLink 3 bridge 200 GB/s (pairs)",
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
        interconnect=f"{PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
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
        # torch total_memory 39.494 GiB (16 notebook outputs); 39.557 (12); OOM 39.50 GiB; vLLM
        # 0.8.3 log 39.38 GiB
        driver_reserved_bytes=reserved_below(40960 * MiB, 39.494),
        capacity_source=(
            "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 "
            "nb/Gemma4_(12B)_Audio.ipynb (39.494), "
            "nb/CodeForces-cot-Finetune_for_Reasoning_on_CodeForces.ipynb (39.557); "
            "https://github.com/TianheWu/CoSeR/issues/10 (39.50 GiB); "
            "https://github.com/vllm-project/vllm/issues/16570 (39.38 GiB)"
        ),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=1555.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=A100_DATASHEET,
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
        source=A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect=f"{PCIE4}; NVLink 3 bridge 600 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=250,
    ),
    GPU(
        name="A100-80GB",
        aliases=("a100 80gb", "a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", "a100 80g"),
        memory_bytes=81920 * MiB,  # nvidia-smi: 81920MiB
        # torch total_memory 79.318 GiB (26 notebook outputs); 79.251 (6, the 2026 notebooks); OOM
        # 79.25 GiB. The current drivers' figure is used (the older ones reserved less)
        driver_reserved_bytes=reserved_below(81920 * MiB, 79.251),
        capacity_source=(
            "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 "
            "nb/ERNIE_4_5_VL_28B_A3B_PT_Vision.ipynb (79.318), nb/Gemma4_(26B_A4B)-Text.ipynb "
            "(79.251); https://github.com/levihsu/OOTDiffusion/issues/235 (79.25 GiB)"
        ),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 0),
        memory_bandwidth_gbps=2039.0,
        bf16_dense_tflops=312.0,
        supports_bf16=True,
        supports_fp8=False,
        source=A100_DATASHEET,
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
        source=A100_DATASHEET,
        fp16_dense_tflops=312.0,
        int8_dense_tops=624.0,
        fp32_tflops=19.5,
        interconnect=f"{PCIE4}; NVLink 3 bridge 600 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    # ---- Ada Lovelace (datasheet figures: dense | sparse, FP32 accumulate at full rate) ------
    GPU(
        name="L4",
        aliases=("NVIDIA L4", "l4 24gb"),
        memory_bytes=23034 * MiB,  # nvidia-smi: 23034MiB (ECC on)
        # torch total_memory 22.161 GiB (30 notebook outputs)
        driver_reserved_bytes=reserved_below(23034 * MiB, 22.161),
        capacity_source=(
            "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 "
            "nb/Deepseek_OCR_(3B)-Eval.ipynb (22.161)"
        ),
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
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=72,
    ),
    GPU(
        name="L40",
        aliases=("NVIDIA L40", "l40 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (48 GiB GDDR6, ECC on)
        # torch: 44.40 GiB total capacity (one OOM message, CUDA 12.8)
        driver_reserved_bytes=reserved_below(46068 * MiB, 44.40),
        capacity_source=("https://github.com/NVlabs/Eagle/issues/68 (44.40 GiB)"),
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
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    GPU(
        name="L40S",
        aliases=("NVIDIA L40S", "l40s 48gb"),
        memory_bytes=46068 * MiB,  # nvidia-smi: 46068MiB (ECC on)
        # torch: 44.53 GiB total capacity (one OOM message)
        driver_reserved_bytes=reserved_below(46068 * MiB, 44.53),
        capacity_source=("https://github.com/Wan-Video/Wan2.1/issues/205 (44.53 GiB)"),
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
        interconnect=PCIE4,
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
        # vLLM's mem_get_info total 79.19 GiB in 41 of the 52 H100 logs of
        # benchmarks/data/vllm_startup_logs.jsonl (79.18-79.22); OOM message 79.11 GiB
        driver_reserved_bytes=reserved_below(81559 * MiB, 79.19),
        capacity_source=(
            "benchmarks/data/vllm_startup_logs.jsonl (llm-d-planner and llm-d-benchmark logs, "
            "79.19 GiB); https://github.com/vllm-project/vllm/issues/27508 (79.11 GiB)"
        ),
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=3350.0,
        bf16_dense_tflops=989.4,  # datasheet 1979 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=H100_DATASHEET,
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
        # capacity estimated (no PCIe observation; the SXM's 79.19 GiB is not carried over)
        vendor="nvidia",
        arch="hopper",
        compute_capability=(9, 0),
        memory_bandwidth_gbps=2000.0,
        bf16_dense_tflops=756.0,  # datasheet 1513 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=H100_DATASHEET,
        fp16_dense_tflops=756.0,
        fp8_dense_tflops=1513.0,
        int8_dense_tops=1513.0,
        fp32_tflops=51.0,
        interconnect=f"{PCIE5}; NVLink bridge 600 GB/s (pairs)",
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
        source=H100_DATASHEET,
        fp16_dense_tflops=835.5,
        fp8_dense_tflops=1670.5,  # 3341 with sparsity
        int8_dense_tops=1670.5,
        fp32_tflops=60.0,
        interconnect=f"{PCIE5}; NVLink bridge 600 GB/s (pairs)",
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
        source=H200_DATASHEET,
        driver_reserved_bytes=616 * MiB,
        capacity_source=(
            "measured on an H200 of this project (driver 580.159.04, torch 2.11): nvidia-smi "
            "memory.reserved 616 MiB; torch total_memory 150,109,880,320 B"
        ),
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
        source=H200_DATASHEET,
        fp16_dense_tflops=835.5,
        fp8_dense_tflops=1670.5,  # 3341 with sparsity
        int8_dense_tops=1670.5,
        fp32_tflops=60.0,
        interconnect=f"{PCIE5}; NVLink bridge 900 GB/s (2 or 4 GPUs)",
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
        supports_fp4=True,
        scale_up_gpus=8,  # HGX / DGX B200: 8 GPUs on NVLink Switch
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
        supports_fp4=True,
        scale_up_gpus=72,  # GB200 NVL72: 72 GPUs on one NVLink Switch domain
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
        source=f"{AMD_DATASHEETS}data-sheets/amd-instinct-mi300x-data-sheet.pdf",
        fp16_dense_tflops=1307.4,
        fp8_dense_tflops=2614.9,
        int8_dense_tops=2614.9,
        fp32_tflops=163.4,
        interconnect="Infinity Fabric 7 x 128 GB/s = 896 GB/s; PCIe 5.0 x16 128 GB/s",
        interconnect_gbps=896.0,
        form_factor="oam",
        scale_up_gpus=8,  # 8 OAM modules on one Infinity Fabric mesh (AMD Instinct platform)
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
        scale_up_gpus=8,  # 8 OAM modules on one Infinity Fabric mesh (AMD Instinct platform)
        tdp_w=1000,
    ),
    # ---- added for multi-GPU training (par-a, issue 30) ----------------------------------
    GPU(
        name="B300",
        aliases=("NVIDIA B300", "NVIDIA B300 SXM6 AC", "b300 288gb", "blackwell ultra"),
        # Derived, unmeasured: 288 GB of HBM3e against the B200's 192 GB on the same stack
        # technology; B200's nvidia-smi 183359 MiB x 1.5 = 275038 MiB.
        memory_bytes=275038 * MiB,
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(10, 3),  # sm_103 (Blackwell Ultra)
        memory_bandwidth_gbps=8000.0,
        # HGX B300 (8 GPUs), with sparsity: FP16/BF16 36 PFLOPS, FP8 72 PFLOPS; per GPU dense =
        # / 8 / 2 (the same reading as NVIDIA/cosmos-framework#114: 2.25 PFLOP/s BF16 dense).
        bf16_dense_tflops=2250.0,
        supports_bf16=True,
        supports_fp8=True,
        supports_fp4=True,
        source="https://www.nvidia.com/en-us/data-center/hgx/",
        fp16_dense_tflops=2250.0,
        fp8_dense_tflops=4500.0,
        interconnect="NVLink 5 1800 GB/s",
        interconnect_gbps=1800.0,
        form_factor="sxm",
        scale_up_gpus=8,  # HGX B300: 8 GPUs on NVLink Switch
    ),
    GPU(
        name="GB300",
        # One Blackwell Ultra GPU of a GB300 superchip (2 GPUs + 1 Grace CPU).
        aliases=("NVIDIA GB300", "gb300 288gb"),
        memory_bytes=275038 * MiB,  # derived as B300's (288 GB HBM3e per GPU), unmeasured
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(10, 3),
        # GB300 NVL72 page (72 GPUs), with sparsity: FP16/BF16 360 PFLOPS, FP8 720 PFLOPS;
        # per GPU dense = / 72 / 2.
        memory_bandwidth_gbps=8000.0,
        bf16_dense_tflops=2500.0,
        supports_bf16=True,
        supports_fp8=True,
        supports_fp4=True,
        source="https://www.nvidia.com/en-us/data-center/gb300-nvl72/",
        fp16_dense_tflops=2500.0,
        fp8_dense_tflops=5000.0,
        interconnect="NVLink 5 1800 GB/s; NVLink-C2C 900 GB/s to the Grace CPU",
        interconnect_gbps=1800.0,
        form_factor="superchip",
        scale_up_gpus=72,  # GB300 NVL72: one NVLink Switch domain
    ),
    GPU(
        name="MI355X",
        aliases=("AMD Instinct MI355X", "mi355x 288gb", "AMD Instinct MI355X OAM"),
        # Derived, unmeasured: ROCm torch reports the MI300X's 192 GB as 191.98 GiB and the
        # MI325X's 256 GB as 255.98 GiB (hipMemGetInfo); 288 GB read the same way is 287.98 GiB
        # = 294892 MiB.
        memory_bytes=294892 * MiB,
        vendor="amd",
        arch="cdna4",
        compute_capability=None,  # gfx950
        memory_bandwidth_gbps=8000.0,
        # Product page, dense peaks: FP16/BF16 2.5 PFLOPS (2516.6), FP8 5.0 PFLOPS (5033.2),
        # MXFP4 10 PFLOPS, FP32 vector 157.3 TFLOPS; 1400 W board power; 7 Infinity Fabric
        # links x 153.6 GB/s.
        bf16_dense_tflops=2516.6,
        supports_bf16=True,
        supports_fp8=True,
        supports_fp4=True,
        source="https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html",
        fp16_dense_tflops=2516.6,
        fp8_dense_tflops=5033.2,
        fp32_tflops=157.3,
        interconnect="Infinity Fabric 7 x 153.6 GB/s = 1075.2 GB/s; PCIe 5.0 x16 128 GB/s",
        interconnect_gbps=1075.2,
        form_factor="oam",
        tdp_w=1400,
        scale_up_gpus=8,  # 8 OAM modules per platform
    ),
)

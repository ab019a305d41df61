"""Workstation (RTX A / Ada / PRO) and GeForce cards of the catalog: the GPUs people fine-tune on at
home or rent by the hour from community clouds. Field conventions: :mod:`memfit.hardware.gpu`."""

from __future__ import annotations

from memfit.hardware.gpu import (
    ADA_WHITEPAPER,
    BLACKWELL_RTX_WHITEPAPER,
    GA102_WHITEPAPER,
    GPU,
    PCIE4,
    PCIE5,
    reserved_below,
)
from memfit.units import MiB

DESKTOP_GPUS: tuple[GPU, ...] = (
    # ---- Ampere ----------------------------------------------------------------------------
    GPU(
        name="RTX-A4000",
        aliases=("NVIDIA RTX A4000", "rtx a4000", "a4000"),
        memory_bytes=16376 * MiB,  # nvidia-smi: 16376MiB (ECC off, the workstation default)
        # torch: 15.61 GiB total capacity (one OOM message)
        driver_reserved_bytes=reserved_below(16376 * MiB, 15.61),
        capacity_source=("https://github.com/DengKaiCQ/VGGT-Long/issues/6 (15.61 GiB)"),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=448.0,
        # Datasheet "Tensor Performance 153.4 TFLOPS" (with sparsity): the FP16/BF16 FP32-
        # accumulate rate at full speed, as on the RTX A6000; dense = half.
        bf16_dense_tflops=76.7,
        supports_bf16=True,
        supports_fp8=False,
        source="https://www.nvidia.com/en-us/design-visualization/rtx-a4000/",
        fp16_dense_tflops=76.7,
        int8_dense_tops=None,  # not published for the A4000
        fp32_tflops=19.2,
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=140,
    ),
    GPU(
        name="RTX-A5000",
        aliases=("NVIDIA RTX A5000", "rtx a5000", "a5000"),
        memory_bytes=24564 * MiB,  # nvidia-smi: 24564MiB (ECC off, the workstation default)
        # vLLM 0.21 log: mem_get_info total 23.85 GiB (benchmarks/data/vllm_startup_logs.jsonl)
        driver_reserved_bytes=reserved_below(24564 * MiB, 23.85),
        capacity_source=("https://github.com/LMCache/LMCache/issues/3430 (23.85 GiB)"),
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
        interconnect=f"{PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
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
        interconnect=f"{PCIE4}; NVLink bridge 112.5 GB/s (pairs)",
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
        rate_source=GA102_WHITEPAPER,
    ),
    # GeForce rates not on a datasheet are derived from the whitepapers' per-SM rates: dense FP16
    # tensor math with FP16 accumulate runs 1024 FLOP per SM per clock on GA10x and AD10x (RTX
    # 3090: 82 SMs x 1.695 GHz x 1024 = 142 TFLOPS, GA102 whitepaper; RTX 4090: 128 x 2.52 GHz x
    # 1024 = 330 TFLOPS, Ada whitepaper), GeForce runs FP32 accumulate (bf16, fp16 here) at half
    # that and Ada fp8 with FP32 accumulate at that rate; FP32 = 2 x CUDA cores x boost clock.
    # SM counts and boost clocks from each card's NVIDIA spec page (``source``).
    GPU(
        name="RTX-3060",
        # The 12 GB card; an 8 GB RTX 3060 (128-bit, 240 GB/s) reports the same device name.
        aliases=("NVIDIA GeForce RTX 3060", "rtx 3060", "rtx 3060 12gb", "3060"),
        memory_bytes=12288 * MiB,  # nvidia-smi: 12288MiB
        # torch: 11.76 GiB total capacity; 11.75 in two other OOM messages
        driver_reserved_bytes=reserved_below(12288 * MiB, 11.76),
        capacity_source=(
            "https://github.com/TencentARC/PhotoMaker/issues/47 (11.76 GiB); "
            "https://github.com/Kunhao-Liu/StyleGaussian/issues/12 (11.75 GiB); "
            "https://github.com/smy20011/dreambooth-gui/issues/78 (11.75 GiB)"
        ),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=360.0,
        bf16_dense_tflops=25.5,  # 28 SMs x 1.777 GHz x 1024 / 2 (FP32 accumulate)
        supports_bf16=True,
        supports_fp8=False,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti/",
        fp16_dense_tflops=25.5,
        int8_dense_tops=101.9,  # 2 x the FP16-accumulate rate
        fp32_tflops=12.7,  # 3584 CUDA cores x 2 x 1.777 GHz
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=170,
        rate_source=GA102_WHITEPAPER,
    ),
    GPU(
        name="RTX-3090",
        aliases=("NVIDIA GeForce RTX 3090", "rtx 3090", "3090"),
        memory_bytes=24576 * MiB,  # nvidia-smi: 24576MiB on current drivers (older: 24268MiB)
        # torch: 23.70 GiB total capacity (2022 driver, whose memory.total was 24268 MiB)
        driver_reserved_bytes=reserved_below(24576 * MiB, 23.70),
        capacity_source=("https://github.com/GaoLii/DSP/issues/10 (23.70 GiB)"),
        vendor="nvidia",
        arch="ampere",
        compute_capability=(8, 6),
        memory_bandwidth_gbps=936.0,
        bf16_dense_tflops=71.0,  # GeForce: FP32-accumulate tensor rate is half the fp16 rate
        supports_bf16=True,
        supports_fp8=False,
        source=GA102_WHITEPAPER,
        fp16_dense_tflops=71.0,  # 71 | 142 with sparsity (FP32 accumulate; 142 with FP16 acc.)
        int8_dense_tops=284.0,  # 284 | 568 with sparsity
        fp32_tflops=35.6,
        interconnect=f"{PCIE4}; NVLink 3 bridge 112.5 GB/s (pairs)",
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
        # capacity estimated: the OOM message found (15.99 GiB, aigc-apps/sd-webui-EasyPhoto#281)
        # is from Windows, whose WDDM driver reports the full memory.total
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=716.8,
        bf16_dense_tflops=97.5,  # 97.5 | 194.9 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=ADA_WHITEPAPER,
        fp16_dense_tflops=97.5,
        fp8_dense_tflops=194.9,  # 194.9 | 389.9 with sparsity
        int8_dense_tops=389.9,  # 389.9 | 779.8 with sparsity
        fp32_tflops=48.7,
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=320,
    ),
    GPU(
        name="RTX-4060-Ti-16GB",
        # The 16 GB card; the 8 GB RTX 4060 Ti (8188 MiB) reports the same device name.
        aliases=("NVIDIA GeForce RTX 4060 Ti", "rtx 4060 ti", "rtx 4060 ti 16gb", "4060 ti"),
        memory_bytes=16380 * MiB,  # nvidia-smi: 16380MiB
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=288.0,
        bf16_dense_tflops=44.1,  # 34 SMs x 2.535 GHz x 1024 / 2 (FP32 accumulate)
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4060-4060ti/",
        fp16_dense_tflops=44.1,
        fp8_dense_tflops=88.3,  # FP32 accumulate
        int8_dense_tops=176.5,
        fp32_tflops=22.1,  # 4352 CUDA cores x 2 x 2.535 GHz
        interconnect="PCIe 4.0 x8 32 GB/s",  # an x8 card: half the x16 rate
        interconnect_gbps=32.0,
        form_factor="pcie",
        tdp_w=165,
        rate_source=ADA_WHITEPAPER,
    ),
    GPU(
        name="RTX-4070-Ti-SUPER",
        aliases=("NVIDIA GeForce RTX 4070 Ti SUPER", "rtx 4070 ti super", "4070 ti super"),
        memory_bytes=16376 * MiB,  # nvidia-smi: 16376MiB
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=672.0,
        bf16_dense_tflops=88.2,  # 66 SMs x 2.61 GHz x 1024 / 2 (FP32 accumulate)
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4070-family/",
        fp16_dense_tflops=88.2,
        fp8_dense_tflops=176.4,
        int8_dense_tops=352.8,
        fp32_tflops=44.1,  # 8448 CUDA cores x 2 x 2.61 GHz
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=285,
        rate_source=ADA_WHITEPAPER,
    ),
    GPU(
        name="RTX-4080-SUPER",
        aliases=("NVIDIA GeForce RTX 4080 SUPER", "rtx 4080 super", "4080 super"),
        # nvidia-smi: 16376MiB; deviceQuery: 80 multiprocessors, 2550 MHz max clock
        memory_bytes=16376 * MiB,
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=736.0,
        bf16_dense_tflops=104.4,  # 80 SMs x 2.55 GHz x 1024 / 2 (FP32 accumulate)
        supports_bf16=True,
        supports_fp8=True,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4080-family/",
        fp16_dense_tflops=104.4,
        fp8_dense_tflops=208.9,
        int8_dense_tops=417.8,
        fp32_tflops=52.2,  # 10240 CUDA cores x 2 x 2.55 GHz
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=320,
        rate_source=ADA_WHITEPAPER,
    ),
    GPU(
        name="RTX-4090",
        aliases=("NVIDIA GeForce RTX 4090", "rtx 4090", "4090"),
        memory_bytes=24564 * MiB,  # nvidia-smi: 24564MiB
        # torch: 23.64 GiB total capacity (two OOM messages); 23.65 (two), 23.68 (2023), 23.61 (one,
        # a display attached)
        driver_reserved_bytes=reserved_below(24564 * MiB, 23.64),
        capacity_source=(
            "https://github.com/ali-vilab/VGen/issues/104 (23.64 GiB); "
            "https://github.com/3DTopia/Phidias-Diffusion/issues/8 (23.64 GiB); "
            "https://github.com/MotrixLab/AiOS/issues/29 (23.65 GiB); "
            "https://github.com/zai-org/CogVideo/issues/36 (23.68 GiB); "
            "https://github.com/pinokiofactory/flux-webui/issues/11 (23.61 GiB)"
        ),
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=1008.0,
        bf16_dense_tflops=165.2,  # 165.2 | 330.4 with sparsity
        supports_bf16=True,
        supports_fp8=True,
        source=ADA_WHITEPAPER,
        fp16_dense_tflops=165.2,
        fp8_dense_tflops=330.3,  # 330.3 | 660.6 with sparsity
        int8_dense_tops=660.6,  # 660.6 | 1321.2 with sparsity
        fp32_tflops=82.6,
        interconnect=PCIE4,
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
        # capacity estimated: the one OOM message found (44.43 GiB, DINGYANB/MTVCrafter#21) is of a
        # card with ECC on (memory.total 46068 MiB), not this row's ECC-off 49140 MiB
        vendor="nvidia",
        arch="ada",
        compute_capability=(8, 9),
        memory_bandwidth_gbps=960.0,
        bf16_dense_tflops=364.2,  # 364.2 | 728.4 with sparsity, full-rate FP32 accumulate
        supports_bf16=True,
        supports_fp8=True,
        source=ADA_WHITEPAPER,
        fp16_dense_tflops=364.2,
        fp8_dense_tflops=728.5,  # 728.5 | 1457 with sparsity
        int8_dense_tops=728.5,  # 728.5 | 1457 with sparsity
        fp32_tflops=91.1,
        interconnect=PCIE4,
        interconnect_gbps=64.0,
        form_factor="pcie",
        tdp_w=300,
    ),
    # ---- Blackwell -------------------------------------------------------------------------
    GPU(
        name="RTX-5090",
        aliases=("NVIDIA GeForce RTX 5090", "rtx 5090", "5090"),
        memory_bytes=32607 * MiB,  # nvidia-smi: 32607MiB
        # torch: 31.37 GiB total capacity (one OOM message)
        driver_reserved_bytes=reserved_below(32607 * MiB, 31.37),
        capacity_source=("https://github.com/Wan-Video/Wan2.1/issues/465 (31.37 GiB)"),
        vendor="nvidia",
        arch="blackwell",
        compute_capability=(12, 0),
        memory_bandwidth_gbps=1792.0,
        bf16_dense_tflops=209.5,  # 209.5 | 419 with sparsity, FP32 accumulate (GeForce half rate)
        supports_bf16=True,
        supports_fp8=True,
        supports_fp4=True,
        source=BLACKWELL_RTX_WHITEPAPER,
        fp16_dense_tflops=209.5,
        fp8_dense_tflops=419.0,  # 419 | 838 with sparsity, FP32 accumulate
        int8_dense_tops=838.0,  # 838 | 1676 with sparsity
        fp32_tflops=104.8,
        interconnect=PCIE5,
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
        # 300 W Max-Q). NVIDIA quotes tensor throughput as FP4 "AI TOPS" with sparsity: 4000 for
        # the Workstation Edition (3511 Max-Q), and FP32 125 TFLOPS. Rates here are the
        # Workstation Edition's (an upper bound for Max-Q): dense FP4 = 4000 / 2, FP8 = FP4 / 2,
        # FP16/BF16 = FP8 / 2, at full rate with FP32 accumulate as on the RTX 6000 Ada (the
        # check: 188 SMs x 2.617 GHz x 1024 FLOP/SM/clock = 504 TFLOPS).
        bf16_dense_tflops=500.0,
        supports_bf16=True,
        supports_fp8=True,
        supports_fp4=True,
        source=(
            "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/"
            "rtx-pro-6000/"
        ),
        fp16_dense_tflops=500.0,
        fp8_dense_tflops=1000.0,
        fp32_tflops=125.0,
        tdp_w=600,
        interconnect=PCIE5,
        interconnect_gbps=128.0,
        form_factor="pcie",
    ),
)

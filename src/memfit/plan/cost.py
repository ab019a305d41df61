"""Predicted step time of a plan: a roofline per GPU, calibrated on published throughputs.

Training (one optimizer step over the global batch, per data-parallel rank)::

    micro-batch = max(FLOPs / (peak · MFU[arch]), weight bytes moved / (bandwidth · MBU))
                  + dequantization + host overhead · n_layer · passes
    FLOPs       = forward · (1 + backward factor) + recompute          (Kaplan et al. 2020, §2.1)
    forward     = 2 · N_matmul · tokens + attention · 2 · n_layer · seq · d_model · tokens
    step        = max(n_accum · micro-batch, collectives) + optimizer + host-link traffic

``MFU[arch]`` is the model-FLOPs utilization dense 16-bit training reaches on each GPU generation
(:data:`MFU_BY_ARCH`); eager attention (the (B, H, S, S) score matrix in memory) costs
:data:`ATTENTION_EAGER_SLOWDOWN` times the FLOP time of a fused (SDPA / FlashAttention) kernel.
Quantized weights are dequantized to 16 bits before each matmul pass (bitsandbytes,
GPTQ/AWQ training kernels): extra bytes per weight per pass (:data:`DEQUANT_BYTES_PER_WEIGHT`).
Offload moves bytes over the real host link (:data:`PCIE_GBPS_PER_DIRECTION` by generation) at
``host_link_efficiency``: ZeRO-Offload moves gradients down and 16-bit parameters up once per
step and steps the optimizer on the CPU; ZeRO-3 parameter offload streams every weight up for
the forward AND the backward of every micro-batch. ZeRO-3/FSDP all-gather the weights (forward
and backward) and reduce-scatter the gradients per micro-batch; DDP all-reduces once per step.
Eager PyTorch pays a host overhead per layer per pass (kernel launches, Python dispatch; more for
quantized linears and under DeepSpeed ZeRO / offload hooks) that dominates small micro-batches
and decode; compiled CUDA-graph runs do not. It is fitted on the eager published points and
added with ``eager_overhead=True``; the planner prices the GPU work without it.

Inference (one batch of requests): prefill is compute-bound, each decode step is memory-bound:
the weights plus the KV cache are read once per new token,
``max(bytes / (bandwidth · MBU), 2 · N · batch / (peak · MFU))`` plus the host overhead
(weight-only quantized kernels reach a smaller share of the bandwidth; tensor parallelism adds
two all-reduce latencies per layer).

Every rule of thumb is in :data:`COST_CONSTANTS` with its source; the free ones (MFU per
generation, dequantization traffic, host overheads, decode bandwidth, TP all-reduce latency,
host-link efficiency) are fitted by
``benchmarks/step_time_calibration.py`` on published throughputs
(``benchmarks/data/step_time_published.jsonl``): median log-ratio per class, see
docs/accuracy.md "Step time (planner)". The model ranks plans; its absolute numbers are a
calibrated roofline (median error there), not a measurement of the user's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.models.model_spec import ModelSpec
from memfit.plan.space import Settings
from memfit.spec import PRECISION_RULES, fsdp_mixed_policy, precision_rule
from memfit.spec.rules import LAYER_SAC, layer_sac_checkpointed

_FIT = "fitted by benchmarks/step_time_calibration.py (median log-ratio of its class)"

#: Rules of thumb of the cost model, each with its source. Entries marked "fitted" are the free
#: constants of the calibration (see the module docstring); the rest are fixed from the source.
COST_CONSTANTS: dict[str, tuple[float, str]] = {
    "mfu": (
        0.55,
        "default model FLOPs utilization of dense 16-bit training/prefill (a generation missing "
        "from MFU_BY_ARCH, and the figure `memfit plan` prints): the fitted Ampere value of "
        "MFU_BY_ARCH; Chowdhery et al. 2022 (PaLM) Table 3 report 21-46 % at scale, torchtitan "
        "docs/performance.md 33-39 % (8 H100, Llama 3.1 8B) and 51-61 % (A100)",
    ),
    "mbu": (
        0.70,
        "fraction of peak memory bandwidth that memory-bound kernels (optimizer step, "
        "dequantization) achieve: memfit's assumption, not measured",
    ),
    "decode_mbu": (
        0.70,
        "fraction of peak memory bandwidth a batch-1 decode step reads weights at: gpt-fast "
        "README (pytorch-labs/gpt-fast @0f925b5) measures 1397 GB/s of an A100-80GB's 2039 "
        "(0.69, power-limited to 330 W); " + _FIT + " (compiled bf16 batch-1 decode)",
    ),
    "quant_decode_bandwidth_share": (
        0.76,
        "share of decode_mbu that weight-only quantized GEMV kernels reach (unpacking and "
        "scales cost issue slots): gpt-fast's README reports 1069 (int8) and 863 GB/s (int4) "
        "against 1397 GB/s for bf16 on one A100; " + _FIT,
    ),
    "backward_per_forward": (
        2.0,
        "backward = 2 x forward FLOPs (gradients w.r.t. inputs and w.r.t. weights, one forward "
        "each): Kaplan et al. 2020 §2.1, the 6N = 2N + 4N rule",
    ),
    "host_memory_gbps": (
        100.0,
        "host DRAM bandwidth a CPU optimizer step (ZeRO-Offload's CPU-Adam) streams at: 8-channel "
        "DDR4-3200 peaks at 204.8 GB/s per socket (JEDEC); memfit assumes half",
    ),
    "host_link_efficiency": (
        0.44,
        "fraction of the PCIe x16 peak per direction that offload copies reach (pinned memory; "
        "nvbandwidth / bandwidthTest report ~25 of 32 GB/s on Gen4, ~13 of 16 on Gen3); " + _FIT,
    ),
    "link_efficiency": (
        0.75,
        "fraction of the GPU-to-GPU link a ring collective reaches (NCCL bus bandwidth): "
        "nccl-tests all_reduce_perf on 8 A100 NVLink reaches ~230 of 300 GB/s per direction; "
        "memfit's assumption for PCIe too",
    ),
    "host_overhead_per_layer_s": (
        1.1e-3,
        "host time per transformer layer per forward-equivalent pass of eager PyTorch (kernel "
        "launches, Python dispatch, ~20-40 kernels of ~10-30 us per layer); dominates "
        "micro-batches of a few hundred tokens and decode: " + _FIT,
    ),
    "zero_hook_overhead_per_layer_s": (
        1.1e-3,
        "extra host time per layer per pass of DeepSpeed ZeRO stages and of offload (ZeRO-3 / "
        "FSDP-offload fetch and release hooks, ZeRO-2 per-parameter gradient hooks in the "
        "backward): TensorAuto/OpenTau issue #177 measures DeepSpeed ZeRO-2 2.9x slower per "
        "step than DDP on 8 A100 for a model of many small tensors, the hooks dominating; "
        "memfit's assumption: as much again as the eager overhead (host_overhead_per_layer_s)",
    ),
    "tp_allreduce_latency_s": (
        24e-6,
        "latency of one small all-reduce of the hidden states (2 per layer per decode step under "
        "tensor parallelism, Shoeybi et al. 2019 §3): NCCL small-message latency on NVLink is "
        "~10-30 us (nccl-tests); " + _FIT,
    ),
    "quant_overhead_per_layer_s": (
        0.27e-3,
        "extra host time per layer per pass of eager 4-bit/8-bit linears (bitsandbytes "
        "Linear4bit / auto-gptq QuantLinear: quant-state handling, extra launches): " + _FIT,
    ),
}

#: Achievable MFU of dense 16-bit (fp16 on Volta/Turing, bf16 from Ampere) training per GPU
#: generation, against the catalog's dense tensor rate with FP32 accumulate. Fitted by
#: benchmarks/step_time_calibration.py on the compute-bound published points (>= 2048 tokens per
#: micro-batch, no quantization, no offload): Ampere (LitGPT/Qwen A100, torchtune 8x A100), Ada
#: (torchtune RTX 4090), Hopper (torchtitan 8x H100: 500 W HBM2e parts priced as H100 SXM, so
#: low). Volta's only point (ZeRO-Offload) is offload-bound and fits the host link instead; Volta
#: and Turing take Ampere's value, Blackwell and CDNA3 Hopper's: memfit's assumption (no point).
MFU_BY_ARCH: dict[str, float] = {
    "volta": 0.55,
    "turing": 0.55,
    "ampere": 0.55,
    "ada": 0.64,
    "hopper": 0.34,
    "blackwell": 0.34,
    "cdna3": 0.34,
    "cdna4": 0.34,  # as CDNA3 (no point)
}
#: fp32 matmuls run on the CUDA cores (no TF32 assumed) at this utilization (SGEMM reaches
#: ~70-80 % of the FP32 peak; memfit assumes the 16-bit MFU, the rest of the step being alike).
#: Eager attention: FlashAttention (Dao et al. 2022, §4.1) reports 2-4x faster attention than the
#: PyTorch standard implementation at seq 512-4k, FlashAttention-2 (Dao 2023) up to 9x; memfit
#: charges the attention FLOPs 3x under ``attention="eager"``.
ATTENTION_EAGER_SLOWDOWN = 3.0

#: Host<->GPU link per direction, GB/s, by architecture: PCIe x16 as PCI-SIG specifies it
#: (Gen3 16, Gen4 32, Gen5 64 GB/s per direction). Superchips (GH200/GB200) use NVLink-C2C
#: (450 GB/s per direction, NVIDIA GH200 datasheet).
PCIE_GBPS_PER_DIRECTION = {
    "volta": 16.0,
    "turing": 16.0,
    "ampere": 32.0,
    "ada": 32.0,
    "hopper": 64.0,
    "blackwell": 64.0,
    "cdna3": 64.0,
    "cdna4": 64.0,
}
NVLINK_C2C_GBPS_PER_DIRECTION = 450.0

#: Bytes read + written per trainable parameter by one optimizer step (memory-bound):
#: AdamW (fp32 master): read p, g, m, v (4 each) and write p, m, v = 28; 8-bit AdamW: m, v are
#: 1 B each: read 4+4+1+1, write 4+1+1 = 16; Adafactor (factored second moment, no first moment,
#: Shazeer & Stern 2018): read p, g, write p = 12; Lion (one momentum): read p, g, m, write p, m =
#: 20; SGD: 12; SGD momentum: 20; Muon (one momentum; its Newton-Schulz matmuls, ~30·m FLOPs
#: per element of an m-row matrix, a few per cent of a step's 6·N·tokens, are not priced): 20.
#: Scaled by the parameter width for pure bf16/fp16 (below).
OPTIMIZER_STEP_BYTES = {
    "adamw": 28,
    "adamw-fused": 28,
    "adamw-8bit": 16,
    "paged-adamw-8bit": 16,
    "paged-adamw-32bit": 28,  # AdamW's traffic, states fp32
    "adafactor": 12,
    "lion": 20,
    "muon": 20,
    "sgd": 12,
    "sgd-momentum": 20,
    "none": 0,
}

#: Share of a block's forward matmul FLOPs torchtitan's per-op SAC recomputes (wk, wo, w3 of
#: Llama-3-8B: (4096·1024 + 4096² + 4096·14336) / (2·4096² + 2·4096·1024 + 3·4096·14336)).
SAC_OP_RECOMPUTE = 0.37

#: Bytes per weight as stored, per quantized format (4-bit: 0.5 B plus its scales; bitsandbytes
#: block of 64 with an fp32 absmax = +1/16, double quant ~ +1/128; GPTQ/AWQ group 128 fp16 scale +
#: packed zero = +1/64 + 1/256), docs of each library (see memfit.estimate.quant).
STORED_BYTES_PER_WEIGHT = {
    "int8": 1.0,
    "fp8": 1.0,
    "nf4": 0.5 + 4 / 64,
    "fp4": 0.5 + 4 / 64,
    "nf4-dq": 0.5 + 1 / 64 + 4 / (64 * 256),
    "int4-gptq": 0.5 + 2 / 128 + 0.5 / 128,
    "int4-awq": 0.5 + 2 / 128 + 0.5 / 128,
}
#: Formats whose kernels dequantize the weight into a 16-bit temporary before a dense matmul once
#: a matmul has more than a few rows (memfit.estimate.quant.FUSED_MAX_TOKENS). bitsandbytes'
#: LLM.int8() (``MatMul8bitLt``) counts too: its backward dequantizes the int8 weight
#: (``CB * SCB / 127``) into a 16-bit copy for the input gradient, and its forward adds activation
#: quantization and an fp16 outlier matmul (Dettmers et al. 2022, §3.2: slower than fp16 below
#: ~6.7B parameters).
DEQUANTIZING_FORMATS = ("nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "int8")
#: Bytes of memory traffic per weight per dequantizing pass, per kernel family, at ``mbu``: the
#: floor is read the packed weight + write the 16-bit copy + read it back in the GEMM (0.5 + 2 +
#: 2 ~ 4.5 B); the measured cost is higher (separate launches per linear, small blocks). Fitted
#: on the QLoRA points (bitsandbytes: LitGPT resource tables, torchtune; GPTQ: Qwen README).
DEQUANT_BYTES_PER_WEIGHT = {
    "nf4": 4.5,
    "nf4-dq": 4.5,
    "fp4": 4.5,
    "int8": 4.5,
    "int4-gptq": 12.2,
    "int4-awq": 12.2,
}
#: Kept for callers of the old name: the floor of the dequantization traffic (see above).
DEQUANT_EXTRA_BYTES_PER_WEIGHT = 4.0


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """What the cost model needs to know of a model (from its ModelSpec and one estimate)."""

    n_params: int
    n_layers: int
    d_model: int
    vocab_size: int
    kv_bytes_per_token_per_byte: int  # 2 (K and V) · n_layers · n_kv_heads · head_dim
    tied_embeddings: bool

    @classmethod
    def from_spec(cls, spec: ModelSpec | None, n_params: int) -> ModelFacts:
        """The facts of ``spec`` (its text tower's, for a multi-part model). Unknown counts are
        0 (one head); an unknown tie flag counts the embedding as a matmul (tied)."""
        s = spec if spec is not None else ModelSpec(model_type=None)
        d = s.text_field("hidden_size") or 0
        layers = s.text_field("n_layers") or 0
        heads = s.text_field("n_heads") or 1
        kv_heads = s.text_field("n_kv_heads") or heads
        head_dim = s.text_field("head_dim") or d // max(heads, 1)
        tied = s.text_field("tie_word_embeddings")
        return cls(
            n_params=n_params,
            n_layers=layers,
            d_model=d,
            vocab_size=s.text_field("vocab_size") or 0,
            kv_bytes_per_token_per_byte=2 * layers * kv_heads * head_dim,
            tied_embeddings=True if tied is None else tied,
        )

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, n_params: int) -> ModelFacts:
        """:meth:`from_spec` of a config.json dict."""
        return cls.from_spec(ModelSpec.from_config(config) if config else None, n_params)

    @property
    def n_matmul_params(self) -> int:
        """Parameters used in matmuls: all but an untied input embedding (a lookup)."""
        lookup = 0 if self.tied_embeddings else self.vocab_size * self.d_model
        return max(self.n_params - lookup, 1)


@dataclass(frozen=True, kw_only=True)
class Rates:
    """A GPU's rates in the units the cost model uses (FLOP/s, B/s)."""

    name: str
    flops: dict[str, float]  # compute precision -> FLOP/s (dense)
    memory_bps: float
    link_bps: float  # GPU-to-GPU, one direction
    host_bps: float  # host<->GPU, one direction
    arch: str = "ampere"  # GPU generation: picks the achievable MFU (MFU_BY_ARCH)

    @classmethod
    def of(cls, gpu: Any) -> Rates:
        def tflops(field: str) -> float | None:
            value = getattr(gpu, field, None)
            return None if value is None else float(value) * 1e12

        fp32 = tflops("fp32_tflops") or 0.0
        fp16 = tflops("fp16_dense_tflops") or tflops("bf16_dense_tflops") or fp32
        flops = {"fp32": fp32 or fp16 / 8, "fp16": fp16, "bf16": tflops("bf16_dense_tflops") or 0}
        if not flops["bf16"]:
            flops.pop("bf16")
        if not any(flops.values()) or not gpu.memory_bandwidth_gbps:
            raise SpecError(
                f"{gpu.name} has no published compute rate or memory bandwidth in the catalog "
                "(see `memfit gpus --json`), so memfit cannot predict step times on it; use "
                "`memfit fit` / `memfit estimate` for its memory, or pick a GPU with rates"
            )
        arch = getattr(gpu, "arch", "ampere")
        superchip = getattr(gpu, "form_factor", None) == "superchip"
        host = NVLINK_C2C_GBPS_PER_DIRECTION if superchip else PCIE_GBPS_PER_DIRECTION[arch]
        link = getattr(gpu, "interconnect_gbps", None) or 2 * PCIE_GBPS_PER_DIRECTION[arch]
        return cls(
            name=gpu.name,
            flops=flops,
            memory_bps=float(gpu.memory_bandwidth_gbps or 0) * 1e9,
            link_bps=float(link) / 2 * 1e9,
            host_bps=host * 1e9,
            arch=arch,
        )


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """Predicted time of one step and its parts (seconds); ``tokens_per_s`` over all GPUs."""

    step_s: float
    tokens_per_s: float
    parts_s: dict[str, float]


def _c(name: str) -> float:
    return COST_CONSTANTS[name][0]


def compute_dtype(precision: str) -> str:
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    return names[PRECISION_RULES[precision].compute]


def mfu(rates: Rates) -> float:
    """Achievable MFU of dense 16-bit training on ``rates``' GPU generation."""
    return MFU_BY_ARCH.get(rates.arch, _c("mfu"))


def _weight_bytes(s: Settings, facts: ModelFacts) -> float:
    """Bytes of the weights a matmul pass reads (16-bit copy for AMP: autocast's cast cache)."""
    if s.quant != "none":
        return facts.n_params * STORED_BYTES_PER_WEIGHT[s.quant]
    return facts.n_params * (4 if compute_dtype(s.precision) == "fp32" else 2)


def _flops_s(matmul: float, attention: float, s: Settings, rates: Rates, tp: int = 1) -> float:
    """Time of ``matmul`` + ``attention`` FLOPs at the generation's MFU (eager attention slower)."""
    rate = rates.flops.get(compute_dtype(s.precision), rates.flops["fp16"]) * tp * mfu(rates)
    slow = ATTENTION_EAGER_SLOWDOWN if s.attention == "eager" else 1.0
    return (matmul + attention * slow) / rate


def _dequant_s(s: Settings, facts: ModelFacts, tokens: int, rates: Rates) -> float:
    """One dequantizing pass over the weights (none for fused small-batch kernels)."""
    if s.quant not in DEQUANTIZING_FORMATS or tokens <= 4:
        return 0.0
    return facts.n_params * DEQUANT_BYTES_PER_WEIGHT[s.quant] / (rates.memory_bps * _c("mbu"))


def _host_s(s: Settings, facts: ModelFacts, passes: float, eager: bool) -> float:
    """Host (launch/dispatch) time of ``passes`` forward-equivalent passes over the layers of an
    eager run (0 unless ``eager``)."""
    if not eager:
        return 0.0
    per_layer = _c("host_overhead_per_layer_s")
    if s.quant != "none":
        per_layer += _c("quant_overhead_per_layer_s")
    if s.shard in ("zero1", "zero2", "zero3") or s.offload != "none":
        per_layer += _c("zero_hook_overhead_per_layer_s")
    return facts.n_layers * passes * per_layer


def recomputes_layers(checkpointing: str) -> bool:
    """Full checkpointing, and its host-RAM variant, rerun each layer's forward in backward."""
    return checkpointing in ("full", "offload")


def recompute_share(s: Settings, n_layers: int) -> float:
    """The share of the layers whose forward reruns in backward: all of them under
    :func:`recomputes_layers`, the blocks torchtitan's per-layer SAC wraps under
    ``selective-layer`` (``rules.layer_sac_checkpointed``), none otherwise."""
    if s.checkpointing == LAYER_SAC and n_layers:
        every = s.techniques.selective_ac_option
        return sum(layer_sac_checkpointed(n_layers, every)) / n_layers
    return 1.0 if recomputes_layers(s.checkpointing) else 0.0


def checkpoint_offload_s(s: Settings, facts: ModelFacts, tokens: int, rates: Rates) -> float:
    """Host-link time of checkpoints kept in host RAM (``--checkpointing offload``: Unsloth's
    smart gradient checkpointing, estimate/analytic/host_checkpoint.py): each layer's input
    goes to the host in the forward and comes back in the backward, ``2 x layers x tokens x
    d_model`` 16-bit values per micro-batch over the host link at ``host_link_efficiency``.
    The copies are non-blocking on a side stream (unsloth-zoo ``UnslothCheckpointFunction``),
    so the caller overlaps them with the compute."""
    width = 4 if compute_dtype(s.precision) == "fp32" else 2
    n_bytes = 2.0 * facts.n_layers * tokens * facts.d_model * width
    return n_bytes / (rates.host_bps * _c("host_link_efficiency"))


def trainable_fraction(s: Settings, facts: ModelFacts) -> float:
    """The planner's trainable share of the parameters: LoRA on every linear adds r·(in + out)
    per linear (Hu et al. 2021), ~ r·12·d per layer for a transformer block (4 attention
    projections + 3 MLP ones of 4d); freezing k of L layers leaves (L - k) / L."""
    f = facts
    if s.lora_rank is not None:
        return min(1.0, s.lora_rank * 12 * f.d_model * f.n_layers / max(f.n_params, 1))
    return 1.0 - s.freeze_layers / f.n_layers if f.n_layers else 1.0


def train_step_cost(
    s: Settings,
    facts: ModelFacts,
    rates: Rates,
    *,
    seq_len: int,
    trainable_fraction: float,
    eager_overhead: bool = False,
) -> StepCost:
    """One optimizer step of ``s.micro_batch x s.grad_accum`` samples per rank.
    ``eager_overhead``: add the host time of eager PyTorch per layer per pass (fitted on the
    published eager runs; it dominates micro-batches of a few hundred tokens). The planner leaves
    it out: it prices the GPU work, and its ties between micro-batch splits of one stack go to
    the larger micro-batch (``search.rank_key``), the direction the overhead points."""
    tokens = s.micro_batch * seq_len
    attn_fwd = 2.0 * facts.n_layers * seq_len * facts.d_model * tokens
    mm_fwd = 2.0 * facts.n_matmul_params * tokens
    frozen_share = s.freeze_layers / facts.n_layers if facts.n_layers else 0.0
    # backward: grad-input (1 forward) for layers after the first trainable one, grad-weight (1
    # forward) for the trainable share only (attention has no weights: 2 forwards)
    bwd_factor = (1.0 - frozen_share) * (
        1.0 + trainable_fraction * (_c("backward_per_forward") - 1)
    )
    attn_bwd = attn_fwd * (1.0 - frozen_share) * _c("backward_per_forward")
    # torchtitan's per-op SAC (``selective-op``) recomputes every other matmul of a block (wk,
    # wo, w3 of Llama's seven: 37 % of a Llama-3-8B block's matmul FLOPs) and saves attention
    share = recompute_share(s, facts.n_layers)
    recompute_mm = share * mm_fwd
    if s.checkpointing == "selective-op":
        recompute_mm = SAC_OP_RECOMPUTE * mm_fwd
    recompute_attn = 0.0 if s.checkpointing in ("none", "selective-op") else attn_fwd
    if s.checkpointing == LAYER_SAC:
        recompute_attn = share * attn_fwd
    compute = _flops_s(
        mm_fwd * (1 + bwd_factor) + recompute_mm, attn_fwd + attn_bwd + recompute_attn, s, rates
    )
    # forward-equivalent passes: forward 1, backward ~2 (both gradients) or ~1 (input only)
    passes = 1.0 + bwd_factor + share
    weight_passes = 2 + share  # fwd, bwd, recompute read weights
    w_bytes = _weight_bytes(s, facts)
    micro = max(compute, weight_passes * w_bytes / (rates.memory_bps * _c("mbu")))
    dequant = weight_passes * _dequant_s(s, facts, tokens, rates)
    host = _host_s(s, facts, passes, eager_overhead)
    parts = {"compute": micro * s.grad_accum}
    parts["dequant"] = dequant * s.grad_accum
    parts["host_overhead"] = host * s.grad_accum
    dp = s.dp
    n_train = facts.n_params * trainable_fraction
    # FSDP2 under torchtitan's policy reduce-scatters in fp32 (spec.rules.FSDP_MIXED_POLICY)
    fp32_reduce = fsdp_mixed_policy(s.precision, s.shard) is not None
    grad_width = 4 if precision_rule(s.precision, s.shard).master_weights or fp32_reduce else 2
    ring = 2.0 * (dp - 1) / dp if dp > 1 else 0.0
    link = rates.link_bps * _c("link_efficiency")
    if s.shard in ("zero3", "fsdp") and dp > 1:
        # per micro-batch: all-gather of the 16-bit weights for forward and backward (each half a
        # ring all-reduce's traffic), reduce-scatter of the gradients
        gathered = 2 * w_bytes / 2 + n_train * grad_width / 2
        parts["communication"] = s.grad_accum * ring * gathered / link
    else:  # DDP / ZeRO-1/2: one all-reduce (or reduce-scatter + all-gather) per step
        parts["communication"] = ring * n_train * grad_width / link
    opt_share = n_train / (dp if s.shard in ("zero1", "zero2", "zero3", "fsdp") else 1)
    width = 1.0 if PRECISION_RULES[s.precision].master_weights else 0.5
    opt_bytes = OPTIMIZER_STEP_BYTES[s.optimizer] * width * opt_share
    host_link = rates.host_bps * _c("host_link_efficiency")
    if s.offload == "none":
        parts["optimizer"] = opt_bytes / (rates.memory_bps * _c("mbu"))
    else:  # ZeRO-Offload: grads D2H, CPU optimizer step, 16-bit params H2D (Ren et al. 2021)
        parts["optimizer"] = opt_bytes / (_c("host_memory_gbps") * 1e9)
        parts["offload_pcie"] = opt_share * (grad_width + 2) / host_link
    if s.offload == "params":
        # ZeRO-3 parameter offload: every weight crosses the host link for the forward AND the
        # backward (and the recompute) of every micro-batch; each rank fetches its shard, then the
        # shards are all-gathered over the GPU link (FSDP CPU offload, ZeRO-3 offload_param)
        parts["offload_pcie"] += s.grad_accum * weight_passes * w_bytes / dp / host_link
    on_gpu = parts["compute"] + parts["dequant"] + parts["host_overhead"]
    if s.checkpointing == "offload":
        parts["checkpoint_pcie"] = s.grad_accum * checkpoint_offload_s(s, facts, tokens, rates)
        on_gpu = max(on_gpu, parts["checkpoint_pcie"])  # non-blocking copies overlap compute
    step = max(on_gpu, parts["communication"]) + parts["optimizer"]
    step += parts.get("offload_pcie", 0.0)
    return StepCost(step_s=step, tokens_per_s=tokens * s.grad_accum * dp / step, parts_s=parts)


def train_cost_key(s: Settings) -> tuple[Any, ...]:
    """Every field of ``s`` that :func:`train_step_cost` reads, with ``lora_rank`` (the planner's
    trainable share, :func:`trainable_fraction`, reads it and ``freeze_layers``): settings
    with one key have one step cost for one model, GPU and sequence, so a search prices each
    key once. A training space's candidates share about half as many keys (the loss,
    ``prepare_kbit``, the LoRA targets and the kernels change no price). Kept beside the
    function it names: a field read there is added here (tests/plan/test_cost.py prices whole
    spaces both ways)."""
    return (
        s.micro_batch, s.grad_accum, s.precision, s.quant, s.attention, s.checkpointing,
        s.techniques.selective_ac_option, s.freeze_layers, s.lora_rank, s.shard, s.offload,
        s.dp, s.optimizer,
    )  # fmt: skip


def infer_cost(
    s: Settings,
    facts: ModelFacts,
    rates: Rates,
    *,
    seq_len: int,
    new_tokens: int,
    eager_overhead: bool = False,
) -> StepCost:
    """Prefill of ``micro_batch`` prompts of ``seq_len`` tokens, then ``new_tokens`` decode steps;
    tensor parallelism splits weights, KV cache and FLOPs ``tp`` ways (plus 2 all-reduces of the
    hidden states per layer, Shoeybi et al. 2019 §3). ``eager_overhead``: as for
    :func:`train_step_cost` (eager decode of HF-style loops is host-bound: ~1 ms per layer per
    token)."""
    b, tp = s.micro_batch, s.tp
    w_bytes = _weight_bytes(s, facts) / tp
    tokens = b * seq_len
    mm = 2.0 * facts.n_matmul_params * tokens
    attn = 2.0 * facts.n_layers * seq_len * facts.d_model * tokens
    kv_width = 4 if compute_dtype(s.precision) == "fp32" else 2
    tp_ring = 2.0 * (tp - 1) / tp
    act = 2 * facts.n_layers * facts.d_model * kv_width  # bytes all-reduced per token per layer
    link = rates.link_bps * _c("link_efficiency")
    prefill = max(_flops_s(mm, attn, s, rates, tp), w_bytes / (rates.memory_bps * _c("mbu")))
    prefill += _dequant_s(s, facts, tokens, rates) / tp + _host_s(s, facts, 1.0, eager_overhead)
    parts = {"prefill": prefill + tp_ring * act * tokens / link}
    decode = 0.0
    if new_tokens:
        mean_ctx = seq_len + new_tokens / 2
        kv = facts.kv_bytes_per_token_per_byte * kv_width * b * mean_ctx / tp
        flops = _flops_s(2.0 * facts.n_matmul_params * b, 0.0, s, rates, tp)
        bandwidth = rates.memory_bps * _c("decode_mbu")
        if s.quant != "none":
            bandwidth *= _c("quant_decode_bandwidth_share")
        step = max(flops, (w_bytes + kv) / bandwidth)
        step += _dequant_s(s, facts, b, rates) / tp + _host_s(s, facts, 1.0, eager_overhead)
        latency = 2 * facts.n_layers * _c("tp_allreduce_latency_s") if tp > 1 else 0.0
        decode = new_tokens * (step + tp_ring * act * b / link + latency)
    parts["decode"] = decode
    total = parts["prefill"] + decode
    produced = b * (new_tokens or seq_len) * s.dp
    return StepCost(step_s=total, tokens_per_s=produced / total, parts_s=parts)


#: 1 M tokens, and seconds in the hour the price tables quote.
TOKENS_PER_MILLION = 1_000_000
SECONDS_PER_HOUR = 3600


def usd_per_million_tokens(usd_per_hour: float | None, tokens_per_s: float) -> float | None:
    """Dollars per 1 M tokens on GPUs rented at ``usd_per_hour`` (all of them together) that
    process ``tokens_per_s``; None without a price or a speed. The one rule every surface that
    prices a plan uses (the plan's side-by-side table, the GPU advice)."""
    if usd_per_hour is None or not tokens_per_s > 0:
        return None
    return usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR) * TOKENS_PER_MILLION

"""Predicted step time of a plan: a roofline per GPU from the catalog's rates.

Training (one optimizer step over the global batch, per data-parallel rank)::

    micro-batch  = max(FLOPs / (peak · MFU), weight bytes moved / (bandwidth · MBU)) + dequant
    FLOPs        = forward · (1 + backward factor) + recompute          (Kaplan et al. 2020, §2.1)
    forward      = 2 · N_matmul · tokens + 2 · n_layer · seq · d_model · tokens  (Kaplan Table 1)
    step         = max(n_accum · micro-batch, data-parallel communication) + optimizer + offload

Inference (one batch of requests): prefill is compute-bound (the forward above over the prompt
tokens), each decode step is memory-bound: the weights plus the KV cache are read once per new
token, ``max(bytes / (bandwidth · MBU), 2 · N · batch / (peak · MFU))``.

Every rule of thumb is in :data:`COST_CONSTANTS` with its source. The model ranks plans; its
absolute numbers are a roofline (an optimistic bound scaled by MFU/MBU), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.models.model_spec import ModelSpec
from memfit.plan.space import Settings
from memfit.spec import PRECISION_RULES, precision_rule

#: Rules of thumb of the cost model, each with its source.
COST_CONSTANTS: dict[str, tuple[float, str]] = {
    "mfu": (
        0.40,
        "model FLOPs utilization of dense training/prefill: Chowdhery et al. 2022 (PaLM), "
        "Table 3, report 46.2 % (PaLM 540B), 32.5 % (Gopher), 29.7 % (MT-NLG), 21.3 % (GPT-3); "
        "memfit assumes 40 %",
    ),
    "mbu": (
        0.70,
        "fraction of peak memory bandwidth that memory-bound kernels (decode, optimizer step, "
        "dequantization) achieve: memfit's assumption, not measured",
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
}

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
}
NVLINK_C2C_GBPS_PER_DIRECTION = 450.0

#: Bytes read + written per trainable parameter by one optimizer step (memory-bound):
#: AdamW (fp32 master): read p, g, m, v (4 each) and write p, m, v = 28; 8-bit AdamW: m, v are
#: 1 B each: read 4+4+1+1, write 4+1+1 = 16; Adafactor (factored second moment, no first moment,
#: Shazeer & Stern 2018): read p, g, write p = 12; Lion (one momentum): read p, g, m, write p, m =
#: 20; SGD: 12; SGD momentum: 20. Scaled by the parameter width for pure bf16/fp16 (below).
OPTIMIZER_STEP_BYTES = {
    "adamw": 28,
    "adamw-fused": 28,
    "adamw-8bit": 16,
    "paged-adamw-8bit": 16,
    "adafactor": 12,
    "lion": 20,
    "sgd": 12,
    "sgd-momentum": 20,
    "none": 0,
}

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
#: a matmul has more than a few rows (memfit.estimate.quant.FUSED_MAX_TOKENS): the temporary is
#: written and read back, 2 x 2 B per weight of extra traffic. bitsandbytes' LLM.int8()
#: (``MatMul8bitLt``) counts too: its backward dequantizes the int8 weight (``CB * SCB / 127``)
#: into a 16-bit copy for the input gradient, and its forward adds activation quantization and
#: an fp16 outlier matmul (Dettmers et al. 2022, §3.2: slower than fp16 below ~6.7B parameters).
DEQUANTIZING_FORMATS = ("nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "int8")
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


def _weight_bytes(s: Settings, facts: ModelFacts) -> float:
    """Bytes of the weights a matmul pass reads (16-bit copy for AMP: autocast's cast cache)."""
    if s.quant != "none":
        return facts.n_params * STORED_BYTES_PER_WEIGHT[s.quant]
    return facts.n_params * (4 if compute_dtype(s.precision) == "fp32" else 2)


def _pass_s(flops: float, n_bytes: float, flops_rate: float, rates: Rates) -> float:
    return max(flops / (flops_rate * _c("mfu")), n_bytes / (rates.memory_bps * _c("mbu")))


def _dequant_s(s: Settings, facts: ModelFacts, tokens: int, rates: Rates) -> float:
    if s.quant not in DEQUANTIZING_FORMATS or tokens <= 4:
        return 0.0
    return facts.n_params * DEQUANT_EXTRA_BYTES_PER_WEIGHT / (rates.memory_bps * _c("mbu"))


def train_step_cost(
    s: Settings, facts: ModelFacts, rates: Rates, *, seq_len: int, trainable_fraction: float
) -> StepCost:
    """One optimizer step of ``s.micro_batch x s.grad_accum`` samples per rank."""
    tokens = s.micro_batch * seq_len
    attn_fwd = 2.0 * facts.n_layers * seq_len * facts.d_model * tokens
    fwd = 2.0 * facts.n_matmul_params * tokens + attn_fwd
    frozen_share = s.freeze_layers / facts.n_layers if facts.n_layers else 0.0
    # backward: grad-input (1 forward) for layers after the first trainable one, grad-weight (1
    # forward) for the trainable share only
    bwd = fwd * (1.0 - frozen_share) * (1.0 + trainable_fraction * (_c("backward_per_forward") - 1))
    recompute = {"none": 0.0, "full": fwd, "selective": attn_fwd}[s.checkpointing]
    rate = rates.flops.get(compute_dtype(s.precision), rates.flops["fp16"])
    n_passes = 2 + (s.checkpointing == "full")
    w_bytes = _weight_bytes(s, facts)
    micro = _pass_s(fwd + bwd + recompute, n_passes * w_bytes, rate, rates)
    micro += n_passes * _dequant_s(s, facts, tokens, rates)
    parts = {"compute": micro * s.grad_accum}
    dp = s.dp
    n_train = facts.n_params * trainable_fraction
    grad_width = 4 if precision_rule(s.precision, s.shard).master_weights else 2
    ring = 2.0 * (dp - 1) / dp if dp > 1 else 0.0
    if s.shard in ("zero3", "fsdp") and dp > 1:
        gathered = 2 * w_bytes + n_train * grad_width / 2  # all-gather fwd + bwd, reduce-scatter
        parts["communication"] = s.grad_accum * ring * gathered / rates.link_bps
    else:
        parts["communication"] = ring * n_train * grad_width / rates.link_bps
    opt_share = n_train / (dp if s.shard in ("zero1", "zero2", "zero3", "fsdp") else 1)
    width = 1.0 if PRECISION_RULES[s.precision].master_weights else 0.5
    opt_bytes = OPTIMIZER_STEP_BYTES[s.optimizer] * width * opt_share
    if s.offload == "none":
        parts["optimizer"] = opt_bytes / (rates.memory_bps * _c("mbu"))
    else:  # ZeRO-Offload: grads D2H, CPU optimizer step, 16-bit params H2D (Ren et al. 2021)
        parts["optimizer"] = opt_bytes / (_c("host_memory_gbps") * 1e9)
        parts["offload_pcie"] = opt_share * (grad_width + 2) / rates.host_bps
    if s.offload == "params":  # parameters stream in for every pass of every micro-batch
        parts["offload_pcie"] += s.grad_accum * n_passes * w_bytes / dp / rates.host_bps
    step = max(parts["compute"], parts["communication"]) + parts["optimizer"]
    step += parts.get("offload_pcie", 0.0)
    return StepCost(step_s=step, tokens_per_s=tokens * s.grad_accum * dp / step, parts_s=parts)


def infer_cost(
    s: Settings, facts: ModelFacts, rates: Rates, *, seq_len: int, new_tokens: int
) -> StepCost:
    """Prefill of ``micro_batch`` prompts of ``seq_len`` tokens, then ``new_tokens`` decode steps;
    tensor parallelism splits weights, KV cache and FLOPs ``tp`` ways (plus 2 all-reduces of the
    hidden states per layer, Shoeybi et al. 2019 §3)."""
    b, tp = s.micro_batch, s.tp
    rate = rates.flops.get(compute_dtype(s.precision), rates.flops["fp16"]) * tp
    w_bytes = _weight_bytes(s, facts) / tp
    tokens = b * seq_len
    fwd = (
        2.0 * facts.n_matmul_params * tokens
        + 2.0 * facts.n_layers * seq_len * facts.d_model * tokens
    )
    kv_width = 4 if compute_dtype(s.precision) == "fp32" else 2
    tp_ring = 2.0 * (tp - 1) / tp
    act = (
        2 * facts.n_layers * facts.d_model * kv_width
    )  # bytes all-reduced per token per layer pair
    parts = {"prefill": _pass_s(fwd, w_bytes, rate, rates) + _dequant_s(s, facts, tokens, rates)}
    parts["prefill"] += tp_ring * act * tokens / rates.link_bps
    decode = 0.0
    if new_tokens:
        mean_ctx = seq_len + new_tokens / 2
        kv = facts.kv_bytes_per_token_per_byte * kv_width * b * mean_ctx / tp
        step = _pass_s(2.0 * facts.n_matmul_params * b, w_bytes + kv, rate, rates)
        step += _dequant_s(s, facts, b, rates) + tp_ring * act * b / rates.link_bps
        decode = new_tokens * step
    parts["decode"] = decode
    total = parts["prefill"] + decode
    produced = b * (new_tokens or seq_len) * s.dp
    return StepCost(step_s=total, tokens_per_s=produced / total, parts_s=parts)

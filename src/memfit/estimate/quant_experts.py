"""Routed MoE experts stored as each pre-quantized format stores them (torch-free; both engines).

transformers 5.23 keeps a MoE layer's routed experts as 3-D parameters (``Qwen3MoeExperts``,
``DeepseekV3Experts``, ``MixtralExperts``, ``GptOssExperts``: ``gate_up_proj`` (E, 2I, H) and
``down_proj`` (E, H, I), transposed for gpt-oss). They are not ``nn.Linear`` modules, so the
Linear quantizers (bitsandbytes, memfit's ``--quant`` on dense layers) leave them alone; the
formats below replace them. Sources (docs/decisions.md "Quantized MoE experts" has the links):

==============  ==========================================================================
format          routed experts as stored (per MoE layer)
==============  ==========================================================================
``mxfp4``       transformers ``integrations/mxfp4.py`` ``Mxfp4GptOssExperts`` (gpt-oss only):
                ``gate_up_proj`` blocks (E, 2I, H/2) uint8 (two FP4 codes a byte) and
                ``gate_up_proj_scales`` (E, 2I, H/32) uint8 (one E8M0 exponent per 32 values),
                ``down_proj`` (E, H, I/2) / ``down_proj_scales`` (E, H, I/32) uint8, the biases
                (E, 2I) and (E, H) in fp32. On Hopper, triton_kernels' ``HopperMXValueLayout``
                pads each expert's packed weight to multiples of 64 x 256 bytes
                (``_padded_shape``); the scales keep the strided layout.
``fp8``         transformers ``integrations/finegrained_fp8.py`` ``FP8Experts``: ``gate_up_proj``
                (E, 2I, H) float8_e4m3fn and ``gate_up_proj_scale_inv`` (E, max(ceil(2I/bn), 2),
                ceil(H/bk)) fp32 (``_alloc_expert_proj``, block ``weight_block_size`` = (bn, bk),
                128 x 128 by default), ``down_proj`` (E, H, I) and its scales.
``int4-gptq``   a GPTQ / AWQ checkpoint quantizes each expert's ``gate_proj``, ``up_proj`` and
``int4-awq``    ``down_proj`` Linear (Qwen3-MoE, Mixtral, DeepSeek layouts): the per-Linear tensors
                of :func:`memfit.estimate.quant.stored_tensors` for each of the E experts. memfit
                stacks each kind into one (E, …) allocation: at most 511 B of rounding per tensor
                are not counted.
bitsandbytes    ``replace_with_bnb_linear`` converts ``nn.Linear`` only: the experts stay in the
                model's dtype (the shared experts and attention are quantized).
==============  ==========================================================================

Inference temporaries per MoE layer call (S = tokens x top-k routed rows, T tokens):

* ``mxfp4``, the triton path transformers runs on CUDA (``Mxfp4GptOssMLP.forward`` →
  ``matmul_ogs``, triton_kernels ``init_allocation``): routing metadata, the gate/up output with
  the SwiGLU fused (S, I), and for the scattered down projection the (S, H) scratch pad beside the
  (T, H) output. No weight is dequantized.
* ``fp8``: ``fp8_grouped_mm_experts_forward`` (transformers' default ``grouped_mm``): the same
  tensors as the bf16 grouped path; the finegrained-fp8 kernel quantizes the activations inside
  (output only). Training's backward (``FP8GroupedMatmulFunction.backward``) dequantizes
  ``min(E, 2**30 // expert_bytes)`` experts at once.
* ``int4-gptq`` / ``int4-awq``: the fp16 input copy, and above the library's fused-kernel row
  limit one expert's dequantized fp16 weight at a time (rows per expert taken as S / E: the trace
  has no routing values).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.estimate import quant
from memfit.estimate.quant import StoredTensor

#: Formats whose checkpoints store the routed experts quantized (others keep them in the
#: model's dtype).
EXPERT_FORMATS = ("mxfp4", "fp8", "int4-gptq", "int4-awq")
#: Formats that quantize only the experts (no dense Linear layer).
EXPERTS_ONLY = ("mxfp4",)
#: Model types transformers' Mxfp4 integration converts (``replace_with_mxfp4_linear`` swaps
#: ``GptOssMLP`` only).
MXFP4_MODEL_TYPES = ("gpt_oss",)
#: MXFP4: values per shared E8M0 scale (OCP MX spec; triton_kernels ``MXFP_BLOCK_SIZE``).
MXFP4_BLOCK = 32
#: triton_kernels ``HopperMXValueLayoutTransformation._padded_shape``: the packed weight's
#: (scaled axis, other axis) are padded to multiples of (64, 256) bytes.
HOPPER_MXFP4_ALIGN = (64, 256)
#: FineGrainedFP8Config's default ``weight_block_size``.
FP8_BLOCK = (128, 128)
#: ``FP8GroupedMatmulFunction.dequant_budget_bytes``: experts dequantized at once in backward.
FP8_DEQUANT_BUDGET_BYTES = 2**30
#: routing metadata of ``triton_kernels.routing``: per routed row the gather and scatter
#: indices (int32, two tensors) and the gate scale (in the activations' dtype).
MXFP4_ROUTING_INT32_PER_ROW = 2


@dataclass(frozen=True, kw_only=True)
class ExpertsShape:
    """One MoE layer's routed experts: E experts of hidden H and intermediate I; ``has_gate``:
    a fused gate/up projection (SwiGLU), ``has_bias``: per-expert biases (gpt-oss)."""

    n_experts: int
    hidden: int
    intermediate: int
    has_gate: bool = True
    has_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("n_experts", "hidden", "intermediate"):
            if getattr(self, name) < 1:
                raise SpecError(f"ExpertsShape: {name} ({getattr(self, name)}) must be positive")

    @property
    def up_out(self) -> int:
        return (2 if self.has_gate else 1) * self.intermediate

    @property
    def numel(self) -> int:
        """Logical parameter count (weights and biases)."""
        e, h = self.n_experts, self.hidden
        n = e * (self.up_out * h + h * self.intermediate)
        return n + (e * (self.up_out + h) if self.has_bias else 0)


def quantizes_experts(fmt: str | None) -> bool:
    return fmt in EXPERT_FORMATS


def format_problems(fmt: str, model_type: str) -> list[str]:
    """Formats transformers cannot load into this model type (mxfp4 outside gpt-oss; mxfp4
    training is refused by :class:`~memfit.spec.WorkloadSpec`)."""
    if fmt == "mxfp4" and model_type not in MXFP4_MODEL_TYPES:
        return [
            f"quant 'mxfp4' on model_type {model_type!r}: transformers' Mxfp4 integration "
            "converts gpt-oss experts only (replace_with_mxfp4_linear); use --quant fp8, "
            "int4-gptq, int4-awq or nf4"
        ]
    return []


#: Config keys that give a MoE model's routed-expert count (Qwen3-MoE / Mixtral / gpt-oss /
#: DeepSeek).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def has_routed_experts(config: dict[str, object]) -> bool:
    """Whether the (text) config describes routed experts."""
    text = config.get("text_config")
    cfg = text if isinstance(text, dict) else config
    counts = [cfg.get(k) for k in EXPERT_COUNT_KEYS]
    return any(isinstance(n, int) and n > 1 for n in counts)


def stored_expert_tensors(
    fmt: str,
    shape: ExpertsShape,
    *,
    dtype: str = "bfloat16",
    group_size: int = 128,
    block_size: tuple[int, int] = FP8_BLOCK,
    hopper: bool = False,
) -> list[StoredTensor]:
    """The tensors one MoE layer's routed experts keep under ``fmt`` (module docstring).
    ``dtype``: the model's (biases of fp8 / GPTQ / AWQ experts stay in it, as for Linears)."""
    if fmt not in EXPERT_FORMATS:
        raise SpecError(f"quant ({fmt!r}) does not store experts quantized ({EXPERT_FORMATS})")
    e, h, i = shape.n_experts, shape.hidden, shape.intermediate
    up = "gate_up_proj" if shape.has_gate else "up_proj"
    out: list[StoredTensor] = []
    if fmt == "mxfp4":
        for name, n, k in ((up, shape.up_out, h), ("down_proj", h, i)):
            if k % MXFP4_BLOCK:
                raise SpecError(f"mxfp4 experts need {name} in_features ({k}) divisible by 32")
            out.append(StoredTensor(name, (e, *_mxfp4_value_shape(n, k, hopper)), "uint8"))
            out.append(StoredTensor(f"{name}_scales", (e, n, k // MXFP4_BLOCK), "uint8"))
            out.append(StoredTensor(f"{name}_bias", (e, n), "float32"))
        return out
    if fmt == "fp8":
        bn, bk = block_size
        for name, n, k, floor in (
            (up, shape.up_out, h, 2 if shape.has_gate else 1),
            ("down_proj", h, i, 1),
        ):
            out.append(StoredTensor(name, (e, n, k), "float8_e4m3fn"))
            scales = (e, max(-(-n // bn), floor), -(-k // bk))
            out.append(StoredTensor(f"{name}_scale_inv", scales, "float32"))
        return out + _biases(shape, up, dtype)
    projections = (
        [("gate_proj", i, h), ("up_proj", i, h)] if shape.has_gate else [("up_proj", i, h)]
    ) + [("down_proj", h, i)]
    for name, n, k in projections:
        for t in quant.stored_tensors(fmt, n, k, group_size=group_size):
            out.append(StoredTensor(f"{name}.{t.name}", (e, *t.shape), t.dtype))
    return out + _biases(shape, up, quant.bias_dtype(fmt, dtype))


def _biases(shape: ExpertsShape, up: str, dtype: str) -> list[StoredTensor]:
    if not shape.has_bias:
        return []
    e = shape.n_experts
    return [
        StoredTensor(f"{up}_bias", (e, shape.up_out), dtype),
        StoredTensor("down_proj_bias", (e, shape.hidden), dtype),
    ]


def _mxfp4_value_shape(n: int, k: int, hopper: bool) -> tuple[int, int]:
    """One expert's packed FP4 weight (N rows of K values, two a byte); on Hopper padded as
    ``HopperMXValueLayout`` stores it (the K/2 bytes to 64, the N rows to 256)."""
    if not hopper:
        return (n, k // 2)
    a_k, a_n = HOPPER_MXFP4_ALIGN
    return (-(-n // a_n) * a_n, -(-(k // 2) // a_k) * a_k)


def stored_experts_bytes(tensors: list[StoredTensor], round_to: int = 1) -> int:
    """Bytes of the tensors, each rounded up to ``round_to`` (512: the caching allocator)."""
    return sum(-(-t.n_bytes // round_to) * round_to for t in tensors)


def gptq_dequantizes(fmt: str, rows: int, n_experts: int, in_features: int) -> bool:
    """GPTQ / AWQ experts: whether an expert call dequantizes its weight (rows per expert taken
    as the routed rows spread evenly: ``ceil(rows / E)``)."""
    return quant.uses_dequantized_weight(fmt, -(-rows // n_experts), in_features)


def fp8_backward_experts(shape: ExpertsShape, n: int, k: int, grad_bytes: int) -> int:
    """Experts one chunk of ``FP8GroupedMatmulFunction.backward`` dequantizes at once."""
    chunk = max(1, FP8_DEQUANT_BUDGET_BYTES // (n * k * grad_bytes))
    return min(shape.n_experts, chunk)


def experts_note(fmt: str, *, training: bool) -> str:
    """The output's line on how a MoE model's routed experts are stored under ``fmt``."""
    if fmt == "mxfp4":
        return (
            "routed experts: MXFP4 blocks + E8M0 scales (transformers Mxfp4GptOssExperts, "
            "triton matmul_ogs kernels on CUDA; on a Hopper --gpu padded as triton's "
            "HopperMXValueLayout stores them); attention, router, embeddings and lm_head stay "
            "in the model's dtype"
        )
    if fmt == "fp8":
        extra = (
            "; backward dequantizes them in <= 1 GiB chunks; LoRA adapters on the quantized "
            "experts are not modelled (adapters on the Linear layers only)"
            if training
            else ""
        )
        return (
            "routed experts: FP8 e4m3 with 128x128 block scales (transformers FP8Experts, "
            f"finegrained-fp8 grouped kernels){extra}"
        )
    if fmt in ("int4-gptq", "int4-awq"):
        return (
            f"routed experts: {fmt} per expert Linear (each expert's gate/up/down packed, "
            "stacked per projection); an expert call dequantizes one expert's weight above the "
            "kernel's row limit, rows spread evenly over the experts"
            + ("; LoRA adapters on the Linear layers only" if training else "")
        )
    return (
        f"routed experts stay in the model's dtype: quant {fmt!r} (bitsandbytes) converts "
        "nn.Linear layers only, and transformers keeps the experts as 3-D parameters"
    )


__all__ = [
    "EXPERT_FORMATS",
    "EXPERTS_ONLY",
    "ExpertsShape",
    "experts_note",
    "format_problems",
    "has_routed_experts",
    "quantizes_experts",
    "stored_expert_tensors",
    "stored_experts_bytes",
]

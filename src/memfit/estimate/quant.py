"""Quantized weight formats as their libraries store them: bytes per Linear, kept-out modules, and
the dequantization temporaries of the CUDA kernel path. Torch-free (the analytic engine imports it).

A ``Linear(in_features=K, out_features=N)`` quantized under format ``fmt`` is stored as the tensors
:func:`stored_tensors` lists. Each is a separate device allocation (the caching allocator rounds
each to 512 B, :data:`ALLOCATION_ROUND_BYTES`). Sources, read for bitsandbytes 0.50.2, GPTQModel,
AutoAWQ 0.2.x and transformers 5.23 (docs/quantization.md has the links and derivations):

================  ==========================================================================
format            stored tensors (shape, dtype)
================  ==========================================================================
``int8``          bitsandbytes ``Linear8bitLt``: ``weight`` (N, K) int8 and its row scales
                  ``SCB`` (N,) fp32 (``Int8Params``; ``CB`` is the same storage as ``weight``).
``nf4`` / ``fp4`` bitsandbytes ``Linear4bit``: ``weight`` (ceil(N·K / 2), 1) uint8 (two 4-bit codes
                  per byte), ``absmax`` (ceil(N·K / 64),) fp32 (one scale per block of 64),
                  ``quant_map`` (16,) fp32 (the code table; a fresh tensor per layer).
``nf4-dq``        as ``nf4`` with double quantization (``compress_statistics``): ``absmax``
                  becomes uint8, quantized in blocks of 256 with ``nested_absmax``
                  (ceil(blocks / 256),) fp32, ``nested_quant_map`` (256,) fp32 (the dynamic
                  8-bit code, copied per layer) and ``offset`` () fp32 (the mean removed first).
``int4-gptq``     GPTQ (GPTQModel / AutoGPTQ ``QuantLinear``, 4 bits packed in int32):
                  ``qweight`` (K / 8, N) int32, ``qzeros`` (ceil(K / g), N / 8) int32, ``scales``
                  (ceil(K / g), N) fp16, ``g_idx`` (K,) int32.
``int4-awq``      AWQ (AutoAWQ ``WQLinear_GEMM``): ``qweight`` (K, N / 8) int32, ``qzeros``
                  (K / g, N / 8) int32, ``scales`` (K / g, N) fp16.
``fp8``           ``weight`` (N, K) float8_e4m3fn and one per-tensor ``scale`` () fp32
                  (torchao / transformer-engine per-tensor scaling).
================  ==========================================================================

A bias stays unquantized: in the model's dtype for bitsandbytes and FP8, fp16 for GPTQ and AWQ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.errors import SpecError

FORMATS = ("int8", "nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "fp8")
#: The caching allocator hands out multiples of 512 B; each stored tensor is its own allocation.
ALLOCATION_ROUND_BYTES = 512

#: Element sizes of the dtypes quantized layers use.
ELEMENT_BYTES = {
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
}

#: bitsandbytes 4-bit: blocksize of ``quantize_4bit`` (default 64, functional.py), blocksize of
#: the second-level (double) quantization of ``absmax`` (256), entries of the 4-bit code table
#: (NF4/FP4: 16) and of the dynamic 8-bit code used for the nested absmax (256).
BNB_4BIT_BLOCKSIZE = 64
BNB_NESTED_BLOCKSIZE = 256
BNB_4BIT_CODE_ENTRIES = 16
BNB_DYNAMIC_CODE_ENTRIES = 256
#: bits per GPTQ/AWQ weight and values packed per int32.
INT4_BITS = 4
INT4_PER_INT32 = 32 // INT4_BITS

#: Largest number of tokens (rows of the activation matrix) for which each library runs a fused
#: kernel that reads the packed weight directly; above it the library first dequantizes the whole
#: weight into a temporary and calls a dense matmul.
#:
#: * bitsandbytes 0.50 ``gemm_4bit`` (backends/cuda/ops.py): the fused kernel always for M ≤ 4;
#:   dequant + ``F.linear`` for M > 1536 or when K is not a multiple of the blocksize; in between a
#:   per-architecture table decides. memfit takes the dequant path there (an upper bound: one
#:   weight-sized temporary at a time).
#: * AutoAWQ ``WQLinearMMFunction``: ``FP16_MATMUL_HEURISTIC_CONDITION`` = tokens ≥ 1024 → dequant.
#: * GPTQ: exllama v2's ``MAX_Q_GEMM_ROWS`` = 50 (reconstructs fp16 above it).
#: * int8 (LLM.int8) and fp8 never dequantize the weight in forward (int8 GEMM / ``_scaled_mm``).
FUSED_MAX_TOKENS = {"nf4": 4, "nf4-dq": 4, "fp4": 4, "int4-awq": 1023, "int4-gptq": 50}

#: Quantized layers are frozen. Backward computes grad-input with the dequantized weight: every
#: format materialises it in the compute dtype (bitsandbytes ``MatMul4Bit.backward`` /
#: ``MatMul8bitLt.backward``, AutoAWQ ``WQLinearMMFunction.backward``).


@dataclass(frozen=True)
class StoredTensor:
    """One tensor a quantized Linear keeps on the device."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def n_bytes(self) -> int:
        return math.prod(self.shape) * ELEMENT_BYTES[self.dtype]


@dataclass(frozen=True)
class KeptOutRule:
    """Which Linear layers a library leaves unquantized by default (embeddings and norms are never
    Linear layers, so no format quantizes them)."""

    only_repeated_blocks: bool
    skip_output_embeddings: bool
    skip_tied: bool
    skip_last_module: bool
    source: str


_TRANSFORMERS_DEFAULT_SKIPS = (
    "transformers quantizers/base.py get_keys_to_not_convert: modules with tied weights, the "
    "module holding the model's last parameter, the output embeddings (lm_head)"
)
#: Default kept-out rules per format.
KEPT_OUT: dict[str, KeptOutRule] = {
    **{
        f: KeptOutRule(
            only_repeated_blocks=False,
            skip_output_embeddings=True,
            skip_tied=True,
            skip_last_module=True,
            source=_TRANSFORMERS_DEFAULT_SKIPS + "; replace_with_bnb_linear converts nn.Linear "
            "and GPT-2 Conv1D",
        )
        for f in ("int8", "nf4", "nf4-dq", "fp4")
    },
    "fp8": KeptOutRule(
        only_repeated_blocks=False,
        skip_output_embeddings=True,
        skip_tied=True,
        skip_last_module=True,
        source=_TRANSFORMERS_DEFAULT_SKIPS + " (torchao / fp8 quantizers use the same default)",
    ),
    **{
        f: KeptOutRule(
            only_repeated_blocks=True,
            skip_output_embeddings=True,
            skip_tied=True,
            skip_last_module=True,
            source="GPTQ and AWQ quantize the Linear layers of the repeated decoder blocks only "
            "(lm_head stays in fp16)",
        )
        for f in ("int4-gptq", "int4-awq")
    },
}


#: Model types whose projections are subclasses of ``nn.Linear``. transformers' quantizer
#: replaces modules whose type *is* ``nn.Linear`` (or GPT-2's Conv1D) —
#: ``integrations/bitsandbytes.py``: ``type(module) is nn.Linear`` in transformers 5.23 — so
#: these layers stay in the model's dtype; memfit's trace applies that rule to every format.
LINEAR_SUBCLASSES: dict[str, str] = {"falcon": "FalconLinear"}


def unquantized_layers_note(model_type: str, fmt: str) -> str | None:
    """What ``--quant`` leaves undone on a model whose projections are Linear subclasses."""
    cls = LINEAR_SUBCLASSES.get(model_type)
    if fmt == "none" or cls is None:
        return None
    return (
        f"quant={fmt!r}: transformers quantizes modules whose type is exactly nn.Linear, and "
        f"{model_type}'s projections are {cls} (a subclass): they stay unquantized in the "
        "model's dtype, only the remaining Linear layers (if any) are quantized"
    )


def _check(fmt: str, out_features: int, in_features: int, group_size: int) -> None:
    if fmt not in FORMATS:
        raise SpecError(f"quant ({fmt!r}) must be one of {', '.join(FORMATS)}")
    if out_features < 1 or in_features < 1:
        raise SpecError(f"a Linear needs positive sizes (got {out_features} x {in_features})")
    if fmt in ("int4-gptq", "int4-awq"):
        if in_features % INT4_PER_INT32 or out_features % INT4_PER_INT32:
            raise SpecError(
                f"quant {fmt!r} packs 8 weights per int32: in_features ({in_features}) and "
                f"out_features ({out_features}) must be multiples of 8"
            )
        if group_size < 1:
            raise SpecError(f"quant_group_size ({group_size}) must be a positive integer")
    if fmt == "int4-awq" and in_features % group_size:
        raise SpecError(
            f"quant 'int4-awq' needs quant_group_size ({group_size}) to divide in_features "
            f"({in_features}); use a group size such as 128 or 64"
        )


def stored_tensors(
    fmt: str,
    out_features: int,
    in_features: int,
    *,
    group_size: int = 128,
    bias: bool = False,
    dtype: str = "bfloat16",
) -> list[StoredTensor]:
    """The tensors one quantized ``Linear(in_features, out_features)`` keeps (see module doc).

    ``dtype``: the model's dtype (bitsandbytes and FP8 keep the bias in it).
    """
    _check(fmt, out_features, in_features, group_size)
    n, k = out_features, in_features
    numel = n * k
    out: list[StoredTensor] = []
    if fmt == "int8":
        out = [StoredTensor("weight", (n, k), "int8"), StoredTensor("SCB", (n,), "float32")]
    elif fmt in ("nf4", "fp4", "nf4-dq"):
        n_blocks = -(-numel // BNB_4BIT_BLOCKSIZE)
        out = [
            StoredTensor("weight", ((numel + 1) // 2, 1), "uint8"),
            StoredTensor("quant_map", (BNB_4BIT_CODE_ENTRIES,), "float32"),
        ]
        if fmt == "nf4-dq":
            out += [
                StoredTensor("absmax", (n_blocks,), "uint8"),
                StoredTensor("nested_absmax", (-(-n_blocks // BNB_NESTED_BLOCKSIZE),), "float32"),
                StoredTensor("nested_quant_map", (BNB_DYNAMIC_CODE_ENTRIES,), "float32"),
                StoredTensor("offset", (), "float32"),
            ]
        else:
            out.append(StoredTensor("absmax", (n_blocks,), "float32"))
    elif fmt == "int4-gptq":
        groups = -(-k // group_size)
        out = [
            StoredTensor("qweight", (k // INT4_PER_INT32, n), "int32"),
            StoredTensor("qzeros", (groups, n // INT4_PER_INT32), "int32"),
            StoredTensor("scales", (groups, n), "float16"),
            StoredTensor("g_idx", (k,), "int32"),
        ]
    elif fmt == "int4-awq":
        groups = k // group_size
        out = [
            StoredTensor("qweight", (k, n // INT4_PER_INT32), "int32"),
            StoredTensor("qzeros", (groups, n // INT4_PER_INT32), "int32"),
            StoredTensor("scales", (groups, n), "float16"),
        ]
    elif fmt == "fp8":
        out = [
            StoredTensor("weight", (n, k), "float8_e4m3fn"),
            StoredTensor("scale", (), "float32"),
        ]
    if bias:
        out.append(StoredTensor("bias", (n,), bias_dtype(fmt, dtype)))
    return out


def bias_dtype(fmt: str, dtype: str) -> str:
    """GPTQ and AWQ store the bias in fp16; the others keep the model's dtype."""
    return "float16" if fmt in ("int4-gptq", "int4-awq") else dtype


def quantized_linear_bytes(
    fmt: str,
    out_features: int,
    in_features: int,
    group_size: int = 128,
    *,
    bias: bool = False,
    dtype: str = "bfloat16",
    round_to: int = 1,
) -> dict[str, int]:
    """Bytes of each stored tensor of one quantized Linear (name → bytes). ``round_to=512`` gives
    what the CUDA caching allocator hands out for each."""
    return {
        t.name: -(-t.n_bytes // round_to) * round_to
        for t in stored_tensors(
            fmt, out_features, in_features, group_size=group_size, bias=bias, dtype=dtype
        )
    }


def uses_dequantized_weight(fmt: str, n_tokens: int, in_features: int) -> bool:
    """Whether the forward matmul of ``n_tokens`` rows first dequantizes the whole weight (the
    library's CUDA path; :data:`FUSED_MAX_TOKENS`)."""
    if fmt in ("int8", "fp8"):
        return False
    if fmt in ("nf4", "nf4-dq", "fp4") and in_features % BNB_4BIT_BLOCKSIZE:
        return True  # bitsandbytes: K not aligned to the blocksize → dequant fallback
    return n_tokens > FUSED_MAX_TOKENS[fmt]


def dequant_temporary_bytes(
    fmt: str,
    out_features: int,
    in_features: int,
    *,
    n_tokens: int,
    compute_bytes: int = 2,
    backward: bool = False,
) -> int:
    """Bytes of the dequantized weight that exists while one matmul runs (0 when the fused kernel
    reads the packed weight). ``backward``: the grad-input matmul of a frozen quantized layer.

    Forward with dequantization: an (N, K) weight in the compute dtype (fp16 for GPTQ/AWQ).
    Backward: every format dequantizes to the compute dtype (int8: ``CB.to(dtype)``). Smaller
    side tensors (bitsandbytes' fp32 absmax of the nested statistics, int8's per-row scale) and
    AWQ's batch-repeated weight in backward are modelled by the trace engine's stand-ins.
    """
    _check(fmt, out_features, in_features, 1)
    weight = out_features * in_features
    if backward:
        return weight * compute_bytes
    if not uses_dequantized_weight(fmt, n_tokens, in_features):
        return 0
    if fmt in ("int4-gptq", "int4-awq"):
        return weight * ELEMENT_BYTES["float16"]
    return weight * compute_bytes


def gpu_problems(fmt: str, gpu: object) -> list[str]:
    """Combinations that cannot run: FP8 matmuls (``torch._scaled_mm``) need an FP8 tensor-core GPU
    (compute capability 8.9+: Ada, Hopper, Blackwell)."""
    if fmt == "fp8" and gpu is not None and not getattr(gpu, "supports_fp8", True):
        name = getattr(gpu, "name", "this GPU")
        cc = getattr(gpu, "compute_capability", None)
        arch = f" (compute capability {cc[0]}.{cc[1]})" if cc else ""
        return [
            f"quant 'fp8' cannot run on {name}{arch}: FP8 matmuls need compute capability 8.9+ "
            "(Ada, Hopper, Blackwell); use --quant int8 or nf4, or an FP8-capable --gpu"
        ]
    return []


#: bitsandbytes 4-bit formats whose packed weight FSDP / ZeRO-3 shard: FSDP-QLoRA stores it as a
#: ``Params4bit`` in a float ``bnb_4bit_quant_storage`` ("FSDP only supports sharding float data
#: types", bitsandbytes docs/source/fsdp_qlora.md at 0.50.2); ``Int8Params`` has no such storage.
BNB_4BIT_FORMATS = ("nf4", "nf4-dq", "fp4")
#: Setups that shard (partition) parameters, the packed 4-bit weights included.
PARAMETER_SHARDING = ("fsdp", "zero3")


def packs_as_parameter(fmt: str, shard: str | None) -> bool:
    """Whether the packed 4-bit weights of ``fmt`` are parameters that ``shard`` shards (the
    FSDP-QLoRA recipe) rather than whole buffers on every rank."""
    return fmt in BNB_4BIT_FORMATS and shard in PARAMETER_SHARDING

"""Weight formats of diffusion pipeline components (torch-free: the CLI's flag table reads it;
estimate/diffusion/weights.py applies them to a component's linears)."""

from __future__ import annotations

#: Bytes a quantized weight of ``n`` elements and ``rows`` output rows takes: (bytes per element,
#: scale bytes per row). Sources:
#: - bitsandbytes ``Params4bit``: packed uint8, an fp32 absmax per 64-element block; with double
#:   quantization an int8 absmax per block plus an fp32 per 256 blocks. ``Int8Params``: int8
#:   data, ``SCB`` fp32 per row.
#: - torchao 0.18 ``Int8WeightOnlyConfig``: int8 data, an fp32 scale and an int8 zero point per
#:   row; ``Float8WeightOnlyConfig``: fp8 data, an fp32 scale per row.
#: - ggml-common.h blocks: ``block_q8_0`` 34 B per 32, ``block_q6_K`` 210 B per 256,
#:   ``block_q5_1`` 24 B per 32, ``block_q5_0`` 22 B per 32, ``block_q4_K`` 144 B per 256,
#:   ``block_q4_1`` 20 B per 32, ``block_q4_0`` 18 B per 32, ``block_q3_K`` 110 B per 256,
#:   ``block_q2_K`` 84 B per 256.
FORMATS: dict[str, tuple[float, int]] = {
    "nf4": (0.5 + 4 / 64, 0),
    "fp4": (0.5 + 4 / 64, 0),
    "nf4-dq": (0.5 + 1 / 64 + 4 / (64 * 256), 0),
    "int8": (1.0, 4),
    "torchao-int8wo": (1.0, 4 + 1),
    "torchao-fp8wo": (1.0, 4),
    "gguf-q8_0": (34 / 32, 0),
    "gguf-q6_k": (210 / 256, 0),
    "gguf-q5_1": (24 / 32, 0),
    "gguf-q5_0": (22 / 32, 0),
    "gguf-q4_k": (144 / 256, 0),
    "gguf-q4_1": (20 / 32, 0),
    "gguf-q4_0": (18 / 32, 0),
    "gguf-q3_k": (110 / 256, 0),
    "gguf-q2_k": (84 / 256, 0),
}
#: Which library applies each format (what the note says; GGUF checkpoints exist for denoisers).
BACKEND = {
    **dict.fromkeys(("nf4", "fp4", "nf4-dq", "int8"), "bitsandbytes"),
    "torchao-int8wo": "torchao",
    "torchao-fp8wo": "torchao",
}
#: --quant / --text-encoder-quant values that only diffusion pipelines take
DIFFUSION_QUANTS = tuple(q for q in FORMATS if q not in ("nf4", "fp4", "nf4-dq", "int8"))

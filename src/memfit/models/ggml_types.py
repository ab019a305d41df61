"""ggml tensor types (torch-free, no ``gguf`` needed): block size and bytes per block, the
quantization mixes ``llama-quantize`` writes, and a GGUF-like tensor table of a bundled model.

:data:`GGML_BLOCKS` is ggml's type table: ``type_traits[...].blck_size`` / ``.type_size`` in
ggml/src/ggml.c (the block structs in ggml/src/ggml-common.h), as the ``gguf`` package's
``GGML_QUANT_SIZES`` repeats it (gguf-py/gguf/constants.py; tests/models/test_ggml_types.py
checks the two agree). A tensor of ``n`` elements whose rows hold ``ne0`` elements takes
``n / blck_size * type_size`` bytes (``ggml_row_size``).

:func:`tensor_type` is the choice ``llama-quantize`` makes per tensor for the common file types
(``llama_tensor_get_type`` in src/llama-quant.cpp, ggml-org/llama.cpp): the base type of the
file type, with ``output.weight`` (or a tied ``token_embd.weight``) at Q6_K and, for the ``_M``
k-quant mixes, ``attn_v`` / ``ffn_down`` at Q6_K on the layers ``use_more_bits`` picks (the first
and last eighth and every third layer between); a tensor whose rows do not divide into blocks
falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). It is what memfit uses when MODEL is a
bundled config plus a file type (``llama-3.1-8b:Q4_K_M``); a ``.gguf`` file's own header gives
the real types.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from memfit.errors import SpecError

QK_K = 256  # k-quant super-block (ggml-common.h)

#: type -> (elements per block, bytes per block): ggml/src/ggml.c type_traits.
GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "F64": (1, 8),
    "I8": (1, 1),
    "I16": (1, 2),
    "I32": (1, 4),
    "I64": (1, 8),
    "Q4_0": (32, 2 + 16),
    "Q4_1": (32, 2 + 2 + 16),
    "Q5_0": (32, 2 + 4 + 16),
    "Q5_1": (32, 2 + 2 + 4 + 16),
    "Q8_0": (32, 2 + 32),
    "Q8_1": (32, 4 + 4 + 32),
    "Q2_K": (QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    "Q3_K": (QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    "Q4_K": (QK_K, 2 + 2 + QK_K // 2 + 12),
    "Q5_K": (QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    "Q6_K": (QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    "Q8_K": (QK_K, 4 + QK_K + QK_K // 8),
    "IQ2_XXS": (QK_K, 2 + QK_K // 4),
    "IQ2_XS": (QK_K, 2 + QK_K // 4 + QK_K // 32),
    "IQ3_XXS": (QK_K, 2 + QK_K // 4 + QK_K // 8),
    "IQ1_S": (QK_K, 2 + QK_K // 8 + QK_K // 16),
    "IQ4_NL": (32, 2 + 16),
    "IQ3_S": (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    "IQ2_S": (QK_K, 2 + QK_K // 4 + QK_K // 16),
    "IQ4_XS": (QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    "IQ1_M": (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    "TQ1_0": (QK_K, 2 + 4 * 13),
    "TQ2_0": (QK_K, 2 + 64),
    "MXFP4": (32, 1 + 16),
}

#: llama-quantize file type (memfit.spec.llamacpp.FILE_TYPES) -> the base type of its 2-D weights
#: (src/llama-quant.cpp ``llama_model_quantize_impl``: ``default_type``).
FILE_TYPES: dict[str, str] = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q5_0": "Q5_0",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q4_0": "Q4_0",
    "Q3_K_M": "Q3_K",
}

#: A k-quant that does not divide a row falls back to these (llama-quant.cpp, "fallback").
_FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def row_bytes(ggml_type: str, n_elements: int) -> int:
    """``ggml_row_size``: the bytes of ``n_elements`` of ``ggml_type`` (whole blocks)."""
    block, size = GGML_BLOCKS[ggml_type.upper()]
    return n_elements // block * size


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp ``use_more_bits``: the first and last eighth, and every third between."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def file_type(name: str) -> str:
    """The canonical spelling of a llama-quantize file type (``q4_k_m`` -> ``Q4_K_M``)."""
    key = name.strip().upper()
    if key not in FILE_TYPES:
        raise SpecError(
            f"GGUF file type ({name!r}) is not modelled; memfit mixes {', '.join(FILE_TYPES)} "
            "(pass a .gguf file for any other: its header has the real types)"
        )
    return key


def tensor_type(ftype: str, name: str, shape: tuple[int, ...], *, layer: int | None,
                n_layers: int, tied: bool) -> str:  # fmt: skip
    """The type ``llama-quantize --ftype`` gives one tensor (module docstring)."""
    base = FILE_TYPES[ftype]
    if len(shape) < 2 or name.endswith(".bias") or "ffn_gate_inp" in name:
        return "F32"
    if base in ("F32", "F16", "BF16"):
        return base
    chosen = _bumped(ftype, name, layer, n_layers, tied) or base
    if shape[0] % GGML_BLOCKS[chosen][0]:
        chosen = _FALLBACK.get(chosen, "F16")
    return chosen


def _bumped(ftype: str, name: str, layer: int | None, n_layers: int, tied: bool) -> str | None:
    """The higher type llama-quantize gives the output and some attn_v / ffn_down tensors."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q8_0" if FILE_TYPES[ftype] == "Q8_0" else "Q6_K"
    if layer is None or not ("attn_v." in name or "ffn_down" in name):
        return None
    if ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layers):
        return "Q6_K"
    if ftype == "Q4_K_S" and (layer < 4 if "attn_v." in name else layer < n_layers // 8):
        return "Q5_K"  # the first layers' attn_v / ffn_down
    return None


@dataclass(frozen=True)
class TensorShape:
    """One tensor of a GGUF-like table: its llama.cpp name and ggml shape (ne0 first)."""

    name: str
    shape: tuple[int, ...]
    layer: int | None  # the blk.N it belongs to; None for token_embd / output / output_norm


def llama_tensor_shapes(spec: object) -> Iterator[TensorShape]:
    """The tensors ``convert_hf_to_gguf.py`` writes for a llama-like decoder config (llama,
    mistral, qwen2/3, gemma, and their MoE forms), by llama.cpp's names
    (gguf-py/gguf/tensor_mapping.py) and ggml shapes."""
    g = spec.__getattribute__
    d, n_layers, n_heads = g("hidden_size"), g("n_layers"), g("n_heads")
    n_kv = g("n_kv_heads") or n_heads
    hd = g("head_dim") or d // n_heads
    vocab, ff = g("vocab_size"), g("intermediate_size")
    n_exp, ff_exp = g("n_experts") or 0, g("expert_intermediate_size") or ff
    model_type = str(g("model_type") or "")
    yield TensorShape("token_embd.weight", (d, vocab), None)
    yield TensorShape("output_norm.weight", (d,), None)
    if not g("tie_word_embeddings"):
        yield TensorShape("output.weight", (d, vocab), None)
    for i in range(n_layers):
        b = f"blk.{i}."
        yield TensorShape(b + "attn_norm.weight", (d,), i)
        yield TensorShape(b + "attn_q.weight", (d, n_heads * hd), i)
        yield TensorShape(b + "attn_k.weight", (d, n_kv * hd), i)
        yield TensorShape(b + "attn_v.weight", (d, n_kv * hd), i)
        yield TensorShape(b + "attn_output.weight", (n_heads * hd, d), i)
        if g("qkv_bias"):
            for part, width in (("q", n_heads * hd), ("k", n_kv * hd), ("v", n_kv * hd)):
                yield TensorShape(b + f"attn_{part}.bias", (width,), i)
        if model_type.startswith(("qwen3", "gemma3", "olmo2")):
            yield TensorShape(b + "attn_q_norm.weight", (hd,), i)
            yield TensorShape(b + "attn_k_norm.weight", (hd,), i)
        if model_type.startswith(("gemma2", "gemma3")):
            yield TensorShape(b + "post_attention_norm.weight", (d,), i)
            yield TensorShape(b + "post_ffw_norm.weight", (d,), i)
        yield TensorShape(b + "ffn_norm.weight", (d,), i)
        if n_exp:
            yield TensorShape(b + "ffn_gate_inp.weight", (d, n_exp), i)
            yield TensorShape(b + "ffn_gate_exps.weight", (d, ff_exp, n_exp), i)
            yield TensorShape(b + "ffn_up_exps.weight", (d, ff_exp, n_exp), i)
            yield TensorShape(b + "ffn_down_exps.weight", (ff_exp, d, n_exp), i)
        else:
            yield TensorShape(b + "ffn_gate.weight", (d, ff), i)
            yield TensorShape(b + "ffn_up.weight", (d, ff), i)
            yield TensorShape(b + "ffn_down.weight", (ff, d), i)

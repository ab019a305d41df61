"""Per-rank activation bytes of a Megatron-style transformer under tensor parallelism, with and
without sequence parallelism, and with or without a vocab-parallel loss (torch-free closed forms).

Source: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), §4 and Table 2, for 16-bit activations of one transformer layer holding
``s`` tokens of ``b`` samples, hidden size ``h``, ``a`` heads, tensor-parallel degree ``t``:

==============================  ==================================  ============================
recomputation                   tensor parallel (no SP)             tensor + sequence parallel
==============================  ==================================  ============================
none                            sbh (10 + 24/t + 5as/(ht))          sbh/t (34 + 5as/h)
selective (attention core)      sbh (10 + 24/t)                     sbh/t · 34
full                            2sbh                                2sbh/t
==============================  ==================================  ============================

The 34 is attention 11 + MLP 19 + two layer norms 4 (each in units of sbh bytes); the "10" that
plain tensor parallelism leaves replicated on every rank is the layer-norm inputs (4), the two
dropout masks (2) and the QKV / MLP inputs (4), exactly what Megatron's sequence parallelism
(and DTensor's ``SequenceParallel`` on the norms) shards along the sequence. Megatron-core's
``megatron/training/theoretical_memory_usage.py`` (``compute_activation_memory``, NVIDIA/
Megatron-LM d98e8a6) writes the 34 as ``18 + 4 · ffn_hidden / h`` (the MLP's 4h terms scale with
the FFN width) and adds, on the first pipeline stage, the embedding input (8sb per in-flight
micro-batch) and its dropout (sbh), and with one pipeline stage the output layer and the loss in
fp32: ``4sbh (1 + v/h)``, the logits split over ``t`` ranks (the vocab-parallel cross entropy:
torchtitan's ``loss_parallel``). Without a vocab-parallel loss each rank holds the whole
``4sbv`` logits. Everything is divided by ``t`` under sequence parallelism; without it only the
``24/t`` part is.

These forms are what the papers and Megatron-core compute; they do not see a model's real code
(SwiGLU's extra ``ffn`` tensors, fused kernels, FlashAttention's ``logsumexp``) — the engines do.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import SpecError

#: Korthikanti et al. 2022, §4.1-4.2, in units of sbh bytes (16-bit activations) per layer.
#: ``LAYER_UNITS``: attention 11 + MLP 19 + layer norms 4 at ffn = 4h.
LAYER_UNITS = 34
#: The part plain tensor parallelism splits t ways (QKV/MLP GEMM outputs, softmax/dropout of the
#: linear layers), and the part it leaves replicated (norm inputs, dropout masks, GEMM inputs).
TP_SPLIT_UNITS = 24
TP_REPLICATED_UNITS = 10
#: The attention-score term: 5as/h sbh (softmax output, its dropout mask and output, the QK^T
#: scores), which selective recomputation and FlashAttention remove.
ATTENTION_SCORE_UNITS = 5
#: Megatron-core's generalisation for an FFN of width ``ffn``: 18 + 4 ffn/h units.
MEGATRON_FIXED_UNITS = 18
MEGATRON_FFN_UNITS = 4
#: Full recomputation keeps each layer's 16-bit input: 2sbh.
FULL_RECOMPUTE_UNITS = 2
#: Embedding: the token ids (8 B each, int64) and the embedding dropout's sbh mask/output.
EMBEDDING_INPUT_BYTES_PER_TOKEN = 8
#: Output layer and loss, fp32: 4sbh for the final norm's output feeding the head plus 4sbv
#: for the logits (Megatron-core: ``4 sbh (1 + v/h)``).
OUTPUT_FP32_BYTES = 4

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class TensorParallelActivations:
    """Activation bytes one tensor-parallel rank of the first pipeline stage holds."""

    per_layer_bytes: int
    layers_bytes: int
    embedding_bytes: int
    output_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.layers_bytes + self.embedding_bytes + self.output_bytes


def tp_activation_bytes(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    n_heads: int,
    n_layers: int,
    vocab: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    loss_parallel: bool = True,
    recompute: str = "selective",
    ffn_hidden: int | None = None,
    pp: int = 1,
) -> TensorParallelActivations:
    """Korthikanti Table 2 per layer (``ffn_hidden``: Megatron-core's ``18 + 4 ffn/h`` in place
    of 34; default 4h), times the layers, plus Megatron-core's embedding and output terms (see the
    module docstring). ``recompute``: none, selective (the attention core), full; ``pp``:
    micro-batches in flight on the first stage for the embedding terms; the output layer is
    counted only when ``pp`` is 1 (it lives on the last stage)."""
    problems = _problems(tp, recompute, sequence_parallel, seq_len)
    if problems:
        raise SpecError.from_problems(problems)
    s, b, h, a, t = seq_len, micro_batch, hidden, n_heads, tp
    sbh = s * b * h
    units: float = LAYER_UNITS
    if ffn_hidden is not None:
        units = MEGATRON_FIXED_UNITS + MEGATRON_FFN_UNITS * ffn_hidden / h
    scores = ATTENTION_SCORE_UNITS * a * s / h if recompute == "none" else 0.0
    if recompute == "full":
        per_layer = FULL_RECOMPUTE_UNITS * sbh / (t if sequence_parallel else 1)
    elif sequence_parallel:
        per_layer = sbh * (units + scores) / t
    else:
        split = units - TP_REPLICATED_UNITS
        per_layer = sbh * (TP_REPLICATED_UNITS + split / t + scores / t)
    embed: float = EMBEDDING_INPUT_BYTES_PER_TOKEN * s * b * pp + sbh * pp
    if sequence_parallel:
        embed = embed / t
    output = 0.0
    if pp == 1:
        hidden_part: float = OUTPUT_FP32_BYTES * sbh
        logits: float = OUTPUT_FP32_BYTES * s * b * vocab
        hidden_part = hidden_part / t if sequence_parallel else hidden_part
        output = hidden_part + (logits / t if loss_parallel else logits)
    return TensorParallelActivations(
        per_layer_bytes=round(per_layer),
        layers_bytes=round(per_layer * n_layers),
        embedding_bytes=round(embed),
        output_bytes=round(output),
    )


def _problems(tp: int, recompute: str, sequence_parallel: bool, seq_len: int) -> list[str]:
    p: list[str] = []
    if tp < 1:
        p.append(f"tp ({tp}) must be a positive integer")
    if recompute not in RECOMPUTE:
        p.append(f"recompute ({recompute!r}) must be one of {', '.join(RECOMPUTE)}")
    if sequence_parallel and tp > 1 and seq_len % tp:
        p.append(
            f"sequence parallelism splits the sequence ({seq_len}) over tp ({tp}) ranks: "
            "use a sequence length divisible by tp"
        )
    return p


__all__ = ["TensorParallelActivations", "tp_activation_bytes"]

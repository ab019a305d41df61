"""DeepSpeed ZeRO-3 over a bitsandbytes 4-bit model (ZeRO3-QLoRA): the engine's start, where
every rank holds the *whole* quantized model before ZeRO-3 partitions it.

How the Hugging Face stack runs ``--shard zero3 --quant nf4|nf4-dq|fp4`` (the recipe of peft's
``docs/source/accelerate/deepspeed.md`` "Use PEFT QLoRA and DeepSpeed with ZeRO3", peft 6008f272):

1. transformers does not construct a quantized model under ``deepspeed.zero.Init``
   (huggingface/transformers PR #29587, v4.39: "Disable zero.init when using DeepSpeed with
   QLoRA"); it quantizes each weight on the GPU and moves the packed data to the CPU
   (``modeling_utils._load_state_dict_into_meta_model``: ``param_to = "cpu"`` under
   ``is_deepspeed_zero3_enabled()``), so the model reaches DeepSpeed whole, on the CPU, with no
   ``ds_id`` on its parameters.
2. ``DeepSpeedEngine._configure_distributed_model`` (deepspeed/runtime/engine.py, DeepSpeed
   d9e12d3a, 2024-03-12, v0.14) casts it (``self.module.bfloat16()`` under ``bf16``: the LoRA
   adapters become 16-bit, the packed 4-bit storage already is) and, because it is not a
   ``zero.Init`` model (``is_zero_init_model``: no parameter has ``ds_id``), moves it to the rank's
   GPU: ``self.module.to(self.device)``. Every rank now holds every parameter.
3. Only then does ZeRO-3 partition it: ``DeepSpeedZeRoOffload._convert_to_zero_parameters``
   (deepspeed/runtime/zero/parameter_offload.py) runs ``Init(module=...)``, whose
   ``_zero_init_param`` broadcasts each parameter and ``partition()`` allocates its ``1/W`` slice
   before freeing the whole tensor (partition_parameters.py). Stage 3 then defragments the
   trainable partitions and calls ``empty_cache()`` (stage3.py ``defragment``), so the training
   step starts from the partitioned model and this phase is a peak of its own.

The phase's bytes per rank (:func:`load_bytes`): every decoder Linear as bitsandbytes stores it
(:func:`memfit.estimate.quant.stored_tensors`: the packed weight in its float
``bnb_4bit_quant_storage``, same bytes, and its quant state, which stays on the GPU from loading
whatever device the packed data moves to: transformers moves ``value.data`` only), the norms, the
embeddings and the LM head (not quantized: transformers' default skip) in 16-bit, the LoRA adapters
in 16-bit (step 2), plus the ``1/W`` partition of the largest parameter being made. Each tensor is
its own allocation (one caching-allocator block, rounded as the allocator rounds it); the device
figure adds the CUDA context the step's answer already carries.

Not modelled: a MoE model (its experts' Linears), a ZeRO-3 job whose quantized model is built
under ``zero.Init`` (none in transformers since v4.39), ``offload_param`` (the move is the same:
DeepSpeed moves the module before it offloads), and the ~0.02 % of extra rows when a script resizes
the embeddings (peft's example adds its chat tokens, 32,000 → 32,008 rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.estimate import quant
from memfit.estimate.outside_phase import with_outside_phase
from memfit.estimate.parallel.shape import DecoderShape, read_shape
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import COMPONENTS, MemoryEstimate, PhasePeak
from memfit.spec import WorkloadSpec

#: The phase's name in ``MemoryEstimate.phases``.
PHASE = "engine init"
#: Bytes of a 16-bit element: what ``module.bfloat16()`` leaves every float parameter in
#: (DeepSpeed's ``bf16`` / ``fp16`` configs; memfit's ``*-true`` / ``*-mixed`` under zero3).
HALF_BYTES = 2
#: The caching allocator's rounding (``CUDACachingAllocator.cpp``): requests up to 1 MiB are
#: rounded to 512 B (``kMinBlockSize``); larger ones to 2 MiB (``kRoundLarge``) above 10 MiB
#: (``kMinLargeAlloc``), to 512 B below it (carved out of 20 MiB segments).
SMALL_ROUND_BYTES, LARGE_ROUND_BYTES, LARGE_MIN_BYTES = 512, 2 * 2**20, 10 * 2**20


@dataclass(frozen=True, kw_only=True)
class LoadBytes:
    """One rank's bytes when DeepSpeed has moved the whole model to it: ``quantized_bytes`` (the
    decoder Linears as stored, quant state included), ``dense_bytes`` (norms, embeddings, head),
    ``adapter_bytes`` (LoRA, 16-bit), ``partition_bytes`` (the slice ZeRO-3 allocates while the
    largest parameter is still whole)."""

    quantized_bytes: int
    dense_bytes: int
    adapter_bytes: int
    partition_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.quantized_bytes + self.dense_bytes + self.adapter_bytes + self.partition_bytes


def applies(workload: WorkloadSpec) -> bool:
    """Whether ``workload`` is a ZeRO-3 training job over a bitsandbytes 4-bit model (the
    FSDP-QLoRA storage, which transformers does not build under ``zero.Init``)."""
    return (
        workload.is_train
        and workload.shard == "zero3"
        and quant.packs_as_parameter(workload.quant, workload.shard)
    )


def _round(n_bytes: int) -> int:
    """``n_bytes`` as the caching allocator hands it out."""
    step = LARGE_ROUND_BYTES if n_bytes > LARGE_MIN_BYTES else SMALL_ROUND_BYTES
    return -(-n_bytes // step) * step


def _linears(shape: DecoderShape) -> list[tuple[int, int]]:
    """One decoder layer's Linears as (out_features, in_features): q, k, v, o and the MLP."""
    h = shape.hidden
    attn = [(shape.q_dim, h), (shape.kv_dim, h), (shape.kv_dim, h), (h, shape.q_dim)]
    mlp = [(shape.ffn, h)] * (shape.mlp_matrices - 1) + [(h, shape.ffn)]
    return attn + mlp


def load_bytes(shape: DecoderShape, workload: WorkloadSpec, n_trainable: int) -> LoadBytes:
    """The engine-init bytes of one rank (module docstring) for a dense decoder ``shape``."""
    layer_q = 0
    largest = 0
    weights = 0
    for n, k in _linears(shape):
        stored = quant.stored_tensors(workload.quant, n, k)
        layer_q += sum(_round(t.n_bytes) for t in stored)
        packed = next(t.n_bytes for t in stored if t.name == "weight")
        largest = max(largest, packed)
        weights += n * k
    biases = max(shape.attention_params - sum(n * k for n, k in _linears(shape)[:4]), 0)
    layer_dense = _round(shape.norm_params // 2 * HALF_BYTES) * 2 + _round(biases * HALF_BYTES)
    embeddings = shape.embedding_params * HALF_BYTES
    dense = shape.n_layers * layer_dense + _round(embeddings) * (1 if shape.tied else 2)
    dense += _round(shape.hidden * HALF_BYTES)  # the final norm
    largest = max(largest, embeddings)
    return LoadBytes(
        quantized_bytes=shape.n_layers * layer_q,
        dense_bytes=dense,
        adapter_bytes=n_trainable * HALF_BYTES,
        partition_bytes=_round(-(-largest // max(workload.dp_shard, 1))),
    )


def with_zero3_load(
    est: MemoryEstimate, source: Any, workload: WorkloadSpec, gpu: Any
) -> MemoryEstimate:
    """``est`` (the training step's answer) with the engine-init phase of a ZeRO3-QLoRA job
    added; where that phase is higher it is the job's peak (allocated, reserved and device)."""
    if not applies(workload) or source.spec is None:
        return est
    shape = read_shape(source.spec)
    if shape.moe:
        return with_notes(est, [NOT_MOE])
    b = load_bytes(shape, workload, est.n_trainable_params)
    load = PhasePeak(
        phase=PHASE,
        peak_allocated_bytes=b.total_bytes,
        components={
            **dict.fromkeys(COMPONENTS, 0),
            "parameters": b.total_bytes - b.partition_bytes,
            "temporary": b.partition_bytes,
        },
    )
    note = NOTE.format(
        whole=b.total_bytes / 2**30, step=est.device_used_bytes / 2**30, w=workload.dp_shard
    )
    return with_outside_phase(est, load, gpu, note)


NOTE = (
    "ZeRO-3 over a 4-bit model: transformers builds it without zero.Init (PR #29587) and "
    "DeepSpeed's engine moves the whole model to every GPU before partitioning it "
    "(engine.py _configure_distributed_model: module.to(device)): {whole:.2f} GiB per rank at "
    "engine init, vs {step:.2f} GiB device for the training step on {w} ranks "
    "(memfit.estimate.zero3_load)"
)
NOT_MOE = (
    "ZeRO-3 over a 4-bit MoE model: the whole model lands on every GPU at engine init before "
    "ZeRO-3 partitions it; that phase is not modelled for MoE layers"
)

__all__ = ["PHASE", "LoadBytes", "applies", "load_bytes", "with_zero3_load"]

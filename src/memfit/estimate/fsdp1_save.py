"""FSDP1's checkpoint during training: the state dict a ``SHARDED_STATE_DICT`` save builds on
the GPU, a phase of its own that can be the job's peak.

How accelerate + HF Trainer save an FSDP1 (``FullyShardedDataParallel``) job's checkpoint
(``save_strategy`` "epoch" / "steps"), with the versions peft's FSDP-QLoRA recipe ran
(peft ``docs/source/accelerate/fsdp.md`` and ``examples/sft/configs/fsdp_config_qlora.yaml``
at 6008f272: ``fsdp_state_dict_type: SHARDED_STATE_DICT``, accelerate >= 0.28, torch 2.2):

1. transformers' ``Trainer._save_optimizer_and_scheduler`` calls accelerate's
   ``save_fsdp_model(..., adapter_only=True)`` for a PEFT model
   (``_get_fsdp_ckpt_kwargs``); accelerate (``utils/fsdp_utils.py`` at v0.28.0) enters
   ``FSDP.state_dict_type(model, SHARDED_STATE_DICT, fsdp_plugin.state_dict_config, ...)`` with
   no state-dict config (``FullyShardedDataParallelPlugin.set_state_dict_type`` sets one only
   for FULL_STATE_DICT), so torch's default ``ShardedStateDictConfig(offload_to_cpu=False)``
   applies (``torch/distributed/fsdp/api.py`` ``StateDictConfig``).
2. ``_get_model_state_dict`` hands the model to peft's ``get_peft_model_state_dict``, which
   builds the *whole* ``model.state_dict()`` before it keeps the adapter keys
   (peft ``utils/save_and_load.py``: ``if state_dict is None: state_dict = model.state_dict()``).
3. For every FSDP unit, ``_sharded_pre_state_dict_hook`` unshards its flat parameter on the GPU
   (``_common_unshard_pre_state_dict_hook``, ``use_orig_params=False``), and
   ``_sharded_post_state_dict_hook`` replaces each parameter by a ShardedTensor whose local shard
   is a *clone* of the rank's chunk (``_shard_utils._create_chunk_sharded_tensor``:
   ``chunks[rank].clone()``), left on the GPU (``offload_to_cpu`` False); the unit is then
   resharded. The root unit (embeddings, final norm, head) is unsharded first and resharded
   last (its hooks wrap the traversal of the nested units).

So while the state dict is being built each rank holds, beside what stays resident after the
optimizer step (its flat-parameter shards, unless offloaded, the quant state of a 4-bit base,
the optimizer states), a GPU copy of its ``1/W`` chunk of every parameter (the packed 4-bit
weights as stored), the root unit whole and one decoder unit whole (plus, with CPU offload, the
shard that unit's all-gather copies up). With ``FULL_STATE_DICT`` accelerate sets
``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``: each unit is gathered and moved
to the CPU in turn (``_unshard_fsdp_state_params``: ``handle.to_cpu()``), so the GPU holds one
unit whole at a time and no copies.

accelerate >= 0.31 gives SHARDED_STATE_DICT ``ShardedStateDictConfig(offload_to_cpu=True)``
(:mod:`memfit.spec.hf_versions`, ``WorkloadSpec.accelerate_version``; None: the installed
release, which does): the sharded post-hook moves each clone to the CPU as it makes it
(``_sharded_post_state_dict_hook``: ``sharded_tensor.cpu()``), so the GPU holds one copy at a
time (the largest chunk) beside the root unit and one unit.

Each tensor is its own allocation, rounded as the caching allocator rounds it; the phase's
reserved bytes are at least its allocated bytes (the clones may reuse the step's cached blocks),
and the device figure adds the CUDA context the step's answer carries.

Not modelled: MoE layers (their experts' units), LOCAL_STATE_DICT (it returns the flat
parameters' own shards: no copy), FSDP2 (``torch.distributed.checkpoint``'s DTensor state dict
holds the shards themselves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.estimate import quant
from memfit.estimate.fsdp1 import ALL_LINEAR_MODULES, DTYPE_BYTES
from memfit.estimate.outside_phase import with_outside_phase
from memfit.estimate.parallel.shape import DecoderShape, read_shape
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import COMPONENTS, MemoryEstimate, PhasePeak
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import autocasts_adapters, sharded_save_offloads

#: The phase's name in ``MemoryEstimate.phases``.
PHASE = "checkpoint save"
#: The caching allocator's rounding (``CUDACachingAllocator.cpp``): requests up to 1 MiB are
#: rounded to 512 B (``kMinBlockSize``); above 10 MiB (``kMinLargeAlloc``) to 2 MiB
#: (``kRoundLarge``); in between to 512 B inside 20 MiB segments.
SMALL_ROUND_BYTES, LARGE_ROUND_BYTES, LARGE_MIN_BYTES = 512, 2 * 2**20, 10 * 2**20
#: Bytes of an fp32 adapter element (peft >= 0.12 keeps adapters in fp32: ``autocasts_adapters``).
FP32_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class SaveBytes:
    """One rank's bytes while the checkpoint's state dict is built, beyond what stays resident
    after the optimizer step: ``clone_bytes`` (the GPU copy of the rank's chunk of every
    parameter; 0 for FULL_STATE_DICT), ``root_bytes`` (the root unit unsharded), ``unit_bytes``
    (the largest decoder unit unsharded, with the shard copied up under CPU offload)."""

    clone_bytes: int
    root_bytes: int
    unit_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.clone_bytes + self.root_bytes + self.unit_bytes


def applies(workload: WorkloadSpec) -> bool:
    """Whether ``workload`` writes an FSDP1 checkpoint during training."""
    return (
        workload.is_train
        and workload.shard == "fsdp"
        and workload.fsdp_version == 1
        and workload.fsdp_state_dict_type is not None
    )


def _round(n_bytes: int) -> int:
    """``n_bytes`` as the caching allocator hands it out."""
    step = LARGE_ROUND_BYTES if n_bytes > LARGE_MIN_BYTES else SMALL_ROUND_BYTES
    return -(-n_bytes // step) * step


def _layer_tensors(shape: DecoderShape, workload: WorkloadSpec) -> list[int]:
    """Bytes of one decoder layer's parameters as the flat parameter stores them: each Linear's
    weight (bitsandbytes' packed 4-bit weight in its float quant storage, same bytes), biases,
    the two norms."""
    shard_b = DTYPE_BYTES[str(workload.precision)][1]
    h = shape.hidden
    linears = [(shape.q_dim, h), (shape.kv_dim, h), (shape.kv_dim, h), (h, shape.q_dim)]
    linears += [(shape.ffn, h)] * (shape.mlp_matrices - 1) + [(h, shape.ffn)]
    packs = quant.packs_as_parameter(workload.quant, workload.shard)
    out = []
    for n, k in linears:
        if packs:
            stored = quant.stored_tensors(workload.quant, n, k)
            out.append(next(t.n_bytes for t in stored if t.name == "weight"))
        else:
            out.append(n * k * shard_b)
    biases = max(shape.attention_params - sum(n * k for n, k in linears[:4]), 0)
    if biases:
        out.append(biases * shard_b)
    out += [shape.norm_params // 2 * shard_b] * 2
    return out


def _root_tensors(shape: DecoderShape, workload: WorkloadSpec) -> list[int]:
    """Bytes of the root unit's parameters: embeddings (and the untied head), final norm."""
    shard_b = DTYPE_BYTES[str(workload.precision)][1]
    embeddings = [shape.embedding_params * shard_b] * (1 if shape.tied else 2)
    return [*embeddings, shape.hidden * shard_b]


def _adapter_tensors(shape: DecoderShape, workload: WorkloadSpec, n_trainable: int) -> list[int]:
    """Bytes of one layer's adapter tensors (lora_A, lora_B of each adapted module, the layer's
    adapter elements split evenly), in peft's adapter dtype."""
    if workload.lora_rank is None or not n_trainable:
        return []
    shard_b = DTYPE_BYTES[str(workload.precision)][1]
    adapter_b = FP32_BYTES if autocasts_adapters(workload.peft_version) else shard_b
    per_layer = n_trainable // max(shape.n_layers, 1)
    targets = workload.lora_targets
    n_tensors = 2 * (len(targets) if isinstance(targets, tuple) else ALL_LINEAR_MODULES)
    return [per_layer // n_tensors * adapter_b] * n_tensors


def chunk_bytes(shape: DecoderShape, workload: WorkloadSpec, n_trainable: int) -> list[int]:
    """Each parameter's per-rank chunk as a SHARDED_STATE_DICT clones it (``tensor.chunk(W)``:
    ``ceil(n / W)`` of its elements, here of its bytes), before the allocator's rounding."""
    world = max(workload.dp_shard, 1)
    layer = _layer_tensors(shape, workload) + _adapter_tensors(shape, workload, n_trainable)
    per_layer = [-(-t // world) for t in layer]
    return per_layer * shape.n_layers + [-(-t // world) for t in _root_tensors(shape, workload)]


def save_bytes(shape: DecoderShape, workload: WorkloadSpec, n_trainable: int) -> SaveBytes:
    """The checkpoint phase's bytes of one rank (module docstring) for a dense decoder."""
    world = max(workload.dp_shard, 1)
    padded = -(-sum(_layer_tensors(shape, workload)) // world) * world  # a block's flat param
    unit = _round(padded)
    if workload.offload != "none":
        unit += _round(padded // world)  # the shard the all-gather copies up (pre_unshard)
    root_whole = _round(-(-sum(_root_tensors(shape, workload)) // world) * world)
    if workload.fsdp_state_dict_type != "SHARDED_STATE_DICT":
        # FULL_STATE_DICT: one unit whole at a time, moved to the CPU; no copies on the GPU
        return SaveBytes(clone_bytes=0, root_bytes=0, unit_bytes=max(unit, root_whole))
    chunks = [_round(c) for c in chunk_bytes(shape, workload, n_trainable)]
    # accelerate >= 0.31: each copy goes to the CPU as it is made; before, all stay on the GPU
    clones = max(chunks) if sharded_save_offloads(workload.accelerate_version) else sum(chunks)
    return SaveBytes(clone_bytes=clones, root_bytes=root_whole, unit_bytes=unit)


def resident_bytes(est: MemoryEstimate, workload: WorkloadSpec) -> int:
    """What stays on the GPU after the optimizer step: the optimizer phase's parameters (flat-
    parameter shards unless offloaded, a 4-bit base's quant state) and optimizer states, and the
    gradients where zero_grad keeps them."""
    opt = est.phases.get("optimizer")
    if opt is None:  # no separate step (optimizer in backward): the least any phase holds
        held_by = [
            p.components.get("parameters", 0) + p.components.get("optimizer_states", 0)
            for p in est.phases.values()
        ]
        return min(held_by, default=0)
    held = opt.components.get("parameters", 0) + opt.components.get("optimizer_states", 0)
    if not workload.zero_grad_set_to_none:
        held += opt.components.get("gradients", 0)
    return held


def with_checkpoint_save(
    est: MemoryEstimate, source: Any, workload: WorkloadSpec, gpu: Any
) -> MemoryEstimate:
    """``est`` (the FSDP1 training step's answer) with the checkpoint phase of ``workload``
    added; where that phase is higher it is the job's peak (allocated, reserved and device)."""
    if not applies(workload) or source.spec is None:
        return est
    shape = read_shape(source.spec)
    if shape.moe:
        return with_notes(est, [NOT_MOE])
    b = save_bytes(shape, workload, est.n_trainable_params)
    resident = resident_bytes(est, workload)
    total = resident + b.total_bytes
    phase = PhasePeak(
        phase=PHASE,
        peak_allocated_bytes=total,
        components={
            **dict.fromkeys(COMPONENTS, 0),
            "parameters": resident + b.root_bytes + b.unit_bytes,
            "temporary": b.clone_bytes,
        },
    )
    offloads = sharded_save_offloads(workload.accelerate_version)
    sharded = workload.fsdp_state_dict_type == "SHARDED_STATE_DICT"
    template = (NOTE if not offloads else NOTE_OFFLOADED) if sharded else NOTE_FULL
    note = template.format(
        kind=workload.fsdp_state_dict_type,
        clones=b.clone_bytes / 2**30,
        total=total / 2**30,
        step=est.peak_allocated_bytes / 2**30,
    )
    peak_note = (
        AVOID.format(version=workload.accelerate_version)
        if sharded and not offloads
        else "; this save is the job's peak"
    )
    return with_outside_phase(est, phase, gpu, note, peak_note=peak_note)


NOTE = (
    "FSDP1 checkpoint ({kind}, accelerate's save_fsdp_model): the state dict is built on the "
    "GPU, each rank cloning its chunk of every parameter ({clones:.2f} GiB) beside the root unit "
    "and one unit unsharded: {total:.2f} GiB allocated, vs {step:.2f} GiB for the training step "
    "(memfit.estimate.fsdp1_save)"
)
#: Said where a SHARDED_STATE_DICT save sets the job's peak: the ways to keep the copies off the
#: GPU. FULL_STATE_DICT: accelerate's ``set_state_dict_type`` gives it
#: ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)`` and ``save_fsdp_model`` keeps
#: both on when there is more than one process (huggingface/accelerate v1.14.0, beb0672a,
#: ``utils/dataclasses.py`` / ``utils/fsdp_utils.py``; the same at v0.28.0). accelerate >= 0.31
#: gives SHARDED_STATE_DICT ``ShardedStateDictConfig(offload_to_cpu=True)`` (PR #2762, 67308ca6,
#: 2024-05-10; first in v0.31.0), so torch's sharded post-hook moves each clone to the CPU as
#: it makes it (``_state_dict_utils._sharded_post_state_dict_hook``: ``sharded_tensor.cpu()``;
#: :func:`memfit.spec.hf_versions.sharded_save_offloads`).
AVOID = (
    "; this save is the job's peak (accelerate {version}). To avoid it: fsdp_state_dict_type "
    "FULL_STATE_DICT (accelerate gathers one unit at a time to rank 0's CPU: "
    "offload_to_cpu=True, rank0_only=True; rank 0's CPU memory then holds the whole state "
    "dict), accelerate >= 0.31 (its SHARDED_STATE_DICT moves each copy to the CPU as it is "
    "made: ShardedStateDictConfig(offload_to_cpu=True)), or no checkpoint during training "
    "(save_strategy no)"
)
NOTE_OFFLOADED = (
    "FSDP1 checkpoint ({kind}, accelerate's save_fsdp_model with offload_to_cpu): each unit "
    "unsharded on the GPU in turn beside the root unit, its copies moved to the CPU one at a "
    "time: {total:.2f} GiB allocated, vs {step:.2f} GiB for the training step "
    "(memfit.estimate.fsdp1_save)"
)
NOTE_FULL = (
    "FSDP1 checkpoint ({kind}, accelerate's save_fsdp_model with offload_to_cpu and "
    "rank0_only): one unit at a time gathered whole and moved to rank 0's CPU: {total:.2f} GiB "
    "allocated, vs {step:.2f} GiB for the training step (memfit.estimate.fsdp1_save)"
)
NOT_MOE = (
    "FSDP1 checkpoint of a MoE model: the state dict's per-rank copies are not modelled for MoE "
    "layers"
)

__all__ = [
    "PHASE",
    "SaveBytes",
    "applies",
    "chunk_bytes",
    "resident_bytes",
    "save_bytes",
    "with_checkpoint_save",
]

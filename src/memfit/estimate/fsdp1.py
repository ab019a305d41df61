"""FSDP1 (``FullyShardedDataParallel``) per rank: FSDP2's answer plus what FSDP1's flat
parameters hold that FSDP2's per-parameter shards do not.

``--shard fsdp --fsdp-version 1`` is how accelerate runs FSDP by default (``fsdp_version`` 1:
``accelerate/commands/launch.py`` ``--fsdp_version`` default "1", huggingface/accelerate
16cb6eb8), and how HF Trainer's ``fsdp: "full_shard auto_wrap"``, Lightning's ``FSDPStrategy``
(LitGPT) and Answer.AI's fsdp_qlora run it. Every engine answers the job as FSDP2 with the same
wrapping (one unit per decoder block, the root holding the embeddings, final norm and head:
accelerate's ``TRANSFORMER_BASED_WRAP`` on ``_no_split_modules``, LitGPT's
``auto_wrap_policy={Block}``); :func:`with_fsdp1` then adds the terms where FSDP1 differs. The
torch code cited is torch 2.13's ``torch/distributed/fsdp/`` (the paths are those torch 2.1 ran):

- **A flat parameter per unit** (``_flat_param.py`` ``FlatParamHandle``): the unit's tensors
  flattened into one 1-D ``FlatParameter``, padded to a multiple of the world size
  (``_init_flat_param_and_metadata``: ``numel_to_pad = world_size - total_numel % world_size``)
  and sharded in equal chunks: each rank holds ``ceil(unit / W)`` elements (FSDP2 pads each
  parameter's dim 0: the same bytes within ``W`` elements a parameter, not modelled).
- **requires_grad of the flat parameter**: with ``use_orig_params=True`` (Lightning's default,
  ``lightning/fabric/strategies/fsdp.py``; accelerate's for PEFT) a unit may mix frozen and
  trainable tensors, and the flat parameter requires grad if any of them does
  (``_validate_tensors_to_flatten``: ``flat_param_requires_grad = flat_param_requires_grad or
  tensor.requires_grad``). Its gradient is the whole unit's: a LoRA block's frozen weights get a
  (zero) gradient like the adapters, where the adapters sit in their block's unit
  (``fsdp_lora_wrap`` ``block``: LitGPT's ``auto_wrap_policy={Block}``). Under peft's
  ``fsdp_auto_wrap_policy`` (``peft`` — HF Trainer installs it for a PEFT model,
  ``transformers/distributed/fsdp.py`` ``update_fsdp_plugin_peft``) each lora_A / lora_B is a
  unit of its own and the blocks' flat parameters are frozen: no gradient there. After a
  synchronised backward the rank keeps the *sharded* gradient of the whole flat parameter
  (``_post_backward_hook`` reduce-scatters it into ``_saved_grad_shard``;
  ``prepare_gradient_for_optim`` moves it to ``.grad``), cast to the sharded parameter's dtype
  (``_cast_grad_to_param_dtype``). FSDP2 gives frozen parameters no gradient: the difference is
  ``frozen numel / W`` per unit, held at the optimizer step.
- **no_sync gradient accumulation**: accelerate's ``Accelerator.accumulate`` enters
  ``no_sync`` on every micro-batch but the last (``accelerator.py`` ``accumulate``, unless
  ``sync_each_batch``), HF Trainer wraps every micro-batch but the last in
  ``accelerator.no_sync`` (``transformers/trainer.py``, transformers 5.23, unless
  ``sync_each_batch``), Lightning Fabric's ``no_backward_sync`` returns ``module.no_sync()``.
  Under ``no_sync`` the post-backward hook returns before the reduce-scatter
  (``_runtime_utils.py`` ``_post_backward_hook``: ``if not state._sync_gradients: ...
  _use_unsharded_grad_views(); return``) and ``prepare_gradient_for_backward`` keeps the padded
  *unsharded* gradient for the next micro-batch: every rank holds every grad-requiring unit's
  whole gradient, in the forward / backward dtype (``MixedPrecision.param_dtype``), from the first
  micro-batch's backward to the last one's (``FullyShardedDataParallel.no_sync`` docstring:
  "accumulate the full model gradients (instead of gradient shards)"). With ``grad_accum`` > 1
  memfit adds them to the forward and backward peaks (less the sharded gradients an FSDP2 answer
  already holds there with ``zero_grad_set_to_none=False``). Measured on torch's own FSDP1 on
  CPU: ``benchmarks/fsdp1_lora_no_sync.py``, ``tests/estimate/test_fsdp1.py``.
- **What is the same** as FSDP2 here: FULL_SHARD frees a unit's unsharded parameters after its
  forward and backward; ``backward_prefetch=BACKWARD_PRE`` (the constructor's default) gathers
  the next unit before the current one's gradient is computed, ``limit_all_gathers=True``
  allows two units' all-gathers in flight (``_runtime_utils._unshard``, the rate limiter):
  the running unit and the next, as FSDP2's implicit prefetch holds (forward_prefetch=False:
  no more). ``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` as accelerate and
  Lightning set it (all three the 16-bit dtype, ``set_mixed_precision`` /
  ``FSDPPrecision.mixed_precision_config``) casts the gathered parameters as FSDP2's policy
  does; FSDP1 reduce-scatters in that 16-bit ``reduce_dtype`` where memfit's FSDP2 follows
  torchtitan's fp32 (a per-unit fp32 gradient copy FSDP1 does not make: an over-count of one
  unit's gradient in fp32, left in). ``sync_module_states`` broadcasts at wrap time only.

Not modelled: a unit's parameters offloaded to CPU with ``no_sync`` (FSDP1 keeps the unsharded
gradients on the GPU there, as here), NO_SHARD / SHARD_GRAD_OP (memfit's ddp / zero2), FSDP1
over quantized weights (Answer.AI's fsdp_qlora), ``use_orig_params=False`` with a frozen
base (FSDP1 refuses mixed ``requires_grad`` there; Answer.AI and peft wrap LoRA layers as their
own units).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from memfit.estimate.device import fit_verdict
from memfit.estimate.parallel.shape import read_shape
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import MemoryEstimate, PhasePeak
from memfit.spec import WorkloadSpec

#: The caching allocator's rounding of a large block (> 10 MiB requests round to 2 MiB:
#: ``CUDACachingAllocator.cpp`` ``kRoundLarge``); each held unsharded gradient is such a block.
ROUND_LARGE_BYTES = 2 * 2**20
#: Bytes of a tensor in the forward / backward dtype (``MixedPrecision.param_dtype``) and in the
#: sharded parameter's dtype, per precision: ``*-mixed`` keeps fp32 sharded parameters (the
#: model loaded in fp32) and computes in 16-bit (accelerate ``set_mixed_precision``, Lightning
#: ``FSDPPrecision.mixed_precision_config``: param_dtype bf16 / fp16); ``*-true`` is 16-bit
#: throughout; ``32-true`` fp32.
DTYPE_BYTES: dict[str, tuple[int, int]] = {
    "bf16-mixed": (2, 4),
    "16-mixed": (2, 4),
    "bf16-true": (2, 2),
    "16-true": (2, 2),
    "32-true": (4, 4),
}
#: FSDP1 aligns each tensor of a flat parameter to this many bytes with use_orig_params=True
#: (``torch/distributed/fsdp/_flat_param.py`` ``_get_aligned_numel``: "This alignment
#: constraint comes from TorchInductor").
ALIGNMENT_BYTES = 16
#: Tensors of a decoder layer besides its MLP: q, k, v, o projections and two norms (biases,
#: where a model has them, are not counted: at most one alignment pad each).
ATTENTION_TENSORS, NORM_TENSORS = 4, 2
#: Linear modules per layer peft's ``all-linear`` adapts in a Llama-style block.
ALL_LINEAR_MODULES = 7
#: Below this, a term is alignment padding: counted, not worth a note.
NOTE_MIN_BYTES = 2**20
#: LoRA targets / modules_to_save that live in the root unit (embeddings, final norm, head).
ROOT_MODULES = ("lm_head", "embed_tokens", "wte", "embed_out", "norm")


@dataclass(frozen=True, kw_only=True)
class Fsdp1Units:
    """A decoder's FSDP1 units on ``world`` shard ranks: per unit its flat parameter's element
    count and whether it requires grad (the blocks, then peft's adapter units if any, then the
    root)."""

    units: tuple[tuple[int, bool], ...]
    n_blocks: int
    n_adapter_units: int
    world: int

    def shard_numel(self, numel: int) -> int:
        """One rank's chunk of a flat parameter padded to a multiple of the world size."""
        return -(-numel // self.world)

    def padded_numel(self, numel: int) -> int:
        return self.shard_numel(numel) * self.world


@dataclass(frozen=True, kw_only=True)
class Fsdp1Terms:
    """What FSDP1 holds beyond FSDP2, per rank: ``held_grad_bytes`` (no_sync's unsharded
    gradients, forward and backward), ``held_segment_bytes`` (the same as allocator blocks),
    ``frozen_grad_bytes`` (sharded gradients of frozen weights in grad-requiring units, at the
    optimizer step)."""

    held_grad_bytes: int
    held_segment_bytes: int
    frozen_grad_bytes: int


def units_of(source: Any, workload: WorkloadSpec, n_trainable: int) -> Fsdp1Units:
    """The units of ``source`` (a decoder LLM: NotModelledError otherwise) under ``workload``:
    one per decoder layer, the root with the embeddings, final norm and head. A LoRA job's
    adapters (``n_trainable``, spread evenly over the layers) sit in their block's unit
    (``fsdp_lora_wrap`` ``block``) or, under peft's policy, in units of their own (two per
    adapted module: lora_A, lora_B), leaving the blocks frozen."""
    shape = read_shape(source.spec)
    lora = workload.lora_rank is not None
    own = lora and workload.fsdp_lora_wrap == "peft"
    per_layer_lora = n_trainable // max(shape.n_layers, 1) if lora else 0
    n_adapted = _n_adapted(workload)
    pad = _alignment_pad(workload)
    units: list[tuple[int, bool]] = []
    for layer in range(shape.n_layers):
        numel = shape.attention_params + shape.norm_params
        n_tensors = ATTENTION_TENSORS + NORM_TENSORS
        if shape.is_moe_layer(layer):
            numel += shape.n_experts * shape.expert_params
            numel += shape.shared_params + shape.router_params
            n_tensors += (shape.n_experts + (1 if shape.shared_ffn else 0)) * shape.mlp_matrices
            n_tensors += 1  # the router
        else:
            numel += shape.dense_mlp_params
            n_tensors += shape.mlp_matrices
        if lora and not own:
            n_tensors += 2 * n_adapted
            units.append((numel + per_layer_lora + (n_tensors - 1) * pad, True))
        else:
            trains = not lora and layer >= workload.freeze_layers
            units.append((numel + (n_tensors - 1) * pad, trains))
    adapters = _adapter_units(per_layer_lora, n_adapted) * shape.n_layers if own else []
    root = shape.embedding_params * (1 if shape.tied else 2) + shape.hidden
    root += (1 if shape.tied else 2) * pad  # embeddings, final norm (, head): their alignment
    root_trains = not lora or _root_trains(workload)
    return Fsdp1Units(
        units=(*units, *adapters, (root, root_trains)),
        n_blocks=shape.n_layers,
        n_adapter_units=len(adapters),
        world=workload.dp_shard,
    )


def _alignment_pad(workload: WorkloadSpec) -> int:
    """The most elements FSDP1 inserts before a tensor of a flat parameter: with
    ``use_orig_params=True`` it aligns every tensor's start to 16 bytes
    (``_flat_param.py``: ``align_addresses = use_orig_params``; ``_get_aligned_numel``,
    ``ALIGNMENT = 16``), so up to ``16 / itemsize - 1`` padding elements each (an upper
    bound: memfit does not know the tensors' order)."""
    itemsize = DTYPE_BYTES[str(workload.precision)][1]
    return ALIGNMENT_BYTES // itemsize - 1


def _n_adapted(workload: WorkloadSpec) -> int:
    """Modules with a LoRA adapter per layer."""
    targets = workload.lora_targets
    return len(targets) if isinstance(targets, tuple) else ALL_LINEAR_MODULES


def _adapter_units(per_layer: int, n_adapted: int) -> list[tuple[int, bool]]:
    """One layer's adapter units under peft's policy: lora_A and lora_B of each adapted module
    (one tensor each: no alignment padding), the layer's adapter elements split evenly."""
    n_units = 2 * max(n_adapted, 1)
    return [(max(per_layer // n_units, 1), True)] * n_units


def _root_trains(workload: WorkloadSpec) -> bool:
    """Whether a LoRA job trains anything in the root unit (its head or embeddings)."""
    names = [*workload.lora_modules_to_save]
    if isinstance(workload.lora_targets, tuple):
        names += workload.lora_targets
    return any(n in ROOT_MODULES for n in names)


def terms(units: Fsdp1Units, workload: WorkloadSpec, n_trainable: int) -> Fsdp1Terms:
    """FSDP1's extra bytes per rank for ``workload`` (module docstring)."""
    compute_b, shard_b = DTYPE_BYTES[str(workload.precision)]
    grad_units = [n for n, trains in units.units if trains]
    held = held_segments = 0
    if workload.is_train and workload.grad_accum > 1:
        sizes = [units.padded_numel(n) * compute_b for n in grad_units]
        held = sum(sizes)
        held_segments = sum(-(-s // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES for s in sizes)
        if not workload.zero_grad_set_to_none:
            # FSDP2's answer already holds the earlier micro-batches' sharded gradients there
            fsdp2 = -(-n_trainable // units.world) * fsdp2_grad_bytes(workload)
            held, held_segments = max(0, held - fsdp2), max(0, held_segments - fsdp2)
    frozen = 0
    if workload.is_train and workload.offload == "none":
        whole = sum(units.shard_numel(n) for n in grad_units) * shard_b
        frozen = max(0, whole - -(-n_trainable // units.world) * fsdp2_grad_bytes(workload))
    return Fsdp1Terms(
        held_grad_bytes=held, held_segment_bytes=held_segments, frozen_grad_bytes=frozen
    )


def fsdp2_grad_bytes(workload: WorkloadSpec) -> int:
    """Bytes of an FSDP2 sharded gradient element: fp32 under memfit's FSDP2 policy for
    ``*-mixed`` (``WorkloadSpec.fsdp_policy``), else the parameters' dtype."""
    return 4 if workload.fsdp_policy is not None else DTYPE_BYTES[str(workload.precision)][1]


def fsdp2_twin(workload: WorkloadSpec) -> WorkloadSpec:
    """The FSDP2 job the engines answer for an FSDP1 ``workload`` (itself for any other)."""
    if workload.fsdp_version == 2:
        return workload
    return dataclasses.replace(
        workload,
        fsdp_version=2,
        fsdp_lora_wrap="peft",
        fsdp_state_dict_type=None,
        accelerate_version=None,
    )


def with_fsdp1(
    est: MemoryEstimate, source: Any, workload: WorkloadSpec, gpu: Any
) -> MemoryEstimate:
    """``est`` (the FSDP2 answer of :func:`fsdp2_twin`) as FSDP1 runs ``workload``: the held
    unsharded gradients added to the forward and backward phases, the frozen weights' sharded
    gradients to the optimizer step, reserved and device bytes by the allocator blocks they
    take, the verdict judged again; the workload and notes say FSDP1."""
    units = units_of(source, workload, est.n_trainable_params)
    t = terms(units, workload, est.n_trainable_params)
    added = {"forward": t.held_grad_bytes, "backward": t.held_grad_bytes}
    added["optimizer"] = t.frozen_grad_bytes
    phases = {}
    for name, p in est.phases.items():
        extra = added.get(name, 0)
        comps = {**p.components, "gradients": p.components.get("gradients", 0) + extra}
        phases[name] = PhasePeak(
            phase=name, peak_allocated_bytes=p.peak_allocated_bytes + extra, components=comps
        )
    top = max(phases.values(), key=lambda p: p.peak_allocated_bytes)
    grown = top.peak_allocated_bytes - est.peak_allocated_bytes
    # the held gradients are blocks of their own for the whole run (each > 10 MiB, rounded to
    # 2 MiB), on top of whatever FSDP2's run reserved; otherwise what the peak grew by
    segments = t.held_segment_bytes if t.held_grad_bytes else grown
    reserved = max(est.peak_reserved_bytes + segments, top.peak_allocated_bytes)
    device = est.device_used_bytes + (reserved - est.peak_reserved_bytes)
    shift = {
        "peak_allocated_bytes": grown,
        "peak_reserved_bytes": reserved - est.peak_reserved_bytes,
        "device_used_bytes": device - est.device_used_bytes,
    }
    ranges = {k: (lo + shift.get(k, 0), hi + shift.get(k, 0)) for k, (lo, hi) in est.ranges.items()}
    out = dataclasses.replace(
        est,
        workload=workload.normalized(),
        peak_allocated_bytes=top.peak_allocated_bytes,
        peak_reserved_bytes=reserved,
        device_used_bytes=device,
        peak_phase=top.phase,
        components=dict(top.components),
        phases=phases,
        ranges=ranges,
        fits=fit_verdict(gpu, device) if est.fits is not None else None,
    )
    # the FSDP2 twin's workload warnings that do not hold for FSDP1 (its no_sync gradients are
    # counted here whatever zero_grad does)
    stale = set(fsdp2_twin(workload).warnings()) - set(workload.warnings())
    out = dataclasses.replace(out, notes=[n for n in out.notes if n not in stale])
    return with_notes(out, notes(units, workload, t), first=True)


def notes(units: Fsdp1Units, workload: WorkloadSpec, t: Fsdp1Terms) -> list[str]:
    """What the FSDP1 answer adds to FSDP2's, in words."""
    n_grad = sum(trains for _, trains in units.units)
    adapters = (
        f" + {units.n_adapter_units} adapter units (peft's fsdp_auto_wrap_policy)"
        if units.n_adapter_units
        else ""
    )
    out = [
        f"FSDP1 (FullyShardedDataParallel, use_orig_params=True): {len(units.units)} flat "
        f"parameters ({units.n_blocks} blocks{adapters} + the root), each padded to a multiple "
        f"of {units.world} and sharded; answered as FSDP2 with the same blocks plus FSDP1's "
        "gradients (memfit.estimate.fsdp1)"
    ]
    if t.held_grad_bytes:
        out.append(
            f"no_sync accumulation over {workload.grad_accum} micro-batches (accelerate's "
            "accumulate, Lightning's no_backward_sync): every rank holds the unsharded gradient "
            f"of the {n_grad} units that require grad, {t.held_grad_bytes / 2**30:.2f} GiB, "
            "through the forward and backward of every micro-batch"
        )
    if t.frozen_grad_bytes >= NOTE_MIN_BYTES:
        out.append(
            "flat parameters mixing frozen and trainable weights get a gradient of the whole "
            f"shard: +{t.frozen_grad_bytes / 2**30:.2f} GiB of sharded gradients at the "
            "optimizer step"
        )
    return out


__all__ = [
    "Fsdp1Terms",
    "Fsdp1Units",
    "fsdp2_grad_bytes",
    "fsdp2_twin",
    "terms",
    "units_of",
    "with_fsdp1",
]

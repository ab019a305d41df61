"""Multi-GPU and offload jobs in the trace engine: what one rank (rank 0) holds, step by step.

Two routes, chosen per setup:

- ``fsdp`` is **traced for real**: PyTorch FSDP2 (``fully_shard`` on every decoder block and on the
  root) runs on FakeTensors with torch's fake process group (``FakeStore``, ``world_size = dp``,
  rank 0). Every byte FSDP2 allocates — sharded parameters, the all-gather buffers, the unsharded
  parameters it frees with ``resize_(0)``, reduce-scatter buffers, sharded gradients — is counted
  by the tracker as it happens. The collectives move no data, which changes no allocation.
  Storages born inside FSDP2's all-gather are labelled ``parameters``, inside its reduce-scatter
  ``gradients``. A ``*-mixed`` precision runs as torchtitan runs FSDP2
  (``spec.rules.FSDP_MIXED_POLICY``): the model built in fp32, ``MixedPrecisionPolicy(
  param_dtype=bf16, reduce_dtype=fp32)``, no autocast; ``*-true`` / ``32-true`` use the default
  policy (no cast). ``reshard_after_forward`` and HSDP (``dp_replicate``: a 2-D mesh) are passed
  to ``fully_shard`` as the workload sets them.
- ``ddp``, ``zero1/2/3`` and every ``offload`` are a **rewrite of the traced timeline**
  (DeepSpeed is not a dependency, and DDP's reducer lives in C++). The single-GPU step is traced
  once, with marks for phases and for each parameter-owning module's forward and backward, then
  replayed as rank 0 runs it: parameter, gradient and optimizer-state storages shrunk to their
  partition; DDP buckets and ZeRO's contiguous-gradient bucket allocated; ZeRO-3 parameters
  gathered per module around its forward and backward (with prefetch); offloaded storages moved
  to a host timeline whose peak is ``host_memory_bytes``. The arithmetic and the cited defaults
  live in :mod:`memfit.estimate.sharding`.

Tensor parallelism (``tp``) is handled before tracing: the traced config has attention heads, KV
heads, intermediate size and (padded) vocabulary divided by ``tp`` and the hidden size unchanged,
which is exactly one rank's share of a Megatron-style block without sequence parallelism
(column-parallel QKV/gate/up, row-parallel o/down, vocab-parallel embedding and lm_head; norms,
dropout and the block input/output activations replicated: Korthikanti et al. 2022, §4.1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass as _is_wrapper

from memfit.errors import TraceError
from memfit.estimate import sharding
from memfit.estimate.trace.build import decoder_layers
from memfit.estimate.trace.rank_trace import RankTrace
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec

#: Model types the tensor-parallel split applies to (shared with the analytic engine).
TP_MODEL_TYPES = sharding.TP_MODEL_TYPES


# ----------------------------------------------------------------------------- entry points
def is_distributed(workload: WorkloadSpec) -> bool:
    return workload.gpus > 1 or workload.offload != "none" or workload.shard != "none"


def per_rank_config(config: dict[str, Any], tp: int) -> dict[str, Any]:
    """The config of one tensor-parallel rank's model (see the module docstring)."""
    return sharding.tp_per_rank_config(config, tp)


def notes(workload: WorkloadSpec) -> list[str]:
    """What the estimate assumes about the distributed setup (added to ``MemoryEstimate.notes``)."""
    if not is_distributed(workload) and workload.tp == 1:
        return []
    out = [
        f"per-GPU memory of rank 0: {workload.gpus} GPU(s) = tp {workload.tp} x data-parallel "
        f"{workload.dp}, shard {workload.shard!r}, offload {workload.offload!r}"
    ]
    if workload.shard == "fsdp":
        out.append("FSDP2 traced with a fake process group (fully_shard per block and root)")
    elif workload.shard in ("zero1", "zero2", "zero3"):
        d = sharding.DEEPSPEED_DEFAULTS
        out.append(
            "DeepSpeed ZeRO modelled on the traced timeline with its code defaults: "
            f"reduce_bucket_size {d['reduce_bucket_size']:.0e}, prefetch "
            f"{d['stage3_prefetch_bucket_size']:.0e}, persistence threshold "
            f"{d['stage3_param_persistence_threshold']:.0e}; fp32 master weights and Adam states"
        )
        if workload.shard == "zero3":
            out.append(
                "ZeRO-3 releases each module's gathered parameters after use; "
                "stage3_max_reuse_distance (1e9) can keep more gathered near the forward/backward "
                "turn (at most stage3_max_live_parameters, 1e9 elements)"
            )
    elif workload.shard == "ddp":
        out.append(
            "DDP with bucket_cap_mb 25 (first bucket 1 MiB) and gradient_as_bucket_view False: "
            "bucket copies held in addition to .grad"
        )
    out.extend(sharding.layout_notes(workload))
    if workload.tp > 1:
        out.append(
            "tensor parallelism traced as one rank's block (heads, KV heads, intermediate and "
            "padded vocabulary divided by tp; no sequence parallelism)"
        )
    return out


# ----------------------------------------------------------------------------- the tracker
class DistTracker(StorageTracker):
    """The storage tracker, plus marks (phase changes, module forward/backward boundaries)
    between its events, and a label forced on storages born while ``forced_label`` is set."""

    def __init__(self) -> None:
        super().__init__(device_type="cpu")
        self.marks: list[tuple[int, str, str]] = []
        self.forced_label: str | None = None
        self.grad_keys: set[int] = set()
        self.on_enter: list[Callable[[], Callable[[], None]]] = []
        self._undo: list[Callable[[], None]] = []
        #: per birth event, its size before the 512 B rounding (a derived form solves those)
        self.raw: list[int] = []
        self._last_raw = 0
        #: rank 0's rewritten timeline once :meth:`Plan.finish` ran (what a derived form records)
        self.timeline: Any = None

    def mark(self, kind: str, payload: str) -> None:
        self.marks.append((len(self.events or ()), kind, payload))

    def set_phase(self, phase: str) -> None:
        self.mark("phase", phase)
        super().set_phase(phase)

    def _rounded(self, n_bytes: int) -> int:
        self._last_raw = n_bytes
        return super()._rounded(n_bytes)

    def _set_live(self, key: int, n_bytes: int) -> None:
        before = len(self.events or ())
        super()._set_live(key, n_bytes)
        events = self.events or []
        self.raw.extend(self._last_raw for op, _k, _n in events[before:] if op == "a")

    def track(self, t: torch.Tensor, label: str | None = None) -> int | None:
        if label is None and self.forced_label is not None and not _is_wrapper(t):
            if self._key_of.get(t.untyped_storage()) is None:
                label = self.forced_label
            return super().track(t, label)
        key = super().track(t, label)
        if label == "gradients" and key is not None:
            self.grad_keys.add(key)  # some parameter's .grad (labelled by the step)
        return key

    def __enter__(self) -> DistTracker:
        super().__enter__()
        self._undo = [setup() for setup in self.on_enter]
        return self

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        super().__exit__(*exc)


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """How one traced run becomes rank 0's run. Create outside FakeTensorMode (FSDP's device mesh
    must be); call :meth:`wrap_` inside it, before the step; :meth:`finish` after it."""

    workload: WorkloadSpec
    full_config: dict[str, Any]
    tracker: DistTracker = field(default_factory=DistTracker)
    mesh: Any = None

    @property
    def config(self) -> dict[str, Any]:
        return per_rank_config(self.full_config, self.workload.tp)

    def wrap_(self, model: torch.nn.Module) -> None:
        if self.workload.shard == "fsdp":
            _fully_shard_(model, self.mesh, self.workload)
            self.tracker.on_enter.append(partial_label_fsdp(self.tracker))
        else:
            _mark_modules_(model, self.tracker)

    def finish(
        self, flat: dict[str, float], trace: RankTrace, full_counts: tuple[int, int] | None
    ) -> list[tuple[str, int, int]]:
        """Replace ``flat``'s phase entries by rank 0's, add ``host_memory``; return the events
        to replay through the allocator. ``trace``: the traced step (:func:`rank_trace.snapshot`
        of :attr:`tracker` after it, or the same step of another variant); ``full_counts``: the
        un-split model's parameters, all and trainable (tp > 1: :func:`full_param_counts`)."""
        from memfit.estimate.trace.rank_replay import strategy

        rewrite = strategy(self.workload, trace)
        timeline = rewrite.run()
        self.tracker.timeline = timeline
        for key in [k for k in flat if k.startswith("phase/")]:
            del flat[key]
        flat.update(timeline.flat())
        if self.workload.tp > 1 and full_counts is not None:
            flat["n_params"] = full_counts[0]
            if not self.workload.lora_rank:  # LoRA: the traced rank's adapter count stays
                flat["n_trainable"] = full_counts[1]
        return timeline.events


def full_param_counts(model: torch.nn.Module) -> tuple[int, int]:
    """All and trainable parameters of the un-split model (built on ``meta``)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def plan_for(workload: WorkloadSpec, config: dict[str, Any]) -> Plan | None:
    """The plan for a multi-GPU / offload / tensor-parallel job, or None for one plain GPU."""
    if not is_distributed(workload) and workload.tp == 1:
        return None
    plan = Plan(workload=workload, full_config=config)
    if workload.shard == "fsdp":
        plan.mesh = _fake_mesh(workload.dp, workload.dp_replicate)
    return plan


def _fake_mesh(dp: int, replicate: int = 1) -> Any:
    """A device mesh of ``dp`` ranks over torch's fake process group (rank 0): 1-D, or
    (replicate, shard) for HSDP — ``fully_shard`` on a 2-D mesh replicates across dim 0 and
    shards across dim 1 (torch.distributed.fsdp.fully_shard docs)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise TraceError(
                "a real torch.distributed process group is initialised in this process; run "
                "memfit's FSDP trace in a separate process"
            )
        if dist.get_world_size() != dp:
            dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp)
    if replicate > 1:
        return init_device_mesh(
            "cpu", (replicate, dp // replicate), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    return init_device_mesh("cpu", (dp,))


def _fully_shard_(model: torch.nn.Module, mesh: Any, workload: WorkloadSpec) -> None:
    """``fully_shard`` on every decoder block, then on the root, as torchtitan's
    ``apply_fsdp_to_decoder`` does for a dense decoder: the workload's ``MixedPrecisionPolicy``
    (``WorkloadSpec.fsdp_policy``; none: FSDP2's default, no cast), ``reshard_after_forward``,
    and an HSDP mesh when ``dp_replicate`` > 1 (see :func:`_fake_mesh`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = workload.fsdp_policy
    mp = MixedPrecisionPolicy()
    if policy is not None:
        mp = MixedPrecisionPolicy(
            param_dtype=getattr(torch, policy[0]),
            reduce_dtype=getattr(torch, policy[1]),
            cast_forward_inputs=False,
        )
    rf = workload.reshard_after_forward
    layers = decoder_layers(model)
    with _real_post_forward_mesh():
        for layer in layers if layers is not None else []:
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=rf)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=rf)


@contextlib.contextmanager
def _real_post_forward_mesh() -> Iterator[None]:
    """``fully_shard(reshard_after_forward=int)`` builds the post-forward sub-mesh from the
    mesh's rank tensor (``_fsdp_init._get_post_forward_mesh_info``); under FakeTensorMode that
    tensor turns fake and reading its values fails, so the sub-mesh is built outside it (a
    device mesh is bookkeeping, not a device allocation)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.fsdp._fully_shard import _fully_shard as module

    original = module._get_post_forward_mesh_info

    def outside_fake(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return original(*args, **kwargs)

    module._get_post_forward_mesh_info = outside_fake
    try:
        yield
    finally:
        module._get_post_forward_mesh_info = original


def partial_label_fsdp(tracker: DistTracker) -> Callable[[], Callable[[], None]]:
    """While tracking, label storages FSDP2 creates inside its all-gather ``parameters`` and
    inside its reduce-scatter ``gradients`` (both would otherwise read as activations/temporary)."""

    def setup() -> Callable[[], None]:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

        names = {
            "foreach_all_gather": "parameters",
            "foreach_all_gather_copy_out": "parameters",
            "foreach_reduce": "gradients",
        }
        saved = {n: getattr(group, n) for n in names if hasattr(group, n)}
        for name, fn in saved.items():
            setattr(group, name, _labelled(fn, tracker, names[name]))

        def undo() -> None:
            for name, fn in saved.items():
                setattr(group, name, fn)

        return undo

    return setup


def _labelled(fn: Callable[..., Any], tracker: DistTracker, label: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous, tracker.forced_label = tracker.forced_label, label
        try:
            return fn(*args, **kwargs)
        finally:
            tracker.forced_label = previous

    return wrapper


def _mark_modules_(model: torch.nn.Module, tracker: DistTracker) -> None:
    """Mark the forward and backward boundaries of every module that owns parameters: forward
    pre/post hooks, and tensor hooks on its output (its backward starts when that gradient is
    ready) and on its first differentiable input (its backward has ended)."""
    for name, module in model.named_modules():
        if not any(True for _ in module.parameters(recurse=False)):
            continue

        def pre(_m: Any, _args: Any, name: str = name) -> None:
            tracker.mark("fwd_in", name)

        def post(_m: Any, args: Any, out: Any, name: str = name) -> None:
            tracker.mark("fwd_out", name)
            if not torch.is_grad_enabled():
                return
            first_out = _first_differentiable(out)
            if first_out is not None:
                first_out.register_hook(lambda g, name=name: tracker.mark("bwd_in", name))
            first_in = _first_differentiable(args)
            if first_in is not None:
                first_in.register_hook(lambda g, name=name: tracker.mark("bwd_out", name))

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def _first_differentiable(tree: Any) -> torch.Tensor | None:
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(tree)
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return t
    return None

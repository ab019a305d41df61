"""Replay a traced step as one data-parallel rank runs it (DDP, ZeRO-1/2/3, offload).

The events of a :class:`~memfit.estimate.trace.distributed.DistTracker`, as a
:class:`~memfit.estimate.trace.rank_trace.RankTrace` keeps them (no live tracker, no model: one
trace serves every variant whose traced step is the same), are walked in order with its marks
(phase changes, module forward/backward boundaries); a strategy decides each storage's size on
the device and in host RAM and adds the storages the framework allocates itself (DDP buckets,
ZeRO's gradient bucket, partitions and gathered parameters). The result is each phase's peak by
component and module, the host peak, and the event list for the allocator replay. Rules and
defaults: :mod:`memfit.estimate.sharding`; which route each setup takes: ``distributed.py``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from memfit.estimate import sharding
from memfit.estimate.trace.build import generic_module_name
from memfit.estimate.trace.rank_trace import Param, RankTrace
from memfit.spec import WorkloadSpec

#: Optimizers DeepSpeed runs as its fused multi-tensor Adam (no parameter-sized temporaries).
DEEPSPEED_FUSED_ADAM = sharding.DEEPSPEED_ADAM
#: First key of the synthetic storages the rewrite adds (the engine uses -1, -2, … for workspaces).
_SYNTHETIC_KEY0 = -1_000_000


@dataclass
class _Peak:
    total_bytes: int = -1
    components: dict[str, int] = field(default_factory=dict)
    modules: dict[str, int] = field(default_factory=dict)


class _Timeline:
    """Live bytes by component and module over a rewritten event sequence, with each phase's
    peak; a second, host-side running total for offloaded storages."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, str, str]] = {}
        self.total = 0
        self.by_comp: dict[str, int] = defaultdict(int)
        self.by_module: dict[str, int] = defaultdict(int)
        self.phase = "init"
        self.peaks: dict[str, _Peak] = {}
        self.events: list[tuple[str, int, int]] = []
        self.host_live: dict[int, int] = {}
        self.host_total = 0
        self.host_peak = 0
        # what a derived form records (memfit.estimate.derived.record): per birth its size
        # before rounding and whether the rewrite set it (else the trace's own size), per key
        # its owner, and the phase marks (event index, phase)
        self.raw: list[int] = []
        self.fixed: list[bool] = []
        self.owner: dict[int, tuple[str, str]] = {}
        self.marks: list[tuple[int, str]] = []

    def alloc(
        self, key: int, n_bytes: int, comp: str, module: str, *, raw: int | None = None
    ) -> None:
        """A birth of ``n_bytes`` (rounded up to 512 B here); ``raw``: the traced storage's
        size before the tracker rounded it, where the rewrite kept the traced size."""
        if n_bytes <= 0:
            return
        if key in self.live:
            self.free(key)
        self.raw.append(n_bytes if raw is None else raw)
        self.fixed.append(raw is None)
        self.owner[key] = (comp, module)
        n_bytes = _round512(n_bytes)
        self.live[key] = (n_bytes, comp, module)
        self.total += n_bytes
        self.by_comp[comp] += n_bytes
        self.by_module[module] += n_bytes
        self.events.append(("a", key, n_bytes))
        self._check()

    def free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is None:
            return
        n_bytes, comp, module = entry
        self.total -= n_bytes
        self.by_comp[comp] -= n_bytes
        self.by_module[module] -= n_bytes
        self.events.append(("f", key, 0))

    def host_alloc(self, key: int, n_bytes: int) -> None:
        if n_bytes <= 0:
            return
        self.host_free(key)
        self.host_live[key] = n_bytes
        self.host_total += n_bytes
        self.host_peak = max(self.host_peak, self.host_total)

    def host_free(self, key: int) -> None:
        self.host_total -= self.host_live.pop(key, 0)

    def set_phase(self, phase: str) -> None:
        self.marks.append((len(self.events), phase))
        self.phase = phase
        self._check()

    def _check(self) -> None:
        peak = self.peaks.setdefault(self.phase, _Peak())
        if self.total > peak.total_bytes:
            peak.total_bytes = self.total
            peak.components = {c: n for c, n in self.by_comp.items() if n}
            peak.modules = {m: n for m, n in self.by_module.items() if n}

    def flat(self) -> dict[str, float]:
        out: dict[str, float] = {"host_memory": self.host_peak}
        for phase, peak in self.peaks.items():
            if phase in ("init", "end") or peak.total_bytes < 0:
                continue
            out[f"phase/{phase}/peak"] = peak.total_bytes
            for comp, n in peak.components.items():
                out[f"phase/{phase}/comp/{comp}"] = n
            for mod, n in peak.modules.items():
                key = f"phase/{phase}/mod/{generic_module_name(mod)}"
                out[key] = out.get(key, 0) + n
        return out


def _round512(n: int) -> int:
    return -(-n // 512) * 512


class _Rewrite:
    """Replays the tracker's events as rank 0 sees them. The base class keeps every storage as
    traced; subclasses override :meth:`device_bytes`, :meth:`prologue`, :meth:`on_mark` and
    :meth:`after_alloc`."""

    def __init__(self, workload: WorkloadSpec, trace: RankTrace):
        self.wl = workload
        self.dp = workload.dp
        self.trace = trace
        self.params = trace.params
        self.tl = _Timeline()
        self._next_key = itertools.count(_SYNTHETIC_KEY0, -1)
        self.offload_opt = workload.offload in ("optimizer", "params")
        self.offload_params = workload.offload == "params"

    # -- what subclasses change
    def device_bytes(self, key: int, n_bytes: int) -> int:
        return n_bytes

    def host_bytes(self, key: int, n_bytes: int) -> int:
        return 0

    def prologue(self) -> None:
        pass

    def on_mark(self, kind: str, payload: str) -> None:
        pass

    def after_alloc(self, key: int) -> None:
        pass

    # -- the walk
    def run(self) -> _Timeline:
        tr, tl = self.trace, self.tl
        marks = iter(tr.marks)
        pending = next(marks, None)
        self.prologue()
        births = iter(tr.raw)
        for i, (op, key, n) in enumerate(tr.events):
            while pending is not None and pending[0] <= i:
                self._mark(pending)
                pending = next(marks, None)
            raw = next(births, n) if op == "a" else 0
            if key in tr.ignored:  # host-side scalars standing in for CPU tensors
                continue
            if op == "a":
                comp, module = self.component(key), tr.module(key)
                n_dev = self.device_bytes(key, n)
                tl.alloc(key, n_dev, comp, module, raw=raw if n_dev == n else None)
                tl.host_alloc(key, self.host_bytes(key, n))
                self.after_alloc(key)
            else:
                tl.free(key)
                tl.host_free(key)
        while pending is not None:
            self._mark(pending)
            pending = next(marks, None)
        return tl

    def _mark(self, mark: tuple[int, str, str]) -> None:
        _, kind, payload = mark
        if kind == "phase":
            self.on_mark("phase_end", self.tl.phase)
            self.tl.set_phase(payload)
        self.on_mark(kind, payload)

    def component(self, key: int) -> str:
        return self.trace.component(key)

    def synthetic(self) -> int:
        return next(self._next_key)

    def is_step_temporary(self, key: int) -> bool:
        return self.trace.phase(key) == "optimizer" and self.component(key) == "temporary"


class _Fsdp(_Rewrite):
    """The real FSDP2 trace; with ``offload params`` (FSDP2's CPUOffloadPolicy, which offloads
    parameters, gradients and optimizer states together) the sharded parameters, the sharded
    gradients, the optimizer states and the CPU optimizer step's temporaries move to the host
    timeline. The all-gathered parameters and the reduce-scatter buffers stay on the device."""

    def _on_host(self, key: int) -> bool:
        if not self.offload_params:
            return False
        return (
            key in self.params
            or key in self.trace.grad_keys
            or self.component(key) == "optimizer_states"
            or self.is_step_temporary(key)
        )

    def device_bytes(self, key: int, n_bytes: int) -> int:
        return 0 if self._on_host(key) else n_bytes

    def host_bytes(self, key: int, n_bytes: int) -> int:
        return n_bytes if self._on_host(key) else 0


class _Ddp(_Rewrite):
    """DDP: the traced step plus the reducer's flat bucket copies, allocated at construction and
    kept for the life of the process (``gradient_as_bucket_view=False``)."""

    def prologue(self) -> None:
        if not self.wl.is_train:
            return
        sizes = list(reversed(self.trace.ddp_sizes))  # trainable parameters, last first
        for n in sharding.ddp_bucket_bytes(sizes):
            self.tl.alloc(self.synthetic(), n, "gradients", "(DDP gradient buckets)")


class _Zero(_Rewrite):
    """DeepSpeed ZeRO stages 1-3 (and their offload) applied to the traced timeline."""

    def __init__(self, workload: WorkloadSpec, trace: RankTrace):
        super().__init__(workload, trace)
        self.stage = int(str(workload.shard)[-1])
        trainable = [p for p in self.params.values() if p.trainable]
        self.n_trainable = sum(p.numel for p in trainable)
        self.param_bytes = max((p.element_size for p in trainable), default=4)
        self.low_precision = self.param_bytes < 4
        #: optimizer state bytes scale to fp32 when DeepSpeed keeps fp32 masters
        self.state_scale = 4 / self.param_bytes if self.low_precision else 1.0
        self.fused_adam = workload.optimizer in DEEPSPEED_FUSED_ADAM
        self.gathered: dict[str, list[int]] = {}
        self.units = self._units() if self.stage == 3 else {}
        self.fwd_order, self.bwd_order = self._orders()
        self.step_keys: list[int] = []

    # -- sizes
    def _partitioned(self, key: int) -> bool:
        p = self.params.get(key)
        if p is None or self.stage < 3:
            return False
        return not sharding.zero3_persists(p.numel)

    def device_bytes(self, key: int, n_bytes: int) -> int:
        if key in self.params:
            if not self._partitioned(key):
                return n_bytes
            return 0 if self.offload_params else self._part(self.params[key])
        comp = self.component(key)
        if comp == "optimizer_states":
            return 0 if self.offload_opt else self._state_part(n_bytes)
        if self.is_step_temporary(key):
            if self.offload_opt or self.fused_adam:
                return 0
            return self._state_part(n_bytes)
        return n_bytes

    def host_bytes(self, key: int, n_bytes: int) -> int:
        if key in self.params and self._partitioned(key) and self.offload_params:
            return self._part(self.params[key])
        if self.component(key) == "optimizer_states" and self.offload_opt:
            return self._state_part(n_bytes)
        return 0

    def _part(self, p: Param) -> int:
        return sharding.partition_numel(p.numel, self.dp) * p.element_size

    def _state_part(self, n_bytes: int) -> int:
        return round(-(-n_bytes // self.dp) * self.state_scale)

    # -- persistent buffers and partitions
    def prologue(self) -> None:
        if self.stage == 3:
            self._hpz_secondary()
        if not self.wl.is_train or self.n_trainable == 0:
            return
        part = sharding.partition_numel(self.n_trainable, self.dp)
        if self.low_precision:
            master = part * sharding.FP32_MASTER_BYTES
            if self.offload_opt:
                self.tl.host_alloc(self.synthetic(), master)
            else:
                self.tl.alloc(self.synthetic(), master, "optimizer_states", "(fp32 master weights)")
        if self.stage == 3:
            bucket = sharding.zero_ipg_bucket_numel(self.n_trainable, stage=3)
            self.tl.alloc(
                self.synthetic(), bucket * self.param_bytes, "gradients", "(ZeRO gradient bucket)"
            )
            self._grad_partition()

    def _hpz_secondary(self) -> None:
        """ZeRO++ hpZ: a secondary partition of every partitioned parameter, held from the start
        (DeepSpeed creates it at the first release and keeps it: the safe side)."""
        hpz = self.wl.zero_hpz_partition_size
        for key, p in self.params.items():
            n = sharding.hpz_secondary_bytes(p.numel, p.element_size, hpz)
            if not n or not self._partitioned(key):
                continue
            if self.offload_params:
                self.tl.host_alloc(self.synthetic(), n)
            else:
                self.tl.alloc(self.synthetic(), n, "parameters", "(ZeRO++ hpZ secondary partition)")

    def _grad_partition(self) -> None:
        part = sharding.partition_numel(self.n_trainable, self.dp)
        if self.offload_opt:
            self.tl.host_alloc(self.synthetic(), part * sharding.OFFLOAD_FP32_GRAD_BYTES)
        else:
            self.tl.alloc(
                self.synthetic(), part * self.param_bytes, "gradients", "(ZeRO gradient partition)"
            )

    def on_mark(self, kind: str, payload: str) -> None:
        if kind == "phase_end" and self.stage == 3:
            for name in list(self.gathered):  # modules without a differentiable input
                self._release(name)
        elif kind == "phase":
            self._on_phase(payload)
        elif kind in ("fwd_in", "bwd_in") and self.stage == 3:
            self._gather(payload)
            order = self.fwd_order if kind == "fwd_in" else self.bwd_order
            self._prefetch(payload, order)
        elif kind in ("fwd_out", "bwd_out") and self.stage == 3:
            self._release(payload)

    def _on_phase(self, phase: str) -> None:
        tl = self.tl
        if phase == "backward" and self.stage in (1, 2) and self.n_trainable:
            if self.stage == 2 and not getattr(self, "_partition_made", False):
                self._partition_made = True
                self._grad_partition()
            bucket = sharding.zero_ipg_bucket_numel(self.n_trainable, stage=self.stage)
            self._ipg = self.synthetic()
            tl.alloc(self._ipg, bucket * self.param_bytes, "gradients", "(ZeRO gradient bucket)")
        elif phase == "optimizer":
            if self.stage in (1, 2):
                tl.free(getattr(self, "_ipg", 0))
            # the step converts the rank's gradient partition to fp32 (16-bit params only)
            if self.low_precision and self.n_trainable and not self.offload_opt:
                key = self.synthetic()
                part = sharding.partition_numel(self.n_trainable, self.dp)
                tl.alloc(key, part * 4, "gradients", "(fp32 gradient partition)")
                self.step_keys.append(key)
        elif phase in ("forward", "end", "prefill"):
            for key in self.step_keys:
                tl.free(key)
            self.step_keys.clear()

    def after_alloc(self, key: int) -> None:
        # Stages 2-3 copy each gradient into the bucket as soon as it is produced and drop it.
        if self.stage >= 2 and self.component(key) == "gradients":
            self.tl.free(key)

    # -- ZeRO-3 gathering
    def _units(self) -> dict[str, list[tuple[int, Param]]]:
        units: dict[str, list[tuple[int, Param]]] = defaultdict(list)
        for key, p in self.params.items():
            if not sharding.zero3_persists(p.numel):
                units[p.module].append((key, p))
        return dict(units)

    def _orders(self) -> tuple[list[str], list[str]]:
        fwd: dict[str, None] = {}
        bwd: dict[str, None] = {}
        for _, kind, payload in self.trace.marks:
            if kind == "fwd_in":
                fwd.setdefault(payload)
            elif kind == "bwd_in":
                bwd.setdefault(payload)
        return list(fwd), list(bwd)

    def _numel(self, name: str) -> int:
        return sum(p.numel for _, p in self.units.get(name, []))

    def _gather(self, name: str) -> None:
        if name in self.gathered or name not in self.units:
            return
        keys = []
        for _, p in self.units[name]:
            key = self.synthetic()
            self.tl.alloc(key, p.numel * p.element_size, "parameters", f"{name} (gathered)")
            keys.append(key)
        self.gathered[name] = keys

    def _prefetch(self, name: str, order: list[str]) -> None:
        d = sharding.DEEPSPEED_DEFAULTS
        budget = d["stage3_prefetch_bucket_size"]
        live = sum(self._numel(n) for n in self.gathered)
        try:
            ahead = order[order.index(name) + 1 :]
        except ValueError:
            return
        for nxt in ahead:
            need = self._numel(nxt)
            if need > budget:
                break
            if nxt not in self.gathered:
                if live + need > d["stage3_max_live_parameters"]:
                    break
                self._gather(nxt)
                live += need
            budget -= need

    def _release(self, name: str) -> None:
        for key in self.gathered.pop(name, []):
            self.tl.free(key)


def strategy(workload: WorkloadSpec, trace: RankTrace) -> _Rewrite:
    """The rewrite of ``trace`` for ``workload``'s setup; it reads ``trace``, never changes it."""
    if workload.shard == "fsdp":
        return _Fsdp(workload, trace)
    if workload.shard in ("zero1", "zero2", "zero3"):
        return _Zero(workload, trace)
    if workload.shard == "ddp":
        return _Ddp(workload, trace)
    return _Rewrite(workload, trace)

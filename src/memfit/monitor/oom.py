"""The OOM guard: when the device runs out of memory, say what was live, which component overflowed
and a technique that fixes it, write that to a self-contained HTML report and the run log, and
re-raise the error unchanged.

What was live comes from the CUDA allocator's snapshot when there is one (every block, matched to
the registered model's parameters / gradients / optimizer states by address; with stack frames when
``torch.cuda.memory._record_memory_history()`` was on), else from the allocator's counters, else on
the CPU from memfit's tensor tracker. Unregistered live tensors count as ``activations``
(activations saved for backward and temporaries); ``cache`` is reserved minus allocated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from memfit.monitor.device import ALLOCATOR_ROUND_BYTES, CpuQuery, DeviceQuery, open_device
from memfit.monitor.guard import Guard
from memfit.monitor.log import RunLog, rank_log_path, record
from memfit.monitor.oom_report import render_oom_html
from memfit.monitor.runtime import estimate_json
from memfit.units import format_bytes, parse_bytes
from memfit.userwrites import write_text

logger = logging.getLogger("memfit.monitor")

#: Components of live memory at an OOM, in report order. ``unattributed`` replaces the first four
#: when neither a model nor an optimizer was registered.
OOM_COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "cache")

#: The fix for each component, best first. Sources: gradient checkpointing, Chen et al. 2016
#: "Training Deep Nets with Sublinear Memory Cost"; FlashAttention, Dao et al. 2022; 8-bit
#: optimizers, Dettmers et al. 2021; ZeRO, Rajbhandari et al. 2020 (§5: stage 1 shards optimizer
#: states, stage 2 also gradients); LoRA, Hu et al. 2021; QLoRA, Dettmers et al. 2023;
#: expandable segments, PyTorch "CUDA semantics" docs (Optimizing memory usage with
#: PYTORCH_CUDA_ALLOC_CONF).
ADVICE: dict[str, tuple[str, ...]] = {
    "activations": (
        "Enable gradient checkpointing (model.gradient_checkpointing_enable() in transformers, "
        "torch.utils.checkpoint elsewhere): each layer keeps only its input and recomputes the "
        "rest in backward, for about one extra forward pass of compute.",
        "Halve the micro-batch and double the gradient-accumulation steps: activations scale with "
        "the micro-batch while the effective batch stays the same.",
        "Use a fused attention kernel (attn_implementation='sdpa' or 'flash_attention_2'): "
        "attention stops storing the sequence x sequence score matrix.",
    ),
    "optimizer_states": (
        "Use 8-bit AdamW (bitsandbytes.optim.AdamW8bit): 2 bytes per parameter for the two "
        "moments instead of 8.",
        "Shard optimizer states across data-parallel ranks (ZeRO-1/2 in DeepSpeed, FSDP): each of "
        "N ranks keeps 1/N.",
        "Offload optimizer states to host RAM (DeepSpeed ZeRO-Offload, FSDP CPUOffload).",
    ),
    "parameters": (
        "Keep the weights in bf16 instead of fp32 (model.to(torch.bfloat16)): half the bytes.",
        "Quantize the frozen base weights to 4 or 8 bits (bitsandbytes; QLoRA for training).",
        "Train LoRA adapters (peft) instead of every weight: gradients and optimizer states then "
        "exist only for the adapters.",
    ),
    "gradients": (
        "Train LoRA adapters (peft) or freeze layers (requires_grad_(False)): frozen weights have "
        "no gradients.",
        "Shard gradients across data-parallel ranks (ZeRO-2, FSDP).",
        "Keep the weights, and so the gradients, in bf16 instead of fp32.",
    ),
    "cache": (
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call: the "
        "allocator grows segments in place instead of leaving free blocks too small to reuse.",
        "Keep tensor shapes the same from step to step (pad sequences to a few bucket lengths): "
        "varying sizes fragment the cache.",
    ),
    "unattributed": (
        "Pass model= and optimizer= to memfit.oom_guard (or memfit.Monitor) so the report can say "
        "which component overflowed.",
        "Enable gradient checkpointing, or halve the micro-batch and double gradient "
        "accumulation: activations are the usual overflow in training.",
        "Use 8-bit AdamW or ZeRO/FSDP sharding if the model is large: AdamW keeps 8 bytes of "
        "state per parameter.",
    ),
}

_REQUEST = re.compile(r"Tried to allocate (\d+(?:\.\d+)?\s*[KMGT]?i?B)", re.I)


def is_oom(exc: BaseException | None) -> bool:
    """A ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class)."""
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom_type is not None and isinstance(exc, oom_type)


def requested_bytes_of(message: str) -> int | None:
    """The failed request's size from PyTorch's message ("Tried to allocate 2.00 GiB")."""
    m = _REQUEST.search(message)
    if m is None:
        return None
    try:
        return parse_bytes(m.group(1).replace(" ", ""))
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class OOMAnalysis:
    """What was live at the OOM and the verdict. ``live_bytes`` sums to ``reserved_bytes``."""

    message: str
    step: int | None
    device: str
    total_bytes: int | None
    requested_bytes: int | None
    allocated_bytes: int
    reserved_bytes: int
    live_bytes: dict[str, int]
    culprit: str
    reason: str
    advice: list[str]
    source: str
    predicted_bytes: dict[str, int] | None = None
    largest_blocks: list[dict[str, Any]] = field(default_factory=list)


def _storages(tensors: list[Any], device: str) -> dict[int, int]:
    """data_ptr → rounded bytes of the distinct storages of ``tensors`` on ``device``."""
    import torch

    dev = torch.device(device)
    out: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != dev.type:
            continue
        if dev.type == "cuda" and (t.device.index or 0) != (dev.index or 0):
            continue
        st = t.untyped_storage()
        n = st.nbytes()
        out.setdefault(st.data_ptr(), -(-n // ALLOCATOR_ROUND_BYTES) * ALLOCATOR_ROUND_BYTES)
    return out


def _known_storages(model: Any, optimizer: Any, device: str) -> dict[int, tuple[str, int]]:
    """Storages of the registered model and optimizer, by component (first claim wins)."""
    params: list[Any] = []
    if model is not None:
        params += list(model.parameters()) + list(model.buffers())
    if optimizer is not None:
        params += [p for g in optimizer.param_groups for p in g["params"]]
    grads = [getattr(p, "grad", None) for p in params]
    states = []
    if optimizer is not None:
        states = [v for st in optimizer.state.values() for v in st.values()]
    known: dict[int, tuple[str, int]] = {}
    for name, tensors in (
        ("parameters", params),
        ("gradients", grads),
        ("optimizer_states", states),
    ):
        for ptr, n in _storages(tensors, device).items():
            known.setdefault(ptr, (name, n))
    return known


def _from_snapshot(
    snap: dict[str, Any], device: str, known: dict[int, tuple[str, int]]
) -> tuple[int, int, dict[str, int], list[dict[str, Any]]]:
    """(allocated, reserved, bytes by component, largest unregistered blocks) from the snapshot."""
    index = int(device.split(":")[1]) if ":" in device else 0
    live = dict.fromkeys(OOM_COMPONENTS[:4], 0)
    allocated = reserved = 0
    unknown: list[dict[str, Any]] = []
    for seg in snap.get("segments", []):
        if seg.get("device", index) != index:
            continue
        reserved += int(seg.get("total_size", 0))
        for block in seg.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            size = int(block["size"])
            allocated += size
            name = known.get(int(block.get("address", -1)), ("activations", 0))[0]
            live[name] += size
            if name == "activations":
                unknown.append({"bytes": size, "where": _user_frame(block.get("frames") or [])})
    unknown.sort(key=lambda b: -b["bytes"])
    return allocated, reserved, live, unknown[:8]


def _user_frame(frames: list[dict[str, Any]]) -> str | None:
    """The first stack frame outside torch and the standard library (where the user allocated)."""
    for fr in frames:
        name = str(fr.get("filename", ""))
        if name.endswith(".py") and "/torch/" not in name and "/lib/python" not in name:
            return f"{name}:{fr.get('line')} in {fr.get('name')}"
    return None


def _predicted(estimate: dict[str, Any] | None) -> dict[str, int] | None:
    """The estimate's components at the peak, merged into the OOM components."""
    if not estimate or "components" not in estimate:
        return None
    comp = estimate["components"]
    return {
        "parameters": comp.get("parameters", 0),
        "gradients": comp.get("gradients", 0),
        "optimizer_states": comp.get("optimizer_states", 0),
        "activations": sum(comp.get(k, 0) for k in ("activations", "temporary", "kv_cache")),
        "cache": max(0, estimate["peak_reserved_bytes"] - estimate["peak_allocated_bytes"]),
    }


def _culprit(
    live: dict[str, int], requested: int | None, predicted: dict[str, int] | None
) -> tuple[str, str]:
    """Which component overflowed, and why that one (the rule the report states)."""
    if predicted:
        excess = {c: live[c] - predicted[c] for c in live if c in predicted}
        worst = max(excess, key=lambda c: excess[c])
        if excess[worst] > 0:
            return worst, (
                f"{worst} held {format_bytes(live[worst])}, {format_bytes(excess[worst])} more "
                f"than the estimate's {format_bytes(predicted[worst])}: the largest overshoot"
            )
    cache = live.get("cache", 0)
    if requested is not None and cache >= requested:
        return "cache", (
            f"the allocator's cache held {format_bytes(cache)} free, more than the "
            f"{format_bytes(requested)} requested, but in blocks too small for it: fragmentation"
        )
    held = {c: n for c, n in live.items() if c != "cache"}
    worst = max(held, key=lambda c: held[c])
    total = sum(held.values())
    share = f" ({held[worst] / total:.0%} of allocated)" if total else ""
    return worst, f"{worst} was the largest live component: {format_bytes(held[worst])}{share}"


def analyse_oom(
    exc: BaseException,
    device: DeviceQuery,
    *,
    model: Any = None,
    optimizer: Any = None,
    estimate: dict[str, Any] | None = None,
    step: int | None = None,
) -> OOMAnalysis:
    """Read what is live now (call it while the failing step's tensors still are)."""
    message = str(exc)
    requested = requested_bytes_of(message)
    known = _known_storages(model, optimizer, device.device)
    snap = device.memory_snapshot()
    largest: list[dict[str, Any]] = []
    if snap is not None and snap.get("segments"):
        allocated, reserved, live, largest = _from_snapshot(snap, device.device, known)
        has_frames = any(b["where"] for b in largest)
        source = "CUDA allocator snapshot" + (" with stack frames" if has_frames else "")
    else:
        mem = device.tensor_memory()
        allocated, reserved = mem.allocated_bytes, mem.reserved_bytes
        live = dict.fromkeys(OOM_COMPONENTS[:4], 0)
        for name, n in known.values():
            live[name] += n
        live["activations"] = max(0, allocated - sum(live.values()))
        source = "CPU tensor tracker" if isinstance(device, CpuQuery) else "allocator counters"
    if model is None and optimizer is None:
        live = {"unattributed": allocated}
    live["cache"] = max(0, reserved - allocated)
    predicted = _predicted(estimate) if "unattributed" not in live else None
    culprit, reason = _culprit(live, requested, predicted)
    return OOMAnalysis(
        message=message,
        step=step,
        device=device.device,
        total_bytes=device.total_bytes,
        requested_bytes=requested,
        allocated_bytes=allocated,
        reserved_bytes=max(reserved, allocated),
        live_bytes=live,
        culprit=culprit,
        reason=reason,
        advice=list(ADVICE[culprit]),
        source=source,
        predicted_bytes=predicted,
        largest_blocks=largest,
    )


def oom_record(analysis: OOMAnalysis, report: str | None) -> dict[str, Any]:
    return record(
        "oom",
        step=analysis.step,
        requested_bytes=analysis.requested_bytes,
        message=analysis.message,
        live_bytes=dict(analysis.live_bytes),
        advice=list(analysis.advice),
        report=report,
    )


def write_oom_report(analysis: OOMAnalysis, path: str | os.PathLike[str]) -> str:
    """Write the HTML report; returns its path."""

    write_text(path, render_oom_html(analysis), what="OOM report")  # atomic; FIFOs refused
    return str(path)


def add_note(exc: BaseException, analysis: OOMAnalysis, report: str | None) -> None:
    """Append memfit's verdict to the traceback (Python 3.11+ exception notes)."""
    if hasattr(exc, "add_note"):
        where = f"; report: {report}" if report else ""
        exc.add_note(f"memfit: {analysis.culprit} overflowed ({analysis.reason}){where}")


class OOMGuard:
    """Context manager behind :func:`oom_guard`. ``analysis`` holds the verdict after an OOM."""

    def __init__(
        self,
        report: str | os.PathLike[str] | None = "oom.html",
        *,
        estimate: Any = None,
        model: Any = None,
        optimizer: Any = None,
        log: str | os.PathLike[str] | None = None,
        device: str | DeviceQuery | None = None,
    ) -> None:
        self.report = report
        self.estimate = estimate_json(estimate)
        self.model, self.optimizer = model, optimizer
        self.log = log
        self._device_arg = device
        self._device: DeviceQuery | None = None
        self.analysis: OOMAnalysis | None = None
        self._guard = Guard("oom_guard")

    def __enter__(self) -> OOMGuard:
        """Never raises: without a device query the guard only re-raises (with a warning)."""
        self._device = self._guard.call("open_device", open_device, self._device_arg)
        if self._device is not None:
            self._guard.call("device.start", self._device.start)
            if isinstance(self._device, CpuQuery) and self.model is not None:
                self._guard.call("track_model", self._device.track, self.model.parameters())
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        """Analyse an OOM, undo the tracker; the user's exception propagates unchanged."""
        try:
            if exc is not None and is_oom(exc) and self._device is not None:
                self._handle(exc)
        finally:
            if self._device is not None:
                self._guard.call("device.stop", self._device.stop)
        return False  # re-raise

    def _handle(self, exc: BaseException) -> None:
        assert self._device is not None
        try:
            self.analysis = analyse_oom(
                exc,
                self._device,
                model=self.model,
                optimizer=self.optimizer,
                estimate=self.estimate,
            )
            report = None if self.report is None else write_oom_report(self.analysis, self.report)
            if self.log is not None:
                log = RunLog(rank_log_path(self.log), mode="a")
                log.write(oom_record(self.analysis, report))
                log.close()
            add_note(exc, self.analysis, report)
        except Exception as err:  # noqa: BLE001 — the user's OOM must surface, not memfit's failure
            logger.warning("memfit: could not analyse the out-of-memory error: %r", err)
            if self.log is not None:
                message = f"{type(err).__name__}: {err}"
                with contextlib.suppress(OSError):
                    log = RunLog(rank_log_path(self.log), mode="a")
                    log.write(record("error", where="oom_guard", message=message))
                    log.close()


def oom_guard(
    report: str | os.PathLike[str] | None = "oom.html",
    *,
    estimate: Any = None,
    model: Any = None,
    optimizer: Any = None,
    log: str | os.PathLike[str] | None = None,
    device: str | DeviceQuery | None = None,
) -> OOMGuard:
    """``with memfit.oom_guard(model=model, optimizer=opt): train()``: on an out-of-memory error
    (``torch.OutOfMemoryError``) write ``report`` (HTML: what was live, the component that
    overflowed, how to fix it), append an ``oom`` record to ``log`` if given, note the verdict on
    the exception, and re-raise it.

    ``estimate``: a MemoryEstimate (or its JSON) to compare against; ``device``: "cuda:N" / "cpu"
    (default: the current CUDA device, else the CPU with an exact tensor tracker).
    """
    return OOMGuard(
        report, estimate=estimate, model=model, optimizer=optimizer, log=log, device=device
    )

"""Pre-flight: estimate the live job before its first step, and warn (or stop, if asked) with the
fix when it will not fit on the device it runs on.

::

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[MemfitPreflight()])
    trainer = lightning.Trainer(callbacks=[MemfitLightningPreflight()])

The job is read from what will really run: the model's own config (and its peft adapter and
``quantization_config``), the dtype its trainable parameters are in (pure vs mixed precision is
read from the live parameters, not guessed from ``bf16=True``), the Trainer's arguments (batch,
accumulation, checkpointing, optimizer), and the **longest batch** among the first
``scan_batches`` batches of the real dataloader (a fresh iterator; ``scan_batches=0`` uses
``max_length`` / ``max_seq_length`` from the arguments instead). The estimate is memfit's analytic
engine (milliseconds). The verdict compares the upper end of the estimate's range with the
device's total memory.

Everything runs inside the guarded boundary (memfit.monitor.guard): a memfit failure is a warning
and training goes on. Only ``raise_if_not_fit=True`` raises, and only
:class:`~memfit.errors.DoesNotFitError`, before the first step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memfit.errors import DoesNotFitError
from memfit.estimate import estimate
from memfit.jobfiles.names import HF_OPTIMIZERS, MIXED, ROLE_OF_MODULE, TRUE
from memfit.models import ModelSource
from memfit.monitor.guard import Guard, safe_print, warn
from memfit.spec import WorkloadSpec
from memfit.units import format_bytes

#: Lightning precision names → memfit's (the dtype of the live parameters refines "mixed").
LIGHTNING = {
    "bf16-mixed": MIXED["bf16"],
    "16-mixed": MIXED["fp16"],
    "bf16-true": TRUE["bf16"],
    "16-true": TRUE["fp16"],
    "32-true": "fp32",
    "32": "fp32",
    "bf16": MIXED["bf16"],
    "16": MIXED["fp16"],
}


@dataclass(frozen=True, kw_only=True)
class PreflightResult:
    model_name: str
    workload: Any
    estimate: Any
    device_bytes: int | None
    fits: bool | None
    seq_from: str

    def message(self) -> str:
        est = self.estimate
        low, high = est.ranges.get("device_used_bytes", (est.device_used_bytes,) * 2)
        need = f"{format_bytes(est.device_used_bytes)} (up to {format_bytes(high)})"
        w = self.workload
        job = (
            f"batch {w.batch_size} x seq {w.seq_len} ({self.seq_from}), {w.precision}, "
            f"checkpointing {w.checkpointing}, optimizer {w.optimizer}"
            + (f", LoRA r={w.lora_rank}" if w.lora_rank else "")
            + (f", weights {w.quant}" if w.quant != "none" else "")
        )
        if self.device_bytes is None:
            return f"memfit pre-flight: {self.model_name}, {job}: needs {need} (no CUDA device)"
        verdict = "fits" if self.fits else "WILL NOT FIT"
        text = (
            f"memfit pre-flight: {self.model_name}, {job}: needs {need} of "
            f"{format_bytes(self.device_bytes)} on this device: {verdict}"
        )
        if not self.fits:
            text += (
                f". Fix: memfit plan {self.model_name} --gpu-memory {self.device_bytes}B "
                f"--seq {w.seq_len} --global-batch {w.batch_size * w.grad_accum} "
                "(memory-only changes first: checkpointing, smaller micro-batch with more "
                "accumulation, 8-bit optimizer states)"
            )
        return text


def longest_batch(batches: Iterable[Any], limit: int) -> int | None:
    """The longest sequence (last dim of ``input_ids``) among the first ``limit`` batches."""
    longest = None
    for i, batch in enumerate(batches):
        if i >= limit:
            break
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        shape = getattr(ids, "shape", None)
        if shape is not None and len(shape) >= 1:
            longest = max(longest or 0, int(shape[-1]))
    return longest


def live_job(
    model: Any,
    *,
    batch_size: int,
    grad_accum: int,
    seq_len: int,
    mixed: str | None,
    checkpointing: bool,
    optimizer: str,
) -> tuple[Any, Any]:
    """The ``(ModelSource, WorkloadSpec)`` of a live (possibly peft-wrapped) transformers model."""

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config.to_dict()
    source = ModelSource.of_live_config(
        config, name=config.get("_name_or_path") or config.get("model_type", "model")
    )
    lora_rank: int | None = None
    targets: tuple[str, ...] | str = "all-linear"
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        pc = next(iter(peft_config.values()))
        lora_rank = int(pc.r)
        mods = pc.target_modules
        if isinstance(mods, (set, list, tuple)):
            targets = tuple(sorted(ROLE_OF_MODULE.get(str(m), str(m)) for m in mods))
    trainable = [p for p in model.parameters() if p.requires_grad]
    dtype = str(trainable[0].dtype if trainable else next(model.parameters()).dtype)
    if "bfloat16" in dtype:
        precision = TRUE["bf16"]  # the optimizer holds bf16 parameters: no fp32 master copy
    elif "float16" in dtype:
        precision = TRUE["fp16"]
    else:
        precision = mixed or TRUE["fp32"]
    quantized = getattr(base, "is_quantized", False) or "quantization_config" in config
    workload = WorkloadSpec(
        mode="train",
        batch_size=batch_size,
        grad_accum=grad_accum,
        seq_len=seq_len,
        precision=precision,
        checkpointing="full" if checkpointing else "none",
        optimizer=optimizer,
        lora_rank=lora_rank,
        lora_targets=targets,
        prepare_kbit=bool(quantized and lora_rank),
    )
    return source, workload


def run_preflight(
    source: Any, workload: Any, *, device_bytes: int | None, seq_from: str
) -> PreflightResult:
    est = estimate(source, workload, engine="analytic")
    high = est.ranges.get("device_used_bytes", (0, est.device_used_bytes))[1]
    fits = None if device_bytes is None else high <= device_bytes
    return PreflightResult(
        model_name=source.name,
        workload=workload,
        estimate=est,
        device_bytes=device_bytes,
        fits=fits,
        seq_from=seq_from,
    )


def cuda_total_bytes() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


class _Preflight:
    """What the transformers and Lightning hooks share: the guard, the report, the raise."""

    def __init__(
        self, *, raise_if_not_fit: bool, scan_batches: int, device_memory_bytes: int | None
    ) -> None:
        self.raise_if_not_fit = raise_if_not_fit
        self.scan_batches = scan_batches
        self.device_memory_bytes = device_memory_bytes
        self.guard = Guard("memfit pre-flight")
        self.result: PreflightResult | None = None

    def finish(self, result: PreflightResult | None) -> None:
        self.result = result
        if result is None:
            return
        text = result.message()
        if result.fits is False:
            warn("%s", text)
        safe_print(text)
        if result.fits is False and self.raise_if_not_fit:
            raise DoesNotFitError(text)

    def device_bytes(self) -> int | None:
        return (
            self.device_memory_bytes if self.device_memory_bytes is not None else cuda_total_bytes()
        )


#: The shared part, public for the Lightning hook (monitor/integrations/lightning.py).
PreflightBase = _Preflight


def _hf_callback_base() -> Any:
    from transformers import TrainerCallback

    return TrainerCallback


class MemfitPreflight(_hf_callback_base(), _Preflight):  # type: ignore[misc]
    """transformers ``TrainerCallback``: the pre-flight at ``on_train_begin``.
    ``device_memory_bytes`` overrides the device's total (tests, or a share of a GPU)."""

    def __init__(
        self,
        *,
        raise_if_not_fit: bool = False,
        scan_batches: int = 64,
        device_memory_bytes: int | None = None,
    ) -> None:
        _Preflight.__init__(
            self,
            raise_if_not_fit=raise_if_not_fit,
            scan_batches=scan_batches,
            device_memory_bytes=device_memory_bytes,
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finish(self.guard.call("on_train_begin", self._check, args, kwargs))

    def _check(self, args: Any, kwargs: dict[str, Any]) -> PreflightResult:
        model = kwargs["model"]
        seq, seq_from = None, "longest of the first batches"
        loader = kwargs.get("train_dataloader")
        if loader is not None and self.scan_batches > 0:
            seq = longest_batch(loader, self.scan_batches)
        if seq is None:
            seq = getattr(args, "max_length", None) or getattr(args, "max_seq_length", None)
            seq_from = "max_length"
        if seq is None:
            raise ValueError(
                "no batch with input_ids and no max_length: pass scan_batches or max_length"
            )
        optim = getattr(args.optim, "value", args.optim)
        ckpt = bool(
            getattr(args, "activation_checkpointing", None)
            or getattr(args, "gradient_checkpointing", None)
            or getattr(kwargs["model"], "is_gradient_checkpointing", False)
        )
        mixed = MIXED["bf16"] if args.bf16 else MIXED["fp16"] if args.fp16 else None
        source, workload = live_job(
            model,
            batch_size=args.per_device_train_batch_size,
            grad_accum=args.gradient_accumulation_steps,
            seq_len=seq,
            mixed=mixed,
            checkpointing=ckpt,
            optimizer=HF_OPTIMIZERS.get(str(optim)) or "adamw",
        )
        return run_preflight(source, workload, device_bytes=self.device_bytes(), seq_from=seq_from)

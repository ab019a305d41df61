"""What the user asks the planner for (validated once), and what each considered option is."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.plan.budget import DEFAULT_HEADROOM
from memfit.plan.cost import StepCost
from memfit.plan.recipe import ALLOW, Change
from memfit.plan.space import RISK_LEVELS, Settings
from memfit.spec import (
    ATTENTIONS,
    MAX_BATCH_SIZE,
    MAX_SEQ_LEN,
    MODES,
    OPTIMIZERS,
    PRECISION_NAMES,
    QUANTS,
    WorkloadSpec,
)
from memfit.spec.rules import CHECKPOINTING, KERNELS, LOSSES, MAX_LORA_RANK

GOALS = ("throughput", "memory")
#: Which plans the precise (trace) engine confirms: every plan shown (recommended and
#: alternatives), the recommended one only, none (the search engine's answer, seconds faster
#: per plan for a 7B-class model), or ``auto`` (the default): the recommended plan only where
#: the search engine's validated error band could change its verdict (issue 32; a search
#: engine without a band, e.g. an injected one, has every plan shown confirmed).
CONFIRM_MODES = ("auto", "shown", "recommended", "none")


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """``batch_size``: training: the micro-batch per GPU, fixed (no accumulation); inference: the
    concurrent requests over all GPUs. ``global_batch`` (training only): samples per optimizer
    step over all GPUs, split by the planner into GPUs x micro-batch x accumulation. Neither:
    batch 1 per GPU. ``goal``: ``throughput`` ranks by predicted step time, ``memory`` by the
    memory a plan needs. ``confirm``: which plans the trace engine checks (``CONFIRM_MODES``).

    The recipe (the job as asked, memfit.plan.recipe): ``precision`` (None: ``bf16-mixed`` to
    train, ``bf16-true`` to infer; 16-bit on GPUs without bf16), ``optimizer`` (None: adamw),
    ``attention``, and LoRA at ``lora_ranks`` when ``lora_asked`` (else full fine-tuning).
    ``allow``: the result-changing families (memfit.plan.recipe.ALLOW) the planner may use as
    freely as memory-only changes; the others only when nothing else fits."""

    mode: str = "train"
    seq_len: int = 512
    batch_size: int | None = None
    global_batch: int | None = None
    new_tokens: int = 0
    gpus: int = 1
    goal: str = "throughput"
    headroom: float = DEFAULT_HEADROOM
    keep_full_finetune: bool = False
    allow_quant: bool = True
    max_quality_risk: str = "high"
    allow_offload: bool = False
    lora_ranks: tuple[int, ...] = (16, 64)
    #: QLoRA plans run through peft's prepare_model_for_kbit_training (TRL's SFTTrainer does)
    prepare_kbit: bool = False
    n_alternatives: int = 4
    confirm: str = "auto"
    precision: str | None = None
    optimizer: str | None = None
    attention: str = "sdpa"
    lora_asked: bool = False
    allow: frozenset[str] = frozenset()
    #: the job's own weight format (QLoRA asked: ``nf4-dq`` with ``lora_asked``; inference: a
    #: quantized checkpoint), kept as asked; other formats are result-changing options
    quant: str = "none"
    #: the modules the job's LoRA adapts (``--lora-targets``), kept as asked
    lora_targets: tuple[str, ...] | str = "all-linear"
    #: the modules an asked LoRA trains in full (``--lora-modules-to-save``), kept as asked
    lora_modules_to_save: tuple[str, ...] = ()
    #: the asked LoRA's dropout (``--lora-dropout``, peft ``lora_dropout``), kept as asked: above
    #: 0 each adapter keeps a dropped copy of its input for backward
    lora_dropout: float = 0.0
    #: the job steps its optimizer in backward (``--optimizer-in-bwd``), kept as asked: its plans
    #: run on one GPU without accumulation (WorkloadSpec.optimizer_in_bwd)
    optimizer_in_bwd: bool = False
    #: the job's training cross-entropy (``--loss``, rules.LOSSES), kept as asked
    loss: str = "full"
    #: whose kernels run the layers (``--kernels``, rules.KERNELS), kept in every plan: a plan
    #: does not swap Unsloth's kernels for transformers' any more than it turns LoRA into a full
    #: fine-tune
    kernels: str = "hf"
    #: the job's own activation checkpointing (the recipe's; the planner tries the others as
    #: memory-only changes): ``none``, or Unsloth's ``offload`` under ``kernels="unsloth"``
    checkpointing: str = "none"
    #: the Unsloth defaults (rules.UNSLOTH_DEFAULTS) the door filled in
    #: (rules.with_kernel_defaults), said in the plan's notes
    kernel_defaults: tuple[tuple[str, str], ...] = ()
    #: also try what needs another library's kernels (Liger / Unsloth's fused cross-entropy,
    #: Unsloth's host-RAM checkpoints); ``check``'s fix turns it off: its files cannot say them
    other_kernels: bool = True
    #: the job's checkpointing is not the planner's to change (``check``'s fix of a
    #: LLaMA-Factory ``use_unsloth`` file: Unsloth's offloaded checkpoints whatever the file
    #: says); every plan keeps :attr:`checkpointing`
    keep_checkpointing: bool = False
    #: training: the job's own micro-batch per GPU (``plan --from FILE``: the file's
    #: ``per_device_train_batch_size``), so that "as asked" is the file's split of the per-GPU
    #: batch (micro-batch x accumulation) and not the whole batch at once; None: the whole
    #: per-GPU batch (the planner's recipe). Candidates still try every split.
    asked_micro_batch: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", frozenset(self.allow))
        p: list[str] = []
        if self.precision is not None and self.precision not in PRECISION_NAMES:
            p.append(f"precision ({self.precision!r}) must be one of {', '.join(PRECISION_NAMES)}")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            p.append(f"optimizer ({self.optimizer!r}) must be one of {', '.join(OPTIMIZERS)}")
        if self.quant not in QUANTS:
            p.append(f"quant ({self.quant!r}) must be one of {', '.join(QUANTS)}")
        elif self.quant != "none" and self.mode == "train" and not self.lora_asked:
            p.append(
                f"quant ({self.quant!r}) trains adapters on a quantized base (QLoRA): add "
                "--lora-rank, or leave --quant out and --allow quant to let the planner choose"
            )
        if self.optimizer_in_bwd and (self.mode != "train" or self.optimizer == "none"):
            p.append(
                "optimizer_in_bwd needs a training job with an optimizer (--mode train, "
                "--optimizer other than none)"
            )
        if self.loss not in LOSSES:
            p.append(f"loss ({self.loss!r}) must be one of {', '.join(LOSSES)}")
        if self.kernels not in KERNELS:
            p.append(f"kernels ({self.kernels!r}) must be one of {', '.join(KERNELS)}")
        elif self.kernels != "hf" and self.mode == "infer":
            p.append(
                f"kernels ({self.kernels!r}) models Unsloth's training kernels; with mode "
                "'infer' drop --kernels (its inference path is not modelled)"
            )
        if self.asked_micro_batch is not None and (
            self.asked_micro_batch < 1 or self.per_rank_batch % self.asked_micro_batch
        ):
            p.append(
                f"asked_micro_batch ({self.asked_micro_batch!r}) must divide the per-GPU batch "
                f"({self.per_rank_batch})"
            )
        if self.checkpointing not in CHECKPOINTING:
            p.append(
                f"checkpointing ({self.checkpointing!r}) must be one of {', '.join(CHECKPOINTING)}"
            )
        if self.attention not in ATTENTIONS:
            p.append(f"attention ({self.attention!r}) must be one of {', '.join(ATTENTIONS)}")
        unknown = sorted(set(self.allow) - set(ALLOW))
        if unknown:
            p.append(f"allow ({', '.join(unknown)}) must name {', '.join(ALLOW)}")
        if self.mode not in MODES:
            p.append(f"mode ({self.mode!r}) must be one of {', '.join(MODES)}")
        if self.goal not in GOALS:
            p.append(f"goal ({self.goal!r}) must be one of {', '.join(GOALS)}")
        if self.confirm not in CONFIRM_MODES:
            p.append(f"confirm ({self.confirm!r}) must be one of {', '.join(CONFIRM_MODES)}")
        if self.max_quality_risk not in RISK_LEVELS:
            p.append(
                f"max_quality_risk ({self.max_quality_risk!r}) must be one of "
                f"{', '.join(RISK_LEVELS)}"
            )
        for name, value, upper in (
            ("seq_len", self.seq_len, MAX_SEQ_LEN),
            ("gpus", self.gpus, 1 << 16),
            ("batch_size", self.batch_size, MAX_BATCH_SIZE),
            ("global_batch", self.global_batch, MAX_BATCH_SIZE),
        ):
            if value is not None and (not isinstance(value, int) or not 1 <= value <= upper):
                p.append(f"{name} ({value!r}) must be a whole number in 1..{upper}")
        if self.batch_size is not None and self.global_batch is not None:
            p.append("give batch_size (--batch) or global_batch (--global-batch), not both")
        if self.global_batch is not None and self.mode != "train":
            p.append("global_batch (--global-batch) is a training setting; use --batch for infer")
        elif (
            isinstance(self.global_batch, int)
            and isinstance(self.gpus, int)
            and self.gpus >= 1
            and self.global_batch % self.gpus
        ):
            p.append(
                f"global_batch ({self.global_batch}) must be a multiple of gpus "
                f"({self.gpus}): each GPU runs the same number of samples"
            )
        if self.new_tokens and self.mode != "infer":
            p.append(f"new_tokens ({self.new_tokens}) only applies to mode 'infer'")
        if not 0 <= self.headroom < 1:
            p.append(f"headroom ({self.headroom}) must be a fraction in [0, 1), e.g. 0.05")
        if not isinstance(self.lora_ranks, tuple) or any(
            not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_LORA_RANK
            for r in self.lora_ranks
        ):
            p.append(
                f"lora_ranks ({self.lora_ranks!r}) must be whole numbers in 1..{MAX_LORA_RANK}"
            )
        if not isinstance(self.n_alternatives, int) or not 0 <= self.n_alternatives <= 1000:
            p.append(f"n_alternatives ({self.n_alternatives!r}) must be a whole number in 0..1000")
        if p:
            raise SpecError.from_problems(p)

    @property
    def per_rank_batch(self) -> int:
        """Training: samples per GPU per optimizer step; inference: all concurrent requests."""
        if self.mode == "train" and self.global_batch is not None:
            return self.global_batch // self.gpus
        return self.batch_size or 1

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["lora_ranks"] = list(self.lora_ranks)
        d["allow"] = sorted(self.allow)
        if self.kernels == "hf":  # transformers' kernels: said by their absence, as estimate does
            for k in ("kernels", "kernel_defaults"):
                d.pop(k)
        if self.checkpointing == "none":
            d.pop("checkpointing")
        if not self.keep_checkpointing:  # said only where a caller holds it (check's fix)
            d.pop("keep_checkpointing")
        if self.asked_micro_batch is None:  # said only where a job file gave its split
            d.pop("asked_micro_batch")
        return d


@dataclass(frozen=True, kw_only=True)
class PlanOption:
    """One considered combination: its settings, predicted cost and risk, and — when it was
    estimated — the estimate, the bytes it is charged, and whether it fits."""

    settings: Settings
    #: the job it runs: (mode, seq_len, new_tokens); :attr:`workload` is built from it on use
    job: tuple[str, int, int]
    cost: StepCost
    risk_level: int
    risk_reasons: tuple[str, ...]
    estimate: MemoryEstimate | None = None
    need_bytes: int | None = None
    fits: bool | None = None
    confirmed_by: str | None = None
    reason: str | None = None
    #: what the option changes about the job as asked (memfit.plan.recipe.changes)
    changes: tuple[Change, ...] = ()

    @property
    def workload(self) -> WorkloadSpec:
        """The workload of one micro-batch (:meth:`Settings.workload`), built and validated when
        first asked: a search visits a few dozen of its ~2 000 options (issue 32)."""
        return _workload(self.settings, *self.job)

    @property
    def changes_result(self) -> bool:
        """It changes what is trained or how its numbers round (not memory-only)."""
        return any(c.family is not None for c in self.changes)

    @property
    def risk(self) -> str:
        return RISK_LEVELS[self.risk_level]

    def to_json(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "settings": self.settings.to_json(),
            "summary": self.settings.describe(),
            "workload": self.workload.normalized(),
            "step_s": self.cost.step_s,
            "tokens_per_s": self.cost.tokens_per_s,
            "cost_parts_s": dict(self.cost.parts_s),
            "quality_risk": self.risk,
            "risk_reasons": list(self.risk_reasons),
            "changes": [c.to_json() for c in self.changes],
            "changes_result": self.changes_result,
            "need_bytes": self.need_bytes,
            "fits": self.fits,
            "engine": None if est is None else est.engine,
            "confirmed_by": self.confirmed_by,
            "reason": self.reason,
            "components": None if est is None else dict(est.components),
            "device_used_bytes": None if est is None else est.device_used_bytes,
        }


@lru_cache(maxsize=4096)
def _workload(settings: Settings, mode: str, seq_len: int, new_tokens: int) -> WorkloadSpec:
    return settings.workload(mode, seq_len, new_tokens)


def kernel_fields(w: WorkloadSpec) -> dict[str, Any]:
    """The job's kernels for a :class:`PlanRequest`, kept by every plan; with Unsloth's, its
    checkpointing and loss too (the recipe runs as ``FastLanguageModel`` does)."""
    if w.mode != "train" or w.kernels == "hf":
        return {}
    return {"kernels": w.kernels, "loss": w.loss, "checkpointing": w.checkpointing}


def job_request(w: WorkloadSpec, **fields: Any) -> PlanRequest:
    """The planner's request for the job ``w`` as asked, keeping its recipe: precision,
    optimizer, attention, LoRA (rank, targets, modules to save, dropout), weight format, the
    loss, the optimizer in backward and the kernels (:func:`kernel_fields`; Unsloth's with
    their checkpointing). Training: its batch x accumulation as the global batch over its GPUs;
    inference: its concurrent requests. ``fields``: :class:`PlanRequest` fields over these
    (the caller's own: headroom, confirmation, alternatives ...).

    The one door from a described job to the planner: ``estimate`` / ``fit``'s nearest change
    (memfit.plan.nearest), ``doctor``'s way forward and ``check``'s fix build their requests
    here, so none of them plans a LoRA job as a full fine-tune or drops Unsloth's kernels."""
    train = w.mode == "train"
    lora = w.lora_rank is not None
    recipe: dict[str, Any] = {
        "mode": w.mode,
        "seq_len": w.seq_len,
        "new_tokens": w.new_tokens,
        "batch_size": None if train else w.batch_size,
        "global_batch": w.batch_size * w.grad_accum * w.gpus if train else None,
        "gpus": w.gpus,
        "precision": w.precision,
        "optimizer": w.optimizer if train else None,
        "optimizer_in_bwd": w.optimizer_in_bwd,
        "attention": w.attention,
        "lora_ranks": (w.lora_rank,) if lora and w.lora_rank else (16, 64),
        "lora_asked": lora,
        "lora_targets": w.lora_targets if lora else "all-linear",
        "lora_modules_to_save": w.lora_modules_to_save if lora else (),
        "lora_dropout": w.lora_dropout if lora else 0.0,
        "quant": w.quant,
        "prepare_kbit": w.prepare_kbit,
        "loss": w.loss if train else "full",
        **kernel_fields(w),
        "confirm": "none",
        "n_alternatives": 0,
    }
    return PlanRequest(**{**recipe, **fields})

"""Validated, frozen inputs: what job is being estimated.

A :class:`WorkloadSpec` says *what the user's job runs* (train or infer, batch, sequence, precision
and the memory techniques). It is validated once in ``__post_init__`` and every problem is reported
together, each naming the field, the value and the rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["train", "infer"]

PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
ATTENTIONS = ("eager", "sdpa", "flash")
CHECKPOINTING = ("none", "full", "selective")
OPTIMIZERS = ("adamw", "adamw-fused", "sgd", "sgd-momentum", "adafactor", "none")
TASKS = ("auto", "causal-lm", "seq-cls", "seq2seq")
MODES = ("train", "infer")

#: The largest sequence memfit will accept: 16 Mi tokens. Beyond it no single GPU could hold even
#: the activations of one layer of the smallest bundled model, so such values are typos.
MAX_SEQ_LEN = 16 * 1024 * 1024
#: Likewise for batch size (samples per micro-batch).
MAX_BATCH_SIZE = 1 << 20


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """One training step or one inference run, as the user's job executes it.

    ``precision``: ``fp32``/``bf16``/``fp16`` keep weights, grads and optimizer states in that
    dtype; ``amp-*`` keep fp32 master weights and run the forward under autocast (``amp-fp16`` adds
    a GradScaler). ``attention``: ``eager`` materialises the (B, H, S, S) scores, ``sdpa`` lets
    PyTorch pick the kernel a CUDA GPU would pick, ``flash`` forces FlashAttention-2.
    ``zero_grad_set_to_none`` is torch's default (True); HF Trainer before 4.x kept grads (False).
    """

    mode: Mode = "train"
    batch_size: int = 1
    seq_len: int = 512
    new_tokens: int = 0
    precision: str = "bf16"
    attention: str = "sdpa"
    checkpointing: str = "none"
    optimizer: str | None = None  # None: "adamw" for train, "none" for infer
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | str = "all-linear"
    freeze_layers: int = 0
    task: str = "auto"
    zero_grad_set_to_none: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", "adamw" if self.mode == "train" else "none")
        if isinstance(self.lora_targets, list):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        problems = self.problems()
        if problems:
            from memfit.errors import SpecError

            raise SpecError.from_problems(problems)

    def problems(self) -> list[str]:
        p: list[str] = []

        def choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                p.append(f"{name} ({value!r}) must be one of {', '.join(allowed)}")

        def positive(name: str, value: object, upper: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                p.append(f"{name} ({value!r}) must be a positive integer")
            elif value > upper:
                p.append(f"{name} ({value}) is beyond what any GPU could hold (max {upper})")

        choice("mode", self.mode, MODES)
        choice("precision", self.precision, PRECISIONS)
        choice("attention", self.attention, ATTENTIONS)
        choice("checkpointing", self.checkpointing, CHECKPOINTING)
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("task", self.task, TASKS)
        positive("batch_size", self.batch_size, MAX_BATCH_SIZE)
        positive("seq_len", self.seq_len, MAX_SEQ_LEN)
        if not isinstance(self.new_tokens, int) or self.new_tokens < 0:
            p.append(f"new_tokens ({self.new_tokens!r}) must be an integer >= 0")
        elif self.new_tokens > MAX_SEQ_LEN:
            p.append(f"new_tokens ({self.new_tokens}) is beyond what any GPU could hold")
        if self.lora_rank is not None and (
            not isinstance(self.lora_rank, int) or self.lora_rank < 1
        ):
            p.append(f"lora_rank ({self.lora_rank!r}) must be a positive integer or None")
        if not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            p.append(f"freeze_layers ({self.freeze_layers!r}) must be an integer >= 0")
        if self.mode == "infer":
            if self.optimizer != "none":
                p.append(
                    f"optimizer ({self.optimizer!r}) contradicts mode 'infer': inference runs no "
                    "optimizer; drop --optimizer or use --mode train"
                )
            if self.checkpointing != "none":
                p.append(
                    f"checkpointing ({self.checkpointing!r}) only applies to mode 'train' "
                    "(inference keeps no activations for backward)"
                )
            if self.lora_rank is not None:
                p.append("lora_rank is a training technique; it has no effect with mode 'infer'")
            if self.freeze_layers:
                p.append(
                    "freeze_layers is a training technique; it has no effect with mode 'infer'"
                )
        elif self.new_tokens:
            p.append(
                f"new_tokens ({self.new_tokens}) only applies to mode 'infer' (generation); "
                "drop --new-tokens or use --mode infer"
            )
        return p

    @property
    def is_train(self) -> bool:
        return self.mode == "train"

    @property
    def uses_optimizer(self) -> bool:
        return self.is_train and self.optimizer != "none"

    def normalized(self) -> dict[str, Any]:
        """The inputs as JSON-ready values (what ``--json`` prints under ``workload``)."""
        d = asdict(self)
        d.pop("extra")
        if self.mode == "infer":
            for k in ("optimizer", "lora_rank", "lora_targets", "freeze_layers", "checkpointing"):
                d.pop(k)
        elif self.lora_rank is None:
            d.pop("lora_targets")
        if isinstance(d.get("lora_targets"), tuple):
            d["lora_targets"] = list(d["lora_targets"])
        return d

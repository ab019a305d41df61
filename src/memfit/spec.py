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
OPTIMIZERS = (
    "adamw",
    "adamw-fused",
    "adamw-8bit",
    "paged-adamw-8bit",
    "adafactor",
    "lion",
    "sgd",
    "sgd-momentum",
    "none",
)
#: Weight formats: bitsandbytes LLM.int8 / NF4 (± double quant) / FP4, GPTQ and AWQ packed int4,
#: FP8 (per-tensor scales). ``none`` keeps the precision's dtype.
QUANTS = ("none", "int8", "nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "fp8")
#: How data-parallel ranks hold the model: ``ddp`` replicates it; ZeRO-1/2/3 partition optimizer
#: states / + gradients / + parameters; ``fsdp`` is PyTorch FSDP2 (fully sharded, like ZeRO-3).
SHARDS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")
#: What lives in host RAM instead of the GPU: optimizer states (+ fp32 master weights), or those
#: and the parameters too (ZeRO-3 / FSDP only).
OFFLOADS = ("none", "optimizer", "params")
#: GPUs per job memfit will reason about.
MAX_GPUS = 1 << 16
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
    ``prepare_kbit``: QLoRA through peft's ``prepare_model_for_kbit_training`` (what TRL's
    SFTTrainer calls on a quantized model): every unquantized half-precision parameter is cast
    to fp32, so the embeddings, norms and LM head, and the activations between the quantized
    layers, run in fp32.
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
    quant: str = "none"
    quant_group_size: int = 128
    prepare_kbit: bool = False
    gpus: int = 1
    shard: str | None = None  # None: "ddp" when there are data-parallel ranks, else "none"
    offload: str = "none"
    tp: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", "adamw" if self.mode == "train" else "none")
        if self.shard is None:
            dp = self.gpus // self.tp if _is_count(self.gpus) and _is_count(self.tp) else 1
            object.__setattr__(self, "shard", "ddp" if dp > 1 else "none")
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
        choice("quant", self.quant, QUANTS)
        choice("shard", self.shard, SHARDS)
        choice("offload", self.offload, OFFLOADS)
        positive("quant_group_size", self.quant_group_size, 1 << 20)
        positive("gpus", self.gpus, MAX_GPUS)
        positive("tp", self.tp, MAX_GPUS)
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
        p.extend(self._technique_problems())
        return p

    def _technique_problems(self) -> list[str]:
        """Combinations that cannot run (quantized training without adapters, offload without a
        sharding engine, tensor parallelism not dividing the GPUs)."""
        p: list[str] = []
        if not (_is_count(self.gpus) and _is_count(self.tp)):
            return p
        if self.gpus % self.tp:
            p.append(
                f"tp ({self.tp}) must divide gpus ({self.gpus}): each tensor-parallel group spans "
                "tp GPUs and the data-parallel degree is gpus / tp"
            )
        dp = self.gpus // self.tp
        if self.shard == "none" and dp > 1:
            p.append(
                f"shard 'none' with {dp} data-parallel ranks (gpus {self.gpus} / tp {self.tp}): "
                "say how the ranks hold the model with --shard ddp|zero1|zero2|zero3|fsdp"
            )
        if self.prepare_kbit not in (True, False):
            p.append(f"prepare_kbit ({self.prepare_kbit!r}) must be true or false")
        elif self.prepare_kbit and (self.mode != "train" or self.quant == "none"):
            p.append(
                "prepare_kbit (peft's prepare_model_for_kbit_training) applies to QLoRA training: "
                "it needs --mode train and a --quant format; drop --prepare-kbit"
            )
        if self.mode == "train" and self.quant != "none" and self.lora_rank is None:
            p.append(
                f"quant ({self.quant!r}) with mode 'train' needs LoRA adapters (QLoRA): quantized "
                "base weights get no gradients; add --lora-rank, or use --quant none"
            )
        if self.offload != "none" and self.shard not in ("zero1", "zero2", "zero3", "fsdp"):
            hint = "--shard zero3" if self.offload == "params" else "--shard zero2 (ZeRO-Offload)"
            p.append(
                f"offload ({self.offload!r}) needs a sharding engine that offloads "
                f"(got shard {self.shard!r}); use {hint}, also with --gpus 1"
            )
        if self.offload == "params" and self.shard in ("zero1", "zero2"):
            p.append(
                f"offload 'params' needs --shard zero3 or fsdp (shard {self.shard!r} keeps "
                "every parameter on each GPU)"
            )
        if self.offload == "optimizer" and self.shard == "fsdp":
            p.append(
                "offload 'optimizer' with shard 'fsdp': FSDP2's CPUOffloadPolicy offloads "
                "parameters, gradients and optimizer states together; use --offload params, or "
                "--shard zero2/zero3 for optimizer-only offload (ZeRO-Offload)"
            )
        if self.mode == "infer" and self.offload == "optimizer":
            p.append("offload 'optimizer' has no effect with mode 'infer' (there is no optimizer)")
        if self.mode == "infer" and self.shard in ("zero1", "zero2", "fsdp"):
            p.append(
                f"shard ({self.shard!r}) is a training setup; for inference use --tp, --shard "
                "zero3 (ZeRO-Inference) or ddp (one replica per GPU)"
            )
        return p

    def warnings(self) -> list[str]:
        """Valid but probably unintended settings (reported in the estimate's ``notes``)."""
        w: list[str] = []
        sharded = self.shard in ("zero1", "zero2", "zero3", "fsdp")
        if sharded and self.dp == 1 and self.offload == "none":
            w.append(
                f"shard {self.shard!r} over a single data-parallel rank partitions nothing: "
                "it saves memory only with --gpus > 1 or with --offload"
            )
        if self.shard == "ddp" and self.dp == 1:
            w.append("shard 'ddp' with one data-parallel rank is a single-GPU run")
        if self.quant in ("nf4", "nf4-dq", "fp4") and self.precision == "fp32" and self.is_train:
            w.append(
                "4-bit base weights with fp32 compute: bitsandbytes dequantizes to fp32 for every "
                "matmul; QLoRA normally computes in bf16 (--precision bf16)"
            )
        if self.prepare_kbit and self.quant in ("int4-gptq", "fp8"):
            w.append(
                f"prepare_kbit with quant {self.quant!r}: peft's prepare_model_for_kbit_training "
                "skips the fp32 casts for GPTQ and torchao models, so it changes nothing here"
            )
        if self.quant == "fp8" and self.is_train:
            w.append(
                "fp8 here stores frozen base weights in fp8 (per-tensor scales); fp8 training "
                "recipes (transformer-engine) keep higher-precision masters and are not modelled"
            )
        return w

    @property
    def dp(self) -> int:
        """Data-parallel degree: ``gpus / tp``."""
        return self.gpus // self.tp

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
        if self.quant not in ("int4-gptq", "int4-awq"):
            d.pop("quant_group_size")
        if self.quant == "none" or self.mode != "train":
            d.pop("prepare_kbit")
        if self.mode == "infer":
            for k in ("optimizer", "lora_rank", "lora_targets", "freeze_layers", "checkpointing"):
                d.pop(k)
        elif self.lora_rank is None:
            d.pop("lora_targets")
        if isinstance(d.get("lora_targets"), tuple):
            d["lora_targets"] = list(d["lora_targets"])
        return d


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1

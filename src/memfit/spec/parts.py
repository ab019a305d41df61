"""The three parts of a job: its shape, its techniques and its parallel layout (frozen records).

Each validates its own fields when built (:mod:`memfit.spec.rules`), names them by their
:class:`~memfit.spec.WorkloadSpec` names in messages, and gives them back by those names
(``flat()``), which is how a WorkloadSpec and the planner's ``Settings`` are built from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from memfit.spec.parallel_rules import (
    model_parallel_size,
    parallel_layout_rules,
    resolve_schedule,
)
from memfit.spec.rules import (
    Mode,
    default_shard,
    field_problems,
    fsdp_rules,
    fsdp_version_rules,
    generation_rules,
    hpz_rules,
    is_count,
    kbit_rules,
    layout_rules,
    offload_rules,
    prefill_rules,
    raise_if,
    shape_rules,
)


# -- the three parts of a job --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ShapeSpec:
    """What one step computes: train or infer, samples per micro-batch, tokens per sample, tokens
    generated, the model head, and micro-batches per optimizer step."""

    mode: Mode = "train"
    batch_size: int = 1
    seq_len: int = 512
    new_tokens: int = 0
    task: str = "auto"
    grad_accum: int = 1
    num_beams: int = 1
    cache_implementation: str = "dynamic"
    prefill_chunk_size: int | None = None

    def __post_init__(self) -> None:
        raise_if(self.problems())

    def problems(self) -> list[str]:
        return (
            field_problems(self.flat())
            + shape_rules(self.mode, self.new_tokens, self.grad_accum)
            + generation_rules(
                self.mode, self.new_tokens, self.num_beams, self.cache_implementation
            )
            + prefill_rules(self.mode, self.prefill_chunk_size)
        )

    def flat(self) -> dict[str, Any]:
        """The fields by their :class:`WorkloadSpec` names."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """LoRA adapters (Hu et al. 2021): their rank and the modules they wrap (``all-linear`` or
    module names)."""

    rank: int
    targets: tuple[str, ...] | str = "all-linear"
    #: peft's ``modules_to_save`` (axolotl / TRL ``lora_modules_to_save``, LLaMA-Factory
    #: ``additional_target``): modules trained in full beside the adapters, e.g. ``embed_tokens``
    #: and ``lm_head`` when new tokens are added; peft keeps the original and a trainable copy
    modules_to_save: tuple[str, ...] = ()
    #: peft's ``LoraConfig.lora_dropout``: an ``nn.Dropout`` on each adapter's input (0: peft's
    #: ``nn.Identity``); above 0 every adapter keeps its own dropped copy of the input and the
    #: mask for backward (peft ``tuners/lora/layer.py``: ``lora_B(lora_A(dropout(x)))``)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.targets, list):
            object.__setattr__(self, "targets", tuple(self.targets))
        if isinstance(self.modules_to_save, list):
            object.__setattr__(self, "modules_to_save", tuple(self.modules_to_save))
        raise_if(self.problems())

    def problems(self) -> list[str]:
        if self.rank is None:
            return ["lora_rank (None) must be a positive integer (no LoRA: lora=None)"]
        return field_problems(
            {
                "lora_rank": self.rank,
                "lora_modules_to_save": self.modules_to_save,
                "lora_dropout": self.dropout,
            }
        )


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How the base weights are stored: ``format`` (``none`` keeps the precision's dtype), the
    GPTQ/AWQ group size, peft's ``prepare_model_for_kbit_training`` (QLoRA through TRL's
    SFTTrainer), and the dtype the quantized layers compute in when it differs from the
    precision's (None: the precision's; the analytic engine sets it for ``prepare_kbit``)."""

    format: str = "none"
    group_size: int = 128
    prepare_kbit: bool = False
    compute_dtype: str | None = None

    def __post_init__(self) -> None:
        raise_if(self.problems())

    def problems(self) -> list[str]:
        return field_problems(self.flat()) + kbit_rules("train", self.format, self.prepare_kbit)

    def flat(self) -> dict[str, Any]:
        return {
            "quant": self.format,
            "quant_group_size": self.group_size,
            "prepare_kbit": self.prepare_kbit,
            "quant_compute_dtype": self.compute_dtype,
        }


@dataclass(frozen=True, kw_only=True)
class TechniqueSpec:
    """The memory techniques of a job. ``optimizer`` None: the mode's default (a WorkloadSpec
    resolves it: adamw to train, none to infer). ``lora`` None: full fine-tuning."""

    precision: str | None = None  # None: the mode's default (WorkloadSpec resolves it)
    attention: str = "sdpa"
    checkpointing: str = "none"
    optimizer: str | None = None
    lora: LoraSpec | None = None
    freeze_layers: int = 0
    quantization: QuantSpec = QuantSpec()
    zero_grad_set_to_none: bool = True
    optimizer_in_bwd: bool = False
    loss: str = "full"  # the training cross-entropy (rules.LOSSES)
    kernels: str = "hf"  # whose kernels run the layers (rules.KERNELS)
    compile: bool = False  # the blocks run under torch.compile (WorkloadSpec.compile)
    selective_ac_option: int = 2  # checkpointing selective-layer: every N-th block (0: all)
    #: the transformers release whose step rules apply (memfit.spec.hf_versions; None: the
    #: installed one)
    transformers_version: str | None = None
    #: the peft release whose adapter rules apply (memfit.spec.hf_versions; None: the installed)
    peft_version: str | None = None

    def __post_init__(self) -> None:
        raise_if(self.problems())

    def problems(self) -> list[str]:
        own: tuple[str, ...] = ("precision", "attention", "checkpointing", "optimizer")
        own += ("freeze_layers", "optimizer_in_bwd", "loss", "kernels")
        own += ("compile", "selective_ac_option", "transformers_version", "peft_version")
        values = {k: getattr(self, k) for k in own}
        for name in ("optimizer", "precision"):
            if values[name] is None:
                del values[name]
        return field_problems(values)

    @classmethod
    def from_flat(cls, **flat: Any) -> TechniqueSpec:
        """From :class:`WorkloadSpec` names (``lora_rank``, ``quant``, ``quant_group_size``...)."""
        rank, targets = flat.pop("lora_rank", None), flat.pop("lora_targets", "all-linear")
        to_save = flat.pop("lora_modules_to_save", ())
        dropout = flat.pop("lora_dropout", 0.0)
        q = {k: flat.pop(k) for k in ("quant", "quant_group_size", "prepare_kbit") if k in flat}
        quant = QuantSpec(
            format=q.get("quant", "none"),
            group_size=q.get("quant_group_size", 128),
            prepare_kbit=q.get("prepare_kbit", False),
            compute_dtype=flat.pop("quant_compute_dtype", None),
        )
        lora = (
            None
            if rank is None
            else LoraSpec(
                rank=rank, targets=targets, modules_to_save=tuple(to_save), dropout=dropout
            )
        )
        return cls(lora=lora, quantization=quant, **flat)

    def flat(self) -> dict[str, Any]:
        """The fields by their :class:`WorkloadSpec` names."""
        return {
            "precision": self.precision,
            "attention": self.attention,
            "checkpointing": self.checkpointing,
            "optimizer": self.optimizer,
            "lora_rank": self.lora_rank,
            "lora_targets": self.lora.targets if self.lora else "all-linear",
            "lora_modules_to_save": self.lora.modules_to_save if self.lora else (),
            "lora_dropout": self.lora.dropout if self.lora else 0.0,
            "freeze_layers": self.freeze_layers,
            "zero_grad_set_to_none": self.zero_grad_set_to_none,
            "optimizer_in_bwd": self.optimizer_in_bwd,
            "loss": self.loss,
            "kernels": self.kernels,
            "compile": self.compile,
            "selective_ac_option": self.selective_ac_option,
            "transformers_version": self.transformers_version,
            "peft_version": self.peft_version,
            **self.quantization.flat(),
        }

    @property
    def lora_rank(self) -> int | None:
        return None if self.lora is None else self.lora.rank

    @property
    def quant(self) -> str:
        return self.quantization.format

    @property
    def prepare_kbit(self) -> bool:
        return self.quantization.prepare_kbit


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """How the job spreads over GPUs: ``tp``-way tensor parallelism inside each group and
    ``dp = gpus / (tp * pp * cp)`` data-parallel ranks holding the model as ``shard`` says
    (None: ``ddp`` when there are several ranks, else ``none``), with ``offload`` to host RAM.

    Pipeline, context and expert parallelism (:mod:`memfit.spec.parallel_rules`, whose table
    gives torchtitan's and Megatron's names): ``pp`` stages run by ``pp_schedule`` (looped
    ``interleaved-1f1b`` with ``pp_virtual_stages`` chunks per rank), ``cp`` ranks splitting the
    sequence (ring attention rotating K/V by ``cp_rotate``), and the routed experts of a MoE
    model over ``ep`` ranks, each expert over ``etp`` tensor-parallel ranks."""

    gpus: int = 1
    tp: int = 1
    shard: str | None = None
    offload: str = "none"
    # -- pipeline, context and expert parallelism (memfit.spec.parallel_rules) --
    pp: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    cp: int = 1
    cp_rotate: str = "allgather"
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    async_tp: bool = False
    float8: str = "none"
    float8_all_gather: bool = False
    # -- FSDP2 / HSDP / ZeRO++ (par-a): WorkloadSpec's fields of the same names --
    dp_replicate: int = 1
    reshard_after_forward: bool | int = True
    zero_hpz_partition_size: int = 1
    # -- FSDP1 (issue 30): WorkloadSpec.fsdp_version --
    fsdp_version: int = 2
    fsdp_lora_wrap: str = "peft"
    fsdp_state_dict_type: str | None = None
    accelerate_version: str | None = None  # WorkloadSpec.accelerate_version

    def __post_init__(self) -> None:
        object.__setattr__(self, "pp_schedule", resolve_schedule(self.pp_schedule))
        if self.shard is None:
            mp = model_parallel_size(self.flat())
            object.__setattr__(self, "shard", default_shard(self.gpus, mp))
        raise_if(self.problems())

    def problems(self) -> list[str]:
        p = field_problems(self.flat())
        if is_count(self.gpus) and is_count(self.tp):
            mp = model_parallel_size(self.flat())
            p += layout_rules(self.gpus, self.tp, self.shard, mp=mp)
            p += offload_rules(self.shard, self.offload)
            p += fsdp_rules(self.shard, self.dp, self.dp_replicate, self.reshard_after_forward)
            p += hpz_rules(self.shard, self.dp, self.zero_hpz_partition_size)
            p += fsdp_version_rules(self.flat())
        p += parallel_layout_rules(self.flat())
        return p

    def flat(self) -> dict[str, Any]:
        # every field is a scalar: a shallow dict is asdict's result without its deep copies
        # (asdict was 45 % of an analytic estimate's "nearest change" search, issue 32)
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def dp(self) -> int:
        """Data-parallel degree: ``gpus / (tp * pp * cp)``."""
        return self.gpus // model_parallel_size(self.flat())  # 1 for an invalid field

"""The search space: technique settings, their quality risk, and the memory order between them.

A :class:`Settings` is one combination of techniques (what ``memfit estimate`` flags say) plus
the split of the per-GPU batch into micro-batch x gradient accumulation. :func:`candidates`
enumerates those the planner considers; options that another option beats in both memory and
speed are left out (each omission says why). :func:`dominates` encodes the memory order used to
skip combinations: a combination that keeps at least as much in memory as one that already did not
fit, in every ordered dimension, is not estimated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from memfit.hardware.precision import FP16_COUNTERPART

# the quality-risk scale and table live with the recipe (what a plan changes about the job)
from memfit.plan.recipe import RISK_LEVELS as RISK_LEVELS  # noqa: E402
from memfit.plan.recipe import RISKS as RISKS  # noqa: E402
from memfit.spec import (
    PARALLEL_FIELDS,
    TECHNIQUE_FIELDS,
    ParallelSpec,
    TechniqueSpec,
    WorkloadSpec,
    default_precision,
    default_precision_note,
    resolve_precision,
)
from memfit.spec.rules import KERNEL_EXCLUDED_SHARDS, precision_rules

#: Memory order per dimension: a higher index keeps less in device memory. Values of equal index
#: are not compared (int8 vs fp8, zero3 vs fsdp). ``micro_batch`` is ordered by its value.
MEMORY_ORDER: dict[str, dict[str, int]] = {
    "checkpointing": {"none": 0, "selective": 1, "selective-op": 1, "full": 2, "offload": 3},
    # a chunked / fused cross-entropy keeps no full logits (estimate/analytic/loss.py)
    "loss": {"full": 0, "chunked": 1, "fused": 2},
    "optimizer": {"adamw": 0, "adamw-fused": 0, "adamw-8bit": 1, "adafactor": 2},
    "quant": {"none": 0, "int8": 1, "fp8": 1, "nf4": 2, "nf4-dq": 3, "int4-awq": 2},
    "shard": {"none": 0, "ddp": 0, "zero2": 1, "zero3": 2, "fsdp": 2},
    "offload": {"none": 0, "optimizer": 1, "params": 2},
}
#: Precision pairs (a, b) where a keeps at least as much as b: mixed precision (fp32 weights,
#: gradients, optimizer states and residual stream) against pure 16-bit weights of the same width.
PRECISION_KEEPS_MORE = {("bf16-mixed", "bf16-true"), ("16-mixed", "16-true")}
#: The pure 16-bit precision of each mixed one (the ``pure-bf16`` result-changing option).
PURE_OF = {"bf16-mixed": "bf16-true", "16-mixed": "16-true"}
#: The 4-bit weight formats whose LoRA is "QLoRA" in a plan's short form (Dettmers et al. 2023,
#: "QLoRA: Efficient Finetuning of Quantized LLMs": LoRA on a 4-bit base); LoRA on an 8-bit base
#: (int8 LLM.int8(), fp8) is "LoRA" beside its format.
QLORA_QUANTS = frozenset({"nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "mxfp4"})
#: The flat names ``Settings.to_json`` gives, in the order ``memfit plan --json`` prints them.
SETTINGS_JSON = (
    "precision",
    "quant",
    "attention",
    "checkpointing",
    "optimizer",
    "lora_rank",
    "freeze_layers",
    "gpus",
    "shard",
    "offload",
    "tp",
    "micro_batch",
    "grad_accum",
    "prepare_kbit",
    "loss",
)


def _view(part: str, name: str) -> Any:
    """A read-only flat attribute of :class:`Settings`: ``name`` of its ``part`` record, read
    once per instance (the records are frozen; a plan search reads these ~700 000 times:
    issue 32)."""

    def read(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    read.__doc__ = f"``{part}.{name}``"
    return cached_property(read)


@dataclass(frozen=True, init=False)
class Settings:
    """One technique combination and batch split, per data-parallel rank: the job's
    :class:`TechniqueSpec` and :class:`ParallelSpec` (the records a :class:`WorkloadSpec` is
    made of) plus the split of the per-rank batch into ``micro_batch`` x ``grad_accum``.

    Built from the records or from their flat names, as a WorkloadSpec is:
    ``Settings(precision="bf16-mixed", lora_rank=16, gpus=2, shard="zero3", micro_batch=4)``
    (``optimizer`` left out: none; ``shard``: the layout's default). Flat names read through
    (``s.precision``, ``s.lora_rank``) and ``dataclasses.replace`` takes them too.
    """

    techniques: TechniqueSpec
    parallel: ParallelSpec
    micro_batch: int = 1
    grad_accum: int = 1

    def __init__(
        self,
        *,
        techniques: TechniqueSpec | None = None,
        parallel: ParallelSpec | None = None,
        micro_batch: int = 1,
        grad_accum: int = 1,
        **flat: Any,
    ) -> None:
        unknown = set(flat) - set(TECHNIQUE_FIELDS) - set(PARALLEL_FIELDS)
        if unknown:
            raise TypeError(f"Settings got unexpected keyword arguments: {sorted(unknown)}")
        tech = techniques.flat() if techniques else {}
        tech.update((k, v) for k, v in flat.items() if k in TECHNIQUE_FIELDS)
        if tech.get("optimizer") is None:
            tech["optimizer"] = "none"  # the planner names every optimizer it runs
        # canonical names (aliases as for training: a plan names its inference precision)
        tech["precision"] = resolve_precision(tech.get("precision"), "train")
        layout = parallel.flat() if parallel else {}
        layout.update((k, v) for k, v in flat.items() if k in PARALLEL_FIELDS)
        set_ = object.__setattr__
        techniques = _shared(TechniqueSpec.from_flat, tech)
        parallel = _shared(ParallelSpec, layout)
        set_(self, "techniques", techniques)
        set_(self, "parallel", parallel)
        set_(self, "micro_batch", micro_batch)
        set_(self, "grad_accum", grad_accum)
        # the flat views and the technique key, read from the parts once per pair of parts
        # (instance attributes shadow the cached properties below: same values, no lock)
        self.__dict__.update(_flat_views(techniques, parallel))

    def split(self, micro_batch: int, grad_accum: int) -> Settings:
        """These settings with another batch split (the same parts: no flat names read or
        validated again; a plan search builds ~4 000 splits of a few dozen stacks)."""
        return Settings.of_parts(self.techniques, self.parallel, micro_batch, grad_accum)

    @staticmethod
    def of_parts(
        techniques: TechniqueSpec, parallel: ParallelSpec, micro_batch: int, grad_accum: int
    ) -> Settings:
        """Settings made of these validated parts (those of another :class:`Settings`: no
        flat names read or validated again)."""
        out = object.__new__(Settings)
        set_ = object.__setattr__
        set_(out, "techniques", techniques)
        set_(out, "parallel", parallel)
        set_(out, "micro_batch", micro_batch)
        set_(out, "grad_accum", grad_accum)
        out.__dict__.update(_flat_views(techniques, parallel))
        return out

    @classmethod
    def of(cls, w: WorkloadSpec) -> Settings:
        """The settings a workload runs: its techniques and layout, its batch as the
        micro-batch and its gradient accumulation."""
        return cls(
            techniques=w.techniques,
            parallel=w.parallel,
            micro_batch=w.batch_size,
            grad_accum=w.grad_accum,
        )

    precision = _view("techniques", "precision")
    quant = _view("techniques", "quant")
    attention = _view("techniques", "attention")
    checkpointing = _view("techniques", "checkpointing")
    optimizer = _view("techniques", "optimizer")
    lora_rank = _view("techniques", "lora_rank")
    freeze_layers = _view("techniques", "freeze_layers")
    prepare_kbit = _view("techniques", "prepare_kbit")
    loss = _view("techniques", "loss")
    kernels = _view("techniques", "kernels")
    gpus = _view("parallel", "gpus")
    shard = _view("parallel", "shard")
    offload = _view("parallel", "offload")
    tp = _view("parallel", "tp")
    dp = _view("parallel", "dp")

    @cached_property
    def technique_key(self) -> tuple[Any, ...]:
        """Everything but the batch split: two settings with one key are one technique stack."""
        return (
            self.precision,
            self.quant,
            self.attention,
            self.checkpointing,
            self.optimizer,
            self.lora_rank,
            self.freeze_layers,
            self.shard,
            self.offload,
            self.tp,
            self.prepare_kbit,
            self.techniques.optimizer_in_bwd,
            self.techniques.loss,
        )

    def to_json(self) -> dict[str, Any]:
        """The settings by their flat names (what ``memfit plan --json`` prints); ``kernels``
        only where they are not transformers' (``hf``)."""
        out = {k: getattr(self, k) for k in SETTINGS_JSON}
        if self.kernels != "hf":
            out["kernels"] = self.kernels
        return out

    def workload(self, mode: str, seq_len: int, new_tokens: int = 0) -> WorkloadSpec:
        """The workload of one micro-batch. Training keeps the techniques; inference drops the
        training-only ones. Gradient accumulation: from the second micro-batch on, the gradients
        of the previous ones are held through the forward and backward (the engines model this
        as gradients that exist when the step starts: ``zero_grad_set_to_none=False``)."""
        train = mode == "train"
        tech = self.techniques.flat()
        tech["prepare_kbit"] = self.prepare_kbit and train and self.quant != "none"
        tech["zero_grad_set_to_none"] = not (train and self.grad_accum > 1)
        if not train:
            tech.update(
                checkpointing="none", optimizer="none", lora_rank=None, freeze_layers=0,
                kernels="hf",
            )  # fmt: skip
        return WorkloadSpec(
            mode="train" if train else "infer",
            batch_size=self.micro_batch,
            seq_len=seq_len,
            new_tokens=0 if train else new_tokens,
            grad_accum=self.grad_accum if train else 1,
            **tech,
            **self.parallel.flat(),
        )

    def describe(self) -> str:
        """Short human form: ``bf16-mixed, QLoRA r16, nf4-dq, ckpt full, adamw-8bit, mb 4 x 8``.

        "QLoRA" names LoRA on a 4-bit base (:data:`QLORA_QUANTS`), as Dettmers et al. 2023 do;
        LoRA on an 8-bit base (``int8``, ``fp8``) is "LoRA" with its format beside it. Modules
        an asked LoRA trains in full (peft ``modules_to_save``) follow the rank with a ``+``:
        they can outweigh the adapters many times (a Llama-3 8B embedding is 0.5 B parameters).
        """
        parts = [self.precision]
        if self.lora_rank:
            q = "Q" if self.quant in QLORA_QUANTS else ""
            lora = self.techniques.lora
            saved = lora.modules_to_save if lora is not None else ()
            parts.append(f"{q}LoRA r{self.lora_rank}" + (f" + {','.join(saved)}" if saved else ""))
        if self.quant != "none":
            parts.append(self.quant + (" (prepare_kbit)" if self.prepare_kbit else ""))
        if self.freeze_layers:
            parts.append(f"freeze {self.freeze_layers}")
        if self.checkpointing != "none":
            parts.append(f"ckpt {self.checkpointing}")
        if self.loss != "full":
            parts.append(f"{self.loss} CE")
        if self.kernels != "hf":
            parts.append(f"{self.kernels} kernels")
        if self.optimizer != "none":
            parts.append(
                self.optimizer + (" in backward" if self.techniques.optimizer_in_bwd else "")
            )
        if self.gpus > 1 or self.shard != "none":
            parts.append(self.shard if self.tp == 1 else f"tp {self.tp}")
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        parts.append(
            f"mb {self.micro_batch}" + (f" x {self.grad_accum}" if self.grad_accum > 1 else "")
        )
        return ", ".join(parts)


#: Validated spec parts by their flat fields (:func:`_shared`), at most this many kept.
SHARED_PARTS_MAX = 4096
_SHARED_PARTS: dict[tuple[Any, ...], Any] = {}


def _shared(build: Any, flat: dict[str, Any]) -> Any:
    """``build(**flat)``, one frozen record per distinct ``flat``: a plan search builds ~2 000
    settings from a few dozen technique stacks and layouts, and validating each part anew was a
    third of the "nearest change that fits" search (issue 32). Keyed with each value's type, so
    that ``True`` and ``1`` stay apart; an unhashable value builds a new record."""
    try:
        key = (build, *((k, type(v), v) for k, v in sorted(flat.items())))
        hash(key)
    except TypeError:
        return build(**flat)
    part = _SHARED_PARTS.get(key)
    if part is None:
        if len(_SHARED_PARTS) >= SHARED_PARTS_MAX:
            _SHARED_PARTS.clear()
        part = _SHARED_PARTS[key] = build(**flat)
    return part


#: The flat views of a pair of parts (:func:`_flat_views`), by their ids (the entry holds the
#: parts, so ``is`` tells a reused id), at most :data:`SHARED_PARTS_MAX` kept.
_VIEWS: dict[tuple[int, int], tuple[Any, Any, dict[str, Any]]] = {}
TECHNIQUE_VIEWS = (
    "precision", "quant", "attention", "checkpointing", "optimizer", "lora_rank",
    "freeze_layers", "prepare_kbit", "loss",
)  # fmt: skip
PARALLEL_VIEWS = ("gpus", "shard", "offload", "tp", "dp")


def _flat_views(techniques: Any, parallel: Any) -> dict[str, Any]:
    """What :class:`Settings`' flat views and ``technique_key`` read for these parts: a plan
    search builds ~4 000 settings from a few dozen pairs of parts, and reading each view
    through its cached property was a fifth of building and judging them (issue 32)."""
    key = (id(techniques), id(parallel))
    found = _VIEWS.get(key)
    if found is not None and found[0] is techniques and found[1] is parallel:
        return found[2]
    views = {n: getattr(techniques, n) for n in TECHNIQUE_VIEWS}
    views.update((n, getattr(parallel, n)) for n in PARALLEL_VIEWS)
    v = views
    views["technique_key"] = (
        v["precision"], v["quant"], v["attention"], v["checkpointing"], v["optimizer"],
        v["lora_rank"], v["freeze_layers"], v["shard"], v["offload"], v["tp"],
        v["prepare_kbit"], techniques.optimizer_in_bwd, techniques.loss,
    )  # fmt: skip
    if len(_VIEWS) >= SHARED_PARTS_MAX:
        _VIEWS.clear()
    _VIEWS[key] = (techniques, parallel, views)
    return views


def dominates(worse: Settings, failed: Settings) -> bool:
    """True when ``worse`` keeps at least as much in memory as ``failed`` in every ordered
    dimension and equals it in the others, so it cannot fit where ``failed`` did not.

    Beyond :data:`MEMORY_ORDER`: a larger micro-batch keeps more; AMP keeps more than pure
    16-bit weights of the same width (fp32 weights, gradients and optimizer states, an fp32
    residual stream); a higher LoRA rank keeps more (larger adapters and their states); fewer
    frozen layers keep more (their gradients, states and activations). Full fine-tuning and LoRA
    are not compared (LoRA's dropout copies of the inputs can outgrow the gradients it saves)."""
    if (worse.attention, worse.tp, worse.gpus) != (failed.attention, failed.tp, failed.gpus):
        return False
    if worse.micro_batch < failed.micro_batch:
        return False
    precisions = (worse.precision, failed.precision)
    if precisions[0] != precisions[1] and precisions not in PRECISION_KEEPS_MORE:
        return False
    if (worse.lora_rank is None) != (failed.lora_rank is None):
        return False
    if worse.lora_rank is not None and failed.lora_rank is not None:
        if worse.lora_rank < failed.lora_rank or worse.freeze_layers != failed.freeze_layers:
            return False
    elif worse.freeze_layers > failed.freeze_layers:
        return False
    if {worse.checkpointing, failed.checkpointing} == {"none", "selective"} and (
        worse.lora_rank is not None or worse.freeze_layers
    ):
        # selective checkpointing saves every matmul's output; without it autograd saves no
        # input of a frozen Linear (its backward needs the weight only), so with adapters or
        # frozen layers "none" can keep less than "selective" (phi-3 QLoRA: 10.6 vs 12.8 GiB)
        return False
    return all(
        _keeps_at_least(getattr(worse, dim), getattr(failed, dim), order)
        for dim, order in MEMORY_ORDER.items()
    )


def _keeps_at_least(a: str, b: str, order: dict[str, int]) -> bool:
    """``a`` keeps at least as much as ``b`` in one ordered dimension (equal, or lower index)."""
    if a == b:
        return True
    return a in order and b in order and order[a] < order[b]


@dataclass(frozen=True, kw_only=True)
class SpaceOptions:
    """What the planner may try. Built by the planner from the request and the GPU. The recipe
    (the job as asked): ``precision``, ``optimizer``, ``attention``, and LoRA at ``lora_ranks``
    when ``lora_asked`` (else full fine-tuning, LoRA at those ranks being a result-changing
    option)."""

    mode: str
    per_rank_batch: int
    fixed_micro_batch: bool
    gpus: int
    n_layers: int
    supports_bf16: bool
    supports_fp8: bool
    keep_full_finetune: bool = False
    allow_quant: bool = True
    allow_offload: bool = False
    lora_ranks: tuple[int, ...] = (16, 64)
    prepare_kbit: bool = False
    precision: str | None = None  # None: bf16-mixed / bf16-true (16-bit on GPUs without bf16)
    optimizer: str | None = None  # None: adamw to train
    attention: str = "sdpa"
    lora_asked: bool = False
    #: the dtype the checkpoint is stored in (None: not said), for the default precision
    checkpoint_dtype: str | None = None
    #: the job's own weight format (QLoRA asked, or a quantized checkpoint to serve)
    quant: str = "none"
    #: the modules an asked LoRA adapts (a LoRA the planner proposes adapts every linear)
    lora_targets: tuple[str, ...] | str = "all-linear"
    #: the modules an asked LoRA trains in full (peft modules_to_save), kept as asked
    lora_modules_to_save: tuple[str, ...] = ()
    #: the asked LoRA's dropout (peft lora_dropout), kept as asked
    lora_dropout: float = 0.0
    #: the optimizer steps in backward (asked): one GPU, no accumulation, no ZeRO / offload
    optimizer_in_bwd: bool = False
    #: the job's training cross-entropy (rules.LOSSES); ``memory_only_losses`` adds the fused
    #: one (Liger / Unsloth: the same loss and gradients, no logits kept) as a memory-only option
    loss: str = "full"
    #: whose kernels run the layers (rules.KERNELS), the job's own: every candidate keeps them
    kernels: str = "hf"
    #: the job's own checkpointing (the recipe's; Unsloth's default is ``offload``)
    checkpointing: str = "none"
    memory_only_losses: bool = True
    #: host-RAM checkpoints (Unsloth's) on one GPU without ZeRO offload, a memory-only option
    host_checkpoints: bool = True
    #: the job's checkpointing is kept by every candidate (PlanRequest.keep_checkpointing)
    keep_checkpointing: bool = False
    #: the job's own micro-batch (PlanRequest.asked_micro_batch): the recipe's split
    asked_micro_batch: int | None = None

    @property
    def recipe_precision(self) -> str:
        """The precision asked, or the one the ecosystem runs this job in
        (:func:`memfit.spec.rules.default_precision`: LoRA on its checkpoint's 16-bit base)."""
        if self.precision is not None:
            asked = resolve_precision(self.precision, self.mode)
            return asked if self.supports_bf16 else FP16_COUNTERPART.get(asked, asked)
        return default_precision(
            self.mode,
            adapters=self.lora_asked,
            bf16=self.supports_bf16,
            checkpoint_dtype=self.checkpoint_dtype,
        )

    @property
    def precision_note(self) -> str | None:
        """Why the recipe runs in its precision when none was asked (None: it was asked)."""
        if self.precision is not None:
            asked = resolve_precision(self.precision, self.mode)
            if asked == self.recipe_precision:
                return None
            return (
                f"precision {self.recipe_precision}: asked {asked}, but this GPU has no bf16 "
                "tensor cores; the job is planned in its fp16 counterpart (same bytes)"
            )
        return default_precision_note(
            self.recipe_precision,
            self.mode,
            adapters=self.lora_asked,
            checkpoint_dtype=self.checkpoint_dtype,
        )

    @property
    def recipe_optimizer(self) -> str:
        if self.mode == "infer":
            return "none"
        return self.optimizer or "adamw"


def micro_batch_splits(o: SpaceOptions) -> list[tuple[int, int]]:
    """The (micro-batch, accumulation) splits of the per-rank batch (the asked one alone where
    the micro-batch is fixed)."""
    if o.fixed_micro_batch:
        return [(o.per_rank_batch, 1)]
    n = o.per_rank_batch
    return [(m, n // m) for m in range(1, n + 1) if n % m == 0]


def _optimizers(o: SpaceOptions) -> tuple[str, ...]:
    """The recipe's optimizer (and the fused AdamW kernel, the same update), then the
    result-changing ones: 8-bit AdamW and Adafactor. Paged 8-bit AdamW is left out (its states
    are counted on the device until evicted, like adamw-8bit)."""
    own = o.recipe_optimizer
    # the recipe's own kernel first: a tie keeps what the job asked
    pair = ("adamw", "adamw-fused")
    same = (own, *(x for x in pair if x != own)) if own in pair else (own,)
    return same + tuple(x for x in ("adamw-8bit", "adafactor") if x not in same)


def _train_stacks(o: SpaceOptions) -> Iterator[dict[str, Any]]:
    """Adapter x quantization x optimizer stacks for training: the recipe's adapter first (full
    fine-tuning, or LoRA at the asked ranks), then LoRA / freezing / QLoRA as result-changing
    options (none with ``keep_full_finetune``). FP4 is left out (NF4 is as small and better)."""
    opts = _optimizers(o)
    quants = [o.quant]
    if o.allow_quant:
        # a job asked in a quantized format is never planned back in 16 bits (more memory for
        # the same adapters: only offloading could hold it, which is not what the user asked)
        more = (["none"] if o.quant == "none" else []) + ["int8", "nf4-dq"]
        more += ["fp8"] if o.supports_fp8 else []
        quants += [q for q in more if q not in quants]
    # adapters and frozen layers: the recipe's optimizer and 8-bit AdamW only (the fused kernel
    # and Adafactor save nothing that matters next to what LoRA / freezing already saves)
    lora_opts = tuple(dict.fromkeys((opts[0], "adamw-8bit")))
    if o.lora_asked:
        for rank in o.lora_ranks:
            for q in quants:
                for opt in lora_opts:
                    yield {
                        "optimizer": opt,
                        "lora_rank": rank,
                        "quant": q,
                        "lora_targets": o.lora_targets,
                        "lora_modules_to_save": o.lora_modules_to_save,
                        "lora_dropout": o.lora_dropout,
                    }
        return
    yield from ({"optimizer": opt} for opt in opts)
    if o.keep_full_finetune:
        return
    if o.n_layers >= 2:
        for opt in lora_opts:
            yield {"optimizer": opt, "freeze_layers": o.n_layers // 2}
    for rank in o.lora_ranks:
        for q in quants:
            for opt in lora_opts:
                yield {"optimizer": opt, "lora_rank": rank, "quant": q}


def _parallel_layouts(o: SpaceOptions) -> list[dict[str, Any]]:
    if o.mode == "infer":  # tensor parallelism inside a replica, replicas across the rest
        return [
            {"tp": tp, "shard": "ddp" if o.gpus // tp > 1 else "none"}
            for tp in range(1, o.gpus + 1)
            if o.gpus % tp == 0 and o.per_rank_batch > 0
        ]
    layouts: list[dict[str, Any]] = []
    if o.gpus > 1:  # ZeRO-1 is left out: ZeRO-2 holds less and communicates the same (ZeRO §7)
        layouts += [{"shard": s} for s in ("ddp", "zero2", "zero3", "fsdp")]
    else:
        layouts.append({"shard": "none"})
    layouts += offload_layouts(o)
    excluded = KERNEL_EXCLUDED_SHARDS.get(o.kernels, ())  # shards the kernels cannot run under
    return [layout for layout in layouts if layout["shard"] not in excluded]


def stack_options(o: SpaceOptions) -> SpaceOptions:
    """``o`` with its batch made neutral (one sample, fixed): its training space is the
    technique stacks of ``o``'s, one split each, whatever ``o``'s batch
    (:func:`memfit.plan.search.judged_stacks` keeps them across jobs: issue 32)."""
    return replace(o, per_rank_batch=1, fixed_micro_batch=True)


def offload_layouts(o: SpaceOptions) -> list[dict[str, Any]]:
    """ZeRO-Offload layouts (memory-only, slow): always candidates for training; the planner
    tries them before any result-changing option unless ``--allow-offload`` ranks them with the
    others by speed."""
    if o.mode == "infer":
        return []
    return [
        {"shard": "zero2", "offload": "optimizer"},
        {"shard": "zero3", "offload": "optimizer"},
        {"shard": "zero3", "offload": "params"},
    ]


def candidates(o: SpaceOptions, *, share_parts: bool = True) -> list[Settings]:
    """Every combination the planner considers, unordered (the recipe's and the ones that
    change it; the planner sorts them into memory-only and result-changing ones).
    ``share_parts``: training settings whose technique and layout parts were built already are
    made of those (False: each through the constructor, the reference the tests compare)."""
    out: list[Settings] = []
    if o.mode == "infer":
        quants = [o.quant]
        if o.allow_quant:
            more = ["none", *(["fp8"] if o.supports_fp8 else []), "int8", "int4-awq", "nf4"]
            quants += [q for q in more if q not in quants]
        for layout in _parallel_layouts(o):
            dp = o.gpus // layout["tp"]
            if o.per_rank_batch % dp:
                continue
            for q in quants:
                out.append(
                    Settings(
                        precision=o.recipe_precision,
                        attention=o.attention,
                        quant=q,
                        gpus=o.gpus,
                        micro_batch=max(o.per_rank_batch // dp, 1),
                        **layout,
                    )
                )
        return out
    own = o.recipe_precision
    precisions = (own, PURE_OF[own]) if own in PURE_OF else (own,)
    # each technique part is shared by the stack's layouts, each layout's part by every stack:
    # a part is built (through the Settings constructor, which validates it) once, and the
    # settings of the other combinations made of built parts (issue 32: ~1 000 constructions
    # of ~350 technique parts were most of a full fine-tune's candidate space)
    techs: dict[tuple[Any, ...], TechniqueSpec] = {}
    layouts = _parallel_layouts(o)
    parallels: list[ParallelSpec | None] = [None] * len(layouts)
    for precision in precisions:
        for stack in _train_stacks(o):
            stack_key = tuple(stack.items())
            for i, layout in enumerate(layouts):
                if o.optimizer_in_bwd and (
                    layout.get("shard", "none") != "none" or layout.get("offload", "none") != "none"
                ):
                    continue  # the optimizer step in backward: one plain GPU (not modelled else)
                run_as = precision
                if precision_rules("train", precision, layout["shard"]):
                    if stack.get("lora_rank") is None:
                        continue  # pure 16-bit states do not exist under DeepSpeed ZeRO
                    # an adapter job under ZeRO runs as DeepSpeed's bf16 / fp16 optimizer does:
                    # the 16-bit model, fp32 masters of the adapters (the *-mixed name)
                    run_as = precision.replace("-true", "-mixed")
                for ckpt, loss in _ckpt_losses(o, layout):
                    splits = [
                        (m, accum)
                        for m, accum in micro_batch_splits(o)
                        # with the optimizer step in backward nothing accumulates
                        if not (o.optimizer_in_bwd and accum > 1)
                    ]
                    if not splits:
                        continue
                    kbit = o.prepare_kbit and stack.get("quant", "none") != "none"
                    tech_key = (run_as, ckpt, loss, kbit, stack_key)
                    tech, par = techs.get(tech_key), parallels[i]
                    if tech is None or par is None or not share_parts:
                        first = Settings(
                            precision=run_as,
                            attention=o.attention,
                            checkpointing=ckpt,
                            gpus=o.gpus,
                            micro_batch=splits[0][0],
                            grad_accum=splits[0][1],
                            prepare_kbit=kbit,
                            optimizer_in_bwd=o.optimizer_in_bwd,
                            loss=loss,
                            kernels=o.kernels,
                            **stack,
                            **layout,
                        )
                        techs[tech_key], parallels[i] = first.techniques, first.parallel
                    else:
                        first = Settings.of_parts(tech, par, *splits[0])
                    out.append(first)
                    out += [first.split(m, accum) for m, accum in splits[1:]]
    return out


#: Memory-only training variants beyond the classic three checkpointing modes: checkpoints in
#: host RAM (Unsloth's "unsloth" checkpointing; one GPU without ZeRO, whose offload already
#: uses the host link) and the fused cross-entropy.
HOST_CHECKPOINTING = "offload"
FUSED_LOSS = "fused"


def _ckpt_losses(o: SpaceOptions, layout: dict[str, Any]) -> list[tuple[str, str]]:
    """(checkpointing, loss) pairs of one training layout: the recipe's loss (and the fused one
    where allowed) under no / selective / full checkpointing, and host-RAM checkpoints on one
    GPU without ZeRO offload."""
    losses = [o.loss]
    if o.memory_only_losses and o.loss != FUSED_LOSS:
        losses.append(FUSED_LOSS)
    ckpts = ["none", "selective", "full"]
    if o.host_checkpoints and o.gpus == 1 and layout.get("offload", "none") == "none":
        ckpts.append(HOST_CHECKPOINTING)
    if o.keep_checkpointing:
        ckpts = [o.checkpointing]
    return [(c, loss) for loss in losses for c in ckpts]


def recipe(o: SpaceOptions) -> Settings:
    """The job as asked: its precision, optimizer, attention and adapter, its own checkpointing
    (none unless the job gave one), the whole per-GPU batch at once unless the job gave its split
    (a job file's micro-batch x accumulation), DDP (training) or tensor parallelism over all GPUs
    (inference)."""
    if o.mode == "infer":
        return Settings(
            precision=o.recipe_precision,
            attention=o.attention,
            quant=o.quant,
            gpus=o.gpus,
            tp=o.gpus,
            micro_batch=o.per_rank_batch,
        )
    return Settings(
        precision=o.recipe_precision,
        attention=o.attention,
        quant=o.quant,
        optimizer=o.recipe_optimizer,
        optimizer_in_bwd=o.optimizer_in_bwd,
        loss=o.loss,
        kernels=o.kernels,
        checkpointing=o.checkpointing,
        lora_rank=o.lora_ranks[0] if o.lora_asked and o.lora_ranks else None,
        lora_targets=o.lora_targets if o.lora_asked else "all-linear",
        lora_modules_to_save=o.lora_modules_to_save if o.lora_asked else (),
        lora_dropout=o.lora_dropout if o.lora_asked else 0.0,
        gpus=o.gpus,
        shard="ddp" if o.gpus > 1 else "none",
        micro_batch=_asked_split(o)[0],
        grad_accum=_asked_split(o)[1],
    )


def _asked_split(o: SpaceOptions) -> tuple[int, int]:
    """The recipe's (micro-batch, accumulation): the job's own split where it gave one (a job
    file's), else the whole per-GPU batch at once."""
    micro = o.asked_micro_batch
    if micro is None or micro < 1 or o.per_rank_batch % micro:
        return o.per_rank_batch, 1
    return micro, o.per_rank_batch // micro


#: The job as asked (the plan's baseline; the name before the recipe-first planner).
naive = recipe

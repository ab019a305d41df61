"""The job as asked, and what a plan changes about it: memory-only or result-changing.

The planner starts from the user's recipe (precision, optimizer, full fine-tuning or LoRA, no
freezing, 16-bit weights) and changes only what it must. Every difference between a plan and the
recipe is a :class:`Change`, of one of two kinds:

* ``memory-only``: the maths of the step stays the same — activation checkpointing, micro-batch x
  gradient accumulation, SDPA / FlashAttention kernels, ZeRO / FSDP sharding, offload to host
  RAM, tensor parallelism, the fused AdamW kernel for AdamW;
* ``changes the result``: what is trained or how its numbers round — quantized base weights,
  LoRA instead of full fine-tuning, frozen layers, 8-bit or factored optimizer states, pure
  16-bit weights without fp32 masters (``bf16-true`` for a ``bf16-mixed`` recipe). Each belongs
  to one family of :data:`ALLOW`, the names ``memfit plan --allow`` takes.

The quality risk of a plan is computed from its result-changing changes only (the recipe's own
choices are the user's): the sum of their points (:data:`RISKS`), capped at ``high`` — so three
reasons are never ``low``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError

#: Ordered quality-risk scale (index = level).
RISK_LEVELS = ("none", "low", "medium", "high")

MEMORY_ONLY, CHANGES_RESULT = "memory-only", "changes the result"

#: The result-changing families ``--allow`` names, with what each allows.
ALLOW: dict[str, str] = {
    "quant": "8-bit / 4-bit / fp8 base weights (int8, nf4-dq, fp8; QLoRA with lora)",
    "lora": "LoRA adapters instead of full fine-tuning",
    "freeze": "the lower half of the layers frozen",
    "8bit-optim": "8-bit AdamW states (bitsandbytes, block-wise)",
    "optim": "another optimizer (Adafactor: factored second moment, no momentum)",
    "pure-bf16": "16-bit weights and optimizer states without fp32 masters (bf16-true / 16-true "
    "for a full fine-tune; an adapter job's frozen base in 16 bits is memory-only)",
}
#: ``--allow`` presets: ``any`` every family, ``none`` (the default) memory-only changes only.
ALLOW_PRESETS: dict[str, tuple[str, ...]] = {"any": tuple(ALLOW), "none": ()}

#: Risk points of each result-changing change, with the reason shown. Sources: Zamirai et al.
#: 2020 (pure bf16 training loses small updates without fp32 masters / stochastic rounding),
#: Micikevicius et al. 2018 (fp16 without loss scaling or masters underflows), Dettmers et al.
#: 2022 (block-wise 8-bit optimizers match 32-bit Adam on their benchmarks), Shazeer & Stern
#: 2018 (Adafactor drops the first moment; needs its own learning-rate schedule), Hu et al. 2021
#: and Biderman et al. 2024 (LoRA matches full fine-tuning on many tasks, learns less on others),
#: Dettmers et al. 2023 (QLoRA: NF4 base weights recover 16-bit fine-tuning on their benchmarks).
RISKS: dict[tuple[str, str], tuple[int, str]] = {
    ("precision", "bf16-true"): (1, "bf16 weights without fp32 master copy: tiny updates are lost"),
    ("precision", "16-true"): (3, "fp16 without loss scaling or fp32 masters: gradients underflow"),
    ("optimizer", "adamw-8bit"): (1, "8-bit optimizer states (block-wise quantized)"),
    ("optimizer", "paged-adamw-8bit"): (1, "8-bit optimizer states (block-wise quantized)"),
    ("optimizer", "adafactor"): (2, "Adafactor: factored 2nd moment, no momentum; retune the LR"),
    ("optimizer", "lion"): (2, "Lion: sign updates; needs a smaller LR than AdamW"),
    ("optimizer", "muon"): (
        2,
        "Muon: orthogonalized momentum on the hidden matrices; retune the LR",
    ),
    ("adapter", "lora"): (1, "LoRA adapters instead of full fine-tuning"),
    ("adapter", "lora-small"): (2, "LoRA rank < 16: less capacity than full fine-tuning"),
    ("adapter", "freeze"): (1, "lower half of the layers frozen"),
    ("quant", "int8"): (1, "8-bit base weights (LLM.int8): check quality on your eval set"),
    ("quant", "fp8"): (1, "fp8 base weights (per-tensor scales): check quality"),
    ("quant", "nf4"): (2, "4-bit base weights: check quality on your eval set"),
    ("quant", "nf4-dq"): (2, "4-bit base weights: check quality on your eval set"),
    ("quant", "fp4"): (3, "FP4 base weights: worse than NF4 (QLoRA paper, Table 2)"),
    ("quant", "int4-awq"): (2, "4-bit AWQ weights: check quality on your eval set"),
    ("quant", "int4-gptq"): (2, "4-bit GPTQ weights: check quality on your eval set"),
}
#: Optimizers with the same update as AdamW (the fused kernel: one launch, same maths).
SAME_MATHS_AS: dict[str, tuple[str, ...]] = {
    "adamw": ("adamw", "adamw-fused"),
    "adamw-fused": ("adamw", "adamw-fused"),
}
#: bitsandbytes' paged 32-bit AdamW runs AdamW's update with fp32 states (paging moves them, it
#: changes no value): the same maths as AdamW
SAME_MATHS_AS["paged-adamw-32bit"] = ("paged-adamw-32bit", "adamw", "adamw-fused")
#: The family each result-changing optimizer belongs to.
OPTIMIZER_FAMILY = {"adamw-8bit": "8bit-optim", "paged-adamw-8bit": "8bit-optim"}


def parse_allow(values: Any) -> frozenset[str]:
    """``--allow quant,lora`` (repeatable, or a preset) as a set of :data:`ALLOW` families."""
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    names: set[str] = set()
    bad: list[str] = []
    for value in values:
        for name in (v.strip() for v in str(value).split(",")):
            if not name:
                continue
            if name in ALLOW_PRESETS:
                names.update(ALLOW_PRESETS[name])
            elif name in ALLOW:
                names.add(name)
            else:
                bad.append(name)
    if bad:
        raise SpecError(
            f"allow ({', '.join(bad)}) must name {', '.join(ALLOW)} or a preset "
            f"({', '.join(ALLOW_PRESETS)}), comma-separated"
        )
    return frozenset(names)


@dataclass(frozen=True, kw_only=True)
class Change:
    """One difference between a plan and the job as asked. ``family``: the :data:`ALLOW` name of
    a result-changing change (None for memory-only ones); ``risk``: its points."""

    what: str
    kind: str
    family: str | None = None
    risk: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"change": self.what, "kind": self.kind}
        if self.family is not None:
            out.update(family=self.family, reason=self.reason)
        return out


def _result(what: str, family: str, key: tuple[str, str]) -> Change:
    risk, reason = RISKS.get(key, (1, what))
    return Change(what=what, kind=CHANGES_RESULT, family=family, risk=risk, reason=reason)


def changes(s: Any, recipe: Any, mode: str, *, asked_ranks: tuple[int, ...] = ()) -> list[Change]:
    """What ``s`` (a plan's :class:`~memfit.plan.space.Settings`) changes about ``recipe`` (the
    job as asked), result-changing ones first. ``asked_ranks``: LoRA ranks the user asked for."""
    head, tail = stack_changes(s, recipe, mode, asked_ranks=asked_ranks)
    return [*head, *split_change(s, recipe, mode), *tail]


def stack_changes(
    s: Any, recipe: Any, mode: str, *, asked_ranks: tuple[int, ...] = ()
) -> tuple[list[Change], list[Change]]:
    """:func:`changes` but the batch split's, which goes between the two lists: what the
    technique stack of ``s`` changes (the same for every micro-batch split of the stack)."""
    out: list[Change] = []
    if s.precision != recipe.precision and not frozen_base_cast(s, recipe):
        out.append(_result(f"precision {s.precision}", "pure-bf16", ("precision", s.precision)))
    if s.quant != recipe.quant and s.quant == "none":
        out.append(
            Change(
                what=f"16-bit base weights instead of {recipe.quant}",
                kind=CHANGES_RESULT,
                family="quant",
                risk=0,
                reason="16-bit base weights: no quantization error",
            )
        )
    elif s.quant != recipe.quant:
        out.append(_result(f"{s.quant} base weights", "quant", ("quant", s.quant)))
    if mode == "train":
        out += _training_changes(s, recipe, asked_ranks)
    out += _memory_changes(s, recipe, mode)
    return out, _layout_changes(s, recipe)


def _training_changes(s: Any, recipe: Any, asked_ranks: tuple[int, ...]) -> list[Change]:
    out: list[Change] = []
    if s.lora_rank is not None and recipe.lora_rank is None:
        key = ("adapter", "lora" if s.lora_rank >= 16 else "lora-small")
        out.append(_result(f"LoRA r{s.lora_rank} instead of full fine-tuning", "lora", key))
    elif s.lora_rank is not None and s.lora_rank not in asked_ranks + (recipe.lora_rank,):
        out.append(_result(f"LoRA r{s.lora_rank}", "lora", ("adapter", "lora-small")))
    if s.freeze_layers != recipe.freeze_layers:
        out.append(_result(f"freeze {s.freeze_layers} layers", "freeze", ("adapter", "freeze")))
    same = SAME_MATHS_AS.get(recipe.optimizer, (recipe.optimizer,))
    if s.optimizer not in same:
        family = OPTIMIZER_FAMILY.get(s.optimizer, "optim")
        out.append(_result(f"optimizer {s.optimizer}", family, ("optimizer", s.optimizer)))
    return out


def frozen_base_cast(s: Any, recipe: Any) -> bool:
    """``s`` differs from the recipe only in how an adapter job stores its frozen base:
    ``bf16-true`` (the base in bf16) against ``bf16-mixed`` (an fp32 base under autocast, or
    under DeepSpeed ZeRO its bf16 model with fp32 masters of what trains), and the same for
    fp16. A memory-only change: autocast runs the base's matmuls on 16-bit copies of the
    weights either way, and peft keeps the adapters, their gradients and optimizer states in
    fp32 (``autocast_adapter_dtype``), so what is trained and how it is updated stay the same;
    only the frozen norms round to 16 bits."""
    if s.lora_rank is None or s.precision == recipe.precision:
        return False
    pair = {str(s.precision).rsplit("-", 1)[0], str(recipe.precision).rsplit("-", 1)[0]}
    kinds = {str(s.precision).rsplit("-", 1)[1], str(recipe.precision).rsplit("-", 1)[1]}
    return len(pair) == 1 and kinds == {"mixed", "true"}


#: How a memory-only change of checkpointing / loss reads (rules.CHECKPOINTING, rules.LOSSES).
CHECKPOINTING_CHANGE = {
    "none": "no activation checkpointing",
    "offload": "full activation checkpointing with the checkpoints in host RAM (Unsloth "
    'use_gradient_checkpointing="unsloth")',
}
LOSS_CHANGE = {
    "full": "the full-logits cross-entropy",
    "chunked": "chunked cross-entropy (torchtune LinearCrossEntropyLoss)",
    "fused": "fused linear cross-entropy (Liger's LigerFusedLinearCrossEntropyLoss, Unsloth's "
    "fused CE: the same loss, no logits kept)",
}


def _memory_changes(s: Any, recipe: Any, mode: str) -> list[Change]:
    found: list[str] = []
    if mode == "train" and frozen_base_cast(s, recipe):
        found.append(f"precision {s.precision} (how the frozen base is stored; adapters stay fp32)")
    if mode == "train" and s.optimizer != recipe.optimizer and s.optimizer in SAME_MATHS_AS:
        kernel = "one fused kernel" if s.optimizer.endswith("-fused") else "foreach kernels"
        found.append(f"optimizer {s.optimizer} (same update, {kernel})")
    if s.attention != recipe.attention:
        found.append(f"attention {s.attention}")
    if mode == "train" and s.checkpointing != recipe.checkpointing:
        found.append(CHECKPOINTING_CHANGE.get(s.checkpointing, "{} activation checkpointing"))
        found[-1] = found[-1].format(s.checkpointing)
    if mode == "train" and getattr(s, "loss", "full") != getattr(recipe, "loss", "full"):
        found.append(LOSS_CHANGE[s.loss])
    return [Change(what=w, kind=MEMORY_ONLY) for w in found]


def split_change(s: Any, recipe: Any, mode: str) -> list[Change]:
    """The change of the batch split, if any (memory-only)."""
    if (s.micro_batch, s.grad_accum) == (recipe.micro_batch, recipe.grad_accum):
        return []
    what = (
        f"micro-batch {s.micro_batch} x {s.grad_accum} accumulation steps"
        if mode == "train"
        else f"{s.micro_batch} requests per replica"
    )
    return [Change(what=what, kind=MEMORY_ONLY)]


def _layout_changes(s: Any, recipe: Any) -> list[Change]:
    found: list[str] = []
    if s.shard != recipe.shard:
        found.append(f"shard {s.shard}")
    if s.offload != recipe.offload:
        found.append(f"offload {s.offload} to host RAM")
    if s.tp != recipe.tp:
        found.append(f"tensor parallel {s.tp}")
    return [Change(what=w, kind=MEMORY_ONLY) for w in found]


def quality_risk(found: list[Change]) -> tuple[int, tuple[str, ...]]:
    """The risk level of a plan's changes: the sum of the result-changing ones' points, capped
    at ``high``, with their reasons (memory-only changes carry none)."""
    risky = [c for c in found if c.kind == CHANGES_RESULT]
    level = min(sum(c.risk for c in risky), len(RISK_LEVELS) - 1)
    return level, tuple(c.reason for c in risky)


def families(found: list[Change]) -> frozenset[str]:
    """The :data:`ALLOW` families a plan's changes need."""
    return frozenset(c.family for c in found if c.family is not None)

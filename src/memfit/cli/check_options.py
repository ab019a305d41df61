"""The fix that changes the result, weighed against the memory-only one (``memfit check``).

A LoRA job whose memory-only fix is slow or missing is run, in practice, as QLoRA: the base
loaded in 4 bits (LLaMA-Factory's ``quantization_bit: 4``, axolotl's ``adapter: qlora`` +
``load_in_4bit``, TRL's ``load_in_4bit``, LitGPT's ``quantize: bnb.nf4-dq``). That changes the
result, so :func:`memfit.cli.check_fix.find_fix` never offers it; this module asks the planner
for it the way ``memfit plan --allow quant`` does (the same request as the memory-only fix, with
``quant`` allowed), writes it in the files' own keys, checks the edited files as the fix is
checked, and prices both (the planner's roofline: step time and $ per 1 M tokens).

The order is the planner's (:func:`memfit.plan.search._Search._weigh_offload`): memory-only
first, unless it offloads to host RAM on one GPU (the last resort there) or is predicted
:data:`~memfit.plan.search.SLOWDOWN_LIMIT` times the result-changing fix's step time. The
result-changing fix is written only where the user asks for it (``--allow quant``); otherwise it
is named beside the memory-only one (or instead of "nothing fits"), with the command that
writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit.cli.check_fix import (
    CheckFix,
    EstimateJob,
    checked_fix,
    fix_variants,
    kept_fields,
    recipe_request,
    wanted_fields,
)
from memfit.errors import MemfitError
from memfit.hardware import get_gpu
from memfit.hardware.precision import precision_on
from memfit.jobfiles import Job, plan_edits
from memfit.plan import plan
from memfit.plan.cost import ModelFacts, Rates, train_step_cost, trainable_fraction
from memfit.plan.search import SLOWDOWN_LIMIT
from memfit.plan.space import Settings
from memfit.report.plan import usd_per_million_tokens_on
from memfit.spec import WorkloadSpec

#: The result-changing families ``memfit check --allow`` takes (``memfit plan --allow``'s names):
#: the ones a job file says in its own keys.
CHECK_FAMILIES = ("quant",)
#: The planner's result-changing plans (and their micro-batch-1 splits) checked on edited files,
#: at most.
MAX_RESULT_CHECKED = 4


@dataclass(frozen=True, kw_only=True)
class Price:
    """The planner's roofline of one optimizer step (memory.plan.cost): seconds, and $ per 1 M
    tokens on on-demand GPUs (None: the GPU has no price)."""

    step_s: float
    usd_per_mtok: float | None

    def text(self) -> str:
        usd = "" if self.usd_per_mtok is None else f", ${self.usd_per_mtok:.2f} per 1M tokens"
        return f"predicted {self.step_s:.3g} s/step{usd}"

    def to_json(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "usd_per_million_tokens": self.usd_per_mtok}


def price(source: Any, w: WorkloadSpec | None, n_params: int, gpu_name: str) -> Price | None:
    """The planner's step time and $ of workload ``w`` on ``gpu_name`` (None: not a training job,
    or a GPU without rates): the cost model the plan's side-by-side table prints, with the
    parameter count of the job's estimate (as the planner takes its baseline's)."""
    if w is None or w.mode != "train" or source is None:
        return None
    try:
        gpu = get_gpu(gpu_name)
        rates = Rates.of(gpu)
    except MemfitError:
        return None
    s = Settings.of(replace(w, precision=precision_on(str(w.precision), gpu)))
    facts = ModelFacts.from_spec(source.spec, n_params)
    cost = train_step_cost(
        s, facts, rates, seq_len=w.seq_len, trainable_fraction=trainable_fraction(s, facts)
    )
    usd = usd_per_million_tokens_on(gpu_name, w.gpus, cost.tokens_per_s)
    return Price(step_s=cost.step_s, usd_per_mtok=usd)


def quantizable(workload: WorkloadSpec) -> bool:
    """A LoRA job on an unquantized base: QLoRA is its result-changing fix."""
    return workload.mode == "train" and workload.lora_rank is not None and workload.quant == "none"


def quant_fix(
    job: Job,
    source: Any,
    workload: WorkloadSpec,
    gpu: str,
    estimate_job: EstimateJob,
    *,
    keep_checkpointing: bool,
) -> CheckFix | None:
    """The planner's first plan with a quantized base (``--allow quant``) that changes nothing
    else the files chose, written in their keys, whose edited files fit (None: none)."""
    request = replace(
        recipe_request(workload, keep_checkpointing=keep_checkpointing),
        allow_quant=True,
        allow=frozenset({"quant"}),
    )
    result = plan(source, request, gpu=gpu)
    options = [] if result.recommended is None else [result.recommended, *result.alternatives]
    set_by = {name: st.file for name, st in job.fields.items()}
    n_checked, seen = 0, set()
    for o in options:
        s = o.settings
        families = {c.family for c in o.changes} - {None}
        if s.quant == "none" or families != {"quant"} or set(kept_fields(s, workload)) != {"quant"}:
            continue  # a plan that changes more than the base's format (8-bit states ...)
        if o.fits is False:
            continue
        planned = fix_variants({**wanted_fields(s, workload), "quant": s.quant}, workload)
        for wanted in planned + _smaller(planned[-1], workload, keep_checkpointing):
            edits, unexpressed = plan_edits(job.files, wanted, set_by)
            if any(u.startswith("quant=") for u in unexpressed):
                return None  # these files cannot say a quantized base
            if unexpressed:
                wanted = {k: v for k, v in wanted.items() if f"{k}={v}" not in unexpressed}
                edits, _ = plan_edits(job.files, wanted, set_by)
            diff = "".join(e.diff() for e in edits)
            if not edits or diff in seen or n_checked >= MAX_RESULT_CHECKED:
                continue
            seen.add(diff)
            n_checked += 1
            fixed = checked_fix(job, edits, wanted, workload, estimate_job, s.describe())
            new_quant = fixed.changes.get("quant", (None, "none"))[1]
            if "kernels" in fixed.changes or new_quant == "none":
                continue
            if fixed.estimate is not None and fixed.estimate.fits and fixed.estimate.fits.fits:
                # the report prefixes each with "changes the result: " (report/check.py)
                labels = tuple(
                    f"{c.what} ({c.reason})" if c.reason else c.what
                    for c in o.changes
                    if c.family is not None
                )
                return replace(fixed, result_changes=labels)
    return None


def _smaller(
    wanted: dict[str, Any], workload: WorkloadSpec, keep_checkpointing: bool
) -> list[dict[str, Any]]:
    """The planned QLoRA change at micro-batch 1 (the same samples per step), then with full
    checkpointing too: where the edited files' estimate finds the planner's split only tight."""
    per_step = workload.batch_size * workload.grad_accum
    one = {**wanted, "batch_size": 1, "grad_accum": per_step}
    out = [one] if keep_checkpointing else [one, {**one, "checkpointing": "full"}]
    return [{k: v for k, v in w.items() if getattr(workload, k) != v} for w in out]


def with_result_changing(
    fix: CheckFix,
    job: Job,
    source: Any,
    workload: WorkloadSpec,
    n_params: int,
    gpu: str,
    estimate_job: EstimateJob,
    *,
    allow: frozenset[str],
    keep_checkpointing: bool,
) -> CheckFix:
    """``fix`` (memory-only, or only a message), weighed against the QLoRA fix (module
    docstring): the one that comes first is returned, the other in its ``other``."""
    if source is None or not quantizable(workload):
        return fix
    memory = fix
    if fix.found and fix.estimate is not None:
        memory = replace(fix, price=price(source, fix.workload, n_params, gpu))
    if memory.found and memory.price is None:
        return memory
    quant = quant_fix(
        job, source, workload, gpu, estimate_job, keep_checkpointing=keep_checkpointing
    )
    if quant is None:
        return memory
    quant = replace(quant, price=price(source, quant.workload, n_params, gpu))
    slow = _slower(memory, quant)
    if memory.found and slow is None:
        return memory  # memory-only first: the result-changing fix is not needed
    files = " ".join(f.path for f in job.files)
    hint = f"written by: memfit check {files} --gpu {gpu} --allow quant --write"
    if "quant" in allow:
        why = (
            f"QLoRA (--allow quant) first: {slow}"
            if memory.found
            else "no change that keeps the files' choices fits; --allow quant: the base in 4 bits"
        )
        return replace(quant, other=memory if memory.found else None, why=why)
    if memory.found:
        return replace(memory, other=quant, why=f"a QLoRA fix is faster: {slow} ({hint})")
    return replace(memory, other=quant, why=hint)


def _slower(memory: CheckFix, quant: CheckFix) -> str | None:
    """Why the memory-only fix gives way (None: it does not): host-RAM offload on one GPU, or
    :data:`SLOWDOWN_LIMIT` times the QLoRA fix's step time."""
    if not memory.found or memory.price is None or quant.price is None:
        return "no memory-only change fits" if not memory.found else None
    w = memory.workload
    ratio = memory.price.step_s / max(quant.price.step_s, 1e-12)
    if w is not None and w.offload != "none" and w.gpus == 1:
        return f"the memory-only fix offloads to host RAM on one GPU ({ratio:.1f}x the step time)"
    if ratio >= SLOWDOWN_LIMIT:
        return f"the memory-only fix is predicted {ratio:.1f}x the step time"
    return None


__all__ = ["CHECK_FAMILIES", "Price", "price", "quant_fix", "with_result_changing"]

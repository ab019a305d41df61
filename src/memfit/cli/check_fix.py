"""The fix ``memfit check`` offers for the user's own files, and the check that it holds.

1. The planner is asked for plans that keep the job's recipe (:func:`recipe_request`): its
   precision, optimizer, attention, and its adapter — full fine-tuning stays full
   (``keep_full_finetune``), LoRA stays LoRA at the file's rank (``lora_asked``,
   ``lora_ranks=(rank,)``), and quantization is searched only when the file quantizes
   (``allow_quant``, ``allow={"quant"}``: the file's own 4-/8-bit base is then no change to rank
   down).
2. A plan is offered only if it keeps what the file chose (:data:`KEPT`: LoRA / QLoRA, the
   quantization, frozen layers, precision) and every change it makes is a key these files have
   (:func:`memfit.jobfiles.plan_edits`); the others are remembered to say what would fit.
3. The edited texts are read back as memfit reads any file (:func:`memfit.jobfiles.files.reread`)
   and estimated by the same route as the job itself: the fix is that estimate's verdict, and
   its changes are what the edited files read as, so the change printed, the diff written and
   the verdict of a later ``memfit check`` on the written files are one thing. The first plan
   whose edited files fit is the fix, then the job as written at micro-batch 1 (with and without
   checkpointing); none: no fix is offered, nothing is written, and the answer says what was
   closest and what would fit (a plan the files cannot say, or one that changes what they chose,
   or a GPU with more memory).

Planner behaviour relied on (memfit.plan.space / search): with ``lora_asked`` only LoRA stacks at
``lora_ranks`` are searched; with ``keep_full_finetune`` no LoRA / freezing; quantized stacks only
with ``allow_quant``; the global batch is held and split into micro-batch x accumulation; layouts
come from the GPU count (a file's ZeRO stage on one GPU is not in the plan: kept, see
:func:`wanted_fields`). Anything else a plan changes is filtered here, not trusted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.hardware.precision import FP16_COUNTERPART
from memfit.jobfiles import FileEdit, Job, plan_edits
from memfit.jobfiles.files import reread
from memfit.jobfiles.reader import MISSING
from memfit.plan import PlanRequest, plan
from memfit.plan.recipe import frozen_base_cast
from memfit.plan.request import job_request
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import sharded_save_offloads
from memfit.units import format_bytes

#: Settings a fix may change, in the order they are printed: the batch split and memory-only
#: techniques the files can say.
FIX_FIELDS = (
    "batch_size",
    "grad_accum",
    "checkpointing",
    "attention",
    "optimizer",
    "offload",
    "shard",
)
#: What the user chose and a fix never changes: a plan that would is not offered (LoRA / QLoRA
#: never becomes a full fine-tune, a quantized base is never un-quantized, Unsloth's kernels are
#: never swapped for transformers' and peft's).
KEPT = ("lora_rank", "quant", "freeze_layers", "precision", "kernels")
#: 4-bit bitsandbytes bases: the planner searches NF4 with double quantization for all of them.
FOUR_BIT = frozenset({"nf4", "nf4-dq", "fp4"})
#: The planner's plans checked by re-reading and estimating their edited files, at most (each is
#: one estimate of the job's own route: milliseconds with the analytic engine, seconds with a
#: trace); the two smallest splits of the job as written are checked after them in any case.
MAX_CHECKED = 6

#: ``(job, workload) -> (workload, estimate)``: the route ``memfit check`` estimates a job by
#: (``workload`` None: the one the job's files describe).
EstimateJob = Callable[[Job, WorkloadSpec | None], tuple[WorkloadSpec, MemoryEstimate]]


@dataclass(frozen=True, kw_only=True)
class KeyChange:
    """One key of one file the fix sets: ``old`` is None when the file lacks it."""

    file: str
    key: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.key}: {_show(self.old)} → {_show(self.new)}"


@dataclass(frozen=True, kw_only=True)
class CheckFix:
    """The fix of a job that does not fit. ``edits`` / ``keys``: the edit of each file and the
    keys it sets (empty: no fix); ``changes``: memfit setting → (before, after), as the edited
    files read; ``estimate``: the edited files' estimate; ``plan``: the planner's plan it comes
    from; ``message``: why there is no fix and what would fit (None when there is one)."""

    edits: list[FileEdit] = field(default_factory=list)
    keys: list[KeyChange] = field(default_factory=list)
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    estimate: MemoryEstimate | None = None
    plan: str | None = None
    message: str | None = None
    unexpressed: list[str] = field(default_factory=list)
    #: the edited files' workload (None: no edit was estimated)
    workload: WorkloadSpec | None = None
    #: the planner's cost of the edited files' step (:mod:`memfit.cli.check_options`)
    price: Any = None
    #: what the fix changes of the result (empty: memory-only), each with the planner's reason
    result_changes: tuple[str, ...] = ()
    #: the other fix weighed against this one (memory-only vs result-changing), named beside it
    other: CheckFix | None = None
    #: why this fix comes first, and how to take the other one
    why: str | None = None

    @property
    def found(self) -> bool:
        return bool(self.edits)

    @property
    def refused(self) -> bool:
        return any(e.refused is not None for e in self.edits)


def recipe_request(workload: WorkloadSpec, *, keep_checkpointing: bool = False) -> PlanRequest:
    """The planner's request for the job the files describe, keeping its recipe: the request
    every described job takes to the planner (:func:`memfit.plan.request.job_request`: its
    LoRA, weight format, loss and kernels — Unsloth's with their checkpointing), with full
    fine-tuning kept full, quantization searched only where the files quantize, and no change
    that needs another library's kernels (a fused loss, host-RAM checkpoints: no key of these
    files says them) unless the job runs them already. ``keep_checkpointing``: the files cannot
    change the job's checkpointing (LLaMA-Factory's ``use_unsloth`` sets Unsloth's whatever
    they say), so no plan changes it."""
    lora = workload.lora_rank
    quantized = workload.quant != "none"
    return job_request(
        workload,
        optimizer=workload.optimizer if workload.optimizer != "none" else None,
        keep_full_finetune=lora is None,
        allow_quant=quantized,
        allow=frozenset({"quant"}) if quantized else frozenset(),
        n_alternatives=2 * MAX_CHECKED,
        other_kernels=False,
        keep_checkpointing=keep_checkpointing,
    )


def checkpointing_fixed(job: Job) -> bool:
    """The files' checkpointing is the kernels' (set by the key that sets ``kernels``, as
    LLaMA-Factory's ``use_unsloth`` sets Unsloth's offloaded checkpoints): no edit of a
    checkpointing key changes it."""
    ckpt, kernels = job.fields.get("checkpointing"), job.fields.get("kernels")
    return (
        ckpt is not None
        and kernels is not None
        and (ckpt.file, ckpt.key) == (kernels.file, kernels.key)
    )


def find_fix(
    job: Job, source: Any, workload: WorkloadSpec, gpu: str, estimate_job: EstimateJob
) -> CheckFix:
    """The least costly plan, in the files' own keys, whose edited files fit (see the module
    docstring), or a :class:`CheckFix` with only a message."""
    ckpt_fixed = checkpointing_fixed(job)
    result = plan(source, recipe_request(workload, keep_checkpointing=ckpt_fixed), gpu=gpu)
    options = [] if result.recommended is None else [result.recommended, *result.alternatives]
    planned = [
        (_how(o.settings, wanted, workload), wanted, kept_fields(o.settings, workload), False)
        for o in options
        for wanted in fix_variants(wanted_fields(o.settings, workload), workload)
    ]
    # the planner's step time of each plan tried, to show beside a plan that is not offered
    step_of = {
        _how(o.settings, wanted, workload): o.cost.step_s
        for o in options
        for wanted in fix_variants(wanted_fields(o.settings, workload), workload)
    }
    splits = [(*t, True) for t in _smallest_splits(workload, keep_checkpointing=ckpt_fixed)]
    tries = planned + splits
    if workload.checkpointing not in PLANNED_CHECKPOINTING:
        # the files' checkpointing is one the planner does not search (torchtitan's per-op
        # selective, a per-layer policy): its plans would swap it for another, the job as
        # written at micro-batch 1 keeps it, so that smaller change is tried first
        tries = splits[:1] + planned + splits[1:]
    tries = _full_state_dict_tries(tries, workload)
    if workload.optimizer_in_bwd:  # each parameter steps in backward: no accumulation
        tries = [t for t in tries if t[1].get("grad_accum", workload.grad_accum) == 1]
    set_by = {name: st.file for name, st in job.fields.items()}
    not_kept: list[str] = []
    not_said: list[tuple[str, list[str]]] = []
    closest: CheckFix | None = None
    seen: set[str] = set()
    n_checked = 0
    for how, wanted, kept, last in tries:
        edits, unexpressed = plan_edits(job.files, wanted, set_by)
        if kept:
            changed = ", ".join(f"{k} {getattr(workload, k)} → {v}" for k, v in kept.items())
            cannot = f"; needs {', '.join(unexpressed)}, which these files cannot say" * bool(
                unexpressed
            )
            step = f"; predicted {step_of[how]:.3g} s/step" if how in step_of else ""
            not_kept.append(f"{how} (changes {changed}{cannot}{step})")
            continue
        if unexpressed:
            # what the files cannot say (a fused optimizer kernel torchtune names by class, a
            # ZeRO stage with no DeepSpeed file) is left as the files have it: the edit of the
            # rest is offered if the edited files fit without it
            step = f" (predicted {step_of[how]:.3g} s/step)" if how in step_of else ""
            not_said.append((how + step, unexpressed))
            wanted = {k: v for k, v in wanted.items() if f"{k}={v}" not in unexpressed}
            edits, _ = plan_edits(job.files, wanted, set_by)
        diff = "".join(e.diff() for e in edits)
        if not edits or diff in seen or (n_checked >= MAX_CHECKED and not last):
            continue
        seen.add(diff)
        n_checked += 1
        fixed = checked_fix(job, edits, wanted, workload, estimate_job, how)
        if "kernels" in fixed.changes:  # never offered: the edited files run other kernels
            continue
        if fixed.estimate is not None and fixed.estimate.fits is not None:
            if fixed.estimate.fits.fits:
                return fixed
            if closest is None or _used(fixed) < _used(closest):
                closest = fixed
    return CheckFix(message=_no_fix(job, workload, gpu, not_kept, not_said, closest))


#: The state-dict type a fix may switch an FSDP1 job's checkpoint to: FULL_STATE_DICT gathers
#: one unit at a time to rank 0's CPU, where SHARDED_STATE_DICT under accelerate < 0.31 copies
#: each rank's chunk of every parameter on the GPU (memfit.estimate.fsdp1_save). The training
#: step is the same; the checkpoint is one file written by rank 0.
FULL_SAVE = {"fsdp_state_dict_type": "FULL_STATE_DICT"}


def _full_state_dict_tries(
    tries: list[tuple[str, dict[str, Any], dict[str, Any], bool]], workload: WorkloadSpec
) -> list[tuple[str, dict[str, Any], dict[str, Any], bool]]:
    """For a job that saves with SHARDED_STATE_DICT: first the checkpoint as FULL_STATE_DICT
    alone (the step unchanged), then each try as it was and with FULL_STATE_DICT."""
    if workload.fsdp_state_dict_type != "SHARDED_STATE_DICT" or sharded_save_offloads(
        workload.accelerate_version
    ):
        return tries
    how = "checkpoint as FULL_STATE_DICT"
    out: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [(how, dict(FULL_SAVE), {}, True)]
    for t_how, wanted, kept, last in tries:
        out.append((t_how, wanted, kept, last))
        out.append((f"{t_how}, {how}", {**wanted, **FULL_SAVE}, kept, last))
    return out


def _how(s: Any, wanted: dict[str, Any], workload: WorkloadSpec) -> str:
    """The plan a try comes from, as tried: with the files' own precision where the try keeps
    the adapter job's load dtype (:func:`fix_variants`)."""
    if "precision" not in wanted and frozen_base_cast(s, workload):
        s = replace(s, precision=workload.precision)
    return str(s.describe())


def fix_variants(wanted: dict[str, Any], workload: WorkloadSpec) -> list[dict[str, Any]]:
    """A plan's changes, first without a swap between AdamW and its fused kernel (the same
    update: the planner picks the kernel it predicts faster, and the file's own choice is kept
    when the edit fits without the swap) and without loading an adapter job's base in 16 bits,
    then as planned."""
    same = ("adamw", "adamw-fused")
    out = [wanted]
    if wanted.get("optimizer") in same and workload.optimizer in same:
        out.insert(0, {k: v for k, v in wanted.items() if k != "optimizer"})
    if "precision" in wanted:
        # the frozen base's 16-bit load (memory-only) only where the plan needs it: first the
        # same changes keeping the files' load dtype
        out = [{k: v for k, v in w.items() if k != "precision"} for w in out] + out
    return out


def _used(fix: CheckFix) -> int:
    return 0 if fix.estimate is None else fix.estimate.device_used_bytes


#: The checkpointing modes the planner searches (memfit.plan.space._ckpt_losses); a file's other
#: mode is kept by its first try (:func:`find_fix`).
PLANNED_CHECKPOINTING = frozenset({"none", "selective", "full", "offload"})


def _smallest_splits(
    workload: WorkloadSpec, *, keep_checkpointing: bool = False
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The last tries, after the planner's plans: the job as written at micro-batch 1 (the same
    samples per step), then with full activation checkpointing too (unless the files'
    checkpointing is the kernels', :func:`_checkpointing_fixed`). A planner's plan may need a
    change the files cannot say; these need only the batch keys (and checkpointing)."""
    per_step = workload.batch_size * workload.grad_accum
    split: dict[str, Any] = {"batch_size": 1, "grad_accum": per_step}
    out: list[tuple[str, dict[str, Any]]] = [(f"micro-batch 1 x {per_step}", split)]
    if not keep_checkpointing:
        full = {**split, "checkpointing": "full"}
        out.append((f"micro-batch 1 x {per_step}, full checkpointing", full))
    return [(how, {k: v for k, v in w.items() if getattr(workload, k) != v}, {}) for how, w in out]


def kept_fields(s: Any, workload: WorkloadSpec) -> dict[str, Any]:
    """What plan settings ``s`` would change of the user's choices (:data:`KEPT`)."""
    out: dict[str, Any] = {}
    for name in KEPT:
        new, old = getattr(s, name), getattr(workload, name)
        if name == "quant" and new in FOUR_BIT and old in FOUR_BIT:
            continue  # the file's own 4-bit base: kept as written
        if name == "precision" and FP16_COUNTERPART.get(old) == new:
            continue  # planned in fp16 on a GPU without bf16 (same bytes): the estimate says so
        if name == "precision" and frozen_base_cast(s, workload):
            continue  # an adapter job's frozen base loaded in 16 bits: memory-only (wanted_fields)
        if new != old:
            out[name] = new
    return out


def wanted_fields(s: Any, workload: WorkloadSpec) -> dict[str, Any]:
    """The changes plan settings ``s`` make to the files' job. A layout the files ask for and
    the plan lacks (ZeRO on one GPU, an offload) is kept: the planner builds its layouts from
    the GPU count, not from the files, and taking memory-saving layouts away never helps a job
    fit (the edited files' estimate says whether the plan fits with them)."""
    new = {"batch_size": s.micro_batch, "grad_accum": s.grad_accum}
    new.update({f: getattr(s, f) for f in FIX_FIELDS if f not in new})
    for f in ("shard", "offload"):
        if new[f] in ("none", "ddp"):
            new[f] = getattr(workload, f)
    out = {f: new[f] for f in FIX_FIELDS if new[f] != getattr(workload, f)}
    if frozen_base_cast(s, workload):
        # LoRA over a base loaded in fp32 (TRL's default dtype) -> the base in its 16-bit
        # dtype: the adapters, what trains and how, stay the same (plan/recipe.py)
        out["precision"] = s.precision
    return out


def checked_fix(
    job: Job,
    edits: list[FileEdit],
    wanted: dict[str, Any],
    workload: WorkloadSpec,
    estimate_job: EstimateJob,
    how: str,
) -> CheckFix:
    """The fix ``edits`` make, judged on the edited files as memfit reads them. An edit memfit
    refuses to make (a YAML construct it does not edit by lines) cannot be read back: it is
    judged on the job with ``wanted`` (memfit settings) applied, and shown to make by hand."""
    keys = [
        KeyChange(file=e.path, key=k, old=file_value(job, e.path, k), new=v)
        for e in edits
        for k, v in e.keys
    ]
    try:
        if any(e.refused is not None for e in edits):
            new_workload, est = estimate_job(job, replace(workload, **wanted))
        else:
            texts = {e.path: e.new_text for e in edits}
            new_workload, est = estimate_job(reread(job, texts), None)
    except SpecError:
        # the edited files no longer read as one job (a key one file sets that another
        # contradicts): never offered
        return CheckFix(edits=edits, keys=keys, changes={}, estimate=None, plan=how)
    changes = {
        f: (getattr(workload, f), getattr(new_workload, f))
        for f in (*FIX_FIELDS, *KEPT, "seq_len", "gpus", *LORA_KEPT, "fsdp_state_dict_type")
        if getattr(workload, f) != getattr(new_workload, f)
    }
    return CheckFix(
        edits=edits, keys=keys, changes=changes, estimate=est, plan=how, workload=new_workload
    )


#: the asked LoRA's fields every fix keeps (the planner is asked to keep them)
LORA_KEPT = ("lora_targets", "lora_modules_to_save", "lora_dropout")


def file_value(job: Job, path: str, key: str) -> Any:
    f = next(f for f in job.files if f.path == path)
    value = f.reader.flat.get(key, MISSING)
    return None if value is MISSING else value


def _show(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _no_fix(
    job: Job,
    workload: WorkloadSpec,
    gpu: str,
    not_kept: list[str],
    not_said: list[tuple[str, list[str]]],
    closest: CheckFix | None,
) -> str:
    """Why no change to these files fits on ``gpu``, and what would."""
    keep = ", ".join(
        x
        for x in (
            f"LoRA r{workload.lora_rank}" if workload.lora_rank else "full fine-tuning",
            f"{workload.quant} base" if workload.quant != "none" else "",
            workload.precision,
        )
        if x
    )
    out = [f"no change to these files' keys makes this job fit on {gpu} (keeping {keep})"]
    if closest is not None and closest.estimate is not None:
        keys = ", ".join(k.describe() for k in closest.keys)
        out.append(
            f"closest edit: {keys} — {format_bytes(_used(closest))} on the device, "
            f"{closest.estimate.fits.verdict if closest.estimate.fits else 'no verdict'}"
        )
    if not_said:
        how, missing = not_said[0]
        out.append(
            f"what would fit: {how} — these files cannot say {', '.join(missing) or 'it'}"
            + (" (ZeRO / offload: add a DeepSpeed config)" if _needs_deepspeed(missing) else "")
        )
    elif not_kept:
        out.append(
            f"the planner's nearest fit changes what you chose, so it is not offered: {not_kept[0]}"
        )
    files = " ".join(f"--from {f.path}" for f in job.files)
    out.append(f"or a GPU with more memory: memfit plan {files} --recommend-gpu")
    return "\n".join(out)


def _needs_deepspeed(missing: list[str]) -> bool:
    return any(m.startswith(("shard=zero", "offload=")) for m in missing)

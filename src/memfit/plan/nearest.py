"""The nearest change that makes one job fit, for ``memfit estimate`` and ``fit``'s "does not fit".

The planner answers it: the job becomes the recipe (its precision, optimizer, attention, LoRA
rank, targets and weight format, its batch as the global batch per GPU) and the search returns
the least change that fits — memory-only first — or, when nothing does, the nearest changes of
:meth:`memfit.plan.search.Plan.nearest` (a shorter sequence, another GPU with its price). Only
where the fast (analytic) engine models the model: a search with the trace engine takes minutes,
so elsewhere the line names the ``memfit plan`` command instead of running it.

An answer is kept in the process (the last :data:`MAX_ANSWERS_KEPT`) and on disk with the
trace engine's answers (:func:`memfit.estimate.trace_cache.cached_answer`, THE key rule): a
repeated job that does not fit is not searched again (issue 32).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from memfit.errors import MemfitError
from memfit.estimate import trace_cache
from memfit.estimate.policy import active
from memfit.hardware import get_gpu
from memfit.models import ModelSource, resolve_model, take_media
from memfit.plan.engines import default_engines
from memfit.plan.request import PlanRequest, job_request
from memfit.plan.search import RUN_DECIDES, plan, tight_decider, tight_figures
from memfit.spec import WorkloadSpec
from memfit.spec.parallel_rules import is_parallel_job


@dataclass(frozen=True, kw_only=True)
class NearestFit:
    """The nearest change that fits (``change``: what to do; ``plan``: the settings; ``kind``:
    memory-only / changes the result / changes the job / another GPU), or only the command to
    search it (``change`` None)."""

    change: str | None
    plan: str | None
    kind: str | None
    command: str
    #: a change the fast engine leaves tight that would be preferred (faster, or memory-only
    #: where ``change`` changes the result; ``memfit.plan.search.Plan.tight``): what it needs,
    #: one line; the trace decides it (``memfit plan`` checks it), None: none
    tight: str | None = None

    def text(self) -> str:
        if self.change is None:
            head = f"nearest change that fits: search it with `{self.command}`"
        else:
            head = (
                f"nearest change that fits ({self.kind}): {self.change} — {self.plan}; "
                f"compare all with `{self.command}`"
            )
        if self.tight is None:
            return head
        if RUN_DECIDES in self.tight:  # the trace engine cannot run it: the line says who does
            return head + f"\nmay fit instead (tight): {self.tight}"
        return head + f"\nmay fit instead (tight): {self.tight}; `{self.command}` checks it"

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "plan": self.plan,
            "kind": self.kind,
            "command": self.command,
            "tight": self.tight,
        }


def request_of(w: WorkloadSpec) -> PlanRequest:
    """The planner's request for the job ``w`` as asked (:func:`memfit.plan.request.job_request`,
    the one door every described job takes to the planner)."""
    return job_request(w)


def plan_command(model: str, w: WorkloadSpec, gpu: str) -> str:
    r = request_of(w)
    parts = [f"memfit plan {model} --gpu {gpu} --seq {r.seq_len}"]
    if r.global_batch:
        parts.append(f"--global-batch {r.global_batch}")
    elif r.batch_size:
        parts.append(f"--mode infer --batch {r.batch_size}")
    if r.lora_asked:
        parts.append(f"--lora-rank {r.lora_ranks[0]}")
    if r.quant != "none":
        parts.append(f"--quant {r.quant}")
    parts.append(f"--precision {r.precision}")
    if r.kernels != "hf":  # kept by every plan, as the LoRA rank is
        parts.append(f"--kernels {r.kernels}")
    return " ".join(parts)


def nearest_fit(model: Any, w: WorkloadSpec, gpu: Any, *, model_name: str) -> NearestFit | None:
    """The nearest change that fits ``w`` on ``gpu``; None where the planner cannot say (a job
    it does not model); only the command where the fast engine does not model the model."""
    if is_parallel_job(w):  # the planner does not search pp / cp / ep layouts
        return None
    gpu_name = gpu if isinstance(gpu, str) else getattr(gpu, "name", str(gpu))
    command = plan_command(model_name, w, gpu_name)
    # the planner searches eager jobs (PlanRequest has no torch.compile): no change for a
    # --compile job, only the command
    if w.tp > 1 or w.shard not in ("none", "ddp") or w.offload != "none" or w.compile:
        return NearestFit(change=None, plan=None, kind=None, command=command)
    try:
        source = model if isinstance(model, ModelSource) else resolve_model(str(model))
        source = take_media(source, w.media)
        if active().search_engines(source).search != "analytic":
            return NearestFit(change=None, plan=None, kind=None, command=command)
        key = _job_key(source, w, gpu)
        if key is not None and key in _ANSWERS:
            _ANSWERS.move_to_end(key)
            return _with_command(_ANSWERS[key], command)
        found = _with_command(_searched(source, w, gpu, key), command)
    except MemfitError:
        return NearestFit(change=None, plan=None, kind=None, command=command)
    if key is not None:
        _ANSWERS[key] = found
        while len(_ANSWERS) > MAX_ANSWERS_KEPT:
            _ANSWERS.popitem(last=False)
    return found


#: Searched answers kept in this process (least recently used dropped first): ``memfit web``'s
#: worker processes answer a repeated job without a second search (issue 32).
MAX_ANSWERS_KEPT = 256
_ANSWERS: OrderedDict[tuple[str, ...], NearestFit] = OrderedDict()


def _job_key(source: ModelSource, w: WorkloadSpec, gpu: Any) -> tuple[str, ...] | None:
    """Everything the search reads: the model (its config as read, its checkpoint's header
    facts), the job, the GPU record and the engine policy; None (not kept) for a model memfit
    builds by running code."""
    if source.config is None:
        return None
    try:
        config = json.dumps(source.config, sort_keys=True)
    except (TypeError, ValueError):
        return None
    model = repr((source.name, source.origin, source.config_path, source.safetensors))
    return (model, config, repr(source.spec), repr(w), repr(gpu), repr(active()))


def _searched(source: ModelSource, w: WorkloadSpec, gpu: Any, key: tuple[str, ...] | None) -> Any:
    """The search's answer (its command left empty), kept on disk under the trace cache's one
    key rule (:func:`memfit.estimate.trace_cache.cached_answer`: the job's key parts with the
    installed versions and memfit's source files), so a repeated ``memfit estimate`` that does
    not fit, or another worker of ``memfit web``, reads it instead of searching again; where
    the trace cache keeps nothing (``--no-cache``, a factory model), searched each time."""

    def run() -> NearestFit:
        # stacks whose weights (and a full fine-tune's gradients) alone overflow are ruled out
        # unestimated (memfit.plan.floor: a lower bound of every engine's need): the same
        # recommendation; where nothing fits, the nearest changes read every miss's estimate,
        # so that search runs again without the floors, on the first one's kept estimates
        record = get_gpu(gpu) if isinstance(gpu, str) else gpu
        engines = default_engines(source, record)
        found = plan(source, request_of(w), gpu=record, analytic_floors=True, engines=engines)
        if found.recommended is None:
            found = plan(source, request_of(w), gpu=record, engines=engines)
        return _answer(found, "")

    if key is None or not trace_cache.cacheable(source):
        return run()
    found, _ = trace_cache.cached_answer(
        {"nearest_fit": list(key)}, run, encode=_encode, decode=_decode
    )
    return found


_FIELDS = ("change", "plan", "kind", "tight")


def _encode(found: NearestFit) -> dict[str, Any]:
    return {k: getattr(found, k) for k in _FIELDS}


def _decode(data: Any) -> NearestFit | None:
    """A kept answer, None where the record is not one (a value missing or not a string)."""
    if not isinstance(data, dict):
        return None
    values = [data.get(k) for k in _FIELDS]
    if set(data) != set(_FIELDS) or any(v is not None and not isinstance(v, str) for v in values):
        return None
    return NearestFit(change=values[0], plan=values[1], kind=values[2], tight=values[3], command="")


def _with_command(found: NearestFit, command: str) -> NearestFit:
    return replace(found, command=command)


def _answer(p: Any, command: str) -> NearestFit:
    """The plan's recommendation as the nearest change, else its nearest changes' first; with
    the tight change that would be preferred to it (:attr:`memfit.plan.search.Plan.tight`)."""
    rec = p.recommended
    tight = None if p.tight is None else _tight_line(p.tight, p.budget)
    if rec is not None:
        kind = "changes the result" if rec.changes_result else "memory-only"
        what = ", ".join(c.what for c in rec.changes) or "the job as asked"
        plan_ = rec.settings.describe()
        return NearestFit(change=what, plan=plan_, kind=kind, command=command, tight=tight)
    if p.nearest:
        n = p.nearest[0]
        return NearestFit(
            change=n["change"], plan=n["plan"], kind=n["kind"], command=command, tight=tight
        )
    return NearestFit(change=None, plan=None, kind=None, command=command, tight=tight)


def _tight_line(opt: Any, budget: Any) -> str:
    """``opt`` (a tight plan) in one line: what it changes, its kind and its figures."""
    kind = "changes the result" if opt.changes_result else "memory-only"
    what = ", ".join(c.what for c in opt.changes) or "the job as asked"
    line = f"{what} ({kind}; {tight_figures(opt, budget)})"
    return f"{line}, {tight_decider(opt)}" if opt.reason else line


__all__ = ["NearestFit", "nearest_fit", "plan_command", "request_of"]

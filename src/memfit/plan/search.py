"""``plan()``: the job as asked, then the least change that makes it fit, confirmed, explained.

0. The request is the recipe (:mod:`memfit.plan.recipe`): the job as asked is estimated first
   (the plan's ``baseline``, judged by THE verdict rule, memfit.estimate.verdict). Candidates are
   sorted into tiers, searched in order, the first tier with a plan that fits wins:
   a. the job as asked fits: memory-only changes only (the recommendation is the job itself, or
      a memory-only change predicted faster);
   b. else: memory-only changes and the result-changing families the user allowed
      (``allow``), ranked by speed; offload layouts here only with ``allow_offload``;
   c. memory-only ZeRO-Offload (slow, same maths);
   d. the result-changing options not allowed, least quality risk first, then speed.
1. Enumerate the combinations (:mod:`memfit.plan.space`) allowed by the request's constraints
   (``keep_full_finetune``, ``allow_quant``, ``max_quality_risk``).
2. Predict each one's step time with the roofline (:mod:`memfit.plan.cost`) — no estimate
   needed — and visit them fastest first (goal ``throughput``) or smallest micro-batch first
   (goal ``memory``).
3. Estimate a visited combination with the fast engine unless it is *dominated*: it keeps at
   least as much in memory as one that already did not fit, or a faster split of the same stack
   already fits. The first visit of a technique stack estimates all its micro-batch splits in
   one batch call (the analytic engine's ``estimate_many``: workloads that differ only in batch
   size share two simulations), and the smallest split that does not fit prunes the others;
   an engine without a batch call (derived, trace) estimates them smallest first and stops at
   that miss. With the derived or trace engine a stack whose floor (:mod:`memfit.plan.floor`:
   its weights, and a full fine-tune's gradients; under DDP and ZeRO what rank 0 keeps of them)
   exceeds the GPU is ruled out before any form is built or trace run, and listed in the notes.
   A fit is then confirmed by the precise engine (``request.confirm``: every plan shown, the
   recommended one only, or none); if that disagrees, the combination counts as not fitting.
4. Stop when the recommended plan and ``n_alternatives`` runners-up (distinct stacks) are found.

The result always comes back; ``Plan.raise_if_not_fit()`` raises when nothing fits.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from memfit import progress
from memfit.errors import DoesNotFitError, MemfitError
from memfit.estimate import checkpoint_dtype
from memfit.estimate.fastpath import verdict_settled
from memfit.estimate.trace.refusals import refused_setting
from memfit.estimate.verdict import Verdict
from memfit.hardware import list_gpus, load_prices
from memfit.plan.budget import Budget, fits, need_bytes, overflow_reason, verdict
from memfit.plan.cost import (
    ModelFacts,
    Rates,
    StepCost,
    infer_cost,
    train_cost_key,
    train_step_cost,
    trainable_fraction,
)
from memfit.plan.engines import (
    CachedEstimator,
    EnginePair,
    Estimator,
    resolve_engines,
    workload_key,
)
from memfit.plan.floor import Floor, stack_floor
from memfit.plan.recipe import (
    CHECKPOINTING_CHANGE,
    LOSS_CHANGE,
    Change,
    changes,
    families,
    quality_risk,
    split_change,
    stack_changes,
)
from memfit.plan.request import PlanOption, PlanRequest
from memfit.plan.space import (
    RISK_LEVELS,
    Settings,
    SpaceOptions,
    candidates,
    dominates,
    micro_batch_splits,
    recipe,
    stack_options,
)
from memfit.plan.split_bound import proven_miss, proven_miss_of_other_optimizer
from memfit.report.plan_html import plan_fragment
from memfit.spec import ParallelSpec, TechniqueSpec
from memfit.spec.rules import kernel_shard_note
from memfit.units import format_bytes

#: The tiers of the search (the module docstring), by the start of their names, in order.
TIER_ORDER = (
    "as asked",
    "memory-only",
    "memory-only, offloading to host RAM",
    "changes the result: nothing memory-only fits",
)

#: Rejected plans listed in a result (fastest first, one per technique stack).
N_REJECTED_SHOWN = 5
#: Predicted step times within this fraction of each other rank as ties, broken by the lower
#: quality risk: the roofline's MFU/MBU constants (memfit.plan.cost) are rules of thumb, so a
#: 1 % faster prediction does not justify Adafactor over 8-bit AdamW. Ties are buckets of width
#: ``log(1 + RANK_TIE_FRACTION)`` in log step time, so the order stays total and transitive.
RANK_TIE_FRACTION = 0.05
#: A recommendation this many times slower than a plan shown beside it is said so in a note,
#: and a memory-only offload plan this many times slower than the fastest result-changing plan
#: that fits is not the recommendation: "memory-only changes first unless they cost several
#: times the step time" (docs/planning.md).
SLOWDOWN_LIMIT = 3.0
#: Combinations the search engine cannot estimate that are sent to the confirming (slow) engine
#: instead, at most, per plan: beyond it they are reported as not estimated (keeps a plan to
#: about a minute when the trace engine takes seconds per estimate).
MAX_FALLBACK_ESTIMATES = 8
#: Plans the search engine leaves *tight* (the point fits, the upper end of its range does not)
#: that the precise engine checks, at most, per plan: one trace, of the fastest such plan, while
#: no plan is found yet (so it is faster than every plan found, e.g. checkpointing before a
#: quantized base), and only where plans are confirmed (``confirm`` not ``none``). ``memfit
#: estimate`` traces such a job too: a plan's verdict is the one ``memfit estimate`` gives it
#: (issue 29). A tight plan left unchecked is shown beside the recommendation (``Plan.tight``).
MAX_TIGHT_CONFIRMS = 1


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's answer. ``recommended`` is None when nothing fits; ``closest`` is then the
    attempt that came nearest. ``rejected``: faster stacks that do not fit, and why."""

    model_name: str
    request: PlanRequest
    budget: Budget
    recommended: PlanOption | None
    alternatives: list[PlanOption]
    baseline: PlanOption
    rejected: list[PlanOption]
    closest: PlanOption | None
    search_engine: str
    confirm_engine: str | None
    n_candidates: int
    n_estimated: int
    n_pruned: int
    n_overruled: int  # plans the search engine accepted and the confirming engine did not
    elapsed_s: float
    n_confirmed: int = 0  # workloads the confirming engine estimated
    search_s: float = 0.0  # time in the search engine
    confirm_s: float = 0.0  # time in the confirming engine
    notes: list[str] = field(default_factory=list)
    #: the tier the recommendation came from (memfit.plan.search's docstring), None: nothing fits
    tier: str | None = None
    #: its place in :data:`TIER_ORDER` (0: the job as asked fits)
    tier_rank: int | None = None
    #: side by side (label, plan): the recommended plan, the fastest memory-only plan and the
    #: fastest plan ``allow`` permits, where they differ from it (the job as asked is the
    #: ``baseline``)
    compare: list[tuple[str, PlanOption]] = field(default_factory=list)
    #: when nothing fits: the nearest changes that do (what, the plan, its need), closest first
    nearest: list[dict[str, Any]] = field(default_factory=list)
    #: whether the recommended plan's bytes are the trace's (the trace or derived engine
    #: answered or confirmed it), or the fast engine's alone (False); None: no plan fits.
    #: ``confirmed_why`` says why, in one line (the plan's ``confirmed:`` line)
    confirmed: bool | None = None
    confirmed_why: str = ""
    #: a plan the fast engine leaves tight (its point fits, its upper end does not) that the
    #: precise engine did not check (``confirm`` none, or its checks spent), where it would be
    #: preferred to the recommendation (faster, or memory-only where that changes the result)
    tight: PlanOption | None = None
    #: tight plans the precise engine checked (at most :data:`MAX_TIGHT_CONFIRMS`)
    n_tight_checked: int = 0

    def preference(self) -> tuple[int, tuple[Any, ...]] | None:
        """How good the recommendation is, smaller better: its tier, then the tier's order
        (:func:`rank_key`, or :func:`risk_first_key` among result-changing fallbacks). None
        when nothing fits."""
        rec = self.recommended
        if rec is None or self.tier_rank is None:
            return None
        key = risk_first_key if self.tier_rank == len(TIER_ORDER) - 1 else rank_key
        return (self.tier_rank, key(rec))

    @property
    def fits(self) -> bool:
        return self.recommended is not None

    @property
    def as_asked(self) -> Verdict | None:
        """THE verdict rule on the job as asked (the baseline); None when it was not
        estimated."""
        est = self.baseline.estimate
        return None if est is None else verdict(est, self.budget)

    def raise_if_not_fit(self) -> None:
        if self.recommended is None:
            closest = ""
            if self.closest is not None and self.closest.reason:
                closest = (
                    f"; closest attempt ({self.closest.settings.describe()}) {self.closest.reason}"
                )
            raise DoesNotFitError(
                f"no plan for {self.model_name} fits {self.budget.gpu_name} x{self.request.gpus} "
                f"within {format_bytes(self.budget.limit_bytes)} (headroom "
                f"{format_bytes(self.budget.headroom_bytes)}){closest}: try more GPUs "
                "(--gpus / --recommend-gpu), --allow-offload, or relax the constraints"
            )

    def _repr_html_(self) -> str:
        """A notebook's view: as asked, then the recommended plan."""
        return plan_fragment(self.to_json())

    def to_json(self) -> dict[str, Any]:
        from memfit.plan.export import export_settings

        rec = self.recommended
        return {
            "model": self.model_name,
            "request": self.request.to_json(),
            "budget": self.budget.to_json(),
            "fits": self.fits,
            "recommended": None if rec is None else rec.to_json(),
            "settings_export": None
            if rec is None
            else export_settings(rec.settings, self.request, self.model_name),
            "baseline": self.baseline.to_json(),
            "as_asked": None if self.as_asked is None else self.as_asked.to_json(),
            "tier": self.tier,
            "alternatives": [a.to_json() for a in self.alternatives],
            "rejected": [r.to_json() for r in self.rejected],
            "closest": None if self.closest is None else self.closest.to_json(),
            "compare": [{"label": label, **o.to_json()} for label, o in self.compare],
            "nearest": list(self.nearest),
            "tight": None if self.tight is None else self.tight.to_json(),
            "search": {
                "engine": self.search_engine,
                "confirm_engine": self.confirm_engine,
                "n_candidates": self.n_candidates,
                "n_tight_checked": self.n_tight_checked,
                "n_estimated": self.n_estimated,
                "n_pruned": self.n_pruned,
                "n_overruled": self.n_overruled,
                "n_confirmed": self.n_confirmed,
                "elapsed_s": self.elapsed_s,
                "search_s": self.search_s,
                "confirm_s": self.confirm_s,
            },
            "confirmed": self.confirmed,
            "confirmed_why": self.confirmed_why,
            "notes": list(self.notes),
        }


def plan(
    model: Any,
    request: PlanRequest | None = None,
    *,
    gpu: Any = None,
    gpu_memory_bytes: int | None = None,
    estimator: Estimator | None = None,
    confirm: Estimator | None = None,
    analytic_floors: bool = False,
    engines: EnginePair | None = None,
    **request_fields: Any,
) -> Plan:
    """Plan ``model`` (a MODEL string or ``ModelSource``) for ``request`` on ``gpu`` (a catalog
    name or record: its rates drive the cost model; ``gpu_memory_bytes`` overrides its memory).

    ``estimator`` / ``confirm``: ``Callable[[WorkloadSpec], MemoryEstimate]``; default the analytic
    engine to search and the trace engine to confirm (see :mod:`memfit.plan.engines`).
    ``analytic_floors``: rule stacks out by their floor (:mod:`memfit.plan.floor`) with the
    analytic engine too (without it, only where the search engine is slower): the same plan is
    recommended, found with fewer estimates, but the misses shown lack those stacks (and
    stacks proven to miss from another one's estimate, :mod:`memfit.plan.split_bound`), and
    where nothing fits no nearest changes are worked out from them, so only a caller that
    reads the recommendation alone, and searches again without floors where there is none,
    asks for it (``memfit.plan.nearest``).
    ``engines``: the default engines of an earlier search of this model on this GPU record
    (:func:`memfit.plan.engines.default_engines`), whose kept estimates this one reads.
    ``request_fields``: :class:`PlanRequest` fields, applied over ``request``."""
    start = time.perf_counter()
    request = replace(request or PlanRequest(), **request_fields)
    source, gpu_rec = _resolve(model, gpu)
    budget = Budget.of(gpu_rec, memory_bytes=gpu_memory_bytes, headroom=request.headroom)
    engines = engines or resolve_engines(source, gpu_rec, estimator, confirm)
    opts = _space_options(request, gpu_rec, source)
    search = _Search(request, budget, engines, Rates.of(gpu_rec), source)
    search.analytic_floors = analytic_floors
    search.recipe = recipe(opts)
    baseline = search.baseline(search.recipe)
    if analytic_floors and search.floor_params is None:
        search.count_base_params(search.recipe)
    found, tier = search.run_tiers(judged_candidates(opts), baseline)
    found = search.confirm_first(found)
    result = search.result(found, baseline, time.perf_counter() - start, tier)
    if request.kernel_defaults:  # Unsloth's defaults filled in (rules.with_kernel_defaults)
        said = " and ".join(f"--{k} {v}" for k, v in request.kernel_defaults)
        result.notes.append(
            f"kernels {request.kernels}: the job runs {said} (Unsloth's defaults, not set); "
            "every plan keeps the kernels"
        )
    if request.mode == "train" and (shards := kernel_shard_note(request.kernels)) is not None:
        result.notes.append(shards)  # layouts the kernels cannot run under, left out (space.py)
    note = opts.precision_note  # a default applied (training), or bf16 asked on a GPU without it
    if note is not None and (request.mode == "train" or request.precision is not None):
        result.notes.append(note)
    return result


def _resolve(model: Any, gpu: Any) -> tuple[Any, Any]:
    from memfit.errors import SpecError
    from memfit.hardware import get_gpu
    from memfit.models import ModelSource, resolve_model

    if gpu is None:
        raise SpecError("plan needs --gpu NAME: its bandwidth and FLOPS rank the plans")
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    return source, get_gpu(gpu) if isinstance(gpu, str) else gpu


def _space_options(request: PlanRequest, gpu: Any, source: Any) -> SpaceOptions:
    facts = ModelFacts.from_spec(source.spec, n_params=1)
    return SpaceOptions(
        mode=request.mode,
        per_rank_batch=request.per_rank_batch,
        fixed_micro_batch=request.global_batch is None,
        gpus=request.gpus,
        n_layers=facts.n_layers,
        supports_bf16=bool(getattr(gpu, "supports_bf16", True)),
        supports_fp8=bool(getattr(gpu, "supports_fp8", False)),
        keep_full_finetune=request.keep_full_finetune,
        allow_quant=request.allow_quant,
        allow_offload=request.allow_offload,
        lora_ranks=request.lora_ranks,
        prepare_kbit=request.prepare_kbit,
        optimizer_in_bwd=request.optimizer_in_bwd,
        loss=request.loss,
        kernels=request.kernels,
        checkpointing=request.checkpointing,
        memory_only_losses=request.other_kernels,
        host_checkpoints=request.other_kernels,
        keep_checkpointing=request.keep_checkpointing,
        asked_micro_batch=request.asked_micro_batch if request.mode == "train" else None,
        precision=request.precision,
        optimizer=request.optimizer,
        attention=request.attention,
        lora_asked=request.lora_asked,
        checkpoint_dtype=checkpoint_dtype(source),
        quant=request.quant,
        lora_targets=request.lora_targets,
        lora_modules_to_save=request.lora_modules_to_save,
        lora_dropout=request.lora_dropout,
    )


#: A candidate with what it changes about the job as asked and its quality risk
#: (:func:`judged_candidates`): (settings, changes, risk level, risk reasons).
Judged = tuple[Settings, tuple[Change, ...], int, tuple[str, ...]]


@functools.lru_cache(maxsize=16)
def judged_candidates(opts: SpaceOptions) -> tuple[Judged, ...]:
    """Every candidate of ``opts`` (:func:`memfit.plan.space.candidates`) with its changes to
    the recipe (``recipe(opts)``) and their quality risk: pure functions of the frozen
    ``opts``, kept per process (``memfit web``'s workers, a ``fit`` sweep: issue 32). What
    depends on the job's sequence (the step cost, the estimates) is computed per search.
    Memory: 5.6 MiB for the 3 312 candidates of a one-GPU full fine-tune at batch 8
    (tracemalloc), so the 16 spaces kept cost up to ~100 MiB a process.

    Training: the technique stacks and their changes are those of :func:`judged_stacks`, kept
    per space but its batch (a job of another batch size on the same model and GPU kind reads
    them), each stack's batch splits made here, in :func:`candidates`' order."""
    base = recipe(opts)
    if opts.mode != "train":
        return _judged_space(opts, candidates(opts), base)
    splits = [
        (m, accum)
        for m, accum in micro_batch_splits(opts)
        if not (opts.optimizer_in_bwd and accum > 1)  # nothing accumulates (candidates)
    ]
    # split_change reads the split alone (the recipe's and the mode are the call's): ~2 000
    # candidates share a handful of splits, and its frozen Change records are shared too
    split_changes = [tuple(split_change(base.split(m, a), base, "train")) for m, a in splits]
    out = []
    for first, head, tail, level, reasons in judged_stacks(stack_options(opts)):
        for (m, accum), split in zip(splits, split_changes, strict=True):
            s = first.split(m, accum)
            # the split's change is memory-only: no risk of its own (quality_risk)
            out.append((s, (*head, *split, *tail), level, reasons))
    return tuple(out)


def tight_figures(opt: PlanOption, budget: Budget) -> str:
    """A tight plan's figures against the limit, as its note and the nearest change say them:
    ``estimate 20.09 GiB, upper end 22.56 GiB, over the 21.05 GiB limit`` (no second "needs"
    figure beside the job's own)."""
    est = opt.estimate
    point = "" if est is None else f"estimate {format_bytes(int(est.device_used_bytes))}, "
    return (
        f"{point}upper end {format_bytes(opt.need_bytes or 0)}, over the "
        f"{format_bytes(budget.limit_bytes)} limit"
    )


#: What decides a tight plan the trace engine cannot run (a fused cross-entropy, checkpoints in
#: host RAM): a run of the job, not memfit (``tight_decider``).
RUN_DECIDES = "only a run on the GPU decides"


def tight_decider(opt: PlanOption) -> str:
    """Who settles a tight plan: the trace engine (``memfit estimate`` of the job runs it), or,
    where the trace engine cannot run the job (``opt.reason``, set by
    :meth:`_Search._keep_tight`: what it cannot run), a run."""
    if opt.reason:
        return f"which {RUN_DECIDES} (the trace engine cannot run {opt.reason})"
    return "which the trace engine decides (`memfit estimate` of that job runs it)"


#: A training space's technique stack, judged (:func:`judged_stacks`): its settings at
#: micro-batch 1, what it changes about the recipe before and after the batch split's change,
#: its risk level and reasons.
JudgedStack = tuple[Settings, tuple[Change, ...], tuple[Change, ...], int, tuple[str, ...]]


@functools.lru_cache(maxsize=64)
def judged_stacks(opts: SpaceOptions) -> tuple[JudgedStack, ...]:
    """The technique stacks of a training space (``opts`` with its batch made neutral:
    :func:`memfit.plan.space.stack_options`) in :func:`candidates`' order, each with what it
    changes about the recipe (:func:`memfit.plan.recipe.stack_changes`, which reads no batch
    split) and its quality risk; kept per process across jobs of any batch size (issue 32)."""
    base = recipe(opts)
    asked = opts.lora_ranks if opts.lora_asked else ()
    out: list[JudgedStack] = []
    for s in candidates(opts):  # one split per stack: the neutral batch has one
        head, tail = stack_changes(s, base, opts.mode, asked_ranks=asked)
        level, reasons = quality_risk(head)
        out.append((s, tuple(head), tuple(tail), level, reasons))
    return tuple(out)


def _judged_space(opts: SpaceOptions, space: list[Settings], base: Settings) -> tuple[Judged, ...]:
    """:func:`judged_candidates` of an inference space (a handful of candidates)."""
    asked = opts.lora_ranks if opts.lora_asked else ()
    out = []
    for s in space:
        head, tail = stack_changes(s, base, opts.mode, asked_ranks=asked)
        level, reasons = quality_risk(head)
        out.append((s, (*head, *split_change(s, base, opts.mode), *tail), level, reasons))
    return tuple(out)


def _judge(s: Settings, base: Any, mode: str, asked: tuple[int, ...]) -> Judged:
    """``s`` with what it changes about ``base`` (the job as asked) and their quality risk."""
    found = tuple(changes(s, base, mode, asked_ranks=asked))
    level, reasons = quality_risk(list(found))
    return (s, found, level, reasons)


class _Search:
    """The state of one search: engines, budget, what did not fit, counters."""

    def __init__(
        self, request: PlanRequest, budget: Budget, engines: EnginePair, rates: Rates, source: Any
    ) -> None:
        self.request, self.budget, self.engines, self.rates = request, budget, engines, rates
        self.source = source
        self.facts = ModelFacts.from_spec(source.spec, n_params=1)
        #: training step costs by :func:`memfit.plan.cost.train_cost_key`, for these facts
        self._costs: dict[tuple[Any, ...], StepCost] = {}
        self._costs_facts = self.facts
        self.failed: dict[tuple[Any, ...], list[Settings]] = {}
        self.rejected: list[PlanOption] = []
        self.unsupported: list[str] = []
        self.by_stack: dict[tuple[Any, ...], list[PlanOption]] = {}
        self.n_candidates = self.n_pruned = self.n_overruled = self.n_fallback = 0
        self.n_found = 0  # plans accepted so far (``confirm="recommended"`` confirms the first)
        self.recipe: Settings | None = None  # the job as asked (set before any option)
        #: base parameters for :func:`memfit.plan.floor.stack_floor` (None: no floor claimed)
        self.floor_params: int | None = None
        #: stacks ruled out by their floor, without an estimate: technique key -> (settings, floor)
        self.ruled_out: dict[tuple[Any, ...], tuple[Settings, Floor]] = {}
        self.opts: list[PlanOption] = []  # every option searched (set by run_tiers)
        self.weigh_note: str | None = None  # why offload was or was not recommended
        self.analytic_floors = False  # floors rule stacks out with the analytic engine too
        self.n_tight_confirmed = 0  # tight plans sent to the precise engine (MAX_TIGHT_CONFIRMS)
        #: tight plans already judged by :meth:`_settle_tight`, by workload: the answer
        self.settled_tight: dict[str, PlanOption] = {}
        #: the first memory-only tight plan the precise engine did not check (:meth:`_settle_tight`)
        self.tight_left: PlanOption | None = None
        #: the first result-changing tight plan the precise engine did not check: shown where
        #: the recommendation offloads and is several times slower (:meth:`_tight_shown`)
        self.tight_changing: PlanOption | None = None
        #: per technique stack, its smallest split's miss (:meth:`_prefetch_stack`), which may
        #: prove a larger split misses unestimated (:meth:`_proven_miss`)
        self.stack_miss: dict[tuple[Any, ...], PlanOption] = {}
        #: the search engine's misses by their stack less its optimizer (:func:`_twin_key`),
        #: which may prove a stack with another optimizer misses unestimated (:meth:`_twin_miss`)
        self.twin_misses: dict[tuple[Any, ...], list[PlanOption]] = {}

    # -- one option --------------------------------------------------------------------------
    def option(self, s: Settings) -> PlanOption:
        r = self.request
        asked = r.lora_ranks if r.lora_asked else ()
        return self._option_of(_judge(s, self.recipe or s, r.mode, asked))

    def _job(self) -> tuple[str, int, int]:
        """The job every option runs: (mode, sequence, new tokens)."""
        return (self.request.mode, self.request.seq_len, self.request.new_tokens)

    def _option_of(self, judged: Judged) -> PlanOption:
        s, found, level, reasons = judged
        return PlanOption(
            changes=found,
            settings=s,
            job=self._job(),
            cost=self.cost(s),
            risk_level=level,
            risk_reasons=reasons,
        )

    def cost(self, s: Settings) -> StepCost:
        """``s``'s predicted step; a training step priced once per :func:`train_cost_key` (the
        fields the price reads) while the model's facts stay: a search prices ~2 000
        candidates, about half of them alike (issue 32)."""
        r = self.request
        if r.mode == "infer":
            return infer_cost(s, self.facts, self.rates, seq_len=r.seq_len, new_tokens=r.new_tokens)
        if self._costs_facts is not self.facts:  # the baseline's count replaces the facts
            self._costs, self._costs_facts = {}, self.facts
        key = train_cost_key(s)
        found = self._costs.get(key)
        if found is None:
            found = self._costs[key] = train_step_cost(
                s, self.facts, self.rates, seq_len=r.seq_len, trainable_fraction=self._trainable(s)
            )
        return found

    def _trainable(self, s: Settings) -> float:
        return trainable_fraction(s, self.facts)

    def estimate(self, opt: PlanOption, engine: CachedEstimator) -> PlanOption:
        try:
            est = engine(opt.workload)
        except MemfitError as exc:
            return replace(opt, reason=f"{engine.name} engine cannot estimate it: {exc}")
        ok = fits(est, self.budget)
        return replace(
            opt,
            estimate=est,
            need_bytes=need_bytes(est),
            fits=ok,
            confirmed_by=engine.name if ok else None,
            reason=None if ok else overflow_reason(est, self.budget, None),
        )

    def search_estimate(self, opt: PlanOption) -> PlanOption:
        """``opt`` by the search engine, a tight answer settled as ``memfit estimate`` settles
        it (:meth:`_settle_tight`)."""
        return self._settle_tight(self.estimate(opt, self.engines.search))

    def _settle_tight(self, done: PlanOption) -> PlanOption:
        """``done`` (the search engine's answer) where it fits or does not fit outright; where
        it is tight (its point fits, the upper end of its range does not), the verdict
        ``memfit estimate`` gives the job: the fast answer it shows first
        (:attr:`EnginePair.fast`: never above the job class's band, so its range may fit where
        the search engine's wide one does not), and where that too is tight, the precise
        engine's (the trace), as ``memfit estimate`` confirms it — at most
        :data:`MAX_TIGHT_CONFIRMS` times, before the first plan is found, and only where plans
        are confirmed. Otherwise ``done`` stands (tight counts as not fitting)."""
        if done.fits or done.estimate is None:
            return done
        if verdict(done.estimate, self.budget).verdict != "tight":
            return done
        key = workload_key(done.workload)
        if key in self.settled_tight:
            return self.settled_tight[key]
        settled = done
        fast = None
        if self.engines.fast is not None:
            try:
                fast = self.engines.fast(done.workload)
            except MemfitError:
                fast = None
        fast_verdict = None if fast is None else verdict(fast, self.budget).verdict
        if fast is not None and fast_verdict == "fits":
            settled = replace(
                done,
                estimate=fast,
                need_bytes=need_bytes(fast),
                fits=True,
                confirmed_by=self.engines.search.name,
                reason=None,
            )
        elif fast_verdict in (None, "tight"):  # the fast answer, where there is one, agrees
            confirm = self.engines.confirm
            traced = confirm is not None and confirm.name == "trace"
            refused = refused_setting(done.workload) if traced else None
            # a plan that offloads to host RAM is the last resort whatever its range, and the
            # trace's own range there is the wide band of other frameworks (DeepSpeed offload):
            # a trace would not settle it (it never traces one, as it never shows one as tight)
            offloads = done.settings.offload != "none"
            if refused is None and not offloads and self._may_confirm_tight():
                assert confirm is not None
                self.n_tight_confirmed += 1
                checked = self.estimate(done, confirm)
                if checked.estimate is not None:
                    settled = checked
            if settled is done:  # left unchecked, or the precise engine cannot run it
                self._keep_tight(replace(done, estimate=fast or done.estimate), refused)
        self.settled_tight[key] = settled
        return settled

    def _keep_tight(self, done: PlanOption, refused: str | None) -> None:
        """Keep the first (fastest) tight plan left unsettled, memory-only and result-changing
        apart, to show beside the recommendation (:meth:`_tight_shown`); never one that
        offloads to host RAM (the last resort whatever its range). ``refused``: why the precise
        engine could not run it (its reason names it), None where it was not asked."""
        if done.estimate is None or done.settings.offload != "none":
            return
        kept = replace(done, need_bytes=need_bytes(done.estimate), reason=refused)
        if not done.changes_result:
            if self.tight_left is None:
                self.tight_left = kept
            return
        held = self.tight_changing
        # the fastest; among plans as fast (a tie), the one nearest to fitting
        if (
            held is None
            or _faster(kept, held)
            or (not _faster(held, kept) and (kept.need_bytes or 0) < (held.need_bytes or 0))
        ):
            self.tight_changing = kept

    def _may_confirm_tight(self) -> bool:
        """Whether a tight plan goes to the precise engine (:meth:`_settle_tight`)."""
        if self.engines.confirm is None or self.request.confirm == "none" or self.n_found:
            return False
        return self.n_tight_confirmed < MAX_TIGHT_CONFIRMS

    # -- baseline ----------------------------------------------------------------------------
    def baseline(self, s: Settings) -> PlanOption:
        """The naive plan (the "before" column), by the search engine; by the precise one only
        where the search engine cannot estimate it (it is shown, not recommended: one trace of
        an 8B model costs seconds)."""
        opt = self.search_estimate(self.option(s))
        if opt.estimate is None and self.engines.confirm is not None and self._may_fall_back():
            opt = self.estimate(self.option(s), self.engines.confirm)
        if opt.estimate is not None:
            self.facts = ModelFacts.from_spec(self.source.spec, opt.estimate.n_params)
            self._count_params(s, opt.estimate.n_params)
            return replace(opt, cost=self.cost(s))
        single = replace(s, parallel=ParallelSpec(), micro_batch=1, grad_accum=1)  # one GPU
        est = self.engines.search(single.workload(self.request.mode, self.request.seq_len))
        self.facts = ModelFacts.from_spec(self.source.spec, est.n_params)
        self._count_params(s, est.n_params)
        return replace(opt, cost=self.cost(s))

    def count_base_params(self, s: Settings) -> None:
        """The base model's parameter count for the floors where the job as asked has LoRA
        adapters or quantized weights (its own count is not the base's): the count of its
        full fine-tune at micro-batch 1 by the search engine (no floor where that fails)."""
        try:  # micro-batch 1, no accumulation
            base = Settings(
                techniques=s.techniques,
                parallel=s.parallel,
                lora_rank=None,
                quant="none",
                prepare_kbit=False,
                lora_dropout=0.0,
                lora_modules_to_save=(),
            )
            est = self.engines.search(base.workload(self.request.mode, self.request.seq_len))
        except MemfitError:
            return
        self._count_params(base, est.n_params)

    def _count_params(self, s: Settings, n_params: int) -> None:
        """Keep the baseline's parameter count for the floors where it is the base model's
        (no LoRA adapters counted, no packed quantized weights)."""
        if s.lora_rank is None and s.quant == "none" and n_params > 0:
            self.floor_params = n_params

    # -- the search --------------------------------------------------------------------------
    def run_tiers(
        self, all_judged: tuple[Judged, ...], baseline: PlanOption
    ) -> tuple[list[PlanOption], str | None]:
        """Search the tiers of the module docstring in order; the first with a plan wins.
        ``all_judged``: :func:`judged_candidates` of the search's space (changes relative to
        :attr:`recipe`)."""
        max_risk = RISK_LEVELS.index(self.request.max_quality_risk)
        opts = [self._option_of(j) for j in all_judged if j[2] <= max_risk]
        self.n_candidates = len(opts)
        for o in opts:
            self.by_stack.setdefault(o.settings.technique_key, []).append(o)
        self.opts = opts
        tiers = self._tiers(opts, baseline)
        for i, (name, pool, key) in enumerate(tiers):
            found = self.run(pool, key)
            if found:
                if name == TIER_ORDER[2] and i + 1 < len(tiers):
                    return self._weigh_offload(found, tiers[i + 1][1])
                return found, name
        return [], None

    def _weigh_offload(
        self, offloaded: list[PlanOption], rest: list[PlanOption]
    ) -> tuple[list[PlanOption], str]:
        """Nothing fits without offloading within what ``allow`` permits. The offload plan is
        memory-only but moves weights or optimizer work over the host link every step, so the
        fastest result-changing plan that fits (least risk first) is weighed against it:

        - on one GPU, CPU offload is the recommendation only when nothing else fits — except for
          a full fine-tune whose only other way is adapters or frozen layers (ZeRO-Offload is
          the documented single-GPU route to train every weight), which is weighed as below;
        - otherwise offload stays first unless it is :data:`SLOWDOWN_LIMIT` times slower than
          the result-changing plan ("memory-only changes first unless they cost several times
          the step time").

        Either way the other plan is listed beside the recommendation, with why."""
        found = self.run([o for o in rest if o.settings.offload == "none"], risk_first_key)
        off = offloaded[0]
        if not found:
            return offloaded, TIER_ORDER[2]
        alt = found[0]
        ratio = off.cost.step_s / max(alt.cost.step_s, 1e-12)
        fams = families(list(alt.changes))
        allow = ",".join(sorted(fams))
        full_finetune = self.recipe is not None and self.recipe.lora_rank is None
        keeps_recipe = not (full_finetune and fams & {"lora", "freeze"})
        if self.request.gpus == 1 and keeps_recipe:
            prefer_alt, why = True, "CPU offload on one GPU is the last resort"
        else:
            prefer_alt, why = ratio >= SLOWDOWN_LIMIT, f"{ratio:.1f}x slower"
        if prefer_alt:
            self.weigh_note = (
                f"offload: no plan within the changes you allowed fits without offloading to "
                f"host RAM ({off.settings.describe()}, predicted {ratio:.1f}x the step time of "
                f"this one); {why}, so this plan, which changes the result (--allow {allow}), is "
                "recommended and the offload plan is listed below (memory-only, same maths)"
            )
            return [alt, off] + found[1:], TIER_ORDER[3]
        self.weigh_note = (
            f"offload: no plan without offloading fits within the changes you allowed; "
            f"{alt.settings.describe()} is predicted {1 / ratio if ratio else 0:.2f}x the step "
            f"time of this one and changes the result (--allow {allow} lets the planner prefer "
            "it)"
        )
        return offloaded + [alt], TIER_ORDER[2]

    @staticmethod
    def tier_rank(name: str | None) -> int | None:
        if name is None:
            return None
        return TIER_ORDER.index(name)

    def _tiers(
        self, opts: list[PlanOption], baseline: PlanOption
    ) -> list[tuple[str, list[PlanOption], Any]]:
        memory_only = [o for o in opts if not o.changes_result]
        if baseline.fits:
            return [("as asked", memory_only, rank_key)]
        allowed = self.request.allow
        free_offload = self.request.allow_offload

        def first(o: PlanOption) -> bool:
            offloaded = o.settings.offload != "none"
            return families(list(o.changes)) <= allowed and (free_offload or not offloaded)

        head = [o for o in opts if first(o)]
        tiers = [(TIER_ORDER[1], head, rank_key)]
        if not free_offload:
            offload = [o for o in memory_only if o.settings.offload != "none"]
            tiers.append((TIER_ORDER[2], offload, rank_key))
        seen = {id(o) for _, pool, _ in tiers for o in pool}
        rest = [o for o in opts if id(o) not in seen]
        tiers.append((TIER_ORDER[3], rest, risk_first_key))
        return tiers

    def run(
        self, opts: list[PlanOption], key: Any = None, *, wanted: int | None = None
    ) -> list[PlanOption]:
        if self.request.goal == "memory":
            return self._run_memory(opts)
        opts = sorted(opts, key=key or rank_key)
        wanted = wanted or 1 + self.request.n_alternatives
        found: list[PlanOption] = []
        fitting_stacks: set[tuple[Any, ...]] = set()
        for opt in opts:
            if len(found) >= wanted:
                break
            s = opt.settings
            if s.technique_key in fitting_stacks or self._dominated(s):
                self.n_pruned += 1
                continue
            if self._rule_out(s):
                continue
            progress.report(f"plan: checking {s.describe()}")
            checked = self._check(opt)
            if checked.fits:
                fitting_stacks.add(s.technique_key)
                found.append(checked)
                self.n_found += 1
        return found

    def _run_memory(self, opts: list[PlanOption]) -> list[PlanOption]:
        smallest = min((o.settings.micro_batch for o in opts), default=1)
        pool = [o for o in opts if o.settings.micro_batch == smallest]
        self.n_pruned += len(opts) - len(pool)
        pool.sort(key=lambda o: (o.cost.step_s, o.risk_level))
        estimated = []
        self.engines.search.prefetch([o.workload for o in pool[:1]])
        for opt in pool:
            if self._dominated(opt.settings):
                self.n_pruned += 1
                continue
            if self._rule_out(opt.settings):
                continue
            progress.report(f"plan: checking {opt.settings.describe()}")
            done = self.search_estimate(opt)
            if done.fits:
                estimated.append(done)
            else:
                self._record_failure(done)
        estimated.sort(key=lambda o: (o.need_bytes or 0, o.cost.step_s))
        found: list[PlanOption] = []
        for opt in estimated:
            if len(found) > self.request.n_alternatives:
                break
            checked = self._confirm(opt)
            if checked.fits:
                found.append(checked)
                self.n_found += 1
        return found

    def _rule_out(self, s: Settings) -> bool:
        """Whether ``s``'s stack cannot fit at any micro-batch by its floor
        (:mod:`memfit.plan.floor`): then the smallest split of the stack not dominated yet is
        noted as a failure (the one a full estimate of the stack would have noted first), so
        its larger splits and the stacks that keep more are pruned as before, without a form."""
        if self.floor_params is None:
            return False
        if self.engines.search.name == "analytic" and not self.analytic_floors:
            return False  # the analytic engine answers in milliseconds: its misses are shown
        floor = stack_floor(s, self.floor_params, train=self.request.mode == "train")
        if floor is None or floor.bytes <= self.budget.limit_bytes:
            return False
        splits = [
            o.settings
            for o in self.by_stack.get(s.technique_key, [])
            if o.settings is s or not self._dominated(o.settings)
        ]
        self._note_failure(min(splits or [s], key=lambda x: x.micro_batch))
        self.ruled_out.setdefault(s.technique_key, (s, floor))
        self.n_pruned += 1
        return True

    def _may_fall_back(self) -> bool:
        return self.request.confirm != "none" and self.n_fallback < MAX_FALLBACK_ESTIMATES

    def _prefetch_stack(self, opt: PlanOption) -> None:
        """Estimate the splits of ``opt``'s stack not dominated yet, smallest micro-batch first,
        and let the smallest one that does not fit prune the others (and larger stacks). With a
        batch function (the analytic engine's) the smallest split alone first, then, where it
        fits, the others in one call; without one (the derived and trace engines: a form per
        variant, or a trace per split) one at a time up to that first miss: the larger splits
        it prunes are never estimated."""
        engine = self.engines.search
        splits = [
            o
            for o in self.by_stack.get(opt.settings.technique_key, [opt])
            if o is opt or not self._dominated(o.settings)
        ]
        splits.sort(key=lambda o: o.settings.micro_batch)
        if self._twin_miss(splits[0]):
            # its twin with another optimizer missed and proves the smallest split misses
            # (memfit.plan.split_bound): noted as its estimate's miss was, not estimated
            self._note_failure(splits[0].settings)
            self.n_pruned += 1
            return
        if engine.batch is not None and len(splits) > 1:
            # the smallest split first, through the batch function (the same answer as the
            # call for all splits: estimate_many's batch-1 line): where it does not fit, as
            # it mostly does not, it prunes the others unestimated (one simulation, not two)
            engine.prefetch([splits[0].workload], batched=True)
            first = self.search_estimate(splits[0])
            if first.estimate is not None and not first.fits:
                self._record_failure(first)
                self.stack_miss[opt.settings.technique_key] = first
                return
            engine.prefetch([o.workload for o in splits])
        elif engine.batch is not None:
            engine.prefetch([o.workload for o in splits])
        for o in splits:
            done = self.search_estimate(o)  # cached: the batch call above estimated it
            if done.estimate is None:
                continue
            if not done.fits:
                self._record_failure(done)  # shown among the faster plans that do not fit
                break

    def _check(self, opt: PlanOption) -> PlanOption:
        self._prefetch_stack(opt)
        if self._proven_miss(opt):
            # a smaller split of the stack missed, and its estimate proves this one misses
            # outright (memfit.plan.split_bound): not estimated, never shown (analytic_floors);
            # its failure noted as its estimate's was (the antichain of failures)
            self._note_failure(opt.settings)
            self.n_pruned += 1
            return replace(opt, fits=False, reason="a smaller split of this stack does not fit")
        if self._twin_miss(opt):  # the same, from the stack's twin with another optimizer
            self._note_failure(opt.settings)
            self.n_pruned += 1
            return replace(opt, fits=False, reason="its stack with another optimizer does not fit")
        if self.engines.search.batch is None and self._dominated(opt.settings):
            # a smaller split of the stack did not fit (noted by the prefetch): ``opt`` cannot
            # either; without a batch call it was not estimated, and is not now (a form or a
            # trace). The stack's nearest miss, the one shown, is that smaller split.
            self.n_pruned += 1
            return replace(opt, fits=False, reason="a smaller split of this stack does not fit")
        done = self.search_estimate(opt)
        if done.estimate is None and self.engines.confirm is not None and self._may_fall_back():
            self.n_fallback += 1
            # the fast engine does not model this combination: ask the precise one directly
            done = self.estimate(opt, self.engines.confirm)
            if not done.fits:
                self._record_failure(done)
            return done
        if not done.fits:
            self._record_failure(done)
            return done
        return self._confirm(done)

    def _proven_miss(self, opt: PlanOption) -> bool:
        """Whether ``opt`` need not be estimated: a search that reads the recommendation alone
        (:attr:`analytic_floors`, whose misses are not shown), without a fallback to the precise
        engine, where its stack's smaller split missed and proves ``opt`` misses too
        (:func:`memfit.plan.split_bound.proven_miss`, the analytic engine's one-GPU steps)."""
        miss = self.stack_miss.get(opt.settings.technique_key)
        engine = self.engines.search
        if miss is None or miss.estimate is None or not self.analytic_floors:
            return False
        if self._may_fall_back() or engine.known(opt.workload):
            return False  # (an estimate kept already costs nothing: read as before)
        return proven_miss(miss.workload, miss.estimate, opt.workload, self.budget.capacity_bytes)

    def _twin_miss(self, opt: PlanOption) -> bool:
        """Whether ``opt`` need not be estimated (as :meth:`_proven_miss`): a stack that differs
        from it only in the optimizer missed at the same or a smaller micro-batch, by more than
        its optimizer states (:func:`memfit.plan.split_bound.proven_miss_of_other_optimizer`:
        the analytic engine's one-GPU steps)."""
        if not self.analytic_floors or self._may_fall_back():
            return False
        misses = self.twin_misses.get(_twin_key(opt.settings))
        if not misses or self.engines.search.known(opt.workload):
            return False
        w, capacity = opt.workload, self.budget.capacity_bytes
        return any(
            proven_miss_of_other_optimizer(m.workload, m.estimate, w, capacity)
            for m in misses
            if m.estimate is not None
        )

    def _confirm(self, opt: PlanOption) -> PlanOption:
        if self.engines.confirm is None:
            return opt
        mode = self.request.confirm
        if mode == "auto" and self.engines.band is not None:
            mode = "recommended"  # the band settles the others' place: only the first counts
            if self.n_found == 0 and self._band_settles(opt):
                return replace(opt, confirmed_by=None)
        if mode == "none" or (mode == "recommended" and self.n_found > 0):
            return replace(opt, confirmed_by=None)
        done = self.estimate(opt, self.engines.confirm)
        if done.estimate is None:  # the precise engine cannot run it: keep the fast estimate
            return replace(opt, confirmed_by=None, reason=f"not confirmed: {done.reason}")
        if not done.fits:
            self.n_overruled += 1
            self._record_failure(done)
        return done

    def confirm_first(self, found: list[PlanOption]) -> list[PlanOption]:
        """``confirm="auto"``: the recommended plan (``found[0]``: the tiers may put a plan
        found later first) confirmed by the precise engine unless the band settles it; one it
        overrules is dropped and the next judged the same way."""
        confirm = self.engines.confirm
        if self.request.confirm != "auto" or self.engines.band is None or confirm is None:
            return found
        while found:
            rec = found[0]
            if rec.confirmed_by == confirm.name or rec.estimate is None or self._band_settles(rec):
                return found
            done = self.estimate(rec, confirm)
            if done.estimate is None:  # the precise engine cannot run it: the fast answer stays
                reason = f"not confirmed: {done.reason}"
                return [replace(rec, confirmed_by=None, reason=reason), *found[1:]]
            if done.fits:
                return [done, *found[1:]]
            self.n_overruled += 1
            self._record_failure(done)
            found = found[1:]
        return found

    def _band_settles(self, opt: PlanOption) -> bool:
        top = self._band_top(opt)
        return top is not None and top[0]

    def _band_top(self, opt: PlanOption) -> tuple[bool, int, str] | None:
        """Whether ``opt`` (a fit by the search engine) still fits at the top of the search
        engine's validated error band (:attr:`EnginePair.band`), by THE verdict rule and the
        fast path's settling rule (:func:`memfit.estimate.fastpath.verdict_settled`), and its
        need there: where it fits, the trace cannot change its verdict and ``confirm="auto"``
        does not run it, and which reserved band it took (the job class's, or the wide one).
        None: no band, or the band's estimate failed."""
        band = self.engines.band
        if band is None:
            return None
        try:
            top = band(opt.workload)
        except MemfitError:
            return None
        judged = verdict(top, self.budget)
        which = (top.trace or {}).get("reserved_band") or "not recorded"
        settled = verdict_settled(top, self.budget.capacity_bytes, judged.verdict)
        return settled, need_bytes(top), f"reserved band: {which}"

    def _record_failure(self, opt: PlanOption) -> None:
        if opt.estimate is None:
            self.unsupported.append(opt.reason or "")
            return
        self._note_failure(opt.settings)
        self.rejected.append(opt)
        if self.analytic_floors and opt.estimate.engine == "analytic":
            self.twin_misses.setdefault(_twin_key(opt.settings), []).append(opt)

    def _note_failure(self, s: Settings) -> None:
        """Keep the failures as an antichain: a failure that keeps at least as much as a known
        one prunes nothing more, and a new one replaces those it is smaller than."""
        group = self.failed.setdefault(_group(s), [])
        if any(dominates(s, f) for f in group):
            return
        group[:] = [f for f in group if not dominates(f, s)]
        group.append(s)

    def _dominated(self, s: Settings) -> bool:
        return any(dominates(s, f) for f in self.failed.get(_group(s), ()))

    # -- the result --------------------------------------------------------------------------
    def _ruled_out_note(self) -> str:
        limit = format_bytes(self.budget.limit_bytes)
        items = [
            f"{s.describe().rsplit(', mb ', 1)[0]} ({f.what} {format_bytes(f.bytes)})"
            for s, f in self.ruled_out.values()
        ]
        return (
            f"{len(items)} technique stacks ruled out without a trace (more than the "
            f"{limit} limit at any micro-batch): " + "; ".join(items)
        )

    def _rejected_shown(self, rec: PlanOption | None) -> list[PlanOption]:
        """Per technique stack the nearest miss (the split that overflowed least); with a plan,
        only stacks predicted faster than it. Closest first: they show what almost fits."""
        ref = rec.estimate if rec is not None else None
        nearest: dict[tuple[Any, ...], PlanOption] = {}
        for r in self.rejected:
            if r.estimate is None or (rec is not None and r.cost.step_s >= rec.cost.step_s):
                continue
            key = r.settings.technique_key
            if key not in nearest or (r.need_bytes or 0) < (nearest[key].need_bytes or 0):
                nearest[key] = r
        pool = sorted(nearest.values(), key=lambda r: (r.need_bytes or 0, r.cost.step_s))
        return [
            replace(
                r,
                reason=f"{r.estimate.engine} engine: "
                + overflow_reason(r.estimate, self.budget, ref),
            )
            for r in pool[:N_REJECTED_SHOWN]
            if r.estimate is not None
        ]

    def _trace_cache_note(self) -> str | None:
        """How many trace-engine answers came from the disk cache (memfit.estimate.trace_cache)."""
        counts = [e.n_traced() for e in (self.engines.search, self.engines.confirm) if e]
        traced, kept = sum(c[0] for c in counts), sum(c[1] for c in counts)
        if not kept:
            return None
        return (
            f"trace cache: {kept} of the {traced} trace-engine answers were read from the disk "
            "cache (--no-cache traces them again)"
        )

    def result(
        self,
        found: list[PlanOption],
        baseline: PlanOption,
        elapsed_s: float,
        tier: str | None = None,
    ) -> Plan:
        rec = found[0] if found else None
        compare = self._compare(rec, found)
        shown = self._rejected_shown(rec)
        notes = [] if self.engines.reason is None else [f"engines: {self.engines.reason}"]
        if self.weigh_note is not None:
            notes.append(self.weigh_note)
        notes += self._slowdown_notes(rec, found[1:] + [o for _, o in compare])
        # where nothing fits, the nearest changes read every miss's estimate: a search with
        # ``analytic_floors`` left some out, and its caller searches again without them
        # (memfit.plan.nearest), whose nearest changes are the answer: none worked out here
        floors = self.analytic_floors
        nearest = [] if rec is not None or not shown or floors else self._nearest(shown[0])
        confirm = self.engines.confirm
        if confirm is not None and self.request.confirm in ("recommended", "none") and rec:
            which = (
                "the recommended plan only" if self.request.confirm == "recommended" else "no plan"
            )
            notes.append(
                f"confirm={self.request.confirm}: the {confirm.name} engine checked {which}"
            )
        if self.ruled_out:
            notes.append(self._ruled_out_note())
        if note := self._trace_cache_note():
            notes.append(note)
        if self.unsupported:
            notes.append(
                f"{len(self.unsupported)} combinations could not be estimated, e.g. "
                f"{self.unsupported[0]}"
            )
        tight = self._tight_shown(rec)
        if tight is not None:
            notes.append(self._tight_note(tight))
        confirmed, confirmed_why = self._confirmed(rec)
        return Plan(
            confirmed=confirmed,
            confirmed_why=confirmed_why,
            model_name=self.source.name,
            request=self.request,
            budget=self.budget,
            recommended=rec,
            alternatives=found[1:],
            baseline=baseline,
            rejected=shown,
            closest=None if rec is not None or not shown else shown[0],
            search_engine=self.engines.search.name,
            confirm_engine=None if self.engines.confirm is None else self.engines.confirm.name,
            n_candidates=self.n_candidates,
            n_estimated=self.engines.search.n_calls,
            n_pruned=self.n_pruned,
            n_overruled=self.n_overruled,
            elapsed_s=elapsed_s,
            n_confirmed=0 if confirm is None else confirm.n_calls,
            search_s=self.engines.search.elapsed_s,
            confirm_s=0.0 if confirm is None else confirm.elapsed_s,
            notes=notes,
            tier=tier,
            tier_rank=self.tier_rank(tier),
            compare=compare,
            nearest=nearest,
            tight=tight,
            n_tight_checked=self.n_tight_confirmed,
        )

    def _tight_shown(self, rec: PlanOption | None) -> PlanOption | None:
        """The memory-only tight plan left unchecked (:meth:`_settle_tight`; never one that
        offloads to host RAM, the last resort whatever its range) where it would be preferred
        to ``rec``: nothing fits, it is faster beyond a tie (:data:`RANK_TIE_FRACTION`), or
        ``rec`` changes the result."""
        tight, changing = self.tight_left, self.tight_changing
        if rec is None:
            return tight or changing
        if tight is not None and (_faster(tight, rec) or rec.changes_result):
            return tight
        if changing is None:
            return None
        if rec.changes_result and _faster(changing, rec):
            return changing
        # a memory-only recommendation that offloads to host RAM and costs several times the
        # step time of a result-changing plan that may fit (SLOWDOWN_LIMIT): both are shown
        offloads = rec.settings.offload != "none"
        return (
            changing
            if offloads and changing.cost.step_s * SLOWDOWN_LIMIT <= rec.cost.step_s
            else None
        )

    def _tight_note(self, tight: PlanOption) -> str:
        kind = "changes the result" if tight.changes_result else "memory-only"
        return (
            f"tight ({kind}): {tight.settings.describe()} ({tight_figures(tight, self.budget)}, "
            f"{tight.cost.step_s:.3g} s/step): it may fit, {tight_decider(tight)}"
        )

    def _confirmed(self, rec: PlanOption | None) -> tuple[bool | None, str]:
        """Whether the recommended plan's bytes are the precise engines' (``Plan.confirmed``),
        and why."""
        if rec is None or rec.estimate is None:
            return None, "no plan fits" if rec is None else "not estimated"
        engine, confirm, mode = rec.estimate.engine, self.engines.confirm, self.request.confirm
        if confirm is not None and rec.confirmed_by == confirm.name:
            auto = mode == "auto" and self.engines.band is not None
            why = self._band_why(rec, settled=False) if auto else f"--confirm {mode}"
            return True, f"the {confirm.name} engine checked the recommended plan ({why})"
        if engine in ("trace", "derived"):
            return True, f"the {engine} engine's bytes"
        if confirm is None:
            return False, f"the {engine} engine's answer (no precise engine to confirm it)"
        if mode == "auto" and self.engines.band is not None:
            top = self._band_top(rec)
            if top is not None and top[0]:
                return False, self._band_why(rec, settled=True) + "; --confirm traces it"
            why = (rec.reason or "").removeprefix("not confirmed: ") or "no answer"
            return False, (
                f"the {confirm.name} engine could not check it ({why}): the {engine} engine's "
                f"answer; {self._band_why(rec, settled=False)}"
            )
        return False, f"--confirm {mode}: the {engine} engine's answer"

    def _band_why(self, rec: PlanOption, *, settled: bool) -> str:
        top = self._band_top(rec)
        if top is None:
            return f"no validated error band for the {self.engines.search.name} engine's answer"
        limit = format_bytes(self.budget.limit_bytes)
        need, band = format_bytes(top[1]), top[2]
        at_top = "at the top of the analytic engine's validated band"
        if settled:
            return (
                f"it fits even {at_top} (it needs {need} of the {limit} limit; {band}): the "
                "trace cannot change the verdict"
            )
        return (
            f"{at_top} it needs {need}, over the {limit} limit ({band}): the band could change "
            "the verdict"
        )

    # -- side by side, and the way forward ------------------------------------------------------
    def _compare(
        self, rec: PlanOption | None, found: list[PlanOption]
    ) -> list[tuple[str, PlanOption]]:
        """The fastest memory-only plan and the fastest plan ``allow`` permits, where they are
        not the recommendation (searched if the tiers did not reach them)."""
        if rec is None or self.request.mode != "train":
            return []
        allowed = self.request.allow
        rows: list[tuple[str, PlanOption]] = []
        pools = (
            ("fastest memory-only", lambda o: not o.changes_result),
            ("fastest your --allow permits", lambda o: families(list(o.changes)) <= allowed),
        )
        for label, keep in pools:
            if label.endswith("permits") and not allowed:
                continue
            if keep(rec):
                continue  # the recommendation is the fastest of its tier's pool
            have = [o for o in found if keep(o)]
            best = (
                min(have, key=lambda o: o.cost.step_s)
                if have
                else next(iter(self.run([o for o in self.opts if keep(o)], wanted=1)), None)
            )
            if best is not None and all(best.settings != o.settings for _, o in rows):
                rows.append((label, best))
        return rows

    @staticmethod
    def _slowdown_notes(rec: PlanOption | None, shown: list[PlanOption]) -> list[str]:
        """A recommendation :data:`SLOWDOWN_LIMIT` times slower than a plan shown beside it
        says so, and why it is still the recommendation."""
        if rec is None:
            return []
        faster = [o for o in shown if o.fits and o.cost.step_s * SLOWDOWN_LIMIT <= rec.cost.step_s]
        if not faster:
            return []
        best = min(faster, key=lambda o: o.cost.step_s)
        why = (
            f"it changes the result ({', '.join(sorted(families(list(best.changes))))}; "
            "--allow to prefer it)"
            if best.changes_result and not rec.changes_result
            else "it carries more quality risk"
            if best.risk_level > rec.risk_level
            else "the planner ranks by its tiers first"
        )
        return [
            f"slower: the recommendation is predicted "
            f"{rec.cost.step_s / best.cost.step_s:.1f}x slower than {best.settings.describe()}, "
            f"shown beside it: {why}"
        ]

    def _nearest(self, closest: PlanOption) -> list[dict[str, Any]]:
        """When nothing fits: the nearest changes that do — a shorter sequence for the closest
        attempt, and the cheapest GPUs (on-demand price) that hold the smallest attempt without
        offloading (the closest one where every attempt offloads). A GPU without bf16 is not
        offered for a bf16 plan, nor a non-NVIDIA one for a bitsandbytes plan."""
        out: list[dict[str, Any]] = []
        by_need = sorted(
            (r for r in self.rejected if r.need_bytes is not None),
            key=lambda r: r.need_bytes or 0,
        )
        stacks: dict[tuple[Any, ...], PlanOption] = {}
        for r in [closest, *by_need]:  # the closest attempt, then the nearest other stacks
            stacks.setdefault(r.settings.technique_key, r)
        if saved := self._without_saved_modules(list(stacks.values())):
            out.append(saved)
        # the loss / host-checkpoint variants of one stack come first by need; a shorter sequence
        # may need a stack further down (parameter offload): try up to 12 (a few ms each)
        for attempt in list(stacks.values())[:12]:
            seq = self._largest_seq(attempt)
            if seq:
                out.append(
                    {
                        "change": f"--seq {seq} (asked {self.request.seq_len})",
                        "plan": attempt.settings.describe(),
                        "kind": "changes the job",
                    }
                )
                break
        on_device = [
            r for r in self.rejected if r.need_bytes is not None and r.settings.offload == "none"
        ]
        targets = [min(on_device, key=lambda r: r.need_bytes or 0)] if on_device else []
        for target in [*targets, closest]:
            rows = self._gpus_holding(target)
            if rows:
                out += rows
                break
        return out

    def _without_saved_modules(self, stacks: list[PlanOption]) -> dict[str, Any] | None:
        """When the asked LoRA trains modules in full (peft ``modules_to_save``: a full copy of
        each, its gradients and optimizer states) and nothing fits: the nearest stack that fits
        without them — those keeping the asked weight format first (a practitioner drops the
        copies or shortens the sequence before changing the quantization) — at the asked
        sequence or the longest shorter one. It changes what is trained: the named modules stay
        frozen (needed only where the job adds tokens to the vocabulary)."""
        saved = self.request.lora_modules_to_save
        if not saved or self.request.mode != "train":
            return None
        ordered = sorted(stacks, key=lambda r: r.settings.quant != self.request.quant)
        engine, seq = self.engines.search, self.request.seq_len
        for attempt in ordered[:12]:
            tech = attempt.settings.techniques.flat()
            tech["lora_modules_to_save"] = ()
            s = replace(attempt.settings, techniques=TechniqueSpec.from_flat(**tech))
            try:
                ok = fits(engine(s.workload("train", seq)), self.budget)
            except MemfitError:
                continue
            longest = None if ok else self._largest_seq_of(s)
            if ok or longest:
                shorter = f" and --seq {longest} (asked {seq})" if longest else ""
                return {
                    "change": f"no --lora-modules-to-save ({','.join(saved)} stay frozen)"
                    + shorter,
                    "plan": s.describe(),
                    "kind": "changes what is trained",
                }
        return None

    def _gpus_holding(self, target: PlanOption) -> list[dict[str, Any]]:
        """The 3 cheapest catalog GPUs (on-demand price) whose memory holds ``target``."""
        s, need = target.settings, target.need_bytes
        if need is None:
            return []
        bnb = s.quant in ("int8", "nf4", "nf4-dq", "fp4") or "8bit" in str(s.optimizer)
        prices = load_prices()
        gpus = []
        for g in list_gpus():
            if s.precision.startswith("bf16") and not g.supports_bf16:
                continue
            if bnb and g.vendor != "nvidia":
                continue
            budget = Budget.of(g, headroom=self.request.headroom)
            if budget.limit_bytes < need or g.name == self.budget.gpu_name:
                continue
            hourly = getattr(prices.of(g), "usd_per_hour", None)
            gpus.append((hourly if hourly is not None else math.inf, g.name, hourly))
        out = []
        for _, name, usd in sorted(gpus)[:3]:
            cost = f" (${usd * self.request.gpus:.2f}/h)" if usd is not None else ""
            out.append(
                {
                    "change": f"--gpu {name}{cost}",
                    "plan": s.describe(),
                    "kind": "another GPU",
                    "usd_per_hour": usd,
                }
            )
        return out

    def _largest_seq(self, closest: PlanOption) -> int | None:
        """The longest sequence (a multiple of 256 below the asked one) at which the closest
        attempt fits, by the search engine; None when not even 256 tokens do."""
        return self._largest_seq_of(closest.settings)

    def _largest_seq_of(self, s: Settings) -> int | None:
        """:meth:`_largest_seq` of the settings ``s``."""
        if self.request.mode != "train":
            return None
        engine = self.engines.search
        lo, hi = 0, self.request.seq_len // 256
        if self.request.seq_len % 256 == 0:
            hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            try:
                ok = fits(engine(s.workload("train", mid * 256)), self.budget)
            except MemfitError:
                ok = False
            lo, hi = (mid, hi) if ok else (lo, mid - 1)
        return lo * 256 if lo else None


def rank_key(o: PlanOption) -> tuple[int, int, int, int, float, int]:
    """The order plans are visited and recommended in (goal ``throughput``): predicted step time
    in buckets of :data:`RANK_TIE_FRACTION`, then the lower quality risk, then the fewer
    result-changing changes (at equal risk, one change a practitioner knows — QLoRA's 4-bit
    base — before two stacked ones, e.g. int8 weights + 8-bit states of a few adapters), then
    fewer changes that need another library's kernels (:func:`other_kernels`), then the step
    time, then the larger micro-batch (fewer, larger kernels)."""
    bucket = math.floor(math.log(max(o.cost.step_s, 1e-12)) / math.log1p(RANK_TIE_FRACTION))
    return (
        bucket, o.risk_level, len(o.risk_reasons), other_kernels(o), o.cost.step_s,
        -o.settings.micro_batch,
    )  # fmt: skip


def other_kernels(o: PlanOption) -> int:
    """Changes the job's own code cannot make with a setting: a fused cross-entropy (Liger,
    Unsloth) or checkpoints in host RAM (Unsloth) the recipe does not use. Within a tie they
    rank after the plans without them."""
    texts = (*LOSS_CHANGE.values(), *CHECKPOINTING_CHANGE.values())
    return sum(c.what in texts for c in o.changes)


def risk_first_key(o: PlanOption) -> tuple[int, int, int, int, float, int]:
    """The order of the result-changing tier: the least quality risk first, then as
    :func:`rank_key`."""
    bucket, risk, n_changes, kernels, step_s, mb = rank_key(o)
    return (risk, n_changes, bucket, kernels, step_s, mb)


def _faster(a: PlanOption, b: PlanOption) -> bool:
    """Whether ``a`` is predicted faster than ``b`` beyond a tie (:data:`RANK_TIE_FRACTION`)."""
    return a.cost.step_s * (1 + RANK_TIE_FRACTION) < b.cost.step_s


def _twin_key(s: Settings) -> tuple[Any, ...]:
    """``s``'s technique stack less its optimizer: the stacks :meth:`_Search._twin_miss` relates
    (the bound compares the two workloads field by field before it claims anything)."""
    return (
        s.precision, s.quant, s.attention, s.checkpointing, s.lora_rank, s.freeze_layers,
        s.shard, s.offload, s.tp, s.prepare_kbit, s.techniques.optimizer_in_bwd, s.loss,
    )  # fmt: skip


def _group(s: Settings) -> tuple[Any, ...]:
    """Settings :func:`dominates` compares only when equal: a failure is looked up among its
    group's."""
    return (s.attention, s.tp, s.lora_rank is None)

"""``upgrade_verdict()``: the seed's "when should you upgrade" checklist, computed from plans.

Each item is *triggered*, *not triggered* or *not applicable*, with the numbers behind it:

- ``plan_exceeds_vram``: the fastest plan the planner finds (offload allowed) still does not fit.
- ``context_unreachable``: even one sample / request at the requested context does not fit with
  the leanest plan (the planner's ``memory`` goal at batch 1); ``fit --solve seq`` says how far
  it gets.
- ``throughput_target``: the largest batch that fits with the recommended plan, at its predicted
  step time (the roofline of :mod:`memfit.plan.cost`), stays below ``throughput_target``.
- ``kv_cache_concurrency`` (inference): fewer concurrent requests of the requested context fit
  than asked for (``fit --solve concurrency``), with the KV cache per request.
- ``impractical_recompute_offload`` (training): the fastest plan that fits needs full
  recomputation or offload and is predicted at least ``impractical_slowdown`` times slower than
  the naive stack without memory constraints (the plan's baseline).
- ``precision_support``: the model's weights are bf16 (config ``torch_dtype``) on a GPU without
  bf16 tensor cores (pre-Ampere), or fp8 (``quantization_config``) without fp8 (pre-Ada/Hopper).
- ``bandwidth`` (inference): decode tokens/s per request with the recommended plan below
  ``decode_floor_tokens_per_s`` (decode is memory-bound: weights + KV cache read per token).

The seed's last item ("missing precision support or bandwidth") is split into the last two.
Verdict: ``upgrade`` when an item is triggered; else ``stay`` when the naive stack already fits,
``optimize_first`` when only a planned stack does. With ``recommend``, the GPUs of the catalog
(and counts, via :func:`memfit.plan.recommend_gpus`) on which every triggered item is resolved.

Estimates come from the analytic engine (milliseconds); a combination it does not model yet is
sent to the trace engine, at most :data:`MAX_TRACE_FALLBACKS` per GPU, and said in the notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import SpecError
from memfit.estimate import policy
from memfit.estimate.result import MemoryEstimate
from memfit.models.model_spec import ModelSpec
from memfit.plan.advice import GPU_COUNTS, GPUAdvice, recommend_gpus
from memfit.plan.budget import DEFAULT_HEADROOM, Budget
from memfit.plan.cost import (
    COST_CONSTANTS,
    ModelFacts,
    Rates,
    StepCost,
    infer_cost,
    train_step_cost,
)
from memfit.plan.engines import CachedEstimator, Estimator
from memfit.plan.request import PlanOption, PlanRequest
from memfit.plan.search import Plan, plan
from memfit.plan.solve import fit
from memfit.plan.space import Settings
from memfit.units import format_bytes

#: Thresholds of the checklist, each a rule of thumb chosen here, with its reason.
UPGRADE_THRESHOLDS: dict[str, tuple[float, str]] = {
    "impractical_slowdown": (
        2.0,
        "a plan predicted to take twice the step time of the naive stack doubles the GPU-hours "
        "of the job; full recomputation alone costs one extra forward of the three passes "
        "(+33 %, Chen et al. 2016), so the bound is only reached with offload or several "
        "slowdowns stacked",
    ),
    "decode_floor_tokens_per_s": (
        10.0,
        "tokens/s each request must stream at to stay ahead of a reader: ~250 words/min at "
        "~1.3 tokens/word is ~5.5 tokens/s; memfit asks for about twice that",
    ),
}
#: Plans the checklist counts as "optimized": up to medium quality risk (4-bit base weights,
#: Adafactor), not high (pure fp16 without loss scaling, FP4): a plan that fits only by risking
#: divergence is not a reason to stay (levels: memfit.plan.space.RISKS).
DEFAULT_MAX_QUALITY_RISK = "medium"
#: Decode steps the bandwidth item assumes when the request generates none (``new_tokens`` 0).
DECODE_PROBE_TOKENS = 256
#: Trace-engine estimates per GPU, by default, for combinations the analytic engine does not model
#: yet: none, to keep a verdict to seconds (the trace engine takes 5-10 s per estimate of a 7B
#: model on a laptop CPU); such combinations count as "could not be estimated" and can leave an
#: item ``unknown``. ``trace_fallbacks`` (``--trace-fallbacks``) raises it.
MAX_TRACE_FALLBACKS = 0

#: ``unknown``: nothing estimated fits, but some combinations could not be estimated (the engine
#: does not model them yet), so they might fit; the verdict is then ``undetermined``.
STATUSES = ("triggered", "not_triggered", "not_applicable", "unknown")
VERDICTS = ("stay", "optimize_first", "upgrade", "undetermined")
ITEMS: dict[str, str] = {
    "plan_exceeds_vram": "the optimized plan still exceeds VRAM",
    "context_unreachable": "the required context cannot be reached",
    "throughput_target": "the largest batch is too small for the throughput target",
    "kv_cache_concurrency": "concurrent requests x context exhaust the KV cache",
    "impractical_recompute_offload": "only impractical recomputation / offload fits",
    "precision_support": "the GPU lacks a precision the model needs",
    "bandwidth": "memory bandwidth too low for interactive decode",
}


def _t(name: str) -> float:
    return UPGRADE_THRESHOLDS[name][0]


@dataclass(frozen=True, kw_only=True)
class CheckItem:
    """One checklist item: its status, the evidence in words, and the numbers behind it."""

    id: str
    status: str
    evidence: str
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return ITEMS[self.id]

    @property
    def triggered(self) -> bool:
        return self.status == "triggered"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "evidence": self.evidence,
            "numbers": dict(self.numbers),
        }


@dataclass(frozen=True, kw_only=True)
class UpgradeVerdict:
    """The checklist for one job on one GPU (x ``request.gpus``), and the verdict."""

    model_name: str
    gpu_name: str
    request: PlanRequest
    context_tokens: int
    concurrency: int | None
    throughput_target: float | None
    items: list[CheckItem]
    verdict: str
    summary: str
    plan: Plan
    resolving: list[GPUAdvice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def upgrade(self) -> bool:
        return self.verdict == "upgrade"

    def item(self, item_id: str) -> CheckItem:
        return next(i for i in self.items if i.id == item_id)

    def to_json(self) -> dict[str, Any]:
        rec = self.plan.recommended
        return {
            "model": self.model_name,
            "gpu": self.gpu_name,
            "gpus": self.request.gpus,
            "request": self.request.to_json(),
            "context_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "throughput_target": self.throughput_target,
            "verdict": self.verdict,
            "upgrade": self.upgrade,
            "summary": self.summary,
            "items": [i.to_json() for i in self.items],
            "recommended_plan": None if rec is None else rec.settings.describe(),
            "resolving_gpus": [a.to_json() for a in self.resolving],
            "thresholds": {k: v for k, (v, _) in UPGRADE_THRESHOLDS.items()},
            "notes": list(self.notes),
        }


#: The checklist's estimator is the engine policy's (``EnginePolicy.analytic_first``).
AnalyticFirst = policy.AnalyticFirst


def upgrade_verdict(
    model: Any,
    *,
    gpu: Any,
    mode: str = "train",
    seq_len: int = 512,
    batch_size: int | None = None,
    global_batch: int | None = None,
    gpus: int = 1,
    new_tokens: int = 0,
    concurrency: int | None = None,
    context: int | None = None,
    throughput_target: float | None = None,
    headroom: float = DEFAULT_HEADROOM,
    max_quality_risk: str = DEFAULT_MAX_QUALITY_RISK,
    recommend: bool = True,
    trace_fallbacks: int = MAX_TRACE_FALLBACKS,
    estimator: Estimator | None = None,
) -> UpgradeVerdict:
    """The upgrade checklist for ``model`` on ``gpus`` x ``gpu`` (catalog name or record).

    Inference: ``seq_len`` is the prompt, ``context`` the tokens each request holds at the end
    (default ``seq_len + new_tokens``), ``concurrency`` the requests served at once (default
    ``batch_size`` or 1). ``throughput_target``: tokens/s over all GPUs (training: tokens
    trained; inference: tokens generated, or prompt tokens without generation). ``estimator``:
    ``Callable[[WorkloadSpec], MemoryEstimate]`` for every GPU (tests); default analytic first."""
    from memfit.hardware import get_gpu
    from memfit.models import ModelSource, resolve_model

    if gpu is None:
        raise SpecError("upgrade needs --gpu NAME: the GPU you have or plan to use")
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    gpu_rec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    request, ctx_tokens, conc = _request(
        mode, seq_len, batch_size, global_batch, gpus, new_tokens, concurrency, context,
        throughput_target, headroom, max_quality_risk,
    )  # fmt: skip
    if not isinstance(trace_fallbacks, int) or trace_fallbacks < 0:
        raise SpecError(f"trace_fallbacks ({trace_fallbacks!r}) must be a whole number >= 0")
    engine = _Engine(source, estimator, trace_fallbacks)
    job = _Job(source, gpu_rec, request, ctx_tokens, conc, throughput_target, engine)
    items = job.items()
    triggered = [i for i in items if i.triggered]
    verdict, summary = _verdict(job, items)
    resolving = job.resolving(triggered) if recommend and triggered else []
    notes = job.notes()
    if recommend and triggered and not resolving:
        notes.append("no GPU of the catalog (1, 2, 4 or 8 per job) resolves every triggered item")
    return UpgradeVerdict(
        model_name=source.name,
        gpu_name=gpu_rec.name,
        request=request,
        context_tokens=ctx_tokens,
        concurrency=conc,
        throughput_target=throughput_target,
        items=items,
        verdict=verdict,
        summary=summary,
        plan=job.plan,
        resolving=resolving,
        notes=notes,
    )


def _request(
    mode: str,
    seq_len: int,
    batch_size: int | None,
    global_batch: int | None,
    gpus: int,
    new_tokens: int,
    concurrency: int | None,
    context: int | None,
    throughput_target: float | None,
    headroom: float,
    max_quality_risk: str,
) -> tuple[PlanRequest, int, int | None]:
    """The planner request, the context per sample / request, and the concurrency (inference)."""
    p: list[str] = []
    if mode == "train":
        if concurrency is not None or context is not None:
            p.append("concurrency / context (--concurrency, --context) are inference settings")
    elif concurrency is not None and batch_size is not None and concurrency != batch_size:
        p.append(f"give batch_size ({batch_size}) or concurrency ({concurrency}), not both")
    if context is not None and isinstance(seq_len, int) and context < seq_len:
        p.append(f"context ({context}) must be >= seq_len ({seq_len}): it includes the prompt")
    if throughput_target is not None and not throughput_target > 0:
        p.append(f"throughput_target ({throughput_target}) must be > 0 tokens/s")
    if p:
        raise SpecError.from_problems(p)
    if mode == "train":
        req = PlanRequest(
            mode="train", seq_len=seq_len, batch_size=batch_size, global_batch=global_batch,
            gpus=gpus, headroom=headroom, allow_offload=True, n_alternatives=0,
            max_quality_risk=max_quality_risk,
        )  # fmt: skip
        return req, seq_len, None
    conc = concurrency if concurrency is not None else batch_size or 1
    n_new = (context - seq_len) if context is not None else new_tokens
    req = PlanRequest(
        mode="infer", seq_len=seq_len, batch_size=conc, global_batch=global_batch,
        new_tokens=n_new, gpus=gpus, headroom=headroom, n_alternatives=0,
        max_quality_risk=max_quality_risk,
    )  # fmt: skip
    return req, seq_len + n_new, conc


class _Engine:
    """The estimators of one verdict: the injected one, or one :class:`AnalyticFirst` per GPU
    (the GPU sets the CUDA context and workspaces), memoised."""

    def __init__(self, source: Any, injected: Estimator | None, trace_fallbacks: int) -> None:
        self.source, self.injected, self.trace_fallbacks = source, injected, trace_fallbacks
        self.engines: dict[str, tuple[AnalyticFirst, CachedEstimator]] = {}

    def for_gpu(self, gpu: Any, *, trace: bool = True) -> Estimator:
        """``trace=False``: analytic only (the catalog scan for resolving GPUs)."""
        if self.injected is not None:
            return self.injected
        key = f"{gpu.name}:{trace}"
        if key not in self.engines:
            first = policy.AUTO.analytic_first(
                self.source, gpu, max_trace=self.trace_fallbacks if trace else 0
            )
            self.engines[key] = (first, CachedEstimator(first, "analytic"))
        return self.engines[key][1]

    def notes(self) -> list[str]:
        used = [e for e, _ in self.engines.values() if e.n_trace]
        if not used:
            return []
        n = sum(e.n_trace for e in used)
        return [
            f"{n} estimates by the trace engine: the analytic engine does not model them yet "
            f"(e.g. {used[0].rejected[0]})"
        ]


class _Job:
    """One verdict's state: the model, the GPU, the plans and solves the items share."""

    def __init__(
        self,
        source: Any,
        gpu: Any,
        request: PlanRequest,
        context_tokens: int,
        concurrency: int | None,
        target: float | None,
        engine: _Engine,
    ) -> None:
        self.source, self.gpu, self.request = source, gpu, request
        self.context_tokens, self.concurrency, self.target = context_tokens, concurrency, target
        self.engine = engine
        self.scan_notes: list[str] = []
        self.estimator_for = engine.for_gpu
        self.estimator = engine.for_gpu(gpu)
        self.budget = Budget.of(gpu, headroom=request.headroom)
        self.rates = Rates.of(gpu)
        self.plan = plan(source, request, gpu=gpu, estimator=self.estimator)
        lean_req = replace(request, goal="memory", batch_size=1, global_batch=None)
        self.lean = plan(source, lean_req, gpu=gpu, estimator=self.estimator)
        n_params = _n_params(self.plan) or _n_params(self.lean) or 1
        self.facts = ModelFacts.from_spec(source.spec, n_params)

    def notes(self) -> list[str]:
        return list(self.plan.notes) + self.engine.notes() + self.scan_notes

    # -- the items ----------------------------------------------------------------------------
    def items(self) -> list[CheckItem]:
        return [
            self.plan_exceeds_vram(),
            self.context_unreachable(),
            self.throughput_target(),
            self.kv_cache_concurrency(),
            self.impractical_recompute_offload(),
            self.precision_support(),
            self.bandwidth(),
        ]

    def plan_exceeds_vram(self) -> CheckItem:
        p, limit = self.plan, self.budget.limit_bytes
        rec = p.recommended
        if rec is not None:
            return CheckItem(
                id="plan_exceeds_vram",
                status="not_triggered",
                evidence=f"the fastest plan that fits needs {_mem(rec)} of the "
                f"{format_bytes(limit)} limit: {rec.settings.describe()}",
                numbers={"need_bytes": rec.need_bytes, "limit_bytes": limit},
            )
        closest = p.closest
        text = f"no plan of {p.n_candidates} combinations fits within {format_bytes(limit)}"
        numbers: dict[str, Any] = {"limit_bytes": limit, "n_candidates": p.n_candidates}
        if closest is not None:
            text += f"; closest: {closest.settings.describe()}, {closest.reason}"
            numbers["closest_need_bytes"] = closest.need_bytes
            numbers["over_bytes"] = (closest.need_bytes or 0) - limit
        status = "triggered"
        if _incomplete(p):
            status, text = "unknown", text + f"; but {_unestimated(p)}: they might fit"
        return CheckItem(id="plan_exceeds_vram", status=status, evidence=text, numbers=numbers)

    def context_unreachable(self) -> CheckItem:
        unit, want = self._unit(), self.context_tokens
        limit = _model_context_limit(self.source.spec)
        if limit is not None and want > limit:
            return CheckItem(
                id="context_unreachable",
                status="not_applicable",
                evidence=f"{want} tokens exceed the model's own context limit ({limit}, "
                "config.json): no GPU changes that",
                numbers={"context_tokens": want, "model_limit_tokens": limit},
            )
        lean = self.lean.recommended or self.lean.closest
        if lean is None:
            return CheckItem(
                id="context_unreachable",
                status="unknown",
                evidence=f"no plan at batch 1 could be estimated: {_unestimated(self.lean)}",
            )
        max_ctx = self._max_context(lean.settings)
        numbers = {"context_tokens": want, "max_context_tokens": max_ctx}
        if self.lean.recommended is not None:
            shown = f"{max_ctx} tokens" if max_ctx >= want else f"at least {want} tokens"
            return CheckItem(
                id="context_unreachable",
                status="not_triggered",
                evidence=f"one {unit} of {want} tokens fits with the leanest plan "
                f"({lean.settings.describe()}, {_mem(lean)}); the longest that fits: {shown}",
                numbers=numbers,
            )
        text = (
            f"even one {unit} of {want} tokens does not fit with the leanest plan "
            f"({lean.settings.describe()}): {lean.reason}; the longest that fits is {max_ctx} "
            f"tokens ({max_ctx / want:.0%} of the requested context)"
        )
        status = "triggered"
        if _incomplete(self.lean):
            status, text = "unknown", text + f"; but {_unestimated(self.lean)}: they might fit"
        return CheckItem(id="context_unreachable", status=status, evidence=text, numbers=numbers)

    def throughput_target(self) -> CheckItem:
        rec = self.plan.recommended
        if self.target is None:
            return _na("throughput_target", "no throughput target given (--throughput-target)")
        if rec is None:
            return _na("throughput_target", "no plan fits (plan_exceeds_vram)")
        solve = "concurrency" if self.request.mode == "infer" else "batch"
        r = self._fit(rec.settings, solve)
        best = replace(rec.settings, micro_batch=max(r.max_value, 1), grad_accum=1)
        cost = self._cost(best, r.estimate, self.rates)
        numbers = {
            "max_batch": r.max_value,
            "step_s": cost.step_s,
            "tokens_per_s": cost.tokens_per_s,
            "target_tokens_per_s": self.target,
        }
        mfu = COST_CONSTANTS["mfu"][0]
        text = (
            f"the largest {'concurrency per replica' if solve == 'concurrency' else 'micro-batch'}"
            f" that fits with the recommended plan is {r.max_value}: predicted {cost.step_s:.3g} "
            f"s/step, {cost.tokens_per_s:,.0f} tokens/s (roofline at MFU {mfu:.0%})"
        )
        if cost.tokens_per_s < self.target:
            text += f" < the target {self.target:,.0f} tokens/s"
            return CheckItem(
                id="throughput_target", status="triggered", evidence=text, numbers=numbers
            )
        text += f" >= the target {self.target:,.0f} tokens/s"
        return CheckItem(
            id="throughput_target", status="not_triggered", evidence=text, numbers=numbers
        )

    def kv_cache_concurrency(self) -> CheckItem:
        if self.request.mode != "infer" or self.concurrency is None:
            return _na("kv_cache_concurrency", "training job: no KV cache")
        want, ctx = self.concurrency, self.context_tokens
        stack = self.plan.recommended or self.lean.recommended
        if stack is None:
            unknown = _incomplete(self.lean) or self.lean.closest is None
            return CheckItem(
                id="kv_cache_concurrency",
                status="unknown" if unknown else "triggered",
                evidence=f"not even one request of {ctx} tokens fits (context_unreachable)"
                if not unknown
                else f"no plan for one request could be checked: {_unestimated(self.lean)}",
                numbers={"concurrency": want, "max_concurrency": 0},
            )
        r = self._fit(stack.settings, "concurrency")
        dp = stack.settings.dp
        most = r.max_value * dp
        per_request = _kv_per_request(r.estimate)
        numbers = {
            "concurrency": want,
            "max_concurrency": most,
            "context_tokens": ctx,
            "kv_cache_bytes_per_request": per_request,
            "kv_cache_bytes_requested": per_request * want,
        }
        text = (
            f"{most} concurrent requests of {ctx} tokens fit ({stack.settings.describe()}); each "
            f"holds {format_bytes(per_request)} of KV cache, {want} hold "
            f"{format_bytes(per_request * want)}"
        )
        status = "triggered" if most < want else "not_triggered"
        text += f" ({'fewer' if most < want else 'at least as many'} than the {want} requested)"
        return CheckItem(id="kv_cache_concurrency", status=status, evidence=text, numbers=numbers)

    def impractical_recompute_offload(self) -> CheckItem:
        rec = self.plan.recommended
        if self.request.mode != "train":
            return _na("impractical_recompute_offload", "inference: no recomputation or offload")
        if rec is None:
            return _na("impractical_recompute_offload", "no plan fits (plan_exceeds_vram)")
        s, base = rec.settings, self.plan.baseline
        slowdown = rec.cost.step_s / base.cost.step_s
        uses = []
        if s.checkpointing == "full":
            uses.append("full recomputation")
        if s.offload != "none":
            uses.append(f"offload of the {s.offload}")
        numbers = {
            "slowdown": slowdown,
            "step_s": rec.cost.step_s,
            "unconstrained_step_s": base.cost.step_s,
            "threshold": _t("impractical_slowdown"),
        }
        if not uses:
            text = f"the fastest plan that fits ({s.describe()}) needs neither full recomputation "
            text += f"nor offload ({slowdown:.2f}x the naive stack's step time)"
            return CheckItem(
                id="impractical_recompute_offload", status="not_triggered", evidence=text,
                numbers=numbers,
            )  # fmt: skip
        impractical = slowdown >= _t("impractical_slowdown")
        text = (
            f"the fastest plan that fits uses {' and '.join(uses)}: predicted {rec.cost.step_s:.3g}"
            f" s/step vs {base.cost.step_s:.3g} s for the naive stack without memory limits "
            f"({base.settings.describe()}): {slowdown:.2f}x, "
            f"{'>=' if impractical else '<'} the {_t('impractical_slowdown'):g}x bound"
        )
        status = "triggered" if impractical else "not_triggered"
        return CheckItem(
            id="impractical_recompute_offload", status=status, evidence=text, numbers=numbers
        )

    def precision_support(self) -> CheckItem:
        return precision_item(self.source.spec, self.gpu)

    def bandwidth(self) -> CheckItem:
        rec = self.plan.recommended
        if self.request.mode != "infer":
            return _na("bandwidth", "training job: no decode")
        if rec is None:
            return _na("bandwidth", "no plan fits (plan_exceeds_vram)")
        rate, step_s = self._decode_rate(rec.settings, self.rates)
        floor = _t("decode_floor_tokens_per_s")
        status = "triggered" if rate < floor else "not_triggered"
        text = (
            f"each decode step of the recommended plan ({rec.settings.describe()}) reads the "
            f"weights and the KV cache at {self.gpu.memory_bandwidth_gbps:g} GB/s: predicted "
            f"{step_s * 1000:.3g} ms/token, {rate:.1f} tokens/s per request "
            f"({'<' if rate < floor else '>='} the floor of {floor:g})"
        )
        numbers = {"tokens_per_s_per_request": rate, "floor_tokens_per_s": floor}
        return CheckItem(id="bandwidth", status=status, evidence=text, numbers=numbers)

    # -- helpers -------------------------------------------------------------------------------
    def _unit(self) -> str:
        return "request" if self.request.mode == "infer" else "sample"

    def _fit(self, s: Settings, solve: str) -> Any:
        r = self.request
        w = s.workload(r.mode, r.seq_len, r.new_tokens)
        return fit(
            self.source, w, solve=solve, gpu=self.gpu, headroom=r.headroom,
            estimator=self.estimator, kv_table=False,
        )  # fmt: skip

    def _max_context(self, s: Settings) -> int:
        r = self._fit(replace(s, micro_batch=1, grad_accum=1), "seq")
        return r.max_value + self.request.new_tokens if r.max_value else 0

    def _cost(self, s: Settings, est: MemoryEstimate | None, rates: Rates) -> StepCost:
        r = self.request
        if r.mode == "infer":
            return infer_cost(s, self.facts, rates, seq_len=r.seq_len, new_tokens=r.new_tokens)
        share = 1.0 if est is None else est.n_trainable_params / max(est.n_params, 1)
        return train_step_cost(s, self.facts, rates, seq_len=r.seq_len, trainable_fraction=share)

    def _decode_rate(self, s: Settings, rates: Rates) -> tuple[float, float]:
        """Tokens/s each request receives, and the time of one decode step."""
        n_new = self.request.new_tokens or DECODE_PROBE_TOKENS
        c = infer_cost(s, self.facts, rates, seq_len=self.request.seq_len, new_tokens=n_new)
        step_s = c.parts_s["decode"] / n_new
        return 1.0 / step_s, step_s

    # -- which GPUs resolve the triggered items -----------------------------------------------
    def resolving(self, triggered: list[CheckItem]) -> list[GPUAdvice]:
        from memfit.hardware import list_gpus

        ids = {i.id for i in triggered}
        out: list[GPUAdvice] = []
        no_rates = [g.name for g in list_gpus() if not has_rates(g)]
        if no_rates:
            self.scan_notes.append(
                f"not scanned (no published compute rate or memory bandwidth in the catalog): "
                f"{', '.join(no_rates)}"
            )
        for g in list_gpus():
            if not has_rates(g):
                continue
            counts = tuple(
                n for n in GPU_COUNTS if (g.name, n) != (self.gpu.name, self.request.gpus)
            )
            est = self.estimator_for(g, trace=False)
            for advice in recommend_gpus(
                self.source, self.request, gpus=[g], counts=counts, estimator=est
            ):
                if self._resolves(advice, g, ids):
                    out.append(advice)
        out.sort(key=lambda a: -a.best.cost.tokens_per_s)
        return out

    def _resolves(self, a: GPUAdvice, gpu: Any, ids: set[str]) -> bool:
        """A plan fits on ``a`` (so the batch, context and concurrency asked for fit); check the
        remaining items on its best plan."""
        best = a.best
        if "precision_support" in ids and precision_item(self.source.spec, gpu).triggered:
            return False
        if "throughput_target" in ids and best.cost.tokens_per_s < (self.target or 0):
            return False
        if "impractical_recompute_offload" in ids:
            slowdown = best.cost.step_s / a.plan.baseline.cost.step_s
            if slowdown >= _t("impractical_slowdown"):
                return False
        if "bandwidth" in ids:
            rate, _ = self._decode_rate(best.settings, Rates.of(gpu))
            if rate < _t("decode_floor_tokens_per_s"):
                return False
        return True


def _verdict(job: _Job, items: list[CheckItem]) -> tuple[str, str]:
    triggered = [i.id for i in items if i.triggered]
    unknown = [i.id for i in items if i.status == "unknown"]
    if triggered:
        return "upgrade", f"upgrade: {len(triggered)} item(s) triggered ({', '.join(triggered)})"
    if unknown:
        return "undetermined", (
            f"undetermined: {', '.join(unknown)} could not be decided because combinations the "
            "analytic engine does not model yet were not estimated; rerun with "
            "--trace-fallbacks 16 (slower) or see `memfit plan`"
        )
    base, rec = job.plan.baseline, job.plan.recommended
    if base.fits:
        return "stay", f"stay: the job fits as it is ({base.settings.describe()}, {_mem(base)})"
    plan_text = rec.settings.describe() if rec is not None else "the plan"
    return "optimize_first", (
        f"optimize first: the naive stack does not fit but {plan_text} does "
        f"(`memfit plan` gives the settings)"
    )


def precision_item(model: ModelSpec | dict[str, Any] | None, gpu: Any) -> CheckItem:
    """bf16 weights on a GPU without bf16, fp8 weights on one without fp8 (catalog flags);
    ``model`` is a ModelSpec or its config.json dict."""
    spec = None if model is None else ModelSpec.of(model)
    needs = _needed_precisions(spec)
    if not needs:
        dtype = spec.dtype if spec is not None else None
        return _na(
            "precision_support", f"the model's weights (torch_dtype {dtype}) need no bf16 or fp8"
        )
    have = {"bf16": gpu.supports_bf16, "fp8": gpu.supports_fp8}
    missing = [p for p in needs if not have[p]]
    numbers = {"needs": list(needs), "missing": missing, "arch": gpu.arch}
    if missing:
        text = (
            f"the model's weights are {'/'.join(missing)} and {gpu.name} ({gpu.arch}) has no "
            f"{'/'.join(missing)} tensor cores: "
        )
        text += "fp16 autocast can overflow on bf16-pretrained weights" if "bf16" in missing else ""
        text += "; " if len(missing) == 2 else ""
        text += "fp8 weights must be upcast (2x the memory)" if "fp8" in missing else ""
        return CheckItem(id="precision_support", status="triggered", evidence=text, numbers=numbers)
    text = f"{gpu.name} ({gpu.arch}) runs {'/'.join(needs)}, as the model's weights need"
    return CheckItem(id="precision_support", status="not_triggered", evidence=text, numbers=numbers)


def has_rates(gpu: Any) -> bool:
    """The cost model needs a bandwidth and a 16-bit tensor rate (rows without published rates
    are skipped when recommending)."""
    rate = gpu.fp16_dense_tflops or gpu.bf16_dense_tflops
    return bool(gpu.memory_bandwidth_gbps and rate)


def _needed_precisions(spec: ModelSpec | None) -> tuple[str, ...]:
    if spec is None:
        return ()
    dtype, quant = spec.text_field("dtype"), spec.text_field("quantization")
    needs = []
    if str(dtype or "").lower() in ("bfloat16", "bf16"):
        needs.append("bf16")
    if str(quant.method if quant else "").lower() == "fp8" or "float8" in str(dtype):
        needs.append("fp8")
    return tuple(needs)


def _model_context_limit(spec: ModelSpec | None) -> int | None:
    return spec.context_limit if spec is not None else None


def _incomplete(p: Plan) -> bool:
    """Whether the search skipped combinations its engine could not estimate (the planner says so
    in its notes)."""
    return any("could not be estimated" in n for n in p.notes)


def _unestimated(p: Plan) -> str:
    found = [n for n in p.notes if "could not be estimated" in n]
    return found[0] if found else "nothing could be estimated"


def _n_params(p: Plan) -> int | None:
    for opt in (p.baseline, p.recommended, p.closest):
        if opt is not None and opt.estimate is not None:
            return opt.estimate.n_params
    return None


def _kv_per_request(est: MemoryEstimate | None) -> int:
    if est is None:
        return 0
    return est.components.get("kv_cache", 0) // max(int(est.workload.get("batch_size", 1)), 1)


def _mem(opt: PlanOption) -> str:
    return "n/a" if opt.need_bytes is None else format_bytes(opt.need_bytes)


def _na(item_id: str, why: str) -> CheckItem:
    return CheckItem(id=item_id, status="not_applicable", evidence=why)


__all__ = [
    "DECODE_PROBE_TOKENS",
    "ITEMS",
    "MAX_TRACE_FALLBACKS",
    "STATUSES",
    "UPGRADE_THRESHOLDS",
    "VERDICTS",
    "AnalyticFirst",
    "CheckItem",
    "UpgradeVerdict",
    "upgrade_verdict",
]

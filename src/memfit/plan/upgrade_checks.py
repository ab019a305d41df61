"""The checks of ``memfit upgrade`` (:func:`memfit.plan.upgrade.upgrade_verdict`) over one job.

:class:`UpgradeChecks` plans the job twice (the fastest plan, offload allowed; the leanest at
batch 1), shares those plans and the solves between the items of
:data:`memfit.plan.upgrade_items.ITEMS`, one check each, and scans the catalog for the GPUs that
resolve the triggered ones. The items' vocabulary and thresholds: :mod:`memfit.plan.upgrade_items`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from memfit.estimate.result import MemoryEstimate
from memfit.models.model_spec import ModelSpec
from memfit.plan.advice import DEFAULT_RANK, GPU_COUNTS, GPUAdvice, rank_advice, recommend_gpus
from memfit.plan.budget import Budget, overflow_reason
from memfit.plan.checklist import Checklist, check, rated_gpus, step_cost, trainable_share
from memfit.plan.cost import ModelFacts, Rates, StepCost, infer_cost
from memfit.plan.cost import mfu as cost_mfu
from memfit.plan.engines import Estimator
from memfit.plan.recipe import RISK_LEVELS
from memfit.plan.request import PlanOption, PlanRequest
from memfit.plan.search import Plan, plan
from memfit.plan.solve import fit
from memfit.plan.space import Settings
from memfit.plan.upgrade_items import CheckItem, precision_item
from memfit.plan.upgrade_items import not_applicable as _na
from memfit.plan.upgrade_items import threshold as _t
from memfit.serving.solve import concurrency_check
from memfit.units import format_bytes

#: Decode steps the bandwidth item assumes when the request generates none (``new_tokens`` 0).
DECODE_PROBE_TOKENS = 256
VERDICTS = ("stay", "optimize_first", "upgrade", "undetermined")


class Engines(Protocol):
    """Where a verdict gets its estimators: one per GPU (``trace=False``: analytic only)."""

    def for_gpu(self, gpu: Any, *, trace: bool = True) -> Estimator: ...
    def notes(self) -> list[str]: ...


class UpgradeChecks(Checklist[CheckItem]):
    """One verdict's state: the model, the GPU, the plans and solves the items share."""

    result_type = CheckItem

    def __init__(
        self,
        source: Any,
        gpu: Any,
        request: PlanRequest,
        context_tokens: int,
        concurrency: int | None,
        target: float | None,
        engine: Engines,
        runtime: str = "hf",
    ) -> None:
        self.source, self.gpu, self.request, self.runtime = source, gpu, request, runtime
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
    @check
    def plan_exceeds_vram(self) -> CheckItem:
        p, limit = self.plan, self.budget.limit_bytes
        rec = p.recommended
        if rec is not None:
            return CheckItem(
                id="plan_exceeds_vram",
                status="not_triggered",
                evidence=f"the fastest plan that fits, {rec.settings.describe()}, takes "
                f"{_mem(rec)} (upper end) of the {format_bytes(limit)} limit",
                numbers={"need_bytes": rec.need_bytes, "limit_bytes": limit},
            )
        closest = p.closest
        text = f"no plan of {p.n_candidates} combinations fits within {format_bytes(limit)}"
        numbers: dict[str, Any] = {"limit_bytes": limit, "n_candidates": p.n_candidates}
        if closest is not None:
            text += f"; closest: {closest.settings.describe()}, {_takes(closest, p)}"
            numbers["closest_need_bytes"] = closest.need_bytes
            numbers["over_bytes"] = (closest.need_bytes or 0) - limit
        status = "triggered"
        if _incomplete(p):
            status, text = "unknown", text + f"; but {_unestimated(p)}: they might fit"
        return CheckItem(id="plan_exceeds_vram", status=status, evidence=text, numbers=numbers)

    @check
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
            f"({lean.settings.describe()}): {_takes(lean, self.lean)}; "
            f"the longest that fits is {max_ctx} "
            f"tokens ({max_ctx / want:.0%} of the requested context)"
        )
        status = "triggered"
        if _incomplete(self.lean):
            status, text = "unknown", text + f"; but {_unestimated(self.lean)}: they might fit"
        return CheckItem(id="context_unreachable", status=status, evidence=text, numbers=numbers)

    @check
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
        mfu = cost_mfu(self.rates)
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

    @check
    def kv_cache_concurrency(self) -> CheckItem:
        if self.request.mode != "infer" or self.concurrency is None:
            return _na("kv_cache_concurrency", "training job: no KV cache")
        want, ctx = self.concurrency, self.context_tokens
        if self.runtime == "vllm":  # vLLM's KV blocks under gpu_memory_utilization (serving/)
            status, text, numbers = concurrency_check(
                self.source.spec, self.gpu, n_gpus=self.request.gpus, context_tokens=ctx, want=want
            )
            return CheckItem(
                id="kv_cache_concurrency", status=status, evidence=text, numbers=numbers
            )
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

    @check
    def impractical_recompute_offload(self) -> CheckItem:
        rec = self.plan.recommended
        if self.request.mode != "train":
            return _na("impractical_recompute_offload", "inference: no recomputation or offload")
        if rec is None:
            return _na("impractical_recompute_offload", "no plan fits (plan_exceeds_vram)")
        s, base = rec.settings, self.plan.baseline
        slowdown = rec.cost.step_s / base.cost.step_s
        uses = recompute_or_offload(s)
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
        riskier = self._riskier_in_gpu(rec) if impractical else None
        if riskier is not None:
            numbers["riskier_step_s"] = riskier.cost.step_s
            text += (
                f"; a riskier plan fits this GPU without offload: {riskier.settings.describe()},"
                f" {riskier.cost.step_s:.3g} s/step (changes the result: "
                f"{'; '.join(riskier.risk_reasons)}; --max-quality-risk high counts it)"
            )
        return CheckItem(
            id="impractical_recompute_offload", status=status, evidence=text, numbers=numbers
        )

    def _riskier_in_gpu(self, rec: PlanOption) -> PlanOption | None:
        """The fastest plan on this GPU at the highest quality risk (a 4-bit base, 8-bit
        states), without offload, where it is faster than ``rec`` (the fastest plan within the
        risk asked, offloading or recomputing): what a practitioner would try before buying a
        GPU; None where the risk asked is already the highest or nothing faster fits."""
        if self.request.max_quality_risk == RISK_LEVELS[-1]:
            return None
        req = replace(self.request, max_quality_risk=RISK_LEVELS[-1], allow_offload=False)
        found = plan(self.source, req, gpu=self.gpu, estimator=self.estimator).recommended
        if found is None or found.cost.step_s >= rec.cost.step_s:
            return None
        return found

    @check
    def precision_support(self) -> CheckItem:
        return precision_item(self.source.spec, self.gpu)

    @check
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
        return step_cost(
            s, self.facts, rates, mode=r.mode, seq_len=r.seq_len, new_tokens=r.new_tokens,
            trainable_fraction=trainable_share(est),
        )  # fmt: skip

    def _decode_rate(self, s: Settings, rates: Rates) -> tuple[float, float]:
        """Tokens/s each request receives, and the time of one decode step."""
        n_new = self.request.new_tokens or DECODE_PROBE_TOKENS
        c = infer_cost(s, self.facts, rates, seq_len=self.request.seq_len, new_tokens=n_new)
        step_s = c.parts_s["decode"] / n_new
        return 1.0 / step_s, step_s

    # -- which GPUs resolve the triggered items -----------------------------------------------
    def resolving(self, triggered: list[CheckItem]) -> list[GPUAdvice]:
        """The catalog GPUs (and counts) on which every triggered item is resolved, cheapest per
        token first (:func:`memfit.plan.advice.rank_advice`); GPUs without published rates are
        named in the notes."""
        ids = {i.id for i in triggered}
        out: list[GPUAdvice] = []
        gpus, unrated = rated_gpus("scanned")
        if unrated:
            self.scan_notes.append(unrated)
        for g in gpus:
            counts = tuple(
                n for n in GPU_COUNTS if (g.name, n) != (self.gpu.name, self.request.gpus)
            )
            est = self.estimator_for(g, trace=False)
            for n in counts:  # the fewest GPUs of this kind on which the items are resolved
                advice = recommend_gpus(
                    self.source, self.request, gpus=[g], counts=(n,), estimator=est
                )
                found = [a for a in advice if self._resolves(a, g, ids)]
                out.extend(found)
                if found:
                    break
        return rank_advice(out, DEFAULT_RANK)

    def _resolves(self, a: GPUAdvice, gpu: Any, ids: set[str]) -> bool:
        """A plan fits on ``a`` (so the batch, context and concurrency asked for fit); check the
        remaining items on its best plan."""
        best = a.best
        if "precision_support" in ids and precision_item(self.source.spec, gpu).triggered:
            return False
        if "throughput_target" in ids and best.cost.tokens_per_s < (self.target or 0):
            return False
        if "impractical_recompute_offload" in ids and recompute_or_offload(best.settings):
            return False  # the same remedy, nearer or farther from the bound: not a way out
        if recompute_or_offload(best.settings) and (
            best.cost.step_s / a.plan.baseline.cost.step_s >= _t("impractical_slowdown")
        ):
            return False  # a GPU on which the job only runs impractically is no way out either
        if "bandwidth" in ids:
            rate, _ = self._decode_rate(best.settings, Rates.of(gpu))
            if rate < _t("decode_floor_tokens_per_s"):
                return False
        return True

    # -- the verdict ----------------------------------------------------------------------------
    def verdict(self, items: list[CheckItem]) -> tuple[str, str]:
        """One of :data:`VERDICTS`, and the summary in words."""
        triggered = [i.id for i in items if i.triggered]
        unknown = [i.id for i in items if i.status == "unknown"]
        if triggered:
            return (
                "upgrade",
                f"upgrade: {len(triggered)} item(s) triggered ({', '.join(triggered)})",
            )
        if unknown:
            return "undetermined", (
                f"undetermined: {', '.join(unknown)} could not be decided because combinations the "
                "analytic engine does not model yet were not estimated; rerun with "
                "--trace-fallbacks 16 (slower) or see `memfit plan`"
            )
        base, rec = self.plan.baseline, self.plan.recommended
        if base.fits:
            return "stay", f"stay: the job fits as it is ({base.settings.describe()}, {_mem(base)})"
        plan_text = rec.settings.describe() if rec is not None else "the plan"
        return "optimize_first", (
            f"optimize first: the naive stack does not fit but {plan_text} does "
            f"(`memfit plan` gives the settings)"
        )


def recompute_or_offload(s: Settings) -> list[str]:
    """What of the ``impractical_recompute_offload`` item a plan uses, in words: full
    recomputation, offload. A GPU resolves the item only with a plan that uses neither (one whose
    plan still offloads would only sit on the other side of the slowdown bound)."""
    uses = []
    if s.checkpointing == "full":
        uses.append("full recomputation")
    if s.offload != "none":
        uses.append(f"offload of the {s.offload}")
    return uses


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


def _takes(option: PlanOption, p: Plan) -> str:
    """Why a plan memfit considered does not fit, said of the plan: it *takes* memory ("needs" is
    the job's own figure, one per job)."""
    if option.estimate is None:
        return option.reason or ""
    return overflow_reason(option.estimate, p.budget, None, verb="takes")

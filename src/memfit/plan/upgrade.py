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
  the naive stack without memory constraints (the plan's baseline). A GPU resolves it only with a
  fastest plan that uses neither (:func:`memfit.plan.upgrade_checks.recompute_or_offload`).
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

The items' vocabulary and thresholds are in :mod:`memfit.plan.upgrade_items`, their checks in
:mod:`memfit.plan.upgrade_checks` (the checklist shape: :mod:`memfit.plan.checklist`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import SpecError
from memfit.estimate import policy
from memfit.hardware import get_gpu
from memfit.models import ModelSource, resolve_model
from memfit.plan.advice import GPUAdvice
from memfit.plan.budget import DEFAULT_HEADROOM
from memfit.plan.checklist import find
from memfit.plan.checklist import has_rates as has_rates
from memfit.plan.engines import CachedEstimator, Estimator
from memfit.plan.request import PlanRequest
from memfit.plan.search import Plan
from memfit.plan.upgrade_checks import DECODE_PROBE_TOKENS, VERDICTS, UpgradeChecks
from memfit.plan.upgrade_items import ITEMS, STATUSES, UPGRADE_THRESHOLDS, CheckItem
from memfit.plan.upgrade_items import precision_item as precision_item

#: Plans the checklist counts as "optimized": up to medium quality risk (4-bit base weights,
#: Adafactor), not high (pure fp16 without loss scaling, FP4): a plan that fits only by risking
#: divergence is not a reason to stay (levels: memfit.plan.space.RISKS).
DEFAULT_MAX_QUALITY_RISK = "medium"
#: Trace-engine estimates per GPU, by default, for combinations the analytic engine does not model
#: yet: none, to keep a verdict to seconds (the trace engine takes 5-10 s per estimate of a 7B
#: model on a laptop CPU); such combinations count as "could not be estimated" and can leave an
#: item ``unknown``. ``trace_fallbacks`` (``--trace-fallbacks``) raises it.
MAX_TRACE_FALLBACKS = 0


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
        return find(self.items, item_id)

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
            "as_asked": None if self.plan.as_asked is None else self.plan.as_asked.to_json(),
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
    runtime: str = "hf",
    recipe: Mapping[str, Any] | None = None,
) -> UpgradeVerdict:
    """The upgrade checklist for ``model`` on ``gpus`` x ``gpu`` (catalog name or record).

    Inference: ``seq_len`` is the prompt, ``context`` the tokens each request holds at the end
    (default ``seq_len + new_tokens``), ``concurrency`` the requests served at once (default
    ``batch_size`` or 1). ``throughput_target``: tokens/s over all GPUs (training: tokens
    trained; inference: tokens generated, or prompt tokens without generation). ``estimator``:
    ``Callable[[WorkloadSpec], MemoryEstimate]`` for every GPU (tests); default analytic first.
    ``runtime="vllm"``: the KV-cache concurrency item asks :mod:`memfit.serving` (vLLM).
    ``recipe``: the job's own recipe as :class:`PlanRequest` fields (``precision``,
    ``optimizer``, ``attention``, ``lora_ranks`` with ``lora_asked``, ``lora_targets``,
    ``quant``, ``loss``, ``kernels`` ...; validated there), kept by every plan of the checklist
    and of the GPU scan as ``plan`` keeps them: a LoRA job stays LoRA, Unsloth's kernels stay
    (``memfit.spec.with_kernel_defaults`` fills in their defaults first)."""

    if gpu is None:
        raise SpecError("upgrade needs --gpu NAME: the GPU you have or plan to use")
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    gpu_rec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    request, ctx_tokens, conc = _request(
        mode, seq_len, batch_size, global_batch, gpus, new_tokens, concurrency, context,
        throughput_target, headroom, max_quality_risk, dict(recipe or {}),
    )  # fmt: skip
    if not isinstance(trace_fallbacks, int) or trace_fallbacks < 0:
        raise SpecError(f"trace_fallbacks ({trace_fallbacks!r}) must be a whole number >= 0")
    engine = _Engine(source, estimator, trace_fallbacks)
    job = UpgradeChecks(
        source, gpu_rec, request, ctx_tokens, conc, throughput_target, engine, runtime=runtime
    )
    items = job.run()
    triggered = [i for i in items if i.triggered]
    verdict, summary = job.verdict(items)
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
    recipe: dict[str, Any],
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
            max_quality_risk=max_quality_risk, **recipe,
        )  # fmt: skip
        return req, seq_len, None
    conc = concurrency if concurrency is not None else batch_size or 1
    n_new = (context - seq_len) if context is not None else new_tokens
    req = PlanRequest(
        mode="infer", seq_len=seq_len, batch_size=conc, global_batch=global_batch,
        new_tokens=n_new, gpus=gpus, headroom=headroom, n_alternatives=0,
        max_quality_risk=max_quality_risk, **recipe,
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

"""``recommend_gpus()``: on which GPUs (and how many of them) some plan fits, with each one's speed
and price, ranked by what the user asks (``rank``):

- ``cost`` (default): US dollars per 1 M tokens, cheapest first: training tokens processed
  (``mode="train"``), generated tokens (``mode="infer"``; prompt tokens without generation). It
  is ``hourly price x GPUs / (tokens/s x 3600) x 10^6`` with the catalog's on-demand prices
  (:mod:`memfit.hardware.prices`, a user price file overrides). A GPU without a price comes after
  every priced one (by speed) and the notes say why it has none. The default answers what a
  user deciding what to rent asks: a faster GPU that costs more per token is not the better buy
  unless time matters, and then ``speed`` says so.
- ``speed``: predicted tokens/s over all the GPUs, fastest first (ties: fewer GPUs, then cost).
- ``memory``: the largest share of each GPU's memory left free by the best plan first (room for
  a longer context or a bigger batch), ties by cost.

Per GPU model the fewest GPUs (1, 2, 4, 8) on which a plan fits are kept. Catalog rows without a
published compute rate or memory bandwidth cannot be timed by the cost model
(:meth:`memfit.plan.cost.Rates.of` refuses them); they are skipped and named in ``notes`` with
that reason. Each GPU's plan is searched with the request's ``confirm`` setting; the CLI scans
with ``confirm="none"`` (one trace of a 7B-class model costs seconds, times ~40 GPUs) and says
so: confirm the GPU you pick with ``memfit plan MODEL --gpu NAME --gpus N``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, SupportsIndex, overload

from memfit.errors import SpecError
from memfit.hardware.prices import GPUPrice, PriceTable, load_prices
from memfit.plan.cost import usd_per_million_tokens
from memfit.plan.engines import Estimator
from memfit.plan.request import PlanOption, PlanRequest
from memfit.plan.search import Plan, plan

#: GPU counts tried per GPU model: one server's worth at most.
GPU_COUNTS = (1, 2, 4, 8)
RANKS = ("cost", "speed", "memory")
DEFAULT_RANK = "cost"
_UNPRICED = " without a price are listed after the priced ones"


@dataclass(frozen=True, kw_only=True)
class GPUAdvice:
    """``gpus`` x ``gpu`` runs the job with ``best``; ``price`` is one GPU's on-demand price."""

    gpu: str
    gpus: int
    best: PlanOption
    plan: Plan
    price: GPUPrice | None = None

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.best.cost.tokens_per_s / self.gpus

    @property
    def token_kind(self) -> str:
        """What the tokens/s and the cost per token count: training, generated or prompt."""
        r = self.plan.request
        if r.mode == "train":
            return "training"
        return "generated" if r.new_tokens else "prompt"

    @property
    def usd_per_hour(self) -> float | None:
        """All ``gpus`` GPUs for an hour, on demand; None without a price."""
        if self.price is None or self.price.usd_per_hour is None:
            return None
        return self.price.usd_per_hour * self.gpus

    @property
    def usd_per_million_tokens(self) -> float | None:
        """Dollars per 1 M tokens (:attr:`token_kind`) at the predicted speed."""
        return usd_per_million_tokens(self.usd_per_hour, self.best.cost.tokens_per_s)

    @property
    def free_share(self) -> float:
        """The share of each GPU's memory the best plan leaves free (0 when unknown)."""
        need, capacity = self.best.need_bytes, self.plan.budget.capacity_bytes
        return 0.0 if need is None or capacity <= 0 else max(0.0, 1.0 - need / capacity)

    def to_json(self) -> dict[str, Any]:
        price = self.price
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "tokens_per_s": self.best.cost.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "token_kind": self.token_kind,
            "step_s": self.best.cost.step_s,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "price": None if price is None else price.to_json(),
            "quality_risk": self.best.risk,
            "plan": self.best.settings.describe(),
            "need_bytes": self.best.need_bytes,
            "capacity_bytes": self.plan.budget.capacity_bytes,
            "confirmed_by": self.best.confirmed_by,
        }


class GPUAdviceList(list[GPUAdvice]):
    """The advice in ``rank`` order (a list), with ``notes``: GPUs skipped or unpriced, and why."""

    def __init__(self, items: list[GPUAdvice], notes: list[str], rank: str = DEFAULT_RANK):
        super().__init__(items)
        self.notes = notes
        self.rank = rank

    @overload
    def __getitem__(self, index: SupportsIndex) -> GPUAdvice: ...
    @overload
    def __getitem__(self, index: slice) -> GPUAdviceList: ...
    def __getitem__(self, index: SupportsIndex | slice) -> GPUAdvice | GPUAdviceList:
        """A slice (the first few rows) keeps the notes and the rank."""
        if isinstance(index, slice):
            return GPUAdviceList(list.__getitem__(self, index), self.notes, self.rank)
        return list.__getitem__(self, index)


def check_rank(rank: str) -> str:
    if rank not in RANKS:
        raise SpecError(f"rank ({rank!r}) must be one of {', '.join(RANKS)}")
    return rank


def _sort_key(a: GPUAdvice, rank: str) -> tuple[float, ...]:
    cost = a.usd_per_million_tokens
    unpriced = float(cost is None)
    cost_key = math.inf if cost is None else cost
    speed = -a.best.cost.tokens_per_s
    if rank == "speed":
        return (speed, a.gpus, cost_key)
    if rank == "memory":
        return (-round(a.free_share, 3), unpriced, cost_key, speed)
    return (unpriced, cost_key, speed, a.gpus)


def rank_advice(
    advice: list[GPUAdvice], rank: str = DEFAULT_RANK, *, prices: PriceTable | None = None
) -> GPUAdviceList:
    """``advice`` sorted by ``rank`` (re-priced from ``prices`` when given), with a note naming
    the GPUs that have no price under ``rank="cost"``."""
    check_rank(rank)
    items = [replace(a, price=prices.of(a.gpu)) for a in advice] if prices else list(advice)
    items.sort(key=lambda a: _sort_key(a, rank))
    # a re-ranked list gets its unpriced note anew (prices or rank may have changed)
    notes = [n for n in getattr(advice, "notes", []) if _UNPRICED not in n]
    note = unpriced_note(items)
    if rank == "cost" and note:
        notes.append(note)
    return GPUAdviceList(items, notes, rank)


def unpriced_note(advice: list[GPUAdvice]) -> str | None:
    """The GPUs of ``advice`` without a price, grouped by the reason they have none."""
    unpriced = [a for a in advice if a.usd_per_million_tokens is None]
    if not unpriced:
        return None
    reasons: dict[str, list[str]] = {}
    for a in unpriced:
        why = a.price.reason if a.price is not None and a.price.reason else "no price"
        reasons.setdefault(why, []).append(a.gpu)
    return (
        f"{len(unpriced)} GPU(s){_UNPRICED}, fastest first: "
        + "; ".join(f"{', '.join(names)} ({why})" for why, names in reasons.items())
        + "; give prices with --prices FILE"
    )


def recommend_gpus(
    model: Any,
    request: PlanRequest,
    *,
    gpus: list[Any] | None = None,
    counts: tuple[int, ...] = GPU_COUNTS,
    estimator: Estimator | None = None,
    confirm: Estimator | None = None,
    rank: str = DEFAULT_RANK,
    prices: PriceTable | None = None,
) -> GPUAdviceList:
    """For each GPU (default: the catalog), the fewest GPUs of that model on which a plan fits,
    in ``rank`` order (``cost``, ``speed`` or ``memory``; module docstring). ``prices``: default
    the catalog's, overridden by ``$MEMFIT_PRICES``. Counts that do not divide the global batch
    are skipped; so are GPUs without published rates and any GPU the planner refuses (both
    listed in ``notes``)."""
    from memfit.hardware import list_gpus
    from memfit.models import ModelSource, resolve_model
    from memfit.plan.cost import Rates

    check_rank(rank)
    table = prices if prices is not None else load_prices()
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    out: list[GPUAdvice] = []
    no_rates: list[str] = []
    refused: list[str] = []
    for gpu in gpus or list_gpus():
        try:
            Rates.of(gpu)
        except SpecError:
            no_rates.append(gpu.name)
            continue
        for n in counts:
            if request.global_batch is not None and request.global_batch % n:
                continue
            try:
                p = plan(
                    source, replace(request, gpus=n), gpu=gpu, estimator=estimator, confirm=confirm
                )
            except SpecError as exc:
                refused.append(f"{gpu.name} x{n} ({exc})")
                continue
            if p.recommended is not None:
                best = p.recommended
                out.append(GPUAdvice(gpu=gpu.name, gpus=n, best=best, plan=p, price=table.of(gpu)))
                break
    notes = []
    if no_rates:
        notes.append(
            f"skipped {len(no_rates)} GPU(s) without a published compute rate or memory "
            f"bandwidth in the catalog (no step time to rank them by): {', '.join(no_rates)}; "
            "`memfit fit MODEL --gpu NAME` still sizes memory on them"
        )
    if refused:
        notes.append(
            f"skipped {len(refused)} GPU/count(s) the planner refused: " + "; ".join(refused)
        )
    if table.files:
        notes.append(f"prices from {', '.join(table.files)} over the catalog's")
    return rank_advice(GPUAdviceList(out, notes), rank)

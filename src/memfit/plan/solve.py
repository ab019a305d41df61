"""``fit()``: the largest batch, the longest sequence, or the most concurrent requests that fit.

Memory grows with each of the three, so the answer is found by a monotone search: double until it
no longer fits, then bisect (``2·log2(answer)`` estimates). The search runs on the fast engine;
the precise engine then checks the answer and, where it disagrees, the search is repeated below
it with the precise engine. Fits means the estimate's upper end stays within capacity minus
headroom (:mod:`memfit.plan.budget`).

The same search then answers the largest value that is only ``tight`` (THE verdict rule,
:mod:`memfit.estimate.verdict`: its point within capacity, its upper end plus headroom not within
it), so a job whose smallest value is tight is told so with that value, never a bare 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from memfit.errors import DoesNotFitError, MemfitError, NotModelledError, SpecError, TraceError
from memfit.estimate.policy import confirming
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.verdict import DOES_NOT_FIT, EXIT_CODES, FITS, TIGHT, Verdict
from memfit.hardware import get_gpu
from memfit.models import ModelSource, resolve_model, take_media
from memfit.plan.budget import DEFAULT_HEADROOM, Budget, fits, need_bytes, verdict
from memfit.plan.engines import CachedEstimator, EnginePair, Estimator, resolve_engines
from memfit.report.plan_html import fit_fragment
from memfit.spec import MAX_BATCH_SIZE, MAX_SEQ_LEN, WorkloadSpec
from memfit.units import format_bytes

SOLVES = ("batch", "seq", "concurrency")
#: ``--solve seq`` answers in multiples of this many tokens (kernels and tokenizers pad to it;
#: fewer estimates).
SEQ_GRANULARITY = 64
#: Context lengths of the KV-cache budget table (``--solve concurrency``), capped at the model's.
KV_TABLE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

_FIELD = {"batch": "batch_size", "seq": "seq_len", "concurrency": "batch_size"}
_KEY = {"batch": "max_batch", "seq": "max_seq", "concurrency": "max_concurrency"}


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """``max_value``: the largest value whose verdict is ``fits`` (0: not even the smallest).
    ``estimate``: at it, or at the smallest value when nothing fits. ``max_tight_value``: the
    largest value whose verdict is at worst ``tight`` (its point within capacity), at least
    ``max_value``; 0 when even the smallest value does not fit; None when not searched.
    ``tight_estimate``: at it, when it is above ``max_value``."""

    solve: str
    max_value: int
    budget: Budget
    estimate: MemoryEstimate | None
    search_engine: str
    confirmed_by: str | None
    n_estimates: int
    kv_table: list[dict[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_tight_value: int | None = None
    tight_estimate: MemoryEstimate | None = None

    @property
    def fits(self) -> bool:
        return self.max_value > 0

    @property
    def verdict(self) -> str:
        """THE verdict of the answer reported: ``fits`` when a value fits; else ``tight`` when
        one is only tight; else ``does not fit``."""
        if self.max_value:
            return FITS
        return TIGHT if self.max_tight_value else DOES_NOT_FIT

    @property
    def exit_code(self) -> int:
        """The verdict rule's exit code of :attr:`verdict` (0 only for ``fits``)."""
        return EXIT_CODES[self.verdict]

    @property
    def only_tight(self) -> bool:
        """Whether a value above ``max_value`` is tight (``max_tight_value`` is that value)."""
        return self.max_tight_value is not None and self.max_tight_value > self.max_value

    def judgement(self, which: str = FITS) -> Verdict | None:
        """THE verdict of the estimate at the fits answer (``which="fits"``, or at the smallest
        value when nothing fits) or at the tight answer (``"tight"``); None without one."""
        est = self.estimate if which == FITS else self.tight_estimate
        return None if est is None else verdict(est, self.budget)

    def raise_if_not_fit(self) -> None:
        if not self.fits:
            raise DoesNotFitError(
                f"not even {_FIELD[self.solve]}=1 fits {self.budget.gpu_name} within "
                f"{format_bytes(self.budget.limit_bytes)}: see `memfit plan` for techniques"
            )

    def _repr_html_(self) -> str:
        """A notebook's view: the answer, then the estimate at it."""
        return fit_fragment(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {
            "solve": self.solve,
            _KEY[self.solve]: self.max_value,
            f"{_KEY[self.solve]}_tight": self.max_tight_value,
            "verdict": self.verdict,
            "needs": {
                FITS: self._needs(self.max_value, FITS) if self.max_value else None,
                TIGHT: self._needs(self.max_tight_value, TIGHT) if self.only_tight else None,
            },
            "capacity_bytes": self.budget.capacity_bytes,
            "headroom_bytes": self.budget.headroom_bytes,
            "limit_bytes": self.budget.limit_bytes,
            "gpu": self.budget.gpu_name,
            "search_engine": self.search_engine,
            "confirmed_by": self.confirmed_by,
            "n_estimates": self.n_estimates,
            "kv_table": list(self.kv_table),
            "estimate": None if self.estimate is None else self.estimate.to_json(),
            "notes": list(self.notes),
        }

    def _needs(self, value: int | None, which: str) -> dict[str, Any] | None:
        v = self.judgement(which)
        return None if v is None else {"value": value, **v.to_json()}


def largest(pred: Callable[[int], bool], *, cap: int, step: int = 1) -> int:
    """The largest multiple of ``step`` in ``[step, cap]`` for which the monotone ``pred`` holds
    (0 if none): doubling, then bisection."""
    if cap < step or not pred(step):
        return 0
    lo = 1  # in units of step: pred(lo * step) holds
    while 2 * lo * step <= cap and pred(2 * lo * step):
        lo *= 2
    hi = min(2 * lo, cap // step + 1)  # pred(hi * step) fails or hi * step > cap
    return _bisect(pred, lo, hi, step) * step


def _bisect(pred: Callable[[int], bool], lo: int, hi: int, step: int) -> int:
    """The largest unit in ``[lo, hi)`` ``pred`` accepts, ``pred(lo * step)`` holding and
    ``hi`` failing or out of range: bisection."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid * step):
            lo = mid
        else:
            hi = mid
    return lo


#: Rounds of guided probing before a guided search falls back to exact bisection.
GUIDED_ROUNDS = 4


def largest_guided(
    pred: Callable[[int], bool], guess: Callable[[int], bool], *, cap: int, step: int = 1
) -> int:
    """:func:`largest` with the same answer for a monotone ``pred``, with fewer calls of it:
    a cheap, inexact ``guess`` of ``pred`` leads the doubling and bisection, then ``pred`` is
    asked at the guess's answer and the value after it. ``pred`` holding at ``v`` and failing at
    ``v + step`` (or ``v`` being ``cap``) is the answer of any monotone search, whatever the
    guess said elsewhere; where ``pred`` disagrees, the interval it has certified shrinks and the
    guess searches again inside it, and after :data:`GUIDED_ROUNDS` rounds ``pred`` searches
    what is left itself (doubling its step up from the certified value, then bisecting)."""
    if cap < step or not pred(step):
        return 0
    lo, hi = 1, cap // step + 1  # in units of step: pred(lo) holds; hi fails or is beyond cap
    for _ in range(GUIDED_ROUNDS):
        if hi - lo == 1:
            return lo * step
        guessed = _largest_between(guess, lo, hi, step)
        for v in (guessed, guessed + 1):
            if lo < v < hi:
                if not pred(v * step):
                    hi = v
                    break
                lo = v
    jump = 1
    while lo + jump < hi and pred((lo + jump) * step):
        lo += jump
        jump *= 2
    return _bisect(pred, lo, min(hi, lo + jump), step) * step


def _largest_above(pred: Callable[[int], bool], lo: int, *, cap: int, step: int) -> int:
    """The largest multiple of ``step`` in ``[lo, cap]`` the monotone ``pred`` accepts, ``pred``
    holding at ``lo``: strides doubling up from ``lo``, then bisection."""
    base, hi = lo // step, cap // step + 1
    jump = 1
    while base + jump < hi and pred((base + jump) * step):
        base += jump
        jump *= 2
    return _bisect(pred, base, min(hi, base + jump), step) * step


def _largest_between(guess: Callable[[int], bool], lo: int, hi: int, step: int) -> int:
    """The largest unit in ``[lo, hi)`` the guess accepts, searching up from ``lo`` (assumed
    to hold) by doubling, then bisecting."""
    base = lo
    while 2 * base < hi and guess(2 * base * step):
        base *= 2
    return _bisect(guess, base, min(2 * base, hi), step)


def fit(
    model: Any,
    workload: WorkloadSpec,
    *,
    solve: str,
    gpu: Any = None,
    gpu_memory_bytes: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    estimator: Estimator | None = None,
    confirm: Estimator | None = None,
    kv_table: bool = True,
    tight: bool = True,
) -> FitResult:
    """Solve ``workload``'s batch size, sequence length or (inference) concurrency on ``gpu`` (a
    catalog name or record) or a GPU of ``gpu_memory_bytes``. ``tight``: also search the largest
    value that is only tight (a few more estimates; False leaves ``max_tight_value`` None)."""

    if solve not in SOLVES:
        raise SpecError(f"solve ({solve!r}) must be one of {', '.join(SOLVES)}")
    if solve == "concurrency" and workload.mode != "infer":
        raise SpecError("solve 'concurrency' counts inference requests: add --mode infer")
    gpu_rec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    budget = Budget.of(gpu_rec, memory_bytes=gpu_memory_bytes, headroom=headroom)
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    source = take_media(source, workload.media)
    engines = resolve_engines(source, gpu_rec, estimator, confirm)
    cap, step, notes = _bounds(solve, source)
    if engines.reason is not None:
        notes.insert(0, f"engines: {engines.reason}")
    name = _FIELD[solve]
    if _answer_first(engines.search, budget, _with(workload, name, step)):
        notes.append(
            f"search: {name}={step} does not fit, estimated from its own traces alone (the "
            f"{engines.search.name} engine's bytes at {name}={step}, no whole form built)"
        )
    value, est, confirmed = _solve(engines, budget, workload, name, cap, step)
    if value >= cap:
        notes.append(f"reached the search limit {name}={cap}")
    most, most_est = value, None
    if tight and value < cap:
        most, most_est, _ = _solve(engines, budget, workload, name, cap, step, accept=_not_over)
        most = max(most, value)
    table: list[dict[str, int]] = []
    if solve == "concurrency" and kv_table:
        answered = _with(workload, name, max(value, step))
        confirmed_answer = confirmed is not None and confirmed == _confirm_name(engines)
        guide = _guide_budget(engines, budget, answered, est) if confirmed_answer else None
        certify = guide is not None and confirming()
        table = _kv_table(engines, budget, workload, source, guide, certify=certify)
        if guide is not None and engines.confirm is not None:
            notes.append(_table_note(engines, budget, guide, certify))
    n = engines.search.n_calls + (engines.confirm.n_calls if engines.confirm else 0)
    if engines.search.n_guided:
        notes.append(
            f"search: {engines.search.n_guided} cheap probes of the {engines.search.name} "
            f"engine (reserved bytes interpolated from its exact replays) led it; the answer "
            f"and the value after it were estimated exactly ({n} exact estimates)"
        )
    return FitResult(
        solve=solve,
        max_value=value,
        budget=budget,
        estimate=est,
        search_engine=engines.search.name,
        confirmed_by=confirmed,
        n_estimates=n,
        kv_table=table,
        notes=notes,
        max_tight_value=most if tight else None,
        tight_estimate=most_est if most > value else None,
    )


def _bounds(solve: str, source: Any) -> tuple[int, int, list[str]]:
    if solve != "seq":
        return MAX_BATCH_SIZE, 1, []
    limit = _context_limit(source)
    if limit is None:
        return MAX_SEQ_LEN, SEQ_GRANULARITY, []
    note = f"sequence capped at the model's context limit ({limit} tokens, config.json)"
    return limit, SEQ_GRANULARITY, [note]


def _context_limit(source: Any) -> int | None:
    return source.spec.context_limit if source.spec is not None else None


#: Whether an estimate is accepted on a budget: THE verdict rule's ``fits`` (the answer), or at
#: worst ``tight`` (the largest value that may run).
Accept = Callable[[MemoryEstimate, Budget], bool]


def _not_over(est: MemoryEstimate, budget: Budget) -> bool:
    """At worst ``tight``: the point value is within capacity (memfit.estimate.verdict)."""
    return verdict(est, budget).verdict != DOES_NOT_FIT


def _predicate(
    engine: CachedEstimator,
    budget: Budget,
    w: WorkloadSpec,
    name: str,
    *,
    probe: bool = False,
    accept: Accept = fits,
) -> Callable[[int], bool]:
    ask = engine.probe if probe else engine

    def pred(value: int) -> bool:
        try:
            return accept(ask(_with(w, name, value)), budget)
        except MemfitError:  # e.g. a sequence beyond what the model's positions allow
            return False

    return pred


def _largest(
    engine: CachedEstimator,
    budget: Budget,
    w: WorkloadSpec,
    name: str,
    *,
    cap: int,
    step: int,
    accept: Accept = fits,
) -> int:
    """The largest value ``accept``-ed by ``engine`` (default: that fits): probed with its guide
    where it has one (:func:`largest_guided`, the answer replayed exactly), else
    :func:`largest`."""
    pred = _predicate(engine, budget, w, name, accept=accept)
    if engine.guide is None:
        return largest(pred, cap=cap, step=step)
    guess = _predicate(engine, budget, w, name, probe=True, accept=accept)
    return largest_guided(pred, guess, cap=cap, step=step)


def _solve(
    engines: EnginePair,
    budget: Budget,
    w: WorkloadSpec,
    name: str,
    cap: int,
    step: int,
    *,
    accept: Accept = fits,
) -> tuple[int, MemoryEstimate | None, str | None]:
    _raise_if_bad_input(engines.search, _with(w, name, step))
    if engines.confirm is not None and _not_modelled(engines.search, _with(w, name, step)):
        engines = EnginePair(search=engines.confirm, confirm=None)  # the precise engine searches
    if engines.confirm is None:
        _raise_if_cannot_run(engines.search, _with(w, name, step))
    value = _largest(engines.search, budget, w, name, cap=cap, step=step, accept=accept)
    confirm = engines.confirm
    if (
        not value
        and confirm is not None
        and _predicate(confirm, budget, w, name, accept=accept)(step)
    ):
        # the fast engine's "not even 1 fits" is its own error band, not the job's: the precise
        # engine says the smallest value fits, so it searches (issue 11: never 0 where it fits)
        value = largest(_predicate(confirm, budget, w, name, accept=accept), cap=cap, step=step)
        return value, _try(confirm, _with(w, name, max(value, step))), confirm.name
    at = _with(w, name, max(value, step))
    if confirm is None:
        return value, _try(engines.search, at), engines.search.name if value else None
    confirmed = _predicate(confirm, budget, w, name, accept=accept)
    if value and confirmed(value):
        if value + step <= cap and confirmed(value + step):
            # the fast engine's "no" above its answer is its own error band: the precise engine
            # accepts more, so it searches on up (else "only tight" could name a value it fits)
            value = _largest_above(confirmed, value + step, cap=cap, step=step)
        return value, _try(confirm, _with(w, name, value)), confirm.name
    if value:  # the precise engine disagrees: search again below, with it
        value = largest(
            _predicate(confirm, budget, w, name, accept=accept), cap=value - step, step=step
        )
    at = _with(w, name, max(value, step))
    return value, _try(confirm, at) or _try(engines.search, at), confirm.name if value else None


def _answer_first(engine: CachedEstimator, budget: Budget, w: WorkloadSpec) -> bool:
    """Ask the search engine's cheap first route (:attr:`CachedEstimator.first`) for the
    smallest value ``w``, where its answer alone settles the search: it does not fit, so every
    monotone search answers 0 there. Kept as the engine's answer (the estimate it would give);
    whether it was."""
    if engine.first is None:
        return False
    est = engine.first(w, lambda e: not fits(e, budget))
    if est is None:
        return False
    engine.seed(w, est)
    return True


def _raise_if_bad_input(engine: CachedEstimator, w: WorkloadSpec) -> None:
    """A job that is wrong at the smallest value (LoRA targets naming no module) is bad input,
    not "the largest value that fits is 0": raise its SpecError (a NotModelledError is not one:
    another engine may model the job)."""
    try:
        engine(w)
    except NotModelledError:
        return
    except SpecError:
        raise
    except MemfitError:
        return


def _raise_if_cannot_run(engine: CachedEstimator, w: WorkloadSpec) -> None:
    """The only engine left refuses the smallest value (NotModelledError) or cannot run the model
    at all (TraceError: e.g. an architecture no task of the trace engine builds): that is its
    reason, raised (exit 2), not "the largest value that fits is 0" (issue 11, found by the
    coverage test on wav2vec2)."""
    try:
        engine(w)
    except (NotModelledError, TraceError):
        raise
    except MemfitError:
        return


def _not_modelled(engine: CachedEstimator, w: WorkloadSpec) -> bool:
    """Whether ``engine`` cannot model ``w`` at all (another engine may): then its "no" at the
    smallest value would be read as "nothing fits" (issue 11)."""
    try:
        engine(w)
    except NotModelledError:
        return True
    except MemfitError:
        return False
    return False


def _with(w: WorkloadSpec, name: str, value: int) -> WorkloadSpec:
    changes: dict[str, Any] = {name: value}
    return replace(w, **changes)


def _try(engine: CachedEstimator, w: WorkloadSpec) -> MemoryEstimate | None:
    try:
        return engine(w)
    except MemfitError:
        return None


def _confirm_name(engines: EnginePair) -> str | None:
    return None if engines.confirm is None else engines.confirm.name


def _guide_budget(
    engines: EnginePair, budget: Budget, answered: WorkloadSpec, precise: MemoryEstimate | None
) -> Budget | None:
    """The budget on which the search engine leads the confirming engine's search of the
    KV-cache table (a guide only: the confirming engine's own verdict certifies each row): the
    capacity scaled by the search engine's need over the confirming engine's (``precise``) at
    the answer ``answered`` (the fast engine's range is wider than the trace's: gpt2 on a T4,
    1024 tokens, 154 requests: 16.6 GiB against 13.8). None without a confirmed answer."""
    if precise is None or engines.confirm is None:
        return None
    fast = _try(engines.search, answered)
    if fast is None or need_bytes(fast) <= 0 or need_bytes(precise) <= 0:
        return None
    scale = need_bytes(fast) / need_bytes(precise)
    return Budget(
        gpu_name=budget.gpu_name,
        capacity_bytes=round(budget.capacity_bytes * scale),
        headroom_bytes=round(budget.headroom_bytes * scale),
    )


def _table_note(engines: EnginePair, budget: Budget, guide: Budget, certify: bool) -> str:
    search, confirm = engines.search.name, engines.confirm.name if engines.confirm else "?"
    scale = guide.capacity_bytes / budget.capacity_bytes
    if certify:
        return (
            f"KV-cache table: each row certified by the {confirm} engine (--confirm: at the "
            f"{search} engine's answer on the capacity x {scale:.3f} and the value after it)"
        )
    return (
        f"KV-cache table: the {search} engine's answers on the capacity x {scale:.3f} (its need "
        f"over the {confirm} engine's at the confirmed answer); --confirm certifies each row "
        f"with the {confirm} engine"
    )


def _kv_table(
    engines: EnginePair,
    budget: Budget,
    w: WorkloadSpec,
    source: Any,
    guide: Budget | None = None,
    *,
    certify: bool = False,
) -> list[dict[str, int]]:
    """Context length x the most concurrent requests that fit: the search engine's answer; with
    a ``guide`` budget (:func:`_guide_budget`), its answer judged on that budget (measured
    equal to the trace's own on every row of gpt2 on a T4 and llama-3.2-1b on an L4:
    docs/accuracy.md, "Inference reserved bytes: the KV cache apart"), and with ``certify`` the
    confirming engine's, asked there first (:func:`_certified`)."""
    limit = _context_limit(source) or KV_TABLE_CONTEXTS[-1]
    rows = []
    for ctx in (c for c in KV_TABLE_CONTEXTS if c <= limit):
        base = replace(w, seq_len=max(ctx - w.new_tokens, 1))
        engine = engines.search
        on = budget if guide is None else guide
        n = _largest(engine, on, base, "batch_size", cap=MAX_BATCH_SIZE, step=1)
        if certify and engines.confirm is not None:
            engine = engines.confirm
            n = _certified(engine, budget, base, n, cap=MAX_BATCH_SIZE)
        est = _try(engine, replace(base, batch_size=max(n, 1)))
        kv = est.components.get("kv_cache", 0) if est is not None and n else 0
        rows.append({"context_tokens": ctx, "max_concurrency": n, "kv_cache_bytes": kv})
        if n == 0:
            break
    return rows


def _certified(engine: CachedEstimator, budget: Budget, w: WorkloadSpec, led: int, *,
               cap: int) -> int:  # fmt: skip
    """The largest batch ``engine`` fits, asked first at ``led`` and the batch after it (the
    answer where it fits there and not after), else searched on up or below with it."""
    pred = _predicate(engine, budget, w, "batch_size")
    if not led:
        return _largest_above(pred, 1, cap=cap, step=1) if pred(1) else 0
    if pred(led):
        if led >= cap or not pred(led + 1):
            return led
        return _largest_above(pred, led + 1, cap=cap, step=1)
    return largest(pred, cap=led - 1, step=1)

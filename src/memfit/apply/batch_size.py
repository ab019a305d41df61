"""``find_batch_size``: the largest micro-batch that really runs — started from memfit's
estimate, confirmed with real steps.

Unlike an OOM-retry loop that starts from a guess and from whatever batch comes first:

1. the starting point is memfit's answer (:func:`memfit.plan.fit`, solve ``batch``);
2. every trial runs at the **worst-case sequence length** (the plan's ``seq_len`` unless
   ``seq_len=`` is given), so a long batch later in training cannot OOM;
3. each trial runs ``n_steps`` real training steps (optimizer states exist from the second) and
   then an **evaluation** forward (``no_grad``) at the same batch;
4. on ``torch.OutOfMemoryError`` the memory is freed and a smaller batch tried (halving, then
   bisection); with ``probe_up=True`` a batch that runs is grown until one fails;
5. the result records every attempt and the estimate-vs-measured gap at the batch found.

On CUDA the device is the GPU (``memory_limit_bytes`` caps it with
``torch.cuda.set_per_process_memory_fraction``); on CPU memfit's exact tensor tracker plays the
device, with capacity ``memory_limit_bytes`` (:mod:`memfit.apply.measure`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from memfit.apply.amp import AmpStep
from memfit.apply.measure import Measurement, free_after_oom, measure
from memfit.apply.preflight import refuse_if_too_large
from memfit.apply.requirements import device_of
from memfit.apply.target import PlanLike, resolve
from memfit.errors import MemfitError, SpecError
from memfit.estimate import estimate
from memfit.estimate.device import allocator_workspaces
from memfit.estimate.result import MemoryEstimate
from memfit.models import ModelSource, resolve_model
from memfit.plan.budget import DEFAULT_HEADROOM
from memfit.plan.solve import fit
from memfit.spec import MAX_BATCH_SIZE, WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One trial: ``mode`` train or eval; ``peak_bytes`` measured (None after an OOM)."""

    batch_size: int
    mode: str
    ok: bool
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class BatchSizeResult:
    """``batch_size``: the largest batch confirmed (0: not even the smallest tried runs).
    ``estimated_batch_size``: memfit's answer (None without an estimate).
    ``estimated_peak_bytes`` / ``measured_peak_bytes``: at ``batch_size``, training step."""

    batch_size: int
    seq_len: int
    device: str
    limit_bytes: int | None
    estimated_batch_size: int | None
    estimated_peak_bytes: int | None
    measured_peak_bytes: int | None
    measured_reserved_bytes: int | None
    measured_eval_peak_bytes: int | None
    attempts: list[Attempt] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        """measured / estimated - 1 of the training step's peak (None when either is missing)."""
        if not self.estimated_peak_bytes or self.measured_peak_bytes is None:
            return None
        return self.measured_peak_bytes / self.estimated_peak_bytes - 1

    @property
    def fits(self) -> bool:
        return self.batch_size > 0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gap"] = self.gap
        return d


def find_batch_size(
    step_fn: Callable[[Any], Any],
    *,
    make_batch: Callable[[int, int], Any],
    model: torch.nn.Module,
    plan: PlanLike,
    optimizer: Any = None,
    source: Any = None,
    seq_len: int | None = None,
    start_batch_size: int | None = None,
    max_batch_size: int = MAX_BATCH_SIZE,
    memory_limit_bytes: int | None = None,
    headroom: float | None = None,
    estimator: Callable[[WorkloadSpec], MemoryEstimate] | None = None,
    eval_fn: Callable[[Any], Any] | None = None,
    check_eval: bool = True,
    n_steps: int = 2,
    probe_up: bool = False,
    force: bool = False,
) -> BatchSizeResult:
    """Find the largest batch for which ``step_fn(make_batch(b, seq_len))`` (one training step)
    and an evaluation forward both run.

    ``plan``: the Plan / PlanOption / WorkloadSpec the model runs (its ``seq_len`` is the worst
    case). ``source``: what memfit estimates (a MODEL name or ``ModelSource``; default: the
    model's own transformers config). ``start_batch_size`` skips the estimate.
    ``estimator``: ``WorkloadSpec -> MemoryEstimate`` (default: the trace engine on CPU, memfit's
    planner engines on CUDA). ``eval_fn(batch)``: default a ``no_grad`` forward under the plan's
    autocast. ``memory_limit_bytes``: the device capacity (required on CPU). Before any real step
    the first batch is estimated, and a job whose estimate (or, on CPU, whose
    ``memory_limit_bytes``) exceeds this machine's free memory is refused unless ``force``."""
    w = resolve(plan).workload
    device = device_of(model)
    seq = seq_len or w.seq_len
    _check_args(device, memory_limit_bytes, n_steps, max_batch_size, start_batch_size)
    notes: list[str] = []
    est_fn = _estimator(model, source, device, estimator, notes)
    start = start_batch_size
    estimated_batch = None
    if start is None:
        estimated_batch = _estimated_batch(
            model, source, w, seq, device, memory_limit_bytes, headroom, est_fn
        )
        start = max(1, min(estimated_batch, max_batch_size))
    _preflight(est_fn, w, start, seq, device, memory_limit_bytes, force)
    trial = _Trial(
        step_fn,
        make_batch,
        model,
        optimizer,
        w,
        seq,
        device,
        memory_limit_bytes,
        eval_fn if check_eval else None,
        n_steps,
        check_eval,
    )
    with _cuda_cap(device, memory_limit_bytes):
        found = _search(trial, start, max_batch_size, probe_up)
    train = trial.measured.get(found)
    est_peak = None
    if found and est_fn is not None:
        try:
            est_peak = est_fn(
                dataclasses.replace(w, batch_size=found, seq_len=seq)
            ).peak_allocated_bytes
        except MemfitError as exc:
            notes.append(f"no estimate at batch {found}: {exc}")
    evals = trial.eval_measured.get(found)
    return BatchSizeResult(
        batch_size=found,
        seq_len=seq,
        device=str(device),
        limit_bytes=memory_limit_bytes,
        estimated_batch_size=estimated_batch,
        estimated_peak_bytes=est_peak,
        measured_peak_bytes=None if train is None else train.peak_bytes,
        measured_reserved_bytes=None if train is None else train.reserved_bytes,
        measured_eval_peak_bytes=None if evals is None else evals.peak_bytes,
        attempts=trial.attempts,
        notes=notes,
    )


def _check_args(
    device: torch.device, limit: int | None, n_steps: int, cap: int, start: int | None
) -> None:
    p = []
    if device.type != "cuda" and limit is None:
        p.append(
            "memory_limit_bytes is required off CUDA: on CPU memfit's tensor tracker plays a "
            "device of that capacity (e.g. memory_limit_bytes=2 * 2**30)"
        )
    if limit is not None and limit <= 0:
        p.append(f"memory_limit_bytes ({limit}) must be > 0")
    if n_steps < 1:
        p.append(f"n_steps ({n_steps}) must be >= 1 (2 lets optimizer states exist)")
    if cap < 1:
        p.append(f"max_batch_size ({cap}) must be >= 1")
    if start is not None and start < 1:
        p.append(f"start_batch_size ({start}) must be >= 1")
    if p:
        raise SpecError.from_problems(p)


class _Trial:
    """Runs one batch size for real and remembers what happened."""

    def __init__(
        self,
        step_fn,
        make_batch,
        model,
        optimizer,
        w,
        seq,
        device,
        limit,
        eval_fn,  # type: ignore[no-untyped-def]
        n_steps,
        check_eval,
    ) -> None:
        self.step_fn, self.make_batch, self.model, self.optimizer = (
            step_fn,
            make_batch,
            model,
            optimizer,
        )
        self.w, self.seq, self.device, self.limit = w, seq, device, limit
        self.eval_fn = eval_fn or (_default_eval(model, w, device) if check_eval else None)
        self.n_steps = n_steps
        self.attempts: list[Attempt] = []
        self.measured: dict[int, Measurement] = {}
        self.eval_measured: dict[int, Measurement] = {}
        self._ok: dict[int, bool] = {}

    def __call__(self, b: int) -> bool:
        if b not in self._ok:
            self._ok[b] = self._run(b, "train") and (self.eval_fn is None or self._run(b, "eval"))
        return self._ok[b]

    def _run(self, b: int, mode: str) -> bool:
        fn = self.eval_fn if mode == "eval" else self.step_fn

        def run() -> None:  # the batch is made on the device being measured: it counts
            batch = self.make_batch(b, self.seq)
            for _ in range(1 if mode == "eval" else self.n_steps):
                fn(batch)  # type: ignore[misc]

        try:
            m = measure(
                run,
                model=self.model,
                optimizer=self.optimizer,
                device=self.device,
                limit_bytes=self.limit,
            )
        except torch.OutOfMemoryError as exc:  # the signal this search looks for
            free_after_oom(self.model, self.optimizer, self.device)
            self.attempts.append(
                Attempt(batch_size=b, mode=mode, ok=False, error=str(exc).splitlines()[0][:200])
            )
            return False
        (self.eval_measured if mode == "eval" else self.measured)[b] = m
        self.attempts.append(
            Attempt(
                batch_size=b,
                mode=mode,
                ok=True,
                peak_bytes=m.peak_bytes,
                reserved_bytes=m.reserved_bytes,
            )
        )
        return True


def _search(runs: Callable[[int], bool], start: int, cap: int, probe_up: bool) -> int:
    """Largest b in [1, cap] with runs(b), assuming monotonicity: from ``start`` halve down on
    failure (then bisect up to the failure), or with ``probe_up`` double up from a success."""
    if runs(start):
        ok, bad = start, None
        if probe_up:
            while ok < cap:
                nxt = min(2 * ok, cap)
                if not runs(nxt):
                    bad = nxt
                    break
                ok = nxt
        if bad is None:
            return ok
    else:
        ok, bad = 0, start
        b = start // 2
        while b >= 1:
            if runs(b):
                ok = b
                break
            bad, b = b, b // 2
        if ok == 0:
            return 0
    while bad - ok > 1:
        mid = (ok + bad) // 2
        if runs(mid):
            ok = mid
        else:
            bad = mid
    return ok


def _preflight(
    est_fn: Any, w: WorkloadSpec, start: int, seq: int, device: Any, limit: int | None, force: bool
) -> None:
    """Refuse (SpecError) a first trial that memfit estimates beyond this machine's free memory,
    and on CPU a ``memory_limit_bytes`` the machine cannot give (the search may grow to it)."""
    if not isinstance(force, bool):
        raise SpecError(f"force ({force!r}) must be True or False")
    what = f"find_batch_size's first trial (batch {start}, seq {seq})"
    if est_fn is not None and not force:
        try:
            est = est_fn(dataclasses.replace(w, batch_size=start, seq_len=seq))
        except MemfitError:
            est = None
        peak = None if est is None else est.peak_allocated_bytes
        refuse_if_too_large(peak, device, what=what, force=force, flag="force=True")
    if device.type == "cpu":
        refuse_if_too_large(
            limit, device, what="memory_limit_bytes on CPU", force=force, flag="force=True"
        )


def _default_eval(
    model: torch.nn.Module, w: WorkloadSpec, device: torch.device
) -> Callable[[Any], Any]:
    amp = AmpStep(w, device_type=device.type)

    def evaluate(batch: Any) -> None:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), amp.autocast():
                out = model(**batch) if isinstance(batch, dict) else model(batch)
            del out
        finally:
            model.train(was_training)

    return evaluate


class _cuda_cap:
    """Cap the CUDA caching allocator at ``limit`` bytes for the search; the fraction the process
    had before is put back on every exit path (not 1.0: the user may have set their own)."""

    def __init__(self, device: torch.device, limit: int | None) -> None:
        self.device, self.limit = device, limit
        self._before: float | None = None

    def __enter__(self) -> None:
        if self.device.type == "cuda" and self.limit is not None:
            getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
            self._before = float(getter(self.device)) if getter is not None else 1.0
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.limit / total), self.device)

    def __exit__(self, *exc: Any) -> None:
        if self._before is not None:
            torch.cuda.set_per_process_memory_fraction(self._before, self.device)
            self._before = None


def _source(model: torch.nn.Module, source: Any) -> Any:
    """What to estimate: ``source`` as given, or a ModelSource of the model's own config."""

    if isinstance(source, ModelSource):
        return source
    if source is not None:
        return resolve_model(str(source))
    config = getattr(getattr(model, "get_base_model", lambda: model)(), "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    cfg = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
    name = str(cfg.get("_name_or_path") or cfg.get("model_type") or type(model).__name__)
    return ModelSource.of_live_config(cfg, name=name)


def _estimator(
    model: torch.nn.Module, source: Any, device: torch.device, estimator: Any, notes: list[str]
) -> Callable[[WorkloadSpec], MemoryEstimate] | None:
    if estimator is not None:
        return estimator  # type: ignore[no-any-return]
    src = _source(model, source)
    if src is None:
        notes.append(
            "no estimate: the model has no transformers config; pass source= or start_batch_size="
        )
        return None
    if device.type == "cuda":
        return lambda w: estimate(src, w)
    from memfit.estimate.trace.engine import trace_hf

    def cpu(w: WorkloadSpec) -> MemoryEstimate:
        est = trace_hf(src.config, w, name=src.name, emulate_cuda=False)
        return _tensor_bytes_only(est, w.is_train)

    return cpu


def _tensor_bytes_only(est: MemoryEstimate, training: bool) -> MemoryEstimate:
    """The CPU 'device' holds tensors only: no CUDA context, no allocator cache, no cuBLAS
    workspaces (which the estimate adds for a CUDA device)."""

    workspaces = sum(allocator_workspaces(None, training=training))
    p = est.peak_allocated_bytes - workspaces
    components = dict(est.components)
    components["temporary"] = components.get("temporary", 0) - workspaces  # counted there
    out = dataclasses.replace(
        est,
        components=components,
        peak_allocated_bytes=p,
        device_used_bytes=p,
        peak_reserved_bytes=p,
        cuda_context_bytes=0,
    )
    # The CPU count is exact (the same tracker measures the run), so no uncertainty band: the
    # calibrated bands describe a CUDA device, and MemoryEstimate only ever widens ranges.
    exact = {
        m: (p, p) for m in ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")
    }
    object.__setattr__(out, "ranges", exact)
    return out


def _estimated_batch(
    model: torch.nn.Module,
    source: Any,
    w: WorkloadSpec,
    seq: int,
    device: torch.device,
    limit: int | None,
    headroom: float | None,
    est_fn: Any,
) -> int:
    if est_fn is None:
        raise SpecError(
            "find_batch_size has nothing to start from: pass source= (a MODEL name) "
            "or start_batch_size="
        )
    if limit is None:
        limit = int(torch.cuda.get_device_properties(device).total_memory)
    src = _source(model, source) or "unused"
    room = (
        headroom if headroom is not None else (DEFAULT_HEADROOM if device.type == "cuda" else 0.0)
    )
    result = fit(
        src,
        dataclasses.replace(w, seq_len=seq),
        solve="batch",
        gpu_memory_bytes=limit,
        headroom=room,
        estimator=est_fn,
        kv_table=False,
    )
    return result.max_value

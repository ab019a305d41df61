"""``doctor()``: check a described job for the seed's seven common mistakes, with the numbers.

Each finding says whether the mistake applies (``yes`` / ``no`` / ``unknown``), the evidence
(from one estimate of the job, a batch solve, the cost model, and the run log when given), and
the next step as a memfit command. What only the user knows comes as facts: how the job was sized
(``sized_by``), whether the quantized model's quality was checked, where the batch size came from,
whether the stacked techniques were benchmarked, and why the GPU was chosen. A fact left out
makes the finding ``unknown`` unless the numbers decide it (a batch that does not fit is a
mistake whatever its origin).

1. ``weights_only_sizing``: the weights as stored vs the step's device memory (upper end).
2. ``quantization_unchecked``: quantized weights and no quality check.
3. ``batch_unprofiled``: the batch vs the largest that fits (``fit --solve batch``).
4. ``sequence_ignored``: the share of the peak that grows with the sequence (activations for
   training, the KV cache for inference) at the requested sequence x batch.
5. ``stacked_unbenchmarked``: at least :data:`STACK_MIN` memory techniques and no benchmark;
   their predicted slowdown (cost model) vs the naive stack.
6. ``reserved_as_leak``: the run log through :func:`memfit.monitor.diagnose` (cache vs leak).
7. ``gpu_by_vram``: the GPUs of the catalog with room for the job, by predicted tokens/s.

The mistakes, the facts, :class:`Finding` and :class:`DoctorReport` are in
:mod:`memfit.plan.doctor_findings`; :class:`DoctorChecks` declares the seven checks over the
checklist shape of :mod:`memfit.plan.checklist`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from memfit.errors import MemfitError, SpecError
from memfit.estimate import settled_for
from memfit.estimate.policy import AUTO, AnalyticFirst, active
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.verdict import DOES_NOT_FIT
from memfit.flags import workload_flags as flags
from memfit.hardware import get_gpu
from memfit.hardware.precision import precision_on
from memfit.models import ModelSource, resolve_model, take_media
from memfit.monitor import diagnose
from memfit.plan.budget import DEFAULT_HEADROOM, Budget, need_bytes, verdict
from memfit.plan.checklist import Checklist, check, rated_gpus, step_cost, trainable_share
from memfit.plan.cost import STORED_BYTES_PER_WEIGHT, ModelFacts, Rates, StepCost
from memfit.plan.doctor_findings import APPLIES as APPLIES
from memfit.plan.doctor_findings import BATCH_FROM as BATCH_FROM
from memfit.plan.doctor_findings import CHOSE_GPU_BY as CHOSE_GPU_BY
from memfit.plan.doctor_findings import MISTAKES as MISTAKES
from memfit.plan.doctor_findings import SIZED_BY as SIZED_BY
from memfit.plan.doctor_findings import DoctorReport, Finding, UserFacts
from memfit.plan.engines import CachedEstimator, Estimator
from memfit.plan.nearest import NearestFit, nearest_fit
from memfit.plan.request import job_request
from memfit.plan.search import Plan, plan
from memfit.plan.solve import fit
from memfit.plan.space import RISKS, Settings
from memfit.spec import WorkloadSpec
from memfit.spec.rules import DEFAULT_PRECISION
from memfit.units import format_bytes

#: Memory techniques stacked before the combination should be benchmarked: "several" in the seed;
#: memfit counts 3 (two techniques interact in one pair, three in three pairs: checkpointing x
#: offload x quantization each change the step time), a rule of thumb chosen here.
STACK_MIN = 3
#: Share of the peak that grows with the sequence below which ignoring it is harmless: 10 %,
#: twice the default headroom (5 %, memfit.plan.budget), which absorbs it; chosen here.
SEQUENCE_SHARE_MIN = 0.10
#: Bytes per weight of a 16-bit checkpoint (what "8B parameters = 16 GB" sizing counts).
CHECKPOINT_BYTES_PER_WEIGHT = 2
_SIZED_APPLIES = {"weights": "yes", "estimate": "no", "profile": "no"}


def doctor(
    model: Any,
    workload: WorkloadSpec,
    *,
    gpu: Any = None,
    sized_by: str | None = None,
    quality_checked: bool | None = None,
    batch_from: str | None = None,
    benchmarked: bool | None = None,
    log: str | os.PathLike[str] | None = None,
    chose_gpu_by: str | None = None,
    headroom: float = DEFAULT_HEADROOM,
    estimator: Estimator | None = None,
) -> DoctorReport:
    """Check ``workload`` of ``model`` (on ``gpu``, a catalog name or record) for the seven
    mistakes. ``estimator``: ``Callable[[WorkloadSpec], MemoryEstimate]`` (tests); default the
    analytic engine, the trace engine for a setting it does not model yet (said in the notes)."""

    told = UserFacts(
        sized_by=sized_by, quality_checked=quality_checked, batch_from=batch_from,
        benchmarked=benchmarked, log=log, chose_gpu_by=chose_gpu_by,
    )  # fmt: skip
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    source = take_media(source, workload.media)
    gpu_rec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    # the job as `memfit estimate` runs it: a defaulted precision settled for this GPU (fp16 on
    # one without bf16) and the checkpoint's dtype, with the line that says which default applied
    workload, precision_note = settled_for(workload, source, gpu_rec)
    est_fn, first = _estimator(source, gpu_rec, estimator)
    # the job itself as `memfit estimate` answers it (one verdict: the analytic engine where the
    # fast-path grid validates it, else the precise route); the what-ifs by ``est_fn``
    est = None if estimator is not None else _as_estimate(source, workload, gpu_rec)
    if est is None:  # an injected estimator (tests), or a job estimate's route refuses
        est = est_fn(workload)
    notes = [] if precision_note is None or workload.mode != "train" else [precision_note]
    if first is not None and first.n_trace:
        notes.append(f"estimated by the trace engine: {first.rejected[0]}")
    # an injected estimator (tests) gets the planner's plan over it, not estimate's search
    d = DoctorChecks(
        source, workload, gpu_rec, est, est_fn, headroom, told, nearest_searched=estimator is None
    )
    findings = d.run()
    return DoctorReport(
        verdict=None if d.budget is None else verdict(est, d.budget),
        model_name=source.name,
        workload=workload,
        gpu_name=None if gpu_rec is None else gpu_rec.name,
        estimate=est,
        findings=findings,
        notes=notes + d.notes,
    )


def _as_estimate(source: Any, workload: WorkloadSpec, gpu: Any) -> MemoryEstimate | None:
    """``workload``'s answer by ``memfit estimate``'s engine choice (:func:`active`), None
    where that route refuses it (the checklist's estimator then answers)."""
    try:
        return active().estimate(source, workload, gpu)
    except MemfitError:
        return None


def _estimator(
    source: Any, gpu: Any, injected: Estimator | None
) -> tuple[Estimator, AnalyticFirst | None]:
    """The injected estimator, or the analytic engine with the trace engine for the job itself
    when the analytic engine does not model it yet (one trace run: seconds)."""
    if injected is not None:
        return injected, None
    first = AUTO.analytic_first(source, gpu, max_trace=1)
    return CachedEstimator(first, "analytic"), first


class DoctorChecks(Checklist[Finding]):
    """One job's checks: its estimate, budget and cost facts, shared by the seven findings."""

    result_type = Finding

    def __init__(
        self,
        source: Any,
        w: WorkloadSpec,
        gpu: Any,
        est: MemoryEstimate,
        est_fn: Estimator,
        headroom: float,
        told: UserFacts,
        *,
        nearest_searched: bool = False,
    ) -> None:
        self.source, self.w, self.gpu, self.est, self.est_fn = source, w, gpu, est, est_fn
        self.headroom, self.told = headroom, told
        self.budget = None if gpu is None else Budget.of(gpu, headroom=headroom)
        self.need = need_bytes(est)
        self.facts = ModelFacts.from_spec(source.spec, est.n_params)
        self.model = source.name
        self.notes: list[str] = []
        #: whether "no batch fits" names `memfit estimate`'s nearest change (memfit.plan.nearest,
        #: the same search and words), or the planner's plan over ``est_fn`` (an injected one)
        self.nearest_searched = nearest_searched
        #: the job as the next steps propose it: its precision as this GPU runs it
        asked = w.precision or DEFAULT_PRECISION[w.mode]  # resolved by WorkloadSpec: never None
        self.proposed = replace(w, precision=precision_on(asked, gpu))
        if self.proposed.precision != w.precision:
            self.notes.append(
                f"{gpu.name} has no bf16 tensor cores: the next steps run the job in "
                f"{self.proposed.precision}, the fp16 counterpart of {w.precision}"
            )

    def cmd(self, verb: str, *extra: str) -> str:
        gpu = [] if self.gpu is None else ["--gpu", self.gpu.name]
        return " ".join(["memfit", verb, self.model, *gpu, *extra, workload_flags(self.proposed)])

    def plan_cmd(self, *extra: str, gpu: bool = True) -> str:
        """``memfit plan`` takes the job's shape and its recipe (precision, LoRA rank), not its
        memory techniques (it chooses those)."""
        w = self.w
        f = ["memfit plan", self.model]
        f += ["--gpu", self.gpu.name] if gpu and self.gpu is not None else []
        f += [f"--mode {w.mode} --seq {w.seq_len} --batch {w.batch_size}"]
        f += [f"--new-tokens {w.new_tokens}"] if w.new_tokens else []
        f += [f"--gpus {w.gpus}"] if w.gpus > 1 else []
        asked = w.precision or DEFAULT_PRECISION[w.mode]
        if asked != DEFAULT_PRECISION[w.mode]:  # the planner's default is right for each GPU
            f += [f"--precision {precision_on(asked, self.gpu if gpu else None)}"]
        f += [f"--lora-rank {w.lora_rank}"] if w.is_train and w.lora_rank is not None else []
        f += [f"--kernels {w.kernels}"] if w.is_train and w.kernels != "hf" else []
        return " ".join(f + list(extra))

    # -- 1 -----------------------------------------------------------------------------------
    @check
    def weights_only_sizing(self) -> Finding:
        sized_by = self.told.sized_by
        per_weight = STORED_BYTES_PER_WEIGHT.get(self.w.quant)
        if per_weight is None:
            per_weight = 4 if self.w.precision == "32-true" else CHECKPOINT_BYTES_PER_WEIGHT
        weights = round(self.est.n_params * per_weight)
        ratio = self.need / max(weights, 1)
        text = (
            f"the weights are {format_bytes(weights)} but the "
            f"{'step' if self.w.is_train else 'run'} needs {format_bytes(self.need)} on the "
            f"device (upper end): sizing by weights under-counts by {ratio:.1f}x"
        )
        applies = _SIZED_APPLIES.get(sized_by or "", "unknown")
        if self.budget is not None and weights <= self.budget.capacity_bytes < self.need:
            text += f"; the weights alone fit {self.gpu.name} but the job {self._verdict_words()}"
        return Finding(
            id="weights_only_sizing",
            status=applies,
            evidence=text,
            next_step=f"size the whole job: {self.cmd('estimate')}",
            numbers={"weights_bytes": weights, "need_bytes": self.need, "ratio": ratio},
        )

    # -- 2 -----------------------------------------------------------------------------------
    @check
    def quantization_unchecked(self) -> Finding:
        checked = self.told.quality_checked
        q = self.w.quant
        if q == "none":
            return Finding(
                id="quantization_unchecked",
                status="no",
                evidence=f"weights stay {self.w.precision}: nothing quantized",
                next_step="none",
            )
        risk = RISKS.get(("quant", q), (1, f"{q} base weights: check quality"))[1]
        applies = "unknown" if checked is None else ("no" if checked else "yes")
        told = {None: "not said (--quality-checked)", True: "checked", False: "not checked"}
        return Finding(
            id="quantization_unchecked",
            status=applies,
            evidence=f"{q} weights ({risk}); quality {told[checked]}",
            next_step="compare the quantized model with the 16-bit one on your eval set "
            f"(perplexity or the task metric); whether a 16-bit plan fits instead: "
            f"{self.plan_cmd('--no-quant')}",
            numbers={"quant": q},
        )

    # -- 3 -----------------------------------------------------------------------------------
    @check
    def batch_unprofiled(self) -> Finding:
        batch_from = self.told.batch_from
        b = self.w.batch_size
        applies = {"guess": "yes", "profile": "no", "finder": "no"}.get(batch_from or "", "unknown")
        step = f"find it: {self.cmd('fit', '--solve', 'batch')}, then watch the first steps "
        step += "with `memfit monitor -- python train.py`"
        if self.gpu is None:
            return Finding(
                id="batch_unprofiled",
                status=applies,
                evidence=f"batch {b} needs {format_bytes(self.need)}; give --gpu to compare it "
                "with the largest batch that fits",
                next_step=step,
                numbers={"batch": b, "need_bytes": self.need},
            )
        r = fit(
            self.source, replace(self.w, batch_size=1), solve="batch", gpu=self.gpu,
            headroom=self.headroom, estimator=self.est_fn, kv_table=False,
        )  # fmt: skip
        limit = r.budget.limit_bytes
        numbers: dict[str, Any] = {"batch": b, "max_batch": r.max_value, "limit_bytes": limit}
        if r.max_value == 0:  # not even batch 1: the way forward is a change to the job
            text, step = self._no_batch_fits(limit, numbers)
            return Finding(
                id="batch_unprofiled", status="yes", evidence=text, next_step=step,
                numbers=numbers,
            )  # fmt: skip
        text = (
            f"batch {b} needs {format_bytes(self.need)}; the largest batch that fits "
            f"{self.gpu.name} within {format_bytes(limit)} is {r.max_value} (fit --solve batch)"
        )
        if b > r.max_value:
            applies, text = "yes", text + f": batch {b} {self._verdict_words()}"
        elif r.max_value >= 2 * b:
            text += f": {r.max_value / b:.1f}x the batch in use fits"
        return Finding(
            id="batch_unprofiled", status=applies, evidence=text, next_step=step, numbers=numbers
        )

    def _verdict_words(self) -> str:
        """THE verdict of the job as a predicate: ``does not fit``, or ``is tight (...)``."""
        v = verdict(self.est, self.budget) if self.budget is not None else None
        if v is None or v.verdict == DOES_NOT_FIT:
            return "does not fit"
        return f"is {v.verdict} (its upper end is over the limit)"

    def _no_batch_fits(self, limit: int, numbers: dict[str, Any]) -> tuple[str, str]:
        """The batch finding when no batch size fits: the job's need, and the planner's least
        change that fits (its recommended plan), or that none does on this GPU."""
        text = (
            f"no batch size fits {self.gpu.name} as the job is set up: it needs "
            f"{format_bytes(self.need)} (upper end) at batch {self.w.batch_size}, over the "
            f"{format_bytes(limit)} limit"
        )
        nearest = self._nearest()
        if nearest is not None and nearest.change is not None:
            numbers["nearest_plan"] = nearest.plan
            numbers["nearest_kind"] = nearest.kind
            text += (
                f"; the nearest change that fits ({nearest.kind}) is {nearest.change} — "
                f"{nearest.plan}"
            )
            return text, f"compare the plans: {nearest.command}"
        p = self._plan()
        rec = None if p is None else p.recommended
        if rec is None:
            text += "; no plan of the planner fits this GPU either"
            closest = None if p is None else p.closest
            if closest is not None and closest.need_bytes is not None:
                text += (
                    f" (the closest plan, {closest.settings.describe()}: "
                    f"{format_bytes(closest.need_bytes)}, upper end)"
                )
            return text, "use a GPU with more memory: " + self.plan_cmd(
                "--recommend-gpu", gpu=False
            )
        numbers["nearest_plan"] = rec.settings.describe()
        numbers["nearest_plan_need_bytes"] = rec.need_bytes
        text += (
            f"; the nearest change that fits is {rec.settings.describe()} (that plan: "
            f"{format_bytes(rec.need_bytes or 0)}, upper end)"
        )
        return text, f"change the job as the plan says: {self.plan_cmd('--allow-offload')}"

    def _nearest(self) -> NearestFit | None:
        """`memfit estimate`'s nearest change for this job (memfit.plan.nearest: one search,
        one answer on every surface); None where doctor's own estimator is injected."""
        if not self.nearest_searched or self.gpu is None:
            return None
        return nearest_fit(self.source, self.proposed, self.gpu, model_name=self.model)

    def _plan(self) -> Plan | None:
        """The planner's answer for the job's recipe (its precision, optimizer, attention and
        adapter) on this GPU, offload allowed, with doctor's estimator (no confirmation)."""
        w = self.proposed
        # the job as described (memfit.plan.request.job_request, the one door), at its own
        # micro-batch without accumulation, offload allowed, no confirmation
        request = job_request(
            w, batch_size=w.batch_size, global_batch=None, headroom=self.headroom,
            allow_offload=True,
        )  # fmt: skip
        try:
            return plan(self.source, request, gpu=self.gpu, estimator=self.est_fn)
        except SpecError as exc:  # a job the planner does not take (said in the notes)
            self.notes.append(f"no plan for the way forward: {exc}")
            return None

    # -- 4 -----------------------------------------------------------------------------------
    @check
    def sequence_ignored(self) -> Finding:
        sized_by = self.told.sized_by
        key = "activations" if self.w.is_train else "kv_cache"
        # The component at its own largest, over the phases: a training step peaks at the
        # optimizer step, where the activations are already freed, so the live bytes at the
        # overall peak would read ~0 for the very tensors the sequence length sizes.
        part, phase = self.est.components.get(key, 0), self.est.peak_phase
        for name, ph in self.est.phases.items():
            if ph.components.get(key, 0) > part:
                part, phase = ph.components[key], name
        share = part / max(self.est.peak_allocated_bytes, 1)
        b, s = self.w.batch_size, self.w.seq_len
        text = (
            f"at seq {s} x batch {b} the {key.replace('_', ' ')} "
            f"{'take' if key == 'activations' else 'takes'} {format_bytes(part)} "
            f"(at their largest, in the {phase}) = {share:.0%} of the peak allocated "
            f"{format_bytes(self.est.peak_allocated_bytes)}"
        )
        numbers: dict[str, Any] = {
            "bytes": part, "share": share, "component": key, "phase": phase,
        }  # fmt: skip
        if not self.w.is_train:
            tokens = b * (s + self.w.new_tokens)
            per_token = part // max(tokens, 1)
            text += f" ({format_bytes(per_token)} per token of context per request)"
            numbers["kv_bytes_per_token"] = per_token
        if share < SEQUENCE_SHARE_MIN:
            applies = "no"
            text += f"; below {SEQUENCE_SHARE_MIN:.0%}, the headroom absorbs it"
        elif sized_by == "weights":
            applies = "yes"
            text += "; sizing by the weights leaves it out"
        else:
            applies = "no" if sized_by in ("estimate", "profile") else "unknown"
        solve = "seq" if self.w.is_train else "concurrency"
        return Finding(
            id="sequence_ignored",
            status=applies,
            evidence=text,
            next_step=f"see how far it goes: {self.cmd('fit', '--solve', solve)}",
            numbers=numbers,
        )

    # -- 5 -----------------------------------------------------------------------------------
    @check
    def stacked_unbenchmarked(self) -> Finding:
        benchmarked = self.told.benchmarked
        used = techniques(self.w)
        numbers: dict[str, Any] = {"techniques": used}
        text = f"{len(used)} memory technique(s): {', '.join(used) or 'none'}"
        if self.gpu is not None and used:
            mine, naive = self._cost(settings_of(self.w)), self._cost(naive_settings(self.w))
            slowdown = mine.step_s / naive.step_s
            numbers["predicted_slowdown"] = slowdown
            text += (
                f"; predicted {mine.step_s:.3g} s/step vs {naive.step_s:.3g} s without them "
                f"({slowdown:.2f}x, roofline on {self.gpu.name})"
            )
        if len(used) < STACK_MIN:
            applies = "no"
        else:
            applies = "unknown" if benchmarked is None else ("no" if benchmarked else "yes")
        return Finding(
            id="stacked_unbenchmarked",
            status=applies,
            evidence=text,
            next_step="check which of them the job needs: "
            f"{self.plan_cmd()}; time each addition for a few "
            "steps with `memfit monitor -- python train.py` (tokens/s in the log)",
            numbers=numbers,
        )

    def _cost(self, s: Settings, gpu: Any = None) -> StepCost:
        """The cost model's step of ``s`` on ``gpu`` (default the job's)."""
        w = self.w
        share = 1.0  # the naive stack trains every weight; the job's own share from its estimate
        if s.lora_rank is not None or s.freeze_layers:
            share = trainable_share(self.est)
        return step_cost(
            s, self.facts, Rates.of(gpu or self.gpu), mode=w.mode, seq_len=w.seq_len,
            new_tokens=w.new_tokens, trainable_fraction=share,
        )  # fmt: skip

    # -- 6 -----------------------------------------------------------------------------------
    @check
    def reserved_as_leak(self) -> Finding:
        log = self.told.log
        if log is None:
            return Finding(
                id="reserved_as_leak",
                status="unknown",
                evidence="no run log given (--log)",
                next_step="record a run with `memfit monitor -- python train.py` (or "
                "memfit.Monitor in the script), then `memfit diagnose run.jsonl`",
            )
        d = diagnose(log)
        numbers: dict[str, Any] = {"verdict": d.verdict, "cache_bytes": d.cache_bytes}
        if d.allocated is not None and d.reserved is not None:
            numbers["allocated_bytes"] = d.allocated.end_bytes
            numbers["reserved_bytes"] = d.reserved.end_bytes
        applies = {"cache": "yes", "too_few_steps": "unknown"}.get(d.verdict, "no")
        step = {
            "cache": "nothing to fix: the allocator reuses its cache; compare allocated, not "
            "nvidia-smi, with the estimate (`memfit report run.jsonl`)",
            "leak": "a real leak: find what keeps tensors alive (store loss.item())",
            "fragmentation": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "stable": "nothing to fix",
        }.get(d.verdict, "log more steps with memfit.Monitor in the training loop")
        return Finding(
            id="reserved_as_leak",
            status=applies,
            evidence=f"{os.path.basename(str(log))}: {d.summary}",
            next_step=step,
            numbers=numbers,
        )

    # -- 7 -----------------------------------------------------------------------------------
    @check
    def gpu_by_vram(self) -> Finding:
        chose_gpu_by = self.told.chose_gpu_by
        applies = {"vram": "yes", "throughput": "no"}.get(chose_gpu_by or "", "unknown")
        step = "rank GPUs by predicted throughput: "
        step += self.plan_cmd("--recommend-gpu", gpu=False)
        if self.gpu is None:
            return Finding(
                id="gpu_by_vram",
                status=applies,
                evidence="no --gpu given",
                next_step=step,
            )
        ranked = self._rank_gpus()
        names = [g for g, _ in ranked]
        mine = dict(ranked).get(self.gpu.name)
        text = (
            f"{len(ranked)} GPUs of the catalog have room for this job (it needs "
            f"{format_bytes(self.need)}, upper end)"
        )
        numbers: dict[str, Any] = {"n_with_room": len(ranked), "tokens_per_s": mine}
        if mine is None:
            text += f"; {self.gpu.name} is not one of them"
        else:
            rank = names.index(self.gpu.name) + 1
            numbers["rank"] = rank
            text += f"; {self.gpu.name} ranks {rank} by predicted tokens/s ({mine:,.0f})"
        top = ", ".join(f"{g} {t:,.0f}" for g, t in ranked[:3])
        text += f"; fastest: {top} tokens/s (same stack, roofline)" if ranked else ""
        return Finding(
            id="gpu_by_vram", status=applies, evidence=text, next_step=step, numbers=numbers
        )

    def _rank_gpus(self) -> list[tuple[str, float]]:
        """Catalog GPUs whose capacity minus headroom holds this job's estimate (the CUDA
        context differs by a few hundred MiB between GPUs: said in the notes), fastest first."""
        gpus, unrated = rated_gpus("ranked")
        out = []
        for g in gpus:
            limit = Budget.of(g, headroom=self.headroom).limit_bytes
            if self.need <= limit:
                s = settings_of(self.w)
                out.append((g.name, self._cost(s, g).tokens_per_s))
        self.notes.append(
            "GPUs ranked with this GPU's estimate; the CUDA context differs by < 0.3 GiB "
            "between GPUs"
        )
        if unrated:
            self.notes.append(unrated)
        return sorted(out, key=lambda x: -x[1])


def techniques(w: WorkloadSpec) -> list[str]:
    """The memory-saving techniques a workload stacks, in words."""
    out = []
    if w.is_train and w.checkpointing != "none":
        out.append(f"{w.checkpointing} checkpointing")
    if w.is_train and w.optimizer in ("adamw-8bit", "paged-adamw-8bit", "adafactor"):
        out.append(f"{w.optimizer} optimizer")
    if w.is_train and w.lora_rank is not None:
        out.append(f"LoRA r{w.lora_rank}")
    if w.is_train and w.freeze_layers:
        out.append(f"{w.freeze_layers} frozen layers")
    if w.quant != "none":
        out.append(f"{w.quant} weights")
    if w.shard in ("zero1", "zero2", "zero3", "fsdp"):
        out.append(w.shard)
    if w.offload != "none":
        out.append(f"offload {w.offload}")
    if w.tp > 1:
        out.append(f"tensor parallel {w.tp}")
    return out


def settings_of(w: WorkloadSpec) -> Settings:
    return Settings.of(w)


def naive_settings(w: WorkloadSpec) -> Settings:
    """The same job without memory techniques: 16-bit or AMP weights, AdamW, DDP."""
    return Settings(
        precision=w.precision,
        attention=w.attention,
        optimizer="adamw" if w.is_train else "none",
        gpus=w.gpus,
        shard="ddp" if w.gpus > 1 else "none",
        micro_batch=w.batch_size,
    )


def workload_flags(w: WorkloadSpec) -> str:
    """``w`` as ``memfit estimate`` flags (defaults left out)."""

    return flags(w)

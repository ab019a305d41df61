"""The estimate record every engine returns, and its JSON form (field names are public)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memfit.errors import DoesNotFitError
from memfit.estimate.uncertainty import PATHS, PathBands, estimate_path, ranges
from memfit.estimate.verdict import judge, judge_estimate
from memfit.report.estimate_html import estimate_fragment

if TYPE_CHECKING:
    from memfit.estimate.verdict import Verdict

#: Components of device memory, in report order. ``parameters`` includes module buffers;
#: ``activations`` includes the step's inputs; ``temporary`` is everything born in backward or in
#: the optimizer step that is not a gradient or an optimizer state (autograd buffers, foreach
#: temporaries, kernel workspaces) plus the cuBLAS/cuBLASLt workspaces held for the process's life.
COMPONENTS = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "kv_cache",
    "temporary",
)


@dataclass(frozen=True, kw_only=True)
class PhasePeak:
    """The highest live bytes inside one phase (forward, backward, optimizer, prefill, decode)."""

    phase: str
    peak_allocated_bytes: int
    components: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"peak_allocated_bytes": self.peak_allocated_bytes, "components": self.components}


@dataclass(frozen=True, kw_only=True)
class FitVerdict:
    """The job on ``gpu`` by THE verdict rule (:mod:`memfit.estimate.verdict`): ``verdict`` is
    ``fits`` / ``tight`` / ``does not fit``, ``fits`` is ``verdict == "fits"``. ``free_bytes``:
    capacity minus the point value. :class:`MemoryEstimate` fills in the verdict from its range."""

    gpu: str
    capacity_bytes: int
    free_bytes: int
    fits: bool
    verdict: str | None = None
    need_bytes: int | None = None  # resident: the paged optimizer states left out
    headroom_bytes: int = 0
    paged_bytes: int = 0  # paged (evictable) optimizer states: memfit.estimate.verdict

    def judgement(self) -> Verdict:
        need = self.need_bytes if self.need_bytes is not None else 0
        return judge(
            point_bytes=self.capacity_bytes - self.free_bytes,
            need_bytes=need + self.paged_bytes,
            capacity_bytes=self.capacity_bytes,
            headroom_bytes=self.headroom_bytes,
            evictable_bytes=self.paged_bytes,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "capacity_bytes": self.capacity_bytes,
            "free_bytes": self.free_bytes,
            "fits": self.fits,
        }
        if self.verdict is not None:
            v = self.judgement()
            out.update(
                verdict=v.verdict,
                need_bytes=v.need_bytes,
                headroom_bytes=v.headroom_bytes,
                limit_bytes=v.limit_bytes,
                margin_bytes=v.margin_bytes,
            )
            if v.paged_bytes:
                out.update(paged_bytes=v.paged_bytes, evicted_bytes=v.evicted_bytes)
        return out


@dataclass(frozen=True, kw_only=True)
class ModuleBytes:
    name: str
    n_bytes: int


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Peak memory of one job, by component and phase.

    ``peak_allocated_bytes``: what ``torch.cuda.max_memory_allocated()`` would report (tensor bytes,
    rounded to the allocator's 512 B blocks). ``peak_reserved_bytes``: ``max_memory_reserved()``
    (allocator segments incl. cache and fragmentation, plus library workspaces held in the
    allocator). ``device_used_bytes``: what ``nvidia-smi`` shows for the process (reserved + CUDA
    context). ``components`` are the live bytes at the peak and sum to ``peak_allocated_bytes``.
    """

    model_name: str
    n_params: int
    n_trainable_params: int
    workload: dict[str, Any]
    engine: str
    environment: dict[str, str]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    cuda_context_bytes: int
    device_used_bytes: int
    peak_phase: str
    components: dict[str, int]
    phases: dict[str, PhasePeak]
    top_modules: list[ModuleBytes]
    fits: FitVerdict | None = None
    #: Host (CPU) RAM the job needs for what it offloads (optimizer states, fp32 masters, params).
    host_memory_bytes: int = 0
    #: Paged optimizer states: CUDA unified memory, on the device until the driver evicts them to
    #: host RAM under pressure; included in ``optimizer_states`` and reported here as well.
    unified_memory_bytes: int = 0
    #: ``{"peak_allocated_bytes": (low, high), "peak_reserved_bytes": ..., "device_used_bytes":
    #: ...}``: what the engine cannot know (fragmentation, library workspaces, kernel choice),
    #: from memfit.estimate.uncertainty; an engine may pass wider ranges of its own.
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    attention_backends: dict[str, int] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Why ``engine`` answered (the engine policy's rule, memfit.estimate.policy); None when the
    #: engine was called directly.
    engine_reason: str | None = None
    #: The code path whose measured error the range carries (memfit.estimate.uncertainty.PATHS:
    #: ``current-hf``, ``other-framework``, ``old-stack``, ``per-rank-closed-form``); None
    #: derives it from the estimate (its workload, the versions it traced with, the framework
    #: that answered). Set by a caller that knows the job runs elsewhere (a LitGPT / torchtune
    #: file answered through transformers' model: ``other-framework``) and by the per-rank
    #: closed form (``per-rank-closed-form``, memfit.estimate.parallel).
    band_path: str | None = None
    #: Whether the bytes are the trace engine's (True: traced, read from the trace cache or a
    #: derived form, or a fast answer the trace confirmed), a fast engine's answer no trace
    #: checked (False: the analytic engine's validated default, memfit.estimate.fastpath), or
    #: None where the one-answer rule did not set it (an engine named alone, a search's
    #: estimates, which say their engines in their own notes, or an engine called directly).
    confirmed: bool | None = None

    def __post_init__(self) -> None:
        total = sum(self.components.values())
        if total != self.peak_allocated_bytes:
            raise ValueError(
                f"components sum to {total} bytes but peak_allocated_bytes is "
                f"{self.peak_allocated_bytes}: an engine bug, please report it"
            )
        if self.band_path is not None and self.band_path not in PATHS:
            raise ValueError(
                f"band_path ({self.band_path!r}) must be one of {', '.join(PATHS)} or None"
            )

        # An engine's own ranges (the analytic engine's reserved-bytes model) widen the calibrated
        # ones; they never narrow them.
        merged = ranges(self)
        for metric, (low, high) in self.ranges.items():
            base_low, base_high = merged.get(metric, (low, high))
            merged[metric] = (min(low, base_low), max(high, base_high))
        # nvidia-smi sees reserved + the context: keep the device range at least that wide.
        context = self.device_used_bytes - self.peak_reserved_bytes
        res_low, res_high = merged["peak_reserved_bytes"]
        dev_low, dev_high = merged["device_used_bytes"]
        merged["device_used_bytes"] = (
            min(dev_low, res_low + context),
            max(dev_high, res_high + context),
        )
        object.__setattr__(self, "ranges", merged)
        if self.fits is not None and self.fits.verdict is None:
            v = judge_estimate(self, self.fits.capacity_bytes)
            verdict = replace(
                self.fits,
                fits=v.fits,
                verdict=v.verdict,
                need_bytes=v.need_bytes,
                headroom_bytes=v.headroom_bytes,
                paged_bytes=v.paged_bytes,
            )
            object.__setattr__(self, "fits", verdict)

    @property
    def peak_components(self) -> dict[str, int]:
        """The :class:`~memfit.estimate.answer.Answer` name of ``components``."""
        return self.components

    def with_band(self, path: str) -> MemoryEstimate:
        """This estimate carrying ``path``'s band (memfit.estimate.uncertainty.PATHS), its
        verdict judged again on the new range: for a caller that knows the job runs another code
        path than the estimate shows (a LitGPT / torchtune file answered through transformers'
        model: ``other-framework``). The range only widens (an engine's ranges never narrow)."""
        fits = None if self.fits is None else replace(self.fits, verdict=None)
        return replace(self, band_path=path, fits=fits)

    @property
    def band(self) -> PathBands:
        """The bands the range was drawn with: its code path and the measurements behind it."""
        return PATHS[estimate_path(self)]

    @property
    def verdict(self) -> Verdict | None:
        """THE verdict (:func:`memfit.estimate.verdict.judge`) on the GPU asked, None without."""
        if self.fits is None or self.fits.verdict is None:
            return None
        return self.fits.judgement()

    def _repr_html_(self) -> str:
        """A notebook's view: the verdict, the peaks with their ranges, the components bar."""
        return estimate_fragment(self.to_json())

    def raise_if_not_fit(self) -> None:
        """Raise :class:`DoesNotFitError` unless the verdict is ``fits`` (``tight`` raises too:
        the upper end of the range plus headroom does not fit; see memfit.estimate.verdict)."""
        if self.fits is not None and not self.fits.fits:
            raise DoesNotFitError(f"{self.model_name}: {self.fits.judgement().text(self.fits.gpu)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": {
                "name": self.model_name,
                "n_params": self.n_params,
                "n_trainable_params": self.n_trainable_params,
            },
            "workload": self.workload,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "confirmed": self.confirmed,
            "environment": self.environment,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "device_used_bytes": self.device_used_bytes,
            **{
                f"{metric}_{end}": value
                for metric, pair in self.ranges.items()
                for end, value in zip(("low", "high"), pair, strict=True)
            },
            "band": self.band.to_json(),
            "host_memory_bytes": self.host_memory_bytes,
            "unified_memory_bytes": self.unified_memory_bytes,
            "peak_phase": self.peak_phase,
            "components": dict(self.components),
            "phases": {name: p.to_json() for name, p in self.phases.items()},
            "top_modules": [{"name": m.name, "bytes": m.n_bytes} for m in self.top_modules],
            "fits": None if self.fits is None else self.fits.to_json(),
            "attention_backends": dict(self.attention_backends),
            "trace": dict(self.trace),
            "notes": list(self.notes),
        }

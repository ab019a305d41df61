"""What ``memfit doctor`` (:func:`memfit.plan.doctor.doctor`) answers: the seven mistakes, the
facts only the user can tell (:class:`UserFacts`), one :class:`Finding` per mistake and the
:class:`DoctorReport`. The checks themselves: :class:`memfit.plan.doctor.DoctorChecks`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.verdict import Verdict
from memfit.plan.budget import need_bytes
from memfit.plan.checklist import CheckResult, find
from memfit.spec import WorkloadSpec

APPLIES = ("yes", "no", "unknown")
SIZED_BY = ("weights", "estimate", "profile")
BATCH_FROM = ("guess", "profile", "finder")
CHOSE_GPU_BY = ("vram", "throughput")
MISTAKES: dict[str, str] = {
    "weights_only_sizing": "sizing by the weights alone",
    "quantization_unchecked": "quantization without a quality check",
    "batch_unprofiled": "batch size chosen without profiling",
    "sequence_ignored": "sequence length / KV cache ignored",
    "stacked_unbenchmarked": "several techniques stacked without benchmarking",
    "reserved_as_leak": "reserved memory mistaken for a leak",
    "gpu_by_vram": "GPU chosen by VRAM alone",
}


class Finding(CheckResult):
    """Whether one mistake applies (``applies``: yes / no / unknown), the evidence in words, the
    next step as a memfit command, and the numbers behind it."""

    TITLES: ClassVar[dict[str, str]] = MISTAKES
    STATUSES: ClassVar[tuple[str, ...]] = APPLIES
    FLAGGED: ClassVar[str] = "yes"
    CLEAR: ClassVar[str] = "no"
    ID_KEY: ClassVar[str] = "mistake"
    STATUS_KEY: ClassVar[str] = "applies"
    WITH_NEXT_STEP: ClassVar[bool] = True

    @property
    def mistake(self) -> str:
        return self.id

    @property
    def applies(self) -> str:
        return self.status


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    """The findings for one job: its estimate, one :class:`Finding` per mistake, notes."""

    model_name: str
    workload: WorkloadSpec
    gpu_name: str | None
    estimate: MemoryEstimate
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    #: THE verdict rule (memfit.estimate.verdict) of the job on the GPU; None without --gpu
    verdict: Verdict | None = None

    @property
    def exit_code(self) -> int:
        """0 when the job fits the GPU (or no GPU was given), 1 when it is tight or does not
        fit: the exit code every command gives for the same job."""
        return 0 if self.verdict is None else self.verdict.exit_code

    @property
    def applying(self) -> list[Finding]:
        return [f for f in self.findings if f.flagged]

    def finding(self, mistake: str) -> Finding:
        return find(self.findings, mistake)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "gpu": self.gpu_name,
            "workload": self.workload.normalized(),
            "engine": self.estimate.engine,
            "need_bytes": need_bytes(self.estimate),
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "n_apply": len(self.applying),
            "n_unknown": sum(f.applies == "unknown" for f in self.findings),
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
        }


@dataclass(frozen=True, kw_only=True)
class UserFacts:
    """What only the user knows about the job; ``None``: not said (the finding is then
    ``unknown`` unless the numbers decide it)."""

    sized_by: str | None = None
    quality_checked: bool | None = None
    batch_from: str | None = None
    benchmarked: bool | None = None
    log: str | os.PathLike[str] | None = None
    chose_gpu_by: str | None = None

    def __post_init__(self) -> None:
        p = []
        for name, allowed in (
            ("sized_by", SIZED_BY),
            ("batch_from", BATCH_FROM),
            ("chose_gpu_by", CHOSE_GPU_BY),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                p.append(f"{name} ({value!r}) must be one of {', '.join(allowed)}")
        if self.log is not None and not os.path.isfile(self.log):
            p.append(
                f"log ({str(self.log)!r}) is not a file: give a run log written by memfit monitor"
            )
        if p:
            raise SpecError.from_problems(p)


__all__ = [
    "APPLIES",
    "BATCH_FROM",
    "CHOSE_GPU_BY",
    "MISTAKES",
    "SIZED_BY",
    "DoctorReport",
    "Finding",
    "UserFacts",
]

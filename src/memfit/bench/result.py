"""What a bench produced: one :class:`BenchRow` per configuration, in a :class:`BenchResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memfit.bench.gate import QualityResult


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    """One configuration. Unknown values are None; ``error`` says why a row could not run.

    ``estimate_error`` is the reason the estimate failed (``estimated_peak_bytes`` is then None).
    Savings are the baseline's peak minus this row's; ``loss_delta`` is this row's last-step loss
    minus the baseline's (same batches, same number of updates before it)."""

    name: str
    techniques: list[str]
    workload: dict[str, Any]
    measured_peak_bytes: int | None = None
    measured_fwd_bwd_peak_bytes: int | None = None
    estimated_fwd_bwd_peak_bytes: int | None = None
    measured_reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    estimated_peak_bytes: int | None = None
    estimate_error: str | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    losses: list[float] = field(default_factory=list)
    n_trainable_params: int | None = None
    quality: QualityResult | None = None
    measured_saving_bytes: int | None = None
    estimated_saving_bytes: int | None = None
    reduction_factor: float | None = None
    loss_delta: float | None = None
    error: str | None = None

    @property
    def prediction_error(self) -> float | None:
        """(estimate - measured) / measured."""
        if self.estimated_peak_bytes is None or not self.measured_peak_bytes:
            return None
        return (self.estimated_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    @property
    def saving_agreement(self) -> float | None:
        """Estimated saving / measured saving (1.0: the estimate predicts the saving exactly)."""
        if self.estimated_saving_bytes is None or not self.measured_saving_bytes:
            return None
        return self.estimated_saving_bytes / self.measured_saving_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quality"] = self.quality.to_dict() if self.quality else None
        d["prediction_error"] = _round(self.prediction_error)
        d["saving_agreement"] = _round(self.saving_agreement)
        return d


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    model: str
    pretrained: str | None
    task: str
    device: str
    corpus: str
    tokenizer: str
    steps: int
    batch_size: int
    seq_len: int
    estimate_kind: str
    workspace_bytes_excluded: int
    rows: list[BenchRow]
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def row(self, name: str) -> BenchRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no bench row {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    @property
    def quality_failures(self) -> list[str]:
        """Rows whose quality gate failed."""
        return [r.name for r in self.rows if r.quality is not None and not r.quality.passed]

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "rows"}
        d["rows"] = [r.to_dict() for r in self.rows]
        return d


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)

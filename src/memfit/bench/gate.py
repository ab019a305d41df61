"""Output quality of a changed model against the unchanged one, on fixed inputs.

Metrics (all computed in fp32 over every position of the held-out windows):

- ``kl``: mean KL(P_ref ‖ P_test) of the next-token (or class) distributions, in nats — how much
  probability mass the change moves; 0 for identical outputs.
- ``top1``: fraction of positions whose argmax agrees (1.0 for identical outputs).
- ``cosine``: mean cosine similarity of the final hidden states (mean-pooled over the sequence, as
  sentence-transformers pools MiniLM) — the embedding metric; 1.0 for identical outputs.

A gate passes when every threshold the user set holds (``max_kl``, ``min_top1``, ``min_cosine``).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from memfit.errors import SpecError
from memfit.spec import QUANTS, WorkloadSpec

#: Default gate: the output distributions move by at most 0.05 nats and the pooled embeddings keep
#: a cosine of at least 0.99. Rules of thumb, not a standard: int8 weight-only quantization of
#: transformer linears stays well within both (measured on the packaged MiniLM: docs/bench.md);
#: set your own with --max-kl / --min-top1 / --min-cosine.
DEFAULT_MAX_KL = 0.05
DEFAULT_MIN_COSINE = 0.99


@dataclass(frozen=True, kw_only=True)
class QualityThresholds:
    max_kl: float | None = DEFAULT_MAX_KL
    min_top1: float | None = None
    min_cosine: float | None = DEFAULT_MIN_COSINE

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_kl", "min_top1", "min_cosine"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0):
                problems.append(f"{name} ({v!r}) must be a number >= 0")
        for name in ("min_top1", "min_cosine"):
            v = getattr(self, name)
            if isinstance(v, (int, float)) and v > 1:
                problems.append(f"{name} ({v!r}) must be at most 1 (a fraction, not a percent)")
        if problems:
            raise SpecError.from_problems(problems)


@dataclass(frozen=True, kw_only=True)
class QualityResult:
    """The metrics of one change, the gate's thresholds and its verdict."""

    change: str
    kl: float
    top1: float
    cosine: float
    n_positions: int
    thresholds: QualityThresholds
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def compare_outputs(ref: Any, test: Any) -> dict[str, float]:
    """KL / top-1 / cosine between two outputs of the same inputs (HF outputs with ``logits`` and
    ``hidden_states``, or plain logits tensors)."""
    ref_logits, test_logits = _logits(ref).float(), _logits(test).float()
    if ref_logits.shape != test_logits.shape:
        raise SpecError(
            f"outputs differ in shape ({tuple(ref_logits.shape)} vs {tuple(test_logits.shape)}): "
            "compare a model with a modified copy of itself"
        )
    ref_lp = torch.log_softmax(ref_logits.reshape(-1, ref_logits.shape[-1]), dim=-1)
    test_lp = torch.log_softmax(test_logits.reshape(-1, test_logits.shape[-1]), dim=-1)
    kl = torch.nn.functional.kl_div(test_lp, ref_lp, log_target=True, reduction="batchmean")
    top1 = (ref_lp.argmax(-1) == test_lp.argmax(-1)).float().mean()
    ref_emb, test_emb = _pooled(ref), _pooled(test)
    cosine = torch.nn.functional.cosine_similarity(ref_emb, test_emb, dim=-1).mean()
    return {
        "kl": max(float(kl), 0.0),  # rounding can make identical distributions -1e-9
        "top1": float(top1),
        "cosine": float(cosine),
        "n_positions": int(ref_lp.shape[0]),
    }


def _logits(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def _pooled(out: Any) -> torch.Tensor:
    """Mean over the sequence of the last hidden state (the logits when there are none)."""
    hidden = getattr(out, "hidden_states", None)
    last = hidden[-1] if hidden else _logits(out)
    return (last.float().mean(dim=1) if last.dim() == 3 else last.float()).reshape(
        last.shape[0], -1
    )


def gate(
    change: str, metrics: dict[str, float], thresholds: QualityThresholds, notes: list[str]
) -> QualityResult:
    failures = []
    t = thresholds
    if t.max_kl is not None and metrics["kl"] > t.max_kl:
        failures.append(f"KL {metrics['kl']:.4g} nats > max_kl {t.max_kl:g}")
    if t.min_top1 is not None and metrics["top1"] < t.min_top1:
        failures.append(f"top-1 agreement {metrics['top1']:.2%} < min_top1 {t.min_top1:.2%}")
    if t.min_cosine is not None and metrics["cosine"] < t.min_cosine:
        failures.append(f"cosine {metrics['cosine']:.5f} < min_cosine {t.min_cosine:g}")
    return QualityResult(
        change=change,
        kl=metrics["kl"],
        top1=metrics["top1"],
        cosine=metrics["cosine"],
        n_positions=int(metrics["n_positions"]),
        thresholds=thresholds,
        failures=failures,
        notes=notes,
    )


def outputs(model: torch.nn.Module, inputs: dict[str, Any]) -> Any:
    """The model's output on ``inputs`` (no labels), with hidden states, in eval mode."""
    device = next(model.parameters()).device
    feed = {k: v.to(device) for k, v in inputs.items() if k != "labels"}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(**feed, output_hidden_states=True)
    finally:
        model.train(was_training)
    return out


def quality(
    model: str = "minilm",
    *,
    quant: str = "int8",
    backend: str = "torchao",
    thresholds: QualityThresholds | None = None,
    seq_len: int = 128,
) -> QualityResult:
    """Quantize a copy of ``model`` with ``memfit.apply_plan_`` (inference, ``quant``, with the
    ``backend`` library) and compare it with the unquantized model on held-out windows of the
    packaged text."""
    from memfit.apply.model import apply_plan_
    from memfit.bench.data import make_batches
    from memfit.bench.models import get_bench_model

    if quant not in QUANTS or quant == "none":
        allowed = ", ".join(q for q in QUANTS if q != "none")
        raise SpecError(f"quant ({quant!r}) must be one of {allowed}")
    spec = get_bench_model(model)
    data = make_batches(
        task=spec.task, n_steps=0, batch_size=1, seq_len=seq_len, vocab_size=spec.vocab_size
    )
    reference = spec.build(train=False, attention="sdpa")
    ref_out = outputs(reference, data.eval)
    quantized = copy.deepcopy(reference)
    workload = WorkloadSpec(mode="infer", precision="fp32", quant=quant, seq_len=seq_len)
    apply_plan_(quantized, workload, quant_backend=backend)
    if problem := quantized_notes(quantized, spec.name, quant):
        raise SpecError(problem[0] + "; the gate would compare the model with itself")
    metrics = compare_outputs(ref_out, outputs(quantized, data.eval))
    notes = [f"inputs: {data.corpus}, {data.eval['input_ids'].shape[0]} windows of {seq_len}"]
    if spec.pretrained is None:
        notes.append(f"{spec.name} has random weights: the metrics measure the change, not skill")
    return gate(f"quant {quant} ({backend})", metrics, thresholds or QualityThresholds(), notes)


def quantized_notes(model: torch.nn.Module, name: str, quant: str) -> list[str]:
    """A note when ``apply_plan_`` quantized no layer of ``model`` (nothing to gate)."""
    from memfit.apply.model import applied_plan

    record = applied_plan(model)
    if record is None or record.quantized:
        return []
    return [
        f"quant {quant!r} quantized no layer of {name} (its projections are not nn.Linear, e.g. "
        "GPT-2's Conv1D): try opt-125m or minilm"
    ]

"""The quality metrics on known cases, and the gate's verdicts."""

from __future__ import annotations

import copy

import pytest
import torch

from memfit.bench.gate import QualityThresholds, compare_outputs, gate, outputs
from memfit.bench.models import get_bench_model
from memfit.errors import SpecError


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = get_bench_model("tiny-opt").build(train=False)
    torch.manual_seed(1)
    inputs = {"input_ids": torch.randint(0, 30000, (4, 32))}
    return model, inputs


def test_identical_models_have_zero_kl_full_agreement_and_cosine_one(tiny) -> None:
    model, inputs = tiny
    m = compare_outputs(outputs(model, inputs), outputs(copy.deepcopy(model), inputs))
    assert m["kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["top1"] == 1.0
    assert m["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert m["n_positions"] == 4 * 32


def test_a_perturbed_model_scores_worse_and_more_noise_scores_worse_still(tiny) -> None:
    model, inputs = tiny
    ref = outputs(model, inputs)
    scores = []
    for scale in (0.02, 0.5):
        noisy = copy.deepcopy(model)
        torch.manual_seed(2)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn_like(p) * scale * p.std())
        scores.append(compare_outputs(ref, outputs(noisy, inputs)))
    small, large = scores
    assert 0 < small["kl"] < large["kl"]
    assert large["top1"] < small["top1"] <= 1.0
    assert large["cosine"] < small["cosine"] < 1.0


def test_gate_lists_every_failed_threshold() -> None:
    metrics = {"kl": 0.2, "top1": 0.8, "cosine": 0.95, "n_positions": 10}
    res = gate("quant int8", metrics, QualityThresholds(max_kl=0.1, min_top1=0.9), [])
    assert not res.passed
    assert res.failures == [
        "KL 0.2 nats > max_kl 0.1",
        "top-1 agreement 80.00% < min_top1 90.00%",
        "cosine 0.95000 < min_cosine 0.99",
    ]
    ok = gate("quant int8", metrics, QualityThresholds(max_kl=None, min_cosine=0.9), [])
    assert ok.passed and ok.to_dict()["passed"] is True


def test_thresholds_reject_percentages_and_negatives() -> None:
    with pytest.raises(SpecError, match=r"min_top1 \(95\) must be at most 1"):
        QualityThresholds(min_top1=95)
    with pytest.raises(SpecError, match=r"max_kl \(-1\) must be a number >= 0"):
        QualityThresholds(max_kl=-1)


def test_outputs_of_different_shapes_are_refused(tiny) -> None:
    with pytest.raises(SpecError, match="outputs differ in shape"):
        compare_outputs(torch.zeros(2, 3, 5), torch.zeros(2, 3, 6))

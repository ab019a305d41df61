"""Factories that declare ``memfit_supports`` take those techniques (docs/factories.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import memfit
from memfit.errors import SpecError
from memfit.spec import WorkloadSpec

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _est(**w: object) -> memfit.MemoryEstimate:
    wl = WorkloadSpec(**{"batch_size": 16, "precision": "bf16-mixed", **w})  # type: ignore[arg-type]
    return memfit.estimate("tiny_vit:make", wl, allow_code=True)


def test_a_declared_checkpointing_drops_the_saved_activations() -> None:
    plain, ckpt = _est(), _est(checkpointing="full")
    assert ckpt.components["activations"] < plain.components["activations"] / 4


def test_a_declared_lora_trains_only_the_adapters() -> None:
    est = _est(lora_rank=8)
    # r x (in + out) per adapted linear: 4 blocks x (qkv 8x(128+384) + proj 8x256 + fc1 8x640
    # + fc2 8x640) + the head 8x(128+10)
    assert est.n_trainable_params == 4 * 8 * (512 + 256 + 640 + 640) + 8 * 138


def test_a_declared_freeze_keeps_the_frozen_blocks_out_of_the_optimizer() -> None:
    assert _est(freeze_layers=2).n_trainable_params < _est().n_trainable_params


def test_a_declared_quantization_replaces_the_linear_layers() -> None:
    quantized = _est(mode="infer", quant="int8")
    plain = _est(mode="infer")
    assert quantized.components["parameters"] < plain.components["parameters"] / 2
    assert quantized.n_params == plain.n_params


def test_an_undeclared_technique_names_what_the_factory_declares() -> None:
    from memfit.estimate.trace.factory_techniques import refuse_undeclared

    with pytest.raises(SpecError, match=r"lora_rank=8 .*memfit_supports = \{checkpointing\}"):
        refuse_undeclared("m:f", WorkloadSpec(lora_rank=8), frozenset({"checkpointing"}))


def test_an_unknown_declared_technique_is_refused() -> None:
    from memfit.estimate.trace.factory_techniques import declared_supports

    def make() -> None: ...

    make.memfit_supports = {"sharding"}  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match=r"memfit_supports names 'sharding'"):
        declared_supports(make)

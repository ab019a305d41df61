"""The registry: every model_type the analytic engine models, each with one declaration."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.errors import SpecError
from memfit.estimate.analytic.registry import (
    BY_MODEL_TYPE,
    FAMILIES,
    FAMILY_OF,
    program_for,
    read_arch,
    supports,
)
from memfit.estimate.tasks import resolve_task


def test_each_model_type_belongs_to_one_family() -> None:
    listed = [mt for f in FAMILIES for mt in f.model_types]
    assert len(listed) == len(set(listed))
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert FAMILY_OF["gpt_neox"] == "neox" and FAMILY_OF["roberta"] == "bert"


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_tiny_config_reads_into_its_family_and_gets_a_program(name: str) -> None:
    config = TINY[name]
    arch = read_arch(config)
    assert arch.family == BY_MODEL_TYPE[config["model_type"]].name
    prog = program_for(arch, resolve_task(config, "auto"))
    assert prog.a is arch


def test_an_unknown_model_type_is_refused_with_the_supported_ones() -> None:
    assert not supports({"model_type": "mamba"})
    assert supports({"model_type": "qwen3"})
    with pytest.raises(SpecError, match=r"model_type 'mamba' \(supported: bert, bloom, clip"):
        read_arch({"model_type": "mamba"})

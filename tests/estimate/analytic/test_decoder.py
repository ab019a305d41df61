"""Decoder family declarations: ``declare`` changes only the blocks it names, and refuses what
a DecoderFamily does not have."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.estimate.analytic.decoder import DecoderFamily, declare
from memfit.estimate.analytic.families import LLAMA, QWEN2, QWEN3


def test_declare_changes_only_the_named_fields_of_a_block() -> None:
    assert QWEN3.attention.qk_norm == "rms"
    assert QWEN3.attention.window == QWEN2.attention.window == "switched"
    assert QWEN3.mlp == LLAMA.mlp
    assert (QWEN3.norm, QWEN3.residual, QWEN3.program) == (LLAMA.norm, LLAMA.residual, None)
    assert QWEN3.model_types == ("qwen3",)


def test_declare_refuses_a_field_the_family_or_the_block_does_not_have() -> None:
    with pytest.raises(SpecError, match=r"declare\('x'\): rope is not a DecoderFamily field"):
        declare("x", like=LLAMA, rope="full")
    with pytest.raises(SpecError, match=r"declare\('x'\): qk_nrom is not a field of Attention"):
        declare("x", like=LLAMA, attention={"qk_nrom": "rms"})


def test_a_family_names_its_residual_style_from_the_vocabulary() -> None:
    with pytest.raises(SpecError, match=r"residual \('post'\) must be one of pre-norm, sandwich"):
        DecoderFamily(name="x", model_types=("x",), residual="post")
    with pytest.raises(SpecError, match=r"model_types \(\(\)\) must name at least one"):
        DecoderFamily(name="x", model_types=())

"""The block vocabulary's declarations: validated on construction, and what each option means
for a model's shape."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.errors import SpecError
from memfit.estimate.analytic.blocks import Attention
from memfit.estimate.analytic.mlp import Mlp
from memfit.estimate.analytic.registry import read_arch


def test_an_attention_option_outside_the_vocabulary_is_named_with_the_allowed_ones() -> None:
    with pytest.raises(SpecError, match=r"rotary \('half'\) must be one of none, config, partial"):
        Attention(rotary="half")
    with pytest.raises(SpecError, match=r"qk_norm \('batch'\) must be None or one of rms"):
        Attention(qk_norm="batch")


def test_a_layout_must_name_as_many_linear_layers_as_it_has() -> None:
    with pytest.raises(SpecError, match=r"names \(\('qkv',\)\) must name 3 Linear layer"):
        Attention(names=("qkv",))
    with pytest.raises(SpecError, match=r"names \(\('fc1', 'fc2'\)\) must name 3 Linear layer"):
        Mlp(kind="gated", names=("fc1", "fc2"))
    with pytest.raises(SpecError, match=r"kind \('glu'\) must be one of gated, gated-fused"):
        Mlp(kind="glu")


def test_partial_rotary_rotates_the_configs_share_of_each_head() -> None:
    neox = read_arch(TINY["neox"])  # rotary_pct 0.25 of a 32-wide head
    assert Attention(rotary="partial").rot_dim(neox) == 8
    assert Attention(rotary="full").rot_dim(neox) == 32
    assert Attention(rotary="none").rot_dim(neox) == 0
    assert Attention(rotary="none").table_dim(neox) == 0


def test_a_switched_window_applies_only_when_the_config_turns_it_on() -> None:
    off = read_arch(dict(TINY["qwen2"], sliding_window=32))
    on = read_arch(dict(TINY["qwen2"], sliding_window=32, use_sliding_window=True))
    assert Attention(window="switched").window_of(off) is None
    assert Attention(window="switched").window_of(on) == 32
    assert Attention(window="config").window_of(on) == 32
    assert off.sliding_window is None  # the ModelSpec applies Qwen2Config's rule already

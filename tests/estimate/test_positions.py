"""Sequences longer than a model's learned position table are refused by both engines."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.estimate import estimate
from memfit.estimate.tasks import position_problems
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


def test_learned_position_limits_follow_the_config() -> None:
    gpt2 = resolve_model("gpt2").config
    assert position_problems(gpt2, 1024) == []
    assert "pass --seq 1024" in position_problems(gpt2, 1025)[0]
    # generation: the last decode step's position is seq + new_tokens - 2
    assert position_problems(gpt2, 1000, 25, generative=True) == []
    assert "pass --seq 998" in position_problems(gpt2, 1000, 27, generative=True)[0]
    assert "fewer --new-tokens" in position_problems(gpt2, 8, 2000, generative=True)[0]
    # RoBERTa's positions start after its padding index: 514 entries, 512 usable
    roberta = resolve_model("roberta-base").config
    assert position_problems(roberta, 512) == [] and position_problems(roberta, 513)
    # rotary, ALiBi and relative-bias families have no table to run past
    for name in ("llama-3.2-1b", "bloom-560m", "t5-small", "falcon-7b"):
        assert position_problems(resolve_model(name).config, 100_000) == []


@pytest.mark.parametrize("engine", ["analytic", "trace"])
def test_both_engines_refuse_a_sequence_past_the_positions(engine: str) -> None:
    if engine == "trace":
        pytest.importorskip("transformers")
    with pytest.raises(SpecError, match=r"exceeds bert's 512 learned positions"):
        estimate("bert-base-uncased", WorkloadSpec(seq_len=1024), engine=engine)
    with pytest.raises(SpecError, match=r"seq_len \+ new_tokens - 1 \(1100\)"):
        estimate("gpt2", WorkloadSpec(mode="infer", seq_len=1000, new_tokens=101), engine=engine)


def test_an_omitted_position_table_size_is_the_config_class_default() -> None:
    # RobertaConfig.max_position_embeddings is 512; two rows go to the padding offset
    roberta = {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}
    assert position_problems(roberta, 510) == []
    assert "exceeds roberta's 510 learned positions" in position_problems(roberta, 511)[0]
    gpt2 = {"model_type": "gpt2"}  # GPT2Config.n_positions 1024
    assert "pass --seq 1024" in position_problems(gpt2, 1025)[0]

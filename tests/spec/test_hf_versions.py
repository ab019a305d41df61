"""transformers-version rules of a training step (memfit.spec.hf_versions) and the two workload
fields the published multi-GPU points needed: ``transformers_version`` and ``lora_dropout``."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.spec import WorkloadSpec
from memfit.spec.hf_versions import (
    FP32_LOGITS_UNTIL,
    autocasts_adapters,
    parse,
    peft_note,
    returns_fp32_logits,
    rule_note,
)


@pytest.mark.parametrize(
    ("version", "model_type", "expected"),
    [
        ("4.37", "llama", True),  # Answer.AI's fsdp_qlora (README: !=4.38.*,!=4.39.*)
        ("4.39.0.dev0", "llama", True),  # peft's examples/sft from git main, 2024-03
        ("4.45.2", "mistral", True),
        ("4.46.0", "llama", False),  # the upcast moved into ForCausalLMLoss
        ("5.23.0", "llama", False),
        (None, "llama", False),  # the installed one: traced as it is
        ("4.40", "gpt2", False),  # no rule read for that model type
    ],
)
def test_fp32_logits_before_446_for_the_model_types_read(
    version: str | None, model_type: str, expected: bool
) -> None:
    assert returns_fp32_logits(version, model_type) is expected


def test_versions_parse_to_their_release_numbers() -> None:
    assert parse("4.39.0.dev0") == (4, 39, 0)
    assert parse("4.45") < FP32_LOGITS_UNTIL <= parse("4.46.1")


def test_a_job_naming_an_old_release_says_which_rule_applies_or_that_none_is_known() -> None:
    assert "fp32" in (rule_note("4.40", "llama") or "")
    assert "no version rule known" in (rule_note("4.40", "gpt2") or "")
    assert rule_note(None, "llama") is None and rule_note("4.50", "llama") is None


def test_the_fields_round_trip_through_the_technique_record_and_print_only_when_set() -> None:
    w = WorkloadSpec(lora_rank=8, lora_dropout=0.1, transformers_version="4.39")
    assert WorkloadSpec.of(shape=w.shape, techniques=w.techniques, parallel=w.parallel) == w
    assert w.techniques.lora is not None and w.techniques.lora.dropout == 0.1
    shown = w.normalized()
    assert shown["lora_dropout"] == 0.1 and shown["transformers_version"] == "4.39"
    plain = WorkloadSpec(lora_rank=8).normalized()
    assert "lora_dropout" not in plain and "transformers_version" not in plain


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lora_rank": 8, "lora_dropout": 1.0}, "probability in [0, 1)"),
        ({"lora_rank": 8, "lora_dropout": "0.1"}, "probability"),
        ({"lora_dropout": 0.1}, "needs --lora-rank"),
        ({"transformers_version": "four"}, "must be a version"),
    ],
)
def test_bad_values_are_refused_with_the_rule(kwargs: dict, words: str) -> None:
    with pytest.raises(SpecError, match=words.replace("[", r"\[").replace(")", r"\)")):
        WorkloadSpec(**kwargs)


def test_peft_before_012_leaves_adapters_in_the_base_dtype() -> None:
    """peft ae1ae20b7 (#1706, released in 0.12.0) added ``autocast_adapter_dtype=True``; before,
    ``update_layer`` moved the adapters to the base weight's dtype."""
    assert not autocasts_adapters("0.9.0") and not autocasts_adapters("0.10.0.dev0")
    assert autocasts_adapters("0.12.0") and autocasts_adapters("0.21.2")
    assert autocasts_adapters(None)  # the installed peft
    assert "base layer's dtype" in (peft_note("0.10") or "")
    assert peft_note("0.13") is None
    w = WorkloadSpec(lora_rank=8, peft_version="0.9")
    assert WorkloadSpec.of(techniques=w.techniques, shape=w.shape) == w
    assert w.normalized()["peft_version"] == "0.9"
    with pytest.raises(SpecError, match="must be a version"):
        WorkloadSpec(lora_rank=8, peft_version="latest")

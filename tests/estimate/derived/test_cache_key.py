"""The derived form's cache key leaves out what a trace never reads (the micro-batch count) and
keeps what the form came from (memfit's own source)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.estimate.derived import cache
from memfit.spec import WorkloadSpec

TINY_GRANITE = dict(
    model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=64,
    intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False,
)  # fmt: skip


def _split(mb: int, accum: int) -> WorkloadSpec:
    return WorkloadSpec(
        mode="train", batch_size=mb, seq_len=32, precision="bf16-true", optimizer="adamw",
        grad_accum=accum, zero_grad_set_to_none=accum == 1,
    )  # fmt: skip


def test_the_splits_of_one_stack_share_one_form_key() -> None:
    held = {cache.variant_key(TINY_GRANITE, _split(32 // a, a)) for a in (2, 4, 8, 16)}
    assert len(held) == 1  # every split with accumulation: one form
    # the held gradients (zero_grad_set_to_none=False) are traced: a form of their own
    assert cache.variant_key(TINY_GRANITE, _split(32, 1)) not in held


def test_an_edited_memfit_file_is_a_new_form_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = cache.variant_key(TINY_GRANITE, _split(2, 1))
    monkeypatch.setattr(cache, "source_fingerprint", lambda: "another checkout")
    assert cache.variant_key(TINY_GRANITE, _split(2, 1)) != before
    # the fingerprint reads the files: a touched one changes it
    tree = tmp_path / "src" / "memfit" / "estimate" / "derived"
    tree.mkdir(parents=True)
    (tree / "cache.py").write_text("x = 1\n")
    monkeypatch.undo()
    real = cache.source_fingerprint.__wrapped__
    monkeypatch.setattr(cache, "__file__", str(tree / "cache.py"))
    first = real()
    (tree / "cache.py").write_text("x = 22\n")
    assert real() != first


@pytest.mark.slow
def test_the_trace_gives_the_same_bytes_at_any_micro_batch_count(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from memfit.estimate.trace.engine import trace_hf

    (tmp_path / "config.json").write_text(json.dumps(TINY_GRANITE))
    two, eight = (trace_hf(TINY_GRANITE, _split(2, a), name="g") for a in (2, 8))
    assert two.peak_allocated_bytes == eight.peak_allocated_bytes
    assert two.peak_reserved_bytes == eight.peak_reserved_bytes
    assert two.components == eight.components

"""Shared fixtures: tiny configs of real architectures (fast to trace and to run on CPU)."""

from __future__ import annotations

import pytest

TINY_LLAMA = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
TINY_GPT2 = dict(
    model_type="gpt2",
    architectures=["GPT2LMHeadModel"],
    n_embd=128,
    n_layer=3,
    n_head=4,
    vocab_size=500,
    n_positions=1024,
)
TINY_BERT = dict(
    model_type="bert",
    architectures=["BertForMaskedLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=512,
)
TINY_GEMMA2 = dict(
    model_type="gemma2",
    architectures=["Gemma2ForCausalLM"],
    hidden_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=2048,
    sliding_window=64,
)
TINY_T5 = dict(
    model_type="t5",
    architectures=["T5ForConditionalGeneration"],
    d_model=128,
    d_kv=32,
    d_ff=256,
    num_layers=3,
    num_decoder_layers=3,
    num_heads=4,
    vocab_size=500,
    is_encoder_decoder=True,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
)


@pytest.fixture
def tiny_llama() -> dict:
    return dict(TINY_LLAMA)


@pytest.fixture(autouse=True)
def _derived_forms_in_a_temporary_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived forms (memfit.estimate.derived.cache) go to one temporary directory per session:
    a test never reads forms left by a user's runs, nor writes into ~/.cache."""
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "memfit-cache"))


@pytest.fixture(autouse=True)
def _trace_answers_not_kept_between_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace cache (memfit.estimate.trace_cache) is off in-process: a test that patches the
    trace engine must see its own run, not an answer another test kept (its key cannot see a
    patch). tests/estimate/test_trace_cache.py turns it on again."""
    from memfit.estimate import trace_cache

    monkeypatch.setattr(trace_cache, "cacheable", lambda source: False)


@pytest.fixture(autouse=True)
def _traced_steps_not_kept_between_tests() -> None:
    """The trace engine's step memo (memfit.estimate.trace.step_memo) starts empty in every test:
    a test that patches the trace must see its own run, not a step another test traced."""
    from memfit.estimate.trace import step_memo

    step_memo.clear()


@pytest.fixture
def fake_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many fake training steps ran (``steps.run_train_steps`` calls), as a one-item list."""
    from memfit.estimate.trace import steps

    calls = [0]
    real = steps.run_train_steps

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "run_train_steps", counted)
    return calls

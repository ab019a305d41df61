"""Long-prompt generation as transformers 5.x runs it: ``logits_to_keep``, FlashAttention without
the S² term, chunked prefill (``GenerationConfig.prefill_chunk_size``), on both engines; the trace
checked against real ``generate()`` on CPU, the analytic engine against the trace."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tests.conftest import TINY_LLAMA

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate
from memfit.spec import WorkloadSpec

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _infer(**kw: object) -> WorkloadSpec:
    base: dict[str, object] = {"mode": "infer", "precision": "bf16-true", "new_tokens": 4}
    return WorkloadSpec(**{**base, **kw})  # type: ignore[arg-type]


def _prefill_bytes(est) -> int:
    """The prefill phase's peak without the process-lifetime cuBLAS workspaces."""
    ph = est.phases["prefill"]
    return ph.peak_allocated_bytes - ph.components["temporary"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


def test_prefill_chunk_size_is_validated_and_only_for_inference() -> None:
    with pytest.raises(SpecError, match=r"prefill_chunk_size \(0\) must be a positive integer"):
        WorkloadSpec(mode="infer", prefill_chunk_size=0)
    with pytest.raises(SpecError, match=r"prefill_chunk_size \(64\) only applies to mode 'infer'"):
        WorkloadSpec(mode="train", prefill_chunk_size=64)
    assert "prefill_chunk_size" not in _infer().normalized()
    assert _infer(prefill_chunk_size=64).normalized()["prefill_chunk_size"] == 64


def test_chunked_prefill_of_an_encoder_decoder_is_said_not_modelled() -> None:
    with pytest.raises(NotModelledError, match="decoder-only causal LMs"):
        estimate("t5-small", _infer(prefill_chunk_size=64), engine="analytic")


def test_flash_prefill_grows_linearly_in_the_prompt_not_quadratically() -> None:
    """FlashAttention saves no S x S scores: doubling a long prompt at most doubles the prefill's
    activations (eager's scores grow 4x)."""

    def acts(s: int, attention: str) -> int:
        est = estimate("llama-3.2-1b", _infer(seq_len=s, attention=attention), engine="analytic")
        return est.phases["prefill"].components["activations"]

    assert acts(16384, "sdpa") <= 2 * acts(8192, "sdpa")
    assert acts(8192, "eager") > 3 * acts(4096, "eager")


def test_generate_keeps_only_the_last_positions_logits_in_fp32() -> None:
    """``logits_to_keep=1``: a 128k-vocabulary model's prefill of 16k tokens holds no (S, V) logits
    (that alone would be 16384 x 128256 x 2 B = 3.9 GiB)."""
    est = estimate("llama-3.2-1b", _infer(seq_len=16384), engine="analytic")
    full_logits_bytes = 16384 * 128256 * 2
    assert est.phases["prefill"].components["activations"] < full_logits_bytes


@pytest.mark.slow  # four traces (~5 s each here, plus importing transformers)
@pytest.mark.parametrize(
    ("batch", "seq", "chunk", "attention"),
    [
        (1, 1024, 256, "sdpa"),
        (1, 1024, 256, "eager"),
        (1, 1024, 256, "flash"),
        (1, 1000, 300, "sdpa"),
    ],
)
def test_analytic_chunked_prefill_agrees_with_the_trace(
    tiny_dir: Path, batch: int, seq: int, chunk: int, attention: str
) -> None:
    """Within 1 % of the trace's prefill peak (tiny Llama, GQA: bool mask, repeated K/V heads,
    the memory-efficient kernel for every chunk after the first)."""
    wl = _infer(batch_size=batch, seq_len=seq, prefill_chunk_size=chunk, attention=attention)
    analytic = _prefill_bytes(estimate(str(tiny_dir), wl, engine="analytic"))
    trace = _prefill_bytes(estimate(str(tiny_dir), wl, engine="trace"))
    assert abs(analytic / trace - 1) < 0.01


def test_chunked_prefill_lowers_the_prefill_peak_of_a_long_prompt(tiny_dir: Path) -> None:
    one = estimate(str(tiny_dir), _infer(seq_len=2048), engine="analytic")
    chunked = estimate(
        str(tiny_dir), _infer(seq_len=2048, prefill_chunk_size=256), engine="analytic"
    )
    assert _prefill_bytes(chunked) < _prefill_bytes(one)
    # the cache is the same once the prompt is in
    assert (
        chunked.phases["decode"].components["kv_cache"]
        == one.phases["decode"].components["kv_cache"]
    )


def test_a_chunk_as_long_as_the_prompt_is_one_pass(tiny_dir: Path) -> None:
    one = estimate(str(tiny_dir), _infer(seq_len=512), engine="analytic")
    same = estimate(str(tiny_dir), _infer(seq_len=512, prefill_chunk_size=512), engine="analytic")
    assert same.peak_allocated_bytes == one.peak_allocated_bytes


@pytest.mark.slow  # builds a real model and runs generate() 3 times (~10 s here)
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
@pytest.mark.parametrize("chunk", [None, 512, 300])
def test_traced_prefill_matches_real_generate_on_cpu(chunk: int | None) -> None:
    """memfit's emulation of ``generate()``'s prefill (fake tensors) against transformers' own
    ``generate(max_new_tokens=1, prefill_chunk_size=...)`` executed on real CPU tensors under the
    same tracker (batch 1; batch 2: the test below). Tolerance:
    0.5 % (generate() also holds its attention mask, position ids and logits processors' small
    tensors; measured: 18 KiB of 20 MB)."""
    import torch
    import transformers

    from memfit.estimate.trace import steps
    from memfit.estimate.trace.engine import trace_hf
    from memfit.estimate.trace.tracker import StorageTracker

    cfg = dict(TINY_LLAMA, hidden_size=256, intermediate_size=768, vocab_size=1000)
    cfg["max_position_embeddings"] = 4096
    wl = _infer(seq_len=2048, new_tokens=1, prefill_chunk_size=chunk)
    fake = trace_hf(cfg, wl, name="t", extrapolate=False, emulate_cuda=False)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    ids = torch.randint(1, 1000, (1, 2048))
    tracker = StorageTracker(device_type="cpu")
    with tracker, torch.no_grad():
        steps.label_model_state(tracker, model)
        tracker.label([ids], "activations")
        tracker.set_phase("prefill")
        model.generate(
            ids, max_new_tokens=1, do_sample=False, prefill_chunk_size=chunk, pad_token_id=0
        )
    measured = tracker.peak.total_bytes
    assert abs(_prefill_bytes(fake) / measured - 1) < 0.005


@pytest.mark.slow  # traces and runs generate() on two tiny models (~10 s here)
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_traced_generation_at_batch_2_matches_real_generate_on_cpu(family: str) -> None:
    """generate() passes (B, S) position_ids (from its all-ones attention mask), so the rotary
    cos/sin (Llama) and the learned position embeddings (GPT-2) are batch-sized; memfit's trace
    passes the same. Against real ``generate()`` at batch 2 on CPU, phase by phase. Measured
    (prefill / decode): Llama −0.23 % / −0.97 %, GPT-2 −0.13 % / −0.62 % (with (1, S) positions:
    −1.4 % / −1.2 %, −1.4 % / −0.8 %). The decode residual is generate()'s own bookkeeping —
    its growing (B, S + t) input_ids and (B, vocab) fp32 scores — a few KiB of a 1.6 MB toy."""
    import torch
    import transformers
    from tests.conftest import TINY_GPT2

    from memfit.estimate.trace import steps
    from memfit.estimate.trace.engine import trace_hf
    from memfit.estimate.trace.tracker import StorageTracker

    cfg, model_cls, config_cls = {
        "llama": (TINY_LLAMA, transformers.LlamaForCausalLM, transformers.LlamaConfig),
        "gpt2": (TINY_GPT2, transformers.GPT2LMHeadModel, transformers.GPT2Config),
    }[family]
    wl = _infer(batch_size=2, seq_len=256, new_tokens=4)
    fake = trace_hf(dict(cfg), wl, name="t", extrapolate=False, emulate_cuda=False)
    torch.manual_seed(0)
    hf_cfg = config_cls(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = model_cls(hf_cfg).to(torch.bfloat16).eval()
    ids = torch.randint(1, 500, (2, 256))
    tracker = StorageTracker(device_type="cpu")

    def decode_starts(_m: object, _args: object, kwargs: dict[str, torch.Tensor]) -> None:
        if kwargs["input_ids"].shape[1] == 1:
            tracker.set_phase("decode")

    model.register_forward_pre_hook(decode_starts, with_kwargs=True)
    with tracker, torch.no_grad():
        steps.label_model_state(tracker, model)
        tracker.label([ids], "activations")
        tracker.set_phase("prefill")
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    for phase, tolerance in (("prefill", 0.005), ("decode", 0.011)):
        ph = fake.phases[phase]
        traced = ph.peak_allocated_bytes - ph.components.get("temporary", 0)
        assert abs(traced / tracker.phase_peaks[phase].total_bytes - 1) < tolerance, phase

"""``fit --solve batch --seq-dist``: the largest batch whose reserved memory after a
variable-length run fits, bounded by the fixed-shape answer at the longest length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main

#: A Llama-shaped model whose reserved memory is dominated by length-sized tensors (a 32k
#: vocabulary's fp32 logits), so that cached blocks of new sizes pile up over a run.
WIDE_VOCAB = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def _fit(model: str, *extra: str) -> list[str]:
    return [
        "fit",
        model,
        "--solve",
        "batch",
        "--precision",
        "bf16-true",
        "--lora-rank",
        "4",
        *extra,
    ]


def test_seq_dist_needs_solve_batch(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", "gpt2", "--solve", "seq", "--gpu", "L4", "--seq-dist", "100,10,512"])
    assert rc == 2
    assert "only --solve batch is solved over a run" in capsys.readouterr().err


def test_seq_dist_fit_refuses_inference(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", "gpt2", "--solve", "batch", "--mode", "infer", "--gpu", "L4",
               "--seq-dist", "100,10,512"])  # fmt: skip
    assert rc == 2
    assert "--seq-dist models training runs" in capsys.readouterr().err


@pytest.mark.slow  # two replays of a run, each tracing the step at four lengths (~2 min here)
def test_the_run_allows_a_smaller_batch_than_the_fixed_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On 1380 MiB the fixed shape at 512 tokens fits batch 2, but the run of sampled lengths
    reserves more than the limit at batch 2 (new sizes leave cached blocks), so the answer is 1;
    and the replay at the answer is within the limit (what "fits" means here)."""
    (tmp_path / "config.json").write_text(json.dumps(WIDE_VOCAB))
    argv = _fit(str(tmp_path), "--gpu-memory", "1380MiB", "--seq-dist", "150,100,512")
    rc = main([*argv, "--run-steps", "30", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["fixed_shape_max_batch"] == 2 and out["max_batch"] == 1
    run = out["seq_dist"]["run"]
    assert run["reserved_bytes"] + out["overhead_bytes"] <= out["limit_bytes"]
    assert out["seq_dist"]["growth"] > 0

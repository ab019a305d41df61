"""Unsloth's training kernels (``--kernels unsloth``, analytic/unsloth.py): per-tensor rules
checked against hand computations from the shapes, and the CLI's answer for an Unsloth job."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.errors import SpecError
from memfit.estimate.analytic.blocks import Work
from memfit.estimate.analytic.engine import _block
from memfit.estimate.analytic.graph import ACTS
from memfit.estimate.analytic.registry import program_for, read_arch
from memfit.estimate.trace.refusals import refusal
from memfit.spec import WorkloadSpec

BATCH, SEQ, RANK = 2, 128, 4
TOKENS = BATCH * SEQ


def _layer_saved_bytes(config: dict, kernels: str) -> int:
    """The activation bytes one training layer keeps for backward (its forward's net change,
    no checkpointing), bf16, LoRA on every linear layer."""
    wl = WorkloadSpec(
        batch_size=BATCH,
        seq_len=SEQ,
        precision="bf16-true",
        lora_rank=RANK,
        loss="fused",
        kernels=kernels,
    )
    prog = program_for(read_arch(config), "causal-lm", lora_rank=RANK)
    w = Work(batch=BATCH, q_len=SEQ, kv_len=SEQ, impl="sdpa", task="causal-lm", train=True)
    return _block(prog, "layer", wl, w, in_rg=True).fwd_end[ACTS]


def test_unsloth_lora_mlp_keeps_e_and_g_per_layer() -> None:
    """``LoRA_MLP`` saves ``e = X @ G`` and ``g = X @ U`` (T x I each, bf16) and nothing else
    that grows with I: widening the MLP by dI adds exactly 2 x T x dI x 2 bytes to what a layer
    keeps. transformers + peft keep at least gate, act(gate), up and their product (4 x)."""
    narrow, wide = dict(TINY["llama"]), dict(TINY["llama"])
    d_ffn = 256
    wide["intermediate_size"] = narrow["intermediate_size"] + d_ffn
    grows = {
        k: _layer_saved_bytes(wide, k) - _layer_saved_bytes(narrow, k) for k in ("hf", "unsloth")
    }
    assert grows["unsloth"] == 2 * TOKENS * d_ffn * 2
    assert grows["hf"] >= 4 * TOKENS * d_ffn * 2


def test_unsloth_attention_keeps_no_norm_copies_or_rotary_products() -> None:
    """Per layer, the fast RMSNorms keep their input and one fp32 scalar per row (not an fp32
    copy of the hidden states), RoPE runs in place and LoRA_QKV / LoRA_W keep only their
    inputs: widening the hidden state by dH (heads fixed: q / kv widths unchanged) adds, in
    bf16, the first norm's output (LoRA_QKV's saved input), the residual sum (the second norm's
    saved input), the second norm's output (LoRA_MLP's saved input) and the layer's output —
    4 x T x dH x 2 bytes (the layer's own input, saved by the first norm, is the caller's)."""
    base = dict(TINY["llama"])
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    wider = dict(base, hidden_size=base["hidden_size"] + 64, head_dim=head_dim)
    d_h = 64
    grows = _layer_saved_bytes(wider, "unsloth") - _layer_saved_bytes(base, "unsloth")
    assert grows == 4 * TOKENS * d_h * 2


def _cli(*extra: str) -> dict:
    from memfit.cli.entry import main

    out = io.StringIO()
    argv = ["estimate", "llama-3.1-8b", "--batch", "1", "--seq", "16384", "--lora-rank", "16"]
    argv += ["--quant", "nf4-dq", "--precision", "bf16-true", "--gpu", "L4", "--json", *extra]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    return dict(json.loads(out.getvalue()))


def test_cli_unsloth_job_reads_lower_and_names_the_defaults_it_applied() -> None:
    """``--kernels unsloth`` alone: Unsloth's offloaded checkpointing and fused CE are applied
    (and said), and the activations fall below the same job on transformers' kernels with
    those two set by hand (the fused kernels keep less); an explicit --checkpointing wins."""
    unsloth = _cli("--kernels", "unsloth")
    hf = _cli("--checkpointing", "offload", "--loss", "fused")
    assert unsloth["workload"]["checkpointing"] == "offload"
    assert unsloth["workload"]["loss"] == "fused"
    said = [n for n in unsloth["notes"] if n.startswith("kernels unsloth")]
    assert said and "--checkpointing offload, --loss fused" in said[0]
    assert "fused LoRA qkv, o, mlp" in said[0]
    assert unsloth["components"]["activations"] < 0.7 * hf["components"]["activations"]
    assert unsloth["peak_reserved_bytes"] < hf["peak_reserved_bytes"]
    full = _cli("--kernels", "unsloth", "--checkpointing", "full")
    assert full["workload"]["checkpointing"] == "full"
    assert "--checkpointing offload" not in " ".join(full["notes"])


def test_unsloth_kernels_are_refused_for_inference_and_by_the_trace() -> None:
    with pytest.raises(SpecError, match=r"kernels \('unsloth'\) models Unsloth's training"):
        WorkloadSpec(mode="infer", kernels="unsloth")
    with pytest.raises(SpecError, match=r"kernels \('triton'\) must be one of hf, unsloth"):
        WorkloadSpec(kernels="triton")
    refused = refusal(WorkloadSpec(lora_rank=8, kernels="unsloth"))
    assert refused is not None and "Unsloth's fused kernels" in str(refused)


def test_a_family_unsloth_runs_otherwise_is_estimated_as_hf_and_says_so() -> None:
    """Gemma 2 has its own Unsloth layer forward (soft-capped attention): not modelled, the
    estimate is transformers' and the note says it reads high."""
    gemma = dict(TINY["gemma2"])
    assert _layer_saved_bytes(gemma, "unsloth") == _layer_saved_bytes(gemma, "hf")


def test_llamafactory_use_unsloth_reads_as_unsloths_kernels_and_defaults(tmp_path) -> None:
    """LLaMA-Factory's ``use_unsloth: true`` on a LoRA job: ``get_unsloth_peft_model`` passes
    ``use_gradient_checkpointing="unsloth"`` whatever the file says, and the patched model runs
    Unsloth's kernels and fused CE."""
    from pathlib import Path

    from memfit.cli.check import route
    from memfit.jobfiles.files import read_job
    from memfit.jobfiles.job import workload_of

    example = Path(__file__).resolve().parents[2] / "jobfiles" / "examples"
    text = (example / "llamafactory-qwen3-lora-sft-otfq.yaml").read_text()
    path = tmp_path / "unsloth.yaml"
    path.write_text(text + "use_unsloth: true\ndisable_gradient_checkpointing: true\n")
    job = read_job([path])
    w = workload_of(job, overrides={"seq_len": 1024})
    assert (w.kernels, w.checkpointing, w.loss) == ("unsloth", "offload", "fused")
    assert "Unsloth's kernels" in route(job, None)[1]
    path.write_text(text)
    w = workload_of(read_job([path]), overrides={"seq_len": 1024})
    assert (w.kernels, w.loss) == ("hf", "full")

"""The LM head's loss without full logits (``--loss chunked / fused``) and checkpoints kept in
host RAM (``--checkpointing offload``) in the analytic engine (analytic/loss.py,
analytic/host_checkpoint.py)."""

from __future__ import annotations

import pytest

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate
from memfit.estimate.analytic.graph import ACTS, N_COMP
from memfit.estimate.analytic.host_checkpoint import checkpoints_on_host
from memfit.estimate.analytic.loss import liger_chunk_rows
from memfit.estimate.analytic.step import BlockProfile
from memfit.spec import LOSSES, WorkloadSpec

#: Llama-3.1-8B (bundled): vocabulary, hidden size, layers
VOCAB, HIDDEN, LAYERS = 128256, 4096, 32
BATCH, SEQ = 2, 2048
TOKENS = BATCH * SEQ


def _peak(**kw) -> int:
    """The highest of the forward and backward peaks (the optimizer step holds no logits)."""
    wl = WorkloadSpec(batch_size=BATCH, seq_len=SEQ, precision="bf16-true", **kw)
    phases = estimate("llama-3.1-8b", wl, engine="analytic").phases
    return max(phases[p].peak_allocated_bytes for p in ("forward", "backward"))


def test_liger_chunk_size_is_its_documented_example() -> None:
    """fused_linear_cross_entropy.py's own comment: BT = 4096*4, V = 32000, H = 4096 gives
    inc_factor 8 and chunk_size 2048; a chunk is never longer than the tokens."""
    assert liger_chunk_rows(4096 * 4, 32000, 4096) == 2048
    assert liger_chunk_rows(7, 32000, 4096) == 1
    assert liger_chunk_rows(100, 32000, 32000) == 100


def test_the_fused_loss_drops_the_full_logits_and_their_fp32_copies() -> None:
    """A LoRA job (frozen LM head; its peak is at the head): the full loss keeps the bf16
    logits, their fp32 copy, the fp32 log-probabilities and their fp32 gradient (about 7 bytes
    per token per vocabulary entry) that the fused loss never makes; the chunked loss saves
    only the fp32 log-probabilities of its chunks."""
    full, chunked, fused = (_peak(loss=x, checkpointing="full", lora_rank=8) for x in LOSSES)
    logits_bf16 = TOKENS * VOCAB * 2
    assert full - fused >= 4 * logits_bf16
    assert full - chunked >= 2 * logits_bf16
    assert fused < chunked


def test_host_checkpoints_leave_two_hidden_states_on_the_gpu() -> None:
    """Full checkpointing keeps one hidden state per layer on the GPU until backward; Unsloth's
    offloaded checkpointing keeps them in host RAM and two GPU buffers of one, kept for the
    run: at the end of the forward at least L - 3 hidden states less, and in the optimizer step
    (no checkpoint alive in either) exactly the two buffers more."""
    hidden_state = TOKENS * HIDDEN * 2

    def phases(ckpt: str) -> dict[str, int]:
        wl = WorkloadSpec(
            batch_size=BATCH,
            seq_len=SEQ,
            precision="bf16-true",
            checkpointing=ckpt,
            loss="fused",
            lora_rank=8,
        )
        est = estimate("llama-3.1-8b", wl, engine="analytic")
        return {name: p.peak_allocated_bytes for name, p in est.phases.items()}

    full, offload = phases("full"), phases("offload")
    assert full["forward"] - offload["forward"] >= (LAYERS - 3) * hidden_state
    assert offload["optimizer"] - full["optimizer"] == 2 * hidden_state


def test_checkpoints_on_host_moves_the_checkpoint_out_of_the_forward_net() -> None:
    prof = BlockProfile(fwd=[], fwd_end=_vec(100), bwd=[], bwd_end=_vec(-100))
    prof.checkpoint_bytes = 40
    moved = checkpoints_on_host(prof)
    assert moved.fwd_end[ACTS] == 60 and moved.bwd_end[ACTS] == -60


def test_the_reentrant_recomputation_holds_the_layer_output_through_its_backward() -> None:
    """UnslothCheckpointFunction reruns the whole layer and keeps its output while
    torch.autograd.backward runs: every backward point of the layer is one hidden state (the
    checkpoint's size) higher than torch's non-reentrant recomputation's."""
    prof = BlockProfile(fwd=[], fwd_end=_vec(100), bwd=[_vec(10), _vec(-5)], bwd_end=_vec(-100))
    prof.checkpoint_bytes = 40
    moved = checkpoints_on_host(prof)
    assert [p[ACTS] for p in moved.bwd] == [50, 35]


def _vec(acts: int):
    v = [0] * N_COMP
    v[ACTS] = acts
    return tuple(v)


def test_a_loss_other_than_full_needs_training() -> None:
    with pytest.raises(SpecError, match=r"loss 'fused' is the training loss .* --mode train"):
        WorkloadSpec(mode="infer", loss="fused")
    with pytest.raises(SpecError, match=r"loss \('sparse'\) must be one of full, chunked, fused"):
        WorkloadSpec(loss="sparse")


def test_the_trace_engine_refuses_what_only_the_analytic_engine_models() -> None:
    pytest.importorskip("transformers")
    wl = WorkloadSpec(batch_size=1, seq_len=64, loss="fused")
    with pytest.raises(NotModelledError, match="modelled by the analytic engine"):
        estimate("qwen2.5-0.5b", wl, engine="trace")

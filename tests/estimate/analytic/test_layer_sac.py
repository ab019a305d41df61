"""torchtitan's per-layer selective checkpointing (``--checkpointing selective-layer``,
``--selective-ac-option N``): every N-th block checkpointed whole, the others not at all
(``_apply_layer_sac`` in ``torchtitan/distributed/activation_checkpoint.py`` at 114151ad4^). The
analytic engine against the trace engine on tiny configs (the trace engine turns checkpointing
off on the blocks torchtitan leaves plain), and the policy's edges."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY
from tests.estimate.analytic.test_vs_trace import assert_matches_trace

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate
from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec
from memfit.spec.rules import layer_sac_checkpointed


def test_torchtitans_counter_picks_every_nth_block_from_one():
    assert layer_sac_checkpointed(5, 2) == (False, True, False, True, False)
    assert layer_sac_checkpointed(3, 3) == (False, False, True)
    assert layer_sac_checkpointed(3, 1) == (True, True, True)
    assert layer_sac_checkpointed(3, 0) == (True, True, True)  # "not ac_freq": every block


#: Four tiny Llama blocks at 4 x 256 tokens: the backward peak is the saved activations' (no,
#: full and per-layer checkpointing trace 65.0 / 39.1 / 51.1 MB: apart far beyond the tolerance)
FOUR_LAYERS = dict(TINY["llama"], num_hidden_layers=4)
BATCH = {"batch_size": 4, "seq_len": 256}


@pytest.mark.parametrize("every", [2, 3])
def test_the_analytic_engine_matches_the_trace(every, trace_hf):
    overrides = {**BATCH, "checkpointing": "selective-layer", "selective_ac_option": every}
    traced, _ = assert_matches_trace(FOUR_LAYERS, overrides, trace_hf, "llama")
    # the trace turned checkpointing off on the plain blocks: neither policy's peak
    for policy in ("none", "full"):
        other = trace_hf(FOUR_LAYERS, WorkloadSpec(**BATCH, checkpointing=policy), name="llama")
        assert abs(traced.peak_allocated_bytes / other.peak_allocated_bytes - 1) > 0.05, policy


def _activations(config: dict, **kw) -> int:
    wl = WorkloadSpec(batch_size=8, seq_len=256, **kw)
    return estimate_analytic(config, wl).components["activations"]


def test_it_lies_between_no_and_full_checkpointing_and_is_full_at_one():
    cfg = TINY["mid-llama"]
    none, full = _activations(cfg), _activations(cfg, checkpointing="full")
    two = _activations(cfg, checkpointing="selective-layer")
    assert full < two < none
    for every in (0, 1):
        assert _activations(cfg, checkpointing="selective-layer", selective_ac_option=every) == full


def test_the_option_needs_the_policy_and_the_derived_engine_leaves_it_to_the_trace():
    with pytest.raises(SpecError, match="selective_ac_option"):
        WorkloadSpec(checkpointing="full", selective_ac_option=3)
    wl = WorkloadSpec(checkpointing="selective-layer", compile=True, precision="bf16-true")
    with pytest.raises(NotModelledError, match="selective-layer"):
        estimate("llama-3.2-1b", wl, engine="analytic")


#: Five blocks, the first two frozen (with the embeddings) or LoRA on all: transformers'
#: ``enable_input_require_grads`` under checkpointing makes the embedding output require grad, so
#: a plain frozen block keeps its activations (the analytic engine was -9 % before it counted it)
FIVE_LAYERS = dict(TINY["llama"], num_hidden_layers=5)


@pytest.mark.parametrize(
    ("every", "extra"),
    [(2, {"freeze_layers": 2}), (5, {"freeze_layers": 2}), (2, {"lora_rank": 4})],
)
def test_frozen_blocks_and_lora_match_the_trace(every, extra, trace_hf):
    overrides = {**BATCH, "checkpointing": "selective-layer", "selective_ac_option": every}
    assert_matches_trace(FIVE_LAYERS, {**overrides, **extra}, trace_hf, "llama")

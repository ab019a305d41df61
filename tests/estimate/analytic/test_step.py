"""How the analytic engine replays a block: activation checkpointing's recomputation
(``Graph.recomputation``, ``run_block``) and gradients autograd hands on without a copy."""

from __future__ import annotations

import pytest

from memfit.estimate.analytic.graph import ACTS, TEMP, Graph
from memfit.estimate.analytic.ops import Ops
from memfit.estimate.analytic.step import BlockProfile, run_block

HIDDEN = 64
TOKENS = 32
#: one (tokens, hidden) bf16 hidden state
HIDDEN_BYTES = TOKENS * HIDDEN * 2


def _layer(o: Ops):
    """A pre-norm residual block: x + up(act(norm(x))), whose output the caller keeps."""
    x = o.g.input(TOKENS * HIDDEN, o.pdtype, rg=True)
    h = o.linear(o.rms_norm(x, HIDDEN), HIDDEN, 2 * HIDDEN, name="up")
    h = o.linear(o.act(h, "silu"), 2 * HIDDEN, HIDDEN, name="down")
    out = o.add(x, h)
    o.g.hold(out)
    return x, [out]


@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_a_checkpointed_layer_leaves_only_its_gradients_behind(checkpointing) -> None:
    """torch.utils.checkpoint (non-reentrant) keeps the layer's input until the layer's backward
    is done and nothing its recomputation made: over forward and backward the layer adds what it
    adds without checkpointing — its output (the next layer's input) kept, its input freed, the
    weights' gradients made. (A recomputed output that stayed held left one hidden state behind
    per layer.)"""

    def step_net(p: BlockProfile) -> list[int]:
        return [f + b for f, b in zip(p.fwd_end, p.bwd_end, strict=True)]

    plain = run_block(_layer, precision="bf16-true", train=True)
    ckpt = run_block(_layer, precision="bf16-true", train=True, checkpointing=checkpointing)
    assert step_net(ckpt) == step_net(plain)
    if checkpointing == "full":  # the forward kept only the input (and the output)
        assert ckpt.fwd_end[ACTS] == HIDDEN_BYTES
        assert ckpt.bwd_end[ACTS] == -HIDDEN_BYTES


def test_the_recomputation_stops_at_the_last_tensor_the_forward_saved() -> None:
    """Early stop: a node packs its saved inputs before its kernel runs, so the recomputation
    raises before ``down`` (which saves only its input and weight) makes its output, and the
    residual add after it never runs; the locals it made then go, the input stays."""
    g = Graph(grad_enabled=True)
    o = Ops(g, precision="bf16-true", train=True)
    x, _ = _layer(o)
    g.recomputation([x])
    _, end = g.forward()
    saved = {id(t): t for n in g.nodes for t in n.saves if not t.leaf and t is not x}
    assert end[ACTS] == sum(t.n_bytes for t in saved.values())
    assert not g.nodes[-1].outputs[0].alive  # the residual add: not recomputed


def test_add_backward_hands_its_gradient_on_without_a_copy() -> None:
    """AddBackward0 passes the incoming gradient to both inputs as it is; the second gradient
    ``x`` gets (through ``y``) is summed into a new tensor, as InputBuffer does for a shared
    one."""
    g = Graph(grad_enabled=True)
    x = g.input(TOKENS * HIDDEN, "bf16", rg=True)
    (y,) = g.op([x], [(x.numel, x.dtype)])
    (out,) = g.op([x, y], [(x.numel, x.dtype)], passthrough=True)
    g.forward()
    points = g.backward([out])
    assert points[0][TEMP] == 0  # the add: nothing allocated
    assert points[1][TEMP] == HIDDEN_BYTES  # y's backward: x's second gradient


def test_a_checkpointed_layer_under_autocast_leaves_its_weight_casts_to_the_caller() -> None:
    """Autocast caches the half casts of the weights that require grad until it exits (the end
    of the forward). Without checkpointing the matmuls save them anyway; a checkpointed layer's
    forward saves nothing, so the cache alone keeps them: the layer holds them and reports their
    bytes for the model's last block to free."""
    ckpt = run_block(_layer, precision="bf16-mixed", train=True, checkpointing="full")
    weights = 2 * (HIDDEN * 2 * HIDDEN) * 2  # up and down, in bf16
    assert ckpt.cast_bytes == weights
    assert ckpt.fwd_end[ACTS] == TOKENS * HIDDEN * 4 + weights  # the fp32 output, the casts
    assert run_block(_layer, precision="bf16-mixed", train=True).cast_bytes == 0

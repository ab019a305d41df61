"""The LM head's cross-entropy when it does not materialise the whole logits (``--loss``).

``blocks.lm_head_and_loss`` models transformers' ``ForCausalLMLoss``: the (B, S, V) logits, their
fp32 copy and the fp32 log-probabilities the backward keeps. Frameworks that train on small GPUs
replace it (``WorkloadSpec.loss``, ``rules.LOSSES``):

``chunked``: torchtune ``LinearCrossEntropyLoss`` (pytorch/torchtune@bd2a0fc7c314
    ``torchtune/modules/loss/cross_entropy_loss.py``; ``CEWithChunkedOutputLoss`` likewise): the
    hidden states are split into ``num_output_chunks`` (default 8) chunks; for each,
    ``logits = output(hidden_chunk)``, ``F.cross_entropy(logits.float(), ...)``. Every chunk's
    saved tensors live until backward: modelled as eager autograd runs it, the fp32
    log-probabilities of each chunk (``LogSoftmaxBackward`` saves its output), so the whole
    (tokens, V) fp32 log-probabilities are kept but never the 16-bit logits or their fp32 copy
    at once beside them. torchtune compiles ``compute_cross_entropy`` (``apply_compile_strategy``);
    what the compiled graph saves may be less (its 16-bit logits) — not modelled, so this reads
    high rather than low.
``fused``: Liger-Kernel ``LigerFusedLinearCrossEntropyFunction`` (linkedin/Liger-Kernel@ead96b61
    ``src/liger_kernel/ops/fused_linear_cross_entropy.py``, ``fused_linear_cross_entropy_forward``)
    and Unsloth's ``UnslothFusedLoss`` (unslothai/unsloth-zoo@ce232d6c
    ``unsloth_zoo/fused_losses/cross_entropy_loss.py``, called from unslothai/unsloth@015bdef0
    ``unsloth/models/llama.py`` whenever ``labels`` are given): the loss *and its gradients* are
    computed in the forward, one chunk of tokens at a time; ``save_for_backward`` keeps only
    ``grad_input`` (the hidden states' shape) and ``grad_weight`` (the LM head's, when it trains).
    The transient is one chunk's logits: Liger's ``chunk_size = next_power_of_2(ceil(BT /
    ceil(V / H)))`` rows of V in the input dtype (about the hidden states' size). Unsloth sizes its
    chunk from the free memory at the call (``_get_chunk_multiplier``: half the free memory, at
    most 4 GiB of fp32 logits): it takes what is free, so the need is modelled with Liger's
    chunk.
"""

from __future__ import annotations

from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.analytic.ops import Ops

#: torchtune ``LinearCrossEntropyLoss(num_output_chunks=8)`` / ``CEWithChunkedOutputLoss``'s default
TORCHTUNE_OUTPUT_CHUNKS = 8


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of Liger's logits chunk: ``next_power_of_2(cdiv(BT, cdiv(V, H)))``, at most BT."""
    inc_factor = -(-vocab // hidden)
    rows = -(-tokens // inc_factor)
    return min(tokens, 1 << max(rows - 1, 0).bit_length())


def chunked_loss(o: Ops, x: Tensor, tokens: int, a: Arch, *, bias: bool) -> list[Tensor]:
    """torchtune's chunked linear cross-entropy (module docstring): per chunk the LM head, an
    fp32 copy and the log-softmax whose fp32 output backward keeps; the chunk's logits and copy
    go when the chunk's loss is computed. Returns the loss."""
    n_chunks = min(TORCHTUNE_OUTPUT_CHUNKS, tokens)
    rows = -(-tokens // n_chunks)
    w = o.weight(
        a.vocab, a.hidden, trainable=o.lm_head_trainable, saved="head" in o.saved_modules
    )  # the model's ``output``
    b = (
        o.weight(a.vocab, trainable=o.lm_head_trainable, saved="head" in o.saved_modules)
        if bias
        else None
    )
    wi = o.autocast_weight(w)
    extra = [o.autocast_weight(b)] if b is not None else []
    losses: list[Tensor] = []
    for i in range(n_chunks):
        part = min(rows, tokens - i * rows)
        if part <= 0:
            break
        (xc,) = o.g.op([x], [(part * a.hidden, x.dtype)], view_of=x)  # hidden.chunk(...)[i]
        xi = o.autocast_input(xc)
        (logits,) = o.g.op(
            [xi, wi, *extra],
            [(part * a.vocab, xi.dtype)],
            saves=[xi if wi.rg else None, wi if xi.rg else None],  # type: ignore[list-item]
            matmul=True,
        )
        _hold_tied_grad(o, a)
        lf = o.cast(logits, "f32")
        (logp,) = o.g.op([lf], [(lf.numel, "f32")])
        o.save_outputs(logp)
        (loss,) = o.g.op([logp], [(1, "f32")])
        losses.append(loss)
    total = losses[0]
    for t in losses[1:]:
        (total,) = o.g.op([total, t], [(1, "f32")])
    o.g.hold(total)
    return [total]


def fused_loss(o: Ops, x: Tensor, tokens: int, a: Arch, *, bias: bool) -> list[Tensor]:
    """Liger's / Unsloth's fused linear cross-entropy (module docstring): one autograd node
    whose forward allocates ``grad_input`` (saved), the LM head's gradient buffer and one
    chunk's logits; backward scales the saved gradients. The gradient buffer is a forward
    workspace here: the graph's backward allocates the LM head's gradient itself (one copy,
    not two). Returns the loss."""
    w = o.weight(a.vocab, a.hidden, trainable=o.lm_head_trainable, saved="head" in o.saved_modules)
    b = (
        o.weight(a.vocab, trainable=o.lm_head_trainable, saved="head" in o.saved_modules)
        if bias
        else None
    )
    xi, wi = o.autocast_input(x), o.autocast_weight(w)
    inputs = [xi, wi] + ([o.autocast_weight(b)] if b is not None else [])
    chunk_bytes = liger_chunk_rows(tokens, a.vocab, a.hidden) * a.vocab * DTYPE_BYTES[xi.dtype]
    grad_w_bytes = wi.numel * DTYPE_BYTES[wi.dtype] if wi.rg else 0
    loss, grad_input = o.g.op(
        inputs,
        [(1, "f32"), (xi.numel, xi.dtype)],
        fwd_workspace=chunk_bytes + grad_w_bytes,
        matmul=True,
    )
    _hold_tied_grad(o, a)
    o.save_outputs(grad_input)
    o.g.hold(loss)
    return [loss]


def _hold_tied_grad(o: Ops, a: Arch) -> None:
    """A tied LM head: its gradient waits in the AccumulateGrad input buffer for the embedding's
    (as ``blocks.lm_head_and_loss``); the last node's second input is the weight."""
    if a.tie and o.existing_grads:
        o.g.nodes[-1].inputs[1].hold_grad = True


def head_loss(
    o: Ops, x: Tensor, tokens: int, a: Arch, *, kind: str, bias: bool = False
) -> list[Tensor]:
    """The LM head and a ``chunked`` or ``fused`` training loss over ``x`` (the final norm's
    output): the loss (what backward starts from)."""
    if kind == "chunked":
        out = chunked_loss(o, x, tokens, a, bias=bias)
    else:
        out = fused_loss(o, x, tokens, a, bias=bias)
    o.g.touch(x)
    return out


__all__ = ["TORCHTUNE_OUTPUT_CHUNKS", "chunked_loss", "fused_loss", "head_loss", "liger_chunk_rows"]

"""Activation checkpointing whose checkpoints live in host RAM (``--checkpointing offload``).

Unsloth's ``use_gradient_checkpointing="unsloth"`` (unslothai/unsloth@015bdef0
``unsloth/models/_utils.py``: ``patch_unsloth_smart_gradient_checkpointing`` for
``max_seq_length`` >= 512) runs each decoder layer as full activation checkpointing does, but
copies the layer's input — the checkpoint — to a pinned host buffer (``non_blocking``) instead of
keeping it on the GPU; backward copies it back into one of two GPU buffers the size of one
hidden state (double buffering: the next layer's copy overlaps this layer's recomputation) and
recomputes the layer (unslothai/unsloth-zoo@ce232d6c ``unsloth_zoo/gradient_checkpointing.py``,
``UnslothCheckpointFunction`` and ``Unsloth_Offloaded_Gradient_Checkpointer``).

``UnslothCheckpointFunction`` is a reentrant checkpoint: its backward reruns the whole layer
(``outputs = ctx.run_function(*detached_inputs)``) and then calls
``torch.autograd.backward(outputs_with_grad, args_with_grad)``, so the recomputed layer's output
(the size of its input, a hidden state) is alive through the layer's whole backward, where
torch's non-reentrant checkpoint stops the recomputation at the last saved tensor.

So against ``full`` checkpointing, per repeated layer of input ``c`` bytes:

    forward   the layer's net change loses ``c`` (its input leaves for host RAM);
    backward  the input is in a GPU buffer already counted, so the layer no longer frees ``c``;
              the recomputed output, ``c``, is alive at every point of the layer's backward;
    static    the two GPU buffers, ``2 c``, from the first backward on (they are kept).

The host holds ``c`` per layer (``host_checkpoint_bytes``); the step moves each checkpoint over
PCIe twice (``plan/cost.py``).
"""

from __future__ import annotations

from dataclasses import replace

from memfit.estimate.analytic.graph import ACTS, one, vadd, vscale
from memfit.estimate.analytic.step import BlockProfile

#: checkpointing modes and the recomputation the analytic engine runs for each block
OFFLOADED = "offload"
#: GPU buffers the checkpoints come back through (unsloth-zoo: ``GPU_BUFFERS`` + ``GPU_BUFFERS_B``)
N_DEVICE_BUFFERS = 2


def recompute_mode(checkpointing: str) -> str:
    """The block-level recomputation of a checkpointing mode: ``offload`` recomputes as ``full``."""
    return "full" if checkpointing == OFFLOADED else checkpointing


def checkpoints_on_host(prof: BlockProfile) -> BlockProfile:
    """A fully checkpointed block's profile with its checkpoint in host RAM (module docstring)."""
    c = one(ACTS, prof.checkpoint_bytes)
    return replace(
        prof,
        fwd_end=vadd(prof.fwd_end, vscale(c, -1)),
        bwd=[vadd(p, c) for p in prof.bwd],  # the reentrant recomputation's output
        bwd_end=vadd(prof.bwd_end, c),
    )


def device_buffer_bytes(checkpoint_bytes: int) -> int:
    """The GPU buffers the offloaded checkpoints return through (static from the first backward)."""
    return N_DEVICE_BUFFERS * checkpoint_bytes


__all__ = [
    "N_DEVICE_BUFFERS",
    "OFFLOADED",
    "checkpoints_on_host",
    "device_buffer_bytes",
    "recompute_mode",
]

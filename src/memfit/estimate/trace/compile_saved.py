"""What ``torch.compile`` saves for backward in one transformer block, measured on real tensors.

Eager autograd keeps every tensor each op's backward asks for (``SavedVariable``). Under
``torch.compile`` the block's forward and backward are one joint graph that AOTAutograd splits
with :func:`torch._functorch.partitioners.min_cut_rematerialization_partition` (Inductor's
partitioner, called with ``compiler="inductor"``): it picks the cheapest set of tensors to keep
(a min cut) and recomputes cheap pointwise ops (RMSNorm's fp32 copy, SiLU, RoPE) in backward.
Inductor then fuses kernels, which changes transient peaks, not what the forward keeps.

:func:`measure_block` runs one HF ``LlamaDecoderLayer`` (built from a small config at the real
proportions, bf16, SDPA) three ways and counts, in each, the bytes of the distinct storages the
autograd graph keeps after the forward (parameters excluded, the block input included when kept):

* eager: the tensors packed by :func:`torch.autograd.graph.saved_tensors_hooks`;
* compile: the outputs of the partitioned forward graph past the block's own output
  (``num_fwd_outputs``), by storage, as the fw graph runs (a backend that records them and runs
  the graph uncompiled: the partition is the one Inductor gets);
* selective-op (torchtitan's per-op SAC, ``checkpoint_wrapper`` then ``compile``, the order of
  torchtitan's ``apply_ac`` / ``apply_compile``): eager keeps the block input plus the outputs
  the policy stores (the checkpoint's cache once the forward is done);
  under compile the partitioner must save what the policy tags ``MUST_SAVE``.

The ratios compile / eager are what ``memfit.estimate.analytic.compile`` applies. This module
imports torch and transformers; ``benchmarks/compile_saved.py`` runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class BlockShape:
    """A decoder layer's proportions: ``head_dim`` is hidden / heads."""

    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    batch: int = 2
    seq: int = 256
    model_type: str = "llama"
    dtype: str = "bfloat16"


@dataclass(frozen=True)
class SavedBytes:
    """Bytes one block keeps for backward, per checkpointing policy and mode."""

    shape: BlockShape
    #: checkpointing policy (memfit's names: none, selective, selective-op) -> bytes
    eager_bytes: dict[str, int]
    compile_bytes: dict[str, int]

    def ratio(self, policy: str) -> float:
        """compile / eager saved bytes under ``policy``."""
        return self.compile_bytes[policy] / self.eager_bytes[policy]


#: torchtitan's per-op SAC save list (``_save_list``, torchtitan/distributed/
#: activation_checkpoint.py at b5bcd76) with the CPU flash kernel the CUDA one stands for here.
_SAC_SAVE = (
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
)


def _sac_context(every_other: bool) -> Any:
    """torchtitan's ``selective_ac_option="op"`` policy (``every_other``): save the attention
    kernels' outputs and every other ``aten.mm`` (the 1st, 3rd, ...), recompute the rest; else
    memfit's ``selective``: every ``aten.mm`` and attention output saved."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    meta = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[mode] += 1
            if every_other and meta[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if func in _SAC_SAVE:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _build(shape: BlockShape) -> tuple[Callable[[torch.Tensor], torch.Tensor], set[int]]:
    import importlib

    from transformers import AutoConfig

    modeling = importlib.import_module(
        f"transformers.models.{shape.model_type}.modeling_{shape.model_type}"
    )
    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    name = prefix[shape.model_type]
    cfg = AutoConfig.for_model(
        shape.model_type,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_kv_heads,
        num_hidden_layers=1,
        head_dim=shape.hidden // shape.n_heads,
        vocab_size=128,
    )
    cfg._attn_implementation = "sdpa"
    dtype = getattr(torch, shape.dtype)
    torch.manual_seed(0)
    layer = getattr(modeling, f"{name}DecoderLayer")(cfg, 0).to(dtype)
    pos = torch.arange(shape.seq)[None].expand(shape.batch, shape.seq)
    probe = torch.zeros(1, dtype=dtype)
    cos, sin = getattr(modeling, f"{name}RotaryEmbedding")(cfg)(probe, pos)
    rope = (cos.to(dtype), sin.to(dtype))
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    params |= {t.untyped_storage().data_ptr() for t in rope}  # shared by every layer

    def block(x: torch.Tensor) -> torch.Tensor:
        out = layer(x, attention_mask=None, position_embeddings=rope, position_ids=pos)
        return out[0] if isinstance(out, tuple) else out

    return block, params


def _input(shape: BlockShape) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    dtype = getattr(torch, shape.dtype)
    x = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g, dtype=dtype)
    return x.requires_grad_()


def _eager_saved(block: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, skip: set[int]):
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    out.sum().backward()
    return sum(saved.values())


def _sac_eager_saved(
    block: Callable[[torch.Tensor], torch.Tensor], shape: BlockShape, every_other: bool
) -> int:
    """Eager selective-op: the input the checkpoint keeps + the outputs in its cache once the
    forward is done (``_CachingTorchDispatchMode.storage``: what the policy answered
    ``MUST_SAVE`` for), by distinct storage."""
    from torch.utils.checkpoint import checkpoint

    modes: list[Any] = []

    def context() -> Any:
        fwd, rec = _sac_context(every_other)
        modes.append(fwd)
        return fwd, rec

    x = _input(shape)
    out = checkpoint(block, x, use_reentrant=False, context_fn=context)
    cached: dict[int, int] = {}
    for per_op in modes[0].storage.values():
        for value in per_op.values():
            for t in tree_flatten(value)[0]:
                t = getattr(t, "val", None)
                if isinstance(t, torch.Tensor):
                    cached[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    out.sum().backward()
    return sum(cached.values()) + x.untyped_storage().nbytes()


def _compiled_saved(
    block: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, skip: set[int]
) -> int:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    seen: dict[str, int] = {}
    saved: dict[int, int] = {}

    def partition(joint: Any, inputs: Any, **kwargs: Any) -> Any:
        seen["n_out"] = kwargs["num_fwd_outputs"]
        return min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kwargs)

    def fw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        def run(args: list[Any]) -> Any:
            outs = gm(*args)
            for t in outs[seen["n_out"] :]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in skip:
                    saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return outs

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def bw_compiler(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=partition)
    torch._dynamo.reset()
    out = torch.compile(block, backend=backend, fullgraph=True)(x)
    out.sum().backward()
    return sum(saved.values())


#: memfit's selective checkpointing policies: whether the policy saves every other mm.
SAC_EVERY_OTHER = {"selective": False, "selective-op": True}


def measure_block(shape: BlockShape) -> SavedBytes:
    """Saved-for-backward bytes of one decoder layer of ``shape``: eager vs compiled, without
    checkpointing and under each selective policy (see the module docstring)."""
    from torch.utils.checkpoint import checkpoint

    block, params = _build(shape)
    eager = {"none": _eager_saved(block, _input(shape), params)}
    compiled = {"none": _compiled_saved(block, _input(shape), params)}
    for policy, every_other in SAC_EVERY_OTHER.items():
        eager[policy] = _sac_eager_saved(block, shape, every_other)

        def sac_block(x: torch.Tensor, every_other: bool = every_other) -> torch.Tensor:
            context = functools.partial(_sac_context, every_other)
            return checkpoint(block, x, use_reentrant=False, context_fn=context)

        compiled[policy] = _compiled_saved(sac_block, _input(shape), params)
    return SavedBytes(shape=shape, eager_bytes=eager, compile_bytes=compiled)


__all__ = ["BlockShape", "SavedBytes", "measure_block"]

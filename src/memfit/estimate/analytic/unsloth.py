"""Unsloth's training kernels (``--kernels unsloth``): what each keeps for backward, per tensor.

``FastLanguageModel`` replaces the decoder layer's forward of the Llama-like families it patches
with its own (unslothai/unsloth@015bdef0d94a ``unsloth/models/llama.py``
``LlamaDecoderLayer_fast_forward`` / ``LlamaAttention_fast_forward``; ``mistral.py``,
``qwen2.py``, ``qwen3.py`` reuse them) and, in ``get_peft_model``, for LoRA with
``lora_dropout == 0`` and ``bias == "none"`` on layers without a base bias, the module forwards
with its own autograd functions (``unsloth/kernels/fast_lora.py``). Per layer, with ``T`` tokens,
hidden ``H``, intermediate ``I``, q / kv widths ``Q`` / ``KV`` and the activations' dtype:

``fast_rms_layernorm`` (``kernels/rms_layernorm.py`` ``Fast_RMS_Layernorm``)
    a new output (T x H) and ``r`` (T fp32); saves its input ``X`` and ``r`` (not the fp32 copies
    transformers' Python RMSNorm keeps); backward writes ``dX`` into the incoming gradient
    (``dX = dY``; Gemma's variant allocates it) and gives the weight no gradient.
``LoRA_QKV`` (q, k and v all adapted)
    outputs Q, K, V; saves only ``X`` (and the adapters); the forward's dequantized weight is
    one global buffer (``fast_dequantize(..., use_global_buffer=True)``), the ``X @ A`` products
    are T x r; backward writes ``dX`` into the saved ``X`` (``torch.matmul(..., out=X)``) and
    dequantizes each base weight once more, one at a time.
``fast_rope_embedding`` (``kernels/rope_embedding.py`` ``Fast_RoPE_Embedding``)
    in place on Q and K (the ``transpose(1, 2).contiguous()`` of the projections' view is the
    projection itself); saves nothing (cos / sin sit on ``ctx``); backward in place too.
``LoRA_W`` (o_proj)
    saves ``X`` (the attention output); backward allocates ``dX`` (T x Q), plus the weight.
``LoRA_MLP`` (gate, up and down all adapted; SwiGLU)
    saves ``X``, ``e = X @ G`` and ``g = X @ U`` (T x I each; not ``h = silu(e) * g``, freed
    when the forward returns); backward allocates ``DW = dY @ W^T`` (T x I), computes ``h``,
    ``df``, ``de`` in place in ``DW``, ``e``, ``g`` and writes ``dX`` into the saved ``X``.

Against transformers + peft (``ops.Ops.lora_default`` / ``quant_ops.lora_on_quantized``) this
drops the MLP's ``act(gate)`` and ``act * up`` and its input gradients' copies, the norms' fp32
copies, rotary's products, and the fp32 copy of each adapter's input peft makes without
autocast. The attention core (``attend``) is memfit's kernel for ``--attention``: Unsloth runs
flash-attn, xformers or SDPA, each saving its output and log-sum-exp like memfit's flash /
efficient kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.analytic.quant_ops import quantized_weight, quantizes

if TYPE_CHECKING:
    from memfit.estimate.analytic.ops import Ops

#: ``model_type`` s whose layers Unsloth runs through ``LlamaDecoderLayer_fast_forward`` /
#: ``LlamaAttention_fast_forward`` (``unsloth/models/{llama,mistral,qwen2,qwen3}.py`` at
#: 015bdef0) and memfit's analytic engine declares as pre-norm RMSNorm + SwiGLU layers.
#: Gemma / Gemma 2 (their own layer forwards, soft-capped attention) and the others are
#: estimated with transformers' modules, and the note says so.
UNSLOTH_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SOURCE = "unslothai/unsloth@015bdef0d94a unsloth/kernels/fast_lora.py"
#: Unsloth's fused CE (unslothai/unsloth-zoo@ce232d6c ``unsloth_zoo/fused_losses/
#: cross_entropy_loss.py`` ``_get_chunk_multiplier`` / ``get_chunk_size``) sizes its chunk of
#: fp32 logits to half the GPU's free memory at its first call, at most 4 GiB: it takes what is
#: free, so memfit counts the need (``loss.fused_loss``: a Liger-sized chunk), and says so.
CE_CHUNK = (
    "Unsloth's fused CE sizes its fp32-logits chunk to half the free memory (at most 4 GiB): "
    "counted here at the chunk it needs, so on a roomy GPU max_memory_reserved() can read "
    "higher by up to that chunk"
)


def kernels_applied(
    model_type: str,
    *,
    lora: tuple[int, Any] | None,
    lora_dropout: float,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
) -> tuple[dict[str, bool], list[str]]:
    """Which of Unsloth's kernels run a training layer of ``model_type`` with LoRA ``lora``
    ((rank, targets) or None): ``norm``, ``rope``, ``qkv``, ``o``, ``mlp`` to True/False
    (``get_peft_model``'s patch conditions, module docstring), and why a fused one does not."""
    on = model_type in UNSLOTH_MODEL_TYPES
    out = {"norm": on, "rope": on, "qkv": False, "o": False, "mlp": False}
    why: list[str] = []
    if not on or lora is None:
        return out, why
    if lora_dropout:
        why.append(f"lora_dropout {lora_dropout:g} (Unsloth fuses LoRA only without dropout)")
        return out, why
    for key, names, bias in (
        ("qkv", ("q_proj", "k_proj", "v_proj"), qkv_bias),
        ("o", ("o_proj",), o_bias),
        ("mlp", ("gate_proj", "up_proj", "down_proj"), mlp_bias),
    ):
        adapted = all(_targets(lora[1], n) for n in names)
        out[key] = adapted and not bias
        if adapted and bias:
            why.append(f"{'/'.join(names)} have a bias (Unsloth's fused {key} needs none)")
    return out, why


def _targets(targets: Any, name: str) -> bool:
    return targets == "all-linear" or name in tuple(targets)


def note(
    model_type: str,
    applied: dict[str, bool],
    why: list[str],
    defaults_applied: tuple[tuple[str, str], ...],
    *,
    loss: str = "full",
) -> str:
    """The line that says which Unsloth kernels and defaults the estimate applied."""
    defaults = ", ".join(f"--{k} {v}" for k, v in defaults_applied)
    said = f"; Unsloth's defaults applied: {defaults}" if defaults else ""
    if loss == "fused":
        said += f"; {CE_CHUNK}"
    if not applied["norm"]:
        return (
            f"kernels unsloth: model_type {model_type!r} is not one memfit runs through "
            f"Unsloth's Llama-style layer (it models {', '.join(UNSLOTH_MODEL_TYPES)}): its "
            "layers are estimated with transformers' modules and peft's LoRA layers, which "
            f"keep more (reads high){said}"
        )
    fused = [k for k in ("qkv", "o", "mlp") if applied[k]]
    lora = f"fused LoRA {', '.join(fused)} ({SOURCE})" if fused else "no fused LoRA kernel"
    extra = f"; not fused: {'; '.join(why)}" if why else ""
    return f"kernels unsloth: fast RMSNorm, in-place RoPE, {lora}{extra}{said}"


# ---------------------------------------------------------------------- the ops
def fast_rms_norm(o: Ops, x: Tensor, dim: int, *, gemma: bool) -> Tensor:
    """``Fast_RMS_Layernorm`` (module docstring)."""
    w = o.weight(dim)
    rows = x.numel // dim
    y, r = o.g.op(
        [x, w],
        [(x.numel, x.dtype), (rows, "f32")],
        saves=[x],
        grad_to=[x],
        passthrough=not gemma,
    )
    o.save_outputs(r)
    return y


def rope_in_place(o: Ops, x: Tensor) -> Tensor:
    """``Fast_RoPE_Embedding``: the rotated tensor is ``x``'s storage; nothing saved."""
    (out,) = o.g.op([x], [(x.numel, x.dtype)], view_of=x, passthrough=True)
    return out


def _base(o: Ops, name: str, n_in: int, n_out: int) -> tuple[Tensor, int]:
    """A frozen base weight (quantized as ``--quant`` stores it) and the bytes of its
    dequantized copy (0: a 16-bit weight is used as it is)."""
    if quantizes(o.quant, name, in_repeated_block=o.in_repeated_block):
        w = quantized_weight(o, n_in, n_out, bias=False)
        return w, n_in * n_out * DTYPE_BYTES[o.cdtype]
    return o.weight(n_out, n_in, trainable=False), 0


def _fused(
    o: Ops,
    x: Tensor,
    layers: list[tuple[str, int, int]],
    outs: list[int],
    *,
    saved_extra: tuple[int, ...] = (),
    fwd_temp: int = 0,
    bwd_temp: int = 0,
    dx_into_x: bool,
) -> list[Tensor]:
    """One of Unsloth's LoRA autograd functions on ``x``: ``layers`` (name, n_in, n_out), its
    outputs' sizes ``outs`` (elements, ``x``'s dtype) and the extra tensors it saves
    (``saved_extra``, elements); ``fwd_temp`` / ``bwd_temp`` bytes besides each dequantized
    weight (forward: the global buffer, the largest; backward: one more copy, one at a time)."""
    assert o.lora is not None
    r = o.lora[0]
    params: list[Tensor] = []
    dq = 0
    for name, n_in, n_out in layers:
        w, n_dq = _base(o, name, n_in, n_out)
        params += [w, *o.lora_adapters(n_in, n_out)]
        dq = max(dq, n_dq)
    rows = x.numel // layers[0][1]
    small = 2 * rows * r * DTYPE_BYTES[x.dtype]  # X @ A / dY @ B^T, T x r
    made = o.g.op(
        [x, *params],
        [(n, x.dtype) for n in (*outs, *saved_extra)],
        fwd_workspace=dq + fwd_temp + small,
        bwd_workspace=2 * dq + bwd_temp + small,
        grad_to=[x, *(p for p in params if p.rg)],
        matmul=True,
    )
    node = o.g.nodes[-1]
    if node.rg:
        node.saves = [x, *made[len(outs) :]]
        node.grad_into = x if dx_into_x else None
    return made[: len(outs)]


def lora_qkv(
    o: Ops, x: Tensor, h: int, q_dim: int, kv_dim: int, names: tuple[str, ...]
) -> tuple[Tensor, Tensor, Tensor]:
    """``LoRA_QKV`` (module docstring): Q, K, V."""
    rows = x.numel // h
    layers = [(names[0], h, q_dim), (names[1], h, kv_dim), (names[2], h, kv_dim)]
    q, k, v = _fused(o, x, layers, [rows * q_dim, rows * kv_dim, rows * kv_dim], dx_into_x=True)
    return q, k, v


def lora_o(o: Ops, x: Tensor, q_dim: int, h: int, name: str) -> Tensor:
    """``LoRA_W`` on o_proj (module docstring); backward allocates ``dX``."""
    rows = x.numel // q_dim
    (out,) = _fused(o, x, [(name, q_dim, h)], [rows * h], dx_into_x=False)
    return out


def lora_mlp(o: Ops, x: Tensor, h: int, f: int, names: tuple[str, ...]) -> Tensor:
    """``LoRA_MLP`` (module docstring): saves ``e`` and ``g``; ``h`` is a forward temporary,
    ``DW`` a backward one."""
    rows = x.numel // h
    inter = rows * f * DTYPE_BYTES[x.dtype]
    layers = [(names[0], h, f), (names[1], h, f), (names[2], f, h)]
    (out,) = _fused(
        o,
        x,
        layers,
        [rows * h],
        saved_extra=(rows * f, rows * f),
        fwd_temp=inter,
        bwd_temp=inter,
        dx_into_x=True,
    )
    return out


__all__ = [
    "SOURCE",
    "UNSLOTH_MODEL_TYPES",
    "fast_rms_norm",
    "kernels_applied",
    "lora_mlp",
    "lora_o",
    "lora_qkv",
    "note",
    "rope_in_place",
]

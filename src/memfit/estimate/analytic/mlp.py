"""MLP blocks of the analytic layer programs (the block vocabulary's MLP kinds, ``blocks.py``).

* ``gated``: ``down(act(gate(x)) * up(x))`` — Llama's SwiGLU, Gemma 2's GeGLU (tanh GELU).
* ``gated-fused``: Phi-3's ``gate_up_proj`` chunked into gate and up, ``down(up * act(gate))``.
* ``fc``: ``fc2(act(fc1(x)))`` with the config's activation (GPT-2, GPT-NeoX, OPT, Phi).
* ``moe``: Mixtral's sparse block (a router and E SwiGLU experts stored as 3-D parameters);
  Qwen3-MoE's (``Qwen3MoeSparseMoeBlock``) is the same block with ``moe_intermediate_size``
  experts, top-k renormalised only when ``norm_topk_prob`` and the routing weights cast back to
  the logits' dtype (``moe_routing="qwen3"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.ops import Ops
from memfit.estimate.analytic.quant_experts_ops import quantized_experts_linear, stored_experts
from memfit.estimate.quant_experts import ExpertsShape, quantizes_experts

#: ``activation_function`` / ``hidden_act`` spellings → the op (``ops.Ops.act``) that runs.
ACT_KIND = {
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
MLP_KINDS = ("gated", "gated-fused", "fc", "moe")
#: How a ``moe`` block turns the router's top-k into expert weights: ``mixtral``
#: (``MixtralTopKRouter``: always renormalised, kept in fp32) or ``qwen3``
#: (``Qwen3MoeTopKRouter``: renormalised when the config's ``norm_topk_prob``, then
#: ``.to(router_logits.dtype)``).
MOE_ROUTINGS = ("mixtral", "qwen3")
#: Linear layers each kind names (for LoRA targets and quantization), in forward order.
N_NAMES = {"gated": 3, "gated-fused": 2, "fc": 2, "moe": 1}


@dataclass(frozen=True, kw_only=True)
class Mlp:
    """An MLP block. ``act``: the ``Ops.act`` kind it always runs, or None for the config's
    (``ACT_KIND[Arch.act]``, ``default_act`` for a spelling not in the table); ``bias``: None
    for the config's (``Arch.mlp_bias``)."""

    kind: str = "gated"
    names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    act: str | None = "silu"
    default_act: str = "gelu"
    bias: bool | None = None
    conv1d: bool = False  # GPT-2's Conv1D layers
    moe_routing: str = "mixtral"

    def __post_init__(self) -> None:
        if self.kind not in MLP_KINDS:
            raise SpecError(f"Mlp: kind ({self.kind!r}) must be one of {', '.join(MLP_KINDS)}")
        if self.moe_routing not in MOE_ROUTINGS:
            raise SpecError(
                f"Mlp: moe_routing ({self.moe_routing!r}) must be one of {', '.join(MOE_ROUTINGS)}"
            )
        if len(self.names) != N_NAMES[self.kind]:
            raise SpecError(
                f"Mlp: names ({self.names!r}) must name {N_NAMES[self.kind]} Linear layer(s) "
                f"for kind {self.kind!r}"
            )

    def act_of(self, a: Arch) -> str:
        return self.act or ACT_KIND.get(a.act, self.default_act)


def mlp_block(o: Ops, x: Tensor, a: Arch, spec: Mlp) -> Tensor:
    """``spec``'s MLP on ``x`` (its input, the norm output the caller keeps)."""
    if spec.kind == "moe":
        return sparse_moe(o, x, a, spec.names[0], routing=spec.moe_routing)
    bias = a.mlp_bias if spec.bias is None else spec.bias
    h, f, act = a.hidden, a.ffn, spec.act_of(a)
    if spec.kind == "gated":
        gate = o.linear(x, h, f, bias=bias, name=spec.names[0])
        g = o.act(gate, act)
        up = o.linear(x, h, f, bias=bias, name=spec.names[1])
        return o.linear(o.mul(g, up), f, h, bias=bias, name=spec.names[2])
    if spec.kind == "gated-fused":
        fused = o.linear(x, h, 2 * f, bias=bias, name=spec.names[0])
        gate, up = o.split(fused, [f, f])
        out = o.linear(o.mul(up, o.act(gate, act)), f, h, bias=bias, name=spec.names[1])
        o.g.touch(gate)  # a view of the fused output, a local until the MLP returns
        return out
    m = o.linear(x, h, f, bias=bias, conv1d=spec.conv1d, name=spec.names[0])
    m = o.act(m, act)
    return o.linear(m, f, h, bias=bias, conv1d=spec.conv1d, name=spec.names[1])


def sparse_moe(
    o: Ops, x: Tensor, a: Arch, router: str = "gate", *, routing: str = "mixtral"
) -> Tensor:
    """``MixtralSparseMoeBlock``: a router (``gate``: h → E, fp32 softmax, top-k, renormalised)
    and E SwiGLU experts stored as 3-D parameters. Expert ``e`` runs on the tokens routed to it
    (``hidden_states[token_idx]``) and its output, scaled by the routing weight (fp32), is
    ``index_add_``-ed into a zero tensor. Summed over experts the saved tensors cover
    ``top_k × tokens`` rows whatever the routing; memfit's trace (fake tensors, no routing values)
    runs them as one expert call on all ``top_k × tokens`` rows, and so does this block.
    ``routing`` (``MOE_ROUTINGS``): how the top-k values become the weights."""
    e, k, h, f = a.n_experts, a.top_k, a.hidden, a.expert_ffn or a.ffn
    tokens = x.numel // h
    logits = o.linear(x, h, e, name=router)
    probs = o.g.op([o.cast(logits, "f32")], [(tokens * e, "f32")])[0]  # softmax(.float())
    o.save_outputs(probs)
    vals, idx = o.g.op([probs], [(tokens * k, "f32"), (tokens * k, "i64")])
    o.save_outputs(idx)
    weights = vals
    if routing == "mixtral" or a.extra.get("norm_topk_prob", False):
        denom = o.g.op([vals], [(tokens, "f32")])[0]
        weights = o.g.op([vals, denom], [(tokens * k, "f32")], saves=[vals, denom])[0]
    if routing == "qwen3":
        weights = o.cast(weights, logits.dtype)  # .to(router_logits.dtype)
    if not o.train and not (quantizes_experts(o.quant) and o.quant_experts):
        res = grouped_experts(o, x, weights, idx, a)
        o.g.touch(logits)  # ``_, weights, index = self.gate(...)``: a local until the block returns
        return res
    out = o.new(tokens * h, x.dtype)  # zeros_like(hidden_states)
    mask = o.new(tokens * k * (e + 1), "i64")  # one_hot(top_k_index, E + 1)
    rows = k * tokens
    cur = o.g.op([x], [(rows * h, x.dtype)])[0]  # hidden_states[token_idx]
    if quantizes_experts(o.quant) and o.quant_experts:  # the checkpoint stores them quantized
        shape = ExpertsShape(n_experts=e, hidden=h, intermediate=f)
        stored_experts(o, shape)
        gu = quantized_experts_linear(o, cur, shape, "up")
        g_, up = o.split(gu, [f, f])
        act = o.mul(o.act(g_, "silu"), up)
        y = quantized_experts_linear(o, act, shape, "down")
    else:
        gate_up = o.weight(e, 2 * f, h)
        down = o.weight(e, h, f)
        w_gu = o.g.op([gate_up], [(2 * f * h, gate_up.dtype)], view_of=gate_up)[0]
        w_dn = o.g.op([down], [(h * f, down.dtype)], view_of=down)[0]
        gu = _expert_linear(o, cur, w_gu, h, 2 * f)
        g_, up = o.split(gu, [f, f])
        act = o.mul(o.act(g_, "silu"), up)
        y = _expert_linear(o, act, w_dn, f, h)
    wsel = o.g.op([weights], [(rows, weights.dtype)])[0]  # top_k_weights[token_idx, pos, None]
    y = o.cast(o.mul(y, wsel), x.dtype)
    (res,) = o.g.op([out, y], [(tokens * h, x.dtype)])  # index_add_ (in place)
    o.g.touch(mask, cur)
    return res


def grouped_experts(o: Ops, x: Tensor, weights: Tensor, idx: Tensor, a: Arch) -> Tensor:
    """An inference pass's experts as transformers 5.23 runs them by default
    (``integrations/moe.py``, ``grouped_mm_experts_forward``; ``experts_implementation``
    "grouped_mm", what memfit's trace runs): the ``S = top_k x tokens`` (token, expert) pairs
    sorted by expert, the hidden states gathered into that order, one grouped matmul per
    projection, the routing weights applied (the product in the promoted dtype: fp32 for
    Mixtral's fp32 weights), the rows put back in token order and summed over the top-k. Every
    tensor it makes is a local until it returns, so at the reordering four S x hidden tensors
    are alive (the gathered input, the down projection, the weighted rows and their reordered
    copy): qwen3-30b-a3b cut to 2 layers at 20 x 512 tokens allocates 4 % more than the
    per-expert loop the training pass keeps (docs/accuracy.md, "Inference on the default
    engine"; training's grid rows were measured with that loop and stay so)."""
    e, k, h, f = a.n_experts, a.top_k, a.hidden, a.expert_ffn or a.ffn
    tokens = x.numel // h
    rows = k * tokens
    ids_sorted, perm = o.g.op([idx], [(rows, "i64"), (rows, "i64")])  # torch.sort(expert_ids)
    (div,) = o.g.op([perm], [(rows, "i64")])  # perm // num_top_k: a temporary
    (sel,) = o.g.op([x, div], [(rows * h, x.dtype)])  # hidden_states[perm // num_top_k]
    (w_g,) = o.g.op([weights, perm], [(rows, weights.dtype)])  # sample_weights[perm]
    (hist_in,) = o.g.op([ids_sorted], [(rows, "i32")])  # expert_ids_g.int() (CUDA)
    (counts,) = o.g.op([hist_in], [(e, "i32")])  # torch.histc
    (offsets,) = o.g.op([counts], [(e, "i32")])  # cumsum
    gate_up, down = o.weight(e, 2 * f, h), o.weight(e, h, f)
    (gu,) = o.g.op([sel, gate_up, offsets], [(rows * 2 * f, x.dtype)], matmul=True, mm=True)
    g_, up = o.split(gu, [f, f])
    act = o.mul(o.act(g_, "silu"), up)  # _apply_gate: act_fn(gate) * up
    (y,) = o.g.op([act, down, offsets], [(rows * h, x.dtype)], matmul=True, mm=True)
    weighted = o.mul(y, w_g)  # proj_out * sample_weights_g.unsqueeze(-1)
    (inv,) = o.g.op([perm], [(rows, "i64")])  # inv_perm[perm] = arange(S)
    (ordered,) = o.g.op([weighted, inv], [(rows * h, weighted.dtype)])  # weighted_out[inv_perm]
    (summed,) = o.g.op([ordered], [(tokens * h, weighted.dtype)])  # .view(T, k, h).sum(dim=1)
    res = o.cast(summed, x.dtype)
    o.g.touch(ids_sorted, perm, sel, w_g, hist_in, counts, offsets, y, inv, ordered)
    return res


def _expert_linear(o: Ops, x: Tensor, w: Tensor, n_in: int, n_out: int) -> Tensor:
    """``F.linear(x, W[e])`` with a selected expert weight (a view of the 3-D parameter)."""
    xi, wi = o.autocast_input(x), o.autocast_weight(w)
    (out,) = o.g.op(
        [xi, wi],
        [(x.numel // n_in * n_out, xi.dtype)],
        saves=[xi if wi.rg else None, wi if xi.rg else None],  # type: ignore[list-item]
        matmul=True,
        mm=True,
    )
    return out


__all__ = [
    "ACT_KIND",
    "MLP_KINDS",
    "MOE_ROUTINGS",
    "Mlp",
    "grouped_experts",
    "mlp_block",
    "sparse_moe",
]

"""gpt-oss (``model_type`` ``gpt_oss``): eager attention with sinks over alternating sliding /
full layers, and routed experts with biases (bf16, or MXFP4 from the checkpoint's
``quantization_config``), inference only (issue 32: ``memfit estimate gpt-oss-20b --mode
infer`` on the analytic engine).

Each block follows ``transformers/models/gpt_oss/modeling_gpt_oss.py`` of transformers 5.23.0
(the installed version memfit's trace runs; ``fastpath.VALIDATED_WITH``):

* ``GptOssPreTrainedModel._supports_sdpa = False``: ``--attention sdpa`` runs
  ``eager_attention_forward`` (memfit's trace builds it so: ``trace/build.py``). The model
  builds two additive masks, ``create_causal_mask`` and ``create_sliding_window_causal_mask``
  ((B, 1, S, S) each in the hidden dtype), held through the forward.
* ``eager_attention_forward`` with sinks: ``repeat_kv`` copies of K and V, the (B, H, S, S_kv)
  scores (``matmul``, ``* scaling``, ``+ mask``), ``cat`` with the per-head sink logit (S_kv +
  1 columns), minus its row max, ``softmax`` in that dtype; the sink column sliced off is the
  returned ``attn_weights``, which the decoder layer's ``_`` keeps until the MLP returns.
* ``_apply_rotary_emb``: ``chunk`` halves, four half-width products, ``cat``; the cos/sin
  tables are half the head wide (``emb = freqs``), in the hidden dtype.
* ``GptOssRMSNorm``: ``(weight * x_fp32).to(dtype)`` (memfit's ``rms-olmo`` norm).
* ``GptOssTopKRouter``: ``F.linear`` with bias (its logits the MLP's ``_`` until it returns),
  ``topk``, ``softmax`` over the k values. ``GptOssExperts`` (``is_transposed``,
  ``has_bias``) as transformers' default ``grouped_mm`` runs them (``integrations/moe.py``,
  ``grouped_mm_experts_forward``: the per-row biases gathered, ``_apply_gate``'s clamped
  SwiGLU); MXFP4 experts as memfit's trace stands in for ``Mxfp4GptOssExperts``'s triton path
  (``trace/quantized_experts.py``, ``_mxfp4_forward``; stored tensors padded on Hopper).
* Sliding layers: ``DynamicSlidingWindowLayer`` keeps a view of the whole prefill ``cat`` (a
  prefill's cache is as long as a full layer's, as Gemma 3's); every layer is run as a full
  one, so a decode past the window is over-counted by the sliding layers' older tokens.

Training is not modelled (the trace answers).
"""

from __future__ import annotations

from typing import Any

from memfit.errors import NotModelledError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import softmax
from memfit.estimate.analytic.blocks import Shared, Work, cache_kv, eager_mask, keep_local
from memfit.estimate.analytic.decoder import DecoderFamily, DecoderProgram
from memfit.estimate.analytic.engine import simulate_infer
from memfit.estimate.analytic.graph import Tensor
from memfit.estimate.analytic.mlp import Mlp
from memfit.estimate.analytic.ops import Ops
from memfit.estimate.analytic.quant_experts_ops import stored_experts
from memfit.estimate.cuda_reduce import current_device
from memfit.estimate.quant_experts import MXFP4_ROUTING_INT32_PER_ROW, ExpertsShape


class GptOssProgram(DecoderProgram):
    """``GptOssForCausalLM`` for inference (module docstring)."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a, family)
        self.shape = ExpertsShape(
            n_experts=max(a.n_experts, 1),
            hidden=a.hidden,
            intermediate=a.expert_ffn or a.ffn,
            has_gate=True,
            has_bias=True,
        )

    def buffer_bytes(self, precision: str) -> int:
        """``inv_freq`` and ``original_inv_freq`` (fp32, head_dim / 2 each)."""
        return 2 * 4 * (self.a.head_dim // 2)

    def simulate(self, wl: Any, task: str) -> Any:
        """Inference as every chain decoder (``engine.simulate_infer``); training is refused."""
        if wl.is_train:
            raise NotModelledError(
                "training model_type 'gpt_oss' is not modelled by the analytic engine; the "
                "trace engine models it",
                engine="analytic",
            )
        if wl.attention == "flash":
            raise NotModelledError(
                "gpt_oss with --attention flash (sinks in the flash kernel) is not modelled by "
                "the analytic engine; the trace engine models it",
                engine="analytic",
            )
        return simulate_infer(self, wl, task)

    # ------------------------------------------------------------------ embed
    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        a = self.a
        x = o.embedding(w.tokens, a.vocab, a.hidden)
        keep_local(o, w, x)
        o.g.hold(x)
        shared = Shared()
        if w.q_len > 1:  # the full and the sliding-window float masks
            shared.mask = eager_mask(o, w, x.dtype)
            o.g.hold(eager_mask(o, w, x.dtype))
        half = w.positions * (a.head_dim // 2)  # cos / sin: (B, S, D / 2)
        shared.cos, shared.sin = o.new(half, x.dtype), o.new(half, x.dtype)
        o.g.hold(shared.cos, shared.sin)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        half = w.positions * (self.a.head_dim // 2)
        sh = Shared(cos=o.g.external(half, x_dtype), sin=o.g.external(half, x_dtype))
        if w.q_len > 1:
            sh.mask = o.g.external(w.batch * w.q_len * w.kv_len, x_dtype)
        return sh

    # ------------------------------------------------------------------ layer
    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        """``GptOssDecoderLayer``: pre-norm; the attention's weights (``_``) live until the
        MLP's ``hidden_states, _ = self.mlp(...)`` rebinds it."""
        hn = self.norm(o, x)
        y, probs = self.attention(o, hn, w, sh)
        o.g.touch(hn)
        x = o.add(x, y)
        hn = self.norm(o, x)
        y = self.moe(o, hn)
        o.g.touch(hn, probs)
        return o.add(x, y)

    def rotary(self, o: Ops, t: Tensor, sh: Shared) -> Tensor:
        """``_apply_rotary_emb``: the two halves' products, then ``cat``."""
        assert sh.cos is not None and sh.sin is not None
        first, second = o.split(t, [1, 1])
        halves = []
        for _ in range(2):
            p1, p2 = o.mul(first, sh.cos), o.mul(second, sh.sin)
            halves.append(o.add(p1, p2))
            o.g.touch(p1, p2)
        (out,) = o.g.op(halves, [(t.numel, t.dtype)])
        o.g.touch(*halves)
        return out

    def attention(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> tuple[Tensor, Tensor]:
        """``GptOssAttention.forward`` with ``eager_attention_forward`` (module docstring):
        the output projection, and the attention weights the layer keeps."""
        a = self.a
        h, heads, kv_heads, d = a.hidden, a.n_heads, a.n_kv, a.head_dim
        bias = bool(a.extra.get("attention_bias", True))
        q = o.linear(x, h, heads * d, bias=bias, name="q_proj")
        k = o.linear(x, h, kv_heads * d, bias=bias, name="k_proj")
        v = o.linear(x, h, kv_heads * d, bias=bias, name="v_proj")
        q_r, k_r = self.rotary(o, q, sh), self.rotary(o, k, sh)
        o.g.touch(q, k)
        k_c, v_c = cache_kv(o, w, k_r, v)
        if w.use_cache:  # ``key_states, value_states = past_key_values.update(...)`` rebinds
            o.g.touch(k_r, v)
        n_rep = heads // kv_heads
        b, s, kvl = w.batch, w.q_len, w.kv_len
        # ``repeat_kv``: a copy with every query head, but with one K/V head (multi-query) the
        # reshape of the expanded tensor is a view and each ``matmul`` copies its broadcast
        # operand for its ``bmm`` only (as ``attention._eager``)
        mqa = n_rep > 1 and kv_heads == 1
        k_rep, v_rep = k_c, v_c
        if n_rep > 1 and not mqa:
            k_rep = o.g.op([k_c], [(k_c.numel * n_rep, k_c.dtype)])[0]
            v_rep = o.g.op([v_c], [(v_c.numel * n_rep, v_c.dtype)])[0]
        n_scores = b * heads * s * kvl
        k_mm = o.g.op([k_c], [(k_c.numel * n_rep, k_c.dtype)])[0] if mqa else k_rep
        att = o.unary(o.matmul(q_r, k_mm, n_scores))  # matmul(q, k^T) * scaling
        if sh.mask is not None:
            att = o.add(att, sh.mask)
        sinks = o.weight(heads)
        (comb,) = o.g.op([att, sinks], [(b * heads * s * (kvl + 1), att.dtype)])  # cat
        (mx, _idx) = o.g.op([comb], [(b * heads * s, comb.dtype), (b * heads * s, "i64")])
        o.g.touch(_idx)
        (comb2,) = o.g.op([comb, mx], [(comb.numel, comb.dtype)])  # - max
        o.g.touch(comb, mx)
        probs = softmax(o, comb2)
        o.g.touch(att)  # ``attn_weights`` rebound to the sliced probabilities
        v_mm = o.g.op([v_c], [(v_c.numel * n_rep, v_c.dtype)])[0] if mqa else v_rep
        out = o.matmul(probs, v_mm, b * heads * s * d)
        out = o.unary(out)  # transpose(1, 2).contiguous()
        o.g.touch(k_rep, v_rep, comb2)
        y = o.linear(out, heads * d, h, bias=bias, name="o_proj")
        o.release_locals(q_r, k_c, v_c)
        return y, probs

    def moe(self, o: Ops, x: Tensor) -> Tensor:
        """``GptOssMLP.forward``: the router, then the routed experts."""
        a = self.a
        e, k, h = a.n_experts, a.top_k, a.hidden
        tokens = x.numel // h
        logits = o.linear(x, h, e, bias=True, name="router")
        vals, idx = o.g.op([logits], [(tokens * k, logits.dtype), (tokens * k, "i64")])
        (scores,) = o.g.op([vals], [(tokens * k, vals.dtype)])  # softmax over the top-k
        o.g.touch(vals)
        if o.quant == "mxfp4" and o.quant_experts:
            out = self.mxfp4_experts(o, x, tokens)
        else:
            out = self.grouped_experts(o, x, scores, idx, tokens)
        o.g.touch(logits, scores, idx)
        return out

    def mxfp4_experts(self, o: Ops, x: Tensor, tokens: int) -> Tensor:
        """The trace's stand-in for ``Mxfp4GptOssExperts`` (``_mxfp4_forward``): routing
        metadata, the fused gate/up output (S, I), the (S, H) scratch pad, the (T, H) output."""
        dev = current_device()
        stored_experts(o, self.shape, hopper=bool(dev is not None and dev.hopper))
        rows = tokens * self.a.top_k
        h, i = self.a.hidden, self.shape.intermediate
        temps = [o.new(rows, "i32") for _ in range(MXFP4_ROUTING_INT32_PER_ROW)]
        temps += [o.new(rows, x.dtype), o.new(self.shape.n_experts, "i32")]
        temps += [o.new(rows * i, x.dtype), o.new(rows * h, x.dtype)]
        out = o.new(tokens * h, x.dtype)
        o.g.touch(*temps)
        return out

    def grouped_experts(
        self, o: Ops, x: Tensor, weights: Tensor, idx: Tensor, tokens: int
    ) -> Tensor:
        """``grouped_mm_experts_forward`` with ``is_transposed`` and ``has_bias``; each local
        alive until it returns (a rebound one until its new value exists)."""
        e, h, i = self.shape.n_experts, self.a.hidden, self.shape.intermediate
        rows = tokens * self.a.top_k
        gate_up, down = o.weight(e, h, 2 * i), o.weight(e, i, h)
        gate_up_bias, down_bias = o.weight(e, 2 * i), o.weight(e, h)
        ids_sorted, perm = o.g.op([idx], [(rows, "i64"), (rows, "i64")])  # torch.sort
        (div,) = o.g.op([perm], [(rows, "i64")])  # perm // num_top_k
        (sel,) = o.g.op([x, div], [(rows * h, x.dtype)])  # hidden_states[perm // k]
        o.g.touch(div)
        (w_g,) = o.g.op([weights, perm], [(rows, weights.dtype)])  # sample_weights[perm]
        (hist_in,) = o.g.op([ids_sorted], [(rows, "i32")])  # expert_ids_g.int() (CUDA)
        (counts,) = o.g.op([hist_in], [(e, "i32")])  # histc
        (offsets,) = o.g.op([counts], [(e, "i32")])  # cumsum
        (b_up,) = o.g.op([gate_up_bias, ids_sorted], [(rows * 2 * i, x.dtype)])  # bias[ids]
        (gu,) = o.g.op([sel, gate_up, offsets], [(rows * 2 * i, x.dtype)], matmul=True, mm=True)
        act = self.apply_gate(o, gu, rows)
        o.g.touch(gu)
        (b_dn,) = o.g.op([down_bias, ids_sorted], [(rows * h, x.dtype)])
        o.g.touch(b_up)
        (y,) = o.g.op([act, down, offsets], [(rows * h, x.dtype)], matmul=True, mm=True)
        o.g.touch(act)
        weighted = o.mul(y, w_g)  # proj_out * sample_weights_g.unsqueeze(-1)
        (inv,) = o.g.op([perm], [(rows, "i64")])  # empty_like(perm)
        (ar,) = o.g.op([], [(rows, "i64")])  # arange, scattered into inv
        o.g.touch(ar)
        (ordered,) = o.g.op([weighted, inv], [(rows * h, weighted.dtype)])  # [inv_perm]
        o.g.touch(weighted)
        (summed,) = o.g.op([ordered], [(tokens * h, weighted.dtype)])  # view(T, k, h).sum(1)
        res = o.cast(summed, x.dtype)
        o.g.touch(ids_sorted, perm, sel, w_g, hist_in, counts, offsets, b_dn, y, inv, ordered)
        return res

    def apply_gate(self, o: Ops, gu: Tensor, rows: int) -> Tensor:
        """``GptOssExperts._apply_gate``: clamped gate and up (strided halves), ``gate *
        sigmoid(gate * alpha)``, ``(up + 1) * glu``."""
        n = rows * self.shape.intermediate
        (gate,) = o.g.op([gu], [(n, gu.dtype)])  # gate.clamp(max=limit)
        (up,) = o.g.op([gu], [(n, gu.dtype)])  # up.clamp(-limit, limit)
        (ga,) = o.g.op([gate], [(n, gu.dtype)])  # gate * alpha
        (sg,) = o.g.op([ga], [(n, gu.dtype)])  # sigmoid
        o.g.touch(ga)
        (glu,) = o.g.op([gate, sg], [(n, gu.dtype)])
        o.g.touch(sg)
        (up1,) = o.g.op([up], [(n, gu.dtype)])  # up + 1
        (out,) = o.g.op([up1, glu], [(n, gu.dtype)])
        o.g.touch(up1, gate, up, glu)
        return out


#: ``GptOssForCausalLM`` (transformers 5.23): inference only.
GPT_OSS = DecoderFamily(
    name="gpt_oss",
    model_types=("gpt_oss",),
    norm="rms-olmo",
    mlp=Mlp(kind="moe", names=("router",)),
    program=GptOssProgram,
)

__all__ = ["GPT_OSS", "GptOssProgram"]

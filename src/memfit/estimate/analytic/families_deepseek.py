"""DeepSeek-V2 (``model_type`` ``deepseek_v2``): multi-head latent attention and a MoE with
shared experts, inference only (issue 32: ``memfit estimate deepseek-v2-lite --mode infer`` on
the analytic engine).

Each block follows ``transformers/models/deepseek_v2/modeling_deepseek_v2.py`` of transformers
5.23.0 (the installed version memfit's trace runs; ``fastpath.VALIDATED_WITH``):

* ``DeepseekV2Attention`` (MLA): ``q_proj`` (or ``q_a_proj`` → ``q_a_layernorm`` →
  ``q_b_proj`` where ``q_lora_rank`` is set) to H x (nope + rope) query heads;
  ``kv_a_proj_with_mqa`` to one latent of ``kv_lora_rank`` + ``qk_rope_head_dim``, whose
  first part is RMS-normed (``kv_a_layernorm``); the rope parts of q and k rotated by
  ``apply_rotary_emb`` in complex fp32 (``view_as_complex(x.float())``, then ``type_as``). The
  **cache holds the compressed latents** (``past_key_values.update(k_nope, k_pe)``: one head
  of ``kv_lora_rank`` and one of ``qk_rope_head_dim`` per token), and every pass expands the
  whole cache again: ``expand_kv`` runs ``kv_b_proj`` over all cached tokens (B x S_kv x H x
  (nope + v)) and builds the keys in a ``new_empty`` (B, H, S_kv, nope + rope) tensor. q
  (nope + rope = 192) and v (128) differ in head width, so SDPA takes the memory-efficient
  kernel (FlashAttention needs one width: ``attention.choose_kernel``).
* ``DeepseekV2Moe``: ``DeepseekV2TopkRouter`` (``F.linear`` of the fp32 hidden states and an
  fp32 copy of the weight, fp32 softmax, top-k, ``* routed_scaling_factor``; its logits are the
  caller's ``_`` until the block returns), the routed experts as transformers' default
  ``grouped_mm`` runs them (``mlp.grouped_experts``), then ``shared_experts`` (a SwiGLU MLP of
  ``moe_intermediate_size x n_shared_experts``) on the block's input, added.
* ``DeepseekV2DecoderLayer``: pre-RMSNorm; the first ``first_k_dense_replace`` layers have the
  dense ``DeepseekV2MLP`` (``intermediate_size``), the others the MoE. The program runs every
  layer in one period (``period`` = the layer count) when the stack mixes both kinds.
* ``DeepseekV2RotaryEmbedding``: ``inv_freq`` and ``original_inv_freq`` buffers (fp32,
  rope / 2 each); ``freqs_cis``, complex64 (positions x rope / 2), shared by every layer.

Training is not modelled (the routed experts' autograd and LoRA on them: the trace answers).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.analytic.arch import Arch
from memfit.estimate.analytic.attention import AttnShape, attention
from memfit.estimate.analytic.blocks import Shared, Work, norm
from memfit.estimate.analytic.decoder import DecoderFamily, DecoderProgram
from memfit.estimate.analytic.engine import simulate_infer
from memfit.estimate.analytic.graph import KV, Tensor
from memfit.estimate.analytic.mlp import Mlp, grouped_experts, mlp_block
from memfit.estimate.analytic.ops import Ops

#: DeepseekV2Config's defaults for the MLA widths config.json may omit (transformers 5.23,
#: ``configuration_deepseek_v2.py``).
MLA_DEFAULTS = {
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_shared_experts": 2,
    "first_k_dense_replace": 0,
}


def _dims(a: Arch) -> dict[str, Any]:
    """The MLA and MoE widths of a DeepSeek-V2 config (``MLA_DEFAULTS`` where it omits one);
    ``q_lora_rank`` None: the plain ``q_proj``."""
    d: dict[str, Any] = {}
    for key, default in MLA_DEFAULTS.items():
        value = a.extra.get(key)
        d[key] = int(value) if value is not None else default
    q_lora = a.extra.get("q_lora_rank")
    d["q_lora_rank"] = int(q_lora) if q_lora else None
    d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    return d


class DeepseekV2Program(DecoderProgram):
    """``DeepseekV2ForCausalLM`` for inference (module docstring)."""

    def __init__(self, a: Arch, family: DecoderFamily) -> None:
        super().__init__(a, family)
        self.d = _dims(a)
        n_dense = min(self.d["first_k_dense_replace"], a.n_layers)
        if a.n_experts and (a.top_k <= 0 or not a.expert_ffn):
            raise SpecError(
                f"model_type 'deepseek_v2': num_experts_per_tok ({a.top_k}) and "
                f"moe_intermediate_size ({a.expert_ffn}) must be set with n_routed_experts "
                f"({a.n_experts}); use --engine trace"
            )
        #: dense MLP layers first, then MoE ones (``layer_idx >= first_k_dense_replace``)
        self.n_dense = n_dense if a.n_experts else a.n_layers
        mixed = 0 < self.n_dense < a.n_layers
        self.period = a.n_layers if mixed else 1

    # ------------------------------------------------------------------ sizes
    def buffer_bytes(self, precision: str) -> int:
        """``inv_freq`` and ``original_inv_freq`` (fp32, rope / 2 each)."""
        return 2 * 4 * (self.d["qk_rope_head_dim"] // 2)

    def simulate(self, wl: Any, task: str) -> Any:
        """Inference as every chain decoder (``engine.simulate_infer``); training is refused."""
        if wl.is_train:
            raise NotModelledError(
                "training model_type 'deepseek_v2' is not modelled by the analytic engine "
                "(the routed experts' autograd); the trace engine models it",
                engine="analytic",
            )
        return simulate_infer(self, wl, task)

    # ------------------------------------------------------------------ embed
    def embed(self, o: Ops, w: Work) -> tuple[Tensor, Shared]:
        """Token embeddings, then ``freqs_cis`` (complex64, positions x rope / 2: the bytes of
        an fp32 positions x rope tensor), held through the forward."""
        x = self.embed_tokens(o, w)
        shared = Shared()
        shared.cos = o.new(w.positions * self.d["qk_rope_head_dim"], "f32")
        o.g.hold(shared.cos)
        self.embed_masks(o, w, shared, x.dtype)
        return x, shared

    def shared_for_layer(self, o: Ops, w: Work, x_dtype: str) -> Shared:
        shared = Shared()
        shared.cos = o.g.external(w.positions * self.d["qk_rope_head_dim"], "f32")
        dtype = self.mask_dtype(w, x_dtype)
        if dtype:
            shared.mask = o.g.external(w.batch * w.q_len * w.kv_len, dtype)
        return shared

    # ------------------------------------------------------------------ layer
    def layer(self, o: Ops, x: Tensor, w: Work, sh: Shared, index: int = 0) -> Tensor:
        """``DeepseekV2DecoderLayer`` (pre-norm); ``index`` within the period picks the MLP."""
        hn = self.norm(o, x)
        y = self.attention_block(o, hn, w, sh)
        o.g.touch(hn)
        x = o.add(x, y)
        hn = self.norm(o, x)
        all_dense = self.n_dense == self.a.n_layers
        dense = all_dense if self.period == 1 else index < self.n_dense
        y = self.dense_mlp(o, hn) if dense else self.moe(o, hn)
        o.g.touch(hn)
        return o.add(x, y)

    def dense_mlp(self, o: Ops, x: Tensor, ffn: int | None = None) -> Tensor:
        a = replace(self.a, ffn=ffn or self.a.ffn, mlp_bias=bool(self.a.extra.get("mlp_bias")))
        return mlp_block(o, x, a, Mlp())

    def moe(self, o: Ops, x: Tensor) -> Tensor:
        """``DeepseekV2Moe.forward``: router, routed experts, shared experts on the input."""
        a = self.a
        e, k, h = a.n_experts, a.top_k, a.hidden
        tokens = x.numel // h
        xf = o.cast(x, "f32")  # hidden_states.type(torch.float32)
        wf = o.cast(o.weight(e, h), "f32")  # self.weight.type(torch.float32)
        (logits,) = o.g.op([xf, wf], [(tokens * e, "f32")], matmul=True, mm=True)
        o.g.touch(wf)
        (scores,) = o.g.op([logits], [(tokens * e, "f32")])  # softmax(dtype=float32)
        o.g.touch(xf)
        if str(a.extra.get("topk_method") or "greedy") == "group_limited_greedy":
            n_group = int(a.extra.get("n_group") or 1)
            (groups,) = o.g.op([scores], [(tokens * n_group, "f32")])
            (masked,) = o.g.op([scores, groups], [(tokens * e, "f32")])  # masked_fill
            o.g.touch(groups)
            scores = masked
        vals, idx = o.g.op([scores], [(tokens * k, "f32"), (tokens * k, "i64")])  # topk
        o.g.touch(scores)
        (weights,) = o.g.op([vals], [(tokens * k, "f32")])  # * routed_scaling_factor
        o.g.touch(vals)
        routed = grouped_experts(o, x, weights, idx, a)
        o.g.touch(logits, weights, idx)  # ``_, topk_weights, topk_indices``: locals
        shared = self.dense_mlp(o, x, a.expert_ffn * self.d["n_shared_experts"])
        return o.add(routed, shared)

    def attention_block(self, o: Ops, x: Tensor, w: Work, sh: Shared) -> Tensor:
        """``DeepseekV2Attention.forward`` (module docstring), its locals alive until it
        returns."""
        a, d = self.a, self.d
        h, heads = a.hidden, a.n_heads
        nope, rope, vd, rank = (
            d["qk_nope_head_dim"],
            d["qk_rope_head_dim"],
            d["v_head_dim"],
            d["kv_lora_rank"],
        )
        qk = d["qk_head_dim"]
        bias = bool(a.extra.get("attention_bias"))
        t = x.numel // h
        local: list[Tensor] = []
        if d["q_lora_rank"] is None:
            q = o.linear(x, h, heads * qk, name="q_proj")
        else:
            qa = o.linear(x, h, d["q_lora_rank"], bias=bias, name="q_a_proj")
            qn = norm(o, qa, d["q_lora_rank"], "rms")
            o.g.touch(qa)
            q = o.linear(qn, d["q_lora_rank"], heads * qk, name="q_b_proj")
            o.g.touch(qn)
        q_nope, q_pe = o.split(q, [nope, rope])
        ckv = o.linear(x, h, rank + rope, bias=bias, name="kv_a_proj_with_mqa")
        kv_nope, k_pe = o.split(ckv, [rank, rope])
        k_nope = norm(o, kv_nope, rank, "rms")
        # apply_rotary_emb: x.float() (copies of the strided rope parts), complex products,
        # ``type_as``; xq_ / xk_ are locals until it returns
        cos = sh.cos if sh.cos is not None else o.g.external(t * rope, "f32")
        xq = o.cast(q_pe, "f32")
        (pq,) = o.g.op([xq, cos], [(xq.numel, "f32")])
        q_rot = o.cast(pq, q.dtype)
        o.g.touch(pq)
        xk = o.cast(k_pe, "f32")
        (pk,) = o.g.op([xk, cos], [(xk.numel, "f32")])
        k_rot = o.cast(pk, q.dtype)
        o.g.touch(pk, xq, xk)
        k_nope, k_rot = self.cache_latents(o, w, k_nope, k_rot)
        (query,) = o.g.op([q_nope, q_rot], [(t * heads * qk, q.dtype)])  # cat
        kv_rows = w.batch * w.kv_len
        kvb = o.linear(k_nope, rank, heads * (nope + vd), name="kv_b_proj")
        _k_part, value = o.split(kvb, [nope, vd])
        (key,) = o.g.op([kvb, k_rot], [(kv_rows * heads * qk, q.dtype)])  # new_empty + copy_
        local += [q, ckv, k_nope, k_rot, q_rot, query, kvb, key]
        shape = AttnShape(
            batch=w.batch,
            n_heads=heads,
            n_kv=heads,
            head_dim=qk,
            q_len=w.q_len,
            kv_len=w.kv_len,
            v_dim=vd,
        )
        out = attention(o, query, key, value, shape, impl=w.impl, mask=sh.mask)
        out = o.linear(out, heads * vd, h, bias=bias, name="o_proj")
        o.release_locals(*local)
        return out

    def cache_latents(
        self, o: Ops, w: Work, k_nope: Tensor, k_rot: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``DynamicLayer.update`` of the two latents: a ``cat`` onto the cached tokens (a copy
        on the first call too), held as the KV cache; the whole cache is what the layer reads."""
        if not w.use_cache:
            return k_nope, k_rot
        old = w.kv_len - w.q_len
        out = []
        for t in (k_nope, k_rot):
            per_token = t.numel // (w.batch * w.q_len)
            parts = [t]
            if old > 0:
                parts.insert(0, o.g.input(per_token * w.batch * old, t.dtype, rg=False, comp=KV))
            (c,) = o.g.op(parts, [(per_token * w.batch * w.kv_len, t.dtype)])
            c.storage.comp = KV
            o.g.hold(c)
            out.append(c)
        return out[0], out[1]


#: ``DeepseekV2ForCausalLM`` (transformers 5.23): MLA, a MoE with shared experts after
#: ``first_k_dense_replace`` dense layers; inference only.
DEEPSEEK_V2 = DecoderFamily(
    name="deepseek_v2", model_types=("deepseek_v2",), program=DeepseekV2Program
)

__all__ = ["DEEPSEEK_V2", "MLA_DEFAULTS", "DeepseekV2Program"]

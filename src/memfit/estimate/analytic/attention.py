"""Attention cores as Hugging Face runs them, with the kernel a CUDA GPU picks.

* eager (``eager_attention_forward``): ``repeat_kv`` copies for grouped-query attention, the
  (B, H, S, S) scores, the fp32 softmax (``dtype=torch.float32``) and its cast back, dropout.
* sdpa (``sdpa_attention_forward`` then PyTorch's ``_fused_sdp_choice``, as memfit's trace
  routes it — ``estimate/trace/cuda_emulation.py``): FlashAttention-2 for fp16/bf16 without a mask
  and head_dim <= 256 (a multiple of 8); else the memory-efficient kernel (GQA heads repeated);
  with grouped-query attention and no efficient kernel, the math path that materialises scores.
* FlashAttention-2 saves q, k, v, the output and the fp32 log-sum-exp (B, H, S) (Dao 2023, §3.1:
  no S×S matrix is stored); its backward holds ``dq_accum`` (fp32) and ``softmax_d`` for the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.estimate.analytic.graph import DTYPE_BYTES, Tensor
from memfit.estimate.analytic.ops import HALF, Ops

#: FlashAttention-2 backward rounding (``mha_bwd``): sequence to 128, head dim to 32 (the same
#: constants memfit's trace uses, measured on an H200: benchmarks/results/).
FLASH_SEQ_ROUND = 128
FLASH_HEAD_ROUND = 32
#: The memory-efficient kernel stores the log-sum-exp padded to a multiple of 32 queries
#: (``_efficient_attention_forward``: ``ceil_div(M, 32) * 32``).
EFFICIENT_LSE_ROUND = 32
#: Philox seed and offset tensors every fused SDPA kernel returns (two int64 scalars).
RNG_STATE_BYTES = 16


#: The softmax of each family's ``eager_attention_forward``: ``f32`` (Llama and most:
#: ``softmax(x, dtype=float32).to(query.dtype)``), ``value`` (GPT-2: ``softmax(x)`` in the
#: scores' dtype, fp32 under autocast, then ``.type(value.dtype)``), ``input`` (BERT, RoBERTa:
#: ``softmax(x)`` and no cast).
EAGER_SOFTMAX = ("f32", "value", "input")


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass(frozen=True, kw_only=True)
class AttnShape:
    batch: int
    n_heads: int
    n_kv: int
    head_dim: int
    q_len: int
    kv_len: int
    v_dim: int = 0  # defaults to head_dim

    @property
    def vd(self) -> int:
        return self.v_dim or self.head_dim


def choose_kernel(o: Ops, shape: AttnShape, *, impl: str, masked: bool, gqa: bool) -> str:
    """The backend memfit's trace picks (``SdpaRouter.choose``)."""
    if impl == "eager":
        return "eager"
    dtype = o.cdtype
    d = shape.head_dim
    flash_ok = dtype in HALF and d <= 256 and d % 8 == 0 and shape.vd == d
    if flash_ok and (impl == "flash" or not masked):
        return "flash"
    if gqa:
        return "math"
    align = 8 if dtype in HALF else 4
    return "efficient" if d % align == 0 else "math"


def flash_backward_workspace_bytes(shape: AttnShape, itemsize: int) -> int:
    s_r = round_up(shape.q_len, FLASH_SEQ_ROUND)
    d_r = round_up(shape.head_dim, FLASH_HEAD_ROUND)
    n = shape.batch * s_r * shape.n_heads * d_r * 4 + shape.batch * shape.n_heads * s_r * 4
    if shape.n_kv != shape.n_heads:
        n += 2 * shape.batch * shape.kv_len * shape.n_heads * shape.head_dim * itemsize
    return n


def attention(
    o: Ops,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    shape: AttnShape,
    *,
    impl: str,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    q_head_major: bool = False,
    eager_softmax: str = "f32",
    repeat_kv_view: bool = True,
) -> Tensor:
    """Attention output in (B, S, H·D) layout (after HF's ``transpose(1, 2).contiguous()``).
    ``mask``: an explicit mask tensor (None: causal or full attention without one).
    ``q_head_major``: q is laid out (B, H, S, D) in memory (a ``cat`` made it, e.g. partial
    rotary) rather than as a transposed (B, S, H, D) projection; FlashAttention's output follows
    q's layout, so ``transpose(1, 2).contiguous()`` then copies it.
    ``eager_softmax``: how the family's ``eager_attention_forward`` normalises the scores (see
    ``EAGER_SOFTMAX``).
    ``repeat_kv_view``: the heads reach SDPA through transformers' ``sdpa_attention_forward``,
    whose ``repeat_kv`` of a single key/value head is a view (below); False for a family that
    calls SDPA itself with fewer key/value heads (Falcon: the kernel path repeats them)."""
    n_rep = shape.n_heads // shape.n_kv
    d = shape.head_dim
    if impl == "eager" or softcap:
        return _eager(o, q, k, v, shape, mask, dropout_p, softcap, eager_softmax)
    gqa_native = n_rep > 1 and mask is None and d == shape.vd and d <= 256
    # ``repeat_kv`` of one key/value head (multi-query: Gemma-3-1B, Gemma-2B, the tiny grid
    # configs) is a view: ``expand`` then ``reshape`` merges the size-1 head dim with the
    # stride-0 repeat dim, no copy (transformers 5.23, integrations/sdpa_attention.py); the fused
    # kernels take the stride-0 heads as they are, the math path's matmuls copy them.
    mqa_view = repeat_kv_view and n_rep > 1 and not gqa_native and shape.n_kv == 1
    if n_rep > 1 and not gqa_native and not mqa_view:
        k, v = _repeat_kv(o, k, n_rep), _repeat_kv(o, v, n_rep)
    if o.autocast:
        q, k, v = (o.cast(t, o.cdtype) if t.dtype == "f32" else t for t in (q, k, v))
    kernel = choose_kernel(o, shape, impl=impl, masked=mask is not None, gqa=gqa_native)
    if kernel == "flash":
        out = fused_attention(o, q, k, v, shape, lse_len=shape.q_len, flash=True)
        return o.unary(out) if q_head_major else out
    if kernel == "efficient":
        if gqa_native:
            k, v = _repeat_kv(o, k, n_rep, interleave=True), _repeat_kv(o, v, n_rep, True)
        bias = None
        if mask is not None and mask.dtype == "bool":  # zeros(...).masked_fill_(~mask, -inf)
            # of the mask's (B, 1, S, S) shape, even where it is one mask expanded over the batch
            n = max(mask.numel, shape.batch * shape.q_len * shape.kv_len)
            (inverted,) = o.g.op([mask], [(n, "bool")])  # ``logical_not``: transient
            bias = o.g.op([mask, inverted], [(n, q.dtype)])[0]
        return fused_attention(
            o, q, k, v, shape, lse_len=round_up(shape.q_len, EFFICIENT_LSE_ROUND), bias=bias
        )
    if gqa_native or mqa_view:
        k, v = _repeat_kv(o, k, n_rep, interleave=True), _repeat_kv(o, v, n_rep, True)
    return math_attention(o, q, k, v, shape, mask, dropout_p)


def _repeat_kv(o: Ops, t: Tensor, n_rep: int, interleave: bool = False) -> Tensor:
    """``repeat_kv``/``repeat_interleave``: an (expand + reshape) copy with every query head."""
    (out,) = o.g.op([t], [(t.numel * n_rep, t.dtype)])
    return out


def fused_attention(
    o: Ops,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    shape: AttnShape,
    *,
    lse_len: int,
    flash: bool = False,
    bias: Tensor | None = None,
) -> Tensor:
    b, h = shape.batch, shape.n_heads
    out_numel = b * h * shape.q_len * shape.vd
    ws = flash_backward_workspace_bytes(shape, DTYPE_BYTES[q.dtype]) if flash else 0
    extra = [bias] if bias is not None else []
    out, lse, rng = o.g.op(
        [q, k, v, *extra],
        [(out_numel, q.dtype), (b * h * lse_len, "f32"), (RNG_STATE_BYTES, "u8")],
        saves=[q, k, v, *extra],
        bwd_workspace=ws,
        matmul=True,
    )
    o.save_outputs(out, lse, rng)
    return out


def math_attention(
    o: Ops, q: Tensor, k: Tensor, v: Tensor, shape: AttnShape, mask: Tensor | None, p: float
) -> Tensor:
    """``_scaled_dot_product_attention_math``: scale q, q·kᵀ, add the mask, softmax, dropout, ·v."""
    b, h = shape.batch, shape.n_heads
    scores = b * h * shape.q_len * shape.kv_len
    qs = o.unary(q)  # q * sqrt(scale)
    att = o.matmul(qs, k, scores)
    if mask is not None or shape.q_len > 1:
        att = o.add(att, mask) if mask is not None else o.unary(att)
    probs = softmax(o, att)
    probs = o.dropout(probs, p)
    out = o.matmul(probs, v, b * h * shape.q_len * shape.vd)
    return o.unary(out)  # transpose(1, 2).contiguous()


def softmax(o: Ops, x: Tensor, dtype: str | None = None) -> Tensor:
    """``softmax`` saves its output (SoftmaxBackward uses the result)."""
    xi = o.cast(x, dtype) if dtype else o.fp32_op(x)
    (out,) = o.g.op([xi], [(x.numel, xi.dtype)])
    o.save_outputs(out)
    return out


def _eager(
    o: Ops,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    shape: AttnShape,
    mask: Tensor | None,
    p: float,
    softcap: float | None = None,
    eager_softmax: str = "f32",
) -> Tensor:
    """``eager_attention_forward`` (Llama and most decoder families); Gemma 2 caps the logits
    (``tanh(x / cap) * cap``: TanhBackward saves its output). ``eager_softmax``: see
    ``EAGER_SOFTMAX``."""
    n_rep = shape.n_heads // shape.n_kv
    repeated: list[Tensor] = []
    # With one key/value head (multi-query) ``repeat_kv``'s reshape of the expanded tensor is a
    # view (the size-1 head dim merges); each ``matmul`` then copies its broadcast operand
    # (``expand(...).reshape``), which only its ``bmm`` uses (and saves, in training).
    mqa = n_rep > 1 and shape.n_kv == 1
    if n_rep > 1 and not mqa:
        k, v = _repeat_kv(o, k, n_rep), _repeat_kv(o, v, n_rep)
        repeated = [k, v]
    b, h = shape.batch, shape.n_heads
    scores = b * h * shape.q_len * shape.kv_len
    att = o.matmul(q, _repeat_kv(o, k, n_rep) if mqa else k, scores)
    att = o.unary(att)  # * scaling
    if softcap:
        att = o.unary(att)  # / softcap
        (att,) = o.g.op([att], [(att.numel, att.dtype)])  # tanh
        o.save_outputs(att)
        att = o.unary(att)  # * softcap
    if mask is not None:
        att = o.add(att, mask)
    if eager_softmax == "f32":
        probs = o.cast(softmax(o, att, "f32"), q.dtype)
    else:
        probs = softmax(o, att)
        if eager_softmax == "value":
            probs = o.cast(probs, v.dtype)
    # ``attn_weights = softmax(attn_weights, ...).to(...)``: the softmax input stays referenced
    # by ``attn_weights`` until the cast result is assigned to it.
    o.g.touch(att)
    probs = o.dropout(probs, p)
    out = o.matmul(probs, _repeat_kv(o, v, n_rep) if mqa else v, b * h * shape.q_len * shape.vd)
    # Returned as ``attn_weights``: alive until the attention module returns, and in the chain
    # families' layers (``hidden_states, _ = self.self_attn(...)``; BERT's and ViT's ``_`` too)
    # until the decoder layer returns, through the MLP.
    o.locals.append(probs)
    o.layer_locals.append(probs)
    out = o.unary(out)  # transpose(1, 2).contiguous()
    # ``repeat_kv``'s copies are the function's ``key_states``/``value_states``: alive until it
    # returns.
    o.g.touch(*repeated)
    return out

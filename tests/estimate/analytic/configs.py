"""Tiny configs of every family the analytic engine models (fast to trace on CPU)."""

from __future__ import annotations

from tests.conftest import TINY_BERT, TINY_GEMMA2, TINY_GPT2, TINY_LLAMA

TINY_QWEN2 = dict(
    TINY_LLAMA,
    model_type="qwen2",
    architectures=["Qwen2ForCausalLM"],
    tie_word_embeddings=True,
)
#: Qwen3-0.6B's layout in small: a head wider than hidden / heads (q/o project 4 x 64 from 128),
#: grouped K/V, tied embeddings, per-head q/k RMSNorms.
TINY_QWEN3 = dict(
    TINY_LLAMA,
    model_type="qwen3",
    architectures=["Qwen3ForCausalLM"],
    head_dim=64,
    tie_word_embeddings=True,
)
TINY_MISTRAL = dict(TINY_LLAMA, model_type="mistral", architectures=["MistralForCausalLM"])
TINY_PHI3 = dict(
    TINY_LLAMA,
    model_type="phi3",
    architectures=["Phi3ForCausalLM"],
    num_key_value_heads=4,
    pad_token_id=0,
)
TINY_MIXTRAL = dict(
    TINY_LLAMA,
    model_type="mixtral",
    architectures=["MixtralForCausalLM"],
    num_local_experts=4,
    num_experts_per_tok=2,
)
TINY_NEOX = dict(
    model_type="gpt_neox",
    architectures=["GPTNeoXForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=512,
    vocab_size=500,
    rotary_pct=0.25,
    max_position_embeddings=2048,
)
TINY_OPT = dict(
    model_type="opt",
    architectures=["OPTForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    ffn_dim=512,
    vocab_size=500,
    word_embed_proj_dim=128,
    max_position_embeddings=2048,
    pad_token_id=1,
)
TINY_BIGCODE = dict(
    model_type="gpt_bigcode",
    architectures=["GPTBigCodeForCausalLM"],
    n_embd=128,
    n_layer=3,
    n_head=4,
    n_inner=512,
    vocab_size=500,
    n_positions=1024,
    multi_query=True,
)
TINY_PHI = dict(
    model_type="phi",
    architectures=["PhiForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=512,
    vocab_size=500,
    resid_pdrop=0.1,
    max_position_embeddings=2048,
)
TINY_ROBERTA = dict(
    TINY_BERT,
    model_type="roberta",
    architectures=["RobertaForMaskedLM"],
    pad_token_id=1,
    max_position_embeddings=514,
)
TINY_VIT = dict(
    model_type="vit",
    architectures=["ViTForImageClassification"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=256,
    image_size=64,
    patch_size=8,
)

TINY = {
    "llama": TINY_LLAMA,
    "qwen2": TINY_QWEN2,
    "qwen3": TINY_QWEN3,
    "mistral": TINY_MISTRAL,
    "mistral-window": dict(TINY_MISTRAL, sliding_window=32),  # sequence 64: the mask is built
    "phi3": TINY_PHI3,
    "mixtral": TINY_MIXTRAL,
    "gemma2": TINY_GEMMA2,
    "gpt2": TINY_GPT2,
    "neox": TINY_NEOX,
    "phi": TINY_PHI,
    "opt": TINY_OPT,
    "bigcode": TINY_BIGCODE,
    "bert": TINY_BERT,
    "roberta": TINY_ROBERTA,
    "vit": TINY_VIT,
}

#: A small Llama whose matrices all hold at least 1e5 elements (ZeRO-3 partitions them; DeepSpeed
#: keeps smaller parameters whole), as tests/estimate/trace/test_distributed.py uses.
MID_LLAMA = dict(
    TINY_LLAMA,
    hidden_size=512,
    num_attention_heads=8,
    num_key_value_heads=4,
    intermediate_size=1024,
    vocab_size=1000,
    num_hidden_layers=2,
)
TINY["mid-llama"] = MID_LLAMA

TINY_FALCON = dict(
    model_type="falcon",
    architectures=["FalconForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    vocab_size=500,
    max_position_embeddings=2048,
)
TINY_BLOOM = dict(
    model_type="bloom",
    architectures=["BloomForCausalLM"],
    hidden_size=128,
    n_layer=3,
    n_head=4,
    vocab_size=500,
)
TINY["falcon"] = TINY_FALCON  # falcon-7b's layout: multi-query, parallel attention, no bias
TINY["falcon-40b"] = dict(  # new_decoder_architecture: grouped K/V, two LayerNorms per layer
    TINY_FALCON, new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=8
)
TINY["bloom"] = TINY_BLOOM
#: falcon-rw-1b's layout: ALiBi instead of rotary, a K/V head per query head, the MLP after the
#: attention residual, biases; and its multi-query variant.
TINY["falcon-rw"] = dict(TINY_FALCON, alibi=True, multi_query=False, parallel_attn=False, bias=True)
TINY["falcon-rw-mq"] = dict(TINY["falcon-rw"], multi_query=True)

#: CLIP: two towers of different widths and depths (the vision tower: 65 positions of 8x8
#: patches), a projection narrower than both.
TINY_CLIP = dict(
    model_type="clip",
    architectures=["CLIPModel"],
    projection_dim=48,
    text_config=dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=500,
    ),
    vision_config=dict(
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=64,
        patch_size=8,
    ),
)
TINY["clip"] = TINY_CLIP

#: Qwen3-30B-A3B's layout in small: Qwen3 attention (head wider than hidden / heads), 8 routed
#: experts of ``moe_intermediate_size`` narrower than the (unused) dense ``intermediate_size``,
#: top-2 renormalised, untied.
TINY_QWEN3_MOE = dict(
    TINY_QWEN3,
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    moe_intermediate_size=96,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    tie_word_embeddings=False,
)
TINY["qwen3_moe"] = TINY_QWEN3_MOE
TINY["qwen3_moe-unnormalised"] = dict(TINY_QWEN3_MOE, norm_topk_prob=False)
#: OLMo 2's layout in small: post-sub-block norms, q/k norms over the whole projection, grouped
#: K/V (the 7B/13B have none; 32B has).
TINY_OLMO2 = dict(TINY_LLAMA, model_type="olmo2", architectures=["Olmo2ForCausalLM"])
TINY["olmo2"] = TINY_OLMO2
#: Gemma 3's layout in small: sliding and full layers (a window of 32 that a 64-token sequence
#: outruns), per-head q/k norms, a head wider than hidden / heads, tied embeddings by default.
TINY_GEMMA3 = dict(
    model_type="gemma3_text",
    architectures=["Gemma3ForCausalLM"],
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=500,
    max_position_embeddings=2048,
    sliding_window=32,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    query_pre_attn_scalar=32,
)
TINY["gemma3"] = TINY_GEMMA3

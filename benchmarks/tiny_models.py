"""Tiny configs of many model types, built with transformers' own config classes (torch-free).

One table, shared by the coverage test (``tests/estimate/test_model_coverage.py``) and the
fast-path-vs-trace grid (``benchmarks/fastpath_grid.py``): per ``model_type`` its kind (decoder,
moe, mla, hybrid, sliding, ssm, encoder, encoder-decoder, vision, audio) and the overrides that make
the config tiny and valid. :func:`tiny_config` returns the ``config.json`` dict that
``AutoConfig.for_model(model_type, ...)`` serialises, with ``architectures`` naming the task's head
class (as a hub config.json does), so the trace engine builds the model a user would train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Small sizes under the names transformers' config classes take (``attribute_map`` maps the
#: common ones onto each family's own: n_embd, d_model, ...).
SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=64, vocab_size=256, max_position_embeddings=256,
)  # fmt: skip
#: MLA keys carry every attention head (DeepSeek's configs set num_key_value_heads to
#: num_attention_heads; eager attention's ``repeat_kv`` would repeat them otherwise).
_MLA = dict(
    num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    moe_intermediate_size=32, first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=8,
)  # fmt: skip
_CONV = dict(
    conv_dim=[8, 8], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=4,
    num_conv_pos_embedding_groups=2,
)  # fmt: skip
#: An override that removes a key of SMALL (a small size the type's config class cannot take).
UNSET = object()
_ENC_DEC = dict(encoder_layers=1, decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64)
#: Per type: (kind, overrides).
TYPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("decoder", {}), "mistral": ("sliding", {"sliding_window": 16}),
    "qwen2": ("decoder", {}), "qwen3": ("decoder", {"head_dim": 16}),
    "gemma": ("decoder", {"head_dim": 16}),
    "gemma2": ("sliding", {"head_dim": 16, "sliding_window": 16}),
    "gemma3_text": ("sliding", {"head_dim": 16, "sliding_window": 16}),
    "phi": ("decoder", {}), "phi3": ("decoder", {"pad_token_id": 0}), "gpt2": ("decoder", {}),
    "gpt_neox": ("decoder", {}), "opt": ("decoder", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "bloom": ("decoder", {}), "falcon": ("decoder", {}), "granite": ("decoder", {}),
    "olmo": ("decoder", {}), "olmo2": ("decoder", {}), "cohere": ("decoder", {}),
    "stablelm": ("decoder", {}), "starcoder2": ("decoder", {}),
    "gptj": ("decoder", {"rotary_dim": 8}),
    # CodeGen splits its heads over mp_num = 4 (hard-coded in modeling_codegen): 4 heads
    "codegen": ("decoder", {"rotary_dim": 8, "num_attention_heads": 4}),
    "gpt_bigcode": ("decoder", {}), "helium": ("decoder", {"head_dim": 16}),
    "glm": ("decoder", {"head_dim": 16, "pad_token_id": 0, "eos_token_id": 1}),
    "smollm3": ("decoder", {"pad_token_id": 0}),
    "mixtral": ("moe", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": ("moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                          "shared_expert_intermediate_size": 32}),
    "qwen3_moe": ("moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                          "head_dim": 16}),
    "olmoe": ("moe", {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("moe", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "gpt_oss": ("moe", {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16,
                        "sliding_window": 16}),
    "llama4_text": ("moe", {"num_local_experts": 4, "num_experts_per_tok": 1, "head_dim": 16,
                            "intermediate_size_mlp": 64}),
    "deepseek_v3": ("mla", {**_MLA, "q_lora_rank": 16}),
    "deepseek_v2": ("mla", {**_MLA, "q_lora_rank": None}),
    "jamba": ("hybrid", {"num_experts": 2, "num_experts_per_tok": 1, "attn_layer_period": 2,
                         "attn_layer_offset": 1, "expert_layer_period": 2,
                         "expert_layer_offset": 1, "mamba_d_state": 4, "use_mamba_kernels": False}),
    # one attention layer: transformers' Bamba asks its cache for a length only those keep
    "bamba": ("hybrid", {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 4,
                         "mamba_n_groups": 1, "attn_layer_indices": [1]}),
    "falcon_h1": ("hybrid", {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 4,
                             "mamba_n_groups": 1, "head_dim": 16, "mamba_d_ssm": 64}),
    "mamba": ("ssm", {"state_size": 4}),
    "bert": ("encoder", {}), "roberta": ("encoder", {}), "distilbert": ("encoder", {}),
    "electra": ("encoder", {"embedding_size": 32}), "albert": ("encoder", {"embedding_size": 32}),
    "deberta-v2": ("encoder", {}),
    "t5": ("encoder-decoder", {"num_heads": 2, "d_kv": 16, "d_ff": 64, "num_layers": 2,
                               "decoder_start_token_id": 0}),
    "bart": ("encoder-decoder", dict(_ENC_DEC)),
    "pegasus": ("encoder-decoder", dict(_ENC_DEC)),
    "vit": ("vision", {"image_size": 32, "patch_size": 8}),
    "deit": ("vision", {"image_size": 32, "patch_size": 8}),
    # ConvNeXt's attribute_map sends num_hidden_layers onto num_stages (4 here): unset
    "convnext": ("vision", {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
                            "image_size": 32, "num_hidden_layers": UNSET}),
    "resnet": ("vision", {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
                          "embedding_size": 8, "image_size": 32}),
    # Swin's attribute_map sends num_attention_heads onto its per-stage list num_heads: unset
    "swin": ("vision", {"image_size": 32, "patch_size": 4, "embed_dim": 8, "depths": [1, 1],
                        "num_heads": [1, 2], "window_size": 2, "num_attention_heads": UNSET}),
    "whisper": ("audio", {**_ENC_DEC, "d_model": 32, "encoder_attention_heads": 2,
                          "decoder_attention_heads": 2, "num_mel_bins": 8,
                          "max_source_positions": 16, "max_target_positions": 64,
                          # WhisperConfig's token ids default to 50256-50257: inside vocab 256
                          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                          "decoder_start_token_id": 1}),
    "wav2vec2": ("audio", dict(_CONV)),
    "hubert": ("audio", dict(_CONV)),
}  # fmt: skip
#: The kinds the issue names (issue 11, "Done means"); "sliding" and "ssm" are extra.
KINDS = ("decoder", "moe", "mla", "hybrid", "encoder", "encoder-decoder", "vision", "audio")
#: Kinds whose models generate (an inference point decodes new tokens).
GENERATIVE = ("decoder", "sliding", "moe", "mla", "hybrid", "ssm", "encoder-decoder")
#: Types of other kinds that generate too (Whisper: speech-to-text decoding).
ALSO_GENERATE = ("whisper",)


def generates(model_type: str) -> bool:
    """Whether an inference job of ``model_type`` decodes new tokens (else: one forward)."""
    kind = TYPES.get(model_type, ("?", {}))[0]
    return kind in GENERATIVE or model_type in ALSO_GENERATE


def tiny_config(model_type: str) -> dict[str, Any]:
    """The config.json dict of a tiny ``model_type`` model, from transformers' config class."""
    from transformers import AutoConfig

    kind, overrides = TYPES[model_type]
    kwargs = {k: v for k, v in {**SMALL, **overrides}.items() if v is not UNSET}
    config = AutoConfig.for_model(model_type, **kwargs).to_dict()
    head = head_class(kind, model_type)
    if head is not None:  # the architecture names the task, as a hub config.json does
        config["architectures"] = [head]
    return config


def head_class(kind: str, model_type: str) -> str | None:
    """The task head a hub config.json of this kind names (causal LM, masked LM, seq2seq, ...)."""
    from transformers.models.auto import modeling_auto as m

    tables = {
        "encoder": m.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "encoder-decoder": m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "vision": m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
        "audio": {**m.MODEL_FOR_CTC_MAPPING_NAMES, **m.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES},
    }
    head = tables.get(kind, m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES).get(model_type)
    if isinstance(head, (list, tuple)):  # DeiT: (the classifier, the one with its teacher)
        head = head[0]
    return head


def write_tiny(folder: Path, model_type: str) -> Path:
    """``folder/model_type/config.json`` of the tiny model; returns its directory."""
    path = folder / model_type / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tiny_config(model_type), default=str))
    return path.parent

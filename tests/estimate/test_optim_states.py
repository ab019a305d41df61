"""Optimizer-state formulas: against hand arithmetic from a config, and against published figures.

The hand formulas here are written from the libraries' documented layouts (docs/optimizers.md), not
from memfit's code; the shapes come from a model built on the meta device by transformers.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from memfit.errors import SpecError
from memfit.estimate.optim_states import (
    OPTIMIZER_NAMES,
    model_optimizer_state_bytes,
    optimizer_state_bytes,
    state_tensors,
)
from memfit.spec import OPTIMIZERS

LLAMA_1B = {
    "hidden": 2048,
    "inter": 8192,
    "layers": 16,
    "kv_dim": 8 * 64,  # num_key_value_heads · head_dim
    "vocab": 128256,
}


def _meta_shapes(
    config: dict, cls_name: str
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(non-embedding shapes, nn.Embedding weight shapes) of a model built on the meta device;
    tied weights count once, as in ``model.parameters()``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(
        **{k: v for k, v in config.items() if k != "architectures"}
    )
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg)
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    normal, embeddings = [], []
    for p in model.parameters():
        (embeddings if id(p) in embedding_ids else normal).append(tuple(p.shape))
    return normal, embeddings


def _bundled(name: str) -> dict:
    from memfit.models import resolve_model

    config = resolve_model(name).config
    assert config is not None
    return dict(config)


def test_every_spec_optimizer_has_a_formula() -> None:
    assert set(OPTIMIZERS) == set(OPTIMIZER_NAMES)
    for name in OPTIMIZERS:
        optimizer_state_bytes(name, (64, 64))


def test_adamw_8bit_state_bytes_of_llama_3_2_1b_match_a_hand_formula() -> None:
    """Llama-3.2-1B (tied embeddings), bf16, bitsandbytes AdamW8bit as HF Trainer runs it.

    Hand formula: each weight matrix of n elements keeps two uint8 states (2·n bytes) and two fp32
    absmax vectors of n/256 blocks (2·4·n/256); RMSNorm weights (2048 < 4096 elements) and the
    embedding (HF Trainer's 32-bit override) keep two fp32 states (8·n); plus two 256-entry fp32
    quantization maps. Every size here is a multiple of 512 bytes, so allocator rounding adds 0.
    """
    h, i, kv, v, n_layers = (LLAMA_1B[k] for k in ("hidden", "inter", "kv_dim", "vocab", "layers"))
    per_layer_matrix = 2 * h * h + 2 * kv * h + 3 * h * i  # q, o; k, v; gate, up, down
    quantized = n_layers * per_layer_matrix * (2 + 2 * 4 / 256)
    norms = (2 * n_layers + 1) * h * 8
    embedding = v * h * 8
    qmaps = 2 * 256 * 4
    expected = int(quantized) + norms + embedding + qmaps

    normal, embeddings = _meta_shapes(_bundled("llama-3.2-1b"), "LlamaForCausalLM")
    assert embeddings == [(v, h)]  # tied: lm_head is the embedding
    got = model_optimizer_state_bytes(
        "adamw-8bit", normal, "bfloat16", fp32_state_shapes=embeddings
    )
    assert got.total_bytes == expected == 4_078_454_784
    assert got.paged_bytes == 0 and got.shared_bytes == qmaps

    # A plain bnb.optim.AdamW8bit loop (no override) quantizes the embedding too.
    plain = model_optimizer_state_bytes("adamw-8bit", normal + embeddings, "bfloat16")
    assert plain.total_bytes == expected - embedding + int(v * h * (2 + 2 * 4 / 256))


def test_paged_adamw_8bit_pages_the_states_of_large_parameters_only() -> None:
    big, small = (1024, 1024), (256, 256)  # 1 048 576 and 65 536 elements (paging needs 1e5)
    got = model_optimizer_state_bytes("paged-adamw-8bit", [big, small], "bfloat16")
    assert got.paged_bytes == 2 * 1024 * 1024  # the two uint8 states of `big`; absmax stays
    same = model_optimizer_state_bytes("adamw-8bit", [big, small], "bfloat16")
    assert got.total_bytes == same.total_bytes


def test_bnb_keeps_32bit_states_below_min_8bit_size() -> None:
    assert optimizer_state_bytes("adamw-8bit", (4095,), "bfloat16", round_to=1) == 8 * 4095
    assert (
        optimizer_state_bytes("adamw-8bit", (4096,), "bfloat16", round_to=1)
        == 2 * 4096 + 2 * 4 * 16
    )


def test_lion_keeps_one_fp32_state_whatever_the_parameter_dtype() -> None:
    for dtype in ("bfloat16", "float32"):
        assert optimizer_state_bytes("lion", (1000, 10), dtype, round_to=1) == 4 * 10_000


def test_adafactor_factors_matrices_and_keeps_vectors_whole() -> None:
    """transformers Adafactor: fp32 row/column factors, a full fp32 state for 1-D, an RMS scalar."""
    assert optimizer_state_bytes("adafactor", (300, 700), "bfloat16", round_to=1) == 4 * (
        300 + 700 + 1
    )
    assert optimizer_state_bytes("adafactor", (2, 3, 5), "bfloat16", round_to=1) == 4 * (6 + 10 + 1)
    assert optimizer_state_bytes("adafactor", (700,), "bfloat16", round_to=1) == 4 * (700 + 1)


def test_torch_optimizers_keep_states_in_the_parameter_dtype() -> None:
    n = 3 * 512
    assert optimizer_state_bytes("adamw", (n,), "bfloat16") == 2 * 2 * n
    assert optimizer_state_bytes("adamw-fused", (n,), "bfloat16") == 2 * 2 * n + 512  # fp32 step
    assert optimizer_state_bytes("sgd-momentum", (n,), "float32") == 4 * n
    assert optimizer_state_bytes("sgd", (n,), "float32") == 0


def test_each_state_tensor_rounds_to_the_allocator_block() -> None:
    (state1, state2, absmax1, absmax2) = state_tensors("adamw-8bit", (5000,))
    assert absmax1.numel == math.ceil(5000 / 256) == 20
    assert optimizer_state_bytes("adamw-8bit", (5000,)) == 2 * 5120 + 2 * 512


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: optimizer_state_bytes("adam", (4,)), r"optimizer \('adam'\) must be one of adamw"),
        (
            lambda: optimizer_state_bytes("adamw", (4, -1)),
            r"shape \(\(4, -1\)\) must be a sequence",
        ),
        (lambda: optimizer_state_bytes("adamw", (4,), "int8"), r"param_dtype \('int8'\) must be"),
        (
            lambda: optimizer_state_bytes("adamw-8bit", (8192,), block_size=0),
            r"block_size \(0\) must be a positive integer",
        ),
    ],
)
def test_bad_input_names_the_value_and_the_rule(call, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        call()


def test_the_module_does_not_import_torch() -> None:
    code = "import sys, memfit.estimate.optim_states; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization", Table 1, "Mem saved"
# (ids in /work/shared/calibration/published_measurements.jsonl). The paper quantizes in blocks of
# 2048 and, for language models, uses its StableEmbedding with 32-bit states; GLUE fine-tuning
# does not. Its "GB" are GiB: both rows below round to the printed value only in GiB (2.129e9 B
# would print as 2.1). Tolerance 3 %: the figures have one decimal (±0.05 GiB ≈ ±2.5-3 %).
DETTMERS_TABLE_1 = [
    # id, config overrides on a bundled config, model class, 32-bit embeddings, published GiB
    (
        "bnb8_roberta_large_glue",
        (
            "roberta-base",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
            },
        ),
        "RobertaForSequenceClassification",
        False,
        2.0,
    ),
    (
        "bnb8_gpt3_medium_lm",
        ("gpt2-medium", {"n_positions": 2048}),  # GPT-3 Medium: 24 × 1024, 2048-token context
        "GPT2LMHeadModel",
        True,
        1.7,
    ),
    pytest.param(
        "bnb8_transformer_1p5b_lm",
        ("gpt2-xl", {}),
        "GPT2LMHeadModel",
        True,
        8.5,
        marks=pytest.mark.xfail(
            strict=True,
            reason="the paper does not give its 1.5B LM's shape; GPT-2 XL gives 8.24 GiB (-3.1 %)",
        ),
    ),
    pytest.param(
        "bnb8_roberta_base_mlm",
        ("roberta-base", {}),
        "RobertaForMaskedLM",
        True,
        1.1,
        marks=pytest.mark.xfail(
            strict=True,
            reason="RoBERTa-Base has 125M parameters: 6 B each is at most 0.70 GiB, not 1.1",
        ),
    ),
]


@pytest.mark.parametrize(
    ("row_id", "config", "cls_name", "stable_embedding", "published_gib"),
    DETTMERS_TABLE_1,
    ids=["roberta_large_glue", "gpt3_medium_lm", "transformer_1p5b_lm", "roberta_base_mlm"],
)
def test_8bit_adam_savings_reproduce_dettmers_table_1(
    row_id: str, config: tuple, cls_name: str, stable_embedding: bool, published_gib: float
) -> None:
    name, overrides = config
    normal, embeddings = _meta_shapes({**_bundled(name), **overrides}, cls_name)
    adam32 = model_optimizer_state_bytes("adamw", normal + embeddings, "float32", round_to=1)
    adam8 = model_optimizer_state_bytes(
        "adamw-8bit",
        normal if stable_embedding else normal + embeddings,
        "float32",
        fp32_state_shapes=embeddings if stable_embedding else (),
        round_to=1,
        block_size=2048,
    )
    saved_gib = (adam32.total_bytes - adam8.total_bytes) / 2**30
    print(f"{row_id}: saved {saved_gib:.3f} GiB, published {published_gib} GiB")
    assert saved_gib == pytest.approx(published_gib, rel=0.03)

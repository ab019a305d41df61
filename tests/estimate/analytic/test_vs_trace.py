"""The analytic engine against the trace engine (the ground truth for what PyTorch and
transformers allocate: byte-exact against real CPU runs, tests/estimate/trace/test_exactness.py).

Tolerance: 3 % on ``peak_allocated_bytes``, the accuracy target of the analytic engine (its
closed forms skip some short-lived Python-local tensors and kernel workspaces). Parameter counts
must match exactly. Tiny configs of every family, a representative slice of the technique matrix;
benchmarks/analytic_vs_trace.py runs the full-size grid.
"""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec

TOLERANCE = 0.03

CASES = [
    ("llama", {}),
    ("llama", {"precision": "fp32"}),
    ("llama", {"precision": "amp-bf16"}),
    ("llama", {"precision": "amp-fp16"}),
    ("llama", {"attention": "eager"}),
    ("llama", {"checkpointing": "full"}),
    ("llama", {"checkpointing": "selective"}),
    ("llama", {"optimizer": "adamw-fused"}),
    ("llama", {"optimizer": "sgd-momentum"}),
    ("llama", {"optimizer": "none"}),
    ("llama", {"optimizer": "adafactor", "precision": "fp32"}),
    ("llama", {"optimizer": "adamw-8bit"}),
    ("gpt2", {"optimizer": "paged-adamw-8bit"}),
    ("llama", {"optimizer": "lion"}),
    ("llama", {"lora_rank": 4}),
    ("llama", {"lora_rank": 4, "lora_targets": ("q_proj", "v_proj"), "checkpointing": "full"}),
    ("llama", {"freeze_layers": 1}),
    ("llama", {"zero_grad_set_to_none": False}),
    # optimizer_in_bwd: each parameter steps in its post-accumulate-grad hook (gradients freed)
    ("llama", {"optimizer_in_bwd": True}),
    ("llama", {"optimizer_in_bwd": True, "precision": "bf16-true", "checkpointing": "full"}),
    ("llama", {"optimizer_in_bwd": True, "optimizer": "adamw-8bit", "precision": "bf16-true"}),
    ("llama", {"optimizer_in_bwd": True, "lora_rank": 4}),
    ("gpt2", {"optimizer_in_bwd": True}),  # tied LM head: its gradient waits for the embedding's
    ("llama", {"mode": "infer", "new_tokens": 6}),
    ("llama", {"mode": "infer", "precision": "fp32"}),
    # QLoRA through peft's prepare_model_for_kbit_training: fp32 around the quantized layers
    ("llama", {"quant": "nf4", "lora_rank": 4, "prepare_kbit": True}),
    ("llama", {"quant": "int8", "lora_rank": 4, "prepare_kbit": True, "checkpointing": "full"}),
    (
        "mistral",
        {"quant": "int4-awq", "lora_rank": 4, "prepare_kbit": True, "precision": "16-true"},
    ),
    # autocast caches every weight cast until generation ends; fp32 rotary keys make the
    # value cache fp32 too (DynamicLayer's empty caches take the keys' dtype)
    ("llama", {"mode": "infer", "new_tokens": 4, "precision": "amp-bf16"}),
    ("gpt2", {"mode": "infer", "new_tokens": 3, "precision": "amp-fp16"}),
    # ... but not FalconLinear's ``input @ self.weight.T``: a view is no leaf (was +7 %)
    ("falcon", {"mode": "infer", "new_tokens": 3, "precision": "amp-bf16"}),
    (
        "falcon-rw",
        {"mode": "infer", "new_tokens": 3, "precision": "amp-bf16", "attention": "eager"},
    ),
    ("bert", {"mode": "infer", "precision": "amp-bf16"}),
    ("qwen2", {}),
    ("qwen2", {"mode": "infer", "new_tokens": 3}),
    ("mistral", {"precision": "16-true", "attention": "flash"}),
    ("mistral-window", {}),
    ("phi3", {}),
    ("phi3", {"checkpointing": "full"}),
    ("mixtral", {"precision": "bf16-true"}),  # grouped-mm experts take bf16 only: no AMP run
    ("mixtral", {"mode": "infer", "new_tokens": 3}),
    ("gemma2", {}),
    ("gemma2", {"precision": "amp-bf16"}),
    ("gemma2", {"lora_rank": 4}),
    ("gemma2", {"mode": "infer", "new_tokens": 3}),
    ("gemma2", {"mode": "infer", "new_tokens": 3, "seq_len": 256}),
    ("gpt2", {}),
    ("gpt2", {"precision": "fp32", "attention": "eager"}),
    ("gpt2", {"freeze_layers": 1}),
    ("gpt2", {"mode": "infer", "new_tokens": 4}),
    ("neox", {}),
    ("phi", {}),
    ("phi", {"precision": "amp-bf16", "attention": "eager"}),
    ("neox", {"checkpointing": "selective"}),
    ("opt", {"attention": "eager"}),
    ("opt", {"lora_rank": 4}),
    ("bigcode", {"precision": "fp32"}),
    ("bert", {}),
    ("bert", {"precision": "fp32", "attention": "eager"}),
    ("bert", {"mode": "infer"}),
    ("roberta", {"lora_rank": 4}),
    ("roberta", {"lora_rank": 4, "precision": "amp-bf16"}),
    ("vit", {}),
    ("vit", {"mode": "infer"}),
    ("falcon", {}),
    ("falcon", {"attention": "eager", "precision": "amp-bf16"}),
    ("falcon", {"mode": "infer", "new_tokens": 4}),
    # FalconLinear is an nn.Linear subclass: transformers leaves it unquantized
    ("falcon", {"mode": "infer", "new_tokens": 3, "quant": "int8"}),
    ("falcon", {"quant": "nf4", "lora_rank": 4}),
    ("falcon-40b", {}),
    ("bloom", {}),
    ("bloom", {"mode": "infer", "new_tokens": 4}),
    ("falcon-rw", {}),
    ("falcon-rw", {"attention": "eager", "precision": "amp-bf16"}),
    ("falcon-rw", {"mode": "infer", "new_tokens": 4}),
    ("falcon-rw", {"mode": "infer", "new_tokens": 4, "attention": "eager"}),
    ("falcon-rw-mq", {"attention": "eager"}),
    ("falcon-rw-mq", {"mode": "infer", "new_tokens": 4}),
]


def _ids(case: tuple[str, dict]) -> str:
    fam, wl = case
    return fam + ":" + (",".join(f"{k}={v}" for k, v in wl.items()) or "default")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_analytic_peak_is_within_three_percent_of_the_trace(case, trace_hf) -> None:
    family, overrides = case
    assert_matches_trace(TINY[family], overrides, trace_hf, family)


def assert_matches_trace(config: dict, overrides: dict, trace_hf, label: str) -> tuple:
    """Both engines on ``config`` (batch 2 x 64 tokens unless ``overrides`` say otherwise): peak
    within ``TOLERANCE``, and within ``NET_TOLERANCE`` without the fixed bytes; exact parameter
    counts; the same phases."""
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 64, **overrides})
    traced = trace_hf(config, wl, name=label)
    analytic = estimate_analytic(config, wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    fixed = _fixed_bytes(wl)
    net = (analytic.peak_allocated_bytes - fixed) / (traced.peak_allocated_bytes - fixed) - 1
    detail = (
        f"{label} {overrides}: analytic {analytic.peak_allocated_bytes} vs trace "
        f"{traced.peak_allocated_bytes} ({error:+.2%}; {net:+.2%} without the fixed {fixed} B), "
        f"phases { {k: v.peak_allocated_bytes for k, v in analytic.phases.items()} } vs "
        f"{ {k: v.peak_allocated_bytes for k, v in traced.phases.items()} }"
    )
    assert abs(error) <= TOLERANCE, detail
    # The cuBLAS workspaces are a large share of these tiny peaks: without them a missing
    # activation term cannot hide (tiny Gemma 2 prefill was -13 % net while within 3 % gross).
    assert abs(net) <= NET_TOLERANCE, detail
    assert analytic.n_params == traced.n_params
    assert analytic.n_trainable_params == traced.n_trainable_params
    assert set(analytic.phases) == set(traced.phases)
    return traced, analytic


#: Tensors that Hugging Face's module code keeps referenced although no backward saves them: an
#: argument until the call returns (BLOOM's ``layernorm_output``, peft's input), a local rebound
#: only after the next call (BERT's ``hidden_states``), a returned tuple (BERT's
#: ``self_outputs``), the model's ``embedding_output`` when a frozen first layer saves nothing of
#: it. Each missing one was 1.5-4 % of these net peaks (BLOOM's prefill -1.6 %, RoBERTa with
#: LoRA -2.8 %, with LoRA under AMP -6.5 %: peft's fp32 copy of a half input); what remains is
#: the caching allocator's 512-byte rounding of small tensors (LayerNorm statistics, biases),
#: which the analytic engine does not model: hence 1 % (measured: within 0.7 %).
#: Under no_grad the same holds for inference: eager attention weights returned into the layer's
#: ``_`` until it returns (Llama fp32 prefill -4.0 % net, NeoX -6.2 %, Phi-3 -5.0 %; the
#: multi-query ``repeat_kv`` is a view, BERT's eager softmax stays in bf16: it was +10.8 %), each
#: sub-block's LayerNorm output, its argument, until it returns (GPT-2 prefill -1.6 %, OPT -4.2 %
#: with its ``inputs_embeds``/``pos_embeds`` locals, Gemma 2 -2.3 %), fused projections whose
#: views are locals (Phi-3 ``qkv``, Phi's ``query_pass``), ViT's (-3.3 %; with LoRA -3.4 %:
#: ``embedding_output`` and the pixel copy that nothing saves).
LOCALS_CASES = [
    ("llama", {"mode": "infer", "attention": "eager", "precision": "fp32"}),
    ("phi3", {"mode": "infer", "attention": "eager", "new_tokens": 3}),
    ("neox", {"mode": "infer", "attention": "eager", "new_tokens": 3}),
    ("phi", {"mode": "infer", "attention": "eager", "new_tokens": 3}),
    ("opt", {"mode": "infer", "attention": "eager", "new_tokens": 3}),
    ("bigcode", {"mode": "infer", "attention": "eager", "precision": "fp32", "new_tokens": 3}),
    ("gemma2", {"mode": "infer", "new_tokens": 3}),
    ("gpt2", {"mode": "infer", "new_tokens": 4}),
    ("bert", {"mode": "infer", "attention": "eager"}),
    ("vit", {"mode": "infer"}),
    ("vit", {"lora_rank": 4}),
    ("bloom", {"mode": "infer", "new_tokens": 4}),
    ("bloom", {}),
    ("roberta", {"lora_rank": 4}),
    ("roberta", {"lora_rank": 4, "precision": "amp-bf16"}),
    ("roberta", {"mode": "infer"}),
    ("bert", {"freeze_layers": 1}),
    ("falcon-rw", {"mode": "infer", "new_tokens": 4}),
    ("falcon-rw", {"attention": "eager"}),
    ("falcon-rw-mq", {"mode": "infer", "new_tokens": 4, "attention": "eager"}),
    ("falcon-40b", {"mode": "infer", "new_tokens": 4}),
]
LOCALS_NET_TOLERANCE = 0.01


@pytest.mark.parametrize("case", LOCALS_CASES, ids=[_ids(c) for c in LOCALS_CASES])
def test_tensors_module_code_keeps_referenced_stay_alive(case, trace_hf) -> None:
    family, overrides = case
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 64, **overrides})
    _compare(trace_hf, TINY[family], wl, net_tolerance=LOCALS_NET_TOLERANCE)


def test_a_larger_held_out_config_stays_within_tolerance(trace_hf) -> None:
    """The closed forms were derived on the tiny configs and two-layer slices of the bundled
    models; a wider, deeper config none of them used must land within the same tolerance."""
    config = dict(
        TINY["llama"],
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=7,
        num_attention_heads=6,
        num_key_value_heads=3,
        vocab_size=3000,
    )
    for overrides in ({}, {"checkpointing": "full", "precision": "amp-bf16"}):
        wl = WorkloadSpec(batch_size=3, seq_len=96, **overrides)
        traced = trace_hf(config, wl, name="held-out")
        analytic = estimate_analytic(config, wl)
        error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
        assert abs(error) <= TOLERANCE, (overrides, error)


QUANTS = ("int8", "nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "fp8")
#: Multi-GPU, offload and tensor-parallel setups, on a Llama whose matrices all hold >= 1e5
#: elements (ZeRO-3 partitions them instead of keeping them whole).
DIST_CASES = [
    {"gpus": 2},
    {"gpus": 4, "shard": "zero1"},
    {"gpus": 4, "shard": "zero2"},
    {"gpus": 4, "shard": "zero3"},
    {"gpus": 4, "shard": "fsdp"},
    {"gpus": 4, "shard": "zero2", "offload": "optimizer"},
    {"gpus": 4, "shard": "zero3", "offload": "params"},
    {"gpus": 4, "shard": "fsdp", "offload": "params"},
    {"gpus": 2, "tp": 2},
    {"gpus": 4, "tp": 2, "shard": "zero3"},
    {"mode": "infer", "gpus": 4, "shard": "zero3", "new_tokens": 3},
    {"mode": "infer", "gpus": 2, "tp": 2, "new_tokens": 3},
]


def _fixed_bytes(wl: WorkloadSpec) -> int:
    """Bytes both engines add by the same fixed rule whatever the model: the cuBLAS workspaces
    and ZeRO's ``reduce_bucket_size``-element gradient bucket (2-byte gradients here). On these
    small models they dwarf the rest, so the comparison also runs without them."""
    from memfit.estimate.device import allocator_workspaces
    from memfit.estimate.sharding import DEEPSPEED_DEFAULTS

    fixed = sum(allocator_workspaces(None, training=wl.is_train))
    if wl.is_train and wl.shard in ("zero1", "zero2", "zero3"):
        fixed += DEEPSPEED_DEFAULTS["reduce_bucket_size"] * 2
    return fixed


def _compare(
    trace_hf, config: dict, wl: WorkloadSpec, *, net_tolerance: float | None = None
) -> None:
    traced = trace_hf(config, wl, name="case")
    analytic = estimate_analytic(config, wl)
    fixed = _fixed_bytes(wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    net = (analytic.peak_allocated_bytes - fixed) / (traced.peak_allocated_bytes - fixed) - 1
    detail = (
        f"{wl}: analytic {analytic.peak_allocated_bytes} vs trace {traced.peak_allocated_bytes} "
        f"({error:+.2%}; {net:+.2%} without the fixed {fixed} B)"
    )
    assert abs(error) <= TOLERANCE, detail
    assert abs(net) <= (NET_TOLERANCE if net_tolerance is None else net_tolerance), detail
    assert analytic.n_params == traced.n_params
    assert analytic.n_trainable_params == traced.n_trainable_params
    assert analytic.host_memory_bytes == pytest.approx(traced.host_memory_bytes, rel=0.01)
    assert set(analytic.phases) == set(traced.phases)


#: Without the fixed buffers the tiny models' peaks are a few MB, where one unmodelled small
#: tensor weighs more; 5 % still fails on any missing parameter, gradient or state term.
NET_TOLERANCE = 0.05


@pytest.mark.parametrize("fmt", QUANTS)
def test_quantized_inference_and_qlora_are_within_tolerance_of_the_trace(fmt, trace_hf) -> None:
    config = TINY["llama"]
    for overrides in (
        {"mode": "infer", "new_tokens": 3},
        {"lora_rank": 4, "checkpointing": "full" if fmt == "nf4-dq" else "none"},
    ):
        wl = WorkloadSpec(batch_size=2, seq_len=64, quant=fmt, **overrides)
        _compare(trace_hf, config, wl)


#: LoRA under selective checkpointing. What torch's SAC stores for each peft LoRA Linear: the base
#: ``mm``/``addmm`` output (also a frozen one whose input needs no gradient: the first layer's),
#: the fp32 ``lora_A`` and ``lora_B`` ``mm`` outputs, and for a quantized base whatever its
#: dequantized path runs through ``mm`` (bitsandbytes 4-bit's ``F.linear``; int8's int32 GEMM is
#: no ``mm``). On these configs the ``lora_B`` outputs are ~30 % of the net peak and the first
#: layer's frozen base outputs ~1.5 %, hence the 1 % net tolerance (measured: within 0.2 %).
SAC_LORA_CASES = [
    {"lora_rank": 4},
    {"lora_rank": 4, "quant": "nf4"},
    {"lora_rank": 4, "quant": "int8"},
]
SAC_LORA_NET_TOLERANCE = 0.01


@pytest.mark.parametrize(
    "overrides", SAC_LORA_CASES, ids=[_ids(("llama", c)) for c in SAC_LORA_CASES]
)
def test_lora_under_selective_checkpointing_keeps_what_torch_stores(overrides, trace_hf) -> None:
    wl = WorkloadSpec(batch_size=2, seq_len=64, checkpointing="selective", **overrides)
    _compare(trace_hf, TINY["llama"], wl, net_tolerance=SAC_LORA_NET_TOLERANCE)


#: Activation checkpointing with SGD (no optimizer states: the backward is the peak, and a
#: checkpointed layer's recomputation decides it). torch's non-reentrant checkpoint keeps the
#: layer's input until the layer's backward is done, recomputes up to the last tensor the forward
#: saved (early stop) and keeps nothing else the recomputation made; AddBackward hands its
#: gradient on without a copy (Falcon's and GPT-NeoX's parallel attention add twice). A recomputed
#: output left behind per layer was +2 to +5.5 % of these net peaks (Llama +2.0 %, GPT-2 +2.1 %,
#: BLOOM +2.2 %, Falcon-RW +3.3 %, GPT-NeoX +4.4 %, ViT +5.1 %, Falcon +5.5 %); measured within
#: 0.7 %, hence 1 %.
CHECKPOINT_CASES = [  # pure bf16 as validated; the llama amp case covers bf16-mixed
    ("llama", {"checkpointing": "full", "precision": "bf16-true"}),
    ("llama", {"checkpointing": "selective", "precision": "bf16-true"}),
    # torchtitan's per-op SAC: attention outputs and every other mm of the block stored
    ("llama", {"checkpointing": "selective-op", "precision": "bf16-true"}),
    ("llama", {"checkpointing": "selective-op", "precision": "amp-bf16"}),
    ("llama", {"checkpointing": "full", "precision": "amp-bf16"}),
    ("gpt2", {"checkpointing": "full", "precision": "bf16-true"}),
    ("neox", {"checkpointing": "full", "precision": "bf16-true"}),
    ("vit", {"checkpointing": "full", "precision": "bf16-true"}),
    ("falcon", {"checkpointing": "full", "precision": "bf16-true"}),
    ("falcon-rw", {"checkpointing": "full", "precision": "bf16-true"}),
    ("bloom", {"checkpointing": "full", "precision": "bf16-true"}),
]
CHECKPOINT_NET_TOLERANCE = 0.01


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=[_ids(c) for c in CHECKPOINT_CASES])
def test_checkpointed_layers_recompute_what_torch_recomputes(case, trace_hf) -> None:
    family, overrides = case
    wl = WorkloadSpec(batch_size=2, seq_len=64, optimizer="sgd", **overrides)
    _compare(trace_hf, TINY[family], wl, net_tolerance=CHECKPOINT_NET_TOLERANCE)


@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_checkpointed_forward_under_autocast_keeps_the_cached_weight_casts(
    checkpointing, trace_hf
) -> None:
    """Autocast caches the half casts of the trainable weights until it exits (the end of the
    forward). A checkpointed layer's forward saves nothing, so that cache alone holds every
    layer's casts at the end of the forward: the forward phase's peak was -10 % (full; -20 %
    with SGD) without them. Same 1 % as above (measured: within 0.2 %)."""
    wl = WorkloadSpec(
        batch_size=2, seq_len=64, precision="amp-bf16", optimizer="sgd", checkpointing=checkpointing
    )
    traced = trace_hf(TINY["llama"], wl, name="llama")
    analytic = estimate_analytic(TINY["llama"], wl)
    fixed = _fixed_bytes(wl)
    a, t = (e.phases["forward"].peak_allocated_bytes - fixed for e in (analytic, traced))
    assert abs(a / t - 1) <= CHECKPOINT_NET_TOLERANCE, (a, t)


@pytest.mark.parametrize("overrides", DIST_CASES, ids=[_ids(("mid", c)) for c in DIST_CASES])
def test_multi_gpu_rank_peak_is_within_tolerance_of_the_trace(overrides, trace_hf) -> None:
    # the precision each case was validated in: pure bf16, and ZeRO's own (16-bit model, fp32
    # masters: bf16-mixed) under DeepSpeed
    zero = str(overrides.get("shard", "")).startswith("zero")
    precision = "bf16-mixed" if zero else "bf16-true"
    wl = WorkloadSpec(**{"batch_size": 1, "seq_len": 32, "precision": precision, **overrides})
    _compare(trace_hf, TINY["mid-llama"], wl)


def test_tensor_parallel_refuses_heads_it_cannot_split() -> None:
    from memfit.errors import SpecError

    config = dict(TINY["mid-llama"], num_key_value_heads=3, num_attention_heads=6)
    with pytest.raises(SpecError, match=r"tp \(4\) must divide num_attention_heads \(6\)"):
        estimate_analytic(config, WorkloadSpec(gpus=4, tp=4))


#: CUDA's reduction staging (``memfit.estimate.cuda_reduce``): at 2048 tokens the bias gradients
#: of the tiny BERT take staging blocks at its backward peak; both engines add them by the same
#: rule (the trace: ``cuda_emulation.reduction_workspaces`` on every ``sum``; the analytic engine:
#: ``ops.sum_to_staging_bytes`` on bias and broadcast gradients). The tiny Llama's RMSNorm
#: staging is not at its backward peak at this size (the check below would say so).
STAGING_CASES = [("bert", {})]


@pytest.mark.slow
@pytest.mark.parametrize("case", STAGING_CASES, ids=[_ids(c) for c in STAGING_CASES])
def test_both_engines_add_the_same_cuda_reduction_staging(case, trace_hf, monkeypatch) -> None:
    from memfit.estimate.analytic import ops
    from memfit.estimate.trace import cuda_emulation
    from memfit.hardware.catalog import get_gpu

    family, overrides = case
    gpu = get_gpu("H200")
    wl = WorkloadSpec(**{"batch_size": 8, "seq_len": 256, "precision": "bf16-true", **overrides})

    def peaks() -> tuple[int, int]:
        from memfit.estimate.analytic import api, engine

        # the patch below changes what a block allocates: nothing kept from the first run
        engine._BLOCKS.clear()
        api._SIMULATIONS.clear()
        traced = trace_hf(TINY[family], wl, name=family, gpu=gpu)
        analytic = estimate_analytic(TINY[family], wl, gpu=gpu)
        return (
            traced.phases["backward"].peak_allocated_bytes,
            analytic.phases["backward"].peak_allocated_bytes,
        )

    with_rule = peaks()
    monkeypatch.setattr(cuda_emulation, "_REDUCE_OPS", {})
    monkeypatch.setattr(ops, "sum_to_staging_bytes", lambda n_rows, n_cols: 0)
    without = peaks()
    traced_added, analytic_added = (a - b for a, b in zip(with_rule, without, strict=True))
    assert traced_added > 0, "the staging does not reach this backward peak: enlarge the job"
    assert abs(with_rule[1] / with_rule[0] - 1) <= TOLERANCE
    # the same blocks at the same peak: equal to within the allocator's 512 B rounding
    assert abs(analytic_added - traced_added) <= 1024, (traced_added, analytic_added)


#: ViT's classifier is as wide as the config's labels: ``ViTForImageClassification`` is built
#: with them (trace/build.py forces 2 only for sequence classification), 1000 for the ImageNet
#: checkpoints. The analytic program had two (as BERT's head): ViT-base cut to 2 layers was
#: -4.29 % checkpointed, -2.6 % trained (docs/accuracy.md §20) — the classifier's weight,
#: gradient, two AdamW states and its foreach temporary. Checkpointing and AdamW as that grid
#: row; 1 % net as the checkpointing cases above.
VIT_LABEL_CASES = [
    {"checkpointing": "full", "precision": "bf16-true"},
    {"precision": "bf16-true"},
    {"mode": "infer", "precision": "bf16-true"},
]


@pytest.mark.parametrize(
    "overrides", VIT_LABEL_CASES, ids=[_ids(("vit", c)) for c in VIT_LABEL_CASES]
)
def test_vit_classifier_is_as_wide_as_the_configs_labels(overrides, trace_hf) -> None:
    config = dict(TINY["vit"], num_labels=1000)
    wl = WorkloadSpec(**{"batch_size": 3, "seq_len": 64, **overrides})
    _compare(trace_hf, config, wl, net_tolerance=CHECKPOINT_NET_TOLERANCE)
    with_map = dict(TINY["vit"], id2label={str(i): f"c{i}" for i in range(7)})
    assert estimate_analytic(with_map, wl).n_params == trace_hf(with_map, wl, name="m").n_params


#: ViT-base's grid rows (docs/accuracy.md §20: the bundled config cut to 2 layers, batch 5, pure
#: bf16, AdamW), trained and checkpointed: -2.57 % and -4.29 % before the classifier had the
#: config's 1000 labels, +0.85 % trained while ``last_hidden_state`` was held to the end of the
#: step; measured within 0.006 % since (the allocator's 512 B rounding), hence 0.1 %.
VIT_BASE_TOLERANCE = 0.001


@pytest.mark.slow  # two traces of ViT-base's real widths: about 40 s here
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_vit_base_grid_rows_match_the_trace(checkpointing, trace_hf) -> None:
    from memfit.models import resolve_model

    config = dict(resolve_model("vit-base-patch16-224").config, num_hidden_layers=2)
    wl = WorkloadSpec(batch_size=5, seq_len=128, precision="bf16-true", checkpointing=checkpointing)
    traced = trace_hf(config, wl, name="vit-base")
    analytic = estimate_analytic(config, wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    assert abs(error) <= VIT_BASE_TOLERANCE, (analytic.peak_allocated_bytes, error)


#: LoRA under full checkpointing on the encoders' grid rows (2 layers, batch 5, bf16): peft's
#: ``enable_input_require_grads`` makes the frozen input embedding's output require grad, so the
#: ops after it save their inputs (issue 32: -1.43 % roberta-base, -1.23 % vit-base without it).
@pytest.mark.slow  # two traces at real widths: about 40 s here
@pytest.mark.parametrize("name", ["roberta-base", "vit-base-patch16-224"])
def test_encoder_lora_under_checkpointing_matches_the_trace(name, trace_hf) -> None:
    from memfit.models import resolve_model

    config = dict(resolve_model(name).config, num_hidden_layers=2)
    wl = WorkloadSpec(
        batch_size=5, seq_len=128, precision="bf16-true", lora_rank=8, checkpointing="full"
    )
    traced = trace_hf(config, wl, name=name)
    analytic = estimate_analytic(config, wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    assert abs(error) <= VIT_BASE_TOLERANCE, (analytic.peak_allocated_bytes, error)


#: FSDP2 as torchtitan runs it (``spec.rules.FSDP_MIXED_POLICY``): the trace applies the real
#: ``fully_shard(mp_policy=MixedPrecisionPolicy(bf16, fp32), reshard_after_forward=...)`` over an
#: fp32 model on a fake (replicate x) shard mesh; the analytic rank view is the closed form.
FSDP_POLICY_CASES = [
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-mixed"},
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-mixed", "reshard_after_forward": False},
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-mixed", "reshard_after_forward": 2},
    {"gpus": 8, "shard": "fsdp", "precision": "bf16-mixed", "dp_replicate": 2},
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-true", "reshard_after_forward": False},
]


@pytest.mark.parametrize(
    "overrides", FSDP_POLICY_CASES, ids=[_ids(("mid", c)) for c in FSDP_POLICY_CASES]
)
def test_fsdp2_mixed_precision_policy_reshard_and_hsdp_agree_with_the_trace(
    overrides, trace_hf
) -> None:
    wl = WorkloadSpec(**{"batch_size": 1, "seq_len": 32, **overrides})
    if wl.precision != "bf16-mixed":
        _compare(trace_hf, TINY["mid-llama"], wl)
        return
    # shardgrid (issue 32): the root group's LM-head gradient is held unsharded from its
    # backward to the final callback (analytic/distributed.py::_fsdp); the rank view places it
    # at every block's backward point, where this 2-layer model's peak is set by the block's
    # most gathered copies: +3.2 ... +3.7 % (before: +2.5 %), never under the trace
    traced = trace_hf(TINY["mid-llama"], wl, name="case")
    analytic = estimate_analytic(TINY["mid-llama"], wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    assert 0 <= error <= FSDP_MIXED_OVER, error
    assert analytic.host_memory_bytes == pytest.approx(traced.host_memory_bytes, rel=0.01)


#: The most the bf16-mixed FSDP2 cases above may lie over the trace (measured +3.7 % at most).
FSDP_MIXED_OVER = 0.04


#: FSDP2 under the bf16 / fp32 policy where the closed form is a little above the trace (never
#: below): CPUOffloadPolicy (the running and the prefetched block placed at every backward point
#: where the trace's peak holds one: measured +4.9 %), LoRA adapters on an fp32-at-rest base
#: (+4.3 %), and FSDP over a tensor-parallel rank (+4.4 %). Host RAM agrees.
FSDP_OVER_CASES = [
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-mixed", "offload": "params"},
    {"gpus": 4, "shard": "fsdp", "precision": "bf16-mixed", "lora_rank": 4},
    {"gpus": 4, "tp": 2, "shard": "fsdp", "precision": "bf16-mixed"},
]


@pytest.mark.parametrize(
    "overrides", FSDP_OVER_CASES, ids=[_ids(("mid", c)) for c in FSDP_OVER_CASES]
)
def test_fsdp2_mixed_policy_closed_form_is_at_most_6_percent_above_the_trace(
    overrides, trace_hf
) -> None:
    wl = WorkloadSpec(**{"batch_size": 1, "seq_len": 32, **overrides})
    traced = trace_hf(TINY["mid-llama"], wl, name="case")
    analytic = estimate_analytic(TINY["mid-llama"], wl)
    error = analytic.peak_allocated_bytes / traced.peak_allocated_bytes - 1
    assert 0 <= error <= 0.06, error
    assert analytic.host_memory_bytes == pytest.approx(traced.host_memory_bytes, rel=0.01)


#: ZeRO++ hpZ (``zero_hpz_partition_size``): a 16-bit secondary partition of every partitioned
#: ZeRO-3 parameter over the hpZ group, on the device or with the offloaded parameters.
HPZ_CASES = [
    {"gpus": 8, "shard": "zero3", "zero_hpz_partition_size": 4},
    {"gpus": 8, "shard": "zero3", "zero_hpz_partition_size": 2, "offload": "params"},
    {"mode": "infer", "gpus": 8, "shard": "zero3", "new_tokens": 3, "zero_hpz_partition_size": 4},
]


@pytest.mark.parametrize("overrides", HPZ_CASES, ids=[_ids(("mid", c)) for c in HPZ_CASES])
def test_zero_plus_plus_hpz_secondary_partition_agrees_with_the_trace(overrides, trace_hf) -> None:
    precision = "bf16-mixed" if overrides.get("mode", "train") == "train" else "bf16-true"
    wl = WorkloadSpec(**{"batch_size": 1, "seq_len": 32, "precision": precision, **overrides})
    _compare(trace_hf, TINY["mid-llama"], wl)

"""Diffusion weight formats and offload groups against the libraries that apply them, on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402
from tests.estimate.diffusion.test_pipeline import FLUX, job, tiny_flux  # noqa: E402

from memfit.estimate.allocator.caching import CachingAllocatorSim  # noqa: E402
from memfit.estimate.diffusion.diffusers_import import diffusers_module  # noqa: E402
from memfit.estimate.diffusion.pipelines import estimate_pipeline  # noqa: E402
from memfit.estimate.diffusion.weights import layout  # noqa: E402


def _flux(dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    model: torch.nn.Module = diffusers_module().FluxTransformer2DModel.from_config(FLUX)
    return model.to(dtype)


def _device_bytes(t: torch.Tensor) -> int:
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_device_bytes(getattr(t, n)) for n in names)
    return int(t.numel() * t.element_size())


@pytest.fixture(scope="module")
def flux_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_flux(tmp_path_factory.mktemp("tiny-flux-weights"))


def test_layerwise_fp8_storage_matches_diffusers_enable_layerwise_casting() -> None:
    real = _flux()
    real.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    stored = sum(_device_bytes(t) for t in [*real.parameters(), *real.buffers()])
    lay = layout(_flux(), layerwise="fp8")
    assert lay.weights_bytes == stored
    assert lay.weights_bytes < layout(_flux()).weights_bytes
    # while a layer runs its weights are held in the compute dtype (bf16: 2 bytes)
    biggest = max(m.weight.numel() for m in _flux().modules() if isinstance(m, torch.nn.Linear))
    assert lay.transient_bytes >= biggest * 2


def _groups(model: torch.nn.Module) -> tuple[int, list[int]]:
    """(the unmatched group's bytes, each matched group's bytes) as diffusers built them."""
    groups = {}
    for mod in model.modules():
        registry = getattr(mod, "_diffusers_hook", None)
        hook = registry.get_hook("group_offloading") if registry is not None else None
        if hook is not None:
            groups[id(hook.group)] = hook.group
    unmatched, matched = 0, []
    for g in groups.values():
        tensors = {id(t): t for m in g.modules for t in [*m.parameters(), *m.buffers()]}
        tensors.update({id(t): t for t in [*(g.parameters or []), *(g.buffers or [])]})
        size = sum(_device_bytes(t) for t in tensors.values())
        if g.onload_leader is model:
            unmatched = size
        else:
            matched.append(size)
    return unmatched, matched


@pytest.mark.parametrize("per_group", [1, 2])
def test_block_level_groups_match_diffusers_apply_group_offloading(per_group: int) -> None:
    from diffusers.hooks import apply_group_offloading

    real = _flux()
    cpu = torch.device("cpu")
    apply_group_offloading(
        real,
        onload_device=cpu,
        offload_device=cpu,
        offload_type="block_level",
        num_blocks_per_group=per_group,
    )
    unmatched, matched = _groups(real)
    lay = layout(_flux(), num_blocks_per_group=per_group)
    assert lay.unmatched_bytes == unmatched
    assert lay.largest_block_bytes == max(matched)
    assert lay.group_resident_bytes("block_level", False) == unmatched + max(matched)
    assert lay.group_resident_bytes("block_level", True) == unmatched + 2 * max(matched)


def test_leaf_level_keeps_one_layer_twice_with_a_stream() -> None:
    lay = layout(_flux())
    assert lay.group_resident_bytes("leaf_level", False) == lay.largest_leaf_bytes
    assert lay.group_resident_bytes("leaf_level", True) == 2 * lay.largest_leaf_bytes
    assert lay.largest_leaf_bytes < lay.group_resident_bytes("block_level", False)


@pytest.mark.slow
def test_bitsandbytes_and_torchao_storage_match_the_real_quantized_tensors() -> None:
    """A Linear quantized on CPU by the libraries themselves (bitsandbytes >= 0.48 quantizes on
    CPU; torchao 0.18's configs) against layout(); bitsandbytes' 16-float NF4 code table is a
    per-layer constant memfit leaves out (64 bytes)."""
    bnb = pytest.importorskip("bitsandbytes")
    rows, cols = 256, 128
    lin = torch.nn.Linear(cols, rows, bias=False, dtype=torch.bfloat16)
    model = torch.nn.Sequential(lin)
    w4 = bnb.nn.Params4bit(
        lin.weight.data, requires_grad=False, quant_type="nf4", compress_statistics=False
    ).to("cpu")
    nf4_real = _device_bytes(w4) + _device_bytes(w4.quant_state.absmax)
    assert layout(model, quant="nf4").weights_bytes == nf4_real
    w8 = bnb.nn.Int8Params(lin.weight.data, requires_grad=False, has_fp16_weights=False).to("cpu")
    assert layout(model, quant="int8").weights_bytes == _device_bytes(w8) + _device_bytes(w8.SCB)
    tq = pytest.importorskip("torchao.quantization")
    for fmt, cfg in (
        ("torchao-int8wo", tq.Int8WeightOnlyConfig()),
        ("torchao-fp8wo", tq.Float8WeightOnlyConfig()),
    ):
        real = torch.nn.Sequential(torch.nn.Linear(cols, rows, bias=False, dtype=torch.bfloat16))
        tq.quantize_(real, cfg)
        assert layout(model, quant=fmt).weights_bytes == _device_bytes(real[0].weight), fmt


def test_a_quantizer_leaves_the_modules_it_is_told_to_skip() -> None:
    model = torch.nn.ModuleDict(
        {"wi": torch.nn.Linear(64, 64, bias=False), "wo": torch.nn.Linear(64, 64, bias=False)}
    ).to(torch.bfloat16)
    all_quantized = layout(model, quant="nf4").weights_bytes
    wo_kept = layout(model, quant="nf4", not_converted=("wo",)).weights_bytes
    assert wo_kept - all_quantized == 64 * 64 * 2 - (64 * 64 // 2 + 64 * 64 // 64 * 4)


def test_group_offload_holds_less_than_model_offload(flux_tree: Path) -> None:
    est = {
        (m, t, s): estimate_pipeline(
            flux_tree, job(offload=m, offload_type=t, use_stream=s), name="t"
        )
        for m, t, s in [
            ("model", "block_level", False),
            ("group", "block_level", False),
            ("group", "block_level", True),
            ("group", "leaf_level", False),
        ]
    }

    def denoise(key: tuple[str, str, bool]) -> int:
        return {s.stage: s for s in est[key].stages}["denoise"].resident_weights_bytes

    model = denoise(("model", "block_level", False))
    block = denoise(("group", "block_level", False))
    assert model > block
    assert denoise(("group", "block_level", True)) > block > denoise(("group", "leaf_level", False))
    assert all(
        e.host_weights_bytes == est[("model", "block_level", False)].host_weights_bytes
        for e in est.values()
    )


def test_quantizing_shrinks_the_denoiser_and_adds_its_dequantized_layer(flux_tree: Path) -> None:
    plain = estimate_pipeline(flux_tree, job(), name="t")
    q = estimate_pipeline(flux_tree, job(quant="nf4", text_encoder_quant="int8"), name="t")
    by = {c.name: c for c in q.components}
    base = {c.name: c for c in plain.components}
    assert by["transformer"].storage == "nf4" and by["vae"].storage == ""
    # --text-encoder-quant: the largest text encoder only (FLUX's T5; here the tiny CLIP)
    encoders = sorted(("text_encoder", "text_encoder_2"), key=lambda c: base[c].weights_bytes)
    assert [by[c].storage for c in encoders] == ["", "int8"]
    assert by["transformer"].weights_bytes < base["transformer"].weights_bytes
    assert by["transformer"].activation_peak_bytes == (
        base["transformer"].activation_peak_bytes + by["transformer"].transient_bytes
    )
    assert q.peak_bytes < plain.peak_bytes


def test_the_reserved_peak_covers_the_allocated_peak_in_every_offload_mode(
    flux_tree: Path,
) -> None:
    for mode in ("none", "model", "sequential", "group"):
        est = estimate_pipeline(flux_tree, job(offload=mode), name="t")
        assert est.peak_reserved_bytes is not None and est.loaded_reserved_bytes is not None
        assert est.peak_reserved_bytes >= est.loaded_reserved_bytes
        # the replay leaves out only the KiB of prompt embeddings carried between stages
        carried = max(s.carried_bytes for s in est.stages)
        assert est.peak_reserved_bytes + carried >= est.peak_bytes, mode


def test_empty_cache_gives_free_segments_back() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(1, 64 << 20)
    sim.free(1)
    assert sim.reserved_bytes == 64 << 20
    sim.empty_cache()
    assert sim.reserved_bytes == 0
    assert sim.result().peak_reserved_bytes == 64 << 20


def test_a_tied_weight_counts_once_in_the_unmatched_group() -> None:
    """T5EncoderModel: ``shared`` and ``encoder.embed_tokens`` are one tensor; block_level makes
    the whole encoder one unmatched group (its blocks are not top-level children)."""
    import transformers

    cfg = transformers.T5Config(d_model=32, d_ff=37, d_kv=16, num_layers=2, num_heads=2)
    with torch.device("meta"):
        t5 = transformers.T5EncoderModel(cfg)
    lay = layout(t5)
    assert lay.unmatched_bytes == lay.weights_bytes
    assert lay.largest_block_bytes == 0

"""``--float8``: torchao Float8 training in the per-rank closed form."""

import dataclasses

import pytest
import torch
from torch._functorch.partitioners import get_default_op_list

from memfit.errors import SpecError
from memfit.estimate.parallel.memory import (
    FLOAT8_BWD_CAST_BYTES,
    gathered_bytes,
    layer_activation_bytes,
    layout_of,
    rank_bytes,
)
from memfit.estimate.parallel.schedule import pipeline_ranks
from memfit.estimate.parallel.shape import read_shape
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


@pytest.fixture(scope="module")
def llama8():
    return read_shape(resolve_model("llama-3.1-8b").spec)


def _job(**kw):
    base = dict(gpus=8, shard="fsdp", batch_size=2, seq_len=8192, attention="flash")
    return WorkloadSpec(**{**base, **kw})


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchaos_float8_linear_saves_its_bf16_input_and_weight(recipe):
    """The closed form keeps a Float8 block's saved activations equal to the bf16 block's
    because torchao's Float8Linear saves the high-precision input and weight, not fp8 copies:
    checked by running torchao's own module (CPU) under saved-tensor hooks."""
    torch = pytest.importorskip("torch")
    float8 = pytest.importorskip("torchao.float8")
    linear = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False)).to(torch.bfloat16)
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    model = float8.convert_to_float8_training(linear, config=config)
    assert type(model[0]).__name__ == "Float8Linear"
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    assert saved == [((64, 256), torch.bfloat16), ((256, 512), torch.bfloat16)]


def _middle_stage(shape):
    """Pipeline rank 1 of 4: transformer layers only (no embeddings, no head)."""
    stage = pipeline_ranks(shape.n_layers, pp=4, schedule="1f1b", virtual_stages=1,
                           micro_batches=4)[1]  # fmt: skip
    assert not (stage.embedding or stage.head)
    return stage


@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
def test_float8_saves_what_bf16_saves_outside_op_sac(llama8, ckpt):
    bf16 = layout_of(_job(checkpointing=ckpt))
    fp8 = dataclasses.replace(bf16, float8="tensorwise")
    assert layer_activation_bytes(llama8, fp8, moe=False, how=ckpt) == layer_activation_bytes(
        llama8, bf16, moe=False, how=ckpt
    )


def test_under_op_sac_float8_keeps_every_linear_output(llama8):
    """torchtitan's policy saves aten._scaled_mm always and alternates only aten.mm: with
    Float8 all seven linear outputs of a Llama block are kept (wk 1024, wo 4096 and w3 14336
    elements per token more than bf16's every-other-mm)."""
    bf16 = layout_of(_job(checkpointing="selective-op"))
    fp8 = dataclasses.replace(bf16, float8="rowwise")
    extra = layer_activation_bytes(llama8, fp8, moe=False, how="selective-op")
    extra -= layer_activation_bytes(llama8, bf16, moe=False, how="selective-op")
    assert extra == bf16.tokens * (1024 + 4096 + 14336) * 2


def test_the_op_sac_float8_rule_rests_on_torchs_compute_intensive_list():
    """The rule above is torchtitan's since 114151ad4 (``OP_SAC_SAVES_FLOAT8_SINCE``), which builds
    its save set from torch's ``get_default_op_list().compute_intensive_ops``: that list must
    hold ``aten._scaled_mm`` (the op a Float8 linear runs) and not count it as an ``aten.mm``.
    Older torchtitan (9dec370, e7c0cae) listed ``aten.mm`` only: its Float8 points are not
    scored (benchmarks/multigpu_points.py)."""
    ops = get_default_op_list().compute_intensive_ops
    assert torch.ops.aten._scaled_mm in ops and torch.ops.aten._scaled_mm != torch.ops.aten.mm


def test_fp8_all_gather_gathers_the_blocks_in_one_byte(llama8):
    lay = layout_of(_job())
    middle = _middle_stage(llama8)
    bf16 = gathered_bytes(llama8, middle, lay)
    fp8 = gathered_bytes(llama8, middle, dataclasses.replace(lay, float8_all_gather=True))
    # per parameter of the biggest block: 2 x 2 (bf16 layers) + 2 + 4 (gradients) -> 2 x 1 + 6
    assert bf16 * 8 == fp8 * 10


def test_float8_adds_its_backward_casts_to_the_temporaries(llama8):
    lay = layout_of(_job(checkpointing="full"))
    middle = _middle_stage(llama8)
    plain = rank_bytes(llama8, middle, lay)
    fp8 = rank_bytes(llama8, middle, dataclasses.replace(lay, float8="tensorwise"))
    assert fp8.temporary_bytes - plain.temporary_bytes == (
        lay.tokens * 14336 * FLOAT8_BWD_CAST_BYTES
    )
    assert "Float8 casts" in fp8.temporary_kind


def test_float8_on_a_gpu_without_fp8_is_refused():
    from memfit.estimate.parallel import estimate_parallel
    from memfit.hardware.catalog import get_gpu

    with pytest.raises(SpecError, match=r"float8 \('tensorwise'\) on A100-80GB: .*--gpu"):
        estimate_parallel(
            resolve_model("llama-3.1-8b"), _job(float8="tensorwise"), gpu=get_gpu("A100-80GB")
        )


def test_fp8_all_gather_needs_tensorwise_under_fsdp():
    with pytest.raises(SpecError, match=r"float8_all_gather .*--float8 tensorwise and --shard"):
        _job(float8="rowwise", float8_all_gather=True)

"""``--compile`` in the per-rank closed form: the tensors torch.compile does not keep are taken
off each layer's saved activations (parallel/memory.py ``compile_dropped_elements``)."""

import dataclasses

import pytest

from memfit.errors import NotModelledError
from memfit.estimate import estimate
from memfit.estimate.parallel.memory import layer_activation_bytes, layout_of
from memfit.estimate.parallel.shape import read_shape
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

H, FFN = 4096, 14336  # Llama-3.1-8B


@pytest.fixture(scope="module")
def llama8():
    return read_shape(resolve_model("llama-3.1-8b").spec)


def _job(**kw):
    base = dict(gpus=8, shard="fsdp", batch_size=2, seq_len=8192, precision="bf16-mixed")
    return WorkloadSpec(**{**base, **kw})


def _layer(shape, w, how):
    return layer_activation_bytes(shape, layout_of(w), moe=False, how=how)


def test_op_checkpointing_drops_the_last_linear_output(llama8):
    """Under torchtitan's per-op SAC the measured partition keeps everything the policy saved
    but w2's output, which no backward reads: h per token (its reduce-scatter output h / t too
    under sequence parallelism)."""
    tokens = 2 * 8192
    eager = _layer(llama8, _job(checkpointing="selective-op"), "selective-op")
    compiled = _layer(llama8, _job(checkpointing="selective-op", compile=True), "selective-op")
    assert eager - compiled == tokens * H * 2
    sp = dict(gpus=64, tp=8, sequence_parallel=True, checkpointing="selective-op")
    eager = _layer(llama8, _job(**sp), "selective-op")
    compiled = _layer(llama8, _job(**sp, compile=True), "selective-op")
    assert eager - compiled == tokens * (H + H // 8) * 2


def test_no_checkpointing_drops_the_silu_output_only(llama8):
    """The closed form counts fused norms (no fp32 copies to drop): compile takes off the SiLU
    output, ffn / t per token."""
    w = _job(gpus=16, tp=2, sequence_parallel=True)
    eager = _layer(llama8, w, "none")
    compiled = _layer(llama8, dataclasses.replace(w, compile=True), "none")
    assert eager - compiled == 2 * 8192 * (FFN // 2) * 2


def test_full_checkpointing_keeps_the_input_either_way(llama8):
    w = _job(checkpointing="full")
    assert _layer(llama8, dataclasses.replace(w, compile=True), "full") == _layer(llama8, w, "full")


def test_a_float8_job_under_compile_is_answered_with_less_activations():
    """The closed form answers --float8 (torchtitan's runs): compile lowers its activations."""
    kw = dict(checkpointing="selective-op", float8="tensorwise")
    eager = estimate("llama-3.1-8b", _job(**kw), gpu="H100-80GB")
    compiled = estimate("llama-3.1-8b", _job(**kw, compile=True), gpu="H100-80GB")
    assert "closed form" in compiled.engine
    saved = eager.components["activations"] - compiled.components["activations"]
    assert saved == 32 * 2 * 8192 * H * 2
    assert any(n.startswith("compile under checkpointing selective-op") for n in compiled.notes)


def test_the_closed_form_refuses_an_unmeasured_block():
    wl = _job(checkpointing="selective-op", float8="tensorwise", compile=True)
    with pytest.raises(NotModelledError, match="compile with model_type 'mixtral'"):
        estimate("mixtral-8x7b", wl, gpu="H100-80GB")


def test_the_recomputed_layer_of_a_frozen_job_is_asked_about_as_the_analytic_engine_asks(llama8):
    """Full checkpointing + compile: the layer recomputed in backward is compiled only where its
    saved set is measured. A job with frozen layers is not (``compile_problem``: "frozen
    layers"); the closed form asked about a fully trained layer before, the analytic engine
    about the job's own — both now answer uncompiled for it, compiled for the unfrozen job."""
    from memfit.estimate.analytic.engine import _compile_measured
    from memfit.estimate.analytic.registry import read_arch
    from memfit.estimate.parallel.engine import _recompute_measured, per_rank

    # pipeline rank 0 of 2 holds no loss: its largest transient is the recomputed layer
    trained = _job(gpus=16, pp=2, grad_accum=2, checkpointing="full", compile=True)
    frozen = dataclasses.replace(trained, freeze_layers=4)
    assert _recompute_measured(llama8, trained)
    assert not _recompute_measured(llama8, frozen)
    arch = read_arch(resolve_model("llama-3.1-8b").config)
    for w in (trained, frozen):
        assert _recompute_measured(llama8, w) == _compile_measured(arch, w)

    def recompute_bytes(w):
        first = per_rank(llama8, w)[1][0]
        assert first.temporary_kind.startswith("one layer recomputed")
        return first.temporary_bytes

    eager = dataclasses.replace(trained, compile=False)
    assert recompute_bytes(trained) < recompute_bytes(eager)
    assert recompute_bytes(frozen) == recompute_bytes(dataclasses.replace(frozen, compile=False))

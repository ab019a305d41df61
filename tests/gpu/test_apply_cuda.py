"""memfit.apply on a CUDA GPU: bitsandbytes' CUDA kernels, paged optimizers, FlashAttention-2,
find_batch_size backing off on real OOMs. Skipped without CUDA: ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from tests.apply.conftest import batch, build  # noqa: E402
from tests.conftest import TINY_LLAMA  # noqa: E402

import memfit  # noqa: E402
from memfit.apply import AmpStep, training_step, verify_plan  # noqa: E402
from memfit.spec import WorkloadSpec  # noqa: E402


def _on_cuda(**workload):
    w = WorkloadSpec(batch_size=2, seq_len=16, **workload)
    model = memfit.apply_plan_(build(TINY_LLAMA).cuda(), w)
    return model, w


def _cuda_batch():
    return {k: v.cuda() for k, v in batch().items()}


def test_qlora_runs_bitsandbytes_cuda_kernels() -> None:
    pytest.importorskip("bitsandbytes")
    model, w = _on_cuda(quant="nf4-dq", lora_rank=4)
    base = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert type(base).__name__ == "Linear4bit" and base.weight.device.type == "cuda"
    opt = memfit.build_optimizer(model, w)
    loss = training_step(model, _cuda_batch(), opt, AmpStep(w, device_type="cuda"))
    assert torch.isfinite(torch.tensor(loss)) and verify_plan(model, w, optimizer=opt) == []


def test_paged_adamw_keeps_its_states_in_unified_memory() -> None:
    pytest.importorskip("bitsandbytes")
    model, w = _on_cuda(optimizer="paged-adamw-8bit", precision="fp32")
    opt = memfit.build_optimizer(model, w)
    training_step(model, _cuda_batch(), opt, AmpStep(w, device_type="cuda"))
    big = model.model.layers[0].mlp.up_proj.weight
    assert opt.state[big]["state1"].dtype == torch.uint8
    assert getattr(opt.state[big]["state1"], "is_paged", False)


def test_flash_attention_is_used_when_installed_or_named_when_missing() -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("FlashAttention-2 needs compute capability 8.0+")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(memfit.MissingDependencyError, match="pip install flash-attn"):
            _on_cuda(attention="flash")
        return
    model, w = _on_cuda(attention="flash")
    assert model.config._attn_implementation == "flash_attention_2"
    training_step(
        model, _cuda_batch(), memfit.build_optimizer(model, w), AmpStep(w, device_type="cuda")
    )


def test_find_batch_size_backs_off_on_real_ooms() -> None:
    w = WorkloadSpec(batch_size=1, seq_len=512, precision="bf16")
    model = memfit.apply_plan_(build(TINY_LLAMA).cuda(), w)
    opt = memfit.build_optimizer(model, w)
    amp = AmpStep(w, device_type="cuda")

    def make_batch(b: int, s: int) -> dict:
        ids = torch.randint(0, 500, (b, s), device="cuda")
        return {"input_ids": ids, "labels": ids}

    limit = 256 * 2**20
    r = memfit.find_batch_size(
        lambda b: training_step(model, b, opt, amp),
        make_batch=make_batch,
        model=model,
        optimizer=opt,
        plan=w,
        memory_limit_bytes=limit,
        start_batch_size=4096,
    )
    assert 0 < r.batch_size < 4096
    assert any(not a.ok for a in r.attempts)
    assert r.measured_reserved_bytes is not None and r.measured_reserved_bytes <= limit

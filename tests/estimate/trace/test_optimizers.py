"""The bitsandbytes stand-ins and transformers' Adafactor in the trace engine.

Three independent references: memfit's torch-free formulas (``optim_states``), the real
bitsandbytes optimizers run on fake tensors (their registered fake kernels allocate nothing, as
the fused CUDA kernels do), and the real bitsandbytes optimizers executed on real CPU tensors.
Tolerance: none.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
from tests.conftest import TINY_LLAMA

from memfit.estimate.optim_states import model_optimizer_state_bytes
from memfit.estimate.trace import steps
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec

#: Tiny Llama whose embedding and LM head (1000 × 128 = 128 000 elements) are above
#: bitsandbytes' paging threshold (10⁵ elements); every other matrix is above min_8bit_size.
PAGED_LLAMA = {**TINY_LLAMA, "vocab_size": 1000}
BNB_NAMES = ("adamw-8bit", "paged-adamw-8bit", "lion")


def _trace(optimizer: str, execution: str = "fake", **workload):
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 32, "optimizer": optimizer, **workload})
    return trace_hf(
        PAGED_LLAMA, wl, name="t", extrapolate=False, execution=execution, emulate_cuda=False
    )


def _shapes(config: dict) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    emb = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    normal = [tuple(p.shape) for p in model.parameters() if id(p) not in emb]
    return normal, [tuple(p.shape) for p in model.parameters() if id(p) in emb]


@pytest.mark.parametrize("optimizer", [*BNB_NAMES, "adafactor"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_traced_states_equal_the_formulas(optimizer: str, precision: str) -> None:
    est = _trace(optimizer, precision=precision)
    normal, embeddings = _shapes(PAGED_LLAMA)
    dtype = "bfloat16" if precision == "bf16" else "float32"
    want = model_optimizer_state_bytes(optimizer, normal, dtype, fp32_state_shapes=embeddings)
    assert est.phases["optimizer"].components["optimizer_states"] == want.total_bytes
    assert est.components["optimizer_states"] == want.total_bytes  # the peak is in step 2
    assert est.unified_memory_bytes == want.paged_bytes
    if optimizer == "paged-adamw-8bit":
        # embedding: two fp32 states (HF Trainer override); LM head: two uint8 states
        assert want.paged_bytes == 2 * 128_000 * 4 + 2 * 128_000
        assert any("paged" in n for n in est.notes)


def test_8bit_states_are_smaller_than_adamw_by_the_expected_amount() -> None:
    """Guard against a comparison that cannot fail: the optimizer really changes the trace."""
    adamw, adamw8 = _trace("adamw"), _trace("adamw-8bit")
    assert adamw8.components["optimizer_states"] < adamw.components["optimizer_states"]
    assert adamw8.peak_allocated_bytes < adamw.peak_allocated_bytes


# ------------------------------------------------------------------ the real bitsandbytes


@pytest.fixture
def bnb() -> Iterator[object]:
    bnb = pytest.importorskip("bitsandbytes")
    manager = bnb.optim.GlobalOptimManager.get_instance()
    manager.initialize()  # a process-wide singleton: keep overrides from leaking across tests
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Paged optimizers are not supported on CPU")
        yield bnb
    manager.initialize()


def _use_real_bnb(monkeypatch: pytest.MonkeyPatch, bnb: object, name: str) -> list[object]:
    """Make the traced step build the real bitsandbytes optimizer, configured as HF Trainer's
    ``create_optimizer`` does (embeddings registered for 32-bit states)."""
    optim = bnb.optim  # type: ignore[attr-defined]
    cls = {
        "adamw-8bit": optim.AdamW8bit,
        "paged-adamw-8bit": optim.PagedAdamW8bit,
        "lion": optim.Lion,
    }[name]

    def make(params, _name, model=None):  # type: ignore[no-untyped-def]
        opt = cls(params)
        built.append(opt)
        if name != "lion":
            for module in model.modules():
                if isinstance(module, torch.nn.Embedding):
                    optim.GlobalOptimManager.get_instance().register_module_override(
                        module, "weight", {"optim_bits": 32}
                    )
        return opt

    built: list[object] = []
    monkeypatch.setattr(steps, "make_optimizer", make)
    return built


@pytest.mark.parametrize("optimizer", BNB_NAMES)
def test_stand_in_equals_real_bitsandbytes_on_fake_tensors(
    optimizer: str, bnb: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bitsandbytes' own init_state on fake tensors, its fake kernels standing for the in-place
    CUDA kernels: every phase peak and component must equal the stand-in's."""
    stand_in = _trace(optimizer)
    built = _use_real_bnb(monkeypatch, bnb, optimizer)
    real = _trace(optimizer)
    assert built and all(type(o).__module__.startswith("bitsandbytes") for o in built)
    assert {k: v.to_json() for k, v in stand_in.phases.items()} == {
        k: v.to_json() for k, v in real.phases.items()
    }


@pytest.mark.parametrize("optimizer", BNB_NAMES)
def test_stand_in_states_equal_real_bitsandbytes_on_cpu(
    optimizer: str, bnb: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real training step on CPU tensors with the real optimizer: every phase peak and
    component equal to the byte. The CPU kernels' own fp32 temporaries run inside one custom op
    (``bitsandbytes::optimizer_update_*``), below the dispatch level the tracker sees, so this
    checks the states bitsandbytes allocates, not the CPU kernels' scratch (which CUDA lacks)."""
    fake = _trace(optimizer)
    built = _use_real_bnb(monkeypatch, bnb, optimizer)
    real = _trace(optimizer, execution="real")
    assert built and all(type(o).__module__.startswith("bitsandbytes") for o in built)
    assert {k: v.to_json() for k, v in fake.phases.items()} == {
        k: v.to_json() for k, v in real.phases.items()
    }
    assert real.components["optimizer_states"] > 0

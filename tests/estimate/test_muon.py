"""Muon (torch.optim.Muon on the hidden matrices, AdamW on the rest; issue 30): the state table,
the analytic engine against the trace, and the real optimizer run on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.conftest import TINY_LLAMA

import memfit
from memfit.apply.optimizers import optimizer_name
from memfit.estimate.optim_states import state_tensors
from memfit.estimate.trace.muon import MuonWithAdamW
from memfit.spec import WorkloadSpec

pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch < 2.9")

#: A Llama with matrices large enough for the optimizer step to be the peak at a short sequence.
WIDE = dict(TINY_LLAMA, hidden_size=512, intermediate_size=2048, num_attention_heads=8)


def test_state_table_momentum_for_matrices_adamw_for_the_rest() -> None:
    names = [t.name for t in state_tensors("muon", (512, 2048), "bfloat16")]
    assert names == ["momentum_buffer"]
    assert [t.name for t in state_tensors("muon", (512,), "bfloat16")] == [
        "exp_avg",
        "exp_avg_sq",
    ]
    embed = state_tensors("muon", (500, 512), "float32", fp32_states=True)  # the AdamW group
    assert [(t.name, t.n_bytes(1)) for t in embed] == [
        ("exp_avg", 500 * 512 * 4),
        ("exp_avg_sq", 500 * 512 * 4),
    ]


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wide-llama")
    (d / "config.json").write_text(json.dumps(WIDE))
    return d


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "32-true"])
def test_analytic_matches_the_trace_of_the_real_optimizer(wide_dir: Path, precision: str) -> None:
    """States exactly; the optimizer step's peak (Newton-Schulz's transients of the largest
    matrix) within 0.01 % (the engines differ elsewhere by the same ~1 KB)."""
    w = WorkloadSpec(precision=precision, optimizer="muon", batch_size=1, seq_len=8)
    a = memfit.estimate(str(wide_dir), w, engine="analytic")
    t = memfit.estimate(str(wide_dir), w, engine="trace")
    assert a.peak_phase == t.peak_phase == "optimizer"
    opt_a, opt_t = a.phases["optimizer"], t.phases["optimizer"]
    assert opt_a.components["optimizer_states"] == opt_t.components["optimizer_states"]
    assert opt_a.components["temporary"] == opt_t.components["temporary"]
    assert opt_a.peak_allocated_bytes == pytest.approx(opt_t.peak_allocated_bytes, rel=1e-4)


def test_the_real_optimizer_allocates_the_table_states_on_cpu(wide_dir: Path) -> None:
    """memfit.build_optimizer builds the pair; after one real step on CPU its state tensors are
    the table's: a momentum buffer per hidden matrix, AdamW's two for embeddings, head, norms."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(wide_dir))
    w = WorkloadSpec(precision="32-true", optimizer="muon", batch_size=1, seq_len=8)
    opt = memfit.build_optimizer(model, w)
    assert isinstance(opt, MuonWithAdamW) and optimizer_name(opt) == "muon"
    ids = torch.randint(0, WIDE["vocab_size"], (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    head = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    for name, p in model.named_parameters():
        to_adamw = id(p) in head or p.ndim != 2
        want = state_tensors("muon", tuple(p.shape), "float32", fp32_states=id(p) in head)
        got = {k: v for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.ndim}
        assert sorted(got) == sorted(t.name for t in want), name
        assert sum(v.numel() * v.element_size() for v in got.values()) == sum(
            t.n_bytes(1) for t in want
        ), name
        assert ("momentum_buffer" in got) is not to_adamw, name

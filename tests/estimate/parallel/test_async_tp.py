"""``--async-tp``: torch's micro-pipelined tensor parallelism (torchtitan
``enable_async_tensor_parallel``) in the per-rank closed form: a SymmetricMemory workspace outside
the caching allocator, in the device figure only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.estimate.parallel.engine import estimate_parallel
from memfit.estimate.parallel.memory import (
    SYMM_MEM_GRANULARITY_BYTES,
    async_tp_request_bytes,
    layout_of,
    symm_mem_workspace_bytes,
)
from memfit.estimate.parallel.shape import read_shape
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec
from memfit.units import MiB

#: Table 4's job (torchtitan benchmarks/llama3_h100_202412_torchtitan.md): 70B, FSDP 32 x TP 8,
#: local batch 16 x 8192, full AC, torch.compile, Float8.
TABLE4 = dict(gpus=256, tp=8, sequence_parallel=True, shard="fsdp", batch_size=16, seq_len=8192,
              checkpointing="full", compile=True, float8="tensorwise")  # fmt: skip


def _job(**kw):
    return WorkloadSpec(mode="train", **{**TABLE4, **kw})


class _Stream:
    """Stands in for a CUDA stream: torch's fused ops only order work on it."""

    def wait_stream(self, other):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _record_workspace_requests(monkeypatch, tp: int) -> list[int]:
    """Run torch's own fused-op code on CPU with the process group and SymmetricMemory faked,
    recording every ``min_size`` it asks ``get_symm_mem_workspace`` for."""
    torch = pytest.importorskip("torch")
    sm = pytest.importorskip("torch.distributed._symmetric_memory")
    from torch.distributed import distributed_c10d as c10d

    requests: list[int] = []

    class _Symm:
        world_size, rank = tp, 0

        def barrier(self, channel=0, timeout_ms=0):
            pass

        def get_buffer(self, rank, shape, dtype, storage_offset=0):
            return torch.zeros(tuple(shape), dtype=dtype)

    class _Group:
        def size(self):
            return tp

    def workspace(group_name, min_size):
        requests.append(min_size)
        return _Symm()

    monkeypatch.setattr(sm, "get_symm_mem_workspace", workspace)
    monkeypatch.setattr(sm, "_get_backend_stream", lambda priority=0: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    if hasattr(torch, "accelerator"):
        monkeypatch.setattr(torch.accelerator, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(c10d, "_resolve_process_group", lambda name: _Group())
    monkeypatch.setattr(c10d, "_get_group_size_by_name", lambda name: tp)
    return requests


def test_torchs_fused_ops_ask_for_the_workspace_the_closed_form_counts(monkeypatch):
    """A sequence-parallel block's fused ops, run through torch's own
    ``_fused_all_gather_matmul_impl`` / ``_fused_matmul_reduce_scatter_impl`` with Llama-3.1-8B's
    widths (tp 4, 2 x 64 tokens), ask the workspace for at most what
    :func:`async_tp_request_bytes` counts, and the largest request is exactly it."""
    torch = pytest.importorskip("torch")
    sm = pytest.importorskip("torch.distributed._symmetric_memory")
    tp, batch, seq = 4, 2, 64
    shape = read_shape(resolve_model("llama-3.1-8b").spec)
    requests = _record_workspace_requests(monkeypatch, tp)
    h, q, kv, ffn = shape.hidden, shape.q_dim // tp, shape.kv_dim // tp, shape.ffn // tp
    bf16 = torch.bfloat16

    def gather(k_out: list[int], width: int = h):  # norm output (sequence shard) -> matmuls
        shard = torch.zeros(batch, seq // tp, width, dtype=bf16)
        weights = [torch.zeros(width, n, dtype=bf16) for n in k_out]
        sm._fused_all_gather_matmul_impl(
            torch.ops.aten.mm.out, shard, weights, None, [{} for _ in weights],
            [None for _ in weights], 1, "tp", True,
        )  # fmt: skip

    def scatter(k_in: int):  # row-parallel matmul -> reduce-scatter along the sequence
        a = torch.zeros(batch, seq, k_in, dtype=bf16)
        sm._fused_matmul_reduce_scatter_impl(
            mm_out_op=torch.ops.aten.mm.out, A=a, B=torch.zeros(k_in, h, dtype=bf16), kwargs={},
            out_dtype=bf16, reduce_op="sum", scatter_dim=1, group_name="tp",
        )  # fmt: skip

    gather([q, kv, kv])  # attention norm -> wq, wk, wv
    scatter(q)  # wo
    gather([ffn, ffn])  # ffn norm -> w1, w3
    scatter(ffn)  # w2
    gather([ffn])  # backward: w2's incoming gradient gathered, times w2^T
    scatter(ffn)  # backward: w1's input gradient reduce-scattered
    lay = layout_of(
        WorkloadSpec(mode="train", gpus=tp, tp=tp, sequence_parallel=True, shard="fsdp",
                     batch_size=batch, seq_len=seq, compile=True, async_tp=True)
    )  # fmt: skip
    assert len(requests) == 6
    assert max(requests) == async_tp_request_bytes(shape, lay) == 2 * (batch * seq // tp) * h * 2


def test_the_workspace_is_in_the_device_figure_only():
    """Async TP adds its workspace to what nvidia-smi shows and nothing to allocated or
    reserved (driver memory the caching allocator never sees); the note and --json say so."""
    source, gpu = resolve_model("llama-3.1-70b"), get_gpu("H100")
    plain = estimate_parallel(source, _job(), gpu=gpu)
    fused = estimate_parallel(source, _job(async_tp=True), gpu=gpu)
    workspace = fused.device_used_bytes - plain.device_used_bytes
    # 2 x (16 x 8192 / 8 tokens) x 8192 wide x 2 bytes = 512 MiB, + signal pad, in 2 MiB pages
    assert workspace == 514 * MiB
    assert workspace % SYMM_MEM_GRANULARITY_BYTES == 0
    assert fused.peak_allocated_bytes == plain.peak_allocated_bytes
    assert fused.peak_reserved_bytes == plain.peak_reserved_bytes
    assert fused.trace["parallel"]["symm_mem_workspace_bytes"] == workspace
    assert plain.trace["parallel"]["symm_mem_workspace_bytes"] == 0
    assert any("SymmetricMemory workspace of 514.00 MiB" in n for n in fused.notes)
    assert "async TP" in fused.engine_reason


def test_the_workspace_grows_with_the_micro_batch_and_shrinks_with_tp():
    shape = read_shape(resolve_model("llama-3.1-70b").spec)
    lay = layout_of(_job(async_tp=True))
    base = symm_mem_workspace_bytes(shape, lay)
    assert symm_mem_workspace_bytes(shape, dataclasses.replace(lay, micro_batch=32)) > base
    assert symm_mem_workspace_bytes(shape, dataclasses.replace(lay, tp=16)) < base
    assert symm_mem_workspace_bytes(shape, dataclasses.replace(lay, async_tp=False)) == 0


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ({"compile": False}, r"async_tp without compile: .*Async TP requires 'model'.*--compile"),
        ({"sequence_parallel": False}, r"async_tp without sequence_parallel: .*add --sp"),
        ({"tp": 1, "sequence_parallel": False}, r"async_tp with tp 1: .*--tp > 1"),
    ],
)
def test_async_tp_without_what_it_needs_is_refused(drop, message):
    with pytest.raises(SpecError, match=message):
        _job(async_tp=True, **drop)


def test_the_cli_flag_answers_and_its_missing_compile_exits_2(capsys):
    base = ["estimate", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--sp", "--shard", "fsdp",
            "--seq", "4096", "--gpu", "H100", "--async-tp"]  # fmt: skip
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "async_tp without compile" in err and "Traceback" not in err
    assert main([*base, "--compile", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace"]["parallel"]["symm_mem_workspace_bytes"] > 0
    assert any("SymmetricMemory" in n for n in out["notes"])

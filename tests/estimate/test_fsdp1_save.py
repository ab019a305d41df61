"""FSDP1's checkpoint phase (``--fsdp-state-dict-type``): the spec's rules, the bytes of a
SHARDED_STATE_DICT save against Llama-2-70B's shapes, and the phase in an estimate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from benchmarks import fsdp1_sharded_save

from memfit.errors import SpecError
from memfit.estimate import fsdp1, fsdp1_save
from memfit.estimate.parallel.shape import read_shape
from memfit.estimate.policy import run_engine
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

GIB = 2**30
#: Llama-2-70B's decoder Linears (config.json: hidden 8192, 64 heads, 8 KV heads, intermediate
#: 28672, 80 layers, vocab 32000, untied head), by hand: q and o 8192 x 8192, k and v
#: 1024 x 8192, gate / up / down 28672 x 8192.
LLAMA2_70B_LINEAR_NUMEL = 2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192
LLAMA2_70B_EMBEDDINGS = 2 * 32000 * 8192


def _peft_qlora(**kw: object) -> WorkloadSpec:
    """peft's FSDP-QLoRA recipe (docs/source/accelerate/fsdp.md at 6008f272) on 2 GPUs."""
    base: dict[str, object] = dict(
        gpus=2,
        shard="fsdp",
        fsdp_version=1,
        fsdp_state_dict_type="SHARDED_STATE_DICT",
        accelerate_version="0.28",  # the recipe's: the copies stay on the GPU (hf_versions)
        grad_accum=2,
        batch_size=2,
        seq_len=2048,
        precision="bf16-true",
        checkpointing="full",
        lora_rank=8,
        lora_targets="all-linear",
        quant="nf4-dq",
    )
    return WorkloadSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_the_state_dict_type_is_an_fsdp1_setting() -> None:
    with pytest.raises(SpecError, match=r"fsdp_state_dict_type \('SHARDED_STATE_DICT'\) is FSDP1"):
        WorkloadSpec(gpus=2, shard="fsdp", fsdp_state_dict_type="SHARDED_STATE_DICT")
    with pytest.raises(SpecError, match=r"fsdp_state_dict_type \('LOCAL'\) must be one of"):
        WorkloadSpec(gpus=2, shard="fsdp", fsdp_version=1, fsdp_state_dict_type="LOCAL")
    with pytest.raises(SpecError, match=r"state-dict type of a training job's .*'infer'"):
        WorkloadSpec(
            mode="infer",
            gpus=2,
            shard="fsdp",
            fsdp_version=1,
            fsdp_state_dict_type="FULL_STATE_DICT",
        )


def test_fsdp1_takes_a_4bit_base_under_peft_wrap_only() -> None:
    assert _peft_qlora().fsdp_version == 1  # peft's wrap: frozen packed blocks, adapters apart
    with pytest.raises(SpecError, match=r"quant 'nf4-dq' and fsdp_lora_wrap 'block'"):
        _peft_qlora(fsdp_lora_wrap="block")


def test_a_sharded_save_clones_every_ranks_chunk_of_every_parameter() -> None:
    """Llama-2-70B in packed 4-bit (half a byte a weight, bf16 quant storage) and bf16
    embeddings / head: each rank's chunks are half of that on 2 ranks (independent arithmetic
    from the config's shapes; the adapters' chunks add 0.6 %, the allocator's 2 MiB rounding of
    each > 10 MiB chunk ~0.6 %: within 2 %)."""
    shape = read_shape(resolve_model("llama-2-70b").spec)
    w = _peft_qlora()
    b = fsdp1_save.save_bytes(shape, w, n_trainable=103_546_880)
    chunks = (80 * LLAMA2_70B_LINEAR_NUMEL // 2 + LLAMA2_70B_EMBEDDINGS * 2) / 2
    assert chunks < b.clone_bytes < chunks * 1.02
    # the root unit whole (embeddings + head, bf16) and one packed block whole
    assert b.root_bytes == pytest.approx(LLAMA2_70B_EMBEDDINGS * 2, rel=0.01)
    assert b.unit_bytes == pytest.approx(LLAMA2_70B_LINEAR_NUMEL / 2, rel=0.01)
    # on 4 ranks each rank's chunks halve; the whole root and block do not
    four = fsdp1_save.save_bytes(shape, _peft_qlora(gpus=4), n_trainable=103_546_880)
    assert four.clone_bytes == pytest.approx(b.clone_bytes / 2, rel=0.01)
    assert four.root_bytes == b.root_bytes


def test_accelerate_since_0_31_moves_each_copy_to_the_cpu_as_it_is_made() -> None:
    """accelerate >= 0.31 (and the installed one, None) gives SHARDED_STATE_DICT
    ``offload_to_cpu=True``: the GPU holds the largest single chunk, not their sum."""
    shape = read_shape(resolve_model("llama-2-70b").spec)
    old = fsdp1_save.save_bytes(shape, _peft_qlora(), n_trainable=103_546_880)
    chunks = fsdp1_save.chunk_bytes(shape, _peft_qlora(), 103_546_880)
    for version in (None, "0.31.0", "1.14"):
        w = _peft_qlora(accelerate_version=version)
        new = fsdp1_save.save_bytes(shape, w, n_trainable=103_546_880)
        # the largest chunk: a rank's half of the bf16 embedding (32000 x 8192 x 2 B / 2)
        assert new.clone_bytes == pytest.approx(max(chunks), rel=0.01)
        assert new.clone_bytes == pytest.approx(LLAMA2_70B_EMBEDDINGS // 2 * 2 / 2, rel=0.01)
        assert (new.root_bytes, new.unit_bytes) == (old.root_bytes, old.unit_bytes)
    assert fsdp1_save.save_bytes(shape, _peft_qlora(accelerate_version="0.30.1"), 0).clone_bytes > (
        16 * GIB
    )


def test_a_full_state_dict_goes_to_the_cpu_unit_by_unit() -> None:
    shape = read_shape(resolve_model("llama-2-70b").spec)
    b = fsdp1_save.save_bytes(shape, _peft_qlora(fsdp_state_dict_type="FULL_STATE_DICT"), 0)
    assert b.clone_bytes == 0 and b.root_bytes == 0
    assert b.unit_bytes == pytest.approx(LLAMA2_70B_EMBEDDINGS * 2, rel=0.01)  # the root, whole


def test_the_save_is_the_peak_of_an_offloaded_job_and_a_phase_of_every_fsdp1_save() -> None:
    """Any engine (the analytic one here, which has no 4-bit FSDP base: a bf16 LoRA job): with
    CPU offload the flat parameters live on the CPU, so the step holds little and the
    checkpoint's GPU copies are the job's peak."""
    source = resolve_model("llama-2-7b")
    w = _peft_qlora(offload="params", quant="none", batch_size=1, seq_len=512)
    step = run_engine("analytic", source, dataclasses.replace(w, fsdp_state_dict_type=None), None)
    saved = run_engine("analytic", source, w, None)
    assert fsdp1_save.PHASE not in step.phases
    phase = saved.phases[fsdp1_save.PHASE]
    b = fsdp1_save.save_bytes(read_shape(source.spec), w, saved.n_trainable_params)
    resident = fsdp1_save.resident_bytes(step, w)
    assert phase.peak_allocated_bytes == resident + b.total_bytes
    assert saved.peak_phase == fsdp1_save.PHASE
    assert saved.peak_allocated_bytes == phase.peak_allocated_bytes > step.peak_allocated_bytes
    assert saved.device_used_bytes == phase.peak_allocated_bytes + saved.cuda_context_bytes
    assert any(n.startswith("FSDP1 checkpoint (SHARDED_STATE_DICT") for n in saved.notes)
    assert saved.workload["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    # the training step itself is unchanged
    assert saved.phases["backward"] == step.phases["backward"]


def test_a_save_below_the_step_is_listed_not_the_peak() -> None:
    source = resolve_model("llama-2-7b")
    w = _peft_qlora(fsdp_state_dict_type="FULL_STATE_DICT", quant="none", offload="params")
    step = run_engine("analytic", source, dataclasses.replace(w, fsdp_state_dict_type=None), None)
    saved = run_engine("analytic", source, w, None)
    assert fsdp1_save.PHASE in saved.phases
    assert saved.peak_phase == step.peak_phase
    assert saved.device_used_bytes == step.device_used_bytes


def test_jobs_without_a_checkpoint_and_fsdp2_twins_are_untouched() -> None:
    w = _peft_qlora()
    assert fsdp1_save.applies(w)
    assert not fsdp1_save.applies(dataclasses.replace(w, fsdp_state_dict_type=None))
    assert fsdp1.fsdp2_twin(w).fsdp_state_dict_type is None  # the engines never see it
    assert (
        "fsdp_state_dict_type" not in dataclasses.replace(w, fsdp_state_dict_type=None).normalized()
    )


def test_the_cli_flag_reaches_the_workload(capsys: pytest.CaptureFixture[str]) -> None:
    from memfit.cli import main

    argv = ["estimate", "llama-3.2-1b", "--gpus", "2", "--shard", "fsdp", "--fsdp-version", "1"]
    argv += ["--fsdp-state-dict-type", "SHARDED_STATE_DICT", "--engine", "analytic", "--json"]
    assert main([*argv, "--accelerate-version", "0.28"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert out["workload"]["accelerate_version"] == "0.28"
    assert fsdp1_save.PHASE in out["phases"]


@pytest.mark.slow  # two spawned ranks importing transformers and peft: about a minute
def test_the_copies_match_torchs_fsdp1_sharded_state_dict(tmp_path: Path) -> None:
    """torch's own FSDP1 on two CPU ranks (benchmarks/fsdp1_sharded_save.py): the state dict
    holds a copy of each rank's chunk of every parameter. Tolerance: within 1 % of either rank
    (``chunk`` splits rows, so rank 0 holds up to one row more a tensor; memfit splits bytes)."""
    ranks = fsdp1_sharded_save.measure(port="29565")
    (tmp_path / "config.json").write_text(json.dumps(fsdp1_sharded_save.CONFIG))
    mine = fsdp1_sharded_save.memfit_chunks(ranks[0]["trainable"], tmp_path)
    for rank in ranks:
        assert rank["copy_bytes"] > 0
        assert mine == pytest.approx(rank["copy_bytes"], rel=0.01), (mine, ranks)

"""FSDP1 (``--fsdp-version 1``): the spec's rules, the terms memfit adds to FSDP2's answer, and
those terms against torch's own FSDP1 run on two CPU ranks (benchmarks/fsdp1_units.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import fsdp1_units

from memfit.errors import SpecError
from memfit.estimate import fsdp1
from memfit.estimate.policy import run_engine
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

GIB = 2**30


def _lit7b(**kw: object) -> WorkloadSpec:
    """LitGPT's 2023 LoRA run on 2 x A100 (benchmarks/data/multigpu_published.jsonl)."""
    base: dict[str, object] = dict(
        gpus=2,
        shard="fsdp",
        fsdp_version=1,
        fsdp_lora_wrap="block",
        grad_accum=64,
        seq_len=1304,
        precision="bf16-true",
        checkpointing="full",
        lora_rank=8,
        lora_targets=("q", "v"),
    )
    return WorkloadSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_fsdp_version_1_needs_shard_fsdp() -> None:
    with pytest.raises(SpecError, match=r"fsdp_version \(1\) .* needs --shard fsdp .*'zero3'"):
        WorkloadSpec(gpus=2, shard="zero3", fsdp_version=1)


def test_fsdp_version_takes_one_or_two() -> None:
    with pytest.raises(SpecError, match=r"fsdp_version \(3\) must be 1 .* or 2"):
        WorkloadSpec(gpus=2, shard="fsdp", fsdp_version=3)


def test_fsdp1_refuses_the_layouts_memfit_runs_on_fsdp2_by_name() -> None:
    with pytest.raises(SpecError, match=r"fsdp_version 1 with tp 2: .* --fsdp-version 2"):
        WorkloadSpec(gpus=4, tp=2, shard="fsdp", fsdp_version=1)
    with pytest.raises(SpecError, match=r"reshard_after_forward \(False\) .*SHARD_GRAD_OP"):
        WorkloadSpec(gpus=4, shard="fsdp", fsdp_version=1, reshard_after_forward=False)


def test_lora_wrap_is_an_fsdp1_setting() -> None:
    with pytest.raises(SpecError, match=r"fsdp_lora_wrap \('block'\) .* needs --fsdp-version 1"):
        WorkloadSpec(gpus=2, shard="fsdp", fsdp_lora_wrap="block", lora_rank=8)


def test_block_wrapped_lora_under_no_sync_holds_every_block_unsharded() -> None:
    """Llama-2-7B's 32 blocks hold 6,476,267,520 parameters (+ 4,194,304 LoRA): their bf16
    gradient on every rank is the 12.06 GiB of the data row's arithmetic (plus FSDP1's 16-byte
    alignment, a bound of at most 7 elements a tensor)."""
    source = resolve_model("llama-2-7b")
    w = _lit7b()
    units = fsdp1.units_of(source, w, 4_194_304)
    t = fsdp1.terms(units, w, 4_194_304)
    exact = (6_476_267_520 + 4_194_304) * 2
    assert 0 <= t.held_grad_bytes - exact <= 32 * 13 * 7 * 2 + 32 * 2
    # the synced step's sharded gradients cover the frozen weights too: half the blocks, bf16
    assert t.frozen_grad_bytes == pytest.approx(6_476_267_520, rel=1e-4)


def test_peft_wrapped_lora_leaves_the_blocks_frozen() -> None:
    source = resolve_model("llama-2-7b")
    w = _lit7b(fsdp_lora_wrap="peft")
    t = fsdp1.terms(fsdp1.units_of(source, w, 4_194_304), w, 4_194_304)
    assert t.held_grad_bytes == 4_194_304 * 2  # only the adapters' units require grad
    assert t.frozen_grad_bytes == 0


def test_one_micro_batch_holds_nothing_unsharded() -> None:
    source = resolve_model("llama-2-7b")
    w = _lit7b(grad_accum=1)
    t = fsdp1.terms(fsdp1.units_of(source, w, 4_194_304), w, 4_194_304)
    assert t.held_grad_bytes == 0 and t.frozen_grad_bytes > 0


def test_an_fsdp1_answer_is_the_fsdp2_answer_plus_the_held_gradients() -> None:
    """Any engine: run_engine answers the FSDP2 twin and adds FSDP1's terms (the analytic engine
    here, milliseconds)."""
    source = resolve_model("llama-3.1-8b")
    w = WorkloadSpec(
        gpus=8, shard="fsdp", fsdp_version=1, grad_accum=4, seq_len=2048, checkpointing="full"
    )
    two = run_engine("analytic", source, fsdp1.fsdp2_twin(w), None)
    one = run_engine("analytic", source, w, None)
    t = fsdp1.terms(fsdp1.units_of(source, w, two.n_trainable_params), w, two.n_trainable_params)
    assert one.phases["backward"].peak_allocated_bytes == (
        two.phases["backward"].peak_allocated_bytes + t.held_grad_bytes
    )
    assert one.peak_reserved_bytes >= two.peak_reserved_bytes + t.held_grad_bytes
    assert one.workload["fsdp_version"] == 1
    assert any(n.startswith("FSDP1 (FullyShardedDataParallel") for n in one.notes)
    # FSDP2's "held gradients not counted" warning does not apply: FSDP1's are counted
    assert any("zero_grad_set_to_none" in n for n in two.notes)
    assert not any("zero_grad_set_to_none" in n for n in one.notes)


def test_the_cli_flag_reaches_the_workload(capsys: pytest.CaptureFixture[str]) -> None:
    from memfit.cli import main

    argv = ["estimate", "llama-3.2-1b", "--gpus", "2", "--shard", "fsdp", "--fsdp-version", "1"]
    rc = main([*argv, "--grad-accum", "2", "--engine", "analytic", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["workload"]["fsdp_version"] == 1


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, object]]:
    return fsdp1_units.measure(port="29561")


@pytest.mark.slow  # two spawned ranks importing transformers and peft: about a minute
@pytest.mark.parametrize("case", fsdp1_units.CASES)
def test_the_terms_bound_torchs_fsdp1_from_above_within_its_alignment(
    case: str, measured: dict[str, dict[str, object]], tmp_path: Path
) -> None:
    """Tolerance: memfit never under the measured bytes, over by at most 0.2 % (its alignment
    bound of 3 fp32 elements a tensor, where FSDP1 pads only what each tensor's offset needs)."""
    (tmp_path / "config.json").write_text(json.dumps(fsdp1_units.CONFIG))
    ranks = measured[case]["ranks"]
    assert isinstance(ranks, list)
    mine = fsdp1_units.memfit_terms(case, ranks[0]["trainable"], tmp_path)
    for rank in ranks:
        for key in ("held", "synced"):
            assert 0 <= mine[key] - rank[key] <= 0.002 * rank[key], (case, key, mine, rank)

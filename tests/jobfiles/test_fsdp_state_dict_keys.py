"""accelerate's ``fsdp_state_dict_type`` in the user's own config: carried into the job under FSDP1
(the checkpoint-save phase of :mod:`memfit.estimate.fsdp1_save`; before accelerate 0.31 a
SHARDED_STATE_DICT save keeps its copies on the GPU, since then it moves them to the CPU), read
and said to change nothing under FSDP2, and the key ``check``'s fix writes when the save is what
does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.estimate.fsdp1_save import PHASE
from memfit.jobfiles import read_job
from memfit.jobfiles.distributed import FSDP2_SAVE_NOTE
from memfit.jobfiles.job import workload_of

EXAMPLES = Path(__file__).parent / "examples"

#: A full fine-tune of a 7B model whose step, with accelerate's parameter offload over 2 ranks,
#: is a few GiB, while a SHARDED_STATE_DICT save under accelerate < 0.31 copies each rank's half
#: of the fp32 weights (~14 GiB) on the GPU: a T4 holds the step but not that save. fp16, as a
#: T4 runs it (bf16 there is refused or emulated: a bf16 file's fix writes fp16 first).
ARGS = """\
model_name_or_path: Qwen/Qwen2.5-7B
per_device_train_batch_size: 1
max_length: 128
fp16: true
"""
ACCELERATE = """\
# accelerate config (FSDP1: no fsdp_version, accelerate's default)
distributed_type: FSDP
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_offload_params: true
  fsdp_state_dict_type: {sd_type}
{version}mixed_precision: fp16
num_processes: 2
"""


def _files(tmp_path: Path, sd_type: str, version: str = "") -> list[Path]:
    args = tmp_path / "args.yaml"
    args.write_text(ARGS)
    acc = tmp_path / "accelerate.yaml"
    acc.write_text(ACCELERATE.format(sd_type=sd_type, version=version))
    return [args, acc]


def _check(capsys, files: list[Path], *extra: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    argv = ["check", *map(str, files), "--gpu", "T4", "--engine", "analytic", "--json", *extra]
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


OLD = ("--accelerate-version", "0.30")  # before ShardedStateDictConfig(offload_to_cpu=True)


def test_a_sharded_state_dict_fsdp1_config_gets_the_save_phase_as_its_peak(capsys, tmp_path):
    files = _files(tmp_path, "SHARDED_STATE_DICT")
    job = read_job(files)
    w = workload_of(job)
    assert (w.fsdp_version, w.fsdp_state_dict_type) == (1, "SHARDED_STATE_DICT")
    assert job.fields["fsdp_state_dict_type"].key == "fsdp_config.fsdp_state_dict_type"
    code, out = _check(capsys, files, *OLD)
    est = out["estimate"]
    assert est["peak_phase"] == PHASE and PHASE in est["phases"]
    save = est["phases"][PHASE]["peak_allocated_bytes"]
    step = max(p["peak_allocated_bytes"] for k, p in est["phases"].items() if k != PHASE)
    assert save > step + 8 * 2**30  # the copies of ~14 GiB, the step a few GiB
    said = est["notes"][0]
    assert "this save is the job's peak (accelerate 0.30)" in said and "FULL_STATE_DICT" in said
    assert "accelerate >= 0.31" in said  # each way to avoid it is said
    assert code == 1  # does not fit on a T4 as written


def test_a_current_accelerate_moves_the_copies_off_the_gpu(capsys, tmp_path):
    """The installed accelerate's rules (>= 0.31): the same file's save holds one copy at a
    time (the largest: a rank's half of one fp32 embedding, 152064 x 3584 x 4 B / 2 = 1.02 GiB)
    beside the root unit and one unit whole; it fits on the T4, no fix."""
    code, out = _check(capsys, _files(tmp_path, "SHARDED_STATE_DICT"))
    _, old = _check(capsys, _files(tmp_path, "SHARDED_STATE_DICT"), *OLD)
    copies = out["estimate"]["phases"][PHASE]["components"]["temporary"]
    assert copies == pytest.approx(152064 * 3584 * 4 / 2, rel=0.01)
    assert old["estimate"]["phases"][PHASE]["components"]["temporary"] > 12 * copies
    assert any("its copies moved to the CPU one at a time" in n for n in out["estimate"]["notes"])
    assert code == 0 and out["fix"] is None


def test_a_full_state_dict_config_is_not_peaked_by_its_save(capsys, tmp_path):
    code, out = _check(capsys, _files(tmp_path, "FULL_STATE_DICT"), *OLD)
    est = out["estimate"]
    assert est["peak_phase"] != PHASE
    assert not any("this save is the job's peak" in n for n in est["notes"])
    assert code == 0


def test_the_fix_switches_the_files_own_key_and_write_applies_it(capsys, tmp_path):
    files = _files(tmp_path, "SHARDED_STATE_DICT")
    code, out = _check(capsys, files, *OLD)
    fix = out["fix"]
    assert fix["keys"] == [
        {
            "file": str(files[1]),
            "key": "fsdp_config.fsdp_state_dict_type",
            "old": "SHARDED_STATE_DICT",
            "new": "FULL_STATE_DICT",
        }
    ]
    assert fix["changes"] == {"fsdp_state_dict_type": "FULL_STATE_DICT"}
    assert files[0].read_text() == ARGS  # the training config untouched
    code, _ = _check(capsys, files, *OLD, "--write")
    assert code == 0
    text = files[1].read_text()
    assert "fsdp_state_dict_type: FULL_STATE_DICT" in text and text.startswith("# accelerate")
    code, again = _check(capsys, files, *OLD)
    assert code == 0 and again["fix"] is None and again["estimate"]["peak_phase"] != PHASE


def test_the_fsdp2_example_config_is_read_and_says_why_its_key_changes_nothing():
    job = read_job([EXAMPLES / "trl-sft-config.yaml", EXAMPLES / "accelerate-fsdp2.yaml"])
    w = workload_of(job)
    assert (w.shard, w.fsdp_version, w.fsdp_state_dict_type) == ("fsdp", 2, None)
    said = [x.message for x in job.warnings if x.key == "fsdp_config.fsdp_state_dict_type"]
    assert said == [FSDP2_SAVE_NOTE]


def test_fsdp2_without_the_key_says_nothing_about_it(tmp_path):
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\nnum_processes: 2\n")
    job = read_job([EXAMPLES / "trl-sft-config.yaml", acc])
    assert not [x for x in job.warnings if "state_dict" in x.key]


def test_the_enum_number_is_read_as_accelerate_reads_it_and_local_adds_no_phase(tmp_path):
    w = workload_of(read_job(_files(tmp_path, "3")))  # StateDictType(3): SHARDED_STATE_DICT
    assert w.fsdp_state_dict_type == "SHARDED_STATE_DICT"
    job = read_job(_files(tmp_path, "LOCAL_STATE_DICT"))
    assert workload_of(job).fsdp_state_dict_type is None
    assert any("no copy" in x.message for x in job.warnings)


def test_a_state_dict_type_accelerate_does_not_know_is_refused_by_key(tmp_path):
    with pytest.raises(SpecError, match=r"fsdp_config.fsdp_state_dict_type \('HALF'\) must be"):
        read_job(_files(tmp_path, "HALF"))


def test_shard_grad_op_reads_the_key_without_a_phase(tmp_path):
    files = _files(tmp_path, "SHARDED_STATE_DICT")
    text = files[1].read_text().replace("FULL_SHARD", "SHARD_GRAD_OP")
    files[1].write_text(text.replace("fsdp_offload_params: true", "fsdp_offload_params: false"))
    w = workload_of(read_job(files))
    assert (w.shard, w.fsdp_state_dict_type) == ("zero2", None)


def test_a_bad_accelerate_version_is_exit_2_naming_it(capsys, tmp_path):
    argv = ["check", *map(str, _files(tmp_path, "SHARDED_STATE_DICT")), "--gpu", "T4"]
    assert main([*argv, "--accelerate-version", "new"]) == 2
    assert "accelerate_version ('new') must be a version" in capsys.readouterr().err


#: HF TrainingArguments with FSDP1 (``fsdp_config.version: 1``): transformers hands
#: ``fsdp_config.state_dict_type`` to accelerate's plugin (default FULL_STATE_DICT).
TRAINER = """\
model_name_or_path: Qwen/Qwen2.5-7B
per_device_train_batch_size: 1
max_length: 128
fp16: true
fsdp: "full_shard offload auto_wrap"
fsdp_config:
  version: {version}
  state_dict_type: SHARDED_STATE_DICT
"""


def test_trainer_fsdp1_state_dict_type_is_carried_and_its_fix_is_that_key(capsys, tmp_path):
    args = tmp_path / "args.yaml"
    args.write_text(TRAINER.format(version=1))
    job = read_job([args], gpus=2)
    w = workload_of(job)
    assert (w.fsdp_version, w.offload, w.fsdp_state_dict_type) == (
        1,
        "params",
        "SHARDED_STATE_DICT",
    )
    assert job.fields["fsdp_state_dict_type"].key == "fsdp_config.state_dict_type"
    code, out = _check(capsys, [args], "--gpus", "2", *OLD)
    assert code == 1 and out["estimate"]["peak_phase"] == PHASE
    assert [(k["key"], k["new"]) for k in out["fix"]["keys"]] == [
        ("fsdp_config.state_dict_type", "FULL_STATE_DICT")
    ]


def test_trainer_fsdp2_state_dict_type_is_said_to_change_nothing(tmp_path):
    args = tmp_path / "args.yaml"
    args.write_text(TRAINER.format(version=2))
    job = read_job([args], gpus=2)
    assert workload_of(job).fsdp_state_dict_type is None
    said = [x.message for x in job.warnings if x.key == "fsdp_config.state_dict_type"]
    assert said == [FSDP2_SAVE_NOTE]

"""A LLaMA-Factory YAML is read in the dtypes LLaMA-Factory trains in (jobfiles/llamafactory.py):
the model loaded in the compute dtype (``bf16: true`` -> bfloat16) with the trainable adapters
upcast to fp32, except under DeepSpeed, which holds the 16-bit model and the fp32 masters itself
(hiyouga/LLaMA-Factory@c867e280 ``model/patcher.py`` ``patch_config``, ``model/adapter.py``
``init_adapter``). The files are LLaMA-Factory's own examples (examples/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit import WorkloadSpec, estimate
from memfit.cli import main
from memfit.errors import SpecError
from memfit.jobfiles import read_job, workload_of
from memfit.units import GB

EXAMPLES = Path(__file__).parent / "examples"
LORA = EXAMPLES / "llamafactory-llama3-lora-sft.yaml"
LORA_DS3 = EXAMPLES / "llamafactory-llama3-lora-sft-ds3.yaml"
FULL_DS3 = EXAMPLES / "llamafactory-llama3-full-sft-ds3.yaml"
FSDP_QLORA = EXAMPLES / "llamafactory-llama3-fsdp-qlora.yaml"
FSDP_LAUNCH = EXAMPLES / "llamafactory-accelerate-fsdp.yaml"
QLORA = EXAMPLES / "llamafactory-qwen3-lora-sft-otfq.yaml"
DS3 = EXAMPLES / "ds_z3_config.json"


def _job(*paths: Path):
    job = read_job(list(paths))
    return job, workload_of(job)


def _lf(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "lf.yaml"
    path.write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\ndo_train: true\n"
        "cutoff_len: 2048\nper_device_train_batch_size: 1\n" + body
    )
    return path


def test_a_lora_example_with_bf16_trains_a_bf16_base_and_says_why() -> None:
    job, w = _job(LORA)
    assert w.precision == "bf16-true" and w.lora_rank == 8
    said = [x.message for x in job.warnings if x.key == "bf16"]
    assert said and "LLaMA-Factory loads the model in its compute dtype" in said[0]
    assert "c867e280" in said[0]


def test_the_lora_example_holds_the_8b_base_in_two_bytes_per_parameter() -> None:
    """The frozen base of Llama-3.1-8B (8.03 B parameters, its model card) at 2 bytes, plus
    21 M fp32 adapters (rank 8 on every linear): ~16.1 GB; read as Hugging Face's Trainer alone
    runs ``bf16: true`` (an fp32 model) it was twice that, and the peak ~16 GB higher."""
    _, w = _job(LORA)
    asked = estimate("llama-3.1-8b", w, engine="analytic")
    assert 16.0 * GB < asked.components["parameters"] < 16.3 * GB
    trainer_reading = estimate(
        "llama-3.1-8b", WorkloadSpec(**{**w.__dict__, "precision": "bf16-mixed"}), engine="analytic"
    )
    saved = trainer_reading.peak_allocated_bytes - asked.peak_allocated_bytes
    assert saved > 15 * GB


def test_a_qlora_example_keeps_its_non_quantized_weights_in_bf16() -> None:
    _, w = _job(QLORA)
    assert (w.precision, w.quant, w.prepare_kbit) == ("bf16-true", "nf4-dq", False)


def test_under_deepspeed_zero3_the_reading_stays_deepspeeds_16_bit_model_with_fp32_masters() -> (
    None
):
    job, w = _job(LORA_DS3, DS3)
    assert (w.precision, w.shard) == ("bf16-mixed", "zero3")
    assert any("bf16-mixed under DeepSpeed ZeRO" in x.message for x in job.warnings)
    assert "under DeepSpeed zero3" in str(job.fields["precision"].raw)
    # the DeepSpeed file beside it is read once, by the reference
    _, alone = _job(LORA_DS3)
    assert (alone.precision, alone.shard) == ("bf16-mixed", "zero3")


def test_a_deepspeed_file_given_beside_the_yaml_is_the_same_reading() -> None:
    """LLaMA-Factory's QLoRA file with a ZeRO-2 config passed next to it (not named by its
    ``deepspeed`` key): DeepSpeed's 16-bit model with fp32 masters, not pure bf16 states."""
    _, w = _job(QLORA, EXAMPLES / "ds_z2_config.json")
    assert (w.precision, w.shard, w.quant) == ("bf16-mixed", "zero2", "nf4-dq")
    assert not [n for n in w.warnings() if "bf16-true with shard" in n]


def test_a_full_fine_tune_upcasts_its_weights_to_fp32() -> None:
    _, w = _job(FULL_DS3, DS3)
    assert (w.precision, w.lora_rank, w.shard) == ("bf16-mixed", None, "zero3")


def test_fsdp_qlora_with_its_accelerate_launcher_is_one_reading_not_a_disagreement() -> None:
    """FSDP does not change LLaMA-Factory's load dtype (only the device map); accelerate's
    ``mixed_precision: bf16`` is the autocast over that bf16 model."""
    _, w = _job(FSDP_QLORA, FSDP_LAUNCH)
    assert (w.precision, w.shard, w.quant, w.gpus) == ("bf16-true", "fsdp", "nf4-dq", 2)


def test_without_a_half_flag_lora_still_loads_the_base_in_16_bits(tmp_path) -> None:
    """``compute_dtype`` None: ``infer_optim_dtype`` picks bf16 (fp16 without bf16)."""
    _, w = _job(_lf(tmp_path, "finetuning_type: lora\n"))
    assert w.precision == "bf16-true"
    _, w = _job(_lf(tmp_path, "finetuning_type: lora\nfp16: true\n"))
    assert w.precision == "16-true"
    _, w = _job(_lf(tmp_path, "finetuning_type: full\n"))
    assert w.precision == "32-true"  # every trainable weight upcast to fp32, no autocast


def test_a_freeze_job_is_counted_over_and_says_so(tmp_path) -> None:
    body = "finetuning_type: freeze\nfreeze_trainable_layers: 8\nbf16: true\n"
    job = read_job([_lf(tmp_path, body)])
    w = workload_of(job, n_layers=32)
    assert (w.precision, w.freeze_layers) == ("bf16-mixed", 24)
    # both over-counts named: every weight in fp32, and the final norm / LM head trained
    assert any(
        "every weight in fp32" in x.message and "the final norm and an untied LM head" in x.message
        for x in job.warnings
    )


def test_pure_bf16_next_to_bf16_is_one_precision(tmp_path) -> None:
    _, w = _job(_lf(tmp_path, "finetuning_type: full\nbf16: true\npure_bf16: true\n"))
    assert w.precision == "bf16-true"


def test_bf16_and_fp16_together_are_still_refused(tmp_path) -> None:
    with pytest.raises(SpecError, match="at most one of bf16 and fp16"):
        _job(_lf(tmp_path, "finetuning_type: lora\nbf16: true\nfp16: true\n"))


def test_check_on_the_lora_example_fits_an_a100_40gb(capsys) -> None:
    """Read as an fp32 base it was 'tight' (38.5 GiB of 39.5); LLaMA-Factory's bf16 base fits."""
    code = main(["check", str(LORA), "--gpu", "A100-40GB", "--engine", "analytic", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"] is True


def test_a_bf16_true_edit_of_a_llamafactory_file_is_pure_bf16_its_own_key(tmp_path) -> None:
    """LLaMA-Factory has no load-dtype key (TRL's ``dtype`` would be refused as unknown): the
    written key is ``pure_bf16``, which reads back as bf16-true."""
    from memfit.jobfiles.edit import WRITERS

    path = _lf(tmp_path, "finetuning_type: full\nbf16: true\n")
    job = read_job([path])
    assert WRITERS["llamafactory"]("precision", "bf16-true", job.files[0]) == [("pure_bf16", True)]
    path.write_text(path.read_text() + "pure_bf16: true\n")
    assert workload_of(read_job([path])).precision == "bf16-true"

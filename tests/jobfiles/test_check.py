"""`memfit check` reads each framework's own config files into the job they describe."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import memfit
from memfit.cli import main
from memfit.errors import SpecError
from memfit.jobfiles import model_of, read_job, workload_of
from memfit.spec import WorkloadSpec

EXAMPLES = Path(__file__).parent / "examples"

#: Each example file and the job it describes, written by hand from the framework's docs.
EXPECTED = {
    "axolotl-llama3-qlora.yml": (
        "meta-llama/Llama-3.1-8B",
        dict(
            batch_size=2,
            grad_accum=4,
            seq_len=4096,
            precision="bf16-true",  # axolotl loads the base in bf16 when bf16 is on
            checkpointing="full",
            optimizer="paged-adamw-32bit",  # optimizer: paged_adamw_32bit
            attention="flash",
            lora_rank=32,
            lora_targets="all-linear",
            lora_dropout=0.05,  # lora_dropout: 0.05
            quant="nf4-dq",
            # prepare_model_for_kbit_training's fp32 upcast is undone by axolotl (its norms and
            # embeddings go back to torch_dtype for an adapter job): no prepare_kbit
            prepare_kbit=False,
        ),
    ),
    "torchtune-llama3_1-8B_qlora_single_device.yaml": (
        "meta-llama/Llama-3.1-8B",
        dict(
            batch_size=2,
            grad_accum=16,
            seq_len=2048,
            precision="bf16-true",
            checkpointing="full",
            optimizer="adamw-fused",
            lora_rank=8,
            lora_targets=("q", "v", "k", "o", "gate", "up", "down"),
            quant="nf4-dq",
            loss="chunked",  # loss: torchtune.modules.loss.LinearCrossEntropyLoss
        ),
    ),
    "litgpt-llama-3.1-8b-qlora.yaml": (
        "meta-llama/Meta-Llama-3.1-8B",
        dict(
            batch_size=2,
            grad_accum=4,
            seq_len=512,
            precision="bf16-true",
            optimizer="adamw",
            lora_rank=32,
            lora_targets=("q", "v"),
            lora_dropout=0.05,  # lora_dropout: 0.05
            quant="nf4",
        ),
    ),
    "llamafactory-qwen3-lora-sft-otfq.yaml": (
        "Qwen/Qwen3-0.6B",
        dict(
            batch_size=1,
            grad_accum=8,
            seq_len=2048,
            # LLaMA-Factory loads the model in its compute dtype, adapters upcast to fp32
            # (jobfiles/llamafactory.py)
            precision="bf16-true",
            checkpointing="full",
            optimizer="adamw-fused",
            lora_rank=8,
            lora_targets="all-linear",
            quant="nf4-dq",
        ),
    ),
    "trl-sft-config.yaml": (
        "Qwen/Qwen2.5-0.5B",
        dict(
            batch_size=4,
            grad_accum=4,
            seq_len=2048,
            precision="bf16-mixed",
            checkpointing="full",
            optimizer="adamw-fused",
            lora_rank=32,
            lora_targets="all-linear",
            lora_dropout=0.05,  # TRL ModelConfig's default under use_peft
        ),
    ),
}


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_example_file_reads_as_the_job_it_describes(name):
    job = read_job([EXAMPLES / name])
    model, kwargs = EXPECTED[name]
    assert model_of(job) == model
    assert workload_of(job) == WorkloadSpec(mode="train", **kwargs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_check_gives_the_estimate_of_that_job(capsys, name):
    model, kwargs = EXPECTED[name]
    # --engine analytic: torchtune / LitGPT files otherwise go through the framework's own code
    # when it is installed (tests/jobfiles/test_framework_routing.py)
    code, out = run_json(capsys, str(EXAMPLES / name), "--gpu", "L4", "--engine", "analytic")
    direct = memfit.estimate(
        model, WorkloadSpec(mode="train", **kwargs), gpu="L4", engine="analytic"
    )
    if name.startswith(("litgpt", "torchtune")):  # their own code runs the job: its band
        direct = direct.with_band("other-framework")
    expected = direct.to_json()
    for d in (out["estimate"], expected):
        d["trace"]["analytic"].pop("wall_s")  # a timing
    assert out["estimate"] == expected
    assert code == (0 if direct.fits.fits else 1)


def test_every_key_is_accounted_for():
    job = read_job([EXAMPLES / "axolotl-llama3-qlora.yml"])
    f = job.files[0]
    accounted = f.reader.used | set(f.reader.unknown())
    assert accounted == set(f.reader.flat)
    assert ("axolotl-llama3-qlora.yml", "learning_rate") in job.no_effect()
    warned = {w.key for w in job.warnings}
    assert "sample_packing" in warned  # `sample_packing: true`
    # `xformers_attention:` (empty), `fsdp:`, `deepspeed:`: unset in axolotl, no warning
    assert not warned & {"xformers_attention", "fsdp", "fsdp_config", "deepspeed"}
    assert {"xformers_attention", "fsdp"} <= f.reader.used


def test_an_unknown_key_is_listed_not_dropped(tmp_path):
    f = tmp_path / "a.yml"
    f.write_text("base_model: gpt2\nsequence_len: 128\nmicro_batch_size: 1\nmy_magic_key: 3\n")
    job = read_job([f])
    assert job.unknown() == [("a.yml", "my_magic_key")]


def test_training_config_plus_accelerate_config_combine():
    job = read_job([EXAMPLES / "trl-sft-config.yaml", EXAMPLES / "accelerate-fsdp2.yaml"])
    w = workload_of(job)
    assert (w.gpus, w.shard, w.batch_size, w.precision) == (2, "fsdp", 4, "bf16-mixed")
    assert job.fields["gpus"].key == "num_processes"


def test_files_that_disagree_are_refused_naming_both():
    with pytest.raises(
        SpecError,
        match=r"disagree on precision: bf16: True in trl-sft-config"
        r".*mixed_precision: 'fp16' in accelerate-deepspeed-zero3",
    ):
        read_job([EXAMPLES / "trl-sft-config.yaml", EXAMPLES / "accelerate-deepspeed-zero3.yaml"])


def test_a_deepspeed_file_named_by_the_training_config_is_read_with_it(tmp_path):
    shutil.copy(EXAMPLES / "ds_z2_config.json", tmp_path / "ds.json")
    cfg = tmp_path / "train.yaml"
    cfg.write_text((EXAMPLES / "trl-sft-config.yaml").read_text() + "deepspeed: ds.json\n")
    job = read_job([cfg])
    assert [f.format for f in job.files] == ["hf", "deepspeed"]
    # "auto" values defer to the training config; the stage is the DeepSpeed file's
    w = workload_of(job)
    assert (w.shard, w.batch_size, w.grad_accum) == ("zero2", 4, 4)


def test_a_missing_deepspeed_file_is_a_warning(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text((EXAMPLES / "trl-sft-config.yaml").read_text() + "deepspeed: nope.json\n")
    job = read_job([cfg])
    assert any("nope.json" in w.message for w in job.warnings)


def test_torchtune_overrides_apply_as_tune_run_takes_them():
    path = EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml"
    job = read_job([path], overrides=["batch_size=8", "tokenizer.max_seq_len=4096"])
    w = workload_of(job)
    assert (w.batch_size, w.seq_len) == (8, 4096)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("- a\n- b\n", "expected a mapping"),
        ("base_model: [unclosed\n", "not valid YAML"),
        ("foo: 1\nbar: 2\n", "not a format memfit reads"),
        ("base_model: gpt2\nmicro_batch_size: 0\nsequence_len: 64\n", "micro_batch_size .0. must"),
        ("base_model: gpt2\nmicro_batch_size: 1\n", "no sequence length"),
        ("base_model: gpt2\nsequence_len: 64\nadapter: dora\n", "adapter .'dora'. must be lora"),
    ],
)
def test_bad_files_are_exit_2_with_the_reason(tmp_path, capsys, text, match):
    f = tmp_path / "job.yml"
    f.write_text(text)
    assert main(["check", str(f)]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_the_fix_is_a_diff_of_the_users_own_file_and_write_applies_it(tmp_path, capsys):
    f = tmp_path / "axolotl.yml"
    shutil.copy(EXAMPLES / "axolotl-llama3-qlora.yml", f)
    before = f.read_text()
    # an RTX-4090: TIGHT as written, fits at micro-batch 1 (tests/jobfiles/test_check_fix.py
    # runs the other files and GPUs, with and without a fix)
    code, out = run_json(capsys, str(f), "--gpu", "RTX-4090")
    assert code == 1 and out["fix"]["diff"].startswith("--- a/" + str(f).lstrip("/"))
    assert f.read_text() == before  # nothing written without --write
    code, _ = run_json(capsys, str(f), "--gpu", "RTX-4090", "--write")
    after = f.read_text()
    assert code == 0 and after != before
    assert after.startswith("# From axolotl's")  # comments and layout kept
    assert len(after.splitlines()) == len(before.splitlines())  # keys replaced in place
    job = read_job([f])  # the written file reads back as the fixed job
    for field, value in out["fix"]["changes"].items():
        assert job.fields[field].value == value, field
    code, again = run_json(capsys, str(f), "--gpu", "V100-32GB")
    assert code == 0 and again["fix"] is None


# --- the load dtype next to bf16 / fp16, and keys that say "off" (issue 29, item 4) -----------

TRL = (EXAMPLES / "trl-sft-config.yaml").read_text()


def _trl(tmp_path, extra: str):
    f = tmp_path / "sft.yaml"
    f.write_text(TRL + extra)
    return read_job([f])


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("dtype: bfloat16\n", "dtype"),
        ("torch_dtype: bfloat16\n", "torch_dtype"),
        ("model_init_kwargs:\n  dtype: bfloat16\n", "model_init_kwargs.dtype"),
        ("model_init_kwargs:\n  torch_dtype: torch.bfloat16\n", "model_init_kwargs.torch_dtype"),
    ],
)
def test_a_bf16_load_dtype_beside_bf16_true_is_a_bf16_base_not_a_disagreement(tmp_path, extra, key):
    job = _trl(tmp_path, extra)
    assert job.fields["precision"].value == "bf16-true"
    assert job.fields["precision"].key == key
    assert not [w for w in job.warnings if "fp32 weights" in w.message]  # the load dtype is known


def test_an_fp16_load_dtype_with_bf16_autocast_is_a_16_bit_base(tmp_path):
    assert _trl(tmp_path, "dtype: float16\n").fields["precision"].value == "16-true"


def test_an_fp32_load_dtype_keeps_mixed_precision_without_the_fp32_warning(tmp_path):
    job = _trl(tmp_path, "dtype: float32\n")
    assert job.fields["precision"].value == "bf16-mixed"
    assert not [w for w in job.warnings if "fp32 weights" in w.message]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("fp16: true\n", r"sft.yaml: fp16 \(True\) with bf16: true: at most one of bf16 and fp16"),
        (
            "dtype: bfloat16\nmodel_init_kwargs:\n  dtype: float16\n",
            r"model_init_kwargs.dtype \('float16'\) contradicts dtype: 'bfloat16'",
        ),
    ],
)
def test_only_a_real_contradiction_is_refused(tmp_path, capsys, extra, match):
    with pytest.raises(SpecError, match=match):
        _trl(tmp_path, extra)
    f = tmp_path / "sft.yaml"
    assert main(["check", str(f), "--engine", "analytic"]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_axolotl_says_its_torch_dtype_key_is_overwritten(tmp_path):
    f = tmp_path / "a.yml"
    f.write_text((EXAMPLES / "axolotl-llama3-qlora.yml").read_text() + "torch_dtype: bfloat16\n")
    job = read_job([f])
    assert [w.key for w in job.warnings if "overwrites" in w.message] == ["torch_dtype"]
    assert not job.unknown()


@pytest.mark.parametrize(
    ("extra", "warned"),
    [
        ("packing: false\n", False),
        ("packing:\n", False),
        ('fsdp: ""\n', False),
        ("fsdp_config: {}\n", False),
        ("packing: true\n", True),
    ],
)
def test_a_trl_key_set_to_false_or_left_empty_is_unset(tmp_path, extra, warned):
    key = extra.split(":")[0]
    job = _trl(tmp_path, extra)
    assert (key in {w.key for w in job.warnings}) is warned
    assert not job.unknown()


@pytest.mark.parametrize(
    ("value", "warned"), [("", False), ("false", False), ("null", False), ("true", True)]
)
def test_an_axolotl_switch_left_empty_is_off(tmp_path, value, warned):
    f = tmp_path / "a.yml"
    text = (EXAMPLES / "axolotl-llama3-qlora.yml").read_text()
    f.write_text(text.replace("xformers_attention:\n", f"xformers_attention: {value}\n"))
    job = read_job([f])
    assert ("xformers_attention" in {w.key for w in job.warnings}) is warned


@pytest.mark.parametrize(
    ("flags", "precision", "key"),
    [
        ("bf16: auto\nfp16:\n", "bf16-true", "bf16"),
        ("bf16: false\nfp16: true\n", "16-true", "fp16"),
        ("bf16: false\nfp16: false\nbfloat16: true\n", "bf16-true", "bfloat16"),
        ("bf16: false\nfp16: false\n", "32-true", "bf16"),
    ],
)
def test_axolotl_loads_its_base_in_the_dtype_its_flags_resolve_to(tmp_path, flags, precision, key):
    f = tmp_path / "a.yml"
    text = (EXAMPLES / "axolotl-llama3-qlora.yml").read_text()
    f.write_text(text.replace("bf16: auto\nfp16:\n", flags))
    job = read_job([f])
    assert (job.fields["precision"].value, job.fields["precision"].key) == (precision, key)


def test_torchtune_optimizer_in_bwd_is_read_and_its_fix_never_accumulates(tmp_path, capsys):
    """torchtune's ``optimizer_in_bwd: True`` ("Requires gradient_accumulation_steps=1", its
    8B_full_single_device.yaml) is the job's, and the estimate drops the full set of gradients;
    ``check`` offers no edit that adds gradient accumulation (the job would refuse to start)."""
    path = tmp_path / "full.yaml"
    text = (EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml").read_text()
    text = text.replace("qlora_llama3_1_8b", "llama3_1_8b")
    path.write_text(text)
    overrides = ["gradient_accumulation_steps=1", "batch_size=1", "tokenizer.max_seq_len=256"]
    w_off = workload_of(read_job([path], overrides=overrides))
    w_on = workload_of(read_job([path], overrides=[*overrides, "optimizer_in_bwd=True"]))
    assert (w_off.optimizer_in_bwd, w_on.optimizer_in_bwd) == (False, True)
    off, on = (memfit.estimate("llama-3.1-8b", w, engine="analytic") for w in (w_off, w_on))
    # at most one node's gradients (the LM head's, 1 GiB) instead of all 16 GB
    assert on.components["gradients"] < off.components["gradients"] / 10
    with pytest.raises(SpecError, match="gradient_accumulation_steps: 2"):
        workload_of(
            read_job([path], overrides=["gradient_accumulation_steps=2", "optimizer_in_bwd=True"])
        )
    code, out = run_json(
        capsys, str(path), "gradient_accumulation_steps=1", "optimizer_in_bwd=True",
        "tokenizer.max_seq_len=2048", "--gpu", "L4", "--engine", "analytic",
    )  # fmt: skip
    assert code == 1
    assert "gradient_accumulation_steps" not in (out.get("fix") or {}).get("diff", "")


def test_check_says_the_paged_part_and_the_resident_need(tmp_path, capsys):
    """A full fine-tune with PagedAdamW8bit (torchtune's 8B_full_single_device, on a 48 GB card):
    the device figure includes the paged states, the verdict's need does not; both are said."""
    path = tmp_path / "full.yaml"
    text = (EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml").read_text()
    path.write_text(text.replace("qlora_llama3_1_8b", "llama3_1_8b"))
    argv = [
        "check", str(path), "gradient_accumulation_steps=1", "optimizer_in_bwd=True",
        "optimizer._component_=bitsandbytes.optim.PagedAdamW8bit", "tokenizer.max_seq_len=2048",
        "--gpu", "RTX-A6000", "--engine", "analytic",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "of it paged optimizer states — FITS on RTX-A6000" in out
    assert "resident (upper end)" in out and "in host RAM" in out

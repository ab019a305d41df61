"""`memfit check` reads torchtitan's TOML job files (torchtitan <= 0.2) into the job torchtitan
runs: the mesh from the [parallelism] degrees and the launcher's GPU count, FSDP2's mixed
precision policy, the pipeline's micro-batches, per-op SAC, Float8 and compile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from benchmarks.multigpu_points import command
from benchmarks.multigpu_points import load as load_points

from memfit.cli import main
from memfit.errors import SpecError
from memfit.estimate.parallel.layouts import LayoutChoice, LayoutPeak
from memfit.jobfiles import model_of, read_job, workload_of
from memfit.jobfiles.files import detect, parse_toml
from memfit.jobfiles.toml_edit import set_toml
from memfit.jobfiles.yaml_edit import EditRefusedError
from memfit.plan.layout_export import torchtitan_toml
from memfit.spec import WorkloadSpec

EXAMPLES = Path(__file__).parent / "examples"
ROOT = Path(__file__).resolve().parents[2]
#: The config.json of Llama 3.1 405B the repository carries (memfit bundles no 405B).
LLAMA_405B = ROOT / "benchmarks" / "configs" / "llama-3.1-405b"

#: torchtitan's reference configs (238fa9953) and the job each describes on the GPUs named,
#: written by hand from torchtitan's job_config.py / parallelize.py at that commit.
EXPECTED = {
    # 8 GPUs: dp_shard = -1 takes all 8 (FSDP2), MixedPrecisionPolicy(bf16, fp32), per-op SAC,
    # optimizer.implementation's default "fused"
    ("torchtitan-llama3_8b.toml", 8): (
        "llama-3.1-8b",
        dict(gpus=8, shard="fsdp", precision="bf16-mixed", batch_size=1, seq_len=8192,
             checkpointing="selective-op", optimizer="adamw-fused"),
    ),
    # 64 GPUs: tp 8 x dp_shard 8, TP with sequence parallelism, full AC, local batch 8
    ("torchtitan-llama3_70b.toml", 64): (
        "llama-3.1-70b",
        dict(gpus=64, tp=8, sequence_parallel=True, shard="fsdp", precision="bf16-mixed",
             batch_size=8, seq_len=8192, checkpointing="full", optimizer="adamw-fused"),
    ),
    # 128 GPUs: tp 8 x dp_shard 16, Float8 (tensorwise, fp8 all-gather), compile
    ("torchtitan-llama3_405b.toml", 128): (
        str(LLAMA_405B),
        dict(gpus=128, tp=8, sequence_parallel=True, shard="fsdp", precision="bf16-mixed",
             batch_size=2, seq_len=8192, checkpointing="full", optimizer="adamw-fused",
             float8="tensorwise", float8_all_gather=True, compile=True, async_tp=True),
    ),
}  # fmt: skip


def toml(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    head = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 4096\n'
    path = tmp_path / name
    path.write_text(head + text)
    return path


def job_of(tmp_path: Path, text: str, gpus: int | None = 8):
    job = read_job([toml(tmp_path, text)], gpus=gpus)
    return job, workload_of(job, n_layers=32)


def warnings_of(job) -> str:
    return " | ".join(w.describe() for w in job.warnings)


# ---------------------------------------------------------------- detection and reference files
@pytest.mark.parametrize("name", ["llama3_8b", "llama3_70b", "llama3_405b", "tt-t1-fsdp8"])
def test_the_reference_files_are_detected_as_torchtitan(name):
    path = EXAMPLES / f"torchtitan-{name}.toml"
    assert detect(parse_toml(path.read_text(), path), str(path)) == "torchtitan"
    text = path.read_text()
    assert text.startswith("# Source: github.com/pytorch/torchtitan")  # where it comes from


def test_a_toml_without_torchtitans_sections_is_not_a_format_memfit_reads(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n')
    with pytest.raises(SpecError, match="not a format memfit reads.*torchtitan TOML"):
        read_job([path])


def test_a_broken_toml_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[model\nname = 1\n")
    with pytest.raises(SpecError, match="job.toml: not valid TOML"):
        read_job([path])


@pytest.mark.parametrize(("name", "gpus"), sorted(EXPECTED))
def test_each_reference_config_reads_as_the_job_torchtitan_runs(name, gpus):
    model, kwargs = EXPECTED[name, gpus]
    job = read_job([EXAMPLES / name], gpus=gpus)
    override = str(LLAMA_405B) if "405b" in name else None
    assert model_of(job, override) == model
    assert workload_of(job, n_layers=126) == WorkloadSpec(mode="train", **kwargs)
    assert not job.unknown()  # every key of torchtitan's own file is known


def test_405b_is_refused_with_the_flag_that_names_a_model():
    job = read_job([EXAMPLES / "torchtitan-llama3_405b.toml"], gpus=128)
    with pytest.raises(
        SpecError, match=r"flavor '405B': memfit bundles no Llama 3.1 405B.*--model"
    ):
        model_of(job)


def test_the_405b_files_async_tp_is_read_not_warned_of():
    job = read_job([EXAMPLES / "torchtitan-llama3_405b.toml"], gpus=128)
    assert "async" not in warnings_of(job).lower()
    assert workload_of(job, n_layers=126).async_tp is True


#: torchtitan's key for async TP, and its 2024 spelling under [experimental] (9dec370)
ASYNC_TP_TABLES = {
    "parallelism": "[parallelism]\ntensor_parallel_degree = 2\n"
    "enable_async_tensor_parallel = true\n",
    "experimental": "[parallelism]\ntensor_parallel_degree = 2\n"
    "[experimental]\nenable_async_tensor_parallel = true\n",
}


@pytest.mark.parametrize("table", sorted(ASYNC_TP_TABLES))
def test_async_tp_is_read_with_tp_and_the_model_compiled(tmp_path, table):
    _, w = job_of(tmp_path, ASYNC_TP_TABLES[table] + "[compile]\nenable = true\n")
    assert (w.async_tp, w.tp, w.sequence_parallel, w.compile) == (True, 2, True, True)


@pytest.mark.parametrize(
    "compile_table",
    ["", "[compile]\nenable = false\n", '[compile]\nenable = true\ncomponents = ["loss"]\n'],
)
def test_async_tp_without_the_model_compiled_is_refused_as_torchtitan_refuses_it(
    tmp_path, compile_table
):
    text = (
        "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
        + compile_table
    )
    with pytest.raises(SpecError, match=r"enable_async_tensor_parallel \(True\) needs the model "
                       r"compiled: torchtitan raises .Async TP requires 'model'"):  # fmt: skip
        job_of(tmp_path, text)


def test_a_2024_file_with_async_tp_and_no_compile_is_told_its_own_compile_key(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 1\n'
        "tensor_parallel_degree = 2\ncompile = false\n"
        "[experimental]\nenable_async_tensor_parallel = true\n"
    )
    with pytest.raises(
        SpecError, match=r'raises "Async TP requires --training.compile"; set training.compile ='
    ):
        read_job([path], gpus=8)


def test_async_tp_without_tensor_parallelism_is_a_warning_and_no_async_tp(tmp_path):
    text = "[parallelism]\nenable_async_tensor_parallel = true\n[compile]\nenable = true\n"
    job, w = job_of(tmp_path, text)
    assert "no effect with tensor_parallel_degree 1" in warnings_of(job)
    assert w.async_tp is False


def test_check_of_a_file_with_async_tp_but_no_compile_exits_2(tmp_path, capsys):
    path = toml(
        tmp_path, "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
    )
    assert main(["check", str(path), "--gpus", "8", "--gpu", "H100"]) == 2
    err = capsys.readouterr().err
    assert "Async TP requires" in err and "Traceback" not in err


def test_a_model_torchtitan_names_and_memfit_does_not_is_refused(tmp_path):
    path = tmp_path / "q.toml"
    path.write_text('[model]\nname = "qwen3"\nflavor = "0.6B"\n[training]\nseq_len = 8\n')
    job = read_job([path], gpus=1)
    with pytest.raises(SpecError, match=r"'qwen3' flavor '0.6B'.*llama3 8B.*pass --model"):
        model_of(job)
    assert model_of(job, "qwen3-0.6b") == "qwen3-0.6b"


def test_hf_assets_path_with_a_config_json_is_the_model(tmp_path):
    shutil.copy(LLAMA_405B / "config.json", tmp_path / "config.json")
    path = tmp_path / "a.toml"
    path.write_text(f'[model]\nname = "llama3"\nflavor = "405B"\nhf_assets_path = "{tmp_path}"\n'
                    '[training]\nseq_len = 8\n')  # fmt: skip
    assert model_of(read_job([path], gpus=1)) == str(tmp_path)


# ---------------------------------------------------------------- the GPUs and the mesh
def test_shard_minus_one_needs_the_launchers_gpu_count(tmp_path):
    with pytest.raises(
        SpecError, match=r"data_parallel_shard_degree = -1 takes the GPUs.*--gpus N"
    ):
        job_of(tmp_path, "", gpus=None)


def test_fixed_degrees_give_the_gpu_count_and_must_agree_with_gpus(tmp_path):
    text = "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n"
    _, w = job_of(tmp_path, text, gpus=None)
    assert (w.gpus, w.tp, w.shard, w.sequence_parallel) == (8, 2, "fsdp", True)
    with pytest.raises(SpecError, match="the degrees multiply to 8 GPUs but --gpus is 16"):
        job_of(tmp_path, text, gpus=16)
    with pytest.raises(SpecError, match="--gpus 12 is not a multiple of the other degrees"):
        job_of(tmp_path, "[parallelism]\ntensor_parallel_degree = 8\n", gpus=12)


def test_hsdp_ddp_and_model_parallel_alone(tmp_path):
    _, w = job_of(tmp_path, "[parallelism]\ndata_parallel_replicate_degree = 2\n")
    assert (w.shard, w.dp_replicate, w.precision) == ("fsdp", 2, "bf16-mixed")
    _, w = job_of(tmp_path, "[parallelism]\ndata_parallel_replicate_degree = 8\n"
                  "data_parallel_shard_degree = 1\n")  # fmt: skip
    assert (w.shard, w.dp_replicate, w.precision) == ("ddp", 1, "bf16-mixed")  # DDP: autocast
    job, w = job_of(tmp_path, "[parallelism]\ndata_parallel_shard_degree = 1\n"
                    "tensor_parallel_degree = 8\n")  # fmt: skip
    assert (w.shard, w.precision) == ("none", "32-true")  # TP without FSDP: no mixed precision
    assert "maybe_enable_amp" in warnings_of(job)


def test_context_and_expert_parallel_degrees(tmp_path):
    cp = 'context_parallel_degree = 2\ncontext_parallel_rotate_method = "alltoall"\n'
    _, w = job_of(tmp_path, "[parallelism]\ndata_parallel_shard_degree = 4\n" + cp)
    assert (w.cp, w.cp_rotate, w.shard, w.gpus) == (2, "alltoall", "fsdp", 8)
    job = read_job([toml(tmp_path, "[parallelism]\nexpert_parallel_degree = 4\n"
                         "expert_tensor_parallel_degree = 1\n")], gpus=8)  # fmt: skip
    assert job.value("ep") == 4 and "etp" not in job.fields


def test_reshard_after_forward_and_cpu_offload(tmp_path):
    _, w = job_of(tmp_path, '[parallelism]\nfsdp_reshard_after_forward = "never"\n')
    assert w.reshard_after_forward is False
    _, w = job_of(tmp_path, '[parallelism]\nfsdp_reshard_after_forward = "always"\n')
    assert w.reshard_after_forward is True
    job = read_job([toml(tmp_path, "enable_cpu_offload = true\n")], gpus=8)
    assert job.value("offload") == "params"
    with pytest.raises(SpecError, match="fsdp_reshard_after_forward.*default, always or never"):
        job_of(tmp_path, '[parallelism]\nfsdp_reshard_after_forward = "sometimes"\n')


def test_disable_loss_parallel_is_a_warning(tmp_path):
    job, _ = job_of(
        tmp_path, "[parallelism]\ntensor_parallel_degree = 2\ndisable_loss_parallel = true\n"
    )
    assert "whole vocabulary is not modelled" in warnings_of(job)


# ---------------------------------------------------------------- precision
@pytest.mark.parametrize(
    ("keys", "precision"),
    [
        ("", "bf16-mixed"),
        ('dtype = "bfloat16"\n', "bf16-true"),
        ('mixed_precision_param = "float32"\n', "32-true"),
    ],
)
def test_precision(tmp_path, keys, precision):
    _, w = job_of(tmp_path, keys)
    assert w.precision == precision


def test_a_bf16_reduce_is_estimated_as_fp32_and_said(tmp_path):
    job, w = job_of(tmp_path, 'mixed_precision_reduce = "bfloat16"\n')
    assert w.precision == "bf16-mixed" and "estimated as fp32" in warnings_of(job)


# ---------------------------------------------------------------- batch and pipeline
def test_local_and_global_batch(tmp_path):
    _, w = job_of(tmp_path, "local_batch_size = 2\nglobal_batch_size = 64\n")
    assert (w.batch_size, w.grad_accum) == (2, 4)  # 64 / (2 x 8 dp ranks)
    _, w = job_of(tmp_path, "batch_size = 3\n")  # the 2024 spelling
    assert (w.batch_size, w.grad_accum) == (3, 1)
    _, w = job_of(tmp_path, "")
    assert w.batch_size == 8  # torchtitan's default local_batch_size
    with pytest.raises(SpecError, match="global_batch_size.*multiple of local_batch_size"):
        job_of(tmp_path, "local_batch_size = 2\nglobal_batch_size = 20\n")


def test_pipeline_micro_batches_schedule_and_default_reshard(tmp_path):
    text = ("local_batch_size = 8\n[parallelism]\npipeline_parallel_degree = 2\n"
            "pipeline_parallel_microbatch_size = 2\n")  # fmt: skip
    _, w = job_of(tmp_path, text)
    assert (w.pp, w.batch_size, w.grad_accum, w.pp_schedule) == (2, 2, 4, "1f1b")
    assert (w.gpus, w.shard) == (8, "fsdp")
    assert w.reshard_after_forward is False  # torchtitan's "default" under PP
    _, w = job_of(tmp_path, text + 'pipeline_parallel_schedule = "ZBVZeroBubble"\n')
    assert (w.pp_schedule, w.pp_virtual_stages) == ("zbv", 1)
    with pytest.raises(SpecError, match="must divide training.local_batch_size"):
        job_of(tmp_path, text.replace("microbatch_size = 2", "microbatch_size = 3"))


def test_interleaved_stages_per_rank_follow_torchtitans_split(tmp_path):
    text = ("local_batch_size = 8\n[parallelism]\npipeline_parallel_degree = 2\n"
            'pipeline_parallel_schedule = "Interleaved1F1B"\n')  # fmt: skip
    _, w = job_of(tmp_path, text)
    assert (w.pp_schedule, w.pp_virtual_stages) == ("interleaved-1f1b", 2)  # its default
    # 32 layers + 2 (embeddings, head) over stages of 5: ceil(34 / 5) = 7 stages
    with pytest.raises(
        SpecError, match="gives 7 stages.*not a multiple of pipeline_parallel_degree"
    ):
        job_of(tmp_path, text + "pipeline_parallel_layers_per_stage = 5\n")
    _, w = job_of(tmp_path, text + "pipeline_parallel_layers_per_stage = 3\n")
    assert w.pp_virtual_stages == 6  # ceil(34 / 3) = 12 stages over 2 ranks


def test_the_2024_pipeline_keys(tmp_path):
    text = ("batch_size = 8\ndata_parallel_shard_degree = 4\n[experimental]\n"
            "pipeline_parallel_degree = 2\npipeline_parallel_microbatches = 4\n")  # fmt: skip
    _, w = job_of(tmp_path, text)
    assert (w.pp, w.batch_size, w.grad_accum, w.gpus) == (2, 2, 4, 8)


# ---------------------------------------------------------------- checkpointing, compile, float8
@pytest.mark.parametrize(
    ("keys", "mode", "warned"),
    [
        ('mode = "none"\n', "none", False),
        ('mode = "full"\n', "full", False),
        ('mode = "selective"\nselective_ac_option = "op"\n', "selective-op", False),
        ('mode = "selective"\nselective_ac_option = "1"\n', "full", False),
        ('mode = "selective"\nselective_ac_option = "2"\n', "selective-layer", False),
        ('mode = "selective"\nselective_ac_option = "3"\n', "selective-layer", False),
        ("", "selective-layer", False),  # torchtitan's default: selective, every 2nd block
        ('mode = "memory_budget"\nmemory_budget = 0.3\n', "none", True),
    ],
)
def test_activation_checkpointing(tmp_path, keys, mode, warned):
    job, w = job_of(tmp_path, "[activation_checkpoint]\n" + keys)
    assert w.checkpointing == mode
    assert ("activation_checkpoint" in warnings_of(job)) is warned


def test_every_nth_block_is_selective_layer_unless_compiled(tmp_path):
    _, w = job_of(
        tmp_path, '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "3"\n'
    )
    assert (w.checkpointing, w.selective_ac_option) == ("selective-layer", 3)
    job, w = job_of(
        tmp_path,
        '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n'
        "[compile]\nenable = true\n",
    )
    assert (w.checkpointing, w.compile) == ("none", True)
    assert "activation_checkpoint.selective_ac_option" in warnings_of(job)


def test_a_checkpointing_mode_torchtitan_does_not_have_is_refused(tmp_path):
    with pytest.raises(SpecError, match="activation_checkpoint.mode.*must be none, full"):
        job_of(tmp_path, '[activation_checkpoint]\nmode = "some"\n')


def test_compile(tmp_path):
    assert job_of(tmp_path, "[compile]\nenable = true\n")[1].compile is True
    assert job_of(tmp_path, "compile = true\n")[1].compile is True  # the 2024 [training] key
    assert job_of(tmp_path, '[compile]\nenable = true\ncomponents = ["loss"]\n')[1].compile is False


def test_float8(tmp_path):
    base = '[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n'
    path = tmp_path / "f8.toml"
    path.write_text(base + "[training]\nseq_len = 4096\n[quantize.linear.float8]\n"
                    "enable_fsdp_float8_all_gather = true\n")  # fmt: skip
    w = workload_of(read_job([path], gpus=8))
    assert (w.float8, w.float8_all_gather) == ("tensorwise", True)
    path.write_text(base + "[training]\nseq_len = 4096\n[quantize.linear.float8]\n"
                    'enable_fsdp_float8_all_gather = true\nrecipe_name = "rowwise"\n')  # fmt: skip
    w = workload_of(read_job([path], gpus=8))
    assert (w.float8, w.float8_all_gather) == ("rowwise", False)  # fp8 all-gather: tensorwise
    _, w = job_of(tmp_path, "[float8]\nenable_float8_linear = true\n")  # the 2024 keys
    assert w.float8 == "tensorwise"
    _, w = job_of(tmp_path, "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n")
    assert w.float8 == "none"  # options without the converter: no Float8


# ---------------------------------------------------------------- optimizer and other keys
@pytest.mark.parametrize(
    ("keys", "optimizer"),
    [
        ("", "adamw-fused"),  # implementation's default since c1c2f55 (2025-04)
        ('[optimizer]\nimplementation = "foreach"\n', "adamw"),
        ('[optimizer]\nname = "Adam"\nimplementation = "fused"\n', "adamw-fused"),
        ("[optimizer]\nfused = false\n", "adamw"),
    ],
)
def test_optimizer(tmp_path, keys, optimizer):
    assert job_of(tmp_path, keys)[1].optimizer == optimizer


def test_the_2024_layout_defaults_to_foreach_adamw_and_unknown_optimizers_warn(tmp_path):
    assert job_of(tmp_path, "batch_size = 1\n")[1].optimizer == "adamw"
    job, w = job_of(tmp_path, '[optimizer]\nname = "Muon"\n')
    assert w.optimizer == "adamw-fused" and "Muon is not modelled" in warnings_of(job)


def test_no_effect_and_unknown_keys_are_listed(tmp_path):
    job, _ = job_of(tmp_path, "steps = 10\nfrobnicate = 1\n[job]\ndump_folder = \"x\"\n"
                    "[lr_scheduler]\nwarmup_steps = 2\n[checkpoint]\nenable = true\n")  # fmt: skip
    no_effect = {k for _, k in job.no_effect()}
    assert {"training.steps", "job.dump_folder", "lr_scheduler.warmup_steps"} <= no_effect
    assert ("job.toml", "training.frobnicate") in job.unknown()


# ---------------------------------------------------------------- the command
def test_check_the_8b_reference_config_end_to_end(capsys):
    path = str(EXAMPLES / "torchtitan-llama3_8b.toml")
    code = main(["check", path, "--gpu", "H100-80GB", "--gpus", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["estimate"]["fits"]["verdict"] == "fits"
    assert out["model"] == "llama-3.1-8b"
    assert "_model_refused" not in out["from"]


def test_check_without_gpus_is_one_line_and_exit_2(capsys):
    path = str(EXAMPLES / "torchtitan-llama3_8b.toml")
    assert main(["check", path, "--gpu", "H100-80GB"]) == 2
    err = capsys.readouterr().err
    assert "pass --gpus N" in err and len(err.strip().splitlines()) == 1


def test_the_published_point_as_a_toml_gives_the_estimate_of_its_command(capsys):
    """tt-t1-fsdp8 (torchtitan 9dec370, Llama 3.1 8B, FSDP over 8 H100s, local batch 2) written
    as torchtitan's own llama3_8b.toml of that commit: the same estimate as the command
    benchmarks/multigpu_points.py runs for it (on the analytic engine, the cheapest that
    answers both)."""
    point = next(p for p in load_points() if p["id"] == "tt-t1-fsdp8")
    argv = command(point)
    argv[argv.index("--engine") + 1] = "analytic"
    assert main(["estimate", *argv, "--gpu", "H100-80GB", "--json"]) in (0, 1)
    direct = json.loads(capsys.readouterr().out)
    path = str(EXAMPLES / "torchtitan-tt-t1-fsdp8.toml")
    main(["check", path, "--gpu", "H100-80GB", "--gpus", "8", "--engine", "analytic", "--json"])
    checked = json.loads(capsys.readouterr().out)["estimate"]
    for key in ("workload", "peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes"):
        assert checked[key] == direct[key], key


# ---------------------------------------------------------------- memfit's own export, read back
def _layout(**kw) -> LayoutPeak:
    base = dict(dp=4, tp=2, pp=1, cp=1, micro_batch=1, grad_accum=4, checkpointing="full",
                peak_pp_rank=0, peak_allocated_bytes=1, device_used_bytes=1,
                device_used_high_bytes=1, verdict="fits", bubble=0.0, shard="fsdp")  # fmt: skip
    return LayoutPeak(**{**base, **kw})


#: Layouts of Llama 3.1 8B (32 layers) the planner can choose, one per kind of key.
ROUND_TRIP = [
    _layout(),
    _layout(dp=8, tp=1, micro_batch=2, grad_accum=2, checkpointing="selective"),
    _layout(dp=2, tp=2, pp=4, grad_accum=8, checkpointing="none"),
    # 32 + 2 layers over 4 x 2 stages: torchtitan's default split (no layers_per_stage)
    _layout(dp=2, pp=4, pp_schedule="interleaved-1f1b", pp_virtual_stages=2, grad_accum=8),
    _layout(dp=2, pp=4, pp_schedule="interleaved-1f1b", pp_virtual_stages=3, grad_accum=8),
    _layout(dp=2, pp=2, pp_schedule="zbv", grad_accum=4, micro_batch=2),
    _layout(dp=2, cp=2, tp=2, grad_accum=2),
    _layout(dp=1, tp=8, grad_accum=16),
    _layout(dp=4, tp=2, ep=2, shard="zero1"),
]


@pytest.mark.parametrize("p", ROUND_TRIP, ids=lambda p: f"dp{p.dp}tp{p.tp}pp{p.pp}cp{p.cp}ep{p.ep}"
                         f"{p.pp_schedule}{p.pp_virtual_stages}{p.checkpointing}")  # fmt: skip
def test_the_torchtitan_toml_export_reads_back_as_its_layout(tmp_path, p):
    glob = p.dp * p.micro_batch * p.grad_accum
    text = torchtitan_toml(p, seq_len=4096, global_batch=glob, n_layers=32)
    path = tmp_path / "exported.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n' + text)
    w = workload_of(read_job([path]), n_layers=32)  # the degrees are fixed: no --gpus
    planned = LayoutChoice(
        dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, micro_batch=p.micro_batch,
        grad_accum=p.grad_accum, seq_len=4096, checkpointing=p.checkpointing,
        pp_schedule=p.pp_schedule, pp_virtual_stages=p.pp_virtual_stages, shard=p.shard,
    ).workload()  # fmt: skip
    fields = ("gpus", "tp", "pp", "cp", "ep", "batch_size", "grad_accum", "seq_len",
              "pp_schedule", "pp_virtual_stages", "reshard_after_forward",
              "dp_replicate")  # fmt: skip
    assert {f: getattr(w, f) for f in fields} == {f: getattr(planned, f) for f in fields}
    # torchtitan has no ZeRO-1 (the export's note: FSDP is the nearest) and its selective
    # checkpointing is per-op (the export's note says memfit planned `selective`)
    assert w.shard == ("fsdp" if planned.shard == "zero1" else planned.shard)
    assert w.checkpointing == {"selective": "selective-op"}.get(p.checkpointing, p.checkpointing)
    assert w.sequence_parallel == (p.tp > 1)  # torchtitan's TP always shards the sequence


# ---------------------------------------------------------------- the fix, in torchtitan's keys
def test_check_writes_the_fix_into_the_toml_and_the_written_file_fits(tmp_path, capsys):
    text = (EXAMPLES / "torchtitan-llama3_8b.toml").read_text()
    path = tmp_path / "llama3_8b.toml"
    path.write_text(text.replace("local_batch_size = 1\n", "local_batch_size = 4\n"))
    argv = ["check", str(path), "--gpu", "H100-80GB", "--gpus", "8", "--write", "--json"]
    assert main(argv) == 0  # the written file's verdict
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["fits"]["verdict"] == "does not fit"
    written = path.read_text()
    assert "local_batch_size = 1\n" in written
    assert "global_batch_size = 32\n" in written  # 4 x 8 dp ranks: the samples per step kept
    assert "max_norm = 1.0  # grad norm clipping\n" in written  # comments and layout kept
    w = workload_of(read_job([path], gpus=8))
    assert (w.batch_size, w.grad_accum, w.checkpointing) == (1, 4, "selective-op")
    assert (tmp_path / "llama3_8b.toml.memfit-orig").read_text() == path.read_text().replace(
        "local_batch_size = 1\n", "local_batch_size = 4\n"
    ).replace("global_batch_size = 32\n", "")


def test_the_fix_can_turn_checkpointing_on(tmp_path, capsys):
    text = (EXAMPLES / "torchtitan-llama3_70b.toml").read_text()
    path = tmp_path / "llama3_70b.toml"
    path.write_text(text.replace('mode = "full"\n', 'mode = "none"\n'))
    code = main(["check", str(path), "--gpu", "H100-80GB", "--gpus", "64", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    keys = {k["key"]: k["new"] for k in out["fix"]["keys"]}
    assert keys.get("activation_checkpoint.mode") == "full"
    assert "global_batch_size = 64" in out["fix"]["diff"]  # 8 x 8 dp ranks held
    assert "per-rank closed form" in out["answered_by"]  # TP with sequence parallelism


def test_a_2024_file_has_no_accumulation_to_write(tmp_path, capsys):
    path = tmp_path / "tt1.toml"
    shutil.copy(EXAMPLES / "torchtitan-tt-t1-fsdp8.toml", path)
    main(["check", str(path), "--gpu", "H100-80GB", "--gpus", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert "global_batch_size" not in out["fix"]["diff"]  # added to torchtitan in 2025-06


def test_set_toml_keeps_comments_adds_keys_and_sections_and_refuses_what_it_cannot_say():
    text = '[training]\nlocal_batch_size = 8  # per rank\nsteps = 10\n\n[job]\nx = "y"\n'
    new = set_toml(text, [("training.local_batch_size", 2), ("training.global_batch_size", 64),
                          ("activation_checkpoint.mode", "full")], source="t.toml")  # fmt: skip
    assert "local_batch_size = 2  # per rank\nsteps = 10\nglobal_batch_size = 64\n" in new
    assert new.endswith('\n[activation_checkpoint]\nmode = "full"\n')
    with pytest.raises(EditRefusedError, match="set by hand: training.seq_len = 4"):
        set_toml("[training]\nseq_len = [\n 1]\n", [("training.seq_len", 4)], source="t.toml")
    with pytest.raises(EditRefusedError, match=r"\[training\] appears twice"):
        set_toml("[training]\na = 1\n[training]\nb = 1\n", [("training.a", 2)], source="t.toml")


def test_estimate_from_a_torchtitan_file_takes_the_launchers_gpus(tmp_path, capsys):
    path = toml(tmp_path, "local_batch_size = 8\n[parallelism]\npipeline_parallel_degree = 2\n"
                'pipeline_parallel_schedule = "Interleaved1F1B"\n[activation_checkpoint]\n'
                'mode = "full"\n')  # fmt: skip
    argv = ["estimate", "--from", str(path), "--gpus", "8", "--engine", "analytic", "--json"]
    assert main(argv) == 0
    w = json.loads(capsys.readouterr().out)["workload"]
    assert (w["gpus"], w["pp"], w["pp_virtual_stages"], w["batch_size"]) == (8, 2, 2, 1)
    assert main(["estimate", "--from", str(path), "--engine", "analytic"]) == 2
    assert "pass --gpus N" in capsys.readouterr().err

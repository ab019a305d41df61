"""Layout exports parse with the frameworks' own schemas (memfit.plan.layout_export).

The frameworks cannot be installed in CI; ``tests/plan/data/framework_schemas.json`` holds what
``benchmarks/framework_schemas.py`` read from their sources at pinned commits: Megatron-LM's
real argparse options (its parser built and dumped), torchtitan's config dataclass fields
(0.3.0 overrides, 0.2.2 TOML), DeepSpeed's config keys and pydantic fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from pathlib import Path

import pytest
import tomllib

from memfit.estimate.parallel.layouts import LayoutPeak
from memfit.plan.layout_export import (
    TORCHTITAN_SCHEDULES,
    accelerate_layout_config,
    deepspeed_layout_config,
    export_layout,
    megatron_args,
    torchtitan_overrides,
    torchtitan_toml,
)

SCHEMAS = json.loads((Path(__file__).parent / "data" / "framework_schemas.json").read_text())
N_LAYERS, SEQ = 126, 8192


def _peak(**kw) -> LayoutPeak:
    base = dict(dp=8, tp=8, pp=8, cp=2, micro_batch=1, grad_accum=16, checkpointing="full",
                peak_pp_rank=0, peak_allocated_bytes=1, device_used_bytes=1,
                device_used_high_bytes=1, verdict="fits", bubble=0.0, shard="fsdp")  # fmt: skip
    return LayoutPeak(**{**base, **kw})


LAYOUTS = [
    _peak(),
    _peak(pp_schedule="interleaved-1f1b", pp_virtual_stages=2, shard="zero1",
          checkpointing="selective"),
    _peak(pp_schedule="zbv", checkpointing="none"),
    _peak(dp=64, pp=1, cp=2, tp=8, grad_accum=2, micro_batch=1),
    _peak(dp=128, tp=1, pp=1, cp=1, ep=8, grad_accum=1, micro_batch=8, shard="zero1"),
]  # fmt: skip


def _global_batch(p: LayoutPeak) -> int:
    return p.dp * p.micro_batch * p.grad_accum


def _megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's options (flags, switches, choices, int types) as an argparse parser."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for o in SCHEMAS["megatron"]["options"]:
        if o["nargs"] == 0:
            parser.add_argument(*o["flags"], action="store_true")
        else:
            kw = {"nargs": o["nargs"], "choices": o["choices"]}
            if o["type"] == "int":
                kw["type"] = int
            parser.add_argument(*o["flags"], **kw)
    return parser


@pytest.mark.parametrize("p", LAYOUTS)
def test_megatron_args_parse_with_megatrons_options(p):
    args = megatron_args(p, seq_len=SEQ, global_batch=_global_batch(p), n_layers=N_LAYERS)
    ns = _megatron_parser().parse_args(args)  # an unknown flag or bad choice exits
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (p.tp, p.pp)
    assert ns.context_parallel_size == p.cp
    assert ns.micro_batch_size == p.micro_batch and ns.global_batch_size == _global_batch(p)
    assert ns.seq_length == SEQ and ns.sequence_parallel == (p.tp > 1)
    assert ns.use_distributed_optimizer == (p.shard == "zero1")
    assert (ns.expert_model_parallel_size or 1) == p.ep


def test_megatron_parser_refuses_a_misspelt_flag():
    with pytest.raises(SystemExit):
        _megatron_parser().parse_args(["--tensor-parallel-size", "8"])


@pytest.mark.parametrize("p", LAYOUTS)
def test_torchtitan_overrides_name_its_config_fields(p):
    schema = SCHEMAS["torchtitan"]["cli"]
    args = torchtitan_overrides(p, seq_len=SEQ, global_batch=_global_batch(p), n_layers=N_LAYERS)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        section, field = flag.removeprefix("--").split(".")
        annotation = schema[section][field]  # KeyError: not a torchtitan field
        assert annotation != "bool"  # tyro makes bools --flag / --no-flag: no value to pass
        if annotation == "int":
            int(value)
    if p.pp > 1:
        assert args[args.index("--parallelism.pipeline_parallel_schedule") + 1] in (
            TORCHTITAN_SCHEDULES.values()
        )


@pytest.mark.parametrize("p", LAYOUTS)
def test_torchtitan_toml_loads_into_its_0_2_2_sections(p):
    schema = SCHEMAS["torchtitan"]["toml"]
    doc = tomllib.loads(torchtitan_toml(p, seq_len=SEQ, global_batch=_global_batch(p),
                                        n_layers=N_LAYERS))  # fmt: skip
    for section, fields in doc.items():
        for k, v in fields.items():
            annotation = schema[section][k]
            assert isinstance(v, int) if annotation == "int" else True
    assert doc["activation_checkpoint"]["mode"] in schema["activation_checkpoint"]["mode"]
    t = doc["training"]
    assert t["global_batch_size"] == _global_batch(p)
    accum = t["global_batch_size"] // (t["local_batch_size"] * p.dp)
    assert accum * t["local_batch_size"] * p.dp == _global_batch(p)


@pytest.mark.parametrize("p", LAYOUTS)
def test_deepspeed_json_uses_deepspeeds_keys_and_batch_rule(p):
    ds = SCHEMAS["deepspeed"]
    cfg = deepspeed_layout_config(p, global_batch=_global_batch(p))
    assert set(cfg) <= set(ds["top_level"])
    assert set(cfg["zero_optimization"]) <= set(ds["zero_optimization"])
    assert set(cfg.get("tensor_parallel", {})) <= set(ds["tensor_parallel"])
    assert set(cfg.get("activation_checkpointing", {})) <= set(ds["activation_checkpointing"])
    # DeepSpeed's rule: train_batch_size = micro x accumulation x data-parallel ranks
    assert cfg["train_batch_size"] == (
        cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * p.dp
    )


def test_accelerate_has_no_pipeline_and_spans_the_gpus():
    assert accelerate_layout_config(_peak(), n_nodes=128) is None  # pp 8
    flat = accelerate_layout_config(_peak(dp=64, pp=1), n_nodes=128)
    par = flat["parallelism_config"]
    assert (par["parallelism_config_dp_shard_size"] * par["parallelism_config_tp_size"]
            * par["parallelism_config_cp_size"]) == flat["num_processes"] == 1024  # fmt: skip


def test_every_export_says_where_its_keys_come_from():
    out = export_layout(LAYOUTS[1], seq_len=SEQ, global_batch=1024, n_layers=N_LAYERS, n_nodes=128)
    assert set(out["sources"]) == {"torchtitan", "torchtitan_toml", "megatron", "deepspeed",
                                   "accelerate"}  # fmt: skip
    assert any("ZeRO-1" in n for n in out["torchtitan"]["notes"])  # zero1 has no torchtitan mode
    assert SCHEMAS["megatron"]["commit"].startswith("d98e8a6")


# -- the frameworks' own parsers, where installed (not in CI: see the module docstring) -------
def test_torchtitan_0_3_parses_the_overrides_where_installed():
    tyro = pytest.importorskip("tyro")
    configs = pytest.importorskip("torchtitan.config.configs")

    job_cls = dataclasses.make_dataclass(  # the two sections of torchtitan's Trainer.Config
        "Job",
        [
            (name, cls, dataclasses.field(default_factory=cls))
            for name, cls in (
                ("training", configs.TrainingConfig),
                ("parallelism", configs.ParallelismConfig),
            )
        ],
    )
    for p in LAYOUTS:
        gb = _global_batch(p)
        job = tyro.cli(job_cls, args=torchtitan_overrides(p, seq_len=SEQ, global_batch=gb,
                                                      n_layers=N_LAYERS))  # fmt: skip
        assert job.parallelism.pipeline_parallel_degree == p.pp
        assert job.training.global_batch_size == gb


def test_megatrons_own_parser_takes_the_args_where_importable():
    arguments = pytest.importorskip("megatron.training.arguments")
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    for p in LAYOUTS:
        ns = parser.parse_args(
            megatron_args(p, seq_len=SEQ, global_batch=_global_batch(p), n_layers=N_LAYERS)
        )
        assert ns.tensor_model_parallel_size == p.tp and ns.pipeline_model_parallel_size == p.pp


def test_deepspeeds_config_class_takes_the_json_where_installed(monkeypatch):
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # no process group
    for p in LAYOUTS:
        gb = _global_batch(p)
        mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda dp=p.dp: dp)
        c = ds_config.DeepSpeedConfig(deepspeed_layout_config(p, global_batch=gb), mpu=mpu)
        assert (c.train_batch_size, c.gradient_accumulation_steps) == (gb, p.grad_accum)

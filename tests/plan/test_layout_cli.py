"""``memfit plan --layout`` / ``--nodes`` / ``--export``: the layout path of plan, exit codes."""

from __future__ import annotations

import argparse
import json

from memfit.cli.entry import main
from memfit.cli.layouts import wants_layout

JOB = ["--global-batch", "32", "--seq", "4096", "--quiet"]


def test_plan_layout_json_has_the_pick_alternatives_and_exports(capsys):
    code = main(["plan", "llama-3.1-8b", "--gpu", "H100", "--gpus", "16", "--layout", *JOB,
                 "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"]
    best = out["best"]
    assert best["dp"] * best["tp"] * best["pp"] * best["cp"] == 16
    assert best["step_s"] > 0 and best["usd_per_million_tokens"] > 0
    assert out["exports"]["megatron"]["args"][:2] == ["--tensor-model-parallel-size",
                                                      str(best["tp"])]  # fmt: skip
    assert all(a["step_s"] >= best["step_s"] for a in out["alternatives"])


def test_nodes_times_gpus_per_node_is_the_job(capsys):
    code = main(["plan", "llama-3.1-8b", "--gpu", "H100", "--nodes", "2", "--gpus-per-node",
                 "8", *JOB, "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["gpus"] == 16 and out["gpus_per_node"] == 8


def test_export_prints_only_that_config(capsys):
    code = main(["plan", "llama-3.1-8b", "--gpu", "H100", "--gpus", "16", *JOB,
                 "--export", "deepspeed"])  # fmt: skip
    cfg = json.loads(capsys.readouterr().out)
    assert code == 0 and cfg["train_batch_size"] == 32


def test_disagreeing_gpu_counts_exit_2(capsys):
    code = main(["plan", "llama-3.1-8b", "--gpu", "H100", "--gpus", "12", "--nodes", "2", *JOB])
    err = capsys.readouterr().err
    assert code == 2 and "--gpus (12) disagrees with --nodes x --gpus-per-node" in err
    assert "Traceback" not in err


def test_the_layout_search_needs_a_global_batch(capsys):
    code = main(["plan", "llama-3.1-8b", "--gpu", "H100", "--gpus", "16", "--layout", "--quiet"])
    assert code == 2 and "needs --global-batch" in capsys.readouterr().err


def test_nothing_fits_exits_1(capsys):
    code = main(["plan", "llama-3.1-70b", "--gpu", "T4", "--gpus", "2", "--layout",
                 "--global-batch", "2", "--seq", "4096", "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "no layout fits" in out and "closest to fitting" in out


def test_plan_keeps_its_data_parallel_search_inside_one_node():
    ns = argparse.Namespace(mode="train", layout=False, nodes=None, gpus_per_node=None,
                            export=None, gpus=8, gpu="H100")  # fmt: skip
    assert not wants_layout(ns)
    assert wants_layout(argparse.Namespace(**{**vars(ns), "gpus": 16}))
    assert not wants_layout(argparse.Namespace(**{**vars(ns), "gpus": 16, "mode": "infer"}))
    assert wants_layout(argparse.Namespace(**{**vars(ns), "layout": True, "gpus": 2}))

"""Published per-GPU memory of multi-GPU training runs against memfit's per-rank estimate.

    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py            # markdown table
    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py --json     # one JSON per point
    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py --write    # + results file
    PYTHONPATH=src .venv/bin/python benchmarks/multigpu_points.py --only ID  # one point

Points: ``benchmarks/data/multigpu_published.jsonl``, one JSON line each with ``source`` (URL with
the table/row), ``framework``, ``version``, ``model`` (a bundled memfit name or a config directory
under ``benchmarks/configs/``), ``gpus``, ``layout`` {dp, fsdp, tp, pp, cp, ep}, ``precision``,
``micro_batch``, ``seq``, ``checkpointing``, ``measured_gib`` and ``metric`` (allocated |
reserved | device: what the source logged), ``notes`` (every assumption). Optional settings a
point may carry: ``shard`` (memfit's --shard: ddp / zero1-3 / fsdp; default from the layout),
``offload``, ``optimizer``, ``attention``, ``lora_rank``, ``lora_targets``, ``quant``,
``lora_dropout`` (peft's, as the source's script sets it), ``transformers_version`` (the release
the source ran, where memfit has a rule for it: ``memfit.spec.hf_versions``), ``peft_version``
(likewise: adapters in the base dtype before peft 0.12), ``compile``, ``float8``, ``engine``
("megatron": see below), ``expressible`` (false, with a ``reason``: listed, never scored),
``fsdp_version`` (1: PyTorch's FSDP1, run as ``--fsdp-version 1 --grad-accum MICRO_BATCHES``: its
no_sync accumulation is part of the job) and ``fsdp_lora_wrap`` (``--fsdp-lora-wrap``: block for
LitGPT's FSDPStrategy) and ``fsdp_state_dict_type`` (``--fsdp-state-dict-type``: the FSDP1
state-dict type the run writes its checkpoint with, accelerate's ``fsdp_state_dict_type``; the
sources' chain for it in ``fsdp_notes``).

A point is *expressible* when memfit has every setting it names; otherwise the table says which
setting is missing and no error is computed (an estimate of another job is no evidence). Each
expressible point is run as the ``memfit estimate`` command the table prints (a subprocess with
``--json``) on the engine memfit's own ``--engine auto`` answers a multi-GPU job with: the fast-path
grid validates the analytic engine for no job on several GPUs (``estimate/fastpath.grid_job``), so
auto takes the precise route (``estimate/policy.EnginePolicy._precise``): the trace engine's bytes,
which the derived engine gives without a full trace (rank 0's traced timeline through the allocator
simulation, grown from a few layers; auto answers with it wherever its form is cached). Where the
derived engine refuses a job, the analytic engine answers, as auto does (:data:`FALLBACK`). Before
2026-12-07 the non-quantized points ran ``--engine analytic``, an answer ``memfit estimate`` never
gives for them: its reserved bytes (allocated + its ratio's middle) missed what the allocator
replay finds (aai-7b-lora-offload-b10: analytic 15.3 GiB reserved, derived 20.2, measured 22.7).
Error = (estimate - measured) / measured on the point's metric.

Megatron-LM rows (``engine: megatron``) are estimated by memfit's Megatron layout, the parallel
closed form (``memfit.estimate.parallel.estimate_parallel``: 16-bit parameters, fp32 main
gradients, fp32 masters + Adam sharded by the distributed optimizer), which ``memfit estimate``
answers with only when pp, cp or ep > 1; the table also gives what the printed command (the
derived engine, transformers' training semantics) answers for the same job: a gap, not hidden.

torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``: every other matmul
output saved) runs as memfit's ``selective-op``, the same policy (``--before`` runs it as
``selective``, every matmul output saved). torchtitan's tensor parallelism always shards the
sequence (``--sp``); its Float8 points run as ``--float8 tensorwise`` (``--float8-all-gather`` where
the source's command sets ``enable_fsdp_float8_all_gather``), its torch.compile points with
``--compile``. A Float8 point under per-op SAC run by a torchtitan whose ``_save_list`` has no
``aten._scaled_mm`` (:data:`OP_SAC_RECOMPUTED_FLOAT8`: every Float8 linear output recomputed) is
listed, not scored: memfit's closed form follows torchtitan since 114151ad4, which saves them all
(``memfit.estimate.parallel.memory.OP_SAC_SAVES_FLOAT8_SINCE``). ``--closed-form`` answers every
expressible point with the per-rank closed form (``memfit.estimate.parallel``) instead of the
printed command; a LoRA or QLoRA point, which the closed form does not model (it answers them as
full fine-tunes), is listed, not scored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.parallel.memory import OP_SAC_SAVES_FLOAT8_SINCE

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "multigpu_published.jsonl"
RESULTS = ROOT / "benchmarks" / "results" / "multigpu_points.md"
GIB = 2**30
#: memfit's nearest checkpointing for the sources' names
CHECKPOINTING = {
    "none": "none",
    "full": "full",
    "selective": "selective",
    "selective-op": "selective-op",
}
#: ``--before``: the policy torchtitan's points ran under before memfit had its op SAC.
BEFORE_CHECKPOINTING = {**CHECKPOINTING, "selective-op": "selective"}
#: The catalog GPU of a point, for the closed form (the 96 GB H100 of torchtitan's Grand Teton
#: hosts is not in the catalog; the capacity does not change the estimate).
CLOSED_FORM_GPUS = {"H100 96GB HBM2e": "H100-80GB", "H200": "H200", "H800-80GB": "H100-80GB"}
METRIC_FIELD = {
    "allocated": "peak_allocated_bytes",
    "reserved": "peak_reserved_bytes",
    "device": "device_used_bytes",
}
#: The engine that answers where the derived engine refuses a point (``--engine auto`` likewise).
FALLBACK = "analytic"
#: torchtitan commits (with their dates) that published Float8 points ran and whose per-op SAC
#: ``_save_list`` lists no ``aten._scaled_mm`` (``torchtitan/parallelisms/parallelize_llama.py``
#: at 9dec370, ``torchtitan/models/llama3/parallelize_llama.py`` at e7c0cae): a Float8 linear's
#: output is recomputed there, saved since ``OP_SAC_SAVES_FLOAT8_SINCE`` (the rule memfit's
#: closed form follows: ``memfit.estimate.parallel.memory``).
OP_SAC_RECOMPUTED_FLOAT8 = {"9dec370": "2024-12-26", "e7c0cae": "2025-06-13"}
#: Models not bundled with memfit: their config.json in the repository (sources in the data rows).
MODEL_PATHS = {
    "yi-34b": "benchmarks/configs/yi-34b",
    "mistral-7b-v0.2": "benchmarks/configs/mistral-7b-v0.2",
}


def load(path: Path = DATA) -> list[dict[str, Any]]:
    """The data-parallel / tensor-parallel points of the shared file; the pipeline, context and
    expert-parallel ones are benchmarks/multigpu_parallel.py's (closed form: parallel)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if not any(r["layout"].get(k, 1) > 1 for k in ("pp", "cp", "ep"))]


def missing(point: dict[str, Any]) -> list[str]:
    """Settings of ``point`` memfit cannot express (empty: expressible)."""
    lay = point["layout"]
    out = [f"{k} {lay[k]}" for k in ("pp", "cp", "ep") if lay.get(k, 1) > 1]
    if point.get("expressible") is False:
        out.append(point["reason"])
        return out
    if point.get("float8") and point["checkpointing"] == "selective-op":
        commit = torchtitan_commit(point)
        if commit in OP_SAC_RECOMPUTED_FLOAT8:
            out.append(
                f"per-op SAC of torchtitan {commit} ({OP_SAC_RECOMPUTED_FLOAT8[commit]}): its "
                "_save_list has no aten._scaled_mm, so every Float8 linear output is recomputed; "
                "memfit models torchtitan since "
                f"{OP_SAC_SAVES_FLOAT8_SINCE} (all saved) and has no flag for the older list"
            )
    return out


def torchtitan_commit(point: dict[str, Any]) -> str | None:
    """The torchtitan commit a point's ``version`` names ("torchtitan 9dec370 (...)")."""
    version = str(point.get("version", ""))
    if point["framework"] != "torchtitan" or not version.startswith("torchtitan "):
        return None
    return version.split()[1]


def shard_of(point: dict[str, Any]) -> str:
    lay = point["layout"]
    if "shard" in point:
        return str(point["shard"])
    if lay.get("fsdp", 1) > 1:
        return "fsdp"
    return "ddp" if lay.get("dp", 1) > 1 else "none"


def precision_of(point: dict[str, Any]) -> str:
    """memfit's precision name; torchtitan rows spell FSDP2's policy out in prose."""
    p = str(point["precision"])
    return "bf16-mixed" if p.startswith("bf16-mixed") else p


def command(point: dict[str, Any], *, before: bool = False) -> list[str]:
    """The ``memfit estimate`` arguments of ``point`` (without ``--json``); ``before``: op SAC
    run as ``selective``."""
    lay = point["layout"]
    model = MODEL_PATHS.get(point["model"], point["model"])
    shard = shard_of(point)
    argv = [model, "--gpus", str(point["gpus"])]
    if lay.get("tp", 1) > 1:
        argv += ["--tp", str(lay["tp"])]
    if shard != "none":
        argv += ["--shard", shard]
    if shard == "fsdp" and lay.get("dp", 1) > 1 and lay.get("fsdp", 1) > 1:
        argv += ["--dp-replicate", str(lay["dp"])]
    if point.get("fsdp_version") == 1:
        # FSDP1 (FullyShardedDataParallel): its no_sync accumulation holds every unit's
        # unsharded gradient, so the micro-batch count is part of the job (memfit.estimate.fsdp1)
        argv += ["--fsdp-version", "1", "--grad-accum", str(point.get("micro_batches", 1))]
        if point.get("fsdp_lora_wrap"):
            argv += ["--fsdp-lora-wrap", point["fsdp_lora_wrap"]]
        if point.get("fsdp_state_dict_type"):
            # the checkpoint the run writes (memfit.estimate.fsdp1_save)
            argv += ["--fsdp-state-dict-type", point["fsdp_state_dict_type"]]
            if accelerate_of(point):
                argv += ["--accelerate-version", accelerate_of(point)]
    if point.get("offload", "none") != "none":
        argv += ["--offload", point["offload"]]
    argv += ["--batch", str(point["micro_batch"]), "--seq", str(point["seq"])]
    argv += ["--precision", precision_of(point)]
    ckpt = (BEFORE_CHECKPOINTING if before else CHECKPOINTING)[point["checkpointing"]]
    argv += ["--checkpointing", ckpt]
    if lay.get("tp", 1) > 1 and point["framework"] == "torchtitan":
        argv += ["--sp"]  # torchtitan's TP plan always shards the sequence (apply_tp)
    if point.get("float8"):
        # torchtitan's Float8 of 2024-12: dynamic tensorwise scaling; fp8 all-gather where the
        # point's source command sets it (float8_all_gather)
        argv += ["--float8", "tensorwise"]
        if point.get("float8_all_gather"):
            argv += ["--float8-all-gather"]
    for key, flag in (("optimizer", "--optimizer"), ("attention", "--attention")):
        if point.get(key):
            argv += [flag, str(point[key])]
    if point.get("lora_rank"):
        argv += ["--lora-rank", str(point["lora_rank"])]
        argv += ["--lora-targets", point.get("lora_targets", "all-linear")]
    if point.get("quant", "none") != "none":
        argv += ["--quant", point["quant"]]
    if point.get("lora_dropout"):
        argv += ["--lora-dropout", str(point["lora_dropout"])]
    if point.get("transformers_version"):
        # the release the source ran: its step rules where they differ (memfit.spec.hf_versions)
        argv += ["--transformers-version", str(point["transformers_version"])]
    if point.get("peft_version"):
        argv += ["--peft-version", str(point["peft_version"])]
    if point.get("compile"):
        argv += ["--compile"]  # the blocks under torch.compile (memfit.estimate.analytic.compile)
    argv += ["--engine", "derived"]
    return argv


def accelerate_of(point: dict[str, Any]) -> str | None:
    """The accelerate release that saved the point's checkpoint (before 0.31 a
    SHARDED_STATE_DICT save kept its copies on the GPU: memfit.spec.hf_versions): the row's
    ``accelerate_version``, else the release its ``version`` text requires ("accelerate>=0.28.0"
    on peft's FSDP-QLoRA page of 2024-03-13, when 0.28.0, of 2024-03-12, was the newest)."""
    if point.get("accelerate_version"):
        return str(point["accelerate_version"])
    found = re.search(r"accelerate\s*>=?\s*(\d+\.\d+(?:\.\d+)?)", str(point.get("version", "")))
    return found.group(1) if found else None


def run_cli(argv: list[str]) -> dict[str, Any]:
    """``memfit estimate ARGV --json`` in a subprocess, on the memfit this process imported."""
    import memfit

    src = str(Path(memfit.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        [sys.executable, "-m", "memfit", "estimate", *argv, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    if proc.returncode == 2 and argv[-2:] == ["--engine", "derived"]:
        # the derived engine refuses the job (a setting only the analytic engine models): the
        # analytic engine answers, as --engine auto's precise route falls back
        return run_cli([*argv[:-1], FALLBACK])
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"memfit estimate {' '.join(argv)}: {proc.stderr.strip()[-400:]}")
    return dict(json.loads(proc.stdout))


def closed_form_estimate(point: dict[str, Any], *, before: bool = False) -> dict[str, Any]:
    """The figures of :func:`closed_form_job` and its engine."""
    est = closed_form_job(point, before=before)
    return {k: getattr(est, k) for k in METRIC_FIELD.values()} | {"engine": est.engine}


def closed_form_models(point: dict[str, Any]) -> bool:
    """Whether the per-rank closed form estimates ``point`` as the source ran it: expressible
    (:func:`missing`), neither LoRA nor quantized weights (it has no terms for them), no
    offload (refused)."""
    lora = point.get("lora_rank") or point.get("quant", "none") != "none"
    return not missing(point) and not lora and point.get("offload", "none") == "none"


def closed_form_job(point: dict[str, Any], *, before: bool = False) -> Any:
    """The per-rank closed form (``memfit.estimate.parallel``) for ``point``, a MemoryEstimate:
    Megatron's layout for Megatron-LM points (16-bit parameters, fp32 main gradients,
    distributed-optimizer shards), torchtitan's (FSDP2) for the others; torch.compile and
    Float8 where the point ran them (as the printed command passes them)."""
    from memfit.estimate.parallel import estimate_parallel
    from memfit.hardware.catalog import get_gpu
    from memfit.models import resolve_model
    from memfit.spec import WorkloadSpec

    lay = point["layout"]
    extra: dict[str, Any] = {}
    if lay.get("tp", 1) > 1 and point["framework"] == "torchtitan":
        extra["sequence_parallel"] = True
    if point.get("float8"):
        extra["float8"] = "tensorwise"
        extra["float8_all_gather"] = bool(point.get("float8_all_gather"))
    if point.get("compile"):
        extra["compile"] = True
    work = WorkloadSpec(
        gpus=point["gpus"],
        tp=lay.get("tp", 1),
        shard=shard_of(point),
        dp_replicate=lay["dp"] if shard_of(point) == "fsdp" and lay.get("fsdp", 1) > 1 else 1,
        batch_size=point["micro_batch"],
        grad_accum=point.get("micro_batches", 1),
        seq_len=point["seq"],
        precision=precision_of(point),
        checkpointing=(BEFORE_CHECKPOINTING if before else CHECKPOINTING)[point["checkpointing"]],
        attention=point.get("attention", "flash"),
        fsdp_version=point.get("fsdp_version", 2),
        fsdp_lora_wrap=point.get("fsdp_lora_wrap", "peft"),
        **extra,
    )
    source = resolve_model(
        str(ROOT / MODEL_PATHS[point["model"]]) if point["model"] in MODEL_PATHS else point["model"]
    )
    gpu = get_gpu(CLOSED_FORM_GPUS.get(point.get("gpu", ""), "H100-80GB"))
    return estimate_parallel(source, work, gpu=gpu)


def run(point: dict[str, Any], *, before: bool = False, closed: bool = False) -> dict[str, Any]:
    """``point`` against memfit: the printed command's answer, or the closed form's for a
    Megatron-LM point (the command's own answer kept as ``command_gib``) or with ``closed``."""
    keys = ("id", "framework", "model", "gpus", "measured_gib", "metric")
    row: dict[str, Any] = {k: point.get(k) for k in keys}
    row["layout"] = layout_text(point)
    row["missing"] = missing(point)
    if row["missing"]:
        return row
    argv = command(point, before=before)
    row["command"] = "memfit estimate " + " ".join(argv)
    field = METRIC_FIELD[point["metric"]]
    megatron = point.get("engine") == "megatron"
    if closed and (point.get("lora_rank") or point.get("quant", "none") != "none"):
        # the closed form has no LoRA or quantized-weight terms (it would answer a full fine-tune)
        row["missing"] = ["the closed form models neither LoRA nor quantized weights"]
        return row
    if closed or megatron:
        try:
            est = closed_form_estimate(point, before=before)
        except SpecError as exc:
            row["missing"] = [f"closed form refuses it: {exc}"]
            return row
        row["engine"] = "closed form" + (": Megatron layout" if megatron else "")
    else:
        est = run_cli(argv)
        row["engine"] = str(est["engine"]).split(" (")[0]
    predicted = est[field] / GIB
    row["predicted_gib"] = round(predicted, 2)
    row["error"] = round(predicted / point["measured_gib"] - 1, 4)
    if megatron and not closed:
        said = run_cli(argv)
        row["command_gib"] = round(said[field] / GIB, 2)
        row["command_engine"] = str(said["engine"]).split(" (")[0]
    return row


def layout_text(point: dict[str, Any]) -> str:
    lay = point["layout"]
    parts = [f"{k} {lay[k]}" for k in ("dp", "fsdp", "tp", "pp", "cp", "ep") if lay.get(k, 1) > 1]
    shard = shard_of(point)
    if shard in ("zero1", "zero2", "zero3"):
        parts = [p.replace("fsdp", shard) for p in parts]
    if point.get("offload", "none") != "none":
        parts.append(f"offload {point['offload']}")
    if point.get("fsdp_version") == 1:
        parts.append("FSDP1")
    what = (
        "QLoRA"
        if point.get("quant", "none") != "none"
        else "LoRA"
        if point.get("lora_rank")
        else ""
    )
    return " x ".join(parts) + (f", {what}" if what else "")


def summary(rows: list[dict[str, Any]]) -> str:
    errs = [r["error"] for r in rows if "error" in r]
    if not errs:
        return "No expressible point."
    absolute = [abs(e) for e in errs]
    return (
        f"Expressible points: {len(errs)} (of {len(rows)}). Median |error|: "
        f"{statistics.median(absolute):.1%}. Worst under-prediction: {min(errs):+.1%}. Worst "
        f"over-prediction: {max(errs):+.1%}. Under by more than 10 %: "
        f"{sum(e < -0.10 for e in errs)}; over by more than 20 %: {sum(e > 0.20 for e in errs)}."
    )


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| point | framework | model | GPUs | layout | metric | measured GiB | memfit GiB "
        "| error | engine |",
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r["missing"]:
            tail = f"- | - | not expressible: {'; '.join(r['missing'])} |"
        else:
            extra = (
                f"; the printed command ({r['command_engine']}): {r['command_gib']:.1f} GiB"
                if "command_gib" in r
                else ""
            )
            tail = f"{r['predicted_gib']:.1f} | {r['error']:+.1%} | {r['engine']}{extra} |"
        lines.append(
            f"| {r['id']} | {r['framework']} | {r['model']} | {r['gpus']} | {r['layout']} | "
            f"{r['metric']} | {r['measured_gib']:.2f} | {tail}"
        )
    lines += ["", summary(rows), "", "Commands (each run with `--json`):", ""]
    lines += [f"- {r['id']}: `{r['command']}`" for r in rows if "command" in r]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per point")
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    parser.add_argument("--only", action="append", default=[], help="run only this point id")
    parser.add_argument(
        "--before", action="store_true", help="torchtitan's op SAC run as memfit's selective"
    )
    parser.add_argument(
        "--closed-form",
        action="store_true",
        help="answer with the per-rank closed form (memfit.estimate.parallel) instead",
    )
    args = parser.parse_args(argv)
    points = [p for p in load() if not args.only or p.get("id") in args.only]
    rows = []
    for p in points:
        rows.append(run(p, before=args.before, closed=args.closed_form))
        print(f"  {p.get('id')}: {rows[-1].get('error', '-')}", file=sys.stderr, flush=True)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    text = render(rows)
    print(text)
    if args.write and not (args.before or args.closed_form):
        head = (
            "# Multi-GPU training: published per-GPU memory vs memfit (data / fully-sharded / "
            "ZeRO / tensor parallel)\n\n`PYTHONPATH=src .venv/bin/python "
            "benchmarks/multigpu_points.py --write` — every point of "
            "`benchmarks/data/multigpu_published.jsonl` without pp, cp or ep (sources, framework "
            "versions, what each measured and every assumption are in that file; the pp / cp / "
            "ep points are `benchmarks/multigpu_parallel.py`'s).\n\n"
        )
        RESULTS.write_text(head + text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Published peak-memory figures measured WITH LitGPT and torchtune, estimated by memfit through
each framework's own code (``memfit check`` on the job's config; memfit.estimate.trace.frameworks)
and, for comparison, through transformers' model with the framework's settings (the analytic engine:
what ``memfit check`` answers when the framework is not installed).

    PYTHONPATH=src .venv/bin/python benchmarks/frameworks_published.py            # every row
    PYTHONPATH=src .venv/bin/python benchmarks/frameworks_published.py --only 1B  # a subset
    PYTHONPATH=src .venv/bin/python benchmarks/frameworks_published.py --render   # md from jsonl

Each row's result is appended to benchmarks/results/frameworks_published.jsonl as it finishes
(a trace of a 7B model takes minutes on a 2-core machine); the table
benchmarks/results/frameworks_published.md is rendered from the newest result of every row.
Error = (estimate - published) / published on ``peak_allocated_bytes`` (both sources report
``torch.cuda.max_memory_allocated()`` or its ``active`` twin; see each source).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
JSONL = RESULTS / "frameworks_published.jsonl"
MD = RESULTS / "frameworks_published.md"
LITGPT_CONFIGS = ROOT / "data" / "litgpt_config_hub"
GB = 1e9
GIB = 2**30

LITGPT_SOURCE = (
    "https://github.com/Lightning-AI/litgpt/blob/00af8b0d9b43eaa3f8c812e3e8bd53ef38cbb49d/"
    "config_hub/finetune/README.md"
)
LITGPT_SETTINGS = (
    "config_hub YAML at the table's commit; Alpaca2k, 1xA10G, peak = "
    "torch.cuda.max_memory_allocated()/1e9 over the whole run (litgpt/finetune/*.py); memfit "
    "assumes the longest batch reaches train.max_seq_length (512); QLoRA rows modelled with "
    "bitsandbytes 0.42.0, LitGPT's pin then"
)
#: LitGPT config_hub/finetune/README.md (commit 00af8b0d, 2024-09-27): 1xA10G rows, Peak memory GB.
LITGPT_ROWS = {
    "llama-3.2-1B/full": 8.70,
    "llama-3.2-1B/lora": 4.49,
    "llama-3.2-1B/qlora": 5.53,
    "llama-3.2-3B/full": 16.51,
    "llama-3.2-3B/lora": 9.67,
    "llama-3.2-3B/qlora": 10.30,
    "tiny-llama/full": 14.10,
    "tiny-llama/lora": 13.50,
    "tiny-llama/qlora": 16.24,
    "phi-2/lora": 13.98,
    "phi-2/qlora": 14.27,
    "gemma-2b/lora": 12.62,
    "gemma-2b/qlora": 11.58,
    "stablelm-base-alpha-3b/lora": 8.58,
    "stablelm-base-alpha-3b/qlora": 5.24,
    "phi-3/lora": 19.75,
    "phi-3/qlora": 19.13,
    "llama-2-7b/lora": 19.77,
    "llama-2-7b/qlora": 13.68,
    "mistral-7b/lora": 20.66,
    "mistral-7b/qlora": 14.29,
    "llama-3.1-8b/lora": 19.73,
    "llama-3.1-8b/qlora": 17.41,
    "falcon-7b/lora": 16.69,
    "falcon-7b/qlora": 9.44,
}

TORCHTUNE_SOURCE = (
    "https://github.com/pytorch/torchtune/blob/1814feb17a9038e1a8053ce93111bd26774a8db6/"
    "README.md#optimization-flags"
)
#: torchtune README "Optimization flags" (commit 1814feb, 2024-11-18): Llama 3.2 3B,
#: full_finetune_single_device, batch 2, packed to 4096, bf16, A100; each technique added on
#: top of the previous (LoRA / QLoRA without optimizer_in_bwd and 8-bit AdamW). "Peak Memory
#: Active (GiB)". The LoRA / QLoRA models: recipes/configs/llama3_2/3B_(q)lora_single_device.yaml
#: at the same commit (q, v, output_proj + MLP, rank 64).
TT_BASE: dict[str, Any] = {
    "model": {"_component_": "torchtune.models.llama3_2.llama3_2_3b"},
    "dtype": "bf16",
    "batch_size": 2,
    "tokenizer": {"max_seq_len": 4096},
    "dataset": {"packed": True},
    "optimizer": {"_component_": "torch.optim.AdamW"},
    "loss": {"_component_": "torch.nn.CrossEntropyLoss"},
    "enable_activation_checkpointing": False,
    "enable_activation_offloading": False,
    "optimizer_in_bwd": False,
    "compile": False,
}
TT_LORA_MODEL = {
    "lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
    "apply_lora_to_mlp": True,
    "lora_rank": 64,
    "lora_alpha": 128,
}
_CHUNKED = {"loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}}
_STEPS: list[tuple[str, float, dict[str, Any]]] = [
    ("+ Packed Dataset", 60.0, {}),
    ("+ Compile", 51.0, {"compile": True}),
    ("+ Chunked Cross Entropy", 42.9, _CHUNKED),
    ("+ Activation Checkpointing", 24.9, {"enable_activation_checkpointing": True}),
    ("+ Optimizer in backward", 23.1, {"optimizer_in_bwd": True}),
    ("+ Activation Offloading", 21.8, {"enable_activation_offloading": True}),
    ("+ 8-bit AdamW", 17.6, {"optimizer": {"_component_": "bitsandbytes.optim.AdamW8bit"}}),
]


def torchtune_rows() -> dict[str, tuple[float, dict[str, Any]]]:
    rows: dict[str, tuple[float, dict[str, Any]]] = {}
    recipe = json.loads(json.dumps(TT_BASE))
    for name, gib, change in _STEPS:
        recipe = {**recipe, **change}
        rows[f"llama3_2_3b {name}"] = (gib, recipe)
    adapters = {**recipe, "optimizer_in_bwd": False, "optimizer": TT_BASE["optimizer"]}
    for kind, gib in (("lora", 8.5), ("qlora", 4.6)):
        model = {"_component_": f"torchtune.models.llama3_2.{kind}_llama3_2_3b", **TT_LORA_MODEL}
        rows[f"llama3_2_3b {kind.upper()}"] = (gib, {**adapters, "model": model})
    return rows


def estimate_row(path: Path, framework: str, gpu: str, options: dict[str, Any]) -> dict[str, Any]:
    import memfit
    from memfit.estimate.trace.frameworks import estimate_with_framework
    from memfit.jobfiles import model_of, read_job, workload_of

    job = read_job([path])
    model = model_of(job)
    workload = workload_of(job)
    data = job.files[0].data
    started = time.perf_counter()
    fw = estimate_with_framework(framework, data, workload, gpu=gpu, **options)
    fw_s = time.perf_counter() - started
    try:
        hf = memfit.estimate(model, workload, gpu=gpu, engine="analytic").peak_allocated_bytes
    except memfit.MemfitError as exc:  # no bundled config for the hub id: said in the row
        hf = None
        print(f"  transformers path: {exc}", file=sys.stderr)
    return {
        "model": model,
        "workload": workload.normalized(),
        "framework_bytes": fw.peak_allocated_bytes,
        "framework_phase": fw.peak_phase,
        "framework_components": fw.components,
        "framework_wall_s": round(fw_s, 1),
        "transformers_bytes": hf,
        "notes": fw.notes,
    }


def run(only: str | None) -> None:
    RESULTS.mkdir(exist_ok=True)
    work: list[dict[str, Any]] = []
    for name, gb in LITGPT_ROWS.items():
        work.append(
            {
                "framework": "litgpt",
                "row": name,
                "published_bytes": int(gb * GB),
                "published": f"{gb:.2f} GB",
                "source": LITGPT_SOURCE,
                "gpu": "A10G",
                "path": LITGPT_CONFIGS / f"{name}.yaml",
                "comparable": True,
                "settings": LITGPT_SETTINGS,
                # litgpt's pyproject.toml at that commit pins bitsandbytes==0.42.0
                "options": {"bnb_version": "0.42.0"} if "qlora" in name else {},
            }
        )
    tmp = Path(tempfile.mkdtemp(prefix="memfit-tt-"))
    for name, (gib, recipe) in torchtune_rows().items():
        path = tmp / (name.replace(" ", "_").replace("+", "").replace("/", "") + ".yaml")
        path.write_text(yaml.safe_dump(recipe))
        compiled = bool(recipe.get("compile"))
        work.append(
            {
                "framework": "torchtune",
                "row": name,
                "published_bytes": int(gib * GIB),
                "published": f"{gib:.1f} GiB",
                "source": TORCHTUNE_SOURCE,
                "gpu": "A100-80GB",
                "path": path,
                "comparable": not compiled,
                "settings": "README: batch 2, packed 4096, bf16, A100; AdamW variant (fused or "
                "foreach) not stated: memfit uses foreach"
                + ("; measured with torch.compile, memfit traces eager" if compiled else ""),
            }
        )
    for item in work:
        if only and only not in item["row"]:
            continue
        print(f"{item['framework']} {item['row']} …", file=sys.stderr, flush=True)
        try:
            result = estimate_row(
                item["path"], item["framework"], item["gpu"], item.get("options", {})
            )
        except Exception as exc:  # noqa: BLE001 - a row that cannot run is recorded, not fatal
            result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        record = {k: v for k, v in item.items() if k not in ("path",)}
        if item["framework"] == "litgpt":
            record["config"] = str(item["path"].relative_to(ROOT.parent))
        else:
            record["recipe"] = yaml.safe_load(item["path"].read_text())
        record.update(result)
        with JSONL.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
        keys = ("framework_bytes", "transformers_bytes", "error")
        print(f"  {json.dumps({k: record.get(k) for k in keys})}", file=sys.stderr)


def _err(est: int | None, pub: int) -> str:
    return "n/a" if est is None else f"{(est - pub) / pub:+.1%}"


def render() -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for line in JSONL.read_text().splitlines():
        rec = json.loads(line)
        rows[(rec["framework"], rec["row"])] = rec
    out = [
        "# Published peak memory measured with LitGPT / torchtune vs memfit",
        "",
        "Generated by `benchmarks/frameworks_published.py` (see its docstring for the command).",
        "memfit through the framework's own code: `memfit check CONFIG` with the framework "
        "installed (litgpt 0.5.13, torchtune 0.6.1 on torch 2.13.0+cpu, traced on fake tensors); "
        "through transformers: the analytic engine with the framework's settings (what "
        "`memfit check` answers when the framework is not installed). Error on peak allocated.",
        "",
        "| framework | row | published | memfit (framework code) | error | memfit (transformers)"
        " | error | peak phase | settings / caveats |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, list[tuple[float, float | None]]] = {}
    for (fw, name), rec in rows.items():
        pub = rec["published_bytes"]
        if "error" in rec:
            out.append(f"| {fw} | {name} | {rec['published']} | failed: {rec['error']} | | | | | |")
            continue
        f_b, h_b = rec["framework_bytes"], rec["transformers_bytes"]
        caveat = rec["settings"]
        if rec["framework"] == "litgpt" and rec["row"].endswith("/full"):
            # bf16 parameters + gradients + AdamW's two bf16 states: 4 x the parameter bytes
            floor = 4 * rec["framework_components"]["parameters"]
            if pub < floor:
                rec["comparable"] = False
                caveat = (
                    f"published figure is below this config's model states alone (bf16 params + "
                    f"grads + 2 AdamW states = {floor / GB:.1f} GB): not the configured job"
                )
        low = name.lower()
        method = "QLoRA" if "qlora" in low else "LoRA" if "lora" in low else "full"
        if rec["comparable"]:
            summary.setdefault(f"{fw} {method}", []).append(
                ((f_b - pub) / pub, None if h_b is None else (h_b - pub) / pub)
            )
        caveat += "" if rec["comparable"] else " — NOT in the summary"
        out.append(
            f"| {fw} | {name} | {rec['published']} | {f_b / GB:.2f} GB | {_err(f_b, pub)} | "
            + ("n/a" if h_b is None else f"{h_b / GB:.2f} GB")
            + f" | {_err(h_b, pub)} | {rec['framework_phase']} | {caveat} |"
        )
    out += ["", "## Error per framework (comparable rows)", ""]
    out += [
        "| framework, method | rows | framework code: mean abs error, worst | transformers path: "
        "mean abs error, worst |",
        "|---|---|---|---|",
    ]
    for fw, errs in summary.items():
        f_errs = [e for e, _ in errs]
        h_errs = [h for _, h in errs if h is not None]

        def stat(xs: list[float]) -> str:
            if not xs:
                return "n/a"
            worst = max(xs, key=abs)
            return f"{sum(abs(x) for x in xs) / len(xs):.1%}, {worst:+.1%} ({len(xs)} rows)"

        out.append(f"| {fw} | {len(errs)} | {stat(f_errs)} | {stat(h_errs)} |")
    out += [
        "",
        "Sources: LitGPT " + LITGPT_SOURCE + " ; torchtune " + TORCHTUNE_SOURCE + ".",
        "",
    ]
    MD.write_text("\n".join(out))
    print(MD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="rows whose name contains this text")
    parser.add_argument("--render", action="store_true", help="only render the md from jsonl")
    args = parser.parse_args()
    if not args.render:
        run(args.only)
    render()


if __name__ == "__main__":
    main()

"""Measure real GPU memory of the jobs memfit estimates, for docs/accuracy.md.

Runs each case in a fresh subprocess (clean allocator and CUDA context) on a CUDA GPU: a model built
from a bundled config.json with random weights, the same step memfit traces (two training steps:
forward + loss, backward, optimizer.step, zero_grad(set_to_none=True); or ``generate()``), and
records ``max_memory_allocated``, ``max_memory_reserved``, and NVML's used memory for the process.

    python benchmarks/gpu_measure.py --out results.jsonl            # all cases
    python benchmarks/gpu_measure.py --case llama1b-train-bf16     # one case, prints JSON

Optionally ``--alloc-trace DIR`` dumps each case's allocation trace (from
``torch.cuda.memory._record_memory_history``) as JSON so the allocator simulation can be replayed
against the real allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "memfit" / "models" / "configs"

#: name -> (bundled config, workload). Workload keys mirror memfit.WorkloadSpec.
CASES: dict[str, tuple[str, dict]] = {
    "llama1b-train-bf16": ("llama-3.2-1b", dict(mode="train", batch_size=2, seq_len=1024)),
    "llama1b-train-bf16-eager": (
        "llama-3.2-1b",
        dict(mode="train", batch_size=2, seq_len=1024, attention="eager"),
    ),
    "llama1b-train-ampbf16": (
        "llama-3.2-1b",
        dict(mode="train", batch_size=2, seq_len=1024, precision="amp-bf16"),
    ),
    "llama1b-train-bf16-ckpt": (
        "llama-3.2-1b",
        dict(mode="train", batch_size=4, seq_len=2048, checkpointing="full"),
    ),
    "llama1b-train-lora": (
        "llama-3.2-1b",
        dict(mode="train", batch_size=2, seq_len=1024, lora_rank=16),
    ),
    "llama1b-infer-gen": (
        "llama-3.2-1b",
        dict(mode="infer", batch_size=4, seq_len=2048, new_tokens=64),
    ),
    "qwen05b-train-fp32-sgd": (
        "qwen2.5-0.5b",
        dict(mode="train", batch_size=2, seq_len=512, precision="fp32", optimizer="sgd-momentum"),
    ),
    "gpt2-train-fp32": ("gpt2", dict(mode="train", batch_size=8, seq_len=1024, precision="fp32")),
    "bert-train-seqcls": (
        "bert-base-uncased",
        dict(mode="train", batch_size=32, seq_len=512, precision="bf16"),
    ),
    "mistral7b-infer": (
        "mistral-7b-v0.1",
        dict(mode="infer", batch_size=1, seq_len=4096, new_tokens=32),
    ),
    "llama1b-train-selective-fused": (
        "llama-3.2-1b",
        dict(
            mode="train",
            batch_size=4,
            seq_len=2048,
            checkpointing="selective",
            optimizer="adamw-fused",
        ),
    ),
    "llama1b-train-ampfp16": (
        "llama-3.2-1b",
        dict(mode="train", batch_size=2, seq_len=1024, precision="amp-fp16"),
    ),
    "opt350m-train-fp16-eager": (
        "opt-350m",
        dict(mode="train", batch_size=4, seq_len=1024, precision="fp16", attention="eager"),
    ),
    "pythia410m-train-fp16": (
        "pythia-410m-deduped",
        dict(mode="train", batch_size=4, seq_len=1024, precision="fp16"),
    ),
}


def run_case(name: str, alloc_trace_dir: str | None) -> dict:
    import torch
    import transformers

    config_name, wl = CASES[name]
    cfg_dict = json.loads((CONFIGS / f"{config_name}.json").read_text())
    mode = wl.get("mode", "train")
    precision = wl.get("precision", "bf16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    amp_dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)
    attn = "eager" if wl.get("attention") == "eager" else "sdpa"
    b, s = wl.get("batch_size", 1), wl.get("seq_len", 512)
    model_type = cfg_dict.pop("model_type")
    hf = transformers.AutoConfig.for_model(model_type, **cfg_dict)
    archs = " ".join(cfg_dict.get("architectures") or [])
    seq_cls = not ("CausalLM" in archs or "LMHead" in archs)  # as memfit's resolve_task
    if seq_cls:
        hf.num_labels = 2
        cls = transformers.AutoModelForSequenceClassification
    else:
        cls = transformers.AutoModelForCausalLM

    torch.cuda.init()
    dev = torch.device("cuda")
    nvml = _nvml()
    baseline = _nvml_used(nvml)
    torch.ones(1, device=dev) @ torch.ones(1, 1, device=dev)  # context + cuBLAS handle
    torch.cuda.synchronize()
    after_init = {
        "nvml_process_bytes": _nvml_process(nvml),
        "reserved": torch.cuda.memory_reserved(),
    }
    if alloc_trace_dir:
        torch.cuda.memory._record_memory_history(
            context=None, stacks="python", max_entries=2_000_000
        )
    torch.cuda.reset_peak_memory_stats()
    with torch.device(dev):
        model = cls.from_config(hf, dtype=dtype, attn_implementation=attn)
    ids = torch.randint(0, hf.vocab_size, (b, s), device=dev)
    t0 = time.perf_counter()
    if mode == "train":
        if wl.get("checkpointing") in ("full", "selective"):
            kwargs: dict = {"use_reentrant": False}
            if wl["checkpointing"] == "selective":  # memfit's own policy (the repo is on the path)
                sys.path.insert(0, str(ROOT / "src"))
                from memfit.estimate.trace.build import selective_checkpoint_context

                kwargs["context_fn"] = selective_checkpoint_context
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if wl.get("lora_rank"):
            from peft import LoraConfig, get_peft_model

            r = wl["lora_rank"]
            model = get_peft_model(
                model,
                LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear"),
            )
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt_name = wl.get("optimizer", "adamw")
        if opt_name == "sgd-momentum":
            opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
        else:
            opt = torch.optim.AdamW(params, lr=1e-4, fused=opt_name == "adamw-fused" or None)
        scaler = torch.amp.GradScaler("cuda", enabled=precision == "amp-fp16")
        labels = torch.zeros(b, dtype=torch.long, device=dev) if seq_cls else ids
        for _ in range(2):
            with torch.autocast("cuda", amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                loss = model(input_ids=ids, labels=labels).loss
            scaler.scale(loss).backward()
            del loss
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    else:
        model.eval()
        n = wl.get("new_tokens", 0)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
            )
    torch.cuda.synchronize()
    out = {
        "case": name,
        "config": config_name,
        "workload": wl,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "nvml_process_bytes": _nvml_process(nvml),
        "nvml_device_used": _nvml_used(nvml),
        "nvml_device_used_baseline": baseline,
        "after_init": after_init,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    if alloc_trace_dir:
        out["alloc_trace"] = _dump_trace(name, alloc_trace_dir)
    return out


def _dump_trace(name: str, directory: str) -> str:
    import torch

    snap = torch.cuda.memory._snapshot()
    events = []
    for trace in snap.get("device_traces", []):
        for ev in trace:
            if ev["action"] in ("alloc", "free_completed"):
                events.append(("a" if ev["action"] == "alloc" else "f", ev["addr"], ev["size"]))
    path = Path(directory) / f"{name}.alloc.json"
    path.write_text(json.dumps(events))
    return path.name


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # NVML missing: the measurement still has the torch numbers
        return None


def _nvml_used(nvml) -> int | None:
    if nvml is None:
        return None
    return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).used)


def _nvml_process(nvml) -> int | None:
    if nvml is None:
        return None
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid() and proc.usedGpuMemory:
            return int(proc.usedGpuMemory)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--cases", nargs="*", default=None, help="run only these cases")
    ap.add_argument("--out", default=None, help="JSON Lines file for all cases")
    ap.add_argument("--alloc-trace", default=None, help="directory for allocation traces")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.alloc_trace)))
        return
    lines = []
    for name in args.cases or CASES:
        cmd = [sys.executable, __file__, "--case", name]
        if args.alloc_trace:
            cmd += ["--alloc-trace", args.alloc_trace]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            row = {"case": name, "error": proc.stderr.strip().splitlines()[-1:]}
        else:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        lines.append(json.dumps(row))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

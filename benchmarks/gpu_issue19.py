"""Issue 19's device measurements in one call: blocks, QLoRA, a variable-length LoRA run, MoE.

    PYTHONPATH=src python benchmarks/gpu_issue19.py --out DIR [--quick] [--parts a,b] [--dry-run]

On a CUDA GPU (meant for a lent H200: parts 1-3 sized for <= 8 minutes, part 4 not yet
timed on one; ``--parts`` splits a run) it measures, with
``torch.cuda.memory._record_memory_history`` snapshots and ``max_memory_allocated`` /
``max_memory_reserved``:

1. transformers' ``LlamaMLP``, ``LlamaAttention`` (SDPA) and ``LlamaRMSNorm`` in bf16 (Llama-3-8B
   sizes: hidden 4096, intermediate 14336, 32 heads, 8 KV heads), forward and backward, at
   4 x N tokens for a few N (the shape of issue 19's published MLP figures);
2. one QLoRA training step of a small Llama (bitsandbytes nf4, bf16 compute, LoRA r=16 on all
   linear layers), if bitsandbytes is installed;
3. a variable-length LoRA run (llama-3.2-1b's bundled config, random weights, bf16, LoRA r=16 on
   all linear layers, AdamW): step lengths drawn by ``memfit.estimate.seqrun.dist`` from the same
   distribution and seed memfit replays, ``max_memory_reserved`` after every step, in two child
   processes (``PYTORCH_CUDA_ALLOC_CONF`` unset, and ``expandable_segments:True``: the variable is
   read when CUDA initialises, so it takes a fresh process), then memfit's own ``--seq-dist``
   answer for the same job, for the comparison;
4. quantized MoE inference (``benchmarks/gpu_issue19_moe.py``): Qwen3-30B-A3B cut to 2 layers
   with block-wise FP8 experts, gpt-oss-20b cut to 2 layers in mxfp4 (if ``kernels`` is
   importable) and Qwen3-30B-A3B with bitsandbytes nf4, random weights, ``generate`` of 32 tokens
   after a 512-token prompt: memory after the load and at the generation peak, a snapshot, and
   memfit's in-process estimate of the same config and workload beside it.

``--parts`` runs a subset (``blocks,qlora,lora_run,moe_fp8,moe_mxfp4,moe_bnb``; default all).
``--dry-run`` needs no CUDA: the MoE parts build their models on the meta device with the
quantizer's module replacement and write memfit's prediction (the other parts have no dry path
and say so; it writes ``DIR/gpu_issue19_dry_run.json``).

Writes ``DIR/gpu_issue19.json`` (every figure, the versions and the GPU) and the snapshots
``DIR/*.pickle`` (open them at https://pytorch.org/memory_viz, or diff them size by size against
memfit's trace as docs/accuracy.md section 2 does). Each part runs on its own; a failing part
records its error and the others still run. Without CUDA it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_issue19_moe as moe  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                num_key_value_heads=8, hidden_act="silu", max_position_embeddings=8192,
                rms_norm_eps=1e-5, rope_theta=500000.0)  # fmt: skip
#: The run of part 3: memfit flags and the sampler's settings (both sides use these).
RUN = dict(model="llama-3.2-1b", batch=4, seq_dist="300,250,1024", seed=0, lora_rank=16)
PARTS = ("blocks", "qlora", "lora_run", *moe.JOBS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for gpu_issue19.json and the snapshots")
    p.add_argument("--quick", action="store_true", help="fewer sizes and steps (a smoke run)")
    p.add_argument("--steps", type=int, default=200, help="steps of the variable-length run")
    p.add_argument("--no-predict", action="store_true", help="skip memfit's own predictions")
    p.add_argument("--parts", type=parts_list, default=PARTS,
                   help=f"comma-separated subset of {','.join(PARTS)} (default all)")  # fmt: skip
    dry = "no CUDA: the MoE parts' models on the meta device, and memfit's predictions"
    p.add_argument("--dry-run", action="store_true", help=dry)
    p.add_argument("--child", choices=("lora-run",), help=argparse.SUPPRESS)
    p.add_argument("--expandable", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def parts_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown part(s) {unknown} in {text!r}; choose from {','.join(PARTS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch
    except ImportError:
        print("gpu_issue19: torch is not installed; nothing measured", file=sys.stderr)
        return 0
    if args.dry_run:
        return dry_run(args, out)
    if not torch.cuda.is_available():
        print("gpu_issue19: no CUDA device; nothing measured (run it on a GPU)", file=sys.stderr)
        return 0
    if args.child == "lora-run":
        print(json.dumps(lora_run(args.steps, args.expandable)))
        return 0
    results: dict[str, Any] = {"env": environment(), "started": time.time()}
    sizes = (512,) if args.quick else (512, 1024, 2048)
    steps = 20 if args.quick else args.steps
    if "blocks" in args.parts:
        results["blocks"] = guarded(lambda: blocks(sizes, out))
    if "qlora" in args.parts:
        results["qlora"] = guarded(lambda: qlora_step(out))
    if "lora_run" in args.parts:
        results["lora_run"] = {
            mode: guarded(lambda e=(mode == "expandable"): lora_child(steps, e))
            for mode in ("default", "expandable")
        }
        if not args.no_predict:
            results["memfit_seq_dist"] = guarded(lambda: memfit_prediction(steps))
    for part in (p for p in args.parts if p in moe.JOBS):
        results[part] = guarded(
            lambda part=part: moe.run_part(part, out, dry_run=False, predict=not args.no_predict)
        )
    results["wall_s"] = round(time.time() - results.pop("started"), 1)
    path = out / "gpu_issue19.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"gpu_issue19: wrote {path}")
    return 0


def dry_run(args: argparse.Namespace, out: Path) -> int:
    """The no-CUDA path: the MoE parts up to model construction (meta device) and memfit's
    prediction; the other parts are listed as not run."""
    results: dict[str, Any] = {"dry_run": True}
    for part in args.parts:
        if part in moe.JOBS:
            results[part] = guarded(
                lambda part=part: moe.run_part(part, out, dry_run=True, predict=not args.no_predict)
            )
        else:
            results[part] = {"skipped": "skipped: no dry-run path (needs CUDA)"}
    path = out / "gpu_issue19_dry_run.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"gpu_issue19: dry run, wrote {path}", file=sys.stderr)
    return 0


def guarded(part: Any) -> Any:
    started = time.time()
    try:
        value = part()
    except Exception as exc:  # a part's failure is a result; the others still run
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    return {"result": value, "wall_s": round(time.time() - started, 1)}


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    env["gpu"] = torch.cuda.get_device_name(0)
    for name in ("transformers", "peft", "bitsandbytes", "kernels"):
        try:
            env[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            env[name] = None
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    return env


def measure(fn: Any, snapshot: Path | None = None) -> dict[str, int]:
    """Peak allocated / reserved above what was live before ``fn`` ran, and after."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if snapshot is not None:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    fn()
    torch.cuda.synchronize()
    if snapshot is not None:
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    return {
        "base_allocated_bytes": base,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_above_base_bytes": torch.cuda.max_memory_allocated() - base,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def block_modules(cfg: Any, dev: str) -> tuple[dict[str, Any], Any]:
    """Part 1's modules and the rotary embedding (on ``dev``) for ``cfg``, a ``LlamaConfig``."""
    from transformers.models.llama import modeling_llama as ml

    made = {
        "mlp": ml.LlamaMLP(cfg),
        "attention": ml.LlamaAttention(cfg, layer_idx=0),
        "rmsnorm": ml.LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
    }
    # transformers 5.x: LlamaRotaryEmbedding(config) takes no device argument
    return made, ml.LlamaRotaryEmbedding(cfg).to(dev)


def blocks(sizes: tuple[int, ...], out: Path) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig

    cfg = LlamaConfig(**LLAMA_8B)
    cfg._attn_implementation = "sdpa"
    dev, dt = "cuda", torch.bfloat16
    made, rotary = block_modules(cfg, dev)
    results: dict[str, Any] = {}
    for name, module in made.items():
        module.to(device=dev, dtype=dt)
        for n in sizes:
            x = torch.randn(4, n, cfg.hidden_size, device=dev, dtype=dt, requires_grad=True)
            if name == "attention":
                pos = torch.arange(n, device=dev).unsqueeze(0)
                cos_sin = rotary(x, pos)

                def fwd(x=x, module=module, cos_sin=cos_sin) -> Any:
                    return module(x, position_embeddings=cos_sin, attention_mask=None)[0]
            else:

                def fwd(x=x, module=module) -> Any:
                    return module(x)

            box: dict[str, Any] = {}
            snap = out / f"{name}_4x{n}.pickle" if n == sizes[len(sizes) // 2] else None
            f = measure(lambda box=box, fwd=fwd: box.update(y=fwd()), snap)
            grad = torch.randn_like(box["y"])
            b = measure(lambda box=box, grad=grad: box["y"].backward(grad))
            results[f"{name}/4x{n}"] = {"forward": f, "backward": b}
            del box, grad, x
            module.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        module.to("meta")
    return results


def small_llama_dir(tmp: Path) -> Path:
    """A small random-weight Llama saved to disk (bitsandbytes quantizes when loading)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000)  # fmt: skip
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
    return tmp


def qlora_step(out: Path) -> dict[str, Any]:
    import tempfile

    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = small_llama_dir(Path(tmp))
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=q, device_map="cuda")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
    model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, 32000, (4, 512), device="cuda")

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first = measure(step, out / "qlora_step1.pickle")
    second = measure(step)
    return {"batch": 4, "seq": 512, "step1": first, "step2": second,
            "model_allocated_bytes": first["base_allocated_bytes"]}  # fmt: skip


def lora_child(steps: int, expandable: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--out", "/tmp", "--child", "lora-run", "--steps", str(steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def lora_run(steps: int, expandable: bool) -> dict[str, Any]:
    """The variable-length run itself (in a child process)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from memfit.estimate.seqrun.dist import parse_seq_dist, step_lengths
    from memfit.models import resolve_model
    from memfit.spec.seqrun import StepPlan

    config = resolve_model(str(RUN["model"])).config or {}
    cfg = LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).to("cuda")
    lora = LoraConfig(r=int(RUN["lora_rank"]), lora_alpha=2 * int(RUN["lora_rank"]),
                      lora_dropout=0.0, target_modules="all-linear")  # fmt: skip
    model = get_peft_model(model, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    plan = StepPlan(batch_size=int(RUN["batch"]), n_steps=steps, seed=int(RUN["seed"]))
    lengths = step_lengths(parse_seq_dist(str(RUN["seq_dist"])), plan)
    torch.cuda.reset_peak_memory_stats()
    reserved, allocated = [], []
    for n in lengths:
        ids = torch.randint(0, cfg.vocab_size, (int(RUN["batch"]), n), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        reserved.append(torch.cuda.max_memory_reserved())
        allocated.append(torch.cuda.max_memory_allocated())
    fixed_n = max(lengths)
    return {"lengths": lengths, "max_reserved_after_step": reserved,
            "max_allocated_after_step": allocated, "max_len_in_run": fixed_n,
            "expandable": expandable,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}  # fmt: skip


def memfit_prediction(steps: int) -> Any:
    """memfit's own answer for part 3's job (on this machine's CPUs)."""
    cmd = [sys.executable, "-m", "memfit", "estimate", str(RUN["model"]), "--batch",
           str(RUN["batch"]), "--precision", "bf16-true", "--lora-rank", str(RUN["lora_rank"]),
           "--seq-dist", str(RUN["seq_dist"]), "--seed", str(RUN["seed"]), "--run-steps",
           str(steps), "--gpu", "H200", "--json"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr.strip()[-500:])
    est = json.loads(done.stdout)
    return {"seq_dist": est.get("seq_dist"), "peak_reserved_bytes": est.get("peak_reserved_bytes")}


if __name__ == "__main__":
    raise SystemExit(main())

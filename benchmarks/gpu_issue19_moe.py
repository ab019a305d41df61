"""Part 4 of ``gpu_issue19.py``: quantized MoE inference measured next to memfit's prediction.

Three jobs, each a bundled config cut to ``LAYERS`` decoder layers with random weights (the
device has no internet: nothing is downloaded):

* ``moe_fp8``: Qwen3-30B-A3B's config, transformers' ``FineGrainedFP8Config`` (block-wise FP8,
  ``weight_block_size`` [128, 128]): the experts become ``FP8Experts``
  (``integrations/finegrained_fp8.py``), the Linear layers ``FP8Linear``; memfit ``--quant fp8``.
* ``moe_mxfp4``: gpt-oss-20b's config, ``Mxfp4Config`` (``Mxfp4GptOssExperts``, triton kernels
  from the ``kernels`` package); memfit ``--quant mxfp4``. Skipped, with the reason, when
  ``kernels`` is not importable or its hub kernel is not in the local cache (no internet).
* ``moe_bnb``: Qwen3-30B-A3B's config, ``BitsAndBytesConfig`` nf4 (``nn.Linear`` only: the
  3-D experts stay bf16); memfit ``--quant nf4``. Skipped when bitsandbytes is not importable.

On the GPU a random bf16 checkpoint is written to a temporary folder and loaded with the
quantization config (transformers quantizes on load, as it does a user's bf16 checkpoint), then
``generate`` runs ``WORKLOAD`` greedily. Recorded: ``memory_allocated`` / ``memory_reserved``
and their peaks after the load, the peaks of the generation, and ``_record_memory_history``
snapshots of the load and of the generation (``DIR/<part>_load.pickle``,
``_generate.pickle``). memfit's estimate of the same config and
workload (in-process, on the same machine) is written beside it with the ratio, so the file is
a ready comparison; a part whose loaded model lacks the quantized experts module (transformers
fell back to bf16) says so in ``warning``. ``dry_run`` does everything up to model
construction on the meta device (no CUDA needed): the quantizer's module replacement, the
parameter bytes it leaves, and memfit's prediction.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "memfit" / "models" / "configs"
#: Decoder layers kept (the full depth of each MoE layer: every expert, real widths).
LAYERS = 2
#: The generation every MoE part runs (and memfit estimates).
WORKLOAD = dict(batch_size=1, seq_len=512, new_tokens=32)
#: part -> (bundled config, memfit --quant, the module whose absence skips the part)
JOBS: dict[str, tuple[str, str, str | None]] = {
    "moe_fp8": ("qwen3-30b-a3b", "fp8", None),
    "moe_mxfp4": ("gpt-oss-20b", "mxfp4", "kernels"),
    "moe_bnb": ("qwen3-30b-a3b", "nf4", "bitsandbytes"),
}


def reduced_config(name: str) -> dict[str, Any]:
    """The bundled config cut to ``LAYERS`` layers, without a checkpoint quantization_config
    (the random checkpoint is bf16; the quantization is chosen on load)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    config["num_hidden_layers"] = LAYERS
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:LAYERS]
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    return config


#: The hub kernel transformers' ``replace_with_mxfp4_linear`` fetches (``get_kernel``); the
#: device has no internet, so it has to be in the local Hugging Face cache already.
MXFP4_KERNEL = "kernels-community/gpt-oss-triton-kernels"
#: The experts module each part's quantizer leaves (another one: transformers fell back).
EXPECTED_EXPERTS = {"fp8": "FP8Experts", "mxfp4": "Mxfp4GptOssExperts", "nf4": "Qwen3MoeExperts"}


def missing_dependency(part: str) -> str | None:
    """Why ``part`` cannot run here, or None."""
    module = JOBS[part][2]
    if module is not None and importlib.util.find_spec(module) is None:
        return f"skipped: {module} is not importable (pip install {module})"
    if JOBS[part][1] == "mxfp4" and not kernel_cached(MXFP4_KERNEL):
        return f"skipped: hub kernel {MXFP4_KERNEL} is not in the local cache (no internet here)"
    return None


def kernel_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return False
    return (Path(HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}").is_dir()


def quantization_config(quant: str) -> Any:
    import torch
    from transformers import BitsAndBytesConfig, FineGrainedFP8Config, Mxfp4Config

    if quant == "fp8":
        return FineGrainedFP8Config(weight_block_size=[128, 128])
    if quant == "mxfp4":
        return Mxfp4Config()
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip


def hf_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    return AutoConfig.for_model(config["model_type"], **fields)


def memfit_prediction(config: dict[str, Any], quant: str) -> dict[str, Any]:
    """memfit's estimate of the job, from the same reduced config (written to a temp folder)."""
    from memfit import WorkloadSpec, estimate

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        spec = WorkloadSpec(mode="infer", precision="bf16-true", quant=quant, **WORKLOAD)
        est = estimate(tmp, spec, gpu="H200")
    return {
        "engine": est.engine,
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "peak_phase": est.peak_phase,
        "components": est.components,
        "phases": {k: v.peak_allocated_bytes for k, v in est.phases.items()},
    }


def meta_model(part: str, config: dict[str, Any]) -> dict[str, Any]:
    """Builds the model on the meta device and applies the quantizer's module replacement
    (what ``from_pretrained`` does before loading weights): the bytes of what it leaves."""
    import torch
    from transformers import AutoModelForCausalLM

    quant = JOBS[part][1]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(config), dtype=torch.bfloat16)
    skip = ["lm_head"]
    if quant == "fp8":
        from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear

        replace_with_fp8_linear(model, modules_to_not_convert=skip,
                                quantization_config=quantization_config(quant))  # fmt: skip
    elif quant == "nf4":
        from transformers.integrations.bitsandbytes import replace_with_bnb_linear

        model = replace_with_bnb_linear(model, modules_to_not_convert=skip,
                                        quantization_config=quantization_config(quant))  # fmt: skip
    else:
        from transformers.integrations.mxfp4 import replace_with_mxfp4_linear

        replace_with_mxfp4_linear(model, quantization_config=quantization_config(quant),
                                  modules_to_not_convert=skip)  # fmt: skip
    tensors = [*model.parameters(), *model.buffers()]
    classes = sorted({type(m).__name__ for m in model.modules() if "Expert" in type(m).__name__})
    built: dict[str, Any] = {
        "meta_tensor_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "expert_modules": classes,
        "class": type(model).__name__,
    }
    if quant == "nf4":
        built["note"] = "bitsandbytes packs Params4bit when they move to CUDA: bf16 sizes here"
    return built


def run_part(part: str, out: Path, *, dry_run: bool, predict: bool = True) -> dict[str, Any]:
    name, quant, _ = JOBS[part]
    why = missing_dependency(part)
    if why is not None:
        return {"skipped": why}
    config = reduced_config(name)
    result: dict[str, Any] = {"config": name, "layers": LAYERS, "quant": quant, **WORKLOAD}
    result["built"] = meta_model(part, config) if dry_run else gpu_part(part, config, out)
    expected = EXPECTED_EXPERTS[quant]
    if expected not in result["built"]["expert_modules"]:
        result["warning"] = f"no {expected} module: transformers did not quantize the experts"
    if predict:
        result["memfit"] = memfit_prediction(config, quant)
        if not dry_run:
            measured = result["built"]["generate"]
            result["memfit_over_measured"] = {
                key: round(result["memfit"][key] / measured[key], 4)
                for key in ("peak_allocated_bytes", "peak_reserved_bytes")
            }
    return result


def gpu_part(part: str, config: dict[str, Any], out: Path) -> dict[str, Any]:
    """``measure_on_gpu``, leaving no recording on and no cached memory for the next part
    when it fails."""
    import gc

    import torch

    try:
        return measure_on_gpu(part, config, out)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        gc.collect()
        torch.cuda.empty_cache()


def measure_on_gpu(part: str, config: dict[str, Any], out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    quant = JOBS[part][1]
    with tempfile.TemporaryDirectory() as tmp:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(hf_config(config), dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        del model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        model = AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=quantization_config(quant), device_map="cuda"
        )
    model.eval()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(out / f"{part}_load.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    loaded = {
        "snapshot": f"{part}_load.pickle",
        "allocated_bytes": torch.cuda.memory_allocated(),
        "reserved_bytes": torch.cuda.memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }
    ids = torch.randint(0, int(config["vocab_size"]), (WORKLOAD["batch_size"], WORKLOAD["seq_len"]))
    ids = ids.to("cuda")
    torch.cuda.reset_peak_memory_stats()
    snapshot = out / f"{part}_generate.pickle"
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=WORKLOAD["new_tokens"],
                       min_new_tokens=WORKLOAD["new_tokens"])  # fmt: skip
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    generate = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "snapshot": snapshot.name,
    }
    classes = sorted({type(m).__name__ for m in model.modules() if "Expert" in type(m).__name__})
    del model
    torch.cuda.empty_cache()
    return {"load": loaded, "generate": generate, "expert_modules": classes}

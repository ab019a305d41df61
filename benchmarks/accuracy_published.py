"""Compare memfit's estimates with published GPU memory measurements.

Reads the curated records in ``shared/calibration/published_measurements.jsonl`` (papers, docs,
PRs; see the README beside it), keeps those memfit can reproduce honestly, runs memfit on each and
writes:

* ``benchmarks/results/published_comparison.jsonl``: one line per compared record (measured and
  predicted bytes, relative error, the workload used and every assumption made);
* ``benchmarks/results/published_comparison.md``: a table per metric, error statistics, and every
  skipped record with the reason.

A record is compared only when all of these hold (``select()``; the first failing rule is the skip
reason):

1. it has a number (not an OOM marker or a symbolic formula);
2. its metric maps to one of memfit's numbers (``METRICS``, found by ``MAPPED_METRIC_PATTERNS`` or
   by what is known of the source's script, ``BENCHMARK_SOURCES``);
3. its unit is unambiguous (``UNIT_BYTES``, or ``SOURCE_UNIT_BYTES`` where the source's arithmetic
   shows what "MB"/"GB" means);
4. its techniques map to memfit's: a quantization format in ``QUANTIZATIONS`` (declared, or named
   by the checkpoint, ``QUANTIZED_NAME_FORMATS``) and tensor parallelism ``TP=N`` — both for
   weight figures only — and no pipeline parallelism, ZeRO or offload (those are reproduced as
   tests, tests/estimate/test_sharding.py);
5. its model is a bundled config (by hub id, by ``SAME_SHAPES_AS``, or by the record's
   ``model_arch_key``); a standard HF model without a bundled config is skipped, not guessed;
6. its workload is stated well enough for the metric (``WORKLOAD_FIELDS``).

Records are run with ``memfit.estimate``, except benchmark tables whose loop ``estimate`` cannot
express (an LM head with ``loss = logits.sum()`` and no optimizer): that loop is traced with
``memfit.trace_step`` on the bundled config, and ``estimate``'s nearest workload is reported beside
it.

Run from the repository root (about two minutes on a 2-core laptop; no GPU needed)::

    .venv/bin/python benchmarks/accuracy_published.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import memfit
from memfit import MemoryEstimate, WorkloadSpec
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.models.bundled import find_bundled
from memfit.units import GB, MB, GiB, MiB

ROOT = Path(__file__).resolve().parents[1]
#: Where the records live: the shared folder next to the checkout, or inside it (device copies).
DATA_CANDIDATES = (
    ROOT.parent / "shared" / "calibration" / "published_measurements.jsonl",
    ROOT / "shared" / "calibration" / "published_measurements.jsonl",
)
RESULTS = ROOT / "benchmarks" / "results"
REGENERATE = ".venv/bin/python benchmarks/accuracy_published.py"

# --------------------------------------------------------------------------------------------
# Selection tables
# --------------------------------------------------------------------------------------------

#: Metric key -> the memfit number it is compared with.
METRICS = {
    "max_memory_allocated": "peak_allocated_bytes",
    "max_memory_reserved": "peak_reserved_bytes",
    "nvidia_smi_used": "device_used_bytes",
    "model_weights": "components['parameters'] (inference, at the peak)",
    "model_states": "parameters + gradients + optimizer_states (optimizer-phase peak)",
}

#: Substrings of a record's ``measured`` field (lower-cased) -> metric key, first match wins.
MAPPED_METRIC_PATTERNS = (
    ("max_memory_reserved", "max_memory_reserved"),
    ("max_memory_allocated", "max_memory_allocated"),
    ("nvidia-smi", "nvidia_smi_used"),
    ("nvml", "nvidia_smi_used"),
    ("model weights", "model_weights"),  # vLLM profiler: torch allocated after load
    ("weight memory", "model_weights"),
    ("model loading took", "model_weights"),  # vLLM startup log: weights only
    ("model states", "model_states"),  # ZeRO paper: (2 + 2 + K)·Ψ
    ("(2+2+k)", "model_states"),
    ("model_states", "model_states"),  # DeepSpeed estimate_zero3_model_states_mem_needs_all_live
    ("training using adam", "model_states"),  # accelerate estimate-memory
)

#: Metrics memfit has no number for, with the reason printed in the skip list.
UNMAPPED_METRIC_PATTERNS = (
    ("kv-cache blocks", "vLLM KV-cache pool (blocks): a serving-engine budget, not modelled"),
    ("kv cache size", "vLLM KV-cache pool (tokens): a serving-engine budget, not modelled"),
    ("dummy profiling run", "vLLM profiling-run activation peak: not modelled"),
    ("activation memory", "activation-only estimate: no metric mapping"),
    ("bytes per parameter", "per-parameter rule of thumb without a model"),
    ("saved by 8-bit optimizer", "difference between two runs (bitsandbytes 8-bit optimizer)"),
    ("buffer size", "an internal ZeRO buffer, not a memfit quantity"),
    ("(claim)", "a claim, not a measurement of a stated configuration"),
)

#: What is known of the scripts behind benchmark tables (the records only say "peak memory").
#: HF's SDPA tables come from fxmarty's training benchmark (gist 7e75cc39; the same loop is posted
#: in full in https://github.com/huggingface/transformers/pull/32092): no optimizer,
#: ``model.zero_grad(); outputs = model(**inputs); loss = outputs.logits.sum(); loss.backward()``,
#: input_ids only, then ``torch.cuda.max_memory_allocated() * 1e-6`` printed as "MB".
#: The BERT table was measured with ``BertLMHeadModel`` (PR 28802's description).
BENCHMARK_SOURCES = {
    "https://huggingface.co/docs/transformers/model_doc/bert": {
        "metric": "max_memory_allocated",
        "optimizer": "none",
        "head": "BertLMHeadModel (AutoModelForCausalLM)",
        "evidence": "https://github.com/huggingface/transformers/pull/28802",
        "note": "BertLMHeadModel built from the plain bert-base-uncased config (is_decoder unset, "
        "as from_pretrained gives it: bidirectional attention); transformers/torch versions are "
        "memfit's, not the source's (PyTorch 2.2.0)",
    },
    "https://huggingface.co/docs/transformers/model_doc/opt": {
        "metric": "max_memory_allocated",
        "optimizer": "none",
        "head": "OPTForCausalLM",
        "evidence": "https://github.com/huggingface/transformers/pull/33298",
        "note": "",
    },
    "https://huggingface.co/docs/transformers/model_doc/gpt_neox": {
        "metric": "max_memory_allocated",
        "optimizer": "none",
        "head": "GPTNeoXForCausalLM",
        "evidence": "https://github.com/huggingface/transformers/pull/31031",
        "note": "",
    },
}

#: Units that mean one thing wherever they appear.
UNIT_BYTES = {"GiB": GiB, "GB (GiB)": GiB, "MiB": MiB}
#: Decimal units, trusted only where the source's arithmetic shows them: HF's SDPA script prints
#: bytes * 1e-6; the ZeRO paper's 16 B x 7.5e9 = 120 GB is decimal.
SOURCE_UNIT_BYTES = {
    "https://huggingface.co/docs/transformers/model_doc/bert": {"MB": MB},
    "https://huggingface.co/docs/transformers/model_doc/opt": {"MB": MB},
    "https://huggingface.co/docs/transformers/model_doc/gpt_neox": {"MB": MB},
    "https://arxiv.org/abs/1910.02054": {"GB": GB},
}

#: Sharding values that still mean one GPU holding the whole model (plain data parallelism keeps a
#: full replica per GPU).
SINGLE_GPU_SHARDING = (None, "TP=1", "TP=1, PP=1", "plain DP")
#: Markers of a quantized checkpoint in a model name (some records leave ``quantization`` empty
#: although the checkpoint is, e.g. RedHatAI/...-FP8-dynamic).
QUANTIZED_NAME_MARKERS = ("fp8", "int4", "int8", "w4a16", "w8a8", "gptq", "awq", "mxfp4", "nf4")

#: Hub models not bundled under their own name whose tensor shapes equal a bundled config's
#: (hidden, layers, heads, KV heads, intermediate, vocab, tied embeddings all the same).
SAME_SHAPES_AS = {
    # Llama 3 -> 3.1 changed the RoPE scaling and context length only.
    "meta-llama/Meta-Llama-3-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    # The ZeRO paper's GPT-2 1.5B: 48 layers, hidden 1600, 25 heads = gpt2-xl.
    "GPT-2 1.5B": "gpt2-xl",
}

#: A record's precision text -> (memfit precision, assumption or None).
PRECISIONS = {
    "bf16": ("bf16", None),
    "fp16": ("fp16", None),
    "fp32 (--dtype float32)": ("fp32", None),
    "fp16 (model loaded with torch_dtype=float16)": ("fp16", None),
    # quantized checkpoints: the activation dtype, which unquantized weights keep
    "bf16 act": ("bf16", None),
    "fp16 act": ("fp16", None),
    "fp16 mixed (fp32 master+Adam)": (
        "amp-fp16",
        "ZeRO's mixed precision holds fp16 params+grads and fp32 master/momentum/variance "
        "(2+2+12 B/param); memfit's amp-fp16 holds fp32 params+grads and two fp32 moments "
        "(4+4+8 B/param): the same 16 B/param in total",
    ),
}
#: What a vLLM "weights" figure holds besides the checkpoint's tensors.
VLLM_WEIGHTS_NOTE = (
    "vLLM's weights figure also holds its RoPE cos/sin cache (max_position_embeddings x head_dim "
    "in the model dtype, e.g. 32 MiB for Llama-3.1-8B in bf16); HF computes RoPE on the fly, so "
    "memfit's parameters lack it"
)
#: HF ``torch_dtype`` -> memfit precision (vLLM's ``--dtype auto`` loads the config's dtype).
CONFIG_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

#: A record's optimizer text -> (memfit optimizer, assumption).
OPTIMIZERS = {
    "Adam": ("adamw", "optimizer 'Adam' run as AdamW: the same two fp32 moments per parameter"),
    "Adam (K=12)": ("adamw", "'Adam (K=12)' run as AdamW: K counts the fp32 master copy too"),
}

#: A record's attention implementation -> memfit attention.
ATTENTIONS = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}

#: Workload fields each metric needs stated (model states and weights do not depend on the batch).
WORKLOAD_FIELDS = {
    "max_memory_allocated": ("mode", "precision", "batch_size", "seq_len", "attention_impl"),
    "max_memory_reserved": ("mode", "precision", "batch_size", "seq_len", "attention_impl"),
    "nvidia_smi_used": ("mode", "precision", "batch_size", "seq_len"),
    "model_weights": ("precision",),
    "model_states": ("precision", "optimizer"),
}
#: Batch and sequence length used where the metric does not depend on them (weights, states).
STATE_ONLY_BATCH, STATE_ONLY_SEQ = 1, 64

#: memfit's pure precisions -> torch dtype name (the benchmark loop loads the model in it).
#: The loop's model dtype; the precision names of ``spec.PRECISION_RULES`` map as "fp16"/"bf16"
#: did before those names were introduced (the loop itself runs no autocast).
TORCH_DTYPES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "16-mixed": "float16",
    "16-true": "float16",
    "bf16-mixed": "bfloat16",
    "bf16-true": "bfloat16",
}

#: Record GPU text prefix -> memfit catalog name (affects only reserved/device-used numbers).
GPUS = {
    "H100 80GB": "H100-80GB",
    "A100-80GB": "A100-80GB",
    "A100 80GB": "A100-80GB",
    "L40S": "L40S",
    "RTX 3090": "RTX-3090",
}


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


class Skip(Exception):
    """A record memfit cannot reproduce honestly; the message is the reason."""


@dataclass
class Case:
    """One record memfit can reproduce: what to run and what to compare."""

    record: dict[str, Any]
    metric: str
    measured_bytes: int
    measured_from: str
    unit_bytes: float
    bundled: str
    workload: WorkloadSpec
    gpu: str | None
    runner: str  # "estimate" or "sdpa-benchmark-loop"
    assumptions: list[str] = field(default_factory=list)


def select(record: dict[str, Any]) -> Case:
    """A Case for ``record``, or raise Skip with the first rule it fails (module docstring)."""
    check_value(record)
    metric = metric_of(record)
    measured_bytes, measured_from, unit_bytes = measured_value(record)
    check_techniques(record)
    bundled, assumptions = bundled_model(record)
    workload, runner, more = workload_of(record, metric, bundled)
    return Case(
        record=record,
        metric=metric,
        measured_bytes=measured_bytes,
        measured_from=measured_from,
        unit_bytes=unit_bytes,
        bundled=bundled,
        workload=workload,
        gpu=gpu_of(record),
        runner=runner,
        assumptions=assumptions + more,
    )


def check_value(record: dict[str, Any]) -> None:
    value = record.get("value")
    if value is None:
        raise Skip(f"no measured value ({record.get('notes') or 'missing'})")
    if not isinstance(value, (int, float)):
        raise Skip(f"symbolic formula {value!r}, no number to compare")


def measured_value(record: dict[str, Any]) -> tuple[int, str, float]:
    """(bytes, how they were obtained, bytes per published unit)."""
    value, unit = record["value"], record.get("unit") or ""
    factor = UNIT_BYTES.get(unit) or SOURCE_UNIT_BYTES.get(record["url"], {}).get(unit)
    if record.get("value_bytes") is not None:
        factor = factor or record["value_bytes"] / value
        return round(record["value_bytes"]), "value_bytes", factor
    if factor is None:
        raise Skip(f"unit {unit!r} is not bytes or is ambiguous for this source")
    return round(value * factor), f"value x {unit} ({factor:g} B)", factor


def metric_of(record: dict[str, Any]) -> str:
    source = BENCHMARK_SOURCES.get(record["url"])
    if source is not None:
        return source["metric"]
    measured = (record.get("measured") or "").lower()
    for pattern, metric in MAPPED_METRIC_PATTERNS:
        if pattern in measured:
            return metric
    for pattern, reason in UNMAPPED_METRIC_PATTERNS:
        if pattern in measured:
            raise Skip(reason)
    raise Skip(f"metric {record.get('measured')!r} maps to no memfit number")


#: A record's quantization text (or a marker in a quantized checkpoint's name) -> (memfit quant,
#: the assumption that maps it).
QUANTIZATIONS = {
    "--quantization fp8 (online dynamic FP8)": (
        "fp8",
        "vLLM online FP8: fp8 weights with one "
        "per-tensor scale, lm_head and embeddings kept in bf16 = memfit's fp8",
    ),
    "FP8 dynamic (compressed-tensors)": (
        "fp8",
        "compressed-tensors FP8-dynamic: fp8 weights "
        "with a per-channel scale (memfit: per-tensor; the scales are < 0.1 % of the bytes)",
    ),
    "FP8 dynamic": (
        "fp8",
        "FP8-dynamic checkpoint: fp8 weights, per-channel scales "
        "(memfit: per-tensor; the scales are < 0.1 % of the bytes)",
    ),
    "GPTQ INT4 w4a16 (gptq_marlin)": (
        "int4-gptq",
        "RedHatAI w4a16 = GPTQ int4, group size 128; Marlin repacks the same bytes",
    ),
    "INT8 w8a8 (compressed-tensors)": (
        "int8",
        "compressed-tensors w8a8: int8 weights and one "
        "scale per output channel, the bytes of bitsandbytes LLM.int8 (int8 + per-row stats)",
    ),
}
#: Quantized checkpoints whose record leaves ``quantization`` empty: name marker -> the text.
QUANTIZED_NAME_FORMATS = {"fp8-dynamic": "FP8 dynamic"}


def quant_of(record: dict[str, Any]) -> tuple[str, list[str]]:
    """(memfit quant, assumptions); Skip for formats memfit does not model."""
    text = record.get("quantization")
    model = (record.get("model") or "").lower()
    if text is None:
        text = next((t for m, t in QUANTIZED_NAME_FORMATS.items() if m in model), None)
    if text is None:
        if any(marker in model for marker in QUANTIZED_NAME_MARKERS):
            raise Skip(f"quantized checkpoint ({record['model']}): format not stated")
        return "none", []
    if text not in QUANTIZATIONS:
        raise Skip(f"quantization ({text}): not mapped to a memfit format")
    quant, why = QUANTIZATIONS[text]
    return quant, [why]


def tp_of(record: dict[str, Any]) -> int:
    """The tensor-parallel degree of a TP-only record (1 for single-GPU records)."""
    sharding = record.get("sharding")
    if sharding in SINGLE_GPU_SHARDING and (record.get("num_gpus") or 1) == 1:
        return 1
    match = re.fullmatch(r"TP=(\d+)(, PP=1)?", sharding or "")
    if match is None or int(match.group(1)) != (record.get("num_gpus") or 1):
        raise Skip(f"sharding/offload ({sharding}): not mapped by this script")
    return int(match.group(1))


def check_techniques(record: dict[str, Any]) -> None:
    quant, _ = quant_of(record)
    if quant != "none" and metric_of(record) != "model_weights":
        raise Skip(f"quantized {metric_of(record)}: only weights are compared")
    if tp_of(record) > 1 and metric_of(record) != "model_weights":
        raise Skip("tensor parallelism: only weights per GPU are compared")
    if record.get("lora"):
        raise Skip(f"LoRA ({record['lora']}): not mapped by this script")


def bundled_model(record: dict[str, Any]) -> tuple[str, list[str]]:
    """The bundled config name for the record's model, with the assumption that maps it."""
    model, key = record.get("model") or "", record.get("model_arch_key") or ""
    found = find_bundled(model) if model else None
    if found is not None:
        return found.name, []
    if model in SAME_SHAPES_AS:
        name = SAME_SHAPES_AS[model]
        return name, [f"{model} traced with the bundled {name} config (same tensor shapes)"]
    found = find_bundled(key) if key else None
    if found is not None:
        return found.name, [f"{model} traced as {found.name} (the record's model_arch_key)"]
    if not model or "generic" in model or model.endswith("params"):
        raise Skip(f"no concrete architecture ({model or 'no model'})")
    raise Skip(f"no bundled config for {model} (a standard HF model: skipped, not guessed)")


def gpu_of(record: dict[str, Any]) -> str | None:
    text = record.get("gpu") or ""
    return next((name for prefix, name in GPUS.items() if text.startswith(prefix)), None)


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


def workload_of(
    record: dict[str, Any], metric: str, bundled: str
) -> tuple[WorkloadSpec, str, list[str]]:
    """(WorkloadSpec, runner, assumptions) for the metric; Skip if the record says too little."""
    precision, notes = precision_of(record, metric, bundled)
    stated = {**record, "precision": precision or None}
    missing = [f for f in WORKLOAD_FIELDS[metric] if stated.get(f) is None]
    if missing:
        raise Skip(f"workload not stated: {', '.join(missing)}")
    if metric == "model_weights":
        quant, quant_notes = quant_of(record)
        tp = tp_of(record)
        wl = WorkloadSpec(
            mode="infer",
            batch_size=STATE_ONLY_BATCH,
            seq_len=STATE_ONLY_SEQ,
            precision=precision,
            quant=quant,
            tp=tp,
            gpus=tp,
        )
        notes = notes + quant_notes + ["weights do not depend on batch/sequence (1 x 64 used)"]
        if tp > 1:
            notes.append(f"per GPU of tensor parallelism {tp} (Megatron-style splits)")
        if record.get("framework") == "vLLM":
            notes.append(VLLM_WEIGHTS_NOTE)
        return wl, "estimate", notes
    if metric == "model_states":
        optimizer, why = optimizer_of(record)
        wl = WorkloadSpec(
            mode="train",
            batch_size=STATE_ONLY_BATCH,
            seq_len=STATE_ONLY_SEQ,
            precision=precision,
            optimizer=optimizer,
        )
        return wl, "estimate", notes + [why, "model states do not depend on batch/sequence"]
    return step_workload(record, precision, notes)


def precision_of(record: dict[str, Any], metric: str, bundled: str) -> tuple[str, list[str]]:
    """The memfit precision ("" if not stated); vLLM weights with no dtype stated use vLLM's
    default, the config's dtype."""
    text = record.get("precision")
    if text is None and metric == "model_weights" and record.get("framework") == "vLLM":
        dtype = resolve_model(bundled).config.get("torch_dtype")
        if dtype in CONFIG_DTYPES:
            why = f"dtype not stated: vLLM's default --dtype auto loads the config's {dtype}"
            return CONFIG_DTYPES[dtype], [why]
    if text is None:
        return "", []
    if text not in PRECISIONS:
        raise Skip(f"precision {text!r} has no memfit equivalent")
    precision, why = PRECISIONS[text]
    return precision, [why] if why else []


def optimizer_of(record: dict[str, Any]) -> tuple[str, str]:
    source = BENCHMARK_SOURCES.get(record["url"])
    if source is not None:
        return source["optimizer"], (
            f"optimizer: none, as in the source's benchmark loop ({source['evidence']})"
        )
    text = record.get("optimizer")
    if text not in OPTIMIZERS:
        raise Skip(f"optimizer {text!r} not stated or not mapped")
    return OPTIMIZERS[text]


def step_workload(
    record: dict[str, Any], precision: str, notes: list[str]
) -> tuple[WorkloadSpec, str, list[str]]:
    """Training steps (no record states the generated-token count an inference run needs)."""
    if not record["mode"].startswith("training"):
        raise Skip("inference: number of generated tokens not stated")
    if record["attention_impl"] not in ATTENTIONS:
        raise Skip(f"attention {record['attention_impl']!r} has no memfit equivalent")
    optimizer, why = optimizer_of(record)
    wl = WorkloadSpec(
        mode="train",
        batch_size=int(record["batch_size"]),
        seq_len=int(record["seq_len"]),
        precision=precision,
        attention=ATTENTIONS[record["attention_impl"]],
        optimizer=optimizer,
    )
    notes = notes + [why]
    runner = "sdpa-benchmark-loop" if record["url"] in BENCHMARK_SOURCES else "estimate"
    if runner == "sdpa-benchmark-loop":
        source = BENCHMARK_SOURCES[record["url"]]
        notes = notes + [
            f"the source's loop is traced with memfit.trace_step: {source['head']}, input_ids "
            "only, loss = logits.sum(), the previous step's outputs alive until reassigned",
            source["note"],
        ]
        notes = [n for n in notes if n]
    return wl, runner, notes


# --------------------------------------------------------------------------------------------
# Running memfit
# --------------------------------------------------------------------------------------------


def estimate_case(case: Case) -> MemoryEstimate:
    """The estimate the case's metric is read from."""
    if case.runner == "sdpa-benchmark-loop":
        return trace_sdpa_benchmark(case)
    return memfit.estimate(case.bundled, case.workload, gpu=case.gpu)


def predict(case: Case) -> dict[str, Any]:
    """memfit's number for the case's metric (and estimate()'s nearest one for benchmark loops)."""
    est = estimate_case(case)
    extra = {}
    if case.runner == "sdpa-benchmark-loop":
        api = memfit.estimate(case.bundled, nearest_api_workload(case.workload), gpu=case.gpu)
        extra = {"predicted_bytes_estimate_api": api.peak_allocated_bytes}
    return {"predicted_bytes": metric_bytes(est, case.metric), "engine": case.runner, **extra}


def metric_bytes(est: MemoryEstimate, metric: str) -> int:
    if metric == "model_weights":
        return est.components["parameters"]
    if metric == "model_states":
        comps = est.phases["optimizer"].components
        return comps["parameters"] + comps["gradients"] + comps["optimizer_states"]
    return int(getattr(est, METRICS[metric]))


def nearest_api_workload(wl: WorkloadSpec) -> WorkloadSpec:
    """What ``memfit.estimate`` can express of the benchmark: a seq-cls head with its CE loss."""
    return dataclasses.replace(wl, task="seq-cls")


def trace_sdpa_benchmark(case: Case) -> MemoryEstimate:
    """fxmarty's SDPA training loop on the bundled config, traced on fake tensors."""
    import torch
    import transformers

    config = dict(resolve_model(case.bundled).config)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config,
            attn_implementation=case.workload.attention,
            dtype=getattr(torch, TORCH_DTYPES[case.workload.precision]),
        )
    model.train()
    held: dict[str, Any] = {}

    def step(m: torch.nn.Module, _optimizer: Any, batch: dict[str, Any]) -> None:
        m.zero_grad()
        held["outputs"] = m(**batch)  # the previous outputs die only at this assignment
        held["loss"] = held["outputs"].logits.sum()
        held["loss"].backward()

    shape = (case.workload.batch_size, case.workload.seq_len)
    ids = torch.randint(0, hf_config.vocab_size - 1, shape, device="meta")
    gpu = get_gpu(case.gpu) if case.gpu else None
    return memfit.trace_step(step, model=model, inputs={"input_ids": ids}, gpu=gpu)


def compare(case: Case) -> dict[str, Any]:
    """The JSON line for one compared record."""
    r = case.record
    out = predict(case)
    return {
        "id": r["id"],
        "url": r["url"],
        "source": r["source"],
        "model": r.get("model"),
        "memfit_model": case.bundled,
        "gpu": case.gpu,
        "workload": case.workload.normalized(),
        "metric": case.metric,
        "memfit_quantity": METRICS[case.metric],
        "measured": f"{r['value']} {r['unit']}",
        "value_bytes": case.measured_bytes,
        "measured_from": case.measured_from,
        "unit_bytes": case.unit_bytes,
        **out,
        "relative_error": out["predicted_bytes"] / case.measured_bytes - 1,
        "assumptions": case.assumptions,
        "reliability": r.get("reliability"),
        "completeness": r.get("completeness"),
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def short_workload(row: dict[str, Any]) -> str:
    wl = row["workload"]
    if row["metric"] == "model_weights":
        quant = f", {wl['quant']}" if wl.get("quant", "none") != "none" else ""
        tp = f", per GPU of tp {wl['tp']}" if wl.get("tp", 1) > 1 else ""
        return f"weights, {wl['precision']}{quant}{tp}"
    if row["metric"] == "model_states":
        return f"model states, {wl['precision']}, {wl['optimizer']}"
    return (
        f"{wl['mode']} {wl['precision']} {wl['attention']} b{wl['batch_size']} s{wl['seq_len']}"
        f" opt={wl.get('optimizer', '-')}"
    )


def in_unit(n_bytes: int, row: dict[str, Any]) -> str:
    unit = row["measured"].split(" ", 1)[1]
    return f"{n_bytes / row['unit_bytes']:.4g} {unit}"


def metric_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| id | model | workload | measured | predicted | error | source |",
        "|---|---|---|---|---|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['id']} | {row['memfit_model']} | {short_workload(row)} | {row['measured']} "
            f"| {in_unit(row['predicted_bytes'], row)} | {row['relative_error']:+.1%} "
            f"| [link]({row['url']}) |"
        )
    return lines


def metric_stats(rows: list[dict[str, Any]]) -> list[str]:
    errors = [abs(r["relative_error"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["relative_error"]))
    under = sum(r["relative_error"] < 0 for r in rows)
    return [
        f"n = {len(rows)}; median |error| = {statistics.median(errors):.1%}; worst = "
        f"{worst['relative_error']:+.1%} ({worst['id']}); under-predictions: {under} of "
        f"{len(rows)}",
    ]


def api_note(rows: list[dict[str, Any]]) -> list[str]:
    """How far ``memfit.estimate``'s nearest built-in step lands on the benchmark-loop rows."""
    api = [r for r in rows if "predicted_bytes_estimate_api" in r]
    if not api:
        return []
    lines = [
        "",
        "`memfit.estimate` cannot express this loop (LM head, `logits.sum()` without labels); its "
        "nearest workload (seq-cls head with cross-entropy, optimizer none) gives:",
        "",
    ]
    for r in api:
        err = r["predicted_bytes_estimate_api"] / r["value_bytes"] - 1
        lines.append(f"- {r['id']}: {in_unit(r['predicted_bytes_estimate_api'], r)} ({err:+.1%})")
    return lines


def assumption_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One bullet per distinct list of assumptions, naming the records it applies to."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in rows:
        groups.setdefault(tuple(r["assumptions"]), []).append(r["id"])
    return [f"- {', '.join(ids)}: " + "; ".join(a) for a, ids in groups.items() if a]


def markdown(rows: list[dict[str, Any]], skipped: list[tuple[str, str]], n_total: int) -> str:
    out = [
        "# memfit vs published GPU memory measurements",
        "",
        f"{len(rows)} of {n_total} records compared; {len(skipped)} skipped (list below). "
        "Error = predicted / measured - 1. Per-record workloads and assumptions are in "
        "`published_comparison.jsonl`; the selection rules are in the script's docstring.",
    ]
    for metric, quantity in METRICS.items():
        group = [r for r in rows if r["metric"] == metric]
        out += ["", f"## {metric} (memfit: `{quantity}`)", ""]
        if not group:
            out.append("No record could be compared.")
            continue
        out += metric_table(group) + [""] + metric_stats(group) + api_note(group)
    out += ["", "## Assumptions", ""] + assumption_lines(rows)
    out += ["", f"## Skipped ({len(skipped)})", ""]
    out += [f"- {rid} — {reason}" for rid, reason in skipped]
    out += ["", "## Regenerate", "", f"    {REGENERATE}", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run(
    records: list[dict[str, Any]], log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Compare every record memfit can reproduce; collect (id, reason) for the others."""
    rows: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for record in records:
        try:
            case = select(record)
        except Skip as why:
            skipped.append((record["id"], str(why)))
            continue
        row = compare(case)
        log(f"{row['id']:40s} {row['relative_error']:+7.1%}")
        rows.append(row)
    return rows, skipped


def quiet_transformers() -> None:
    """transformers warns about config fields of the bundled configs; the run does not need it."""
    import transformers

    transformers.logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = next((p for p in DATA_CANDIDATES if p.exists()), DATA_CANDIDATES[0])
    parser.add_argument("--data", type=Path, default=default)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    quiet_transformers()
    records = load(args.data)
    rows, skipped = run(records, lambda line: print(line, file=sys.stderr))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = args.out_dir / "published_comparison.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = args.out_dir / "published_comparison.md"
    md.write_text(markdown(rows, skipped, len(records)), encoding="utf-8")
    print(f"compared {len(rows)}, skipped {len(skipped)}: wrote {jsonl} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""memfit's advice on jobs people actually run (issue 29, "Done means").

    PYTHONPATH=src .venv/bin/python benchmarks/practice.py              # run, write results
    PYTHONPATH=src .venv/bin/python benchmarks/practice.py --only litgpt # a subset (by id)
    PYTHONPATH=src .venv/bin/python benchmarks/practice.py --write-doc  # also docs/planning.md

The jobs are common recipes from the frameworks' own docs and READMEs, each with its source (URL or
repo + path + commit), the settings it states, quoted, and the GPU it names. Every job is written
in memfit's own CLI terms:

* ``recipe``: the documented recipe as ``memfit estimate`` flags (its precision, quantization,
  adapter, checkpointing, optimizer, batch split), without ``--gpu``;
* ``plan``: what a user with that recipe types to ask memfit for advice (``memfit plan`` with
  the recipe's shape, adapter, optimizer and, for QLoRA, its ``--quant``); ``--precision`` for a
  full fine-tune (its framework's precision is the user's choice) and for a recipe off memfit's
  LoRA default, bf16-true (fp16 on a T4, TRL's float32 weights under bf16 autocast); a
  bf16 LoRA / QLoRA job leaves it to memfit's default (bf16 in the framework is the default
  there, and memfit's is what is tested);
* ``file``: for a job whose source is a config file, the copy memfit reads with ``--from``.

Diffusion jobs run ``memfit estimate`` (a DiffusionJob has no planner), serving jobs ``memfit
vllm``: their ``recipe`` is that command's flags and ``plan`` is empty.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
LITGPT_CONFIGS = ROOT / "data" / "litgpt_config_hub"
PRACTICE_DATA = ROOT / "data" / "practice"

KINDS = ("train", "diffusion", "vllm")


@dataclass(frozen=True)
class Job:
    id: str
    framework: str
    kind: str
    model: str
    gpu: str
    source: str
    quote: str
    recipe: tuple[str, ...]
    plan: tuple[str, ...] = ()
    file: str | None = None
    #: why the GPU is this catalog card (where the source names memory, not a card)
    gpu_note: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: where the evidence says the source's GPU is too small for its own recipe: memfit's
    #: expected answer, checked against what memfit answers (:func:`expected_outcome`)
    expect: Expect | None = None


@dataclass(frozen=True)
class Expect:
    """A job whose documented GPU the evidence contradicts: nothing fits per memfit, and the
    closest plan's verdict (``memfit.estimate.verdict.judge``: ``tight`` or ``does not fit``)
    is ``verdict`` for the reason ``why`` (the arithmetic and its sources). Check (a) reports
    such a job as ``known`` when memfit answers that verdict, FAIL when it answers another."""

    verdict: str
    why: str


# -- LitGPT config_hub/finetune: the README's table is "1xA10G" for every row -------------------
LITGPT_SOURCE = (
    "Lightning-AI/litgpt@00af8b0d9b43 config_hub/finetune/{row}.yaml; GPU from "
    "config_hub/finetune/README.md at that commit (and @03ffc5515b25: 'All experiments were "
    "conducted using bfloat-16 precision on the Alpaca2k dataset', Hardware column '1xA10G')"
)
#: LitGPT config folder -> memfit bundled model (folders without a bundled config are left out:
#: gemma-2b (memfit bundles gemma-2, not gemma-1), stablelm-base-alpha-3b)
LITGPT_MODELS = {
    "llama-3.1-8b": "llama-3.1-8b",
    "llama-3.2-1B": "llama-3.2-1b",
    "llama-3.2-3B": "llama-3.2-3b",
    "mistral-7b": "mistral-7b-v0.1",
    "llama-2-7b": "llama-2-7b",
    "phi-2": "phi-2",
    "phi-3": "phi-3-mini-4k",
    "tiny-llama": "tinyllama-1.1b",
    "falcon-7b": "falcon-7b",
}
#: LitGPT's lora_* switches -> memfit's LoRA roles (lora_head: LitGPT's lm_head, no memfit role)
LITGPT_ROLES = {
    "lora_query": "q",
    "lora_key": "k",
    "lora_value": "v",
    "lora_projection": "o",
    "lora_mlp": "mlp",
}


def litgpt_job(folder: str, method: str) -> Job:
    """A LitGPT config_hub row read from its YAML (the keys below are LitGPT's; litgpt/finetune/
    lora.py and full.py use AdamW, no activation checkpointing)."""
    path = LITGPT_CONFIGS / folder / f"{method}.yaml"
    cfg = yaml.safe_load(path.read_text())
    train = cfg["train"]
    micro, per_step = int(train["micro_batch_size"]), int(train["global_batch_size"])
    seq = int(train["max_seq_length"])
    precision = cfg["precision"]
    recipe = ["--mode", "train", "--batch", str(micro), "--seq", str(seq)]
    recipe += ["--grad-accum", str(per_step // micro), "--precision", precision]
    recipe += ["--optimizer", "adamw", "--checkpointing", "none"]
    plan = ["--seq", str(seq), "--global-batch", str(per_step)]
    if method == "full" or precision not in ("bf16-true", "bf16-mixed"):
        plan += ["--precision", precision]
    quoted = [f"precision: {precision}"]
    if method != "full":
        roles = [r for k, r in LITGPT_ROLES.items() if cfg.get(k)]
        rank = int(cfg["lora_r"])
        recipe += ["--lora-rank", str(rank), "--lora-targets", ",".join(roles)]
        plan += ["--lora-rank", str(rank), "--lora-targets", ",".join(roles)]
        quoted.append(
            f"lora_r: {rank}, " + ", ".join(f"{k}: true" for k in LITGPT_ROLES if cfg.get(k))
        )
        if cfg.get("lora_head"):
            quoted.append("lora_head: true (not modelled: no memfit role for lm_head)")
    if cfg.get("quantize"):
        recipe += ["--quant", "nf4"]  # bnb.nf4: no double quantization in LitGPT's mapping
        plan += ["--quant", "nf4"]
        quoted.append(f"quantize: {cfg['quantize']}")
    quoted.append(
        f"micro_batch_size: {micro}, global_batch_size: {per_step}, max_seq_length: {seq}"
    )
    return Job(
        id=f"litgpt-{folder}-{method}",
        framework="litgpt",
        kind="train",
        model=LITGPT_MODELS[folder],
        gpu="A10G",
        source=LITGPT_SOURCE.format(row=f"{folder}/{method}"),
        quote="; ".join(quoted),
        recipe=tuple(recipe),
        plan=tuple(plan),
        file=str(path.relative_to(ROOT.parent)),
    )


def litgpt_jobs() -> list[Job]:
    out = []
    for folder in LITGPT_MODELS:
        for method in ("full", "lora", "qlora"):
            if (LITGPT_CONFIGS / folder / f"{method}.yaml").exists():
                out.append(litgpt_job(folder, method))
    return out


# -- torchtune README "Optimization flags" (Llama 3.2 3B, A100) ---------------------------------
TORCHTUNE_SOURCE = (
    "pytorch/torchtune@1814feb17a90 README.md 'Optimization flags' (the table measured on an "
    "A100: 'Llama 3.2 3B ... batch size 2, max sequence length 4096 (packed), bf16'); LoRA / "
    "QLoRA models: recipes/configs/llama3_2/3B_(q)lora_single_device.yaml at that commit "
    "(q_proj, v_proj, output_proj + MLP, rank 64)"
)
TORCHTUNE_BASE = ("--mode", "train", "--batch", "2", "--seq", "4096", "--precision", "bf16-true")


def torchtune_jobs() -> list[Job]:
    lora = ("--lora-rank", "64", "--lora-targets", "q,v,o,mlp")
    rows = [
        (
            "full-packed",
            "full_finetune_single_device, '+ Packed Dataset' row: AdamW, no checkpointing",
            TORCHTUNE_BASE + ("--optimizer", "adamw", "--checkpointing", "none"),
            (
                "--seq",
                "4096",
                "--global-batch",
                "2",
                "--keep-full-finetune",
                "--precision",
                "bf16-true",
            ),
        ),  # fmt: skip
        (
            "full-ckpt",
            "'+ Activation Checkpointing' row (full fine-tune, AdamW, checkpointing on)",
            TORCHTUNE_BASE + ("--optimizer", "adamw", "--checkpointing", "full"),
            (
                "--seq",
                "4096",
                "--global-batch",
                "2",
                "--keep-full-finetune",
                "--precision",
                "bf16-true",
            ),
        ),  # fmt: skip
        (
            "full-8bit-adamw",
            "'+ 8-bit AdamW' row (full fine-tune, checkpointing, bitsandbytes AdamW8bit)",
            TORCHTUNE_BASE + ("--optimizer", "adamw-8bit", "--checkpointing", "full"),
            (
                "--seq",
                "4096",
                "--global-batch",
                "2",
                "--keep-full-finetune",
                "--optimizer",
                "adamw-8bit",
                "--precision",
                "bf16-true",
            ),
        ),  # fmt: skip
        (
            "lora",
            "'LoRA' row: lora_finetune_single_device, rank 64 on q, v, output_proj + MLP, "
            "activation checkpointing on",
            TORCHTUNE_BASE + ("--optimizer", "adamw", "--checkpointing", "full") + lora,
            ("--seq", "4096", "--global-batch", "2", *lora),
        ),
        (
            "qlora",
            "'QLoRA' row: as LoRA with the base in NF4 (torchtune's qlora_ builders)",
            TORCHTUNE_BASE
            + ("--optimizer", "adamw", "--checkpointing", "full", "--quant", "nf4")
            + lora,
            ("--seq", "4096", "--global-batch", "2", *lora, "--quant", "nf4"),
        ),
    ]
    return [
        Job(
            id=f"torchtune-llama3_2-3b-{name}",
            framework="torchtune",
            kind="train",
            model="llama-3.2-3b",
            gpu="A100-80GB",
            gpu_note="README names 'A100' (80 GB assumed: its full-finetune row peaks at 60 GiB)",
            source=TORCHTUNE_SOURCE,
            quote=quote,
            recipe=recipe,
            plan=plan,
        )
        for name, quote, recipe, plan in rows
    ]


# -- axolotl examples/llama-3 (README states the VRAM each needs) -------------------------------
AXOLOTL_README = (
    "axolotl-ai-cloud/axolotl@3d1f5fa1a982 examples/llama-3/README.md: "
    "'[Full Fine Tune](./fft-8b.yaml) - Single GPU @ 48GB VRAM', "
    "'[LoRA](./lora-8b.yml) - Single GPU @ 11GB VRAM'"
)


def axolotl_jobs() -> list[Job]:
    return [
        Job(
            id="axolotl-llama-3-fft-8b",
            framework="axolotl",
            kind="train",
            model="llama-3.1-8b",
            gpu="RTX-A6000",
            gpu_note="README: 'Single GPU @ 48GB VRAM'; RTX-A6000 is the catalog's 48 GB card",
            source=AXOLOTL_README + "; config axolotl-ai-cloud/axolotl@15f7910d33b4 "
            "examples/llama-3/fft-8b.yaml",
            quote="base_model: meta-llama/Meta-Llama-3-8B; sequence_len: 8192; sample_packing: "
            "true; micro_batch_size: 1; gradient_accumulation_steps: 8; optimizer: "
            "paged_adamw_8bit; bf16: auto; gradient_checkpointing: true; flash_attention: true",
            recipe=(
                "--mode",
                "train",
                "--batch",
                "1",
                "--seq",
                "8192",
                "--grad-accum",
                "8",
                "--precision",
                "bf16-true",
                "--optimizer",
                "paged-adamw-8bit",
                "--checkpointing",
                "full",
                "--attention",
                "flash",
            ),
            plan=(
                "--seq",
                "8192",
                "--global-batch",
                "8",
                "--keep-full-finetune",
                "--optimizer",
                "paged-adamw-8bit",
                "--attention",
                "flash",
                "--precision",
                "bf16-true",
            ),
            file="benchmarks/data/practice/axolotl-llama-3-fft-8b.yaml",
            notes=(
                "Llama-3-8B modelled as the bundled Llama-3.1-8B (same shapes but rope "
                "scaling); bf16: auto on a bf16 GPU loads the model in bf16 (bf16-true)",
                "the example sets no liger_fused_linear_cross_entropy / cut_cross_entropy key "
                "(nor at axolotl@067b021c8b87): the recipe keeps transformers' full-logits "
                "loss; a plan with the fused loss (Liger) is a memory-only change memfit may "
                "propose",
            ),
        ),  # fmt: skip
        Job(
            id="axolotl-llama-3-lora-8b",
            framework="axolotl",
            kind="train",
            model="llama-3.1-8b",
            gpu="RTX-3060",
            gpu_note="README: 'Single GPU @ 11GB VRAM'; RTX-3060 (12 GB) is the catalog's "
            "smallest card with at least 11 GB",
            source=AXOLOTL_README + "; config axolotl-ai-cloud/axolotl@107c67ae5a23 "
            "examples/llama-3/lora-8b.yml",
            quote="load_in_8bit: true; adapter: lora; lora_r: 32; lora_target_linear: true; "
            "lora_modules_to_save: [embed_tokens, lm_head]; sequence_len: 4096; sample_packing: "
            "true; micro_batch_size: 2; gradient_accumulation_steps: 4; optimizer: "
            "adamw_bnb_8bit; bf16: auto; gradient_checkpointing: true; flash_attention: true",
            recipe=(
                "--mode",
                "train",
                "--batch",
                "2",
                "--seq",
                "4096",
                "--grad-accum",
                "4",
                "--precision",
                "bf16-true",
                "--optimizer",
                "adamw-8bit",
                "--checkpointing",
                "full",
                "--attention",
                "flash",
                "--lora-rank",
                "32",
                "--lora-targets",
                "all-linear",
                "--quant",
                "int8",
                "--lora-modules-to-save",
                "embed_tokens,lm_head",
            ),
            plan=(
                "--seq",
                "4096",
                "--global-batch",
                "8",
                "--lora-rank",
                "32",
                "--optimizer",
                "adamw-8bit",
                "--attention",
                "flash",
                "--quant",
                "int8",
                "--lora-modules-to-save",
                "embed_tokens,lm_head",
            ),
            file="benchmarks/data/practice/axolotl-llama-3-lora-8b.yml",
            notes=(
                "lora_modules_to_save: [embed_tokens, lm_head] is --lora-modules-to-save: peft "
                "trains a copy of each (two 0.5 B-parameter matrices in the base's dtype, their "
                "gradients and 8-bit states) beside the frozen originals; the README's 11 GB "
                "dates from axolotl@15f7910d3 (2024-04-18), before axolotl@230e0ac36 "
                "(2024-05-28, 'Fix Lora config error for Llama3') added the key to the example "
                "because it sets special_tokens: the 11 GB is a job without these copies",
                "no plan that trains these copies fits 12 GB on one GPU by memfit's counts: the "
                "closest attempt's parameters (7.58 GiB: the base in nf4 or int8, the frozen "
                "bf16 embed_tokens / lm_head and their trained bf16 copies, peft "
                "ModulesToSaveWrapper's copy.deepcopy, huggingface/peft@5d602fdbf "
                "src/peft/utils/other.py), their gradients (2.27 GiB) and AdamW-8bit states "
                "(5.07 GiB: transformers' Trainer gives every nn.Embedding 32-bit states, "
                "register_module_override(module, 'weight', {'optim_bits': 32})) are 14.9 GiB "
                "before any activation, over the 11.4 GiB limit; axolotl keeps the embeddings "
                "in bf16 (axolotl-ai-cloud/axolotl@067b021c8 src/axolotl/loaders/model.py "
                "_configure_embedding_dtypes: fp32 before prepare_model_for_kbit_training, "
                "back to torch_dtype for an adapter). The recipe itself (mb 2 x 4096 packed "
                "tokens) also keeps 8192 x 128256 logits: 3.9 GiB per fp32 copy. memfit names "
                "the way forward: the plan without the copies",
            ),
            expect=Expect(verdict="does not fit", why=AXOLOTL_LORA_8B_EXPECT),
        ),  # fmt: skip
    ]


#: The hand check of the axolotl lora-8b recipe's trained copies (issue 29 practice helper).
#: axolotl-ai-cloud/axolotl@107c67ae5a23 (the example's commit) src/axolotl/loaders/model.py
#: _configure_embedding_dtypes: embed_tokens / lm_head go to fp32 before
#: prepare_model_for_kbit_training, then (adapter lora: needs_fa2_dtype) back to cfg.torch_dtype,
#: all in model loading, before load_adapter's get_peft_model: the originals are bf16 when peft
#: wraps them. huggingface/peft@5d602fdbf src/peft/utils/other.py ModulesToSaveWrapper.update:
#: copy.deepcopy(self.original_module) (the original's dtype); src/peft/tuners/tuners_utils.py
#: cast_adapter_dtype upcasts only BaseTunerLayer adapters (lora_A / lora_B), not these copies.
#: transformers Trainer.create_optimizer (adamw_bnb_8bit): every nn.Embedding weight gets
#: GlobalOptimManager's override {'optim_bits': 32}; the embed copy is an nn.Embedding.
AXOLOTL_LORA_8B_EXPECT = (
    "hand check (axolotl@107c67ae5a23 loaders/model.py _configure_embedding_dtypes: the "
    "embeddings are back in bf16 before get_peft_model; peft@5d602fdbf ModulesToSaveWrapper: "
    "copy.deepcopy keeps bf16, cast_adapter_dtype upcasts only LoRA layers; transformers "
    "Trainer.create_optimizer: nn.Embedding at optim_bits 32): each of embed_tokens and lm_head "
    "is 128256 x 4096 = 525.3 M parameters, 0.98 GiB in bf16. Trained copies 1.96 GiB + their "
    "bf16 gradients 1.96 GiB + AdamW-8bit states 4.89 GiB (embed copy 32-bit: 8 B/param = "
    "3.91 GiB; lm_head copy 8-bit: 2 B/param = 0.98 GiB) = 8.8 GiB, beside the frozen bf16 "
    "originals (1.96 GiB) and the int8 base (~6.5 GiB): 17 GiB before one activation, over "
    "the README's 'Single GPU @ 11GB VRAM' (the only GPU axolotl documents for this file, "
    "written at axolotl@15f7910d3 2024-04-18, before axolotl@230e0ac36 2024-05-28 added "
    "lora_modules_to_save). memfit's count agrees (parameters 10.73 GiB, optimizer states "
    "5.07 GiB: `memfit estimate` of the recipe), so the documented GPU is wrong for the file "
    "as it stands; the row keeps the documented 11 GB card with this mark"
)


# -- torchtune Llama 3.1 8B single-device recipes (README "Memory and training speed") --------
TORCHTUNE_8B_COMMIT = "bd2a0fc7c314"
TORCHTUNE_8B_SOURCE = (
    "pytorch/torchtune@" + TORCHTUNE_8B_COMMIT + " README.md 'Memory and training speed' ('all "
    "the below numbers are provided for batch size 2 (without gradient accumulation), a dataset "
    "packed to sequence length 2048, and torch compile enabled'); config recipes/configs/"
    "llama3_1/{config}.yaml at that commit"
)
#: README rows: (method, config, GPU, README's 'Runnable On', its 'Peak Memory per GPU')
TORCHTUNE_8B_ROWS = (
    ("full", "8B_full_single_device", "RTX-4090", "1x 4090", "18.9 GiB"),
    ("full", "8B_full_single_device", "RTX-A6000", "1x A6000", "37.4 GiB"),
    ("lora", "8B_lora_single_device", "RTX-4090", "1x 4090", "16.2 GiB"),
    ("lora", "8B_lora_single_device", "RTX-A6000", "1x A6000", "30.3 GiB"),
    ("qlora", "8B_qlora_single_device", "RTX-4090", "1x 4090", "7.4 GiB"),
)
TORCHTUNE_8B_SHAPE = ("--mode", "train", "--batch", "2", "--seq", "2048", "--grad-accum", "1")
#: the LoRA / QLoRA configs: lora_attn_modules ['q_proj', 'v_proj', 'output_proj'],
#: apply_lora_to_mlp: True, lora_rank: 8
TORCHTUNE_8B_LORA = ("--lora-rank", "8", "--lora-targets", "q,v,o,mlp")
#: every 8B single-device config: ``loss: _component_:
#: torchtune.modules.loss.LinearCrossEntropyLoss``
#: (the output projection and cross-entropy in 8 chunks of tokens): memfit's --loss chunked
TORCHTUNE_8B_LOSS = ("--loss", "chunked")


def torchtune_8b_job(method: str, config: str, gpu: str, runnable: str, peak: str) -> Job:
    plan = ["--seq", "2048", "--global-batch", "2", *TORCHTUNE_8B_LOSS]
    if method == "full":
        recipe = [*TORCHTUNE_8B_SHAPE, "--precision", "bf16-true", *TORCHTUNE_8B_LOSS]
        recipe += ["--optimizer", "paged-adamw-8bit", "--checkpointing", "full"]
        recipe += ["--optimizer-in-bwd"]
        plan += ["--keep-full-finetune", "--optimizer", "paged-adamw-8bit"]
        plan += ["--precision", "bf16-true", "--optimizer-in-bwd"]
        quote = (
            "model: llama3_1_8b; optimizer: bitsandbytes.optim.PagedAdamW8bit; "
            "optimizer_in_bwd: True; enable_activation_checkpointing: True; dtype: bf16; "
            "batch_size: 2"
        )
        notes: tuple[str, ...] = (
            "optimizer_in_bwd: memfit's --optimizer-in-bwd (each parameter steps in backward, "
            "its gradient freed; no accumulation)",
            "PagedAdamW8bit's states live in CUDA unified memory, which can page to host RAM "
            "and which torch's peak-memory counters (the README's figure) do not count; "
            "memfit's verdict leaves them out of the resident need (docs/decisions.md)",
            "torchtune's model and PagedAdamW8bit keep the token embedding's states in 8 bits; "
            "memfit's HF path keeps them in 32 bits (HF Trainer's override), paged either way",
        )
    else:
        recipe = [*TORCHTUNE_8B_SHAPE, "--precision", "bf16-true", *TORCHTUNE_8B_LOSS]
        recipe += ["--optimizer", "adamw-fused", "--checkpointing", "full", *TORCHTUNE_8B_LORA]
        plan += [*TORCHTUNE_8B_LORA, "--optimizer", "adamw-fused"]
        quote = (
            f"model: {'q' if method == 'qlora' else ''}lora_llama3_1_8b; lora_attn_modules: "
            "['q_proj', 'v_proj', 'output_proj']; apply_lora_to_mlp: True; lora_rank: 8; "
            "optimizer: torch.optim.AdamW, fused: True; enable_activation_checkpointing: True; "
            "dtype: bf16; batch_size: 2"
        )
        notes = ()
        if method == "qlora":
            recipe += ["--quant", "nf4"]
            plan += ["--quant", "nf4"]
            notes = ("torchtune's NF4 is torchao's NF4Tensor, modelled as bitsandbytes nf4",)
    return Job(
        id=f"torchtune-llama3_1-8b-{method}-{gpu.lower()}",
        framework="torchtune",
        kind="train",
        model="llama-3.1-8b",
        gpu=gpu,
        gpu_note=f"README 'Runnable On': '{runnable}'",
        source=TORCHTUNE_8B_SOURCE.format(config=config),
        quote=f"README row: Llama 3.1 8B | {method} | {runnable} | peak {peak}; config: {quote}",
        recipe=tuple(recipe),
        plan=tuple(plan),
        file=f"benchmarks/data/practice/torchtune-llama3_1-{config}.yaml",
        notes=(
            *notes,
            "the README's packed 2048-token sequences, batch 2 and no accumulation override the "
            "file's max_seq_len: null and gradient_accumulation_steps; the config's "
            "torchtune.modules.loss.LinearCrossEntropyLoss (output projection and loss in 8 "
            "chunks, no full logits) is memfit's --loss chunked (estimate/analytic/loss.py, "
            "modelled as eager autograd saves it: the fp32 log-probabilities); torch.compile "
            "(README: on) is not modelled; the README's peak is torch's peak memory, the "
            "figure memfit compares with the GPU is device memory in use",
        ),
    )


def torchtune_8b_jobs() -> list[Job]:
    return [torchtune_8b_job(*row) for row in TORCHTUNE_8B_ROWS]


# -- Unsloth's free-Colab notebooks (Tesla T4), each with its own peak-memory printout ------------
UNSLOTH_NOTEBOOKS = "unslothai/notebooks@bdda2efc7ad5"
UNSLOTH_SOURCE = (
    UNSLOTH_NOTEBOOKS + " nb/{nb}.ipynb (linked from unslothai/unsloth README.md's free "
    "notebooks table); 4-bit loading: unslothai/unsloth@015bdef0d94a unsloth/models/llama.py "
    "BitsAndBytesConfig(load_in_4bit = True, bnb_4bit_use_double_quant = True, "
    "bnb_4bit_quant_type = 'nf4', bnb_4bit_compute_dtype = dtype)"
)
#: notebook -> (memfit model, the model_name it loads, the notebook's saved T4 output
#: 'Peak reserved memory = ... GB' (torch.cuda.max_memory_reserved() / 1024**3), None when absent)
UNSLOTH_ROWS = (
    ("Llama3.1_(8B)-Alpaca", "llama-3.1-8b", "unsloth/Llama-3.1-8B", "7.922"),
    ("Llama3.2_(1B_and_3B)-Conversational", "llama-3.2-3b", "unsloth/Llama-3.2-3B-Instruct",
     "6.531"),
    ("Qwen2.5_(7B)-Alpaca", "qwen2.5-7b", "unsloth/Qwen2.5-7B", "7.893"),
    ("Mistral_v0.3_(7B)-Conversational", "mistral-7b-v0.1",
     "unsloth/mistral-7b-instruct-v0.3-bnb-4bit", "6.289"),
    ("Gemma2_(9B)-Alpaca", "gemma-2-9b", "unsloth/gemma-2-9b", "9.383"),
    ("Qwen3_(14B)-Alpaca", "qwen3-14b", "unsloth/Qwen3-14B-Base-unsloth-bnb-4bit", "12.949"),
)  # fmt: skip
UNSLOTH_LORA = ("--lora-rank", "16", "--lora-targets", "q,k,v,o,gate,up,down")
#: Unsloth's memory techniques memfit models: use_gradient_checkpointing = 'unsloth' with
#: max_seq_length >= 512 is its smart offloaded checkpointing (unslothai/unsloth@015bdef0d94a
#: unsloth/models/_utils.py, patch_unsloth_smart_gradient_checkpointing; unslothai/unsloth-zoo@
#: ce232d6cef9c unsloth_zoo/gradient_checkpointing.py): --checkpointing offload; with labels its
#: CausalLM_fast_forward (unsloth/models/llama.py, used by gemma2.py and qwen3.py) calls
#: unsloth_fused_ce_loss (unsloth_zoo/fused_losses/cross_entropy_loss.py): --loss fused
#: --kernels unsloth runs the job as FastLanguageModel does (its RMSNorm / RoPE / fused LoRA
#: kernels, estimate/analytic/unsloth.py); the two flags after it are its defaults, said anyway
UNSLOTH_TECHNIQUES = ("--kernels", "unsloth", "--checkpointing", "offload", "--loss", "fused")
UNSLOTH_NOTES = (
    "use_gradient_checkpointing = 'unsloth' (max_seq_length 2048 >= 512: Unsloth's smart "
    "offloaded checkpointing, each layer's input copied to pinned host RAM and back through "
    "two GPU buffers) is memfit's --checkpointing offload; Unsloth's fused CE "
    "(unsloth_fused_ce_loss, whenever labels are given) is --loss fused; FastLanguageModel's "
    "fast RMSNorm / RoPE and fused LoRA QKV / O / MLP kernels are --kernels unsloth "
    "(estimate/analytic/unsloth.py), which implies both; the plan keeps the kernels",
    "Unsloth pads a batch to its longest sample (packing = False), and these datasets' samples "
    "are mostly far shorter than max_seq_length: memfit's 2048 tokens per sample is the "
    "worst case, not the notebook's run; its printed peak is for its own data",
    "dtype = None on a T4 (no bf16) loads in float16 with fp32 LoRA adapters: memfit's 16-true",
)


#: The Qwen3-14B notebook runs at the edge of the T4 by Unsloth's own printed figures
#: (benchmarks/unsloth_notebooks.py: the notebooks' peaks against memfit's estimates).
UNSLOTH_QWEN3_14B_EXPECT = (
    "the Qwen3-14B notebooks' own saved T4 output puts this job at the edge of the card: "
    "'Peak reserved memory' 12.949 GB (this notebook, r16, Alpaca's short samples), 14.066 and "
    "14.508 GB (its r32 siblings nb/Qwen3_(14B).ipynb, nb/Qwen3_(14B)-Reasoning-"
    "Conversational.ipynb, same commit) of 'Max memory = 14.741 GB' (95.4 and 98.4 %). memfit's "
    "point for 2048-token samples with --kernels unsloth (12.26 GiB on the device at mb 2, "
    "11.83 GiB at mb 1; 13.22 and 12.12 GiB with transformers' + peft's kernels) is "
    "within the 14.56 GiB card, its upper end is not: tight, the verdict this evidence "
    "supports. The Unsloth runs with a printed peak on the current Unsloth (fused CE) lie "
    "within memfit's current-HF band; they are two, too few to fit an Unsloth band of their "
    "own (docs/accuracy.md, 'Unsloth's notebooks against memfit')"
)


def unsloth_job(nb: str, model: str, model_name: str, peak: str) -> Job:
    recipe: tuple[str, ...] = (
        "--mode",
        "train",
        "--batch",
        "2",
        "--seq",
        "2048",
        "--grad-accum",
        "4",
    )
    recipe += ("--precision", "16-true", "--optimizer", "adamw-8bit", *UNSLOTH_TECHNIQUES)
    recipe += (*UNSLOTH_LORA, "--quant", "nf4-dq")
    plan: tuple[str, ...] = (
        "--seq",
        "2048",
        "--global-batch",
        "8",
        *UNSLOTH_LORA,
        "--quant",
        "nf4-dq",
    )
    plan += ("--optimizer", "adamw-8bit", "--precision", "16-true", "--kernels", "unsloth")
    extra: tuple[str, ...] = ()
    if model == "mistral-7b-v0.1":
        extra = ("Mistral-7B-Instruct-v0.3 modelled as the bundled Mistral-7B-v0.1 (same "
                 "shapes but a 32768-token vocabulary instead of 32000)",)  # fmt: skip
    if model == "qwen3-14b":
        extra = (
            "Qwen3-14B-Base modelled as the bundled Qwen3-14B (same shapes)",
            "at the edge of the T4, by the notebook's own output: '11.898 GB of memory "
            "reserved' after loading (before training), 'Peak reserved memory = 12.949 GB' "
            "= 87.8 % of 'Max memory = 14.741 GB' (torch's GiB), on Alpaca samples far "
            "shorter than 2048 tokens and Unsloth 2025.4.4 (before its fused CE, "
            "unslothai/unsloth@806bee2433 2025-08-13). memfit's estimate of the recipe "
            "(current Unsloth, --kernels unsloth, 2048-token samples) is 11.74 GiB reserved, "
            "12.26 GiB on the device: within the card, its upper end (14.59 GiB; the analytic "
            "engine's reserved range, allocated x 1.002-1.278) is not: tight. Nothing memfit "
            "counts "
            "is over-counted against this evidence: the after-load reserve alone is 2.4 GiB "
            "above memfit's 9.49 GiB of weights (the dynamic 4-bit checkpoint "
            "'unsloth-bnb-4bit' leaves some modules in 16 bits: its shards, 4.97 + 4.59 + "
            "1.56 GB in the notebook's download bars, are 1.1 GiB more than uniform "
            "nf4-dq; https://huggingface.co/collections/unsloth/unsloth-4-bit-dynamic-quants "
            "'selectively skips quantizing certain parameters'). With --kernels unsloth "
            "memfit no longer counts peft's fp32 copy of each LoRA input (Unsloth's fused "
            "LoRA kernels make none; estimate/analytic/unsloth.py)",
        )
    expect = Expect(verdict="tight", why=UNSLOTH_QWEN3_14B_EXPECT) if model == "qwen3-14b" else None
    return Job(
        expect=expect,
        id="unsloth-" + nb.lower().replace("_(", "-").replace(")", "").replace("_", "-"),
        framework="unsloth",
        kind="train",
        model=model,
        gpu="T4",
        gpu_note="the notebook's saved output: 'GPU = Tesla T4. Max memory = 14.7 GB.' "
        "(free Colab)",
        source=UNSLOTH_SOURCE.format(nb=nb),
        quote=f"model_name = '{model_name}'; max_seq_length = 2048; dtype = None; "
        "load_in_4bit = True; r = 16; target_modules = ['q_proj', 'k_proj', 'v_proj', "
        "'o_proj', 'gate_proj', 'up_proj', 'down_proj']; use_gradient_checkpointing = "
        "'unsloth'; per_device_train_batch_size = 2; gradient_accumulation_steps = 4; "
        f"optim = 'adamw_8bit'; saved output on the T4: 'Peak reserved memory = {peak} GB.' "
        "(torch.cuda.max_memory_reserved() / 1024**3)",
        recipe=recipe,
        plan=plan,
        notes=(*UNSLOTH_NOTES, *extra),
    )


def unsloth_jobs() -> list[Job]:
    return [unsloth_job(*row) for row in UNSLOTH_ROWS]


# -- TRL: trl/scripts/sft.py usage lines and the docs' PEFT / LoRA guides ---------------------
TRL = "huggingface/trl@f2cd57710ae3"
TRL_DEFAULTS = (
    TRL + " trl/trainer/sft_config.py (SFTConfig: 'gradient_checkpointing: Defaults to True', "
    "'bf16: Defaults to True if fp16 is not set', max_length default 1024) and "
    "trl/trainer/model_config.py (dtype default 'float32', lora_r default 16, lora_dropout "
    "default 0.05, "
    "bnb_4bit_quant_type 'nf4', use_bnb_nested_quant False); LoRA targets left out: peft's "
    "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING ('llama' and 'qwen2': q_proj, v_proj)"
)
#: (id, model, GPU, gpu_note, source, quote, batch, seq, accumulation, LoRA rank, targets, quant)
TRL_ROWS = (
    ("trl-sft-qwen2-0.5b-full", "qwen2.5-0.5b", "L4",
     "the script names no GPU: L4 (24 GB, bf16) stands for a single common card",
     TRL + " trl/scripts/sft.py docstring '# Full training'",
     "python trl/scripts/sft.py --model_name_or_path Qwen/Qwen2-0.5B --dataset_name "
     "trl-lib/Capybara --learning_rate 2.0e-5 --num_train_epochs 1 --packing "
     "--per_device_train_batch_size 2 --gradient_accumulation_steps 8",
     2, 1024, 8, None, None, None),
    ("trl-sft-qwen2-0.5b-lora", "qwen2.5-0.5b", "L4",
     "the script names no GPU: L4 (24 GB, bf16) stands for a single common card",
     TRL + " trl/scripts/sft.py docstring '# LoRA'",
     "python trl/scripts/sft.py --model_name_or_path Qwen/Qwen2-0.5B --dataset_name "
     "trl-lib/Capybara --learning_rate 2.0e-4 --num_train_epochs 1 --packing "
     "--per_device_train_batch_size 2 --gradient_accumulation_steps 8 --use_peft --lora_r 32 "
     "--lora_alpha 16",
     2, 1024, 8, 32, "q,v", None),
    ("trl-peft-llama-2-7b-qlora", "llama-2-7b", "RTX-4090",
     "the guide names no card ('Enables fine-tuning of models like Llama-70B on a single "
     "consumer GPU'): RTX-4090 (24 GB) stands for a single consumer GPU",
     TRL + " docs/source/peft_integration.md 'Using QLoRA with TRL', 'Command Line'",
     "python trl/scripts/sft.py --model_name_or_path meta-llama/Llama-2-7b-hf --dataset_name "
     "trl-lib/Capybara --load_in_4bit --use_peft --lora_r 32 --lora_alpha 16 "
     "--per_device_train_batch_size 1 --gradient_accumulation_steps 16",
     1, 1024, 16, 32, "q,v", "nf4"),
    ("trl-jobs-qwen2.5-0.5b-full", "qwen2.5-0.5b", "A100-80GB",
     "hf jobs --flavor a100-large: one A100 80GB (https://huggingface.co/docs/hub/spaces-gpus, "
     "'Nvidia A100 - large', 80 GB)",
     TRL + " docs/source/jobs_training.md 'Using uv Scripts'",
     "trainer = SFTTrainer(model='Qwen/Qwen2.5-0.5B', train_dataset=dataset) (Capybara, "
     "every other setting the default: TrainingArguments' per_device_train_batch_size 8); "
     "hf jobs uv run --flavor a100-large --with trl --secrets HF_TOKEN train.py",
     8, 1024, 1, None, None, None),
)  # fmt: skip


def trl_job(row: tuple[Any, ...]) -> Job:
    job_id, model, gpu, gpu_note, source, quote, batch, seq, accum, rank, targets, quant = row
    recipe = ["--mode", "train", "--batch", str(batch), "--seq", str(seq)]
    recipe += ["--grad-accum", str(accum), "--precision", "bf16-mixed"]
    recipe += ["--optimizer", "adamw", "--checkpointing", "full"]
    plan = ["--seq", str(seq), "--global-batch", str(batch * accum)]
    if rank is None:
        plan += ["--keep-full-finetune"]
    else:
        # ModelConfig.lora_dropout defaults to 0.05: each adapter keeps a dropped copy of its input
        lora = ["--lora-rank", str(rank), "--lora-targets", targets, "--lora-dropout", "0.05"]
        recipe += lora
        plan += lora
    # TRL loads float32 weights (ModelConfig.dtype) under bf16 autocast: not memfit's LoRA
    # default (bf16-true), so the user states it, as for any recipe off memfit's default
    plan += ["--precision", "bf16-mixed"]
    if quant:
        recipe += ["--quant", quant]
        plan += ["--quant", quant]
    notes = [
        "SFTConfig defaults: gradient checkpointing on, bf16 autocast over the float32 "
        "weights ModelConfig loads (memfit's bf16-mixed), max_length 1024 ("
        + ("--packing: every sequence 1024 tokens" if "--packing" in quote else
           "padded to the longest sample, so 1024 tokens is the worst case") + ")",
        "TrainingArguments' default optimizer, AdamW",
    ]  # fmt: skip
    if rank is not None:
        notes.append(
            "plan with --precision bf16-mixed: without it memfit plans a LoRA job at its "
            "default bf16-true, not TRL's float32 weights under autocast"
        )
    if "Qwen/Qwen2-0.5B" in quote:
        notes.append("Qwen2-0.5B modelled as the bundled Qwen2.5-0.5B (same shapes)")
    return Job(
        id=job_id,
        framework="trl",
        kind="train",
        model=model,
        gpu=gpu,
        gpu_note=gpu_note,
        source=source + "; defaults: " + TRL_DEFAULTS,
        quote=quote,
        recipe=tuple(recipe),
        plan=tuple(plan),
        notes=tuple(notes),
    )


def trl_jobs() -> list[Job]:
    return [trl_job(row) for row in TRL_ROWS]


# -- diffusers: published low-VRAM recipes with the GPU they ran on ------------------------------
SDXL_BLOG = (
    "https://huggingface.co/blog/simple_sdxl_optimizations ('Exploring simple optimizations "
    "for SDXL'; A100 40GB; notebook github.com/huggingface/notebooks diffusers/"
    "exploring_simple optimizations_for_sdxl.ipynb)"
)
SD3_BLOG = (
    "https://huggingface.co/blog/sd3 ('Diffusers welcomes Stable Diffusion 3', 'Summary of "
    "Memory Optimizations' table; A100 80GB)"
)
FLUX_QUANT_BLOG = (
    "https://huggingface.co/blog/diffusers-quantization ('Exploring Quantization Backends in "
    "Diffusers', May 2025; 1x H100 80GB) and its table "
    "https://huggingface.co/datasets/derekl35/diffusers-quantization-benchmarks"
)
WAN_README = (
    "Wan-Video/Wan2.2@1ea34ff48f87 README.md 'Run Text-Image-to-Video Generation': 'This "
    "command can run on a GPU with at least 24GB VRAM (e.g, RTX 4090 GPU)'"
)


def diffusion_jobs() -> list[Job]:
    rows = [
        ("sdxl-fp16-batch4", "sdxl-base-1.0", "A100-40GB", SDXL_BLOG,
         "StableDiffusionXLPipeline fp16, pipe.to('cuda'), num_images_per_prompt=4, 25 steps, "
         "1024x1024, SDPA",
         ("--precision", "fp16", "--batch", "4", "--height", "1024", "--width", "1024",
          "--steps", "25")),
        ("sdxl-fp16-batch4-model-offload", "sdxl-base-1.0", "A100-40GB", SDXL_BLOG,
         "as above with pipe.enable_model_cpu_offload()",
         ("--precision", "fp16", "--batch", "4", "--height", "1024", "--width", "1024",
          "--steps", "25", "--pipeline-offload", "model")),
        ("sd3-medium-fp16", "sd3-medium", "A100-80GB", SD3_BLOG,
         "StableDiffusion3Pipeline fp16, pipe.to('cuda'), 1024x1024, 28 steps ('Default' row)",
         ("--precision", "fp16", "--height", "1024", "--width", "1024", "--steps", "28")),
        ("flux-dev-nf4", "flux.1-dev", "H100-80GB", FLUX_QUANT_BLOG,
         "FluxPipeline bf16, transformer + text_encoder_2 BitsAndBytesConfig(load_in_4bit, nf4), "
         "pipe.to('cuda'), 1024x1024, 50 steps",
         ("--height", "1024", "--width", "1024", "--steps", "50", "--quant", "nf4",
          "--text-encoder-quant", "nf4")),
        ("flux-dev-bf16-model-offload", "flux.1-dev", "H100-80GB", FLUX_QUANT_BLOG,
         "FluxPipeline bf16, pipe.enable_model_cpu_offload(), 1024x1024, 50 steps",
         ("--height", "1024", "--width", "1024", "--steps", "50", "--pipeline-offload",
          "model")),
        ("wan2.2-ti2v-5b-720p-offload", "wan2.2-ti2v-5b", "RTX-4090", WAN_README,
         "python generate.py --task ti2v-5B --size 1280*704 --offload_model True "
         "--convert_model_dtype --t5_cpu (121 frames, 50 steps)",
         ("--height", "704", "--width", "1280", "--num-frames", "121", "--steps", "50",
          "--precision", "bf16", "--pipeline-offload", "model")),
    ]  # fmt: skip
    return [
        Job(
            id=f"diffusers-{name}",
            framework="diffusers" if not name.startswith("wan") else "wan2.2",
            kind="diffusion",
            model=model,
            gpu=gpu,
            source=source,
            quote=quote,
            recipe=("--mode", "infer", *flags),
        )
        for name, model, gpu, source, quote, flags in rows
    ]


# -- vLLM: `vllm serve` configurations reported to start on a named GPU --------------------------
LLMD_PLANNER = (
    "https://github.com/jgchn/llm-d-planner/blob/accuracy/accuracy/results/v0.19.0/"
    "accuracy_report.md (vLLM v0.19.0, H100 80GB; startup logs)"
)
VLLM_PR = "https://github.com/vllm-project/vllm/pull/10511 (start-up logs on H100 80GB)"
LLMD_BENCH = (
    "https://github.com/llm-d/llm-d-benchmark/blob/main/config_explorer/"
    "empirical-vllm-memory-results.md (H100 80GB)"
)


def vllm_jobs() -> list[Job]:
    rows = [
        ("llama-3.1-8b-8k", "llama-3.1-8b", LLMD_PLANNER,
         "vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.95 "
         "--max-model-len 8192",
         ("--gpu-memory-utilization", "0.95", "--max-model-len", "8192")),
        ("llama-3.1-8b-default", "llama-3.1-8b", VLLM_PR,
         "vllm serve meta-llama/Meta-Llama-3-8B (defaults: --gpu-memory-utilization 0.9)",
         ("--gpu-memory-utilization", "0.9")),
        ("llama-3.1-8b-tp2", "llama-3.1-8b", VLLM_PR,
         "vllm serve ... --tensor-parallel-size 2",
         ("--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "2")),
        ("qwen2.5-7b-8k", "qwen2.5-7b", LLMD_PLANNER,
         "vllm serve Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization 0.95 --max-model-len 8192",
         ("--gpu-memory-utilization", "0.95", "--max-model-len", "8192")),
        ("qwen3-0.6b-32k", "qwen3-0.6b", LLMD_BENCH,
         "vllm serve Qwen/Qwen3-0.6B --gpu-memory-utilization 0.9 --max-model-len 32000 "
         "--block-size 128 --enable-prefix-caching",
         ("--gpu-memory-utilization", "0.9", "--max-model-len", "32000", "--block-size", "128",
          "--enable-prefix-caching")),
    ]  # fmt: skip
    return [
        Job(
            id=f"vllm-{name}",
            framework="vllm",
            kind="vllm",
            model=model,
            gpu="H100-80GB",
            source=source,
            quote=quote,
            recipe=flags,
        )
        for name, model, source, quote, flags in rows
    ]


def all_jobs() -> list[Job]:
    return (
        litgpt_jobs()
        + torchtune_jobs()
        + torchtune_8b_jobs()
        + axolotl_jobs()
        + unsloth_jobs()
        + trl_jobs()
        + diffusion_jobs()
        + vllm_jobs()
    )


def recipe_argv(job: Job) -> list[str]:
    """The documented recipe as one memfit command line (``estimate`` or ``vllm``)."""
    verb = "vllm" if job.kind == "vllm" else "estimate"
    return [verb, job.model, *job.recipe, "--gpu", job.gpu]


def plan_argv(job: Job) -> list[str]:
    """What the user asks ``memfit plan`` (empty for a job kind without a planner here)."""
    if not job.plan:
        return []
    return ["plan", job.model, "--gpu", job.gpu, *job.plan]


# -- running memfit on a job ---------------------------------------------------------------------
RESULTS = ROOT / "results"
JSONL = RESULTS / "practice.jsonl"
MD = RESULTS / "practice.md"
DOC = ROOT.parent / "docs" / "planning.md"
DOC_BEGIN = "<!-- practice:begin (generated by benchmarks/practice.py --write-doc) -->"
DOC_END = "<!-- practice:end -->"
GIB = 2**30
PASS, FAIL, NA = "pass", "FAIL", "n/a"
#: (a) for a job whose documented GPU the evidence contradicts (:class:`Expect`), when memfit
#: answers what the evidence says
KNOWN = "known"
#: Optimizers with one update (memfit.plan.recipe.SAME_MATHS_AS) or one state layout (8-bit
#: AdamW, paged or not: bitsandbytes' block-wise states, paging only moves them under pressure).
SAME_OPTIMIZER = {"adamw-fused": "adamw", "paged-adamw-8bit": "adamw-8bit"}
#: 4-bit formats the recipe's 4-bit keeps (double quantization only shrinks the scales).
SAME_QUANT = {"nf4-dq": "nf4"}


def run_cli(argv: list[str]) -> tuple[int, Any, str]:
    """``memfit ARGV --json`` in this process: (exit code, parsed JSON or None, stderr)."""
    from memfit.cli.entry import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([*argv, "--json"])
        except SystemExit as exc:  # argparse's own exit (bad flag): exit 2 with its message
            rc = int(exc.code or 0)
    try:
        data = json.loads(out.getvalue())
    except ValueError:
        data = None
    return rc, data, err.getvalue().strip()


def analytic(argv: list[str]) -> list[str]:
    return [*argv, "--engine", "analytic", "--quiet"]


def plan_cli(job: Job) -> list[str]:
    return analytic(plan_argv(job)) + ["--confirm", "none"]


def recipe_option(job: Job, request_json: dict[str, Any]) -> Any:
    """The documented recipe as the planner sees an option: its estimate, verdict against the
    plan's budget, and predicted step time (memfit.plan.cost), with the plan's model facts.

    Uses the planner's own search object (memfit.plan.search._Search, private) so the step time
    is the very number the planner ranks its options by; the recipe itself (quantized, with
    checkpointing) is not among the options ``memfit plan`` prints."""
    from memfit.cli.entry import build_parser
    from memfit.estimate.options import using_options
    from memfit.flags import workload_from_args
    from memfit.plan.budget import Budget
    from memfit.plan.cost import Rates
    from memfit.plan.engines import resolve_engines
    from memfit.plan.request import PlanRequest
    from memfit.plan.search import _resolve, _Search, _space_options
    from memfit.plan.space import Settings, recipe
    from memfit.spec import EstimateOptions

    args = build_parser().parse_args(analytic(recipe_argv(job)))
    workload = workload_from_args(args)
    fields = dict(request_json)
    fields["lora_ranks"] = tuple(fields["lora_ranks"])
    fields["allow"] = frozenset(fields["allow"])
    request = PlanRequest(**fields)
    with using_options(EstimateOptions(engine="analytic")):
        source, gpu = _resolve(job.model, job.gpu)
        budget = Budget.of(gpu, headroom=request.headroom)
        engines = resolve_engines(source, gpu, None, None)
        search = _Search(request, budget, engines, Rates.of(gpu), source)
        search.recipe = recipe(_space_options(request, gpu, source))
        search.baseline(search.recipe)  # sets the model facts as plan() does
        return search.estimate(search.option(Settings.of(workload)), engines.search)


def _gib(n: Any) -> str:
    return "?" if n is None else f"{n / GIB:.1f}"


def _frozen_base_only(rec: dict[str, Any], doc: dict[str, Any]) -> bool:
    """An adapter job whose plan only stores the frozen base in the 16-bit dtype its ``*-mixed``
    recipe computes in (or back): the planner's memory-only change (memfit.plan.recipe.
    frozen_base_cast: autocast computes the base in 16 bits either way, adapters stay fp32)."""
    if rec["lora_rank"] is None or rec["lora_rank"] != doc["lora_rank"]:
        return False
    a, b = str(rec["precision"]).rsplit("-", 1), str(doc["precision"]).rsplit("-", 1)
    return a[0] == b[0] and {a[1], b[1]} == {"mixed", "true"}


def technique_changes(rec: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """What the recommendation (plan JSON settings) changes about the documented recipe's
    techniques (its Settings as JSON), checkpointing and batch split left out (speed decides)."""
    found = []
    if rec["lora_rank"] != doc["lora_rank"]:
        found.append(f"LoRA rank {rec['lora_rank']} (recipe {doc['lora_rank']})")
    if SAME_QUANT.get(rec["quant"], rec["quant"]) != SAME_QUANT.get(doc["quant"], doc["quant"]):
        found.append(f"quant {rec['quant']} (recipe {doc['quant']})")
    if rec["precision"] != doc["precision"] and not _frozen_base_only(rec, doc):
        found.append(f"precision {rec['precision']} (recipe {doc['precision']})")
    opt = SAME_OPTIMIZER.get(rec["optimizer"], rec["optimizer"])
    if opt != SAME_OPTIMIZER.get(doc["optimizer"], doc["optimizer"]):
        found.append(f"optimizer {rec['optimizer']} (recipe {doc['optimizer']})")
    if rec["freeze_layers"] != doc["freeze_layers"]:
        found.append(f"freeze {rec['freeze_layers']} layers")
    if rec["offload"] != doc["offload"]:
        found.append(f"offload {rec['offload']} (recipe {doc['offload']})")
    if rec["shard"] != doc["shard"]:
        found.append(f"shard {rec['shard']} (recipe {doc['shard']})")
    return found


def check_train(job: Job) -> dict[str, Any]:
    from memfit.plan.search import RANK_TIE_FRACTION

    row: dict[str, Any] = {"plan_cmd": "memfit " + " ".join(plan_cli(job))}
    rc, plan, err = run_cli(plan_cli(job))
    if plan is None:
        row.update(
            a=(FAIL, f"memfit plan failed (exit {rc}): {err[-300:]}"), b=(NA, ""), c=(NA, "")
        )
        return row
    rec = plan.get("recommended")
    row["tier"] = plan.get("tier")
    row["as_asked"] = plan["baseline"]["summary"]
    row["capacity_bytes"] = plan["budget"].get("capacity_bytes")
    row["limit_bytes"] = plan["budget"].get("limit_bytes")
    doc = recipe_option(job, plan["request"])
    row["recipe_summary"] = doc.settings.describe()
    row["recipe_need_bytes"] = doc.need_bytes
    row["recipe_fits"] = doc.fits
    row["recipe_step_s"] = doc.cost.step_s
    row["recipe_reason"] = doc.reason
    if rec is None or not rec.get("fits"):
        closest = plan.get("closest") or {}
        why = (
            f"nothing fits per memfit (closest: {closest.get('summary')}: {closest.get('reason')})"
        )
        nearest = plan.get("nearest") or []
        if nearest:  # the way forward memfit names (issue 29: every "no" with one)
            why += f"; memfit's nearest change: {nearest[0]['change']}: {nearest[0]['plan']}"
        row["closest_verdict"] = closest_verdict(plan)
        row.update(a=expected_outcome(job, why, row["closest_verdict"]))
        row.update(b=(NA, "no recommendation"), c=(NA, "no recommendation"))
        return row
    row["recommended"] = rec["summary"]
    row["rec_need_bytes"] = rec["need_bytes"]
    row["rec_step_s"] = rec["step_s"]
    row["rec_changes"] = [c["change"] for c in rec.get("changes", [])]
    row["a"] = (PASS, f"fits: needs {_gib(rec['need_bytes'])} of {_gib(row['limit_bytes'])} GiB")
    if not doc.fits:
        why = doc.reason or "does not fit"
        row["b"] = (NA, f"recipe does not fit per memfit: {why}")
        row["c"] = (NA, "recipe does not fit per memfit")
        return row
    doc_json = doc.settings.to_json()
    changed = technique_changes(rec["settings"], doc_json)
    slower = rec["step_s"] > doc.cost.step_s * (1 + RANK_TIE_FRACTION)
    if rec["settings"]["checkpointing"] != doc_json["checkpointing"] and slower:
        changed.append(
            f"checkpointing {rec['settings']['checkpointing']} (recipe "
            f"{doc_json['checkpointing']}) and slower"
        )
    row["b"] = (FAIL, "changes " + "; ".join(changed)) if changed else (PASS, "keeps the recipe")
    ratio = rec["step_s"] / doc.cost.step_s - 1
    what = f"{rec['step_s']:.3g} s vs recipe {doc.cost.step_s:.3g} s ({ratio:+.0%})"
    row["c"] = (FAIL if slower else PASS, what)
    return row


def closest_verdict(plan: dict[str, Any]) -> str | None:
    """The verdict (THE rule, ``memfit.estimate.verdict.judge``) of the plan's closest option
    when nothing fits: its point and upper end against the plan's budget."""
    from memfit.estimate.verdict import judge

    closest, budget = plan.get("closest") or {}, plan.get("budget") or {}
    point, need = closest.get("device_used_bytes"), closest.get("need_bytes")
    capacity, limit = budget.get("capacity_bytes"), budget.get("limit_bytes")
    if None in (point, need, capacity, limit):
        return None
    return judge(
        point_bytes=point, need_bytes=need, capacity_bytes=capacity, headroom_bytes=capacity - limit
    ).verdict


def expected_outcome(job: Job, why: str, verdict: str | None) -> tuple[str, str]:
    """Check (a) when nothing fits: FAIL, unless the job's :class:`Expect` says the evidence
    puts its recipe past its documented GPU and memfit's closest plan has the expected verdict
    (``known``); a different verdict is a FAIL that says what was expected."""
    if job.expect is None:
        return FAIL, why
    if verdict == job.expect.verdict:
        return KNOWN, f"{why}; expected (closest plan {verdict}): {job.expect.why}"
    return FAIL, f"{why}; expected the closest plan {job.expect.verdict}, memfit: {verdict}"


def check_from_file(job: Job, row: dict[str, Any]) -> None:
    """(d) ``memfit plan --from FILE`` reads the file's adapter and precision as the recipe's."""
    argv = ["plan", "--from", job.file or "", "--gpu", job.gpu, "--engine", "analytic"]
    rc, plan, err = run_cli([*argv, "--quiet", "--confirm", "none"])
    row["from_cmd"] = "memfit " + " ".join(argv)
    if plan is None and "could not fetch config.json" in err:
        row["d"] = (NA, f"the file's model is not bundled and this run is offline: {err[-200:]}")
        return
    if plan is None:
        row["d"] = (FAIL, f"memfit plan --from failed (exit {rc}): {err[-300:]}")
        return
    asked = plan["baseline"]["settings"]
    doc_rank = next(
        (job.recipe[i + 1] for i, f in enumerate(job.recipe) if f == "--lora-rank"), None
    )
    doc_prec = job.recipe[job.recipe.index("--precision") + 1]
    missing = []
    if (None if doc_rank is None else int(doc_rank)) != asked["lora_rank"]:
        missing.append(f"LoRA rank {asked['lora_rank']} (file {doc_rank})")
    if asked["precision"] != doc_prec:
        missing.append(f"precision {asked['precision']} (file's effect {doc_prec})")
    row["from_as_asked"] = plan["baseline"]["summary"]
    row["d"] = (FAIL, "as asked: " + "; ".join(missing)) if missing else (PASS, "reads the file")


def check_diffusion(job: Job) -> dict[str, Any]:
    argv = analytic(recipe_argv(job))
    rc, est, err = run_cli(argv)
    row: dict[str, Any] = {"recipe_cmd": "memfit " + " ".join(argv)}
    if est is None:
        row["a"] = (FAIL, f"memfit estimate failed (exit {rc}): {err[-300:]}")
    else:
        fit = est["fits"] or {}
        row.update(
            recipe_need_bytes=fit.get("need_bytes"),
            capacity_bytes=fit.get("capacity_bytes"),
            limit_bytes=fit.get("limit_bytes"),
            recipe_verdict=fit.get("verdict"),
        )
        ok = fit.get("verdict") == "fits"
        need, limit = _gib(fit.get("need_bytes")), _gib(fit.get("limit_bytes"))
        row["a"] = (PASS if ok else FAIL, f"{fit.get('verdict')}: needs {need} of {limit} GiB")
    row.update(b=(NA, "no planner for a diffusion pipeline"), c=(NA, "no planner"))
    return row


def check_vllm(job: Job) -> dict[str, Any]:
    argv = recipe_argv(job)
    rc, d, err = run_cli(argv)
    row: dict[str, Any] = {"recipe_cmd": "memfit " + " ".join(argv)}
    if d is None:
        row["a"] = (FAIL, f"memfit vllm failed (exit {rc}): {err[-300:]}")
    else:
        row.update(
            recipe_need_bytes=d.get("requested_bytes"),
            capacity_bytes=d.get("total_bytes"),
            recipe_verdict="starts" if d.get("starts") else "does not start",
            kv_cache_tokens=d.get("kv_cache_tokens"),
        )
        why = d.get("error") or f"KV cache {d.get('kv_cache_tokens')} tokens"
        row["a"] = (PASS if d.get("starts") else FAIL, f"{row['recipe_verdict']}: {why}")
    row.update(b=(NA, "serving: memfit checks the configuration"), c=(NA, "serving"))
    return row


def run_job(job: Job) -> dict[str, Any]:
    started = time.perf_counter()
    if job.kind == "train":
        row = check_train(job)
        row["recipe_cmd"] = "memfit " + " ".join(analytic(recipe_argv(job)))
        if job.file:
            check_from_file(job, row)
    elif job.kind == "diffusion":
        row = check_diffusion(job)
    else:
        row = check_vllm(job)
    row.setdefault("d", (NA, "no config file"))
    head = {k: getattr(job, k) for k in ("id", "framework", "kind", "model", "gpu", "source")}
    head.update(quote=job.quote, gpu_note=job.gpu_note, notes=list(job.notes), file=job.file)
    return {**head, **row, "wall_s": round(time.perf_counter() - started, 2)}


# -- rendering -----------------------------------------------------------------------------------
def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| job | source | GPU | recipe (memfit's reading) | memfit's recommendation | "
        "needs GiB: recipe / rec / limit | recipe verdict | step s: recipe → rec | a | b | c | d |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "train":
            recipe = r.get("recipe_summary", "?")
            rec = r.get("recommended", "— (nothing fits)")
            need = f"{_gib(r.get('recipe_need_bytes'))} / {_gib(r.get('rec_need_bytes'))}"
            fits = r.get("recipe_fits")
            verdict = "?" if fits is None else ("fits" if fits else "does not fit")
            steps = (
                f"{r['recipe_step_s']:.3g} → {r['rec_step_s']:.3g}"
                if r.get("rec_step_s") and r.get("recipe_step_s")
                else "—"
            )
        else:
            flags = r["recipe_cmd"].split()[3:]
            recipe = " ".join(flags[: flags.index("--gpu")])
            rec = "the recipe (no planner)"
            need = f"{_gib(r.get('recipe_need_bytes'))} / —"
            verdict, steps = r.get("recipe_verdict", "?"), "—"
        cap = r.get("limit_bytes") or r.get("capacity_bytes")
        src = r["source"].split(" ")[0]
        out.append(
            "| " + " | ".join(_cell(x) for x in (
                r["id"], src, r["gpu"], recipe, rec, f"{need} / {_gib(cap)}", verdict,
                steps, r["a"][0], r["b"][0], r["c"][0], r["d"][0],
            )) + " |"
        )  # fmt: skip
    return out


def failures(rows: list[dict[str, Any]]) -> list[str]:
    return [f"- `{r['id']}` ({k}): {r[k][1]}" for r in rows for k in "abcd" if r[k][0] == FAIL]


def known(rows: list[dict[str, Any]]) -> list[str]:
    return [f"- `{r['id']}` ({k}): {r[k][1]}" for r in rows for k in "abcd" if r[k][0] == KNOWN]


def summary(rows: list[dict[str, Any]]) -> str:
    parts = []
    for k in "abcd":
        n = {s: sum(r[k][0] == s for r in rows) for s in (PASS, FAIL, KNOWN, NA)}
        text = f"({k}) {n[PASS]} pass, {n[FAIL]} FAIL, "
        parts.append(text + (f"{n[KNOWN]} known, " if n[KNOWN] else "") + f"{n[NA]} n/a")
    return f"{len(rows)} jobs: " + "; ".join(parts)


CHECKS_TEXT = (
    "Checks: **(a)** memfit's recommendation fits by memfit's own verdict (diffusion / vLLM: "
    "the documented configuration fits / starts); **(b)** when the documented recipe fits per "
    "memfit, the recommendation keeps its techniques (LoRA rank, quantization, precision, "
    "optimizer, no freezing, no offload or sharding added, checkpointing changed only when "
    "not slower); **(c)** when the recipe fits, the recommendation's predicted step time "
    "(memfit.plan.cost roofline, the planner's `step_s`) is no slower than the recipe's, "
    "within the planner's own 5 % tie band (`RANK_TIE_FRACTION`); **(d)** for a job whose source "
    "is a config file, `memfit plan --from FILE` reads the file's LoRA rank and precision as "
    "the job as asked. Engine: analytic, `--confirm none`. **known** (a): nothing fits per "
    "memfit where the evidence (the job's note, with its arithmetic and sources) says the "
    "documented GPU is too small for the recipe as written, and memfit's closest plan has the "
    "verdict that evidence predicts; another verdict is a FAIL."
)


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Practice benchmark: memfit's advice on jobs people run",
        "",
        "Generated by `benchmarks/practice.py` (re-run: `PYTHONPATH=src python "
        "benchmarks/practice.py --write-doc`). Each job's source, quoted settings, the memfit "
        "commands run and every reason are in `practice.jsonl`.",
        "",
        CHECKS_TEXT,
        "",
        summary(rows),
        "",
        *table(rows),
        "",
        "## FAIL list",
        "",
        *(failures(rows) or ["- none"]),
        "",
        "## Known: the documented GPU is too small for the recipe, by the evidence",
        "",
        *(known(rows) or ["- none"]),
        "",
        "## Sources",
        "",
        *(f"- `{r['id']}`: {r['source']}; quoted: {r['quote']}"
          + (f"; GPU: {r['gpu_note']}" if r["gpu_note"] else "")
          + "".join(f"; note: {n}" for n in r["notes"]) for r in rows),
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def write_doc(rows: list[dict[str, Any]]) -> None:
    text = DOC.read_text()
    body = "\n".join([
        DOC_BEGIN,
        "",
        "## Practice benchmark",
        "",
        "Common jobs from the frameworks' own docs and READMEs (LitGPT config_hub, torchtune, "
        "axolotl examples, Unsloth's Colab notebooks, TRL's scripts and docs, diffusers blog "
        "recipes, vLLM start-up reports), each with its source "
        "and the GPU it names, run through `memfit plan` / `estimate` / `vllm` by "
        "`benchmarks/practice.py` (regenerate this section with `PYTHONPATH=src python "
        "benchmarks/practice.py --write-doc`; sources and reasons: "
        "`benchmarks/results/practice.md`).",
        "",
        CHECKS_TEXT,
        "",
        summary(rows),
        "",
        *table(rows),
        "",
        "FAIL list:",
        "",
        *(failures(rows) or ["- none"]),
        "",
        "Known (the documented GPU is too small for the recipe, by the evidence in the note):",
        "",
        *(known(rows) or ["- none"]),
        "",
        DOC_END,
    ])  # fmt: skip
    if DOC_BEGIN in text:
        head, rest = text.split(DOC_BEGIN, 1)
        text = head + body + rest.split(DOC_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="run the jobs whose id contains this text")
    ap.add_argument(
        "--write-doc", action="store_true", help="also rewrite docs/planning.md's section"
    )
    args = ap.parse_args(argv)
    jobs = [j for j in all_jobs() if not args.only or args.only in j.id]
    rows = []
    started = time.perf_counter()
    for i, job in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {job.id} …", file=sys.stderr, flush=True)
        rows.append(run_job(job))
    RESULTS.mkdir(exist_ok=True)
    if not args.only:
        JSONL.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
        MD.write_text(render(rows))
        if args.write_doc:
            write_doc(rows)
    print(render(rows) if args.only else summary(rows))
    print("\n".join(failures(rows)))
    print("\n".join(known(rows)))
    print(f"wall {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Unsloth's Colab notebooks' own printed GPU memory against memfit's estimates of their jobs.

Each Unsloth notebook prints, in its saved output, ``{start_gpu_memory} GB of memory reserved.``
(``torch.cuda.max_memory_reserved()`` after loading the model and its LoRA adapters) and, after
``trainer.train()``, ``Peak reserved memory = {used_memory} GB.`` (the same counter; both are
``/ 1024 / 1024 / 1024``: GiB). Rows: every text-model QLoRA notebook of
unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283 ``nb/`` with such a printout whose
model memfit bundles (vision / audio / embedding / hybrid-architecture notebooks and models
memfit does not bundle are left out; so are ``nb/Gemma3_(27B)_A100-Conversational`` (Gemma 3
27B loads its vision tower through ``FastModel``), ``nb/Mistral_(7B)-Text_Completion`` (LoRA
targets embed_tokens and lm_head: continued pretraining) and
``nb/Meta_Synthetic_Data_Llama3_2_(3B)`` (its peak equals its start: no training peak printed)).
``nb/TinyLlama_(1.1B)-Alpaca`` packs its samples (``packing = True``): the one printout at a
known sequence length (4096), without gradient checkpointing.

memfit runs each job with ``--kernels unsloth`` (Unsloth's layer kernels,
``memfit/estimate/analytic/unsloth.py``; the same job with ``--kernels hf`` is shown beside it,
memfit's reading before them) and as the practice benchmark reads Unsloth (benchmarks/practice.py
``UNSLOTH_TECHNIQUES``): ``--checkpointing offload`` (use_gradient_checkpointing='unsloth'),
``--loss fused`` (Unsloth's fused CE, unslothai/unsloth@806bee2433, 2025-08-13: in Unsloth
2025.8.x and later), nf4-dq, the notebook's rank / micro-batch, and ``max_seq_length`` tokens
per sample — the worst case: the notebooks pad each batch to its longest sample (packing
False), so their printed peak is for sequences at most that long, and the printed peak of a
notebook run on an Unsloth before its fused CE also holds the logits that version materialised.

    PYTHONPATH=src .venv/bin/python benchmarks/unsloth_notebooks.py

writes benchmarks/results/unsloth_notebooks.md.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
MD = ROOT / "results" / "unsloth_notebooks.md"
GIB = 2**30
NOTEBOOKS = "unslothai/notebooks@bdda2efc7ad5ae129ea63cd2065d23c391406283"
#: Unsloth's fused CE (no (tokens, vocab) logits) arrived in 2025.8 (unslothai/unsloth@806bee2433,
#: 2025-08-13); a notebook printed by an earlier version kept its logits (fp16 on a T4).
FUSED_CE_SINCE = (2025, 8)


@dataclass(frozen=True)
class Row:
    """One notebook's saved output: ``start`` / ``peak`` as printed (GiB), the Unsloth version
    its banner printed (None where the banner predates version numbers with a patch level)."""

    nb: str
    model: str  # memfit's bundled model
    loads: str  # the notebook's model_name
    gpu: str
    seq: int
    rank: int
    batch: int
    unsloth: str
    start: float
    peak: float
    checkpointing: str = "offload"

    @property
    def fused_ce(self) -> bool:
        year, month = (int(x) for x in self.unsloth.split(".")[:2])
        return (year, month) >= FUSED_CE_SINCE

    @property
    def source(self) -> str:
        return f"{NOTEBOOKS} nb/{self.nb}.ipynb"


#: (notebook, memfit model, model_name, GPU, max_seq_length, r, per_device_train_batch_size,
#: the Unsloth banner's version, '... GB of memory reserved.', 'Peak reserved memory = ... GB.'),
#: copied from the notebooks' saved outputs at NOTEBOOKS. Llama-3-8B is modelled as Llama-3.1-8B,
#: Qwen2-7B as Qwen2.5-7B, Phi-3.5-mini as Phi-3-mini-4k, Mistral-7B-v0.3 as v0.1 (same shapes,
#: v0.3's vocabulary is 32768 not 32000), the Qwen3-14B-Base checkpoint as Qwen3-14B.
ROWS = (
    Row(nb="Llama3.1_(8B)-Alpaca", model="llama-3.1-8b", loads="unsloth/Llama-3.1-8B", gpu="T4",
        seq=2048, rank=16, batch=2, unsloth="2024.8", start=5.984, peak=7.922),
    Row(nb="Llama3_(8B)-Alpaca", model="llama-3.1-8b", loads="unsloth/llama-3-8b-bnb-4bit",
        gpu="T4", seq=2048, rank=16, batch=2, unsloth="2024.5", start=5.594, peak=7.535),
    Row(nb="Llama3_(8B)-Conversational", model="llama-3.1-8b",
        loads="unsloth/llama-3-8b-Instruct-bnb-4bit", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2024.5", start=5.594, peak=9.549),
    Row(nb="Llama3_(8B)-Ollama", model="llama-3.1-8b", loads="unsloth/llama-3-8b-bnb-4bit",
        gpu="T4", seq=2048, rank=16, batch=2, unsloth="2024.9", start=5.613, peak=8.361),
    Row(nb="Llama3.2_(1B_and_3B)-Conversational", model="llama-3.2-3b",
        loads="unsloth/Llama-3.2-3B-Instruct", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2024.10.0", start=2.635, peak=6.531),
    Row(nb="Mistral_v0.3_(7B)-Alpaca", model="mistral-7b-v0.1", loads="unsloth/mistral-7b-v0.3",
        gpu="T4", seq=2048, rank=16, batch=2, unsloth="2024.5", start=4.52, peak=5.836),
    Row(nb="Mistral_v0.3_(7B)-Conversational", model="mistral-7b-v0.1",
        loads="unsloth/mistral-7b-instruct-v0.3-bnb-4bit", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2024.5", start=4.52, peak=6.289),
    Row(nb="Mistral_Nemo_(12B)-Alpaca", model="mistral-nemo-12b",
        loads="unsloth/Mistral-Nemo-Base-2407", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2024.7", start=8.588, peak=10.68),
    Row(nb="Gemma2_(2B)-Alpaca", model="gemma-2-2b", loads="unsloth/gemma-2-2b", gpu="T4",
        seq=2048, rank=16, batch=2, unsloth="2024.8", start=2.697, peak=7.684),
    Row(nb="Gemma2_(9B)-Alpaca", model="gemma-2-9b", loads="unsloth/gemma-2-9b", gpu="T4",
        seq=2048, rank=16, batch=2, unsloth="2024.7", start=6.576, peak=9.383),
    Row(nb="Phi_3.5_Mini-Conversational", model="phi-3-mini-4k",
        loads="unsloth/Phi-3.5-mini-instruct", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2024.8", start=2.285, peak=3.342),
    Row(nb="Phi_4-Conversational", model="phi-4", loads="unsloth/Phi-4", gpu="T4", seq=2048,
        rank=16, batch=2, unsloth="2025.1.5", start=10.043, peak=12.361),
    Row(nb="Qwen2.5_(7B)-Alpaca", model="qwen2.5-7b", loads="unsloth/Qwen2.5-7B", gpu="T4",
        seq=2048, rank=16, batch=2, unsloth="2024.9", start=5.764, peak=7.893),
    Row(nb="Qwen2_(7B)-Alpaca", model="qwen2.5-7b", loads="unsloth/Qwen2-7B", gpu="T4",
        seq=2048, rank=16, batch=2, unsloth="2024.6", start=7.072, peak=9.137),
    Row(nb="Qwen3_(14B)-Alpaca", model="qwen3-14b",
        loads="unsloth/Qwen3-14B-Base-unsloth-bnb-4bit", gpu="T4", seq=2048, rank=16, batch=2,
        unsloth="2025.4.4", start=11.898, peak=12.949),
    Row(nb="Qwen3_(14B)", model="qwen3-14b", loads="unsloth/Qwen3-14B", gpu="T4", seq=2048,
        rank=32, batch=2, unsloth="2025.4.5", start=11.898, peak=14.066),
    Row(nb="Qwen3_(14B)-Reasoning-Conversational", model="qwen3-14b", loads="unsloth/Qwen3-14B",
        gpu="T4", seq=2048, rank=32, batch=2, unsloth="2025.5.9", start=11.898, peak=14.508),
    Row(nb="TinyLlama_(1.1B)-Alpaca", model="tinyllama-1.1b", loads="unsloth/tinyllama-bnb-4bit",
        gpu="T4", seq=4096, rank=32, batch=2, unsloth="2024.1", start=0.879, peak=13.508,
        checkpointing="none"),
    Row(nb="Llama3.3_(70B)_A100-Conversational", model="llama-3.3-70b",
        loads="unsloth/Llama-3.3-70B-Instruct", gpu="A100-80GB", seq=2048, rank=16, batch=2,
        unsloth="2025.9.1", start=39.221, peak=42.789),
    Row(nb="Qwen3_(32B)_A100-Reasoning-Conversational", model="qwen3-32b",
        loads="unsloth/Qwen3-32B", gpu="A100-40GB", seq=2048, rank=32, batch=2,
        unsloth="2025.9.1", start=19.121, peak=24.529),
)  # fmt: skip


#: unslothai/unsloth README.md 'Context length benchmarks' (added at unslothai/unsloth@e3162dc5bf,
#: 2025-01-14; last present at 0acd1c7eec2a, 2026-03-17): "4bit QLoRA on all linear layers (Q,
#: K, V, O, gate, up and down) with rank = 32 with a batch size of 1. We padded all sequences to
#: a certain maximum sequence length"; the 70B rows "on a 80GB A100". The same README (line 46 at
#: e3162dc5bf): "We worked with Apple to add Cut Cross Entropy. Unsloth now supports 89K context
#: for Meta's Llama 3.3 (70B) on a 80GB GPU": no logits (memfit's --loss fused). A claim, not a
#: printout: the 8B column is exactly linear in the VRAM (4719 tokens per GB), so most of its
#: rows are read off a line through measurements the README does not show.
UNSLOTH_CONTEXT_SOURCE = (
    "unslothai/unsloth@0acd1c7eec2a README.md 'Context length benchmarks' (Llama 3.1 (8B) / "
    "Llama 3.3 (70B) max. context length, 'Unsloth context length' column)"
)
#: (memfit model, GPU VRAM in GB as the table writes it, Unsloth's max context length)
CONTEXT_ROWS = (
    ("llama-3.1-8b", 8, 2972), ("llama-3.1-8b", 12, 21848), ("llama-3.1-8b", 16, 40724),
    ("llama-3.1-8b", 24, 78475), ("llama-3.1-8b", 40, 153977), ("llama-3.1-8b", 48, 191728),
    ("llama-3.1-8b", 80, 342733), ("llama-3.3-70b", 48, 12106), ("llama-3.3-70b", 80, 89389),
)  # fmt: skip


def context_argv(model: str, seq: int, kernels: str = "unsloth") -> list[str]:
    """A README context-length row as one ``memfit estimate`` line (bf16: an A100)."""
    out = ["estimate", model, "--mode", "train", "--batch", "1", "--seq", str(seq)]
    out += ["--kernels", kernels]
    out += ["--precision", "bf16-true", "--optimizer", "adamw-8bit", "--checkpointing", "offload"]
    out += ["--loss", "fused", "--lora-rank", "32", "--lora-targets", "q,k,v,o,gate,up,down"]
    return out + ["--quant", "nf4-dq", "--gpu", "A100-80GB", "--engine", "analytic", "--quiet"]


def compare_context(model: str, vram_gb: int, seq: int) -> dict[str, Any]:
    """memfit's device point for Unsloth's longest context on a card of ``vram_gb``, against
    that memory (the run fit in it: a point above it over-counts by at least the difference)."""
    est = _run(context_argv(model, seq))
    point = est["device_used_bytes"] / GIB
    dynamic = (est["components"]["activations"] + est["components"]["temporary"]) / GIB
    hf = _run(context_argv(model, seq, "hf"))
    hf_dynamic = (hf["components"]["activations"] + hf["components"]["temporary"]) / GIB
    return {
        "hf_point": hf["device_used_bytes"] / GIB,
        "hf_dynamic_per_token_kib": hf_dynamic * 2**20 / seq,
        "hf_over": hf["device_used_bytes"] / GIB / vram_gb - 1,
        "model": model,
        "vram_gb": vram_gb,
        "seq": seq,
        "point": point,
        "high": est["device_used_bytes_high"] / GIB,
        "vram_gib": vram_gb * 1e9 / GIB,
        "dynamic": dynamic,
        "dynamic_per_token_kib": dynamic * 2**20 / seq,
        "over": point / vram_gb - 1,
    }


def argv(row: Row, kernels: str = "unsloth") -> list[str]:
    """The notebook's job as one ``memfit estimate`` line (module docstring)."""
    out = ["estimate", row.model, "--mode", "train", "--batch", str(row.batch)]
    out += ["--kernels", kernels]
    out += ["--seq", str(row.seq), "--grad-accum", "4", "--precision", "16-true"]
    out += ["--optimizer", "adamw-8bit", "--checkpointing", row.checkpointing, "--loss", "fused"]
    out += ["--lora-rank", str(row.rank), "--lora-targets", "q,k,v,o,gate,up,down"]
    return out + ["--quant", "nf4-dq", "--gpu", row.gpu, "--engine", "analytic", "--quiet"]


def estimate(row: Row, kernels: str = "unsloth") -> dict[str, Any]:
    """memfit's answer for ``row`` (``memfit ARGV --json`` in this process)."""
    return _run(argv(row, kernels))


def _run(args: list[str]) -> dict[str, Any]:
    from memfit.cli.entry import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main([*args, "--json"])
    return dict(json.loads(out.getvalue()))


def compare(row: Row) -> dict[str, Any]:
    """The printed figures against memfit's: weights after load (memfit's parameters, allocated,
    against the printed reserve) and the peak reserved, with memfit's range and its band."""
    est = estimate(row)
    hf = estimate(row, "hf")["peak_reserved_bytes"] / GIB
    params = est["components"]["parameters"] / GIB
    point = est["peak_reserved_bytes"] / GIB
    low, high = est["peak_reserved_bytes_low"] / GIB, est["peak_reserved_bytes_high"] / GIB
    return {
        "nb": row.nb,
        "fused_ce": row.fused_ce,
        "start_over_params": row.start / params - 1,
        "peak_error": point / row.peak - 1,  # memfit's point vs the printed peak
        "hf_point": hf,
        "hf_error": hf / row.peak - 1,
        "notes": [n for n in est.get("notes", []) if n.startswith("kernels unsloth")],
        "inside": low <= row.peak <= high,
        "params": params,
        "point": point,
        "low": low,
        "high": high,
        "band": est["band"]["path"],
    }


def render(results: list[tuple[Row, dict[str, Any]]]) -> str:
    lines = [
        "# Unsloth's notebooks' printed GPU memory against memfit",
        "",
        "Generated by `benchmarks/unsloth_notebooks.py` (its docstring: rows, what memfit runs). "
        "GiB; *start* = the notebook's reserve after loading, *peak* = its `Peak reserved "
        "memory`; memfit's peak reserved point and range at `max_seq_length` tokens per sample "
        "(the notebooks' samples are at most that long); error = memfit point / printed peak - 1. "
        "memfit runs the job with `--kernels unsloth` (Unsloth's layer kernels, "
        "`estimate/analytic/unsloth.py`); *hf kernels* is the same job with transformers' "
        "modules and peft's LoRA layers (`--kernels hf`, memfit's reading before them).",
        "",
        "| notebook | GPU | Unsloth | fused CE | model | r | start | memfit params | start / "
        "params | peak | hf kernels point | error | memfit point [range] | error | inside range |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, c in results:
        lines.append(
            f"| {row.nb} | {row.gpu} | {row.unsloth} | {'yes' if row.fused_ce else 'no'} | "
            f"{row.model} | {row.rank} | {row.start:.2f} | {c['params']:.2f} | "
            f"{c['start_over_params']:+.0%} | {row.peak:.2f} | {c['hf_point']:.2f} | "
            f"{c['hf_error']:+.1%} | {c['point']:.2f} "
            f"[{c['low']:.2f} - {c['high']:.2f}] | {c['peak_error']:+.1%} | "
            f"{'yes' if c['inside'] else 'no'} |"
        )
    kernels = sorted({f"`{r.model}`: {n}" for r, c in results for n in c["notes"]})
    lines += ["", "What memfit applied, per model:", "", *(f"- {k}" for k in kernels)]
    lines += ["", "Sources: " + "; ".join(f"`{r.nb}`: {r.source}" for r, _ in results), ""]
    return "\n".join(lines)


def render_context(results: list[dict[str, Any]]) -> str:
    lines = [
        "## Unsloth's long-context claims against memfit",
        "",
        f"Source: {UNSLOTH_CONTEXT_SOURCE} (a claim: the 8B column is linear in the VRAM). "
        "memfit: QLoRA r32 on all linear layers, batch 1, `--kernels unsloth --checkpointing "
        "offload --loss fused`, nf4-dq, bf16, AdamW-8bit; over = memfit's device point / the "
        "VRAM - 1 (the run fit in that VRAM: a positive value over-counts by at least this, a "
        "negative one is consistent with the claim); *hf kernels*: the same job with `--kernels "
        "hf` (before).",
        "",
        "| model | VRAM (GB) | Unsloth context | hf kernels KiB / token | hf kernels over | "
        "memfit point GiB | memfit dynamic GiB | dynamic KiB / token | over |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        lines.append(
            f"| {c['model']} | {c['vram_gb']} | {c['seq']:,} | "
            f"{c['hf_dynamic_per_token_kib']:.0f} | {c['hf_over']:+.0%} | {c['point']:.1f} | "
            f"{c['dynamic']:.1f} | {c['dynamic_per_token_kib']:.0f} | {c['over']:+.0%} |"
        )
    return "\n".join([*lines, ""])


def main() -> int:
    results = [(row, compare(row)) for row in ROWS]
    context = [compare_context(*row) for row in CONTEXT_ROWS]
    MD.write_text(render(results) + "\n" + render_context(context))
    for c in context:
        print(
            f"{c['model']:14} {c['vram_gb']:3} GB {c['seq']:>8,} tokens  over {c['over']:+.0%} "
            f"(hf kernels {c['hf_over']:+.0%})"
        )
    for row, c in results:
        print(
            f"{row.nb:42} {c['peak_error']:+7.1%} (hf {c['hf_error']:+7.1%})  "
            f"inside={c['inside']}  fused={row.fused_ce}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

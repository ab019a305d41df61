"""Long-prompt generation against published figures (issue 19 item 4): the Qwen3 speed benchmark's
Hugging Face Transformers tables (``max_memory_allocated`` of ``generate()`` of 2048 tokens after
prompts of 1 to 30720 tokens, batch 1, FlashAttention-2), next to memfit's analytic engine.

For each point: memfit's peak (the larger of its prefill and decode phases), and both phases
alone, with the error against the published value. AWQ rows also get memfit's decode with eager
attention: the AutoAWQ environment of the benchmark lists no flash-attn, so those rows ran
transformers 4.51.3's SDPA path, which repeats K and V to every query head before each call
(``integrations/sdpa_attention.py`` @4.51.3: ``repeat_kv`` unconditionally) — at decode that is
what eager attention allocates (the repeated K/V plus (1, H, 1, S) scores). Writes
``benchmarks/results/prefill_published.md``.

    PYTHONPATH=src python benchmarks/prefill_published.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "qwen3_speed_benchmark.json"
OUT = ROOT / "results" / "prefill_published.md"
#: The published quantizations memfit's ``--quant`` reproduces (FP8 rows use fbgemm / finegrained
#: kernels and GPTQ-Int8 rows a GPTQModel kernel whose temporaries memfit does not model).
QUANT = {"BF16": "none", "AWQ-INT4": "int4-awq"}
MIB = 2**20
NEW_TOKENS = 2048


def main() -> int:
    from memfit.estimate import estimate
    from memfit.spec import WorkloadSpec

    data = json.loads(DATA.read_text())
    rows = [
        "| model | prompt | weights | published | memfit peak (phase) | error | prefill alone | "
        "decode alone | error of decode | decode, K/V repeated (AWQ) | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in data["points"]:
        quant = QUANT.get(p["quantization"])
        name = p["model"].lower()
        if quant is None or "a3b" in name:
            continue
        w = WorkloadSpec(
            mode="infer",
            precision="bf16-true",
            seq_len=p["input_length"],
            new_tokens=NEW_TOKENS,
            attention="flash",
            quant=quant,
        )
        est = estimate(name, w, engine="analytic")
        pub = p["gpu_memory_mib"] * MIB
        pre = est.phases["prefill"].peak_allocated_bytes
        dec = est.phases["decode"].peak_allocated_bytes
        repeated = "– | –"
        if quant != "none":
            eager = estimate(name, dataclasses.replace(w, attention="eager"), engine="analytic")
            rep = eager.phases["decode"].peak_allocated_bytes
            repeated = f"{rep / MIB:.0f} MiB | {rep / pub - 1:+.1%}"
        rows.append(
            f"| {p['model']} | {p['input_length']} | {p['quantization']} | "
            f"{p['gpu_memory_mib']} MiB | {est.peak_allocated_bytes / MIB:.0f} MiB "
            f"({est.peak_phase}) | {est.peak_allocated_bytes / pub - 1:+.1%} | "
            f"{pre / MIB:.0f} MiB | {dec / MIB:.0f} MiB | {dec / pub - 1:+.1%} | {repeated} |"
        )
    head = [
        "# Long-prompt generation vs the Qwen3 speed benchmark (Transformers rows)",
        "",
        f"Source: {data['url']} ({data['location']}). Setup: {data['setup']}.",
        "memfit: analytic engine, `--mode infer --precision bf16-true --attention flash "
        f"--new-tokens {NEW_TOKENS} --seq PROMPT` (`--quant int4-awq` for AWQ), "
        "`max_memory_allocated` (cuBLAS workspaces included). 'decode, K/V repeated': the same "
        "with `--attention eager`, whose decode allocates what transformers 4.51.3's SDPA path "
        "did (`repeat_kv` of the cache to every query head; the AutoAWQ environment had no "
        "flash-attn).",
        "",
    ]
    OUT.write_text("\n".join([*head, *rows, ""]))
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

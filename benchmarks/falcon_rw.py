"""Falcon with ALiBi (falcon-rw layout): the analytic engine against the trace engine.

No falcon-rw checkpoint is bundled; ``benchmarks/configs/falcon-rw-1b.json`` has
tiiuae/falcon-rw-1b's layout (24 layers, width 2048, 32 heads, ALiBi, a K/V head per query head,
biases, the MLP after the attention residual). Prints each workload's peak allocated bytes by both
engines and the error (the figures quoted in docs/accuracy.md §6).

    .venv/bin/python benchmarks/falcon_rw.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parent / "configs" / "falcon-rw-1b.json"
CASES: list[dict[str, Any]] = [
    {"batch_size": 2, "seq_len": 1024},
    {"batch_size": 2, "seq_len": 1024, "attention": "eager"},
    {"batch_size": 2, "seq_len": 1024, "precision": "amp-bf16"},
    {"batch_size": 2, "seq_len": 1024, "lora_rank": 16},
    {"batch_size": 2, "seq_len": 1024, "lora_rank": 16, "precision": "amp-bf16"},
    {"batch_size": 2, "seq_len": 1024, "checkpointing": "full"},
    {"mode": "infer", "batch_size": 4, "seq_len": 1024, "new_tokens": 32},
    {"mode": "infer", "batch_size": 4, "seq_len": 1024, "new_tokens": 32, "attention": "eager"},
]


def main() -> int:
    from memfit.estimate import estimate
    from memfit.spec import WorkloadSpec

    config = str(CONFIG)
    gib = 2**30
    for overrides in CASES:
        wl = WorkloadSpec(**overrides)
        traced = estimate(config, wl, engine="trace").peak_allocated_bytes
        analytic = estimate(config, wl, engine="analytic").peak_allocated_bytes
        what = ", ".join(f"{k}={v}" for k, v in overrides.items())
        print(
            f"{what:70s} trace {traced / gib:7.3f} GiB  analytic {analytic / gib:7.3f} GiB  "
            f"{analytic / traced - 1:+.2%}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The analytic engine's reserved-bytes band per job class: GENERATED, do not edit.

Written by ``benchmarks/reserved_bands.py`` (its docstring: how the band is fitted) from
``benchmarks/results/fastpath_grid.jsonl`` (its working-tree copy); the test
tests/estimate/analytic/test_reserved_bands.py recomputes it from that file and checks
every grid row of each class lies under its band's top. None: the grid has fewer than
3 rows of at least 1024 MiB for that class, or the script's
EXCLUDED names it (inference): the wide band applies."""

from __future__ import annotations

from typing import Any

#: grid job -> top of the band = ratio x analytic allocated bytes + fixed_bytes;
#: low_ratio: the lowest covered / allocated of the class's rows; worst: the row that set
#: the ratio.
BANDS: dict[str, dict[str, Any] | None] = {
    "ckpt": {
        "ratio": 1.3023,
        "fixed_bytes": 0,
        "low_ratio": 1.064,
        "n_rows": 30,
        "n_large_rows": 6,
        "largest_allocated_bytes": 18893766144,
        "worst": "qwen3-0.6b (bundled-2)",
    },
    "infer": None,
    "lora": {
        "ratio": 1.0431,
        "fixed_bytes": 24963963,
        "low_ratio": 1.016,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5400290848,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_ckpt": {
        "ratio": 1.0746,
        "fixed_bytes": 13214496,
        "low_ratio": 1.028,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5011859456,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_ckpt_dropout": {
        "ratio": 1.0746,
        "fixed_bytes": 15311648,
        "low_ratio": 1.029,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5011859456,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_ckpt_held": {
        "ratio": 1.0732,
        "fixed_bytes": 11909507,
        "low_ratio": 1.027,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5017561088,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_ckpt_held_dropout": {
        "ratio": 1.0732,
        "fixed_bytes": 16103811,
        "low_ratio": 1.028,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5017561088,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_dropout": {
        "ratio": 1.0376,
        "fixed_bytes": 21230865,
        "low_ratio": 1.017,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5446821408,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_held": {
        "ratio": 1.0419,
        "fixed_bytes": 24201494,
        "low_ratio": 1.015,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5405992480,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_held_dropout": {
        "ratio": 1.0364,
        "fixed_bytes": 22570175,
        "low_ratio": 1.017,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5452523040,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_selckpt_held": {
        "ratio": 1.0653,
        "fixed_bytes": 14090428,
        "low_ratio": 1.02,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5374527520,
        "worst": "phi-4 (bundled-2)",
    },
    "lora_selckpt_held_dropout": {
        "ratio": 1.0653,
        "fixed_bytes": 23579117,
        "low_ratio": 1.025,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 5374527520,
        "worst": "phi-4 (bundled-2)",
    },
    "mixed": {
        "ratio": 1.2897,
        "fixed_bytes": 0,
        "low_ratio": 1.021,
        "n_rows": 27,
        "n_large_rows": 6,
        "largest_allocated_bytes": 37768390144,
        "worst": "qwen3-0.6b (bundled-2)",
    },
    "mixed_offload_held": {
        "ratio": 1.1391,
        "fixed_bytes": 0,
        "low_ratio": 1.005,
        "n_rows": 7,
        "n_large_rows": 4,
        "largest_allocated_bytes": 6782671392,
        "worst": "olmo-2-7b (bundled-2)",
    },
    "qlora": {
        "ratio": 1.2025,
        "fixed_bytes": 3099549,
        "low_ratio": 1.013,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 4616487456,
        "worst": "phi-4 (bundled-2)",
    },
    "qlora_ckpt": {
        "ratio": 1.2244,
        "fixed_bytes": 4702800,
        "low_ratio": 1.023,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 4228056064,
        "worst": "phi-4 (bundled-2)",
    },
    "qlora_dq_ckpt": {
        "ratio": 1.2129,
        "fixed_bytes": 4560021,
        "low_ratio": 1.023,
        "n_rows": 27,
        "n_large_rows": 5,
        "largest_allocated_bytes": 4202652672,
        "worst": "phi-4 (bundled-2)",
    },
    "train": {
        "ratio": 1.2651,
        "fixed_bytes": 216539,
        "low_ratio": 1.074,
        "n_rows": 30,
        "n_large_rows": 6,
        "largest_allocated_bytes": 18893766144,
        "worst": "gemma-3-1b (bundled-2)",
    },
}

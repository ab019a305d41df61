"""peft's LoRA dropout executed for real on CPU against the analytic engine (issue: dropout).

A small Llama (hidden 128, 3 layers, the tests' ``TINY_LLAMA``) with peft LoRA r8 on every
linear layer and ``lora_dropout`` 0.1 runs one real training step on CPU tensors (random
weights) under the trace engine's allocation tracker (``trace_hf(execution="real")``: how
tests/estimate/trace/test_exactness.py checks that the fake trace counts what real execution
allocates), with CUDA's kernels where a CPU has them: ``F.dropout`` as CUDA's fused
``native_dropout`` (a bool mask; CPU's own dropout keeps an input-dtype noise tensor instead),
attention eager in 16-bit (CPU has no bf16 flash / efficient SDPA kernel). Each job runs with
dropout 0 and 0.1; the table gives both peaks, the analytic engine's error, and what dropout
adds in each. A last row runs CPU's own dropout (``emulate_cuda=False``) to show the mask's
dtype is the only difference.

    PYTHONPATH=src .venv/bin/python benchmarks/lora_dropout_cpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests package
from tests.conftest import TINY_LLAMA  # noqa: E402

CONFIG: dict[str, Any] = TINY_LLAMA
#: (precision, checkpointing, attention)
JOBS = (
    ("bf16-true", "none", "eager"),
    ("bf16-mixed", "none", "eager"),
    ("fp32", "none", "sdpa"),
    ("bf16-true", "full", "eager"),
)


def _peaks(precision: str, ckpt: str, attention: str, *, emulate: bool = True) -> list[int]:
    from memfit.estimate.analytic import estimate_analytic
    from memfit.estimate.trace.engine import trace_hf
    from memfit.spec import WorkloadSpec

    out = []
    for p in (0.0, 0.1):
        w = WorkloadSpec(batch_size=2, seq_len=128, lora_rank=8, precision=precision,
                         checkpointing=ckpt, attention=attention, lora_dropout=p)  # fmt: skip
        real = trace_hf(CONFIG, w, name="tiny-llama", extrapolate=False, execution="real",
                        emulate_cuda=emulate)  # fmt: skip
        out += [real.peak_allocated_bytes, estimate_analytic(CONFIG, w).peak_allocated_bytes]
    return out


def main() -> int:
    print("| job | real CPU, dropout 0.1 | analytic | error | dropout adds: real | analytic |")
    print("|---|---|---|---|---|---|")
    for precision, ckpt, attention in JOBS:
        r0, a0, r1, a1 = _peaks(precision, ckpt, attention)
        print(f"| {precision}, ckpt {ckpt}, {attention} | {r1:,} | {a1:,} | "
              f"{100 * (a1 / r1 - 1):+.2f} % | {r1 - r0:,} | {a1 - a0:,} |")  # fmt: skip
    r0, a0, r1, a1 = _peaks("bf16-true", "none", "eager", emulate=False)
    print(f"| bf16-true, CPU's own dropout (fp32 noise mask) | {r1:,} | {a1:,} | "
          f"{100 * (a1 / r1 - 1):+.2f} % | {r1 - r0:,} | {a1 - a0:,} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

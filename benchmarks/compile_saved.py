"""Measure what torch.compile saves for backward per decoder layer, and fit memfit's coefficients.

    PYTHONPATH=src .venv/bin/python benchmarks/compile_saved.py            # print the table
    PYTHONPATH=src .venv/bin/python benchmarks/compile_saved.py --write    # + results file

For each model type memfit's ``--compile`` covers, one HF decoder layer (bf16, SDPA, causal) is
run eagerly and through ``torch.compile`` with AOTAutograd's min-cut partitioner, as Inductor
splits it (``memfit.estimate.trace.compile_saved.measure_block``), at several shapes. The bytes
each keeps per token are linear in the layer's widths — hidden ``h``, K/V width ``kv``, MLP width
``ffn``, heads ``n`` (fp32 softmax statistics) and a constant (fp32 norm statistics) — so five
shapes give the coefficients exactly (integers per token); a sixth shape, at Llama-3.1-8B's
proportions, checks them. The fitted coefficients are
``memfit.estimate.analytic.compile.SAVED_PER_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from fractions import Fraction
from pathlib import Path

from memfit.estimate.trace.compile_saved import BlockShape, measure_block

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "compile_saved.md"
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
POLICIES = ("none", "selective", "selective-op")
#: (hidden, heads, kv heads, ffn): five shapes that pin the five coefficients, then the check
FIT_SHAPES = (
    (256, 4, 1, 512),
    (256, 4, 2, 512),
    (256, 4, 1, 768),
    (512, 8, 1, 512),
    (256, 2, 1, 512),
)
CHECK_SHAPE = (512, 4, 1, 1792)  # Llama-3.1-8B's proportions: head_dim 128, 4:1 GQA, ffn 3.5 h


def basis(hidden: int, heads: int, kv_heads: int, ffn: int) -> list[int]:
    """(h, kv, ffn, n, 1) of a shape: what the saved bytes per token are linear in."""
    return [hidden, kv_heads * hidden // heads, ffn, heads, 1]


def solve(rows: list[list[int]], rhs: list[Fraction]) -> list[Fraction]:
    """Gaussian elimination over the rationals (exact)."""
    n = len(rows)
    m = [[Fraction(v) for v in row] + [r] for row, r in zip(rows, rhs, strict=True)]
    for col in range(n):
        piv = next(i for i in range(col, n) if m[i][col] != 0)
        m[col], m[piv] = m[piv], m[col]
        for i in range(n):
            if i != col and m[i][col] != 0:
                f = m[i][col] / m[col][col]
                m[i] = [a - f * b for a, b in zip(m[i], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def measure(model_type: str, dims: tuple[int, int, int, int]) -> tuple[dict, dict, int]:
    hidden, heads, kv_heads, ffn = dims
    shape = BlockShape(
        hidden=hidden,
        intermediate=ffn,
        n_heads=heads,
        n_kv_heads=kv_heads,
        batch=2,
        seq=128,
        model_type=model_type,
    )
    got = measure_block(shape)
    return got.eager_bytes, got.compile_bytes, shape.batch * shape.seq


def fit(model_type: str) -> dict:
    runs = [measure(model_type, d) for d in FIT_SHAPES]
    out: dict = {}
    for mode in ("eager", "compile"):
        for policy in POLICIES:
            rhs = [Fraction((e if mode == "eager" else c)[policy], tok) for e, c, tok in runs]
            coeffs = solve([basis(*d) for d in FIT_SHAPES], rhs)
            out[(mode, policy)] = coeffs
    eager, compiled, tok = measure(model_type, CHECK_SHAPE)
    check = {}
    b = basis(*CHECK_SHAPE)
    for policy in POLICIES:
        for mode, got in (("eager", eager), ("compile", compiled)):
            predicted = sum(c * v for c, v in zip(out[(mode, policy)], b, strict=True)) * tok
            check[(mode, policy)] = (int(predicted), got[policy])
    return {"coeffs": out, "check": check}


def render(results: dict, seconds: float) -> str:
    import torch
    import transformers

    lines = [
        "# torch.compile's saved-for-backward bytes per decoder layer (measured)",
        "",
        "`PYTHONPATH=src .venv/bin/python benchmarks/compile_saved.py --write` "
        f"(torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{platform.machine()} CPU, {seconds:.0f} s). One HF decoder layer, bf16 parameters and "
        "inputs (the 16-bit block FSDP2's bf16 policy runs), SDPA causal (the flash kernel), "
        "eager autograd vs `torch.compile` with AOTAutograd's `min_cut_rematerialization_partition"
        "(compiler='inductor')`; selective policies wrap the layer in `checkpoint(..., "
        "context_fn=...)` before compiling (torchtitan's order). Bytes per token = "
        "a·h + b·kv + c·ffn + d·heads + e, fitted exactly on five shapes "
        f"{list(FIT_SHAPES)} (hidden, heads, kv heads, ffn), checked on {CHECK_SHAPE}.",
        "",
        "| model type | checkpointing | eager a, b, c, d, e | compile a, b, c, d, e | "
        "8B-proportion check: eager fit / measured, compile fit / measured | compile / eager |",
        "| --- | --- | --- | --- | --- | ---: |",
    ]
    for mt, r in results.items():
        for policy in POLICIES:
            e = r["coeffs"][("eager", policy)]
            c = r["coeffs"][("compile", policy)]
            ce, cc = r["check"][("eager", policy)], r["check"][("compile", policy)]
            lines.append(
                f"| {mt} | {policy} | {', '.join(str(v) for v in e)} | "
                f"{', '.join(str(v) for v in c)} | {ce[0]} / {ce[1]}, {cc[0]} / {cc[1]} | "
                f"{cc[1] / ce[1]:.4f} |"
            )
    inexact = sorted(
        {mt for mt, r in results.items() for fit_, got in r["check"].values() if fit_ != got}
    )
    if inexact:
        lines += [
            "",
            f"Not exact for {', '.join(inexact)} (the check differs from the fit): the five "
            "terms do not span that layer (Qwen3's per-head q/k RMSNorms keep fp32 copies and "
            "statistics per query and per key/value head), so memfit's table "
            "(`memfit.estimate.analytic.compile.SAVED_PER_TOKEN`) leaves it out.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    ap.add_argument("--only", choices=MODEL_TYPES, action="append")
    args = ap.parse_args()
    t0 = time.time()
    results = {}
    for mt in args.only or MODEL_TYPES:
        print(f"measuring {mt} ...", file=sys.stderr, flush=True)
        results[mt] = fit(mt)
        table = {
            f"{mode}/{policy}": [str(v) for v in coeffs]
            for (mode, policy), coeffs in results[mt]["coeffs"].items()
        }
        print(json.dumps({mt: table}), flush=True)
    text = render(results, time.time() - t0)
    print(text)
    if args.write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

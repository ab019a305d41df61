"""Make docs/sample-report.html: a real CPU training run, monitored, beside memfit's estimate.

The model is a 4-layer GPT-2 (256 wide, byte-level vocabulary) built from a config, trained for
40 AdamW steps on the text of memfit's own docs (real text, shipped in this repository). The
estimate is the trace engine's for the same job with CPU kernels (``emulate_cuda=False``), the
setting in which memfit's count equals real CPU execution byte for byte — so the receipt shows what
the monitor measured against what memfit predicted for *this* device.

    .venv/bin/python benchmarks/sample_report.py

writes docs/sample-run.jsonl, docs/sample-report.html and docs/sample-report.png.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 4,
    "vocab_size": 256,
    "n_positions": 256,
}
BATCH, SEQ, STEPS = 8, 128, 40


def text_batches() -> list[list[list[int]]]:
    data = b"".join(p.read_bytes() for p in sorted(DOCS.glob("*.md")))
    window = BATCH * SEQ
    return [
        [list(data[i + j * SEQ : i + (j + 1) * SEQ]) for j in range(BATCH)]
        for i in range(0, STEPS * window, window)
    ]


def main() -> int:
    import torch
    import transformers

    import memfit
    from memfit.estimate.trace.engine import trace_hf

    workload = memfit.WorkloadSpec(batch_size=BATCH, seq_len=SEQ, precision="fp32")
    est = trace_hf(CONFIG, workload, name="gpt2-4x256 (bytes)", emulate_cuda=False)
    cfg = dict(CONFIG)
    hf = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    log = DOCS / "sample-run.jsonl"
    log.unlink(missing_ok=True)
    with memfit.Monitor(str(log), estimate=est, model=model, sample_interval_s=0.2) as mon:
        mon.watch(optimizer, tokens_per_step=BATCH * SEQ, samples_per_step=BATCH)
        for batch in text_batches():
            ids = torch.tensor(batch)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            del out
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    memfit.render_html_report(str(log), str(DOCS / "sample-report.html"))
    from memfit.report.png import render_png

    render_png(str(log), str(DOCS / "sample-report.png"))
    print(json.dumps(mon.receipt, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far holding recomputed modules to their backward moves `peft-zero3-lora-70b-8gpu`.

A measurement of memfit's own replay, not of a GPU: rank 0's ZeRO-3 rewrite of the traced step
(``memfit.estimate.trace.rank_replay._Zero``) is run as is and with one rule patched in for this
process only (nothing in ``src`` changes):

- ``hold``: every module gathered by the backward's recompute stays gathered until its own
  backward has run. Two sources give it: DeepSpeed's ``stage3_max_reuse_distance`` (1e9
  elements, ``__params_to_release``) keeps a Llama-2-70B layer's gate / up / down gathered from
  their recompute to their backward on any torch; torch's non-reentrant checkpoint before
  pytorch/pytorch#127959 stored ``x.detach()`` of every recomputed saved tensor, an alias that
  keeps the others' gathered storage (q / k / v / o) after ZeRO-3 sets ``param.data`` to an
  empty tensor, while DeepSpeed gathers them again for their backward (not counted here: an
  upper bound of the first, a lower bound of both).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/zero3_leads.py`` (two trace-engine runs,
~45 s each, ``--no-cache``). Output: peak allocated / reserved / device (GiB) for each variant.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator

from memfit.estimate.trace import rank_replay

#: the point's command (benchmarks/multigpu_points.py) on the trace engine, uncached
JOB = [
    *("estimate", "llama-2-70b", "--gpus", "8", "--shard", "zero3", "--batch", "8"),
    *("--seq", "2048", "--precision", "bf16-mixed", "--checkpointing", "full"),
    *("--optimizer", "adamw", "--attention", "flash", "--lora-rank", "8"),
    *("--lora-targets", "all-linear", "--lora-dropout", "0.1", "--transformers-version", "4.39"),
    *("--peft-version", "0.10", "--engine", "trace", "--json", "--no-cache"),
]
GiB = 2**30


@contextlib.contextmanager
def _patched(hold: bool) -> Iterator[None]:
    cls = rank_replay._Zero
    saved = cls.on_mark
    held: dict[str, list[int]] = {}

    def on_mark(self: rank_replay._Zero, kind: str, payload: str) -> None:
        if hold and kind == "fwd_out" and self.tl.phase == "backward" and self.stage == 3:
            held.setdefault(payload, []).extend(self.gathered.pop(payload, []))
            return
        saved(self, kind, payload)
        if kind in ("bwd_out", "phase_end"):
            for name in [payload] if kind == "bwd_out" else list(held):
                for key in held.pop(name, []):
                    self.tl.free(key)

    cls.on_mark = on_mark  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.on_mark = saved  # type: ignore[method-assign]


def run(hold: bool) -> dict[str, float]:
    from memfit.cli.entry import main

    out = io.StringIO()
    with _patched(hold), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(JOB)
    d = json.loads(out.getvalue())
    keys = ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")
    return {k: d[k] / GiB for k in keys}


if __name__ == "__main__":
    for hold in (False, True):
        r = run(hold)
        print(
            f"hold {hold!s:5}  allocated {r['peak_allocated_bytes']:.2f}"
            f"  reserved {r['peak_reserved_bytes']:.2f}  device {r['device_used_bytes']:.2f}"
        )

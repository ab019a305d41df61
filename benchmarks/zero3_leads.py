"""How far DeepSpeed ZeRO-3 behaviour memfit does not model moves `peft-zero3-lora-70b-8gpu`.

A measurement of memfit's own replay, not of a GPU: rank 0's ZeRO-3 rewrite of the traced step
(``memfit.estimate.trace.rank_replay._Zero``) is run as is and with one or both of two rules
patched in for this process only (nothing in ``src`` changes):

- ``prefetch``: DeepSpeed's prefetch loop (``PartitionedParameterCoordinator.fetch_sub_module``,
  deepspeed v0.13.1 and master edaa7221, ``partitioned_param_coordinator.py``: ``while
  self.__param_queue and numel_prefetching < max_params_to_prefetch``) takes parameters from the
  trace queue while the running total is *below* ``stage3_prefetch_bucket_size``, so the one that
  crosses it is fetched too; memfit's ``_prefetch`` stops before a module that does not fit.
- ``hold``: a module gathered by the backward's recompute stays gathered until its own backward
  has run. Two sources give it: torch's non-reentrant checkpoint before
  pytorch/pytorch#127959 stores ``x.detach()`` of every recomputed saved tensor, an alias that
  keeps a gathered frozen weight's storage after ZeRO-3 sets ``param.data`` to an empty tensor
  (#127959 stopped the detach for tensors without
  grad); and DeepSpeed's ``stage3_max_reuse_distance`` (1e9 elements,
  ``__params_to_release``), which keeps a layer's gate / up / down from their recompute to their
  backward on Llama-2-70B on any torch.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/zero3_leads.py`` (four trace-engine runs,
~40 s each, ``--no-cache``). Output: peak allocated / reserved / device (GiB) for each variant.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator

from memfit.estimate import sharding
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


def _prefetch_past_bucket(self: rank_replay._Zero, name: str, order: list[str]) -> None:
    d = sharding.DEEPSPEED_DEFAULTS
    live = sum(self._numel(n) for n in self.gathered)
    budget = min(d["stage3_max_live_parameters"] - live, d["stage3_prefetch_bucket_size"])
    if name not in order:
        return
    taken = 0
    for nxt in order[order.index(name) + 1 :]:
        if taken >= budget:
            break
        if self._numel(nxt) and nxt not in self.gathered:
            self._gather(nxt)
        taken += self._numel(nxt)


@contextlib.contextmanager
def _patched(prefetch: bool, hold: bool) -> Iterator[None]:
    cls = rank_replay._Zero
    saved = cls._prefetch, cls.on_mark
    held: dict[str, list[int]] = {}

    def on_mark(self: rank_replay._Zero, kind: str, payload: str) -> None:
        if hold and kind == "fwd_out" and self.tl.phase == "backward" and self.stage == 3:
            held.setdefault(payload, []).extend(self.gathered.pop(payload, []))
            return
        saved[1](self, kind, payload)
        if kind in ("bwd_out", "phase_end"):
            for name in [payload] if kind == "bwd_out" else list(held):
                for key in held.pop(name, []):
                    self.tl.free(key)

    if prefetch:
        cls._prefetch = _prefetch_past_bucket  # type: ignore[method-assign]
    cls.on_mark = on_mark  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls._prefetch, cls.on_mark = saved  # type: ignore[method-assign]


def run(prefetch: bool, hold: bool) -> dict[str, float]:
    from memfit.cli.entry import main

    out = io.StringIO()
    with _patched(prefetch, hold), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(JOB)
    d = json.loads(out.getvalue())
    keys = ("peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes")
    return {k: d[k] / GiB for k in keys}


if __name__ == "__main__":
    for prefetch, hold in ((False, False), (True, False), (False, True), (True, True)):
        r = run(prefetch, hold)
        print(
            f"prefetch {prefetch!s:5} hold {hold!s:5}  allocated {r['peak_allocated_bytes']:.2f}"
            f"  reserved {r['peak_reserved_bytes']:.2f}  device {r['device_used_bytes']:.2f}"
        )

"""How much DeepSpeed's all-gather stream pool could add to `peft-zero3-lora-70b-8gpu`'s reserved.

A measurement of memfit's own replay, not of a GPU. DeepSpeed ZeRO-3 allocates every gathered
parameter on its all-gather stream: ``__all_gather_params_`` calls ``all_gather_coalesced`` and
``fetch_sub_module`` calls the handle's ``wait()`` inside ``with
get_accelerator().stream(self.__allgather_stream)`` (deepspeed 5d7546064, 2024-02-23, the release
line the source ran: ``deepspeed/runtime/zero/partitioned_param_coordinator.py``), and
``free_param`` frees it after ``record_stream(current_stream())``
(``partition_parameters.py``). PyTorch's caching allocator hands a free block only to a request
of the stream it was allocated on (``get_free_block`` in ``c10/cuda/CUDACachingAllocator.cpp``:
the block pools are ordered by stream first), so the gathered weights and everything else live in
two pools that never serve each other. memfit's allocator replay has one stream
(``memfit.estimate.allocator.caching``: "Not modelled: several streams").

This script runs the point's command on the trace engine (rank 0's ZeRO-3 rewrite,
``memfit.estimate.trace.rank_replay._Zero``, unchanged), keeps each rewritten timeline, and
replays it three ways through memfit's allocator (then again with ``benchmarks/zero3_leads.py``'s
two rules patched in, so that the leads' sum is measured, not added by hand): as one pool (what
memfit answers), and split into the gathered parameters (module names ending in
``(gathered)``) and the rest, each its own pool. With no ``empty_cache`` and no out-of-memory
retry, reserved bytes only grow, so two pools reserve the sum of their own peaks. Output: GiB of
the rewritten timeline per traced layer count.

Run: ``PYTHONPATH=src:. .venv/bin/python benchmarks/zero3_streams.py`` (two trace-engine runs,
~40 s each, ``--no-cache``; ``benchmarks/results/zero3_streams.txt``).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

from benchmarks.zero3_leads import JOB, _patched
from memfit.estimate.allocator.caching import simulate
from memfit.estimate.trace import rank_replay

GiB = 2**30
GATHERED = "(gathered)"


def split_events(
    events: list[tuple[str, int, int]], owner: dict[int, tuple[str, str]]
) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """``(gathered, rest)``: the events of storages whose module name ends in ``(gathered)``
    (ZeRO-3's gathered parameters, on DeepSpeed's all-gather stream) and all others."""
    gathered, rest = [], []
    for event in events:
        module = owner.get(event[1], ("", ""))[1]
        (gathered if module.endswith(GATHERED) else rest).append(event)
    return gathered, rest


def pools(events: list[tuple[str, int, int]], owner: dict[int, tuple[str, str]]) -> dict[str, int]:
    """Peak allocated / reserved bytes of one pool and of the two-pool split."""
    one = simulate(events)
    gathered, rest = split_events(events, owner)
    g, r = simulate(gathered), simulate(rest)
    return {
        "allocated": one.peak_allocated_bytes,
        "reserved_one_pool": one.peak_reserved_bytes,
        "reserved_gather_pool": g.peak_reserved_bytes,
        "reserved_rest_pool": r.peak_reserved_bytes,
        "reserved_two_pools": g.peak_reserved_bytes + r.peak_reserved_bytes,
    }


@contextlib.contextmanager
def _kept(timelines: list[rank_replay._Timeline]) -> Iterator[None]:
    cls = rank_replay._Zero
    saved = cls.run

    def run(self: rank_replay._Zero) -> rank_replay._Timeline:
        tl = saved(self)
        timelines.append(tl)
        return tl

    cls.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.run = saved  # type: ignore[method-assign]


def main(with_leads: bool) -> None:
    from memfit.cli.entry import main as cli

    timelines: list[rank_replay._Timeline] = []
    leads = _patched(prefetch=True, hold=True) if with_leads else contextlib.nullcontext()
    quiet = contextlib.redirect_stdout(io.StringIO())
    with leads, _kept(timelines), quiet, contextlib.suppress(SystemExit):
        cli(JOB)
    print("with zero3_leads' two rules (prefetch past the bucket, hold)" if with_leads else
          "as memfit models the rewrite")  # fmt: skip
    for i, tl in enumerate(timelines):
        n_layers = len({m.split(".layers.")[1].split(".")[0] for _, m in tl.owner.values()
                        if ".layers." in m})  # fmt: skip
        p = pools(tl.events, tl.owner)
        print(
            f"timeline {i} ({n_layers} layers traced): allocated {p['allocated'] / GiB:.2f}  "
            f"reserved one pool {p['reserved_one_pool'] / GiB:.2f}  two pools "
            f"{p['reserved_two_pools'] / GiB:.2f} (gathered {p['reserved_gather_pool'] / GiB:.2f}"
            f" + rest {p['reserved_rest_pool'] / GiB:.2f})  difference "
            f"{(p['reserved_two_pools'] - p['reserved_one_pool']) / GiB:+.2f}"
        )


if __name__ == "__main__":
    main(with_leads=False)
    main(with_leads=True)

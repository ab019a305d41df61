"""An inference pass's reserved bytes by the caching allocator's replay of the program's own order.

The analytic engine's inference reserved rule (:data:`memfit.estimate.analytic.reserved.
INFER_RESERVED`) scales the activations and temporaries at the peak by one ratio, fitted to
dense models' serving-size traces. A MoE layer's routed experts break it: their tensors are
sized by the routed rows (tokens x top-k: the gathered inputs, the grouped ``gate_up``
output, the weighted down projections in fp32), each larger than any block the attention or a
dense MLP freed before it, so the allocator cuts a fresh segment for each while the earlier
blocks stay cached (deepseek-v2-lite cut to 2 layers at 20 x 256 + 16: 1 336 MiB reserved for
824 MiB of transients at the peak, 1.62 x, in the trace's replay; docs/accuracy.md, "DeepSeek-V2
inference on the fast path"). Those segments follow from the order and sizes of the pass's
allocations, which the analytic program records (``Graph.events``, the same ops the trace
counts): this module replays them through the same model of PyTorch's caching allocator the
trace engine uses (:mod:`memfit.estimate.allocator.caching`).

Replayed: the inputs, then each block of the prefill (or of a forward) in order, a repeated
layer as many times as the model has it; the block input a block frees is the previous block's
output of that size (the caller's storage). The parameters are not replayed (allocated once at
load, densely: their rounding is the rule's ``held_ratio``); what the replay returns is the peak
reserved bytes of everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.estimate.allocator.caching import CachingAllocatorSim
from memfit.estimate.analytic.step import Stack

#: ``Simulated.info``'s key of the replayed bytes (the batch API replays each batch it asks:
#: ``api._replayed_at``).
REPLAYED_KEY = "replayed_reserved_bytes"


def replayed_reserved_bytes(stacks: Sequence[Stack], *, input_bytes: int) -> int | None:
    """Peak reserved bytes of one pass through ``stacks`` (embed, layers, head) less the
    parameters, by the caching allocator's replay of the blocks' recorded allocations; None
    where a block has no recorded order (a training block)."""
    if any(st.profile.events is None for st in stacks if st.count > 0):
        return None
    sim = CachingAllocatorSim()
    carried: dict[int, list[int]] = {}  # earlier blocks' live outputs (key) by bytes
    n_keys = 0
    if input_bytes:
        sim.malloc(n_keys, input_bytes)
        n_keys += 1
    for st in stacks:
        events = st.profile.events or []
        for _ in range(max(st.count, 0)):
            keys: dict[int, tuple[int, int]] = {}  # this pass's live allocations
            for kind, key, n_bytes in events:
                if kind == "a":
                    keys[key] = (n_keys, n_bytes)
                    sim.malloc(n_keys, n_bytes)
                    n_keys += 1
                elif key in keys:
                    sim.free(keys.pop(key)[0])
                elif carried.get(n_bytes):  # the block's input: an earlier block's output
                    sim.free(carried[n_bytes].pop())
            for mine, n_bytes in keys.values():
                carried.setdefault(n_bytes, []).append(mine)
    return sim.result().peak_reserved_bytes


__all__ = ["REPLAYED_KEY", "replayed_reserved_bytes"]

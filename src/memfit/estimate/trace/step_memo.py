"""One traced step serves every rank variant of a job: the trace engine's per-process memo.

For ``ddp``, ``zero1/2/3`` and every ``offload`` the trace engine traces the single-GPU step
(tensor-parallel config, LoRA, quantization, checkpointing, optimizer and all) and then rewrites its
timeline as rank 0 runs it (:mod:`memfit.estimate.trace.distributed`, ``Plan.finish``). The model's
build and the fake step read none of ``shard``, ``offload``, ``gpus`` and ``grad_accum``
(:data:`REWRITE_ONLY`) but for the precision the step runs in (``bf16-mixed`` under DeepSpeed ZeRO
is a bf16 model, under DDP fp32 weights with autocast: ``spec.rules.run_precision``, part of the
key) and, under ZeRO-3, whether 4-bit weights are packed parameters (``quant.packs_as_parameter``,
part of the key); only the rewrite reads them. So a plan that builds the forms of ZeRO-2 with the
optimizer offloaded, ZeRO-3 with it offloaded and ZeRO-3 with the parameters offloaded would run the
same traces three times. Here the first run of a step keeps what the rewrite reads
(:class:`~memfit.estimate.trace.rank_trace.RankTrace`) and the trace's numbers before the rewrite; a
run whose key matches skips building and stepping the model and runs the rewrite, the allocator
replay and the run observer only, which gives what the trace gives (tests compare forms and
estimates with and without the memo byte for byte). FSDP2 is traced for real (its collectives
allocate inside the step): never kept; nor a real CPU execution, nor a run whose history is recorded
(``--snapshot``) or whose raw events are asked for (``trace_step_events``).

The key (:func:`key`) hashes everything the traced step depends on: the config with the traced
layer counts, every workload field but :data:`REWRITE_ONLY`, the precision as run, the task, the
layer counts, the CUDA emulation switch, the GPU (its kernels' workspaces), the number of steps
and whether pixels were cast. It lives as long as the process, bounded (:data:`MAX_ENTRIES`,
:data:`MAX_EVENTS`, least recently used first out), and is off where the disk caches are
(``--no-cache``, ``MEMFIT_NO_CACHE=1``: every trace then runs torch). A forked trace worker's
entries come back to its parent with its answer (:func:`collecting`, :func:`adopt`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from memfit.estimate import quant
from memfit.estimate.trace.rank_trace import RankTrace
from memfit.spec import WorkloadSpec

#: Workload fields only the rank rewrite reads (the traced step is the same for every value).
REWRITE_ONLY = ("shard", "offload", "gpus", "grad_accum", "zero_hpz_partition_size")
#: Entries kept at most. A cold plan of an 8B model traces 5-8 shallow runs per technique stack
#: (six stacks), and the full-depth runs of a stack whose growth fails: 40-70 entries.
MAX_ENTRIES = 128
#: Events kept at most over all entries: an entry holds about 0.21 kB per event with its owners
#: (measured: 1.09 MB for a 5,084-event trace of 8 Qwen3-8B-shaped layers), so ~210 MB. A
#: full-depth trace of 36 such layers at seq 4096 has 22-27 thousand events, a cold plan's
#: entries together about 0.45 million.
MAX_EVENTS = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One traced step: what the rewrite reads, the trace's numbers before it (``flat``: the
    engine's ``flatten_trace``), the un-split model's parameter counts (tp > 1), or ``uncast``:
    the run stopped because the model does not cast fp32 pixels (the engine runs it again
    with cast pixels, another key)."""

    trace: RankTrace | None = None
    flat: dict[str, float] = dataclasses.field(default_factory=dict)
    full_counts: tuple[int, int] | None = None
    uncast: bool = False

    @property
    def n_events(self) -> int:
        return 0 if self.trace is None else len(self.trace.events)


_MEMO: OrderedDict[str, Entry] = OrderedDict()
_MADE: ContextVar[list[tuple[str, Entry]] | None] = ContextVar("memfit_step_memo", default=None)


def enabled() -> bool:
    """Whether the memo is read and written: where the disk caches are (not under
    ``--no-cache`` nor ``MEMFIT_NO_CACHE``)."""
    from memfit.estimate.derived import cache

    return cache.enabled()


def key(config: dict[str, Any], workload: WorkloadSpec, **run: Any) -> str | None:
    """The memo key of a traced step: ``config`` as traced (layer counts set, before the
    tensor-parallel split), ``workload`` but :data:`REWRITE_ONLY`, and ``run``'s other
    arguments (by ``repr``); None where the config has no canonical JSON form."""
    fields = {
        f.name: getattr(workload, f.name)
        for f in dataclasses.fields(workload)
        if f.name not in REWRITE_ONLY
    }
    # the one thing of the step the shard decides: ``bf16-mixed`` under DeepSpeed ZeRO runs as
    # a bf16 model (spec.rules.run_precision), under DDP as fp32 weights with autocast
    fields["run_precision"] = workload.run_precision
    # and whether the packed 4-bit weights are parameters (FSDP-QLoRA under zero3) or buffers
    fields["quant_packed"] = quant.packs_as_parameter(workload.quant, workload.shard)
    try:
        blob = json.dumps(
            [config, fields, {k: repr(v) for k, v in run.items()}], sort_keys=True, default=repr
        )
    except (TypeError, ValueError):  # e.g. keys of mixed types
        return None
    return hashlib.sha256(blob.encode()).hexdigest()


def get(k: str | None, *, touch: bool = True) -> Entry | None:
    """The entry kept under ``k`` (None: none, or the memo is off)."""
    if k is None or not enabled():
        return None
    entry = _MEMO.get(k)
    if entry is not None and touch:
        _MEMO.move_to_end(k)
    return entry


def put(k: str | None, entry: Entry) -> None:
    """Keep ``entry`` under ``k`` (and in the list of :func:`collecting`, if one is open)."""
    if k is None or not enabled():
        return
    made = _MADE.get()
    if made is not None:
        made.append((k, entry))
    _store(k, entry)


def adopt(entries: Iterable[tuple[str, Entry]]) -> None:
    """Keep entries another process made (a trace worker's, :func:`collecting`)."""
    if not enabled():
        return
    for k, entry in entries:
        _store(k, entry)


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[str, Entry]]]:
    """The ``(key, entry)`` pairs kept inside the block, to hand to another process."""
    made: list[tuple[str, Entry]] = []
    token = _MADE.set(made)
    try:
        yield made
    finally:
        _MADE.reset(token)


def clear() -> None:
    """Forget every entry (tests start from an empty memo)."""
    _MEMO.clear()


def n_entries() -> int:
    """How many steps are kept."""
    return len(_MEMO)


def _store(k: str, entry: Entry) -> None:
    if entry.n_events > MAX_EVENTS:
        return
    _MEMO[k] = entry
    _MEMO.move_to_end(k)
    total = sum(e.n_events for e in _MEMO.values())
    while len(_MEMO) > MAX_ENTRIES or total > MAX_EVENTS:
        _old, dropped = _MEMO.popitem(last=False)
        total -= dropped.n_events


def run_key(
    cfg: dict[str, Any],
    wl: WorkloadSpec,
    task: str,
    counts: dict[str, int],
    trust_remote_code: bool,
    *,
    gpu: Any,
    emulate_cuda: bool = True,
    n_steps: int = 2,
    cast_pixels: bool = False,
) -> str | None:
    """The key of one fake run of the trace engine (its ``_trace_run``'s arguments)."""
    return key(
        cfg, wl, task=task, counts=sorted(counts.items()), trust_remote_code=trust_remote_code,
        gpu=gpu, emulate_cuda=emulate_cuda, n_steps=n_steps, cast_pixels=cast_pixels,
    )  # fmt: skip

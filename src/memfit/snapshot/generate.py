"""Snapshots in torch's format for tests, benchmarks and trying ``memfit snapshot`` without a GPU.

A CUDA snapshot cannot be recorded on a CPU, so these build the same dict
(``torch.cuda.memory._snapshot()``, see memfit/snapshot/load.py) from other sources:

- :func:`snapshot_from_cpu_step`: a real training step of a small torch model on the CPU, every
  storage birth and death seen by memfit's :class:`StorageTracker` with the Python stack of the op
  that made it, replayed through memfit's model of the caching allocator
  (``memfit.estimate.allocator.caching``) for addresses, segments, splits and free blocks.
- :func:`write_synthetic_snapshot`: a training-loop-shaped trace of any size, written as a stream
  (``PickleStreamWriter``) so a 300 MB file costs little memory to make.

Neither is a CUDA recording: addresses come from the allocator model, not the driver, and there are
no C++ frames. The keys, value types, event vocabulary and pickle layout are torch's.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from memfit.snapshot.write import PickleStreamWriter, Stream

#: Where fake device addresses start (CUDA's look like this on Linux).
ADDRESS_BASE = 0x7F0000000000

ALLOCATOR_SETTINGS: dict[str, Any] = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {str(1 << i): 0 for i in range(64)},
}


def _frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


# -- from a real CPU step ---------------------------------------------------------------------


def _capture_frames(skip_files: tuple[str, ...]) -> list[dict[str, Any]]:
    """The Python stack, innermost first, without the tracker's own frames."""
    stack = traceback.extract_stack()[::-1]
    out = []
    for fs in stack:
        where = f"{fs.filename}:{fs.name}"
        if any(s in where for s in skip_files):
            continue
        out.append(_frame(fs.filename, fs.lineno or 0, fs.name))
    return out


def _tiny_step(steps: int, batch: int, hidden: int) -> tuple[Any, Any]:
    """A small MLP trained for ``steps`` AdamW steps on the CPU, under a frame-recording tracker."""
    import torch

    from memfit.estimate.trace.tracker import StorageTracker

    class FramesTracker(StorageTracker):
        def __init__(self) -> None:
            super().__init__(device_type="cpu", record_events=True, round_to=1)
            self.meta: list[tuple[int, list[dict[str, Any]] | None]] = []
            self._skip = (
                "memfit/estimate/trace/tracker.py",
                "memfit/snapshot/generate.py:_capture_frames",
                "memfit/snapshot/generate.py:_set_live",
                "torch/utils/_python_dispatch.py",
            )

        def _set_live(self, key: int, n_bytes: int) -> None:
            before = len(self.events or ())
            super()._set_live(key, n_bytes)
            for kind, _, _ in (self.events or [])[before:]:
                frames = _capture_frames(self._skip) if kind == "a" else None
                self.meta.append((time.perf_counter_ns() // 1000, frames))

        def _on_free(self, key: int) -> None:
            before = len(self.events or ())
            super()._on_free(key)
            for _ in (self.events or [])[before:]:
                self.meta.append((time.perf_counter_ns() // 1000, None))

    torch.manual_seed(0)
    tracker = FramesTracker()
    with tracker:
        model = torch.nn.Sequential(
            torch.nn.Linear(hidden, 4 * hidden),
            torch.nn.GELU(),
            torch.nn.Linear(4 * hidden, hidden),
            torch.nn.LayerNorm(hidden),
            torch.nn.Linear(hidden, 16),
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        for _ in range(steps):
            x = torch.randn(batch, hidden)
            y = torch.randint(0, 16, (batch,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, y, loss
    return tracker, (model, opt)


def snapshot_from_cpu_step(*, steps: int = 2, batch: int = 64, hidden: int = 512) -> dict[str, Any]:
    """A snapshot dict of a real CPU training loop (see the module docstring). Needs torch."""
    tracker, alive = _tiny_step(steps, batch, hidden)  # `alive`: the snapshot is taken now
    snapshot = snapshot_from_events(tracker.events or [], tracker.meta)
    del alive  # the model and optimizer die only after the end state was read
    return snapshot


def snapshot_from_events(
    events: Sequence[tuple[str, int, int]],
    meta: Sequence[tuple[int, list[dict[str, Any]] | None]],
) -> dict[str, Any]:
    """A snapshot dict of an allocation history: ``events`` (``("a", key, n_bytes)`` /
    ``("f", key, 0)``, as StorageTracker records them) replayed through memfit's allocator model
    for addresses and segments; ``meta[i]``: event i's time (microseconds) and, for an
    allocation, its frames. Torch-free."""
    from memfit.estimate.allocator.caching import CachingAllocatorSim

    sim = CachingAllocatorSim()
    out: list[dict[str, Any]] = []
    requested: dict[int, int] = {}
    frames_of: dict[int, list[dict[str, Any]]] = {}
    for (kind, key, n_bytes), (t_us, frames) in zip(events, meta, strict=True):
        if kind == "a":
            if n_bytes == 0:
                continue
            reserved = sim.reserved_bytes
            sim.malloc(key, n_bytes)
            block = sim._live[key]
            if block is None:
                continue
            if sim.reserved_bytes > reserved:
                head = block
                while head.prev is not None:
                    head = head.prev
                out.append(
                    _event("segment_alloc", head.addr, sim.reserved_bytes - reserved, t_us, [])
                )
            requested[key] = n_bytes
            frames_of[key] = frames or []
            out.append(_event("alloc", block.addr, n_bytes, t_us, frames_of[key]))
        elif key in requested:
            block = sim._live[key]
            addr = None if block is None else block.addr  # free() merges: read it first
            sim.free(key)
            size = requested.pop(key)
            stack = frames_of.pop(key)
            if addr is not None:
                out.append(_event("free_requested", addr, size, t_us, stack))
                out.append(_event("free_completed", addr, size, t_us, stack))
    return {
        "segments": _segments_of(sim, requested, frames_of),
        "device_traces": [out],
        "allocator_settings": dict(ALLOCATOR_SETTINGS),
        "external_annotations": [],
    }


def _event(action: str, addr: int, size: int, t_us: int, frames: list[Any]) -> dict[str, Any]:
    return {
        "action": action,
        "addr": ADDRESS_BASE + addr,
        "size": size,
        "stream": 0,
        "time_us": t_us,
        "frames": frames,
    }


def _segments_of(
    sim: Any, requested: dict[int, int], frames_of: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The allocator model's segments at the end, as torch's segment dicts."""
    key_of = {id(b): k for k, b in sim._live.items() if b is not None}
    blocks = [b for b in sim._live.values() if b is not None]
    for pool in (sim._small, sim._large):
        blocks += list(pool.by_addr.values())
    heads = {}
    for b in blocks:
        head = b
        while head.prev is not None:
            head = head.prev
        heads[head.addr] = (head, b.pool.is_small)
    out = []
    for addr in sorted(heads):
        head, small = heads[addr]
        seg_blocks, total, alloc_bytes, req_bytes = [], 0, 0, 0
        b = head
        while b is not None:
            key = key_of.get(id(b), -1)
            live = key >= 0
            req = requested.get(key, 0)
            seg_blocks.append(
                {
                    "address": ADDRESS_BASE + b.addr,
                    "size": b.size,
                    "requested_size": req,
                    "state": "active_allocated" if live else "inactive",
                    "frames": frames_of.get(key, []),
                }
            )
            total += b.size
            alloc_bytes += b.size if live else 0
            req_bytes += req
            b = b.next
        out.append(
            {
                "device": 0,
                "address": ADDRESS_BASE + addr,
                "total_size": total,
                "allocated_size": alloc_bytes,
                "active_size": alloc_bytes,
                "requested_size": req_bytes,
                "stream": 0,
                "segment_type": "small" if small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": seg_blocks,
            }
        )
    return out


def write_pickle(snapshot: dict[str, Any], path: str | Path) -> Path:
    """``pickle.dump`` as ``torch.cuda.memory._dump_snapshot`` does it."""
    import pickle

    path = Path(path)
    with path.open("wb") as f:
        pickle.dump(snapshot, f)
    return path


# -- synthetic, any size ----------------------------------------------------------------------

_USER_FILES = (
    "/home/user/project/train.py",
    "/opt/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py",
    "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py",
)
_TORCH_FRAMES = (
    ("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"),
    ("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1762, "_call_impl"),
    (
        "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
        1751,
        "_wrapped_call_impl",
    ),
    ("/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", 2991, "silu"),
    ("/opt/venv/lib/python3.11/site-packages/torch/optim/adamw.py", 519, "_multi_tensor_adamw"),
)


class _SyntheticTrace:
    """A training loop's allocation pattern: per step, activations pile up through the forward
    pass, are freed in backward while gradients appear, then optimizer temporaries come and go.
    ``n_sites`` distinct call sites, each a stack of ``depth`` frames shared by all its events."""

    def __init__(self, seed: int, n_sites: int = 120, depth: int = 24) -> None:
        self.rng = random.Random(seed)
        self.sites = [self._stack(i, depth) for i in range(n_sites)]
        self.sizes = [self.rng.choice((512, 4096, 1 << 20, 8 << 20, 32 << 20)) for _ in self.sites]
        self.live: dict[int, tuple[int, int]] = {}  # addr -> (size, site)
        self.next_addr = ADDRESS_BASE
        self.time_us = 1_700_000_000_000_000
        self.reserved = 0

    def _stack(self, i: int, depth: int) -> list[dict[str, Any]]:
        torch_part = [_frame(*self.rng.choice(_TORCH_FRAMES)) for _ in range(depth // 2)]
        user_file = _USER_FILES[i % len(_USER_FILES)]
        user = [
            _frame(user_file, 100 + 7 * i + k, f"fn_{i}_{k}") for k in range(depth - depth // 2)
        ]
        return torch_part + user

    def _alloc(self, site: int) -> dict[str, Any]:
        size = self.sizes[site] - self.rng.randrange(0, 512)
        addr = self.next_addr
        self.next_addr += -(-size // 512) * 512
        self.live[addr] = (size, site)
        self.time_us += self.rng.randrange(1, 50)
        return {
            "action": "alloc",
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": self.time_us,
            "frames": self.sites[site],
        }

    def _free(self, addr: int) -> Iterator[dict[str, Any]]:
        size, site = self.live.pop(addr)
        for action in ("free_requested", "free_completed"):
            self.time_us += self.rng.randrange(1, 20)
            yield {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self.time_us,
                "frames": self.sites[site],
            }

    def events(self, n_steps: int, acts_per_step: int = 400) -> Iterator[dict[str, Any]]:
        n = len(self.sites)
        grads: list[int] = []
        for step in range(n_steps):
            acts = []
            for k in range(acts_per_step + self.rng.randrange(0, 40)):
                ev = self._alloc(k % (n // 2))
                acts.append(ev["addr"])
                yield ev
            if not grads:
                for k in range(40):
                    ev = self._alloc(n // 2 + k)
                    grads.append(ev["addr"])
                    yield ev
            for addr in reversed(acts):
                yield from self._free(addr)
            temps = [self._alloc(n - 1 - (k % 20)) for k in range(30)]
            for ev in temps:
                yield ev
            for ev in temps:
                yield from self._free(ev["addr"])
            if step % 50 == 49:  # a snapshot marker, as torch writes when one is taken
                yield {
                    "action": "snapshot",
                    "addr": 0,
                    "size": 0,
                    "stream": 0,
                    "time_us": self.time_us,
                    "frames": [],
                }

    def segments(self) -> list[dict[str, Any]]:
        """One segment per live block, with a free tail when the block is below 20 MiB."""
        out = []
        for addr, (size, site) in sorted(self.live.items()):
            block = -(-size // 512) * 512
            total = max(block, 20 << 20) if block > (1 << 20) else 2 << 20
            blocks = [
                {
                    "address": addr,
                    "size": block,
                    "requested_size": size,
                    "state": "active_allocated",
                    "frames": self.sites[site],
                }
            ]
            if total > block:
                blocks.append(
                    {
                        "address": addr + block,
                        "size": total - block,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    }
                )
            out.append(
                {
                    "device": 0,
                    "address": addr,
                    "total_size": total,
                    "allocated_size": block,
                    "active_size": block,
                    "requested_size": size,
                    "stream": 0,
                    "segment_type": "large" if total > (2 << 20) else "small",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return out


def write_synthetic_snapshot(path: str | Path, *, n_steps: int, seed: int = 0) -> Path:
    """Write a synthetic snapshot of ``n_steps`` training steps (~26 KB of pickle per step).

    The segments (the end state) are written before the trace in torch's layout, so the trace is
    generated twice with the same seed: once to learn the end state, once to write it.
    """
    path = Path(path)
    probe = _SyntheticTrace(seed)
    for _ in probe.events(n_steps):
        pass
    segments = probe.segments()
    trace = _SyntheticTrace(seed)
    trace.sites = probe.sites  # the same frame objects: events share the segments' stacks
    snapshot = {
        "segments": segments,
        "device_traces": [Stream(trace.events(n_steps))],
        "allocator_settings": dict(ALLOCATOR_SETTINGS),
        "external_annotations": [],
    }
    with path.open("wb") as f:
        PickleStreamWriter(f).dump(snapshot)
    return path

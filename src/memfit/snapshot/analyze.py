"""Summarise a CUDA memory snapshot without a browser: peak, who holds memory, fragmentation.

Two sources inside one snapshot:

- ``segments``: the allocator's state when the snapshot was taken. Every block of every segment,
  with its state and the stack that allocated it: live allocations by place in the code, and
  fragmentation (reserved vs allocated, free blocks inside partly used segments).
- ``device_traces``: the allocator's recent history, one event list per device (``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc`` / ``segment_free``, ``segment_map`` /
  ``segment_unmap`` for expandable segments, ``oom``, ``snapshot``). Replayed in order it gives the
  allocated and reserved curves, the peak, and what was live at the peak.

Replay rules (``CUDACachingAllocator.cpp``): ``alloc`` carries the *requested* size and
``free_requested`` the block's requested size, so the trace curve counts requested bytes; torch's
``memory_allocated()`` counts rounded block sizes (``allocated_size``), a little more. Allocated
bytes drop at ``free_requested`` (as ``stats.allocated_bytes`` does); ``free_completed`` comes
later only for blocks used on other streams. The trace is a window (``max_entries``): blocks
allocated before it are known only as bytes, so the curve starts at the end state (segments'
requested bytes) minus the window's net change.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import SnapshotError
from memfit.snapshot import frames as fr
from memfit.snapshot.load import read_snapshot

#: Points kept for each device's timeline: the replay keeps between this and twice as many,
#: merging neighbours (keeping the larger value) when the trace is longer.
TIMELINE_POINTS = 400


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """One allocation: a live block, or an ``alloc`` event live at the peak."""

    size_bytes: int
    device: int
    address: int
    location: str
    module: str
    frames: list[str]
    time_us: int | None = None
    event_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "device": self.device,
            "address": self.address,
            "location": self.location,
            "module": self.module,
            "frames": self.frames,
            "time_us": self.time_us,
            "event_index": self.event_index,
        }


@dataclass(frozen=True, kw_only=True)
class PlaceBytes:
    """Bytes held by the allocations made at one place (a location or a module)."""

    place: str
    n_bytes: int
    n_allocations: int

    def to_json(self) -> dict[str, Any]:
        return {"place": self.place, "bytes": self.n_bytes, "n_allocations": self.n_allocations}


@dataclass(frozen=True, kw_only=True)
class SegmentUse:
    """One segment's use: ``inactive_bytes`` are free blocks inside it."""

    device: int
    address: int
    segment_type: str
    total_bytes: int
    allocated_bytes: int
    inactive_bytes: int
    n_inactive_blocks: int
    largest_inactive_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "address": self.address,
            "segment_type": self.segment_type,
            "total_bytes": self.total_bytes,
            "allocated_bytes": self.allocated_bytes,
            "inactive_bytes": self.inactive_bytes,
            "n_inactive_blocks": self.n_inactive_blocks,
            "largest_inactive_bytes": self.largest_inactive_bytes,
        }


@dataclass(frozen=True, kw_only=True)
class Fragmentation:
    """Reserved memory not holding tensors, split by what ``torch.cuda.empty_cache()`` can return.

    ``inactive_split_bytes``: free blocks inside segments that also hold live blocks (torch's
    ``inactive_split_bytes``): only a smaller request can use them, ``empty_cache()`` cannot free
    them. ``releasable_bytes``: segments with no live block, which ``empty_cache()`` returns.
    """

    reserved_bytes: int
    allocated_bytes: int
    pending_free_bytes: int
    inactive_split_bytes: int
    n_inactive_split_blocks: int
    releasable_bytes: int
    n_segments: int
    n_free_segments: int
    worst_segments: list[SegmentUse]

    @property
    def fragmentation_pct(self) -> float:
        """Share of reserved bytes in free blocks inside partly used segments."""
        return (
            100.0 * self.inactive_split_bytes / self.reserved_bytes if self.reserved_bytes else 0.0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "reserved_bytes": self.reserved_bytes,
            "allocated_bytes": self.allocated_bytes,
            "pending_free_bytes": self.pending_free_bytes,
            "inactive_split_bytes": self.inactive_split_bytes,
            "n_inactive_split_blocks": self.n_inactive_split_blocks,
            "releasable_bytes": self.releasable_bytes,
            "n_segments": self.n_segments,
            "n_free_segments": self.n_free_segments,
            "fragmentation_pct": round(self.fragmentation_pct, 2),
            "worst_segments": [s.to_json() for s in self.worst_segments],
        }


@dataclass(frozen=True, kw_only=True)
class TimelinePoint:
    event_index: int
    time_us: int | None
    allocated_bytes: int
    reserved_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "event_index": self.event_index,
            "time_us": self.time_us,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
        }


@dataclass(frozen=True, kw_only=True)
class DeviceTrace:
    """The replay of one device's trace.

    ``peak_allocated_bytes``: requested bytes live at the trace's peak (see the module docstring);
    ``before_trace_bytes`` of them were allocated before the window began (no stack known).
    ``at_peak``: the rest, by place in the code. ``lead_up``: the last allocations before the peak
    that were still live at it, newest first.
    """

    device: int
    n_events: int
    actions: dict[str, int]
    first_time_us: int | None
    last_time_us: int | None
    peak_allocated_bytes: int
    peak_event_index: int | None
    peak_time_us: int | None
    peak_reserved_bytes: int
    before_trace_bytes: int
    n_frees_without_alloc: int
    at_peak: list[PlaceBytes]
    at_peak_by_module: list[PlaceBytes]
    lead_up: list[Allocation]
    ooms: list[dict[str, Any]]
    timeline: list[TimelinePoint]

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "n_events": self.n_events,
            "actions": dict(self.actions),
            "first_time_us": self.first_time_us,
            "last_time_us": self.last_time_us,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_event_index": self.peak_event_index,
            "peak_time_us": self.peak_time_us,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "before_trace_bytes": self.before_trace_bytes,
            "n_frees_without_alloc": self.n_frees_without_alloc,
            "at_peak": [p.to_json() for p in self.at_peak],
            "at_peak_by_module": [p.to_json() for p in self.at_peak_by_module],
            "lead_up": [a.to_json() for a in self.lead_up],
            "ooms": list(self.ooms),
            "timeline": [p.to_json() for p in self.timeline],
        }


@dataclass(frozen=True, kw_only=True)
class SnapshotAnalysis:
    """What :func:`analyze_snapshot` found. ``allocated_bytes`` / ``reserved_bytes`` are the state
    when the snapshot was taken (block sizes, as ``memory_allocated()`` / ``memory_reserved()``)."""

    path: str
    file_bytes: int
    reader: str
    allocated_bytes: int
    requested_bytes: int
    reserved_bytes: int
    n_live_allocations: int
    largest: list[Allocation]
    by_location: list[PlaceBytes]
    by_module: list[PlaceBytes]
    fragmentation: Fragmentation
    devices: list[DeviceTrace]
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "reader": self.reader,
            "allocated_bytes": self.allocated_bytes,
            "requested_bytes": self.requested_bytes,
            "reserved_bytes": self.reserved_bytes,
            "n_live_allocations": self.n_live_allocations,
            "largest": [a.to_json() for a in self.largest],
            "by_location": [p.to_json() for p in self.by_location],
            "by_module": [p.to_json() for p in self.by_module],
            "fragmentation": self.fragmentation.to_json(),
            "devices": [d.to_json() for d in self.devices],
            "allocator_settings": self.allocator_settings,
            "notes": list(self.notes),
        }


def _top_places(sizes: dict[str, list[int]], top: int) -> list[PlaceBytes]:
    rows = sorted(sizes.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return [PlaceBytes(place=k, n_bytes=v[0], n_allocations=v[1]) for k, v in rows]


def _add(places: dict[str, list[int]], key: str, n_bytes: int) -> None:
    acc = places[key]
    acc[0] += n_bytes
    acc[1] += 1


class _SegmentReader:
    """Folds segments into totals, top allocations, places and fragmentation; keeps O(top) rows."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.allocated = self.requested = self.reserved = self.pending = 0
        self.inactive_split = self.n_inactive_split = self.releasable = 0
        self.n_segments = self.n_free_segments = self.n_live = 0
        self.requested_by_device: Counter[int] = Counter()
        self.largest: list[tuple[int, int, Allocation]] = []  # min-heap of (size, seq, alloc)
        self.worst: list[tuple[int, int, SegmentUse]] = []
        self.by_location: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.by_module: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._seq = 0

    def __call__(self, seg: dict[str, Any]) -> None:
        device = int(seg.get("device", 0) or 0)
        total = int(seg.get("total_size", 0))
        self.n_segments += 1
        self.reserved += total
        allocated = inactive = n_inactive = largest_free = 0
        for block in seg.get("blocks") or ():
            size = int(block.get("size", 0))
            state = block.get("state")
            if state == "active_allocated":
                frames, requested = _block_frames(block)
                allocated += size
                self.requested += requested
                self.requested_by_device[device] += requested
                self.n_live += 1
                self._live_block(device, int(block.get("address", 0)), size, frames)
            elif state == "inactive":
                inactive += size
                n_inactive += 1
                largest_free = max(largest_free, size)
            else:  # active_pending_free (torch's name; the docstring says active_awaiting_free)
                self.pending += size
        self.allocated += allocated
        if allocated == 0 and inactive == total:
            self.n_free_segments += 1
            self.releasable += total
        elif inactive:
            self.inactive_split += inactive
            self.n_inactive_split += n_inactive
            use = SegmentUse(
                device=device,
                address=int(seg.get("address", 0)),
                segment_type=str(seg.get("segment_type", "?")),
                total_bytes=total,
                allocated_bytes=allocated,
                inactive_bytes=inactive,
                n_inactive_blocks=n_inactive,
                largest_inactive_bytes=largest_free,
            )
            self._push(self.worst, inactive, use)

    def _live_block(self, device: int, address: int, size: int, frames: Any) -> None:
        _add(self.by_location, fr.location(frames), size)
        _add(self.by_module, fr.module(frames), size)
        if len(self.largest) < self.top or size > self.largest[0][0]:
            alloc = Allocation(
                size_bytes=size,
                device=device,
                address=address,
                location=fr.location(frames),
                module=fr.module(frames),
                frames=fr.format_frames(frames),
            )
            self._push(self.largest, size, alloc)

    def _push(self, heap: list[Any], key: int, row: Any) -> None:
        self._seq += 1
        item = (key, -self._seq, row)
        if len(heap) < self.top:
            heapq.heappush(heap, item)
        elif key > heap[0][0]:
            heapq.heapreplace(heap, item)


def _block_frames(block: dict[str, Any]) -> tuple[Any, int]:
    """(frames, requested bytes) of a block; older snapshots keep them in ``history``."""
    if "frames" in block:
        return block["frames"], int(block.get("requested_size", block.get("size", 0)))
    history = block.get("history") or [{}]
    return history[0].get("frames", []), int(history[0].get("real_size", block.get("size", 0)))


@dataclass(slots=True)
class _Live:
    size: int
    frames: Any
    time_us: int | None
    index: int
    addr: int


class _TraceReplay:
    """Replays one device's events in order, in memory bounded by the live allocations."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.n = 0
        self.actions: Counter[str] = Counter()
        self.net = self.reserved = 0
        self.peak_net = 0  # the window's start until an alloc rises above it
        self.peak_index = -1
        self.peak_time: int | None = None
        self.peak_reserved = 0
        self.live: dict[int, _Live] = {}
        self.freed_after_peak: list[_Live] = []  # live at the peak, freed since
        self.n_unmatched = 0
        self.first_time: int | None = None
        self.last_time: int | None = None
        self.ooms: list[dict[str, Any]] = []
        self.points: list[list[int]] = []  # [first index, time, net max, reserved max]
        self.bucket = 1

    def __call__(self, ev: dict[str, Any]) -> None:
        i = self.n
        self.n += 1
        action = ev.get("action")
        self.actions[str(action)] += 1
        t = ev.get("time_us")
        if t is not None:
            if self.first_time is None:
                self.first_time = t
            self.last_time = t
        size = int(ev.get("size", 0) or 0)
        if action == "alloc":
            addr = int(ev.get("addr", 0))
            self.live[addr] = _Live(size, ev.get("frames"), t, i, addr)
            self.net += size
            if self.net > self.peak_net:
                self.peak_net, self.peak_index, self.peak_time = self.net, i, t
                self.freed_after_peak.clear()
        elif action == "free_requested":
            self.net -= size
            entry = self.live.pop(int(ev.get("addr", 0)), None)
            if entry is None:
                self.n_unmatched += 1
            elif entry.index <= self.peak_index:
                self.freed_after_peak.append(entry)
        elif action in ("segment_alloc", "segment_map"):
            self.reserved += size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        elif action in ("segment_free", "segment_unmap"):
            self.reserved -= size
        elif action == "oom" and len(self.ooms) < 20:
            self.ooms.append(
                {
                    "event_index": i,
                    "time_us": t,
                    "requested_bytes": size,
                    "device_free_bytes": ev.get("device_free"),
                    "location": fr.location(ev.get("frames")),
                    "frames": fr.format_frames(ev.get("frames")),
                }
            )
        self._sample(i, t)

    def _sample(self, i: int, t: int | None) -> None:
        pts = self.points
        if pts and i - pts[-1][0] < self.bucket:
            last = pts[-1]
            last[2] = max(last[2], self.net)
            last[3] = max(last[3], self.reserved)
            return
        pts.append([i, t if t is not None else -1, self.net, self.reserved])
        if len(pts) >= 2 * TIMELINE_POINTS:
            merged = []
            for a, b in zip(pts[0::2], pts[1::2], strict=False):
                merged.append([a[0], a[1], max(a[2], b[2]), max(a[3], b[3])])
            if len(pts) % 2:
                merged.append(pts[-1])
            self.points = merged
            self.bucket *= 2

    def result(self, end_requested: int, end_reserved: int | None, top: int) -> DeviceTrace:
        # The curve is known up to a constant: what was allocated before the window. Anchor it
        # at the end state the segments describe.
        offset = max(end_requested - self.net, 0)
        r_offset = max((end_reserved or 0) - self.reserved, 0)
        at_peak = [e for e in self.live.values() if e.index <= self.peak_index]
        at_peak += self.freed_after_peak
        peak = offset + self.peak_net
        places: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        modules: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for e in at_peak:
            _add(places, fr.location(e.frames), e.size)
            _add(modules, fr.module(e.frames), e.size)
        lead = sorted(at_peak, key=lambda e: -e.index)[:top]
        return DeviceTrace(
            device=self.device,
            n_events=self.n,
            actions=dict(self.actions),
            first_time_us=self.first_time,
            last_time_us=self.last_time,
            peak_allocated_bytes=peak,
            peak_event_index=self.peak_index if self.peak_index >= 0 else None,
            peak_time_us=self.peak_time,
            peak_reserved_bytes=r_offset + self.peak_reserved,
            before_trace_bytes=peak - sum(e.size for e in at_peak),
            n_frees_without_alloc=self.n_unmatched,
            at_peak=_top_places(places, top),
            at_peak_by_module=_top_places(modules, top),
            lead_up=[
                Allocation(
                    size_bytes=e.size,
                    device=self.device,
                    address=e.addr,
                    location=fr.location(e.frames),
                    module=fr.module(e.frames),
                    frames=fr.format_frames(e.frames),
                    time_us=e.time_us,
                    event_index=e.index,
                )
                for e in lead
            ],
            ooms=self.ooms,
            timeline=[
                TimelinePoint(
                    event_index=p[0],
                    time_us=None if p[1] == -1 else p[1],
                    allocated_bytes=offset + p[2],
                    reserved_bytes=r_offset + p[3],
                )
                for p in self.points
            ],
        )


#: The numbers the analysis computes with, in segments, blocks and trace events; torch writes each
#: as an int (``torch/csrc/cuda/Module.cpp``, ``THCPModule_memorySnapshot``) or leaves it out.
_INT_FIELDS = (
    "device",
    "address",
    "total_size",
    "size",
    "requested_size",
    "real_size",
    "addr",
    "time_us",
    "device_free",
)
_MAX_INT = 2**63 - 1
#: What a record of the wrong shape raises inside the analysis (a segment's ``blocks`` a number,
#: ``device_traces`` holding None...): each becomes one SnapshotError.
_SHAPE_FAILURES = (TypeError, ValueError, AttributeError, OverflowError, KeyError, IndexError)


def _check_record(path: Path, what: str, rec: Any) -> None:
    """A SnapshotError unless ``rec`` is a dict whose numeric fields are None or int64 ints."""
    if not isinstance(rec, dict):
        raise SnapshotError(
            f"{path}: not a torch memory snapshot: a {what} is a {type(rec).__name__}, not a dict; "
            "it was written by something else or altered"
        )
    for key in _INT_FIELDS:
        value = rec.get(key)
        if value is None or (type(value) is int and -_MAX_INT <= value <= _MAX_INT):
            continue
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise SnapshotError(
            f"{path}: not a torch memory snapshot: a {what}'s {key!r} is {shown}, not a 64-bit "
            "integer; it was written by something else or altered"
        )
    for key in ("frames", "blocks", "history"):
        value = rec.get(key)
        if value is not None and not isinstance(value, (list, tuple)):
            raise SnapshotError(
                f"{path}: not a torch memory snapshot: a {what}'s {key!r} is a "
                f"{type(value).__name__}, not a list; it was written by something else or altered"
            )


def _plain_settings(settings: Any) -> dict[str, Any]:
    """``allocator_settings`` as torch writes them (names to JSON values: numbers, strings, the
    ``roundup_power2_divisions`` map); an entry JSON cannot write (bytes, a tuple key) is left
    out rather than breaking ``--json``."""
    if not isinstance(settings, dict):
        return {}
    out = {}
    for key, value in settings.items():
        try:
            json.dumps({key: value})
        except (TypeError, ValueError, RecursionError):
            continue
        out[key] = value
    return out


def analyze_snapshot(
    path: str | Path, *, top: int = 10, stream: bool | None = None
) -> SnapshotAnalysis:
    """Summarise the CUDA memory snapshot at ``path`` (a ``torch.cuda.memory._dump_snapshot``
    pickle). ``top``: rows per table. ``stream``: None reads files of 32 MiB and more as a stream
    (bounded memory) and smaller ones whole; True / False force one reader.

    The file is read with a pickle reader that refuses every class or function reference, so a
    hostile file cannot run code (:class:`~memfit.errors.SnapshotError`).
    """
    path = Path(path)
    segments = _SegmentReader(top)
    replays: dict[int, _TraceReplay] = {}
    reserved_by_device: Counter[int] = Counter()

    def on_segment(seg: dict[str, Any]) -> None:
        _check_record(path, "segment", seg)
        for block in seg.get("blocks") or ():
            _check_record(path, "block", block)
            for entry in block.get("history") or ():
                _check_record(path, "block history entry", entry)
        segments(seg)
        reserved_by_device[int(seg.get("device", 0) or 0)] += int(seg.get("total_size", 0))

    def on_event(device: int, ev: dict[str, Any]) -> None:
        _check_record(path, "trace event", ev)
        replay = replays.get(device)
        if replay is None:
            replay = replays[device] = _TraceReplay(device)
        replay(ev)

    try:
        rest, reader = read_snapshot(path, on_segment, on_event, stream=stream)
    except _SHAPE_FAILURES as exc:  # a list where a dict goes, a str where a number goes...
        raise SnapshotError(
            f"{path}: not a torch memory snapshot: a value of the wrong type or shape in it "
            f"({type(exc).__name__}: {str(exc)[:80]}); it was written by something else or altered"
        ) from None
    notes = []
    if not replays:
        notes.append(
            "no trace events: record them with torch.cuda.memory._record_memory_history() before "
            "the step and take the snapshot after it; only the end state is reported"
        )
    devices = []
    for device, replay in sorted(replays.items()):
        devices.append(
            replay.result(segments.requested_by_device[device], reserved_by_device.get(device), top)
        )
        if replay.n_unmatched:
            notes.append(
                f"device {device}: {replay.n_unmatched} frees of blocks allocated before the trace "
                "window (max_entries); their stacks are unknown"
            )
    frag = Fragmentation(
        reserved_bytes=segments.reserved,
        allocated_bytes=segments.allocated,
        pending_free_bytes=segments.pending,
        inactive_split_bytes=segments.inactive_split,
        n_inactive_split_blocks=segments.n_inactive_split,
        releasable_bytes=segments.releasable,
        n_segments=segments.n_segments,
        n_free_segments=segments.n_free_segments,
        worst_segments=[row for _, _, row in sorted(segments.worst, reverse=True)],
    )
    settings = rest.get("allocator_settings")
    return SnapshotAnalysis(
        path=str(path),
        file_bytes=path.stat().st_size,
        reader=reader,
        allocated_bytes=segments.allocated,
        requested_bytes=segments.requested,
        reserved_bytes=segments.reserved,
        n_live_allocations=segments.n_live,
        largest=[row for _, _, row in sorted(segments.largest, reverse=True)],
        by_location=_top_places(segments.by_location, top),
        by_module=_top_places(segments.by_module, top),
        fragmentation=frag,
        devices=devices,
        allocator_settings=_plain_settings(settings),
        notes=notes,
    )

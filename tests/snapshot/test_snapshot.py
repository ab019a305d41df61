"""Snapshot analysis: torch's format, the replay, fragmentation, the safe and streaming readers."""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memfit.errors import SnapshotError
from memfit.snapshot import analyze_snapshot, load_snapshot
from memfit.snapshot.frames import location, module
from memfit.snapshot.generate import snapshot_from_cpu_step, write_pickle, write_synthetic_snapshot
from memfit.snapshot.load import stream_snapshot
from memfit.snapshot.write import PickleStreamWriter, Stream

USER = {"filename": "/home/u/train.py", "line": 42, "name": "train_step"}
LIB = {
    "filename": "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py",
    "line": 300,
    "name": "forward",
}
TORCH = {
    "filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
    "line": 125,
    "name": "forward",
}
CPP = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "malloc"}

# The keys torch writes (THCPModule_memorySnapshot in torch/csrc/cuda/Module.cpp).
SEGMENT_KEYS = {
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size",
    "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
}  # fmt: skip
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
EVENT_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


@pytest.fixture(scope="module")
def cpu_snapshot() -> dict[str, Any]:
    pytest.importorskip("torch")
    return snapshot_from_cpu_step()


def ev(
    action: str, addr: int, size: int, frames: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": 0,
        "frames": frames or [],
    }


def seg(
    address: int, blocks: list[tuple[int, str, list[dict[str, Any]]]], kind: str = "large"
) -> dict[str, Any]:
    out, at = [], address
    for size, state, frames in blocks:
        out.append(
            {"address": at, "size": size, "requested_size": size, "state": state, "frames": frames}
        )
        at += size
    used = sum(b["size"] for b in out if b["state"] == "active_allocated")
    return {
        "device": 0, "address": address, "total_size": at - address, "allocated_size": used,
        "active_size": used, "requested_size": used, "stream": 0, "segment_type": kind,
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": out,
    }  # fmt: skip


def write(tmp_path: Path, snap: Any, name: str = "s.pickle", protocol: int | None = None) -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    return path


def test_generated_snapshot_has_torchs_keys_and_types(cpu_snapshot: dict[str, Any]) -> None:
    assert set(cpu_snapshot) >= {"segments", "device_traces", "allocator_settings"}
    for s in cpu_snapshot["segments"]:
        assert set(s) == SEGMENT_KEYS and isinstance(s["segment_pool_id"], tuple)
        for b in s["blocks"]:
            assert set(b) == BLOCK_KEYS
            assert b["state"] in ("active_allocated", "inactive")
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    events = cpu_snapshot["device_traces"][0]
    assert {e["action"] for e in events} == {
        "segment_alloc",
        "alloc",
        "free_requested",
        "free_completed",
    }
    assert all(set(e) == EVENT_KEYS for e in events)
    frames = next(e["frames"] for e in events if e["action"] == "alloc")
    assert set(frames[0]) == {"filename", "line", "name"}


def test_both_readers_agree_on_every_pickle_protocol(
    cpu_snapshot: dict[str, Any], tmp_path: Path
) -> None:
    expected = None
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        path = write(tmp_path, cpu_snapshot, f"p{protocol}.pickle", protocol)
        whole = analyze_snapshot(path, stream=False).to_json()
        streamed = analyze_snapshot(path, stream=True).to_json()
        assert (whole.pop("reader"), streamed.pop("reader")) == ("whole", "stream")
        for j in (whole, streamed):
            j.pop("path"), j.pop("file_bytes")
        assert streamed == whole
        expected = expected or whole
        assert whole == expected, f"protocol {protocol} reads differently"


def test_cpu_step_peak_is_everything_live_at_it(
    cpu_snapshot: dict[str, Any], tmp_path: Path
) -> None:
    a = analyze_snapshot(write(tmp_path, cpu_snapshot))
    d = a.devices[0]
    # The trace starts at an empty allocator: nothing is from before it, and the places at the
    # peak add up to the peak.
    assert d.before_trace_bytes == 0 and d.n_frees_without_alloc == 0
    assert sum(p.n_bytes for p in d.at_peak) == d.peak_allocated_bytes
    assert d.peak_allocated_bytes > a.requested_bytes  # activations + grads + states > states
    assert a.allocated_bytes == sum(
        b["size"]
        for s in cpu_snapshot["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    )
    # user frames only: the innermost frame of every place is the generator's own code
    assert all(p.place.startswith("generate.py:") for p in d.at_peak)


def test_replay_finds_the_peak_what_was_live_and_what_came_before(tmp_path: Path) -> None:
    mib = 1 << 20
    events = [
        ev("free_requested", 0x900, 2 * mib),  # allocated before the trace window
        ev("alloc", 0x100, 4 * mib, [TORCH, LIB, USER]),
        ev("alloc", 0x200, 8 * mib, [TORCH, USER]),
        ev("alloc", 0x300, 1 * mib, [USER]),
        ev("free_requested", 0x300, 1 * mib),  # peak is before this: 13 MiB + what came before
        ev("free_requested", 0x200, 8 * mib),
        ev("alloc", 0x400, 2 * mib, [USER]),
    ]
    # end state: 0x100 (4 MiB) and 0x400 (2 MiB) live, plus 3 MiB from before the window
    blocks = [
        (4 * mib, "active_allocated", [LIB]),
        (3 * mib, "active_allocated", []),
        (2 * mib, "active_allocated", [USER]),
        (11 * mib, "inactive", []),
    ]
    segments = [seg(0x100, blocks)]
    snap = {"segments": segments, "device_traces": [events]}
    d = analyze_snapshot(write(tmp_path, snap)).devices[0]
    assert d.peak_event_index == 3
    # 9 MiB live at the end - 4 MiB net change in the window = 5 MiB at its start; 2 freed first
    assert d.peak_allocated_bytes == 3 * mib + 13 * mib
    assert d.before_trace_bytes == 3 * mib  # 2 of the 5 were freed before the peak
    assert d.n_frees_without_alloc == 1
    assert [(p.place, p.n_bytes) for p in d.at_peak] == [
        ("train.py:42 train_step", 9 * mib),
        ("transformers/models/llama/modeling_llama.py:300 forward", 4 * mib),
    ]
    assert [a.address for a in d.lead_up] == [0x300, 0x200, 0x100]  # newest first
    assert d.timeline[-1].allocated_bytes == 9 * mib  # anchored at the segments' end state


def test_fragmentation_separates_split_blocks_from_empty_segments(tmp_path: Path) -> None:
    mib = 1 << 20
    snap = {
        "segments": [
            seg(0x0, [(2 * mib, "active_allocated", [USER]), (18 * mib, "inactive", [])]),
            seg(0x4000000, [(20 * mib, "inactive", [])]),
            seg(
                0x8000000,
                [(1 * mib, "inactive", []), (1 * mib, "active_allocated", [LIB])],
                "small",
            ),
        ],
        "device_traces": [],
    }
    a = analyze_snapshot(write(tmp_path, snap))
    f = a.fragmentation
    assert (f.reserved_bytes, f.allocated_bytes) == (42 * mib, 3 * mib)
    assert (f.inactive_split_bytes, f.n_inactive_split_blocks) == (19 * mib, 2)
    assert (f.releasable_bytes, f.n_free_segments) == (20 * mib, 1)
    assert (
        f.worst_segments[0].address == 0x0
        and f.worst_segments[0].largest_inactive_bytes == 18 * mib
    )
    assert round(f.fragmentation_pct, 2) == round(100 * 19 / 42, 2)
    assert a.notes and "no trace events" in a.notes[0]


def test_places_skip_torch_and_cpp_frames() -> None:
    assert (
        location([CPP, TORCH, LIB, USER])
        == "transformers/models/llama/modeling_llama.py:300 forward"
    )
    assert module([TORCH, USER]) == "train"
    assert location([CPP, TORCH]) == "(torch internals only)"
    assert location([]) == "(no Python stack recorded)"


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("stream", [False, True])
def test_a_pickle_that_calls_code_is_refused_and_nothing_runs(tmp_path: Path, stream: bool) -> None:
    marker = tmp_path / "pwned"
    evil_global = tmp_path / "global.pickle"  # protocol 0: GLOBAL os.system
    evil_global.write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    evil_stack = write(tmp_path, {"segments": [], "x": _Evil(marker)}, "stack.pickle", 4)
    for path, what in ((evil_global, r"os\.system"), (evil_stack, r"builtins\.eval|STACK_GLOBAL")):
        with pytest.raises(
            SnapshotError, match=rf"refused to load: .*{what}.*nothing in it was executed"
        ):
            analyze_snapshot(path, stream=stream)
    assert not marker.exists()
    # the crafted files are live: an ordinary unpickler would have run them
    pickle.loads(evil_stack.read_bytes())
    assert marker.read_text() == "pwned"


def test_broken_and_foreign_pickles_get_a_clear_error(tmp_path: Path) -> None:
    good = write(tmp_path, {"segments": [], "device_traces": [[ev("alloc", 1, 2)]]}, protocol=4)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(good.read_bytes()[:-20])
    for stream in (False, True):
        with pytest.raises(
            SnapshotError, match=r"cut\.pickle: (the pickle ends early|not a readable pickle)"
        ):
            analyze_snapshot(cut, stream=stream)
        with pytest.raises(
            SnapshotError, match=r"not a torch memory snapshot: the pickle holds a list"
        ):
            analyze_snapshot(write(tmp_path, [1, 2], "list.pickle"), stream=stream)
    with pytest.raises(SnapshotError, match="snapshot .*missing.pickle.* does not exist"):
        load_snapshot(tmp_path / "missing.pickle")


def _ops(data: bytes) -> list[tuple[str, Any]]:
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data) if op.name != "FRAME"]


def test_stream_writer_writes_what_pickle_dump_writes() -> None:
    frames = [TORCH, USER]
    events = [ev("alloc", 2**45 + i, 512 + i * 70000, frames) for i in range(2503)]
    events.append(
        {"action": "oom", "device_free": 3, "size": 2**33, "stream": 0, "time_us": 1, "frames": []}
    )
    snap = {"segments": [seg(0, [(512, "active_allocated", frames)])],
            "device_traces": [events, [dict(events[0])]],
            "allocator_settings": {"garbage_collection_threshold": 0.5, "expandable_segments": True,
                                   "PYTORCH_CUDA_ALLOC_CONF": "x" * 300}}  # fmt: skip
    buf = io.BytesIO()
    streamed = dict(snap, device_traces=[Stream(iter(events)), snap["device_traces"][1]])
    PickleStreamWriter(buf).dump(streamed)
    assert _ops(buf.getvalue()) == _ops(pickle.dumps(snap, protocol=4))


_PEAK_RSS = """
import sys
from memfit.snapshot import analyze_snapshot

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

before = status("VmRSS:")
analyze_snapshot(sys.argv[1], stream=sys.argv[2] == "stream")
print(status("VmHWM:") - before)
"""


def _peak_rss_bytes(path: Path, reader: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(path), reader],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")
def test_streaming_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    small = write_synthetic_snapshot(tmp_path / "small.pickle", n_steps=15)
    # 8x the events: the streaming reader's fixed ~2.6 MB of allocator noise was 0.73-0.76x of
    # a 4x file's extra bytes on this machine (a flaky bound), 0.32x of these (2026-12-06)
    big = write_synthetic_snapshot(tmp_path / "big.pickle", n_steps=120)
    extra = big.stat().st_size - small.stat().st_size
    assert extra > 3_000_000
    whole = _peak_rss_bytes(big, "whole") - _peak_rss_bytes(small, "whole")
    stream = _peak_rss_bytes(big, "stream") - _peak_rss_bytes(small, "stream")
    # Whole: every event dict is alive at once, so memory grows by several times the added bytes
    # (measured ~6x). Stream: shared frames, live allocations, a bounded timeline and one batch
    # of 1000 events; what grows is allocator noise (measured ~0.5x here, flattening with size:
    # benchmarks/results/snapshot_memory.md).
    assert whole > 3 * extra, (whole, extra)
    assert stream < 0.75 * extra, (stream, extra)


def test_cli_snapshot_text_json_and_bad_input(cpu_snapshot: dict[str, Any], tmp_path: Path) -> None:
    path = write_pickle(cpu_snapshot, tmp_path / "cpu.pickle")
    cmd = [sys.executable, "-m", "memfit", "snapshot", str(path)]
    text = subprocess.run(cmd + ["--top", "3"], capture_output=True, text=True, check=True).stdout
    assert "peak allocated" in text and "live at the peak, by place in the code" in text
    out = subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["devices"][0]["peak_allocated_bytes"] > 0
    (tmp_path / "bad.pickle").write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    bad = subprocess.run(cmd[:-1] + [str(tmp_path / "bad.pickle")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "memfit: error:" in bad.stderr and "refused to load" in bad.stderr


def test_stream_snapshot_returns_the_rest_of_the_root(tmp_path: Path) -> None:
    snap = {"segments": [seg(0, [(512, "inactive", [])])], "device_traces": [[ev("alloc", 1, 2)]],
            "allocator_settings": {"expandable_segments": False}}  # fmt: skip
    got: list[Any] = []
    rest = stream_snapshot(write(tmp_path, snap), got.append, lambda d, e: got.append((d, e)))
    assert rest["allocator_settings"] == {"expandable_segments": False}
    assert got == [snap["segments"][0], (0, snap["device_traces"][0][0])]


def test_snapshot_and_report_modules_do_not_import_torch() -> None:
    code = (
        "import sys, memfit.snapshot, memfit.report.html, memfit.cli.report;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_snapshots_doc_quotes_the_benchmark_table() -> None:
    root = Path(__file__).resolve().parents[2]
    generated = (root / "benchmarks/results/snapshot_memory.md").read_text()
    rows = [line for line in generated.splitlines() if line.startswith("| ") and " MB |" in line]
    assert len(rows) == 4 and all(row in (root / "docs/snapshots.md").read_text() for row in rows)

"""The snapshot readers on hostile files: devices, FIFOs, bad length fields, long text lines."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from memfit.errors import MemfitError, SnapshotError
from memfit.snapshot import analyze_snapshot

READERS = [False, True]  # whole, stream


def _root_with(tail: bytes) -> bytes:
    """A protocol-2 pickle of {"segments": [], "x": <tail opcodes>} ending in STOP."""
    # EMPTY_DICT, key "segments", EMPTY_LIST, SETITEM, key "x", the tail, SETITEM, STOP
    return b"\x80\x04}" + b"\x8c\x08segments]s" + b"\x8c\x01x" + tail + b"s."


@pytest.mark.parametrize("stream", READERS)
def test_a_negative_length_field_is_refused_not_looped_on(tmp_path: Path, stream: bool) -> None:
    path = tmp_path / "neg.pickle"
    path.write_bytes(_root_with(b"X" + struct.pack("<i", -9)))
    started = time.monotonic()
    with pytest.raises(SnapshotError, match="malformed pickle|not a readable pickle"):
        analyze_snapshot(path, stream=stream)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("stream", READERS)
def test_a_length_field_past_the_end_of_the_file_is_refused(tmp_path: Path, stream: bool) -> None:
    path = tmp_path / "huge.pickle"
    path.write_bytes(_root_with(b"\x8d" + struct.pack("<q", 2**60) + b"abc"))
    with pytest.raises(SnapshotError, match="bytes|pickle"):
        analyze_snapshot(path, stream=stream)


def test_a_long_text_line_is_read_in_linear_time(tmp_path: Path) -> None:
    # 4 MB of digits in a protocol-0 INT: the old reader re-copied its buffer per chunk
    path = tmp_path / "line.pickle"
    path.write_bytes(_root_with(b"V" + b"a" * 4_000_000 + b"\n"))
    started = time.monotonic()
    analysis = analyze_snapshot(path, stream=True)
    assert analysis.reader == "stream"
    assert time.monotonic() - started < 10


def test_a_text_line_longer_than_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "line.pickle"
    path.write_bytes(_root_with(b"V" + b"a" * (17 << 20)))  # no newline at all
    with pytest.raises(SnapshotError, match="text argument longer than"):
        analyze_snapshot(path, stream=True)


@pytest.mark.parametrize("stream", READERS)
@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_a_snapshot_path_linked_to_a_device_is_refused(
    tmp_path: Path, stream: bool, target: str
) -> None:
    link = tmp_path / "snap.pickle"
    link.symlink_to(target)
    with pytest.raises(MemfitError, match="character device"):
        analyze_snapshot(link, stream=stream)


@pytest.mark.parametrize("stream", READERS)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, stream: bool) -> None:
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)
    with pytest.raises(MemfitError, match="FIFO"):
        analyze_snapshot(fifo, stream=stream)

"""The bounded reader refuses what could exhaust or hang the machine, and reads what it should."""

from __future__ import annotations

import os
import threading

import pytest

from memfit.userfiles import (
    UserFileError,
    iter_lines,
    read_bytes,
    read_json,
    read_text,
)


def test_reads_a_regular_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"a": 1}')
    assert read_json(f, what="config") == {"a": 1}
    assert read_text(f, what="config") == '{"a": 1}'


def test_a_symlink_to_dev_zero_is_refused_without_reading_it(tmp_path):
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(UserFileError, match="character device"):
        read_bytes(link, what="config")


def test_a_fifo_is_refused_instead_of_hanging(tmp_path):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_bytes(fifo, what="run log")
        except BaseException as exc:  # noqa: BLE001 - the assertion below names it
            result.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading a FIFO hung"
    assert isinstance(result[0], UserFileError) and "FIFO" in str(result[0])


def test_a_directory_and_a_missing_path_are_clear_errors(tmp_path):
    with pytest.raises(UserFileError, match="directory"):
        read_bytes(tmp_path, what="config")
    with pytest.raises(UserFileError, match="does not exist"):
        read_bytes(tmp_path / "nope.json", what="config")


def test_the_size_cap_is_checked_while_reading(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b"x" * 1001)
    with pytest.raises(UserFileError, match="larger than 1,000 bytes"):
        read_bytes(f, what="config", max_bytes=1000)
    assert len(read_bytes(f, what="config", max_bytes=1001)) == 1001


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', "[" * 100_000 + "]" * 100_000])
def test_json_is_strict_and_bounded(tmp_path, text):
    f = tmp_path / "c.json"
    f.write_text(text)
    with pytest.raises(UserFileError, match="not valid JSON|nested too deeply"):
        read_json(f, what="config")


def test_non_utf8_text_is_a_clear_error(tmp_path):
    f = tmp_path / "c.json"
    f.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserFileError, match="not UTF-8"):
        read_text(f, what="config")


def test_lines_stream_with_a_per_line_cap(tmp_path):
    f = tmp_path / "run.jsonl"
    f.write_bytes(b"one\r\ntwo\nthree")
    assert list(iter_lines(f, what="run log")) == [(1, b"one"), (2, b"two"), (3, b"three")]
    f.write_bytes(b"short\n" + b"y" * 50 + b"\n")
    with pytest.raises(UserFileError, match="line 2 is longer than 10 bytes"):
        list(iter_lines(f, what="run log", max_line_bytes=10))

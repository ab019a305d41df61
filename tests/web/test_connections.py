"""Idle connections cannot starve a request (issue 33: 31 idle TCP connections made every
request a 503 for as long as they stayed open)."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from memfit.cli import build_parser, main
from memfit.web.connections import Slots
from memfit.web.serve import running


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    """A server with a short head deadline and few slots per client (so the test is quick)."""
    with running(
        run=main, parser_factory=build_parser, n_workers=1, head_timeout_s=2.0, max_per_client=8
    ) as base:
        yield base


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``sock`` within ``seconds`` (an RST counts); what it sent
    before is read and dropped."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(4096) == b"":
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def test_idle_sockets_held_open_do_not_stop_a_request(guarded: str) -> None:
    url = f"{guarded}/api/estimate?model=gpt2&engine=analytic"
    with urllib.request.urlopen(url) as r:  # the worker's first job (imports) before the clock
        assert r.status == 200
    socks = []
    try:
        for i in range(40):  # silent ones and ones stuck half-way through their request head
            s = socket.create_connection(("127.0.0.1", _port(guarded)))
            if i % 2:
                s.sendall(b"GET /api/schema HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        started = time.monotonic()
        with urllib.request.urlopen(url) as r:
            assert r.status == 200 and r.headers["X-Memfit-Exit"] == "0"
        assert time.monotonic() - started < 1.9  # answered before any deadline freed a slot
    finally:
        for s in socks:
            s.close()


def test_a_connection_without_a_whole_request_head_is_closed_at_the_deadline(
    guarded: str,
) -> None:
    silent = socket.create_connection(("127.0.0.1", _port(guarded)))
    trickle = socket.create_connection(("127.0.0.1", _port(guarded)))
    try:
        started = time.monotonic()
        for byte in b"GET / HTTP/1.1\r\n":  # slowloris: a byte at a time does not move it
            trickle.sendall(bytes([byte]))
            time.sleep(0.1)
        assert _closed_within(trickle, 3.0) and _closed_within(silent, 1.0)
        assert time.monotonic() - started < 4.5
    finally:
        silent.close()
        trickle.close()


def test_a_keep_alive_connection_gets_its_answer_and_then_the_deadline(guarded: str) -> None:
    s = socket.create_connection(("127.0.0.1", _port(guarded)))
    try:
        s.sendall(b"GET /api/schema HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(10)
        assert s.recv(12) == b"HTTP/1.1 200"
        assert _closed_within(s, 5.0)  # idle after its answer: closed, not held forever
    finally:
        s.close()


class _Conn:
    def __init__(self, idle: bool, since: float) -> None:
        self.idle, self.idle_since, self.closed = idle, since, False

    def close_idle(self) -> None:
        self.closed = True


def test_a_full_client_gives_up_its_longest_idle_slot_and_busy_slots_are_kept() -> None:
    slots = Slots(max_total=4, max_per_client=2)
    a_busy, a_idle = _Conn(False, 0.0), _Conn(True, 1.0)
    assert slots.admit(a_busy, "a") and slots.admit(a_idle, "a")
    newer: Any = _Conn(True, 2.0)
    assert slots.admit(newer, "a")  # a's idle connection made room
    assert a_idle.closed and not a_busy.closed and a_idle not in slots.open
    newer.idle = False
    assert not slots.admit(_Conn(True, 3.0), "a")  # both of a's slots answer requests: refused
    b1, b2 = _Conn(True, 4.0), _Conn(True, 5.0)
    assert slots.admit(b1, "b") and slots.admit(b2, "b")  # another client still has its slots
    assert slots.admit(_Conn(True, 6.0), "c")  # all 4 taken: the oldest idle one (b1) gave way
    assert b1.closed and not b2.closed

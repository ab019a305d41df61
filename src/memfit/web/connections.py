"""The calculator's HTTP connections: idle sockets cannot starve a request.

uvicorn's own bound (``limit_concurrency``) counts every open connection, idle ones included, and
it sets no deadline on a connection that never sends a request: 31 idle TCP connections made
every request a 503 for as long as they stayed open (issue 33). This module replaces that bound
with three rules, in a subclass of uvicorn's pure-Python HTTP/1.1 protocol (h11):

- **a deadline for the request head**: a connection must send a whole request line and headers
  within :data:`HEAD_TIMEOUT_S` of opening, or of its previous response (keep-alive); the
  deadline is not moved by bytes that trickle in, so a client sending one byte a second
  (slowloris) is closed like a silent one. A request being answered has no deadline (a trace may
  take minutes; the worker pool bounds it);
- **slots per client address** (:data:`MAX_PER_CLIENT`) and in all (:data:`MAX_CONNECTIONS`);
- **an idle connection gives its slot up**: a new connection that finds the slots full closes the
  connection that has waited longest for a request (of the same client first), and is refused
  (a 503 with the one-line message, then closed) only when every slot is answering a request.

So a client holding open sockets delays nobody, its own next request included, and a client's
requests in flight never take another client's last slot.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection may take to send its request head (after opening or after a response).
HEAD_TIMEOUT_S = 5.0
#: Connections one client address may hold open.
MAX_PER_CLIENT = 16
#: Connections open in all.
MAX_CONNECTIONS = 64


class Slots:
    """The open connections, by client address; each knows whether it is idle (no request
    being answered) and since when."""

    def __init__(self, *, max_total: int, max_per_client: int) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.open: dict[Any, str] = {}  # connection -> client address

    def admit(self, conn: Any, client: str) -> bool:
        """Take a slot for ``conn`` (closing idle connections to make room); False when every
        slot that would be freed is answering a request."""
        while sum(1 for c in self.open.values() if c == client) >= self.max_per_client:
            if not self._evict(lambda other: self.open[other] == client):
                return False
        while len(self.open) >= self.max_total:
            if not self._evict(lambda other: True):
                return False
        self.open[conn] = client
        return True

    def release(self, conn: Any) -> None:
        self.open.pop(conn, None)

    def _evict(self, among: Any) -> bool:
        idle = [c for c in self.open if among(c) and c.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        self.release(oldest)
        oldest.close_idle()
        return True


def refusal(message: str) -> bytes:
    """A whole HTTP 503 response with the API's error body, closing the connection."""
    body = json.dumps({"error": f"memfit: error: {message}", "exit_code": 2}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the module's rules; :func:`guarded_protocol` makes the class
    of one server (its :class:`Slots` and deadline)."""

    slots: Slots
    head_timeout_s: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None
        client = self.client[0] if self.client else ""
        if not self.slots.admit(self, client):
            transport.write(
                refusal("every connection slot is answering a request: try again shortly")
            )
            transport.close()
            return
        self._arm()

    @property
    def idle(self) -> bool:
        """No request is being answered (waiting for one, or for its head to arrive)."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        if self.idle and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self.close_idle)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def close_idle(self) -> None:
        """Close the connection if it is still waiting for a request (the deadline, or its slot
        taken by a newer connection)."""
        if self.idle and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.idle:  # a request head arrived: answered without a deadline
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        self._arm()  # the next request's head has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.slots.release(self)
        super().connection_lost(exc)


def guarded_protocol(
    *,
    head_timeout_s: float = HEAD_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    max_per_client: int = MAX_PER_CLIENT,
) -> type[GuardedH11Protocol]:
    """The protocol class for one server (``uvicorn.Config(http=...)``), with its own slots."""
    slots = Slots(max_total=max_connections, max_per_client=max_per_client)
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"slots": slots, "head_timeout_s": head_timeout_s},
    )

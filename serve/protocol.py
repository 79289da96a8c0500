"""uvicorn's HTTP/1.1 protocol (h11) with the deadlines uvicorn lacks: a whole request (headers and body) must
arrive within ``request_timeout_s`` of its first byte, else ``408`` and the connection is closed; a connection
that sends nothing is closed after ``keep_alive_s``, as uvicorn already does between requests.

uvicorn (0.54) arms its keep-alive timer only after a response, and has no deadline for receiving a request,
so a client that trickles headers or a body one byte a second, or connects and says nothing, holds a
connection (a file descriptor and a ``limit_concurrency`` slot) for as long as it likes ("Slowloris"; nginx's
``client_header_timeout``/``client_body_timeout`` and gunicorn's ``--timeout`` are the usual cures).

    python -c "from prodip.serve.protocol import deadline_protocol; print(deadline_protocol(30.0))"
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from prodip.serve.schemas import error_body

#: request states after which the request is wholly received (h11: the client's side of the exchange)
_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps(
        error_body(
            f"request not received within {seconds:g} s (headers and body); the connection is closed",
            code="request_timeout",
        )
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class DeadlineH11Protocol(H11Protocol):
    """:class:`H11Protocol` plus a per-request receive deadline and an idle deadline from connect.

    ``request_timeout_s`` is set on the subclass :func:`deadline_protocol` makes (uvicorn builds the
    protocol from its own ``Config``, which has no such field).
    """

    request_timeout_s: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        # idle from the start, as between requests: uvicorn arms this only after a response
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state not in _RECEIVED:  # a request's first byte
            self._deadline = self.loop.call_later(self.request_timeout_s, self._request_timed_out)
        super().data_received(data)
        if self.conn.their_state in _RECEIVED:
            self._cancel_deadline()

    def on_response_complete(self) -> None:
        self._cancel_deadline()  # answered (perhaps before the body, e.g. 401/413): the next request starts anew
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _cancel_deadline(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _request_timed_out(self) -> None:
        """Answer 408 unless a response has begun, stop the route (it sees ``http.disconnect``), close."""
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state in _RECEIVED:
            return
        # headers still coming (IDLE): no cycle of this request yet (self.cycle is the previous one's)
        cycle = self.cycle if self.conn.their_state is not h11.IDLE else None
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the route's receive() returns http.disconnect; its sends are dropped
            cycle.message_event.set()
        if cycle is None or not cycle.response_started:  # else the client already has its answer's status
            self.transport.write(_timeout_response(self.request_timeout_s))
        self.logger.info("%s: request not received within %g s: 408, closed", self.client, self.request_timeout_s)
        self.transport.close()


def deadline_protocol(request_timeout_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class to pass as ``uvicorn.run(..., http=...)``, with ``request_timeout_s`` (seconds)."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"request_timeout_s": float(request_timeout_s)})

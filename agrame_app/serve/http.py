"""The HTTP server under ``agrame serve``: uvicorn's h11 protocol with the two timeouts it lacks.

uvicorn times out only an idle keep-alive connection, and only after a response: a client that
opens a connection and sends its request head a byte a second (slowloris), or a body that never
ends, holds a connection and a file descriptor for ever. As nginx's ``client_header_timeout`` and
``client_body_timeout`` do, a request head must arrive whole within ``header_timeout`` seconds of
its first byte (or of the connection), and its body within ``body_timeout`` seconds of the head;
otherwise the client gets a 408 in the ``{"error"}`` shape and the connection is closed. A body
refused part way (413) is read and dropped for at most ``body_timeout`` more seconds, so the client
reads its 413 instead of a reset, then the connection is closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional


@dataclass(frozen=True)
class Timeouts:
    """Seconds a connection may take (``agrame serve --header-timeout/--body-timeout/--keep-alive-timeout``)."""

    #: for a request's head (request line and headers) to arrive whole
    header: float = 10.0
    #: for its body, from the end of its head
    body: float = 60.0
    #: idle between two requests on one connection (uvicorn's ``timeout_keep_alive``)
    keep_alive: int = 5


def _timeout_response(what: str, seconds: float) -> bytes:
    body = json.dumps({"error": f"request {what} not received within {seconds:g} s"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


@lru_cache(maxsize=None)
def _timed_protocol() -> type:
    """uvicorn's h11 protocol with a head and a body timeout (see the module's docstring); built on
    first use, so that the command line imports this module without the serve extra."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with a head and a body timeout (see the module's docstring)."""

        header_timeout: float = Timeouts.header
        body_timeout: float = Timeouts.body

        def connection_made(self, transport) -> None:  # type: ignore[override]
            self._timer = None
            self._timing: Optional[str] = None
            self._seen_cycle = None
            super().connection_made(transport)
            self._arm("head", self.header_timeout)

        def _arm(self, what: Optional[str], seconds: float = 0.0) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timing = None, what
            if what is not None:
                self._timer = self.loop.call_later(seconds, self._expired, what, seconds)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            if self._timing is None and self._between_requests() and self.conn.their_state is h11.IDLE:
                self._arm("head", self.header_timeout)  # the first byte of the next request
            super().data_received(data)
            self._follow()

        def _follow(self) -> None:
            """Move the timer along: a new request's head arrived → time its body; its body ended → none."""
            if self.cycle is not None and self.cycle is not self._seen_cycle:
                self._seen_cycle = self.cycle
                self._arm("body", self.body_timeout)
            if self._timing == "body" and self.conn.their_state is not h11.SEND_BODY:
                self._arm(None)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._timing is None and self.conn.their_state is h11.SEND_BODY:
                self._arm("body", self.body_timeout)  # a refused body still coming: drop it for a while, then close
            self._follow()

        def _expired(self, what: str, seconds: float) -> None:
            self._timer, self._timing = None, None
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_timeout_response(what, seconds))
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # the app's next receive() is a disconnect
                self.cycle.message_event.set()
            self.transport.close()

        def connection_lost(self, exc) -> None:
            self._arm(None)
            super().connection_lost(exc)

    return TimedH11Protocol


def protocol(timeouts: Timeouts) -> type:
    """The protocol class uvicorn is given (``http=``), with these timeouts."""
    return type("AgrameH11Protocol", (_timed_protocol(),),
                {"header_timeout": float(timeouts.header), "body_timeout": float(timeouts.body)})


def server_config(app, host: str, port: int, timeouts: Timeouts = Timeouts(), **options):
    """The uvicorn configuration ``agrame serve`` runs ``app`` with."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=protocol(timeouts),
                          timeout_keep_alive=max(1, int(timeouts.keep_alive)), **options)


__all__ = ["Timeouts", "protocol", "server_config"]

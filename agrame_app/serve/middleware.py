"""ASGI middleware: request bodies bounded and checked before anything parses them; one access-log line a request."""

from __future__ import annotations

import logging
import time

from .schemas import Limits


class BodyLimit:
    """ASGI middleware: a request body is read, as it streams in, only up to its endpoint's limit
    (:meth:`Limits.body_limit`; a ``Content-Length`` over it is refused before a byte is read), and
    must be UTF-8 JSON nested at most :data:`agrame.io.MAX_JSON_DEPTH` deep — all checked before
    anything parses it. Refusals are ``{"error"}`` with 413 or 400."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limits.body_limit(scope["method"], scope["path"])
        raw = scope.get("headers") or []
        headers = dict(raw)
        names = [k.lower() for k, _ in raw]
        if b"transfer-encoding" in names and b"content-length" in names or names.count(b"content-length") > 1:
            # RFC 9112 §6.3: a message with both framings (or two lengths) may be a smuggling attempt, and
            # a server that answers it must close the connection: refused before a byte is read (issue 62)
            return await self._refuse(scope, receive, send, 400, "request framing: both Content-Length and "
                                      "Transfer-Encoding (or two Content-Lengths); send one", close=True)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._refuse(scope, receive, send, 413, f"body of {int(declared):,} bytes: at most "
                                      f"{limit:,} for {scope['method']} {scope['path']}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._refuse(scope, receive, send, 413, f"body over {limit:,} bytes: at most {limit:,} "
                                          f"for {scope['method']} {scope['path']}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        if body:
            from agrame.io import MAX_JSON_DEPTH, json_depth

            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return await self._refuse(scope, receive, send, 400, f"body: not valid UTF-8 (at byte {exc.start})")
            if json_depth(body) > MAX_JSON_DEPTH:
                return await self._refuse(scope, receive, send, 400, f"body: JSON nested more than {MAX_JSON_DEPTH} "
                                                                     "deep")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, receive, send, status: int, message: str, close: bool = False):
        from fastapi.responses import JSONResponse

        response = JSONResponse({"error": message}, status_code=status,
                                headers={"Connection": "close"} if close else None)
        await response(scope, receive, send)


class AccessLog:
    """ASGI middleware: one line a request on the ``agrame.access`` logger at INFO — method, path, status and
    milliseconds (``GET /passages/p1 200 3.1 ms``). The query string is left out unless ``queries`` (it may hold
    what a user searched for; request bodies are never logged)."""

    def __init__(self, app, queries: bool = False):
        self.app, self.queries = app, queries
        self.log = logging.getLogger("agrame.access")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.log.isEnabledFor(logging.INFO):
            return await self.app(scope, receive, send)
        began, status = time.perf_counter(), [0]

        async def sent(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            path = scope.get("path", "")
            if self.queries and scope.get("query_string"):
                path += "?" + scope["query_string"].decode("latin-1")
            self.log.info("%s %s %s %.1f ms", scope.get("method", "-"), path, status[0] or "-",
                          (time.perf_counter() - began) * 1000)

"""ASGI middleware: request bodies bounded and checked before anything parses them."""

from __future__ import annotations

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

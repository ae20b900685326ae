"""Refusals in the documented shape, ``{"error": …}``: the service's own errors and every exception
handler of the app (validation, 404/405, busy, a shard down, a full disk, a damaged index)."""

from __future__ import annotations


class RetryLater(Exception):
    """The server or the index is busy (the admission gate, another writer holding the lock): 503 with
    Retry-After."""


class ApiError(Exception):
    """A refusal with its HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def damaged_message(exc) -> str:
    """What a client is told of an :class:`agrame.index.format.IndexDamagedError`."""
    return (f"the index is damaged: {exc.file} {exc.problem}; its reads are refused (never answered from "
            "changed files) until it is restored or rebuilt")


def add_error_handlers(app) -> None:
    """Every refusal of ``app`` as ``{"error": …}`` (FastAPI's own say ``{"detail": …}``)."""
    import logging

    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from agrame.index import UnknownIdsError
    from agrame.index.format import IndexDamagedError, NoSpaceError, ReadOnlyIndexError
    from agrame.index.sharded import ShardUnavailableError

    @app.exception_handler(ApiError)
    async def _error(_: Request, exc: ApiError):
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        kind = first.get("type", "")
        if kind == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "malformed JSON")
            message = f"body: malformed JSON: {detail} (at character {loc[0] if loc else '?'})"
            return JSONResponse({"error": message}, status_code=400)
        if not loc and kind in ("model_attributes_type", "dict_type", "missing"):
            return JSONResponse({"error": "body: expected a JSON object (send it with Content-Type: "
                                          "application/json)"}, status_code=422)
        where = ".".join(loc)
        return JSONResponse({"error": f"{where or 'body'}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(404)
    async def _not_found(_: Request, exc):
        return JSONResponse({"error": f"not found: {getattr(exc, 'detail', 'no such endpoint')}"}, status_code=404)

    @app.exception_handler(405)
    async def _method(_: Request, exc):
        return JSONResponse({"error": "method not allowed on this endpoint"}, status_code=405)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _last_resort(request: Request, exc: Exception):
        logging.getLogger("agrame.serve").exception("error serving %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the server log has the details"},
                            status_code=500)

    @app.exception_handler(RetryLater)
    async def _busy(_: Request, exc: RetryLater):
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(ShardUnavailableError)
    async def _shard_down(_: Request, exc: ShardUnavailableError):
        # Ray is restarting the shard's actor: the client may retry, or ask for allow_partial; a shard
        # lost for good gets no Retry-After (retrying cannot help) and says so.
        return JSONResponse({"error": str(exc), "missing_shards": exc.missing, "permanent": exc.permanent},
                            status_code=503, headers={} if exc.permanent else {"Retry-After": "1"})

    @app.exception_handler(NoSpaceError)
    async def _no_space(_: Request, exc: NoSpaceError):
        # the server's disk, not the client's request: 507 Insufficient Storage (RFC 4918), nothing committed
        return JSONResponse({"error": f"no space left on the server writing {exc.file} ({exc.reason}); the index "
                                      "holds its last committed generation and nothing of this write"}, status_code=507)

    @app.exception_handler(ReadOnlyIndexError)
    async def _read_only(_: Request, exc: ReadOnlyIndexError):
        # the index's state, not the request: it is served but cannot be written where it lies
        return JSONResponse({"error": "the index is on a read-only file system: it can be searched and served, "
                                      "not written"}, status_code=409)

    @app.exception_handler(IndexDamagedError)
    async def _damaged(_: Request, exc: IndexDamagedError):
        return JSONResponse({"error": damaged_message(exc), "damaged": exc.file}, status_code=503)

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError):
        return JSONResponse({"error": str(exc)}, status_code=404 if isinstance(exc, UnknownIdsError) else 400)

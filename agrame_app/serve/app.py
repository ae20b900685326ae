"""The HTTP API: ``POST /search``, ``POST /rank``, ``POST /cite``, ``GET /health``, ``GET /`` and,
over an index, ``GET /passages/{id}``, ``POST /passages`` (upsert) and ``DELETE /passages``.

Writes are refused (403) unless the server runs with ``allow_writes`` *and* an API key, which a
write must send (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``; compared in constant time;
401 without it); ``protect_reads`` asks the same of every endpoint but ``/`` and ``/health``.
A write takes the index's writer lock (:class:`agrame.index.IndexWriter`), so it is serialised
with ``agrame index``/``delete``/``compact`` run beside the server.

Requests never name files: the index folder is fixed when the server starts and opened
read-only (:mod:`.service`). Errors are JSON ``{"error": ...}`` with a 4xx status (:mod:`.errors`);
request sizes are bounded (:class:`Limits`, :mod:`.middleware`). The routes live in :mod:`.routes`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .holder import FixedHolder, IndexHolder  # noqa: F401 (the server's index holders)
from .schemas import Limits

__all__ = ["Limits", "create_app"]


def create_app(index: Union[str, Path, None] = None, model: Optional[str] = None, limits: Limits = Limits(), *,
               allow_writes: bool = False, api_key: Optional[str] = None, protect_reads: bool = False,
               ray_address: Optional[str] = None, log_queries: bool = False):
    """The FastAPI application over ``index`` (optional: ``/rank`` and ``/cite`` work without one): a
    folder (single or sharded), or an opened index object; ``ray_address`` serves a sharded folder
    through one Ray actor per shard (:class:`agrame.index.distributed.RayShardedIndex`).

    ``allow_writes`` needs ``api_key``; ``protect_reads`` requires the key on reads too. Every request is
    logged on ``agrame.access`` at INFO (method, path, status, ms; the query string only with ``log_queries``)."""
    from fastapi import FastAPI

    from agrame import __version__

    from .errors import add_error_handlers
    from .middleware import AccessLog, BodyLimit
    from .routes import health, page, passages, search
    from .service import IndexService

    service = IndexService(index, model, limits, allow_writes=allow_writes, api_key=api_key,
                           protect_reads=protect_reads, ray_address=ray_address)
    app = FastAPI(title="AGRaME", version=__version__,
                  description="Any-granularity ranking: search an index, rank given passages, cite an answer.")
    app.state.service = service
    app.add_middleware(BodyLimit, limits=limits)
    app.add_middleware(AccessLog, queries=log_queries)  # (added last: outermost, so a refusal is logged too)
    add_error_handlers(app)
    for module in (health, search, passages, page):
        app.include_router(module.router)
    return app

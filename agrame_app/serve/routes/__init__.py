"""The routes, one module per concern (FastAPI's "bigger applications" layout), each a thin layer over
the app's one :class:`agrame_app.serve.service.IndexService` (``app.state.service``)."""

from __future__ import annotations

from fastapi import Request

from ..service import IndexService


def service(request: Request) -> IndexService:
    """The app's service (a dependency: ``Depends(service)``)."""
    return request.app.state.service


def reader(request: Request) -> None:
    """Reads need the API key only with ``protect_reads``."""
    request.app.state.service.check_read(request.headers)


def writer(request: Request) -> None:
    """Writes need ``allow_writes``, the API key and an index."""
    request.app.state.service.check_write(request.headers)

"""``GET /health``."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from ..service import IndexService
from . import service

router = APIRouter()


@router.get("/health")
def health(svc: IndexService = Depends(service)):
    """``ok`` (200) only when every part of the index answers; ``degraded`` (503) names the shards
    that do not, since when and why, with counts of the others marked partial."""
    body, status, headers = svc.health()
    return body if status == 200 else JSONResponse(body, status_code=status, headers=headers)

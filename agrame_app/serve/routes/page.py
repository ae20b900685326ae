"""``GET /``: the one-page web UI."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC = Path(__file__).resolve().parent.parent / "static"

router = APIRouter()


@router.get("/")
def page():
    return FileResponse(STATIC / "index.html", media_type="text/html")

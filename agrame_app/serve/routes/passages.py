"""``GET /passages/{id}`` and the writes: ``POST /passages`` (upsert) and ``DELETE /passages``."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..schemas import DeleteRequest, UpsertRequest
from ..service import IndexService
from . import reader, service, writer

router = APIRouter()


@router.get("/passages/{passage_id}", dependencies=[Depends(reader)])
def get_passage(passage_id: str, svc: IndexService = Depends(service)):
    return svc.passage(passage_id)


@router.post("/passages", dependencies=[Depends(writer)])
def upsert(req: UpsertRequest, svc: IndexService = Depends(service)):
    return svc.upsert(req)


@router.delete("/passages", dependencies=[Depends(writer)])
def delete(req: DeleteRequest, svc: IndexService = Depends(service)):
    return svc.delete(req)

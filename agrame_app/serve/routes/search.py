"""``POST /search`` (the index), ``POST /rank`` (given passages, or the index's by id), ``POST /cite``."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..schemas import CiteRequest, RankRequest, SearchRequest
from ..service import IndexService
from . import reader, service

router = APIRouter(dependencies=[Depends(reader)])


@router.post("/search")
def search(req: SearchRequest, svc: IndexService = Depends(service)):
    return svc.search(req)


@router.post("/rank")
def rank(req: RankRequest, svc: IndexService = Depends(service)):
    return svc.rank(req)


@router.post("/cite")
def cite(req: CiteRequest, svc: IndexService = Depends(service)):
    return svc.cite(req)

"""What the API takes: the request bodies (pydantic models) and the size limits (:class:`Limits`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class Limits:
    """Largest requests served (a 413 names the limit)."""

    max_top_k: int = 100
    max_passages: int = 100
    max_passage_chars: int = 20_000
    max_query_chars: int = 1_000
    max_answer_chars: int = 5_000
    max_write_passages: int = 1_000
    #: Heavy requests (/rank of given passages, /cite, POST /passages) run at most this many at once,
    #: and with at most ``max_chars_in_flight`` characters to encode between them (one request over
    #: the budget runs alone); beyond that a 503 with Retry-After. A maximum-size /rank (100 ×
    #: 20,000 characters) takes ~2 CPU-minutes and ~1.8 GB here, so the default admits one.
    max_heavy: int = max(1, (os.cpu_count() or 2) // 2)
    max_chars_in_flight: int = 2_000_000
    max_delete_ids: int = 100_000
    #: Seconds a write waits for the index's writer lock (another writer at work) before a 503.
    write_lock_timeout: float = 30.0
    #: /search goes through the same gate, its cost in characters-to-encode equivalents: the query, each
    #: candidate scored in the compressed stage (~250: decompressing and scoring a ~1,000-character
    #: passage is about a quarter of encoding it), each inverted list probed (~100) and each hit explained
    #: (~2,000). A search costing at least ``heavy_search_cost`` also counts against ``max_heavy``.
    heavy_search_cost: int = 500_000
    #: Request bodies are read (streamed) only up to a limit per endpoint, before any parsing (413 beyond):
    #: /rank and /cite from their passage limits (6 bytes a character: JSON's \uXXXX escapes), writes
    #: ``max_write_bytes``, /search ``max_search_bytes``, anything else ``max_other_bytes``.
    max_search_bytes: int = 1 << 20
    max_write_bytes: int = 16 << 20
    max_other_bytes: int = 64 << 10

    def body_limit(self, method: str, path: str) -> int:
        """Largest request body (bytes) read for an endpoint."""
        slack = 64 << 10
        if path in ("/rank", "/cite"):
            extra = self.max_query_chars if path == "/rank" else self.max_answer_chars
            return 6 * (self.max_passages * self.max_passage_chars + extra) + slack
        if path == "/passages" and method in ("POST", "DELETE"):
            return self.max_write_bytes
        if path == "/search":
            return self.max_search_bytes
        return self.max_other_bytes


# Scalars are strict (issue 62): "5" or true is no top_k, "yes" no explain — a 422 naming the field, not a guess.


class PassageIn(BaseModel):
    id: Optional[str] = None
    text: str


class SearchRequest(BaseModel):
    query: str
    granularity: Literal["passage", "sentence", "span"] = "sentence"
    top_k: int = Field(10, ge=1, strict=True)
    explain: bool = Field(False, strict=True)
    nprobe: Optional[int] = Field(None, ge=1, le=1024, strict=True)
    ncandidates: Optional[int] = Field(None, ge=1, le=8192, strict=True)
    filter: Optional[Dict[str, Any]] = None
    #: Sharded on Ray: answer with the shards that replied (the response names the missing ones)
    #: instead of 503 when a shard's actor is down.
    allow_partial: bool = Field(False, strict=True)


class RankRequest(BaseModel):
    """Rank given ``passages``, or (``ids``) passages of the index by id, optionally ``filter``-ed."""

    query: str
    passages: Optional[List[Union[str, PassageIn]]] = None
    ids: Optional[List[str]] = None
    filter: Optional[Dict[str, Any]] = None
    granularity: Literal["passage", "sentence"] = "sentence"
    top_k: int = Field(10, ge=1, strict=True)
    explain: bool = Field(False, strict=True)


class StoredPassage(BaseModel):
    id: str
    text: str
    metadata: Optional[Dict[str, Any]] = None


class UpsertRequest(BaseModel):
    passages: List[StoredPassage]


class DeleteRequest(BaseModel):
    ids: Optional[List[str]] = None
    filter: Optional[Dict[str, Any]] = None
    missing: Literal["error", "ok"] = "error"


class CiteRequest(BaseModel):
    answer: str
    passages: List[Union[str, PassageIn]]
    margin: Optional[float] = Field(None, ge=0, strict=True)

"""Where a retriever's hits come from: an index folder opened here, or an ``agrame serve`` URL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ..ranker import GRANULARITIES, ScoredSpan
from ..runs import docid


@dataclass
class Hit:
    """One retrieved unit, framework-neutral."""

    text: str
    passage_id: str
    score: float
    granularity: str
    start: int
    end: int
    best_sentence: Optional[Tuple[int, int]]
    metadata: Dict[str, Any] = field(default_factory=dict)

    @property
    def doc_id(self) -> str:
        return docid(ScoredSpan(self.passage_id, self.start, self.end, self.score, 0.0, 0.0, self.text),
                     self.granularity)

    def to_metadata(self) -> Dict[str, Any]:
        return {"passage_id": self.passage_id, "score": self.score, "granularity": self.granularity,
                "start": self.start, "end": self.end,
                "best_sentence": None if self.best_sentence is None else list(self.best_sentence),
                "doc_id": self.doc_id, "metadata": dict(self.metadata)}


class SearchSource:
    """``search(query, granularity, top_k, filter) -> [Hit]``."""

    def search(self, query: str, granularity: str, top_k: int, filter: Optional[Mapping] = None) -> List[Hit]:
        raise NotImplementedError


def _check(query: str, granularity: str, top_k: int) -> None:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query is empty")
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")


class LocalSource(SearchSource):
    """An index folder (plain or sharded), opened once."""

    def __init__(self, path: Union[str, Path], model=None, **search_options):
        from ..index.sharded import open_index

        self.index = open_index(path, model=model)
        self.options = search_options

    def search(self, query: str, granularity: str, top_k: int, filter: Optional[Mapping] = None) -> List[Hit]:
        hits = self.index.search(query, granularity, top_k=top_k, filter=filter, **self.options)  # checks its input
        best: Dict[str, Tuple[int, int]] = {}
        if granularity == "sentence":
            for h in hits:
                best.setdefault(h.passage_id, (h.start, h.end))
        else:  # the best sentence of each hit's passage (rank_ids encodes the query again: one more forward)
            pids = list(dict.fromkeys(h.passage_id for h in hits))
            for s in self.index.rank_ids(query, pids, "sentence", top_k=None):
                best.setdefault(s.passage_id, (s.start, s.end))
        return [Hit(h.text, h.passage_id, float(h.score), granularity, int(h.start), int(h.end),
                    best.get(h.passage_id), self.index.metadata(h.passage_id) or {}) for h in hits]


def _error(where: str, status: int, message: str) -> Exception:
    """The exception a folder would have raised for the same request: a bad filter is a
    :class:`~agrame.index.FilterError` (the server's message names the ``filter``), other refused
    input a ``ValueError``, anything else (503, 5xx, auth) a ``RuntimeError``."""
    text = f"{where} answered {status}: {message}"
    if status in (400, 413, 422):
        from ..index.metadata import FilterError

        return FilterError(text) if message.startswith("filter") else ValueError(text)
    return RuntimeError(text)


class RemoteSource(SearchSource):
    """A running ``agrame serve`` (``POST /search`` with ``explain``, which carries each passage's
    best sentence). ``api_key``: for a server started with ``--protect-reads``."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.api_key, self.timeout = api_key, timeout

    def search(self, query: str, granularity: str, top_k: int, filter: Optional[Mapping] = None) -> List[Hit]:
        _check(query, granularity, top_k)
        body = {"query": query, "granularity": granularity, "top_k": top_k, "explain": True}
        if filter is not None:
            body["filter"] = dict(filter)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.url}/search", data=json.dumps(body).encode(), headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            raise _error(f"{self.url}/search", exc.code, str(message)) from None
        out = []
        for r in data["results"]:
            best = r.get("best_sentence")
            out.append(Hit(r["text"], r["passage_id"], float(r["score"]), granularity, int(r["start"]),
                           int(r["end"]), None if best is None else (int(best[0]), int(best[1])),
                           r.get("metadata") or {}))
        return out


def open_source(source: Union[str, Path, SearchSource], model=None, api_key: Optional[str] = None) -> SearchSource:
    """An index folder, an ``http(s)://`` URL of ``agrame serve``, or a source as it is."""
    if isinstance(source, SearchSource):
        return source
    text = str(source)
    if text.startswith(("http://", "https://")):
        return RemoteSource(text, api_key=api_key)
    return LocalSource(source, model=model)

"""The one service the routes call: it owns the open index (single, sharded or Ray) and its generation
changes, the model, the admission gate of heavy requests, the API key, and the writes.

Each request takes the index generation current when it starts and uses only that one, so an
``agrame index --add`` (or a rebuild renamed into place) is picked up atomically: a request sees the
old index or the new one, never half of each."""

from __future__ import annotations

import hmac
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Optional, Union

from agrame.index.format import residuals_of

from .errors import ApiError, RetryLater, damaged_message
from .holder import FixedHolder, IndexHolder
from .schemas import CiteRequest, DeleteRequest, Limits, RankRequest, SearchRequest, UpsertRequest

NO_INDEX = "this server has no index (start it with --index DIR)"


class Gate:
    """Admission of heavy requests by count and by estimated cost (characters to encode)."""

    def __init__(self, max_requests: int, max_chars: int):
        self.max_requests, self.max_chars = max_requests, max_chars
        self.requests, self.chars = 0, 0
        self._lock = threading.Lock()

    def enter(self, cost: int, counted: bool = True) -> None:
        """Admit a request of ``cost`` or raise :class:`RetryLater`; ``counted``: it also takes one of
        ``max_requests`` (a light search only spends budget)."""
        with self._lock:
            if (counted and self.requests >= self.max_requests) or (self.chars and self.chars + cost > self.max_chars):
                raise RetryLater(f"the server is busy with {self.requests} heavy request(s) "
                                 f"({self.chars:,} characters being encoded); retry shortly")
            self.requests += int(counted)
            self.chars += cost

    def leave(self, cost: int, counted: bool = True) -> None:
        with self._lock:
            self.requests -= int(counted)
            self.chars -= cost

    @contextmanager
    def admitted(self, cost: int, counted: bool = True):
        self.enter(cost, counted)
        try:
            yield
        finally:
            self.leave(cost, counted)


def check_text(value, where: str = "body") -> None:
    """Every string of a request must be encodable text (JSON allows lone surrogate escapes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"{where}: not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, where)
            check_text(v, f"{where}.{k}" if isinstance(k, str) and k.isascii() else where)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_text(v, f"{where}[{i}]")


def given_passages(items, limits: Limits):
    """A request's passages (texts or ``{"id", "text"}``) within the limits."""
    from agrame.corpus import Passage

    if not items:
        raise ApiError(400, "no passages given")
    if len(items) > limits.max_passages:
        raise ApiError(413, f"{len(items)} passages: at most {limits.max_passages} per request")
    out = []
    for i, item in enumerate(items):
        text = item if isinstance(item, str) else item.text
        out.append(Passage(str(i) if isinstance(item, str) or item.id is None else item.id, text))
        check_length(out[-1].id, text, limits)
    return out


def check_length(pid: str, text: str, limits: Limits) -> None:
    if len(text) > limits.max_passage_chars:
        raise ApiError(413, f"passage {pid!r}: {len(text)} characters, at most {limits.max_passage_chars}")


def hit_json(h, explanation=None, metadata=None) -> dict:
    out = {"passage_id": h.passage_id, "start": h.start, "end": h.end, "score": h.score,
           "span_score": h.span_score, "passage_score": h.passage_score, "text": h.text,
           "pieces": [list(p) for p in h.pieces]}
    if metadata is not None:  # a passage of the index: its metadata, as GET /passages/{id} gives it
        out["metadata"] = metadata
    if explanation is not None:
        e = explanation.to_json()
        out["passage_text"] = e["text"]
        out["tokens"] = [[t["start"], t["end"], round(t["similarity"], 4), t["matched"]]
                         for t in e["passage_tokens"] if t["end"] > t["start"]]
        pt = e["passage_tokens"]
        # [query token, index of the passage token it matched, similarity, that token's start, end] (the page pairs
        # them: issue 63)
        out["query_tokens"] = [[t["token"], t["passage_token"], round(t["similarity"], 4),
                                pt[t["passage_token"]]["start"], pt[t["passage_token"]]["end"]] for t in e["query_tokens"]]
        best = e["best_sentence"]
        out["best_sentence"] = None if best is None else [e["sentences"][best]["start"], e["sentences"][best]["end"]]
    return out


def _metadata(idx, passage_id: str) -> dict:
    """A hit's passage metadata (an index without any: {})."""
    get = getattr(idx, "metadata", None)
    return (get(passage_id) or {}) if get is not None else {}


def _explained(hits, explain_all) -> dict:
    """Explanations of the hits' distinct passages, computed together (one query encoding)."""
    ids = list(dict.fromkeys(h.passage_id for h in hits))
    return dict(zip(ids, explain_all(ids))) if ids else {}


class IndexService:
    """What the API does, apart from HTTP: see the module's doc."""

    def __init__(self, index: Union[str, Path, None] = None, model: Optional[str] = None, limits: Limits = Limits(),
                 *, allow_writes: bool = False, api_key: Optional[str] = None, protect_reads: bool = False,
                 ray_address: Optional[str] = None):
        from agrame.ranker import Ranker

        if (allow_writes or protect_reads) and not api_key:
            raise ValueError("allow_writes and protect_reads need an API key")
        self.holder: Union[IndexHolder, FixedHolder, None] = None
        if index is not None and not isinstance(index, (str, Path)):
            self.holder = FixedHolder(index)  # an opened index (e.g. RayShardedIndex)
        elif index is not None and ray_address is not None:
            from agrame.index.distributed import RayShardedIndex

            self.holder = FixedHolder(RayShardedIndex(index, model=model, address=ray_address))
        elif index is not None:
            self.holder = IndexHolder(Path(index), model)  # opened once; its model is the server's
        if self.holder is not None:
            self.encoder = self.holder.encoder
        else:
            from agrame.loading import load_encoder

            self.encoder = load_encoder(model)
        self.ranker = Ranker(self.encoder)
        self.limits, self.gate = limits, Gate(limits.max_heavy, limits.max_chars_in_flight)
        self.allow_writes, self.api_key, self.protect_reads = allow_writes, api_key, protect_reads
        self._write_lock = threading.Lock()  # one write at a time in this process (the folder lock: the rest)

    # -- access ------------------------------------------------------------------------------

    def _authorised(self, headers) -> None:
        auth = headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key")
        if given is None or not hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                                                    self.api_key.encode("utf-8")):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)")

    def check_read(self, headers) -> None:
        if self.protect_reads:
            self._authorised(headers)

    def check_write(self, headers) -> None:
        if not self.allow_writes:
            raise ApiError(403, "this server is read-only (start it with --allow-writes and an API key)")
        self._authorised(headers)
        if self.holder is None:
            raise ApiError(404, NO_INDEX)

    def check_query(self, query: str, top_k: Optional[int] = None) -> None:
        if not query.strip():
            raise ApiError(400, "query is empty")
        if len(query) > self.limits.max_query_chars:
            raise ApiError(413, f"query of {len(query)} characters, at most {self.limits.max_query_chars}")
        if top_k is not None and top_k > self.limits.max_top_k:
            raise ApiError(413, f"top_k {top_k}: at most {self.limits.max_top_k}")

    def on_current(self, answer):
        """``answer(generation)`` on one generation for the whole request. A writer that replaced the
        generation meanwhile may have removed its metadata file (SQLite reopens its -wal/-shm files by
        name, unlike the memory-mapped vectors): the request is then answered once more, whole, from
        the newer generation."""
        import sqlite3

        idx = self.holder.read()
        try:
            return answer(idx)
        except sqlite3.OperationalError:
            self.holder.current(wait=True)
            newer = self.holder.read()
            if newer is idx:
                raise
            return answer(newer)

    # -- reads --------------------------------------------------------------------------------

    def search_cost(self, idx, req: SearchRequest) -> int:
        """A search's cost for the gate (:class:`Limits`), from what it asks for."""
        from agrame.index.format import SearchSettings

        defaults = getattr(idx, "defaults", None)
        nprobe = req.nprobe or getattr(defaults, "nprobe", 8)
        candidates = req.ncandidates or getattr(defaults, "ncandidates", 128)
        if req.granularity == "passage":
            candidates = max(candidates, getattr(defaults, "per_hit", SearchSettings().per_hit) * req.top_k)
        return len(req.query) + 250 * candidates + 100 * nprobe + (2_000 * req.top_k if req.explain else 0)

    def search(self, req: SearchRequest) -> dict:
        check_text(req.model_dump())
        if self.holder is None:
            raise ApiError(404, NO_INDEX)
        self.check_query(req.query, req.top_k)
        return self.on_current(lambda idx: self._search(idx, req))

    def _search(self, idx, req: SearchRequest) -> dict:
        started = time.perf_counter()
        partial = {"allow_partial": True} if req.allow_partial and hasattr(idx, "num_shards") else {}
        cost = self.search_cost(idx, req)
        with self.gate.admitted(cost, counted=cost >= self.limits.heavy_search_cost):
            hits = idx.search(req.query, req.granularity, top_k=req.top_k, nprobe=req.nprobe,
                              ncandidates=req.ncandidates, filter=req.filter, **partial)
            explained = _explained(hits, lambda ids: idx.explain_all(req.query, ids)) if req.explain else {}
        results = [hit_json(h, explained.get(h.passage_id), _metadata(idx, h.passage_id)) for h in hits]
        out = {"query": req.query, "granularity": req.granularity, "generation": idx.manifest.get("generation", 1),
               "passages": int(idx.count(allow_partial=bool(partial))),
               "ms": round(1000 * (time.perf_counter() - started), 1), "results": results}
        if getattr(hits, "missing_shards", None):
            out.update(partial=True, missing_shards=hits.missing_shards)
        return out

    def rank(self, req: RankRequest) -> dict:
        check_text(req.model_dump())
        self.check_query(req.query, req.top_k)
        if (req.passages is None) == (req.ids is None):
            raise ApiError(400, "give either passages or ids (passages of the index)")
        if req.ids is not None:
            if self.holder is None:
                raise ApiError(404, "this server has no index: rank given passages instead of ids")
            if len(req.ids) > self.limits.max_passages:
                raise ApiError(413, f"{len(req.ids)} ids: at most {self.limits.max_passages} per request")
            return self.on_current(lambda idx: self._rank_ids(idx, req))
        if req.filter is not None:
            raise ApiError(400, "filter applies to passages of the index (ids), not to given passages")
        passages = given_passages(req.passages, self.limits)
        ranker = self.ranker
        with self.gate.admitted(sum(len(p.text) for p in passages)):
            corpus = ranker.encode(passages)
            hits = ranker.rank(req.query, corpus, req.granularity, top_k=req.top_k)
            explained = _explained(hits, lambda ids: ranker.explain_all(req.query, corpus, ids)) if req.explain else {}
        return {"query": req.query, "granularity": req.granularity,
                "results": [hit_json(h, explained.get(h.passage_id)) for h in hits]}

    def _rank_ids(self, idx, req: RankRequest) -> dict:
        hits = idx.rank_ids(req.query, req.ids, req.granularity, top_k=req.top_k, filter=req.filter)
        explained = _explained(hits, lambda ids: idx.explain_all(req.query, ids)) if req.explain else {}
        return {"query": req.query, "granularity": req.granularity, "generation": idx.manifest.get("generation", 1),
                "results": [hit_json(h, explained.get(h.passage_id), _metadata(idx, h.passage_id)) for h in hits]}

    def passage(self, passage_id: str) -> dict:
        check_text(passage_id, "id")
        if self.holder is None:
            raise ApiError(404, NO_INDEX)
        idx = self.holder.read()
        record = idx.get(passage_id)
        if record is None:
            raise ApiError(404, f"no passage {passage_id!r}")
        return {**record, "generation": idx.manifest.get("generation", 1)}

    def cite(self, req: CiteRequest) -> dict:
        check_text(req.model_dump())
        if not req.answer.strip():
            raise ApiError(400, "answer is empty")
        if len(req.answer) > self.limits.max_answer_chars:
            raise ApiError(413, f"answer of {len(req.answer)} characters, at most {self.limits.max_answer_chars}")
        passages = given_passages(req.passages, self.limits)
        from propcite.citer import Citer

        citer = Citer(self.ranker, margin=req.margin)  # cheap: shares the loaded model
        with self.gate.admitted(sum(len(p.text) for p in passages) + len(req.answer)):
            result = citer.cite(req.answer, citer.encode(passages))
        sentences = [{"start": sent.start, "end": sent.end, "text": sent.text,
                      "citations": [passages[c].id for c in sent.citations], "markers": [c + 1 for c in sent.citations],
                      "propositions": [{"text": p.text, "pieces": [list(x) for x in p.pieces],
                                        "passage_id": None if p.passage is None else passages[p.passage].id,
                                        "passage_span": list(p.passage_span), "score": round(p.score, 4)}
                                       for p in sent.propositions]} for sent in result.sentences]
        return {"text": result.text, "sentences": sentences,
                "passages": [{"id": p.id, "text": p.text} for p in passages]}

    # -- writes -------------------------------------------------------------------------------

    def _write(self, change):
        from agrame.index import IndexLockedError, IndexWriter
        from agrame.index.sharded import ShardedWriter, is_sharded

        with self._write_lock:
            try:
                kind = ShardedWriter if is_sharded(self.holder.path) else IndexWriter
                with kind(self.holder.path, lock_timeout=self.limits.write_lock_timeout) as w:
                    manifest = change(w)
            except IndexLockedError as exc:
                raise RetryLater(str(exc)) from None
        self.holder.current(wait=True)  # serve the committed generation from the next request on
        return manifest

    def upsert(self, req: UpsertRequest) -> dict:
        check_text(req.model_dump())
        if not req.passages:
            raise ApiError(400, "no passages given")
        if len(req.passages) > self.limits.max_write_passages:
            raise ApiError(413, f"{len(req.passages)} passages: at most {self.limits.max_write_passages} per request")
        from agrame.corpus import Passage

        for p in req.passages:
            check_length(p.id, p.text, self.limits)
        passages = [Passage(p.id, p.text, metadata=p.metadata) for p in req.passages]
        with self.gate.admitted(sum(len(p.text) for p in passages)):
            manifest = self._write(lambda w: w.upsert(self.encoder, passages))
        return {"upserted": len(passages), "generation": manifest["generation"],
                "passages": manifest["num_passages"] - manifest.get("num_deleted", 0)}

    def delete(self, req: DeleteRequest) -> dict:
        check_text(req.model_dump())
        if (req.ids is None) == (req.filter is None):
            raise ApiError(400, "give either ids or a filter")
        if req.ids is not None and len(req.ids) > self.limits.max_delete_ids:
            raise ApiError(413, f"{len(req.ids)} ids: at most {self.limits.max_delete_ids} per request")
        before = len(self.holder.current())
        manifest = self._write(lambda w: w.delete(req.ids, missing=req.missing) if req.ids is not None
                               else w.delete_where(req.filter))
        left = manifest["num_passages"] - manifest.get("num_deleted", 0)
        return {"deleted": before - left, "generation": manifest["generation"], "passages": left}

    # -- health -------------------------------------------------------------------------------

    def health(self) -> tuple:
        """``(body, status, headers)``: ``ok`` (200) only when every part of the index answers;
        ``degraded`` (503) names the shards that do not, since when and why, with counts of the
        others marked partial, or the damaged file."""
        from agrame import __version__
        from agrame.index.format import IndexDamagedError
        from agrame.index.sharded import ShardUnavailableError

        out: Dict[str, Any] = {"status": "ok", "version": __version__, "model": self.encoder.source,
                               "fingerprint": self.encoder.fingerprint()[:12], "limits": self.limits.__dict__}
        holder = self.holder
        if holder is None:
            return out, 200, {}
        try:
            idx = holder.current()
        except IndexDamagedError as exc:
            out.update(status="degraded", error=damaged_message(exc), index={"name": holder.path.name,
                                                                            "damaged": exc.file})
            return out, 503, {}
        try:
            idx.check_unchanged()
            damaged = None
        except IndexDamagedError as exc:
            damaged = exc
        down = idx.unavailable()
        info: Dict[str, Any] = {"name": holder.path.name}
        try:
            m = idx.manifest
            count = idx.count(allow_partial=True)
            info.update(format=m["format"], generation=m.get("generation", 1), passages=int(count),
                        partial=count.partial, deleted=m.get("num_deleted", 0), tokens=m["num_tokens"],
                        sentences=m["num_sentences"], nbits=m.get("nbits"),
                        residuals=residuals_of(m))
        except ShardUnavailableError:  # no shard answers: nothing to count
            info.update(passages=None, partial=True)
        if holder.reload_error:
            info["reload_error"] = holder.reload_error
        out["index"] = info
        problem = holder.reload_error if not getattr(holder, "mid_commit", False) else None
        if problem is None:
            from agrame.index.format import IndexFolderError, check_model

            try:  # an index of another model swapped in by rename opens, but no search can use it (issue 62)
                check_model(idx.manifest, self.encoder, holder.path)
            except (IndexFolderError, KeyError, ShardUnavailableError) as exc:
                problem = None if isinstance(exc, (KeyError, ShardUnavailableError)) else str(exc)
        if problem:
            out.update(status="degraded", error=f"the index folder holds what this server cannot serve: {problem}")
            return out, 503, {}
        if damaged is not None:
            info["damaged"] = damaged.file
            out.update(status="degraded", error=damaged_message(damaged))
            return out, 503, {}
        if not down:
            return out, 200, {}
        now = time.time()
        info["unavailable"] = [{**d, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d["since"])),
                                "down_s": round(now - d["since"], 1)} for d in down]
        error = ShardUnavailableError.from_states(down)
        out.update(status="degraded", error=str(error))
        return out, 503, {} if error.permanent else {"Retry-After": "1"}

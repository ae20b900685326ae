"""The HTTP API: ``POST /search``, ``POST /rank``, ``POST /cite``, ``GET /health``, ``GET /`` and,
over an index, ``GET /passages/{id}``, ``POST /passages`` (upsert) and ``DELETE /passages``.

Writes are refused (403) unless the server runs with ``allow_writes`` *and* an API key, which a
write must send (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``; compared in constant time;
401 without it); ``protect_reads`` asks the same of every endpoint but ``/`` and ``/health``.
A write takes the index's writer lock (:class:`agrame.index.IndexWriter`), so it is serialised
with ``agrame index``/``delete``/``compact`` run beside the server.

Requests never name files: the index folder is fixed when the server starts and opened
read-only. Each request takes the index generation current when it starts and uses only
that one, so an ``agrame index --add`` (or a rebuild renamed into place) is picked up
atomically: a request sees the old index or the new one, never half of each. Errors are
JSON ``{"error": ...}`` with a 4xx status; request sizes are bounded (:class:`Limits`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, Field

try:  # at module level: FastAPI resolves the dependencies' (string) annotations in these globals
    from fastapi import Request
except ImportError:  # pragma: no cover - create_app needs the serve extra anyway
    Request = None

STATIC = Path(__file__).resolve().parent / "static"


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


class PassageIn(BaseModel):
    id: Optional[str] = None
    text: str


class SearchRequest(BaseModel):
    query: str
    granularity: Literal["passage", "sentence", "span"] = "sentence"
    top_k: int = Field(10, ge=1)
    explain: bool = False
    nprobe: Optional[int] = Field(None, ge=1, le=1024)
    ncandidates: Optional[int] = Field(None, ge=1, le=8192)
    filter: Optional[Dict[str, Any]] = None
    #: Sharded on Ray: answer with the shards that replied (the response names the missing ones)
    #: instead of 503 when a shard's actor is down.
    allow_partial: bool = False


class RankRequest(BaseModel):
    """Rank given ``passages``, or (``ids``) passages of the index by id, optionally ``filter``-ed."""

    query: str
    passages: Optional[List[Union[str, PassageIn]]] = None
    ids: Optional[List[str]] = None
    filter: Optional[Dict[str, Any]] = None
    granularity: Literal["passage", "sentence"] = "sentence"
    top_k: int = Field(10, ge=1)
    explain: bool = False


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
    margin: Optional[float] = Field(None, ge=0)


class _Generation:
    """One opened index generation with the (stat) key that identifies it on disk."""

    def __init__(self, index, key):
        self.index, self.key = index, key


class IndexHolder:
    """The current index generation; a newer committed one replaces it between requests."""

    def __init__(self, path: Path, encoder):
        self.path, self.encoder = path, encoder
        self._lock = threading.Lock()
        self._current = self._open()
        self.reload_error: Optional[str] = None

    def _key(self):
        from agrame.index.sharded import is_sharded, read_shards

        folder = os.stat(self.path)
        if is_sharded(self.path):  # every shard's manifest: a write commits in one of them
            names = ["shards.json"] + [f"{n}/manifest.json" for n in read_shards(self.path)["shards"]]
        else:
            names = ["manifest.json"]
        stats = [os.stat(self.path / name) for name in names]
        return (folder.st_ino, *((m.st_ino, m.st_mtime_ns, m.st_size) for m in stats))

    def _open(self, verify="auto") -> _Generation:
        from agrame.index.sharded import open_index

        key = self._key()
        return _Generation(open_index(self.path, model=self.encoder, verify=verify), key)


    def current(self, wait: bool = False):
        """The newest committed generation (checked with two ``stat`` calls per request).

        One request reopens a newer generation while the others keep answering from the one they
        have (``wait``: a write's own request waits for it, so what it committed is what the next
        request reads). A reopened generation is checked as an index is at open (checksums of files up
        to ``VERIFY_LIMIT``, the metadata's digest): ~1 s a GB of store, once per generation."""
        from agrame.index.format import IndexDamagedError, IndexFolderError

        try:
            key = self._key()
        except OSError:  # mid-rename of a rebuilt folder: keep serving the open one
            return self._current.index
        except IndexFolderError as exc:  # shards.json no longer reads as the committed one
            problem = str(exc).split("shards.json", 1)[-1].lstrip(":").strip() or "cannot be read"
            raise IndexDamagedError(self.path, "shards.json", problem) from None
        if key != self._current.key and self._lock.acquire(blocking=wait):
            try:
                key = self._key()
                if key != self._current.key:
                    try:
                        self._current = self._open()
                        self.reload_error = None
                    except (ValueError, OSError) as exc:  # e.g. rebuilt with another model
                        self.reload_error = str(exc)
                        self._current = _Generation(self._current.index, key)
            finally:
                self._lock.release()
        return self._current.index

    def read(self):
        """The current generation for a read, checked to hold what was committed
        (:meth:`~agrame.index.base.BaseIndex.check_unchanged`: IndexDamagedError otherwise)."""
        from agrame.index.format import IndexDamagedError

        idx = self.current()
        try:
            idx.check_unchanged()
        except IndexDamagedError:
            # a writer that committed meanwhile removes what its generation supersedes (an old inverted
            # file, a compacted store): that is no damage, the newer generation is what to check and serve
            newer = self.current(wait=True)
            if newer is idx:
                raise
            newer.check_unchanged()
            return newer
        return idx


class FixedHolder:
    """An index object that follows its own generations (the Ray backend's actors reopen per call)."""

    reload_error: Optional[str] = None

    def __init__(self, index):
        self.index, self.path, self.encoder = index, Path(index.path), index.encoder

    def current(self, wait: bool = False):
        return self.index

    def read(self):
        self.index.check_unchanged()
        return self.index


def _passages(items, limits: Limits):
    from agrame.corpus import Passage

    if not items:
        raise _Error(400, "no passages given")
    if len(items) > limits.max_passages:
        raise _Error(413, f"{len(items)} passages: at most {limits.max_passages} per request")
    out = []
    for i, item in enumerate(items):
        text = item if isinstance(item, str) else item.text
        pid = str(i) if isinstance(item, str) or item.id is None else item.id
        if len(text) > limits.max_passage_chars:
            raise _Error(413, f"passage {pid!r}: {len(text)} characters, at most {limits.max_passage_chars}")
        out.append(Passage(pid, text))
    return out


class _Gate:
    """Admission of heavy requests by count and by estimated cost (characters to encode)."""

    def __init__(self, max_requests: int, max_chars: int):
        self.max_requests, self.max_chars = max_requests, max_chars
        self.requests, self.chars = 0, 0
        self._lock = threading.Lock()

    def enter(self, cost: int, counted: bool = True) -> None:
        """Admit a request of ``cost`` or raise :class:`_RetryLater`; ``counted``: it also takes one of
        ``max_requests`` (a light search only spends budget)."""
        with self._lock:
            if (counted and self.requests >= self.max_requests) or (self.chars and self.chars + cost > self.max_chars):
                raise _RetryLater(f"the server is busy with {self.requests} heavy request(s) "
                                  f"({self.chars:,} characters being encoded); retry shortly")
            self.requests += int(counted)
            self.chars += cost

    def leave(self, cost: int, counted: bool = True) -> None:
        with self._lock:
            self.requests -= int(counted)
            self.chars -= cost


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a request body is read, as it streams in, only up to its endpoint's limit
    (:meth:`Limits.body_limit`; a ``Content-Length`` over it is refused before a byte is read), and
    must be UTF-8 JSON nested at most :data:`agrame.io.MAX_JSON_DEPTH` deep — all checked before
    anything parses it. Refusals are ``{"error"}`` with 413 or 400."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limits.body_limit(scope["method"], scope["path"])
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._refuse(scope, receive, send, 413, f"body of {int(declared):,} bytes: at most "
                                      f"{limit:,} for {scope['method']} {scope['path']}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._refuse(scope, receive, send, 413, f"body over {limit:,} bytes: at most {limit:,} "
                                          f"for {scope['method']} {scope['path']}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        if body:
            from agrame.io import MAX_JSON_DEPTH, json_depth

            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return await self._refuse(scope, receive, send, 400, f"body: not valid UTF-8 (at byte {exc.start})")
            if json_depth(body) > MAX_JSON_DEPTH:
                return await self._refuse(scope, receive, send, 400, f"body: JSON nested more than {MAX_JSON_DEPTH} "
                                                                     "deep")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, receive, send, status: int, message: str):
        from fastapi.responses import JSONResponse

        await JSONResponse({"error": message}, status_code=status)(scope, receive, send)


def _check_text(value, where: str = "body") -> None:
    """Every string of a request must be encodable text (JSON allows lone surrogate escapes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Error(400, f"{where}: not valid Unicode (a lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k, where)
            _check_text(v, f"{where}.{k}" if isinstance(k, str) and k.isascii() else where)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_text(v, f"{where}[{i}]")


class _RetryLater(Exception):
    """The index is busy (another writer holds its lock): 503 with Retry-After."""


class _Error(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _hit(h, explanation=None, metadata=None) -> dict:
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
        out["query_tokens"] = [[t["token"], t["passage_token"], round(t["similarity"], 4)] for t in e["query_tokens"]]
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


def create_app(index: Union[str, Path, None] = None, model: Optional[str] = None, limits: Limits = Limits(), *,
               allow_writes: bool = False, api_key: Optional[str] = None, protect_reads: bool = False,
               ray_address: Optional[str] = None):
    """The FastAPI application over ``index`` (optional: ``/rank`` and ``/cite`` work without one): a
    folder (single or sharded), or an opened index object; ``ray_address`` serves a sharded folder
    through one Ray actor per shard (:class:`agrame.index.distributed.RayShardedIndex`).

    ``allow_writes`` needs ``api_key``; ``protect_reads`` requires the key on reads too."""
    import hmac

    from fastapi import Depends, FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse

    from agrame import __version__
    from agrame.loading import load_encoder
    from agrame.index.format import SearchSettings
    from agrame.ranker import Ranker

    holder = None
    if index is not None and not isinstance(index, (str, Path)):
        holder = FixedHolder(index)  # an opened index (e.g. RayShardedIndex)
        encoder = index.encoder
    elif index is not None and ray_address is not None:
        from agrame.index.distributed import RayShardedIndex

        holder = FixedHolder(RayShardedIndex(index, model=model, address=ray_address))
        encoder = holder.encoder
    elif index is not None:
        from agrame.index.sharded import open_index

        opened = open_index(index, model=model)
        holder = IndexHolder(Path(index), opened.encoder)
        encoder = opened.encoder
    else:
        encoder = load_encoder(model)
    ranker = Ranker(encoder)
    gate = _Gate(limits.max_heavy, limits.max_chars_in_flight)

    def heavy(cost: int, counted: bool = True):
        from contextlib import contextmanager

        @contextmanager
        def admitted():
            gate.enter(cost, counted)
            try:
                yield
            finally:
                gate.leave(cost, counted)
        return admitted()

    def search_cost(idx, req) -> int:
        """A search's cost for the gate (:class:`Limits`), from what it asks for."""
        defaults = getattr(idx, "defaults", None)
        nprobe = req.nprobe or getattr(defaults, "nprobe", 8)
        candidates = req.ncandidates or getattr(defaults, "ncandidates", 128)
        if req.granularity == "passage":
            candidates = max(candidates, getattr(defaults, "per_hit", SearchSettings().per_hit) * req.top_k)
        return len(req.query) + 250 * candidates + 100 * nprobe + (2_000 * req.top_k if req.explain else 0)

    if (allow_writes or protect_reads) and not api_key:
        raise ValueError("allow_writes and protect_reads need an API key")
    app = FastAPI(title="AGRaME", version=__version__,
                  description="Any-granularity ranking: search an index, rank given passages, cite an answer.")
    app.add_middleware(BodyLimit, limits=limits)
    write_lock = threading.Lock()  # one write at a time in this process (the folder lock serialises the rest)

    def _key_of(request: Request) -> Optional[str]:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key")

    def _authorised(request: Request) -> None:
        given = _key_of(request)
        if given is None or not hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                                                    api_key.encode("utf-8")):
            raise _Error(401, "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)")

    def reader(request: Request) -> None:
        if protect_reads:
            _authorised(request)

    def writer(request: Request) -> None:
        if not allow_writes:
            raise _Error(403, "this server is read-only (start it with --allow-writes and an API key)")
        _authorised(request)
        if holder is None:
            raise _Error(404, "this server has no index (start it with --index DIR)")

    @app.exception_handler(_Error)
    async def _error(_: Request, exc: _Error):
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

    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        # every refusal in the documented shape (FastAPI's own say {"detail": …})
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _last_resort(request: Request, exc: Exception):
        import logging

        logging.getLogger("agrame.serve").exception("error serving %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the server log has the details"},
                            status_code=500)

    @app.exception_handler(_RetryLater)
    async def _busy(_: Request, exc: _RetryLater):
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    from agrame.index.sharded import ShardUnavailableError

    @app.exception_handler(ShardUnavailableError)
    async def _shard_down(_: Request, exc: ShardUnavailableError):
        # Ray is restarting the shard's actor: the client may retry, or ask for allow_partial; a shard
        # lost for good gets no Retry-After (retrying cannot help) and says so.
        return JSONResponse({"error": str(exc), "missing_shards": exc.missing, "permanent": exc.permanent},
                            status_code=503, headers={} if exc.permanent else {"Retry-After": "1"})

    from agrame.index.format import NoSpaceError

    @app.exception_handler(NoSpaceError)
    async def _no_space(_: Request, exc: NoSpaceError):
        # the server's disk, not the client's request: 507 Insufficient Storage (RFC 4918), nothing committed
        return JSONResponse({"error": f"no space left on the server writing {exc.file} ({exc.reason}); the index "
                                      "holds its last committed generation and nothing of this write"}, status_code=507)

    from agrame.index.format import IndexDamagedError

    def _damaged_message(exc: IndexDamagedError) -> str:
        return (f"the index is damaged: {exc.file} {exc.problem}; its reads are refused (never answered from "
                "changed files) until it is restored or rebuilt")

    @app.exception_handler(IndexDamagedError)
    async def _damaged(_: Request, exc: IndexDamagedError):
        return JSONResponse({"error": _damaged_message(exc), "damaged": exc.file}, status_code=503)

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError):
        from agrame.index import UnknownIdsError

        return JSONResponse({"error": str(exc)}, status_code=404 if isinstance(exc, UnknownIdsError) else 400)

    def check_query(query: str, top_k: Optional[int] = None) -> None:
        if not query.strip():
            raise _Error(400, "query is empty")
        if len(query) > limits.max_query_chars:
            raise _Error(413, f"query of {len(query)} characters, at most {limits.max_query_chars}")
        if top_k is not None and top_k > limits.max_top_k:
            raise _Error(413, f"top_k {top_k}: at most {limits.max_top_k}")

    @app.get("/health")
    def health():
        """``ok`` (200) only when every part of the index answers; ``degraded`` (503) names the shards
        that do not, since when and why, with counts of the others marked partial."""
        out = {"status": "ok", "version": __version__, "model": encoder.source,
               "fingerprint": encoder.fingerprint()[:12], "limits": limits.__dict__}
        if holder is None:
            return out
        try:
            idx = holder.current()
        except IndexDamagedError as exc:
            out.update(status="degraded", error=_damaged_message(exc), index={"name": holder.path.name,
                                                                             "damaged": exc.file})
            return JSONResponse(out, status_code=503)
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
                        sentences=m["num_sentences"], nbits=m.get("nbits"))
        except ShardUnavailableError:  # no shard answers: nothing to count
            info.update(passages=None, partial=True)
        if holder.reload_error:
            info["reload_error"] = holder.reload_error
        out["index"] = info
        if damaged is not None:
            info["damaged"] = damaged.file
            out.update(status="degraded", error=_damaged_message(damaged))
            return JSONResponse(out, status_code=503)
        if not down:
            return out
        now = time.time()
        info["unavailable"] = [{**d, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d["since"])),
                                "down_s": round(now - d["since"], 1)} for d in down]
        error = ShardUnavailableError.from_states(down)
        out.update(status="degraded", error=str(error))
        return JSONResponse(out, status_code=503, headers={} if error.permanent else {"Retry-After": "1"})

    @app.post("/search", dependencies=[Depends(reader)])
    def search(req: SearchRequest):
        _check_text(req.model_dump())
        if holder is None:
            raise _Error(404, "this server has no index (start it with --index DIR)")
        check_query(req.query, req.top_k)
        return _on_current(lambda idx: _search(idx, req))

    def _on_current(answer):
        """``answer(generation)`` on one generation for the whole request. A writer that replaced the
        generation meanwhile may have removed its metadata file (SQLite reopens its -wal/-shm files by
        name, unlike the memory-mapped vectors): the request is then answered once more, whole, from
        the newer generation."""
        import sqlite3

        idx = holder.read()
        try:
            return answer(idx)
        except sqlite3.OperationalError:
            holder.current(wait=True)
            newer = holder.read()
            if newer is idx:
                raise
            return answer(newer)

    def _search(idx, req: SearchRequest) -> dict:
        started = time.perf_counter()
        partial = {"allow_partial": True} if req.allow_partial and hasattr(idx, "num_shards") else {}
        cost = search_cost(idx, req)
        with heavy(cost, counted=cost >= limits.heavy_search_cost):
            hits = idx.search(req.query, req.granularity, top_k=req.top_k, nprobe=req.nprobe,
                              ncandidates=req.ncandidates, filter=req.filter, **partial)
            explained = _explained(hits, lambda ids: idx.explain_all(req.query, ids)) if req.explain else {}
        results = [_hit(h, explained.get(h.passage_id), _metadata(idx, h.passage_id)) for h in hits]
        out = {"query": req.query, "granularity": req.granularity, "generation": idx.manifest.get("generation", 1),
               "passages": int(idx.count(allow_partial=bool(partial))), "ms": round(1000 * (time.perf_counter() - started), 1), "results": results}
        if getattr(hits, "missing_shards", None):
            out.update(partial=True, missing_shards=hits.missing_shards)
        return out

    @app.post("/rank", dependencies=[Depends(reader)])
    def rank(req: RankRequest):
        _check_text(req.model_dump())
        check_query(req.query, req.top_k)
        if (req.passages is None) == (req.ids is None):
            raise _Error(400, "give either passages or ids (passages of the index)")
        if req.ids is not None:
            if holder is None:
                raise _Error(404, "this server has no index: rank given passages instead of ids")
            if len(req.ids) > limits.max_passages:
                raise _Error(413, f"{len(req.ids)} ids: at most {limits.max_passages} per request")
            return _on_current(lambda idx: _rank_ids(idx, req))
        if req.filter is not None:
            raise _Error(400, "filter applies to passages of the index (ids), not to given passages")
        passages = _passages(req.passages, limits)
        with heavy(sum(len(p.text) for p in passages)):
            corpus = ranker.encode(passages)
            hits = ranker.rank(req.query, corpus, req.granularity, top_k=req.top_k)
            explained = _explained(hits, lambda ids: ranker.explain_all(req.query, corpus, ids)) if req.explain else {}
        results = [_hit(h, explained.get(h.passage_id)) for h in hits]
        return {"query": req.query, "granularity": req.granularity, "results": results}

    def _rank_ids(idx, req: RankRequest) -> dict:
        hits = idx.rank_ids(req.query, req.ids, req.granularity, top_k=req.top_k, filter=req.filter)
        explained = _explained(hits, lambda ids: idx.explain_all(req.query, ids)) if req.explain else {}
        return {"query": req.query, "granularity": req.granularity, "generation": idx.manifest.get("generation", 1),
                "results": [_hit(h, explained.get(h.passage_id), _metadata(idx, h.passage_id)) for h in hits]}

    @app.get("/passages/{passage_id}", dependencies=[Depends(reader)])
    def get_passage(passage_id: str):
        _check_text(passage_id, "id")
        if holder is None:
            raise _Error(404, "this server has no index (start it with --index DIR)")
        idx = holder.read()
        record = idx.get(passage_id)
        if record is None:
            raise _Error(404, f"no passage {passage_id!r}")
        return {**record, "generation": idx.manifest.get("generation", 1)}

    def _write(change):
        from agrame.index import IndexLockedError, IndexWriter
        from agrame.index.sharded import ShardedWriter, is_sharded

        with write_lock:
            try:
                kind = ShardedWriter if is_sharded(holder.path) else IndexWriter
                with kind(holder.path, lock_timeout=limits.write_lock_timeout) as w:
                    manifest = change(w)
            except IndexLockedError as exc:
                raise _RetryLater(str(exc)) from None
        holder.current(wait=True)  # serve the committed generation from the next request on
        return manifest

    @app.post("/passages", dependencies=[Depends(writer)])
    def upsert(req: UpsertRequest):
        _check_text(req.model_dump())
        if not req.passages:
            raise _Error(400, "no passages given")
        if len(req.passages) > limits.max_write_passages:
            raise _Error(413, f"{len(req.passages)} passages: at most {limits.max_write_passages} per request")
        from agrame.corpus import Passage

        for p in req.passages:
            if len(p.text) > limits.max_passage_chars:
                raise _Error(413, f"passage {p.id!r}: {len(p.text)} characters, at most {limits.max_passage_chars}")
        passages = [Passage(p.id, p.text, metadata=p.metadata) for p in req.passages]
        with heavy(sum(len(p.text) for p in passages)):
            manifest = _write(lambda w: w.upsert(encoder, passages))
        return {"upserted": len(passages), "generation": manifest["generation"],
                "passages": manifest["num_passages"] - manifest.get("num_deleted", 0)}

    @app.delete("/passages", dependencies=[Depends(writer)])
    def delete(req: DeleteRequest):
        _check_text(req.model_dump())
        if (req.ids is None) == (req.filter is None):
            raise _Error(400, "give either ids or a filter")
        if req.ids is not None and len(req.ids) > limits.max_delete_ids:
            raise _Error(413, f"{len(req.ids)} ids: at most {limits.max_delete_ids} per request")
        before = len(holder.current())
        manifest = _write(lambda w: w.delete(req.ids, missing=req.missing) if req.ids is not None
                          else w.delete_where(req.filter))
        left = manifest["num_passages"] - manifest.get("num_deleted", 0)
        return {"deleted": before - left, "generation": manifest["generation"], "passages": left}

    @app.post("/cite", dependencies=[Depends(reader)])
    def cite(req: CiteRequest):
        _check_text(req.model_dump())
        if not req.answer.strip():
            raise _Error(400, "answer is empty")
        if len(req.answer) > limits.max_answer_chars:
            raise _Error(413, f"answer of {len(req.answer)} characters, at most {limits.max_answer_chars}")
        passages = _passages(req.passages, limits)
        from propcite.citer import Citer

        citer = Citer(ranker, margin=req.margin)  # cheap: shares the loaded model
        with heavy(sum(len(p.text) for p in passages) + len(req.answer)):
            result = citer.cite(req.answer, citer.encode(passages))
        sentences = []
        for sent in result.sentences:
            sentences.append({
                "start": sent.start, "end": sent.end, "text": sent.text,
                "citations": [passages[c].id for c in sent.citations], "markers": [c + 1 for c in sent.citations],
                "propositions": [{"text": p.text, "pieces": [list(x) for x in p.pieces],
                                  "passage": None if p.passage is None else passages[p.passage].id,
                                  "passage_span": list(p.passage_span), "score": round(p.score, 4)}
                                 for p in sent.propositions]})
        return {"text": result.text, "sentences": sentences,
                "passages": [{"id": p.id, "text": p.text} for p in passages]}

    @app.get("/")
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    return app

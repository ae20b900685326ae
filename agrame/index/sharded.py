"""A sharded index: S ordinary ``agrame-index/2`` folders sharing one codec, opened and searched as one.

Layout::

    DIR/shards.json      {"format": "agrame-sharded/1", "num_shards": S, "shards": ["shard-000", …], …}
    DIR/shard-000/ …     each an index folder (its own manifest, generations, lock, metadata)
    DIR/.lock            the writer lock of the whole index (taken before any shard's own)
    DIR/journal.json     a change that spans shards, written before it is applied (redo log)

A passage lives in shard ``shard_of(id, S)`` (a stable hash, the same on every machine and process),
so an upsert or delete goes to one place. Every shard holds the same centroids and buckets — trained
once on a sample of the whole corpus — so their exact scores are comparable and the top-k of S
shards merges by score alone. Search encodes the query once and runs the shards in threads
(:class:`ShardedIndex`) or in one Ray actor each (:mod:`agrame.index.distributed`).

A change that touches several shards is first written to ``journal.json`` (fsync, rename), then
applied shard by shard (each shard commits atomically), then the journal is removed. A writer that
dies in between leaves the journal: the next writer re-applies it (upserts and deletes are
idempotent) before anything else. Readers see each shard's own committed generation.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import __version__, scoring
from ..corpus import Passage
from ..encoder import Encoder
from ..ranker import ScoredSpan, hit_order
from .base import BaseIndex
from .codec import ResidualCodec, same_codec
from .format import (CODEC_FIELDS, FORMAT_SHARDED, MAX_SHARDS, SHARDS_FILE, IndexDamagedError, IndexFolderError, is_sharded,
                     manifest_checksum, model_block, read_manifest, read_shards, write_manifest)
from .lock import WriterLock
from .metadata import parse_filter
from .store import (CompressedBlock, compress_block, default_pool_factor, default_residuals, train_codec,
                    write_blocks)
from .writer import DEFAULT_COMPACT_THRESHOLD, IndexWriter, UnknownIdsError, build_new_folder, check_passages

JOURNAL = "journal.json"


def shard_of(passage_id: str, num_shards: int) -> int:
    """The shard that holds ``passage_id``: BLAKE2b-64 of its UTF-8 bytes, modulo S (Python's own
    ``hash`` is salted per process, so it would route differently on every node)."""
    digest = hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


def shard_name(s: int) -> str:
    return f"shard-{s:03d}"


def write_shards_manifest(folder: Path, manifest: dict) -> None:
    manifest = {k: v for k, v in manifest.items() if k != "checksum"}
    manifest["checksum"] = manifest_checksum(manifest)
    _write_json(folder / SHARDS_FILE, manifest)


def _write_json(path: Path, data) -> None:
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def route(passages: Sequence[Passage], num_shards: int) -> List[List[Passage]]:
    """Passages grouped by shard, each group in the given order."""
    parts: List[List[Passage]] = [[] for _ in range(num_shards)]
    for p in passages:
        parts[shard_of(p.id, num_shards)].append(p)
    return parts


#: ``blocks(shard, passages) -> iterator of CompressedBlock`` in passage order.
BlockSource = Callable[[int, Sequence[Passage]], Iterator[CompressedBlock]]


def local_blocks(encoder: Encoder, codec: ResidualCodec, *, batch_size: int = 16, chunk_passages: int = 1024,
                 store_offsets: bool = False, bar=None, pool_factor=1) -> BlockSource:
    """Blocks encoded in this process (the same chunks and batches as an unsharded build)."""
    def blocks(shard: int, passages: Sequence[Passage]) -> Iterator[CompressedBlock]:
        for lo in range(0, len(passages), chunk_passages):
            part = list(passages[lo:lo + chunk_passages])
            encoded = encoder.encode_passages([p.text for p in part], batch_size=batch_size)
            if bar is not None:
                bar.update(len(part))
            yield compress_block(codec, part, encoded, store_offsets=store_offsets, pool_factor=pool_factor)
    return blocks


def write_sharded(folder: Path, model: dict, codec: ResidualCodec, codec_info: dict, parts: Sequence[Sequence[Passage]],
                  blocks: BlockSource, *, store_offsets: bool = False, pool_factor=1) -> None:
    """Every shard (a committed index folder) and ``shards.json`` into ``folder``."""
    names = []
    for s, part in enumerate(parts):
        sub = folder / shard_name(s)
        sub.mkdir()
        manifest = write_blocks(sub, model, codec, codec_info, part, blocks(s, part), store_offsets=store_offsets,
                                pool_factor=pool_factor)
        write_manifest(sub, manifest)
        names.append(sub.name)
    write_shards_manifest(folder, {
        "format": FORMAT_SHARDED, "agrame_version": __version__, "num_shards": len(parts), "shards": names,
        "routing": "blake2b-64(utf-8 id) mod num_shards",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model, "num_passages": sum(len(p) for p in parts)})


def commit_new(path: Path, overwrite: bool, write: Callable[[Path], None], lock_timeout: float = 0.0,
               held: bool = False) -> Path:
    """Write a new sharded index beside ``path`` and put it in place with one rename (with ``overwrite``,
    an atomic exchange with the index there, whose writer lock is held meanwhile)."""
    lock = None
    if overwrite and path.is_dir() and (is_sharded(path) or (path / "manifest.json").exists()):
        lock = WriterLock(path, lock_timeout)
        lock.acquire()
    try:
        build_new_folder(path, overwrite, lambda tmp: write(tmp), exchange=True, lock_timeout=lock_timeout, held=held)
    finally:
        if lock is not None:
            lock.release()
    return path


def build_sharded(encoder: Encoder, passages: Sequence[Passage], path: Union[str, Path], num_shards: int, *,
                  nbits=None, batch_size: int = 16, chunk_passages: int = 1024, overwrite: bool = False,
                  progress: bool = True, codec: Optional[ResidualCodec] = None, seed: int = 0,
                  store_offsets: bool = False, lock_timeout: float = 0.0, pool_factor=None) -> Path:
    """Index ``passages`` into ``num_shards`` shards with one codec, atomically (one rename);
    ``pool_factor``: :mod:`agrame.pooling`, the same in every shard."""
    pool_factor = default_pool_factor(encoder, pool_factor)
    nbits = default_residuals(encoder, nbits)
    path = Path(path)
    if not isinstance(num_shards, int) or not 1 <= num_shards <= MAX_SHARDS:
        raise ValueError(f"the number of shards must be between 1 and {MAX_SHARDS}")
    passages = check_passages(passages)
    if not passages:
        raise IndexFolderError("no passages to index")
    if codec is None:
        # The sample's encodings are not reused (an unsharded build reuses them): its chunks, and so its
        # batches, are then the same as a Ray build's — the two give identical bytes for one codec.
        codec, _, codec_info = train_codec(encoder, passages, nbits, batch_size=batch_size, seed=seed,
                                           progress=progress, pool_factor=pool_factor)
    else:
        codec_info = {"num_centroids": codec.num_centroids, "given": True}
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(passages), desc="indexing", unit="psg", disable=None)
    try:
        blocks = local_blocks(encoder, codec, batch_size=batch_size, chunk_passages=chunk_passages,
                              store_offsets=store_offsets, bar=bar, pool_factor=pool_factor)
        parts = route(passages, num_shards)
        return commit_new(path, overwrite, lambda tmp: write_sharded(tmp, model_block(encoder), codec, codec_info,
                                                                     parts, blocks, store_offsets=store_offsets,
                                                                     pool_factor=pool_factor),
                          lock_timeout)
    finally:
        if bar is not None:
            bar.close()


# -- reading ------------------------------------------------------------------------------------


class ShardUnavailableError(RuntimeError):
    """Shards did not answer: no partial answer is given unless the caller asked for one
    (``allow_partial``). ``permanent`` when a shard will not come back by itself (its Ray actor is
    dead for good: killed, or its folder failed to open on restart) — then a retry is no use and the
    message says so; otherwise Ray is restarting it and a retry may succeed."""

    def __init__(self, missing: Sequence[int], reason: str = "", permanent: bool = False):
        self.missing = list(missing)
        self.permanent = permanent
        shards = f"shard{'s' if len(self.missing) > 1 else ''} {', '.join(map(str, self.missing))}"
        if permanent:
            super().__init__(f"{shards} lost{': ' + reason if reason else ''}; a retry will not bring "
                             f"{'them' if len(self.missing) > 1 else 'it'} back: restart the server (or ask for "
                             "allow_partial)")
        else:
            super().__init__(f"{shards} did not answer{': ' + reason if reason else ''}; retry, or ask for "
                             "allow_partial")

    @classmethod
    def from_states(cls, states: Sequence[Mapping]) -> "ShardUnavailableError":
        """The error for shards in the states ``BaseIndex.unavailable`` reports (``shard``, ``reason``,
        ``permanent``): lost when any of them is lost for good."""
        reasons = sorted({st["reason"] for st in states})
        reason = reasons[0] if len(reasons) == 1 else "; ".join(f"shard {st['shard']}: {st['reason']}" for st in states)
        return cls([st["shard"] for st in states], reason, permanent=any(st["permanent"] for st in states))


class SearchResults(list):
    """Hits, best first; ``missing_shards`` names the shards left out of a partial answer."""

    def __init__(self, hits: Iterable = (), missing_shards: Sequence[int] = ()):
        super().__init__(hits)
        self.missing_shards = list(missing_shards)

    @property
    def partial(self) -> bool:
        return bool(self.missing_shards)


def merge_hits(per_shard: Sequence[Sequence[ScoredSpan]], top_k: Optional[int]) -> List[ScoredSpan]:
    """Top-k of several shards' top-k by exact score (:func:`hit_order`)."""
    merged = sorted((h for hits in per_shard for h in hits), key=hit_order)
    return merged if top_k is None else merged[:top_k]


class ShardedWrites:
    """add / upsert / delete / delete_where / compact of a sharded folder through :class:`ShardedWriter`
    (for the index classes that search it: in threads here, or on Ray actors)."""

    path: Path

    def _after_write(self) -> None:
        """What a reader does once its own write committed (reopen, or nothing where readers reopen per call)."""

    def _write(self, method: str, *args, lock_timeout: float = 0.0,
               compact_threshold=DEFAULT_COMPACT_THRESHOLD, **options) -> dict:
        with ShardedWriter(self.path, lock_timeout=lock_timeout, compact_threshold=compact_threshold,
                           model=self.encoder) as writer:
            if method in ("add", "upsert"):
                result = getattr(writer, method)(self.encoder, *args, **options)
            else:
                result = getattr(writer, method)(*args, **options)
        self._after_write()
        return result

    def add(self, passages, **options) -> dict:
        return self._write("add", passages, **options)

    def upsert(self, passages, **options) -> dict:
        return self._write("upsert", passages, **options)

    def delete(self, ids: Sequence[str], *, missing: str = "error", **options) -> dict:
        return self._write("delete", ids, missing=missing, **options)

    def delete_where(self, filter, **options) -> dict:
        return self._write("delete_where", filter, **options)

    def compact(self, *, lock_timeout: float = 0.0) -> dict:
        return self._write("compact", lock_timeout=lock_timeout, compact_threshold=None)


class ShardedIndex(ShardedWrites, BaseIndex):
    """A sharded index folder opened as one (:class:`~agrame.index.Index`'s search API).

    >>> index = ShardedIndex("my-sharded-index")
    >>> index.search("coral bleaching", granularity="sentence", top_k=5)
    """

    def __init__(self, path: Union[str, Path], model: Union[Encoder, str, Path, None] = None,
                 verify: Union[bool, str] = "auto", threads: Optional[int] = None):
        from .search import Index

        self.path = Path(path)
        self.shards_manifest = read_shards(self.path)
        self.num_shards = int(self.shards_manifest["num_shards"])
        self.shards = [Index(self.path / name, model=model, verify=verify) for name in self.shards_manifest["shards"]]
        first = self.shards[0].manifest
        for shard in self.shards[1:]:
            if shard.manifest["model"] != first["model"] or shard.manifest.get("dim") != first.get("dim"):
                raise IndexFolderError(f"sharded index {self.path} is damaged: {shard.path.name} was built with "
                                       "another model than shard-000")
        self._centroids_for: Optional[tuple] = None  # the generations _centroids was checked for
        self._centroids = None
        self._threads = threads or min(self.num_shards, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="agrame-shard") if self.num_shards > 1 else None

    def check_unchanged(self) -> None:
        for shard in self.shards:
            try:
                shard.check_unchanged()
            except IndexDamagedError as exc:
                raise IndexDamagedError(self.path, f"{shard.path.name}/{exc.file}", exc.problem) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for shard in self.shards:
            if shard.store is not None:
                shard.store.close()

    @property
    def manifest(self) -> dict:
        """A summary in the single index's terms (what front ends show)."""
        ms = [s.manifest for s in self.shards]
        first = ms[0]
        return {"format": FORMAT_SHARDED, "generation": sum(int(m.get("generation", 1)) for m in ms),
                "model": first["model"], "dim": first.get("dim"), "nbits": first.get("nbits"),
                **{k: first[k] for k in CODEC_FIELDS if k in first},
                "num_shards": self.num_shards, "has_spans": any(m.get("has_spans") for m in ms),
                "num_passages": sum(int(m["num_passages"]) for m in ms),
                "num_deleted": sum(int(m.get("num_deleted", 0)) for m in ms),
                "num_tokens": sum(int(m.get("num_tokens", 0)) for m in ms),
                "num_sentences": sum(int(m.get("num_sentences", 0)) for m in ms)}

    @property
    def encoder(self) -> Encoder:
        encoder = self.shards[0].encoder
        for shard in self.shards[1:]:
            shard._encoder = encoder  # one model in memory; every shard was checked to hold its fingerprint
        return encoder

    def reload(self) -> bool:
        changed = [shard.reload() for shard in self.shards]
        return any(changed)

    def _after_write(self) -> None:
        self.reload()

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def shard(self, passage_id: str):
        return self.shards[shard_of(passage_id, self.num_shards)]

    def get(self, passage_id: str) -> Optional[dict]:
        return self.shard(passage_id).get(passage_id)

    def metadata(self, passage_id: str) -> dict:
        return self.shard(passage_id).metadata(passage_id)

    def sentence_spans(self, passage_id: str):
        return self.shard(passage_id).sentence_spans(passage_id)

    def with_metadata(self, hits: List) -> List:
        """:meth:`BaseIndex.with_metadata`, each shard's hits read in one lookup (its :meth:`Index.with_metadata`)."""
        by_shard: Dict[int, List[int]] = {}
        for k, h in enumerate(hits):
            if getattr(h, "metadata", {}) is None:
                by_shard.setdefault(shard_of(h.passage_id, self.num_shards), []).append(k)
        for i, ks in by_shard.items():
            for k, h in zip(ks, self.shards[i].with_metadata([hits[k] for k in ks])):
                hits[k] = h
        return hits

    def ids(self) -> List[str]:
        return [pid for s in self.shards for pid in s.ids()]

    def _map(self, fn: Callable, items: Sequence) -> list:
        if self._pool is None or len(items) == 1:
            return [fn(x) for x in items]
        return list(self._pool.map(fn, items))

    def encode_query(self, query: str, granularity: str = "sentence"):
        self.encoder  # noqa: B018 - shares the model with every shard first
        return self.shards[0].encode_query(query, granularity)

    def _checked(self, query: str, granularity: str, top_k: Optional[int], filter) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        if granularity == "span" and not self.manifest["has_spans"]:
            raise ValueError(f"index {self.path} holds no spans: index passages with a JSONL 'spans' field "
                             "to search at granularity 'span'")
        self.shards[0]._check(granularity if granularity != "span" else "passage", top_k)
        if filter is not None:
            parse_filter(filter)  # a bad filter fails before the model runs

    def search(self, query: str, granularity: str = "sentence", top_k: Optional[int] = 10, *,
               filter: Optional[Mapping] = None, allow_partial: bool = False, **options) -> SearchResults:
        """:meth:`Index.search` over every shard (``exact``, ``nprobe``, ``ncandidates``, ``per_hit``,
        ``alpha`` apply to each), top-k merged by exact score. (``allow_partial`` is for the Ray
        backend's interface: shards in this process always answer.)"""
        self._checked(query, granularity, top_k, filter)
        q, s = self.encode_query(query, granularity)
        return self.search_vectors(q, s, granularity, top_k, filter=filter, **options)

    def search_vectors(self, q, s, granularity: str = "sentence", top_k: Optional[int] = 10, *,
                       filter=None, **options) -> SearchResults:
        """Staged search splits one search's cost over the shards instead of running a whole one
        in each: each shard's candidate budget is its share of the passages (``shard_budget``), and
        the query's centroid scores are computed once when the shards share their codec (as built).
        Exact mode scores every passage in every shard and merges in the total order of hits."""
        shared = {}
        if not options.get("exact") and self.num_shards > 1:
            lives = [len(shard) for shard in self.shards]
            total = max(1, sum(lives))
            centroids = self._shared_centroids()
            if centroids is not None:
                return self.with_metadata(self._staged_shared(q, s, granularity, top_k, filter,
                                                              scoring.centroid_scores(q.float(), centroids),
                                                              [live / total for live in lives], **options))
            shared = {i: {"share": live / total} for i, live in enumerate(lives)}

        def one(i):
            shard = self.shards[i]
            if granularity == "span" and not shard.manifest.get("has_spans"):
                return []
            return shard.search_vectors(q, s, granularity, top_k, filter=filter, **options, **shared.get(i, {}))
        return self.with_metadata(SearchResults(merge_hits(self._map(one, range(self.num_shards)), top_k)))

    def _staged_shared(self, q, s, granularity: str, top_k: Optional[int], filter, cs, shares: List[float], *,
                       nprobe: Optional[int] = None, ncandidates: Optional[int] = None, per_hit: Optional[int] = None,
                       alpha: Optional[float] = None, exact: bool = False) -> SearchResults:
        """Staged search over shards that share the codec, run as the single index runs it: each stage's
        scores compare across shards (the same centroids), so every cut is made over the whole — each shard
        runs stages 1–2a on its lists (the probed centroids chosen once), the whole's best
        ``PRUNE_FACTOR × ncandidates`` go on to stage 2b in their shards, the whole's best ``ncandidates``
        of those are scored exactly in one stage over one corpus gathered from the shards. The shards pick
        the single index's candidates (up to ties) at its cost, not S × a share with a margin, nor S exact
        stages' fixed costs. A filter's growing ``nprobe`` aims at the shard's share of the candidates
        (:func:`shard_budget`)."""
        from .search import prune, rank_stored, shard_budget, stored_corpus

        first = self.shards[0]
        nprobe, ncandidates = first.budgets(granularity, top_k, nprobe, ncandidates, per_hit)
        alpha = first.alpha(alpha)
        probes: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

        def probed(i):
            shard = self.shards[i]
            if granularity == "span" and not shard.manifest.get("has_spans"):
                return np.zeros(0, dtype=np.int64), torch.zeros(0)
            return shard.probed(cs, nprobe, shard_budget(ncandidates, shares[i]), shard.allowed(filter), probes)
        # The shards' stages run one after another in this thread: each is a compiled pass over one shard's
        # lists or codes (well under a millisecond on the pool corpus), which a thread task costs more than it
        # saves — 8 shards' passage top 100: 1.11× the single index's latency on the shard threads, 1.01×
        # in one (a diagnostic A/B, 100 squad-dev questions). The exact stage uses every thread (ranker's
        # chunk pool).
        kept = prune([probed(i) for i in range(self.num_shards)], ncandidates,
                     lambda i, positions: self.shards[i].code_scores(cs, positions))

        parts = [(self.shards[i].store, np.sort(pos)) for i, pos in enumerate(kept) if len(pos)]
        if not parts:
            return SearchResults()
        # One exact stage over the shards' chosen passages gathered into one corpus (they share the codec):
        # a shard's own stage 3 has a fixed cost (thread round trips, the hits' records) that S shards would
        # pay S times. Ties at the cut are kept, then cut in the total order of hits, as merge_hits would.
        hits = rank_stored(q, s, stored_corpus(parts, granularity), granularity, top_k, alpha, keep_within=0.0)
        return SearchResults(merge_hits([hits], top_k))

    def _shared_centroids(self):
        """The codec's centroids when every shard holds the same codec (checked once per set of opened
        generations), else None."""
        stores = tuple((shard.path, shard.manifest.get("generation", 1)) for shard in self.shards)
        if self._centroids_for != stores:
            first = self.shards[0]
            same = first.store is not None and all(
                shard.store is not None and same_codec(shard.store.codec, first.store.codec)
                for shard in self.shards[1:])
            if same:  # one codec object: the gathered corpus's vectors decode with it (and 25 MB, not S ×)
                for shard in self.shards[1:]:
                    shard.store.codec, shard._centroids = first.store.codec, first._centroids
            self._centroids_for, self._centroids = stores, (first._centroids if same else None)
        return self._centroids

    def _by_shard(self, passage_ids: Sequence[str]) -> Dict[int, List[str]]:
        groups: Dict[int, List[str]] = {}
        for pid in passage_ids:
            groups.setdefault(shard_of(pid, self.num_shards), []).append(pid)
        return groups

    def rank_ids(self, query: str, passage_ids: Sequence[str], granularity: str = "sentence",
                 top_k: Optional[int] = 10, *, filter=None, alpha: Optional[float] = None) -> List[ScoredSpan]:
        self._checked(query, granularity, top_k, filter)
        self.encoder  # noqa: B018
        groups = self._by_shard(passage_ids)
        per = self._map(lambda item: self.shards[item[0]].rank_ids(query, item[1], granularity, top_k,
                                                                   filter=filter, alpha=alpha), list(groups.items()))
        return merge_hits(per, top_k)

    def explain_all(self, query: str, passage_ids: Sequence[str], alpha: Optional[float] = None) -> list:
        self.encoder  # noqa: B018
        out = {}
        for s, ids in self._by_shard(passage_ids).items():
            out.update(zip(ids, self.shards[s].explain_all(query, ids, alpha=alpha)))
        return [out[pid] for pid in passage_ids]

    def explain(self, query: str, passage_id: str, alpha: Optional[float] = None):
        return self.explain_all(query, [passage_id], alpha=alpha)[0]

def _passage_record(p: Passage) -> dict:
    out = {"id": p.id, "text": p.text}
    if p.spans is not None:
        out["spans"] = json.loads(json.dumps(list(p.spans)))
    if p.metadata:
        out["metadata"] = p.metadata
    return out


def _passage(record: dict) -> Passage:
    spans = record.get("spans")
    return Passage(record["id"], record["text"], spans=None if spans is None else tuple(spans),
                   metadata=record.get("metadata"))


class ShardedWriter:
    """Exclusive write access to a sharded index: the root lock, then each changed shard's own
    :class:`~agrame.index.IndexWriter`; a journal makes a change that spans shards all-or-redone."""

    def __init__(self, path: Union[str, Path], *, lock_timeout: float = 0.0,
                 compact_threshold: Optional[float] = DEFAULT_COMPACT_THRESHOLD,
                 say: Optional[Callable[[str], None]] = None, model=None):
        self.path = Path(path)
        self.model = model  # what re-applying an unfinished upsert encodes with (default: the index's own)
        self.lock = WriterLock(self.path, lock_timeout)
        self.lock_timeout = lock_timeout
        self.compact_threshold = compact_threshold
        self.say = say or (lambda message: None)
        self.manifest: dict = {}
        self.replayed = False

    def __enter__(self) -> "ShardedWriter":
        self.manifest = read_shards(self.path)
        self.lock.acquire()
        try:
            self._replay()
        except BaseException:
            self.lock.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()

    @property
    def num_shards(self) -> int:
        return int(self.manifest["num_shards"])

    def _shard_path(self, s: int) -> Path:
        return self.path / self.manifest["shards"][s]

    def _shard_writer(self, s: int) -> IndexWriter:
        return IndexWriter(self._shard_path(s), lock_timeout=self.lock_timeout,
                           compact_threshold=self.compact_threshold, say=self.say)

    def _replay(self) -> None:
        journal = self.path / JOURNAL
        if not journal.exists():
            return
        try:
            entry = json.loads(journal.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            # Not committed: the journal is renamed into place whole, so a torn one was never begun.
            journal.unlink()
            return
        self.say(f"re-applying a change to {self.path} that a writer left unfinished ({entry['op']})")
        self._apply(entry, encoder=None)
        self._done()
        self.replayed = True

    def _journal(self, entry: dict) -> None:
        _write_json(self.path / JOURNAL, entry)

    def _done(self) -> dict:
        (self.path / JOURNAL).unlink(missing_ok=True)
        _fsync_folder(self.path)
        return self.summary()

    def summary(self) -> dict:
        ms = [read_manifest(self._shard_path(s)) for s in range(self.num_shards)]
        return {"format": FORMAT_SHARDED, "num_shards": self.num_shards,
                "generation": sum(int(m.get("generation", 1)) for m in ms),
                "num_passages": sum(int(m["num_passages"]) for m in ms),
                "num_deleted": sum(int(m.get("num_deleted", 0)) for m in ms),
                "shards": [{"name": self.manifest["shards"][s], "generation": m.get("generation", 1)}
                           for s, m in enumerate(ms)]}

    def _apply(self, entry: dict, encoder: Optional[Encoder], **options) -> None:
        op = entry["op"]
        if op in ("upsert", "delete"):
            groups: Dict[int, list] = {}
            items = entry["passages"] if op == "upsert" else entry["ids"]
            for item in items:
                groups.setdefault(shard_of(item["id"] if op == "upsert" else item, self.num_shards), []).append(item)
            for s in sorted(groups):
                with self._shard_writer(s) as w:
                    if op == "upsert":
                        if encoder is None:
                            from .format import load_index_model
                            encoder = load_index_model(read_manifest(w.path), w.path, self.model)
                        w.upsert(encoder, [_passage(r) for r in groups[s]], **options)
                    else:
                        w.delete(groups[s], missing="ok")
        elif op == "delete_where":
            for s in range(self.num_shards):
                with self._shard_writer(s) as w:
                    w.delete_where(entry["filter"])
        else:
            raise IndexFolderError(f"sharded index {self.path}: unknown journal operation {op!r}")

    def _positions(self, ids: Sequence[str]) -> set:
        from .store import Store

        found = set()
        for s, group in self._group_ids(ids).items():
            store = Store(self._shard_path(s), read_manifest(self._shard_path(s)), verify=False)
            try:
                found.update(store.position_of(group))
            finally:
                store.close()
        return found

    def _group_ids(self, ids: Iterable[str]) -> Dict[int, List[str]]:
        groups: Dict[int, List[str]] = {}
        for pid in ids:
            groups.setdefault(shard_of(pid, self.num_shards), []).append(pid)
        return groups

    def add(self, encoder: Encoder, passages, **options) -> dict:
        passages = check_passages(passages)
        present = self._positions([p.id for p in passages])
        if present:
            raise IndexFolderError(f"passage ids already in {self.path}: {sorted(present)[:5]} "
                                   "(use upsert to replace them)")
        return self.upsert(encoder, passages, **options)

    def upsert(self, encoder: Encoder, passages, **options) -> dict:
        passages = check_passages(passages)
        seen = set()
        for p in passages:
            if p.id in seen:
                raise IndexFolderError(f"passage id {p.id!r} given twice")
            seen.add(p.id)
        entry = {"op": "upsert", "passages": [_passage_record(p) for p in passages]}
        self._journal(entry)
        self._apply(entry, encoder, **{k: v for k, v in options.items() if k in ("batch_size", "progress")})
        return self._done()

    def delete(self, ids: Sequence[str], missing: str = "error") -> dict:
        ids = list(dict.fromkeys(ids))
        if missing != "ok":
            unknown = [pid for pid in ids if pid not in self._positions(ids)]
            if unknown:
                raise UnknownIdsError(self.path, unknown)
        entry = {"op": "delete", "ids": ids}
        self._journal(entry)
        self._apply(entry, None)
        return self._done()

    def delete_where(self, spec) -> dict:
        parse_filter(spec)
        entry = {"op": "delete_where", "filter": spec}
        self._journal(entry)
        self._apply(entry, None)
        return self._done()

    def compact(self) -> dict:
        for s in range(self.num_shards):
            with self._shard_writer(s) as w:
                w.compact()
        return self.summary()


def open_index(path: Union[str, Path], model: Union[Encoder, str, Path, None] = None,
               verify: Union[bool, str] = "auto", **options) -> BaseIndex:
    """An index folder opened for search whatever its kind: sharded or single."""
    if is_sharded(path):
        return ShardedIndex(path, model=model, verify=verify, **options)
    from .search import Index
    return Index(path, model=model, verify=verify)

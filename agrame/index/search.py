"""Search over a whole index in PLAID's stages (Santhanam et al. 2022), every exact score from
:mod:`agrame.scoring` through :func:`agrame.ranker.rank_corpus`.

1. **Candidates**: each query token's ``nprobe`` most similar centroids; their inverted
   lists give the candidate passages.
2. **Pruning by centroids alone**, in two steps: (a) Σ_i max over the passage's *probed*
   centroids of q_i·c (from the inverted lists, no token data read) keeps
   ``PRUNE_FACTOR × ncandidates`` passages; (b) Σ_i max over *all* its tokens' centroids
   (their codes) keeps ``ncandidates``.
3. **Exact**: the survivors are decompressed and scored like an in-memory corpus: passage
   S(q,p), every sentence S'(q,s)+α·S(q,p), or the spans stored with the passages.

Both centroid approximations are the MaxSim of :func:`agrame.scoring.segment_maxsim` over a
matrix of centroid similarities, so no second MaxSim is written here.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import scoring
from ..corpus import EncodedCorpus
from ..encoder import Encoder
from ..ranker import GRANULARITIES, Ranker, ScoredSpan, hit_order, rank_corpus
from .base import BaseIndex
from .format import FORMAT_V1, IndexFolderError, SearchSettings, load_index_model, read_manifest
from .store import Store, gather
from .writer import DEFAULT_COMPACT_THRESHOLD

#: Stage 2a keeps this many times ``ncandidates`` passages for the code-level step 2b.
PRUNE_FACTOR = 4
#: Passages per exhaustive (``exact``) scoring chunk.
EXACT_CHUNK_TOKENS = 65_536
#: Tries to open a generation while writers keep committing newer ones.
OPEN_ATTEMPTS = 5
_UNSET = object()


class Index(BaseIndex):
    """An index folder opened for search (either format; version 1 is always scanned exactly), and
    the way to change it (:meth:`add`, :meth:`upsert`, :meth:`delete`, :meth:`compact`: each takes
    the folder's writer lock, commits a generation and reopens).

    >>> index = Index.build(["Coral reefs bleach when the water warms.", {"id": "gbr", "text": "…"}], "my-index")
    >>> index = Index("my-index")                           # (an index built before: opened)
    >>> index.search("What causes coral bleaching?", granularity="sentence", top_k=5,
    ...              filter={"year": {"$gte": 2020}})
    """

    @classmethod
    def build(cls, passages, path: Union[str, Path], model: Union[Encoder, str, Path, None] = None, *,
              overwrite: bool = False, progress: bool = True, **options) -> "Index":
        """``agrame index`` from Python: encode ``passages`` (texts, ``(id, text)`` pairs, ``{"id", "text",
        "metadata"}`` dicts or :class:`~agrame.corpus.Passage`; a text without an id gets its position) with
        ``model`` (the default; a shipped name, a folder or an :class:`Encoder`) into a compressed index folder
        at ``path`` (a new one; ``overwrite`` replaces an index there as a new generation), and open it.
        ``options``: :func:`agrame.index.build_index`'s (``nbits``, ``pool_factor``, ``lock_timeout``…)."""
        from ..corpus import as_passages
        from ..loading import load_encoder
        from .writer import build_compressed

        encoder = model if isinstance(model, Encoder) else load_encoder(model)
        build_compressed(encoder, as_passages(passages), path, overwrite=overwrite, progress=progress, **options)
        return cls(path, model=encoder)

    def __init__(self, path: Union[str, Path], model: Union[Encoder, str, Path, None] = None,
                 verify: Union[bool, str] = "auto"):
        self.path = Path(path)
        self._model_arg = model
        self._verify = verify
        self._encoder: Optional[Encoder] = None
        self.store: Optional[Store] = None
        self._open(read_manifest(self.path))

    def _open(self, manifest: dict) -> None:
        # A writer may commit (and remove the files of the generation read here) between reading the
        # manifest and opening its files: then open the newer one. Once open, memory maps and the
        # metadata connection keep this generation readable however the folder changes.
        for attempt in range(OPEN_ATTEMPTS):
            try:
                self._open_once(manifest)
                return
            except (IndexFolderError, OSError):
                newer = read_manifest(self.path)
                if newer == manifest or attempt == OPEN_ATTEMPTS - 1:
                    raise
                manifest = newer

    def _open_once(self, manifest: dict) -> None:
        store: Optional[Store] = None
        v1 = None
        if manifest["format"] == FORMAT_V1:
            from .v1 import load_index
            v1 = load_index(self.path)[1]
        else:
            # A weak reference: Store → Index would be a cycle, and a server that reopens a generation per
            # write would keep every old one (its memory maps, its SQLite connection) until a full GC.
            store = Store(self.path, manifest, self._verify, tokenize=_tokenizer(self, manifest))
            self._centroids = torch.from_numpy(store.codec.centroids32)
        old, self.store, self._v1, self.manifest = self.store, store, v1, manifest
        if old is not None:
            old.close()
        self._ids: Optional[dict] = None
        self._token_lists = None  # lut.TokenLists of this generation, built by the first warp_candidates
        self.defaults = SearchSettings(**manifest.get("search", {}))

    def _passage_offsets(self, texts: List[str]) -> list:
        return self.encoder.passage_offsets(texts)

    def reload(self) -> bool:
        """Open the newest committed generation if it changed (e.g. after ``add``); True if it did."""
        manifest = read_manifest(self.path)
        if manifest.get("generation") == self.manifest.get("generation") and manifest == self.manifest:
            return False
        self._open(manifest)
        return True

    @property
    def compressed(self) -> bool:
        return self.store is not None

    def check_unchanged(self) -> None:
        if self.store is not None:
            self.store.check_unchanged()

    def __len__(self) -> int:
        """Live passages (deleted ones not counted)."""
        return self.store.num_live if self.store is not None else int(self.manifest["num_passages"])

    # -- reading passages by id ---------------------------------------------------------------

    def get(self, passage_id: str) -> Optional[dict]:
        """``{"id", "text", "metadata", "spans"?}`` of a live passage, or None."""
        if self.store is None:
            position = self._v1_ids().get(passage_id)
            return None if position is None else {"id": passage_id, "text": self._v1.texts[position], "metadata": {}}
        position = self.store.position_of([passage_id]).get(passage_id)
        if position is None:
            return None
        record = self.store.record(position)
        if record.get("id") != passage_id:  # the record is checked; the id → position lookup must agree with it
            self.store.damaged_lookup(passage_id)
        return {**record, "metadata": self.store.metadata(position)}

    def with_metadata(self, hits: List) -> List:
        """:meth:`BaseIndex.with_metadata` with every hit's metadata read in one lookup (one SQLite query for
        a top 100, :meth:`Store.metadata_by_id`, instead of a record and two queries a hit)."""
        if self.store is None:
            return super().with_metadata(hits)
        wanted = {h.passage_id for h in hits if getattr(h, "metadata", {}) is None}
        if not wanted:
            return hits
        found = self.store.metadata_by_id(sorted(wanted))
        for k, h in enumerate(hits):
            if h.metadata is None:
                hits[k] = h._replace(metadata=dict(found.get(h.passage_id, {})))
        return hits

    def sentence_spans(self, passage_id: str) -> List[Tuple[int, int]]:
        """The sentence spans the index holds for a live passage (what its sentence hits and run
        ids are made of); ValueError for an unknown id."""
        from ..spans import split_sentences

        if self.store is None:  # format 1 kept no spans of its own: it split as today
            record = self.get(passage_id)
            if record is None:
                raise ValueError(f"index {self.path} has no passage {passage_id!r}")
            return split_sentences(record["text"])
        position = self.store.position_of([passage_id]).get(passage_id)
        if position is None:
            raise ValueError(f"index {self.path} has no passage {passage_id!r}")
        lo, hi = int(self.store.sent_starts[position]), int(self.store.sent_starts[position + 1])
        return [(int(a), int(b)) for a, b in self.store.sentences[lo:hi].reshape(-1, 2)]

    def metadata(self, passage_id: str) -> dict:
        """A passage's metadata (``{}`` when it has none); ValueError for an unknown id."""
        record = self.get(passage_id)
        if record is None:
            raise ValueError(f"index {self.path} has no passage {passage_id!r}")
        return record["metadata"]

    def ids(self) -> List[str]:
        """Ids of the live passages, in stored order."""
        if self.store is None:
            return list(self._v1.ids)
        return [pid for pid, _ in sorted(self.store.live_ids().items(), key=lambda kv: kv[1])]

    def _v1_ids(self) -> dict:
        if self._ids is None:
            self._ids = {pid: k for k, pid in enumerate(self._v1.ids)}
        return self._ids

    # -- changes (writer lock, one generation each, then reopened) ----------------------------

    def _writer(self, lock_timeout: float, compact_threshold):
        from .writer import IndexWriter

        return IndexWriter(self.path, lock_timeout=lock_timeout, compact_threshold=compact_threshold)

    def add(self, passages, *, lock_timeout: float = 0.0, compact_threshold=DEFAULT_COMPACT_THRESHOLD,
            **options) -> dict:
        """Append passages with new ids (their ``metadata`` too), encoded with the index's model."""
        with self._writer(lock_timeout, compact_threshold) as writer:
            manifest = writer.add(self.encoder, passages, **options)
        self.reload()
        return manifest

    def upsert(self, passages, *, lock_timeout: float = 0.0, compact_threshold=DEFAULT_COMPACT_THRESHOLD,
               **options) -> dict:
        """Replace the text, vectors and metadata of ids the index holds and add the rest, in one generation."""
        with self._writer(lock_timeout, compact_threshold) as writer:
            manifest = writer.upsert(self.encoder, passages, **options)
        self.reload()
        return manifest

    def delete(self, ids: Sequence[str], *, missing: str = "error", lock_timeout: float = 0.0,
               compact_threshold=DEFAULT_COMPACT_THRESHOLD) -> dict:
        """Delete passages by id (an unknown id is an error unless ``missing="ok"``)."""
        with self._writer(lock_timeout, compact_threshold) as writer:
            manifest = writer.delete(list(ids), missing=missing)
        self.reload()
        return manifest

    def delete_where(self, filter, *, lock_timeout: float = 0.0,
                     compact_threshold=DEFAULT_COMPACT_THRESHOLD) -> dict:
        """Delete every passage a metadata filter admits."""
        with self._writer(lock_timeout, compact_threshold) as writer:
            manifest = writer.delete_where(filter)
        self.reload()
        return manifest

    def compact(self, *, lock_timeout: float = 0.0) -> dict:
        """Rewrite the store without deleted passages (disk space returned)."""
        with self._writer(lock_timeout, None) as writer:
            manifest = writer.compact()
        self.reload()
        return manifest

    @property
    def encoder(self) -> Encoder:
        """The index's own model (loaded on first use), or the one given, checked by fingerprint."""
        if self._encoder is None:
            self._encoder = load_index_model(self.manifest, self.path, self._model_arg)
        return self._encoder

    def search(self, query: str, granularity: str = "sentence", top_k: Optional[int] = 10, *,
               exact: bool = False, nprobe: Optional[int] = None, ncandidates: Optional[int] = None,
               per_hit: Optional[int] = None, alpha: Optional[float] = None, filter=None) -> List[ScoredSpan]:
        """Rank the index's passages, sentences or stored spans for ``query``, best first.

        ``filter``: a metadata filter (:mod:`agrame.index.metadata`), applied before candidates are
        scored: a filtered search returns ``top_k`` hits whenever ``top_k`` passages match."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        self._check(granularity, top_k)
        allowed = self.allowed(filter)  # a bad filter fails before the model runs
        q, s = self.encode_query(query, granularity)
        return self.search_vectors(q, s, granularity, top_k, exact=exact, nprobe=nprobe,
                                   ncandidates=ncandidates, per_hit=per_hit, alpha=alpha, allowed=allowed)

    def allowed(self, filter=None) -> Optional[np.ndarray]:
        """Mask of the stored positions a search may return (live and admitted by ``filter``);
        None when that is every position."""
        from .metadata import is_empty, matches, parse_filter

        if self.store is not None:
            return self.store.allowed(filter)
        if is_empty(filter):
            return None
        return np.full(len(self._v1), matches({}, parse_filter(filter)), dtype=bool)

    def rank_ids(self, query: str, passage_ids: Sequence[str], granularity: str = "sentence",
                 top_k: Optional[int] = 10, *, filter=None, alpha: Optional[float] = None) -> List[ScoredSpan]:
        """Rank indexed passages named by id (scored on their stored vectors), those ``filter`` admits."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        self._check(granularity, top_k)
        positions = np.unique(np.array([self._position(pid) for pid in passage_ids], dtype=np.int64))
        allowed = self.allowed(filter)
        if allowed is not None:
            positions = positions[allowed[positions]]
        if not len(positions):
            return []
        q, s = self.encode_query(query, granularity)
        alpha = self.encoder.settings.alpha if alpha is None else float(alpha)
        if self._v1 is not None:
            return self.with_metadata(rank_corpus(q, s, self._v1.select(positions.tolist()), granularity,
                                                  alpha=alpha, top_k=top_k))
        return self.with_metadata(self._score(q, s, positions, granularity, top_k, alpha))

    def encode_query(self, query: str, granularity: str = "sentence"):
        """``[Q]`` and sub-unit query vectors with the index's model (:meth:`Ranker.encode_query`)."""
        return Ranker(self.encoder).encode_query(query, granularity)

    def explain(self, query: str, passage_id: str, alpha: Optional[float] = None):
        """:meth:`Ranker.explain` for an indexed passage (a search hit's ``passage_id``), scored on
        the vectors the index holds (decompressed)."""
        return self.explain_all(query, [passage_id], alpha=alpha)[0]

    def explain_all(self, query: str, passage_ids: Sequence[str], alpha: Optional[float] = None) -> list:
        """:meth:`explain` for several indexed passages (e.g. all hits), the query encoded once."""
        positions = [self._position(pid) for pid in passage_ids]
        corpus = self.store.corpus(positions) if self.store is not None else self._v1.select(positions)
        return Ranker(self.encoder, alpha=alpha).explain_all(query, corpus, list(passage_ids))

    def _position(self, passage_id: str) -> int:
        found = (self.store.position_of([passage_id]) if self.store is not None else self._v1_ids()).get(passage_id)
        if found is None:
            raise ValueError(f"index {self.path} has no passage {passage_id!r}")
        return found

    def _check(self, granularity: str, top_k: Optional[int]) -> None:
        if granularity not in GRANULARITIES:
            raise ValueError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
        if top_k is not None and top_k < 1:
            raise ValueError("top_k must be at least 1")
        if granularity == "span" and not self.manifest.get("has_spans"):
            raise ValueError(f"index {self.path} holds no spans: index passages with a JSONL 'spans' field "
                             "to search at granularity 'span'")

    def search_vectors(self, q: torch.Tensor, s: Optional[torch.Tensor], granularity: str = "sentence",
                       top_k: Optional[int] = 10, **options) -> List[ScoredSpan]:
        """:meth:`search` with query vectors already encoded (:meth:`_search_vectors`), each hit with its
        passage's metadata."""
        return self.with_metadata(self._search_vectors(q, s, granularity, top_k, **options))

    def _search_vectors(self, q: torch.Tensor, s: Optional[torch.Tensor], granularity: str = "sentence",
                        top_k: Optional[int] = 10, *, exact: bool = False, nprobe: Optional[int] = None,
                        ncandidates: Optional[int] = None, per_hit: Optional[int] = None,
                        alpha: Optional[float] = None, filter=None,
                        allowed: Optional[np.ndarray] = _UNSET, share: Optional[float] = None) -> List[ScoredSpan]:
        """:meth:`search` with query vectors already encoded (``Ranker.encode_query``); ``allowed``
        (a mask from :meth:`allowed`) instead of ``filter`` when it is already computed.

        For a shard of a sharded index whose shards do not share a codec
        (:class:`~agrame.index.sharded.ShardedIndex`): ``share``, the part of the whole's live passages
        it holds, makes its candidate budget its share of the whole's (:func:`shard_budget`) instead of
        a whole search's."""
        self._check(granularity, top_k)
        if allowed is _UNSET:
            allowed = self.allowed(filter)
        alpha = self.alpha(alpha)
        if self._v1 is not None:
            corpus = self._v1 if allowed is None else self._v1.select(np.flatnonzero(allowed).tolist())
            if len(corpus) == 0:
                return []
            return rank_corpus(q, s, corpus, granularity, alpha=alpha, top_k=top_k,
                               span_table=_stored_spans(corpus) if granularity == "span" else None)
        if exact:
            return self._exhaustive(q, s, granularity, top_k, alpha, allowed)
        nprobe, ncandidates = self.budgets(granularity, top_k, nprobe, ncandidates, per_hit)
        if share is not None:
            ncandidates = shard_budget(ncandidates, share)
        survivors = np.sort(self.candidates(q, nprobe, ncandidates, allowed))
        return self._score(q, s, survivors, granularity, top_k, alpha)

    def budgets(self, granularity: str, top_k: Optional[int], nprobe: Optional[int] = None,
                ncandidates: Optional[int] = None, per_hit: Optional[int] = None) -> Tuple[int, int]:
        """The ``(nprobe, ncandidates)`` a staged search uses: the given ones or the index's defaults, and
        for passages at least ``per_hit`` candidates per hit asked for."""
        nprobe = self.defaults.nprobe if nprobe is None else int(nprobe)
        ncandidates = self.defaults.ncandidates if ncandidates is None else int(ncandidates)
        if nprobe < 1 or ncandidates < 1:
            raise ValueError("nprobe and ncandidates must be at least 1")
        per_hit = self.defaults.per_hit if per_hit is None else int(per_hit)
        if top_k is not None and granularity == "passage":
            ncandidates = max(ncandidates, per_hit * top_k, top_k)
        return nprobe, ncandidates

    def alpha(self, alpha: Optional[float] = None) -> float:
        """``alpha`` or the index's model's (without loading the model)."""
        if alpha is not None:
            return float(alpha)
        if self._encoder is not None:
            return self._encoder.settings.alpha
        return self.manifest["model"]["settings"].get("alpha", 0.5)

    def candidates(self, q: torch.Tensor, nprobe: int, ncandidates: int,
                   allowed: Optional[np.ndarray] = None) -> np.ndarray:
        """Stages 1–2: the ``ncandidates`` passages with the best centroid-approximated scores — stages
        1–2a (:meth:`probed`), the best ``PRUNE_FACTOR × ncandidates`` of those, then stage 2b (Σ_i max
        over all the passage's tokens' centroids, :meth:`code_scores`) keeps ``ncandidates``."""
        cs = scoring.centroid_scores(q.float(), self._centroids)
        return prune([self.probed(cs, nprobe, ncandidates, allowed)], ncandidates,
                     lambda _, positions: self.code_scores(cs, positions))[0]

    def probed(self, cs: torch.Tensor, nprobe: int, ncandidates: int, allowed: Optional[np.ndarray] = None,
               probes: Optional[Dict[int, Tuple[np.ndarray, np.ndarray]]] = None) -> Tuple[np.ndarray, Optional[torch.Tensor]]:
        """Stages 1–2a for centroid scores ``cs`` ([Lq, K], :func:`agrame.scoring.centroid_scores`): the
        passages of the ``nprobe`` best centroids' lists, with their scores over those centroids alone.

        ``allowed`` (a mask of positions: live and admitted by a filter) restricts the lists. An allowed
        set of at most ``PRUNE_FACTOR × ncandidates`` skips both stages: it is returned whole, with no
        scores (None: all of it goes on to stage 2b). Otherwise ``nprobe`` grows with the share it excludes
        (next-plaid's N/|subset|) and doubles until the lists give ``ncandidates`` allowed passages or
        every centroid is probed, so a filtered search never runs short of candidates that exist.
        ``probes``: the centroids probed at each ``nprobe`` for these scores and their rows of ``cs``
        (:func:`~agrame.scoring.probed_rows`), filled and read here (a sharded index's shards share it: one
        top-``nprobe`` and one gather instead of one a shard)."""
        store = self.store
        if allowed is not None:
            count = int(allowed.sum())
            if count <= PRUNE_FACTOR * ncandidates:
                return np.flatnonzero(allowed), None
            nprobe = int(min(cs.shape[1], np.ceil(nprobe * store.num_live / max(1, count))))
        while True:
            probed = None if probes is None else probes.get(nprobe)
            if probed is None:
                probe = torch.topk(cs, min(nprobe, cs.shape[1]), dim=1).indices.unique().numpy()
                probed = (probe, scoring.probed_rows(cs, probe))
                if probes is not None:
                    probes[nprobe] = probed
            unique, approx = scoring.probed_maxsim(cs, probed[0], store.ivf.offsets, store.ivf.pids, len(store),
                                                   allowed, rows=probed[1])
            if allowed is None or len(unique) >= ncandidates or nprobe >= cs.shape[1]:
                return unique, approx
            nprobe = min(cs.shape[1], 2 * nprobe)

    def warp_candidates(self, q: torch.Tensor, nprobe: int, ncandidates: int,
                        allowed: Optional[np.ndarray] = None) -> np.ndarray:
        """Candidates by lookup-table scores of the probed centroids' tokens (:mod:`.lut`, WARP's
        stage) instead of stages 1–2: the ``ncandidates`` best passages, best first. Not the default —
        ``python -m benchmarks.index_search stages`` measures both (benchmarks/README.md)."""
        from .lut import TokenLists, warp_candidates

        store = self.store
        if store is None:
            raise ValueError(f"index {self.path} is format 1: it has no compressed codes to score")
        if self._token_lists is None:
            n = len(store)
            self._token_lists = TokenLists.build(store.codes, store.starts[:n], store.doclens[:n],
                                                 store.codec.num_centroids)
        return warp_candidates(q, scoring.centroid_scores(q.float(), self._centroids), store.codec, self._token_lists,
                               store.residuals, nprobe, ncandidates, allowed)

    def code_scores(self, cs: torch.Tensor, positions: np.ndarray) -> torch.Tensor:
        """Stage 2b: each passage's Σ_i max over all its tokens' centroids (``cs``: as :meth:`probed`'s),
        which compares across indexes that share a codec (a sharded index's shards)."""
        store = self.store
        lo = store.starts[positions]
        return scoring.lookup_maxsim(cs, store.codes, lo, lo + store.doclens[positions])

    def _corpus(self, pids: np.ndarray, granularity: str):
        """Passages ``pids`` as stage 3 reads them: compressed until scored, with what ``granularity`` needs."""
        return stored_corpus([(self.store, pids)], granularity)

    def _score(self, q, s, pids: np.ndarray, granularity: str, top_k, alpha: float,
               precise: bool = False, keep_within: Optional[float] = None) -> List[ScoredSpan]:
        """Stage 3: decompress ``pids`` and score them exactly (``precise``, ``keep_within``: see
        :func:`~agrame.ranker.rank_corpus`, for :meth:`_exhaustive`)."""
        if len(pids) == 0:
            return []
        return rank_stored(q, s, self._corpus(pids, granularity), granularity, top_k, alpha, precise, keep_within)

    def _exhaustive(self, q, s, granularity: str, top_k, alpha: float,
                    allowed: Optional[np.ndarray] = None) -> List[ScoredSpan]:
        """Every allowed passage decompressed and scored, chunk by chunk; top-k merged in the total
        order of hits (:func:`~agrame.ranker.hit_order`: ties by passage id), with scores that do not
        depend on the batch (float64, :func:`agrame.scoring.similarity`), so that any sharding of the
        same passages answers exactly the same. The scan itself runs in float32 and keeps every unit
        within :func:`exact_margin` of the k-th; only their passages are scored again in float64."""
        store = self.store
        positions = np.arange(len(store)) if allowed is None else np.flatnonzero(allowed)
        ends = np.cumsum(store.doclens[positions])
        hits: List[ScoredSpan] = []
        margin = exact_margin(q, s, alpha)
        lo = 0
        while lo < len(positions):
            base = ends[lo - 1] if lo else 0
            hi = int(np.searchsorted(ends, base + EXACT_CHUNK_TOKENS, side="right"))
            hi = min(max(hi, lo + 1), len(positions))
            hits.extend(self._score(q, s, positions[lo:hi], granularity, top_k, alpha,
                                    precise=top_k is None, keep_within=margin))
            lo = hi
        if top_k is not None and hits:
            hits.sort(key=lambda h: -h.score)
            cut = hits[min(top_k, len(hits)) - 1].score - margin
            near = sorted({h.passage_id for h in hits if h.score >= cut})
            found = store.position_of(near)
            hits = self._score(q, s, np.sort(np.array([found[pid] for pid in near], dtype=np.int64)), granularity,
                               None, alpha, precise=True)
        hits.sort(key=hit_order)
        return hits[:top_k] if top_k is not None else hits


def prune(parts: Sequence[Tuple[np.ndarray, Optional[torch.Tensor]]], ncandidates: int,
          code_scores: Callable[[int, np.ndarray], torch.Tensor]) -> List[np.ndarray]:
    """Stage 2's cuts over stages 1–2a's passages of one index or of shards that share a codec (their
    scores compare): ``parts``, each ``(positions, stage-2a scores)`` (None: a small allowed set, all of
    which goes on), keep their best ``PRUNE_FACTOR × ncandidates`` over all parts; stage 2b
    (``code_scores(part, positions)``) then keeps the best ``ncandidates``. Each part's kept positions."""
    parts = [(u, torch.full((len(u),), float("inf")) if a is None else a) for u, a in parts]
    approx = torch.cat([a for _, a in parts])
    pool = max(PRUNE_FACTOR * ncandidates, int(torch.isinf(approx).sum()))
    if len(approx) > pool:
        parts = _cut(parts, _top_indices(approx, pool))
    if sum(len(u) for u, _ in parts) > ncandidates:
        parts = [(u, code_scores(i, u)) for i, (u, _) in enumerate(parts)]
        parts = _cut(parts, _top_indices(torch.cat([a for _, a in parts]), ncandidates))
    return [u for u, _ in parts]


def _cut(parts: Sequence[tuple], keep: np.ndarray) -> List[tuple]:
    """``(positions, scores)`` of each part, kept where ``keep`` (indices into all parts' rows in order)
    falls in its rows."""
    mask = np.zeros(sum(len(p) for p, _ in parts), dtype=bool)
    mask[keep] = True
    out, lo = [], 0
    for positions, scores in parts:
        here = mask[lo:lo + len(positions)]
        out.append((positions[here], scores[torch.from_numpy(here)]))
        lo += len(positions)
    return out


def stored_corpus(parts, granularity: str) -> EncodedCorpus:
    """Passages of ``(store, pids)`` parts (one index's, or shards' that share a codec) as stage 3 reads
    them: one corpus, compressed until scored, with what ``granularity`` needs."""
    return gather(parts, with_sentences=granularity != "passage", with_offsets=granularity == "span", lazy=True)


def rank_stored(q, s, corpus, granularity: str, top_k, alpha: float, precise: bool = False,
                keep_within: Optional[float] = None) -> List[ScoredSpan]:
    """Stage 3 over stored passages (:meth:`Index._corpus`, one index's or several shards' joined): their
    exact top-k, spans from the passages' own stored spans."""
    table = None
    if granularity == "span":
        table = _stored_spans(corpus)
        if not table:
            return []
    return rank_corpus(q, s, corpus, granularity, alpha=alpha, top_k=top_k, span_table=table,
                       precise=precise, keep_within=keep_within)


def _stored_spans(corpus) -> dict:
    """The span table of the passages' own stored spans (none: empty)."""
    return Ranker._span_table(corpus, None) if corpus.spans else {}


def exact_margin(q: torch.Tensor, s: Optional[torch.Tensor], alpha: float) -> float:
    """How far a float32 score can be from its float64 value, doubled for room: a float32 dot
    product of unit d-vectors is off by at most d·u (u = 2⁻²⁴; Higham's bound with Σ|xᵢyᵢ| ≤ 1), a
    score sums L query tokens' maxima (L·d·u, plus L·L·u for the sum itself), and a sentence's adds
    α·S(q,p) — 1.2e-3 for 32 query tokens, d = 384, α = 0.5."""
    u = 2.0 ** -24
    d = q.shape[-1]
    bound = lambda n: n * (d + n) * u  # noqa: E731
    lq = q.shape[0]
    ls = lq if s is None else s.shape[0]
    return 2 * (bound(ls) + abs(alpha) * bound(lq))


def shard_budget(ncandidates: int, share: float) -> int:
    """Candidates of a shard holding ``share`` of the passages when the whole's budget is
    ``ncandidates``: if the whole's best ``ncandidates`` fall on the shards like random draws, a
    shard receives Binomial(n, share) of them — its mean plus three standard deviations (and one)
    holds them with a margin, chosen by that argument, not on any measured split."""
    mean = ncandidates * min(1.0, max(0.0, share))
    return max(1, min(ncandidates, int(np.ceil(mean + 3 * np.sqrt(mean * (1 - min(1.0, share))))) + 1))


def _tokenizer(index: "Index", manifest: dict):
    """The index's model's ``passage_offsets``, holding the index only weakly (a store kept after its
    index is gone loads the model itself)."""
    ref, path, model_arg, cache = weakref.ref(index), index.path, index._model_arg, {}

    def tokenize(texts):
        owner = ref()
        if owner is not None:
            return owner.encoder.passage_offsets(texts)
        if "encoder" not in cache:
            cache["encoder"] = load_index_model(manifest, path, model_arg)
        return cache["encoder"].passage_offsets(texts)
    return tokenize


def _top_indices(scores: torch.Tensor, k: int) -> np.ndarray:
    return torch.topk(scores, k).indices.numpy()

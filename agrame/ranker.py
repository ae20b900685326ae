"""Public ranking API: passages, sentences or arbitrary spans from one passage encoding."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Dict, Iterable, List, Literal, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import scoring
from .corpus import EncodedCorpus, PassageLike, as_passages
from .encoder import Encoder
from .loading import load_encoder
from .spans import SpanLike, normalize_span, span_token_mask

Granularity = Literal["passage", "sentence", "span"]
GRANULARITIES: Tuple[str, ...] = ("passage", "sentence", "span")

#: Tokens per scoring chunk: bounds the [Lq, T] similarity matrix (32 × 65,536 × 4 B = 8 MB).
CHUNK_TOKENS = 65_536


class ScoredSpan(NamedTuple):
    """One ranked unit. ``score`` = ``span_score`` + α·``passage_score`` for sub-units."""

    passage_id: str
    start: int
    end: int
    score: float
    span_score: float
    passage_score: float
    text: str
    pieces: Tuple[Tuple[int, int], ...] = ()
    #: the passage's metadata (``{}`` when it has none): every interface's hits carry it (issue 63)
    metadata: Optional[Mapping[str, object]] = None


class Ranker:
    """Rank passages, sentences or spans for a query with one multi-vector encoding.

    >>> ranker = Ranker()                                   # default model
    >>> ranker.rank("What causes coral bleaching?", texts, granularity="sentence")
    """

    def __init__(self, model: Union[Encoder, str, Path, None] = None, *, alpha: Optional[float] = None,
                 batch_size: int = 16, device: str = "cpu"):
        self.encoder = model if isinstance(model, Encoder) else load_encoder(model, device=device)
        self.alpha = self.encoder.settings.alpha if alpha is None else float(alpha)
        self.batch_size = batch_size

    def encode(self, passages: Iterable[PassageLike], progress: bool = False) -> EncodedCorpus:
        """Encode passages once; the result can be ranked at any granularity many times."""
        items = as_passages(passages)
        encoded = self.encoder.encode_passages([p.text for p in items], batch_size=self.batch_size,
                                               progress=progress)
        return EncodedCorpus.build(items, encoded)

    def rank(
        self,
        query: str,
        passages: Union[EncodedCorpus, Iterable[PassageLike]],
        granularity: Granularity = "sentence",
        *,
        spans: Union[Mapping[str, Sequence[SpanLike]], Sequence[Sequence[SpanLike]], None] = None,
        top_k: Optional[int] = 10,
        alpha: Optional[float] = None,
    ) -> List[ScoredSpan]:
        """Rank the units of ``passages`` for ``query``, best first.

        ``granularity="sentence"`` ranks every sentence of every passage together by
        S'(q,s) + α·S(q,p); ``"span"`` does the same for ``spans`` (per passage id, or a
        list aligned with the passages, or the passages' own ``spans``); ``"passage"``
        ranks passages by S(q,p). ``top_k=None`` returns everything.
        """
        if granularity not in GRANULARITIES:
            raise ValueError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        if top_k is not None and top_k < 1:
            raise ValueError("top_k must be at least 1")
        corpus = passages if isinstance(passages, EncodedCorpus) else self.encode(passages)
        alpha = self.alpha if alpha is None else float(alpha)
        span_table = self._span_table(corpus, spans) if granularity == "span" else None
        q_vecs, s_vecs = self.encode_query(query, granularity)
        hits = rank_corpus(q_vecs, s_vecs, corpus, granularity, alpha=alpha, top_k=top_k, span_table=span_table)
        return [h._replace(metadata=dict(corpus.metadata.get(h.passage_id) or {})) for h in hits]

    def explain(self, query: str, passage: Union[PassageLike, EncodedCorpus], *, passage_id: Optional[str] = None,
                alpha: Optional[float] = None):
        """Why ``passage`` scores what it does for ``query``: each query token's matched passage
        token and similarity, each passage token's best similarity, every sentence's S'(q,s),
        S(q,p) and combined score (:class:`agrame.explain.Explanation`).

        ``passage``: text, ``(id, text)``, a :class:`Passage`, or an encoded corpus with
        ``passage_id`` naming the passage (default: its first).
        """
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")  # before encoding the passage
        corpus = passage if isinstance(passage, EncodedCorpus) else self.encode([passage])
        return self.explain_all(query, corpus, [corpus.ids[0] if passage_id is None else passage_id], alpha=alpha)[0]

    def explain_all(self, query: str, corpus: EncodedCorpus, passage_ids: Sequence[str], *,
                    alpha: Optional[float] = None) -> list:
        """:meth:`explain` for several passages of an encoded corpus, the query encoded once."""
        from .explain import explain_passage

        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        position = {pid: p for p, pid in enumerate(corpus.ids)}
        missing = [pid for pid in passage_ids if pid not in position]
        if missing:
            raise ValueError(f"no passage {missing[0]!r} to explain")
        q, s = self.encode_query(query, "sentence")
        tokens = self.encoder.query_tokens(query, "Q")
        alpha = self.alpha if alpha is None else float(alpha)
        return [explain_passage(query, tokens, q, s, corpus, position[pid], alpha) for pid in passage_ids]

    def encode_query(self, query: str, granularity: str = "sentence") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Query vectors for S(q,p) and for S'(q,s) (None for passages; the same tensor when shared)."""
        if granularity == "passage":
            return self.encoder.encode_query(query, "Q").vectors, None
        marker = self.encoder.settings.span_query_marker
        if self.encoder.same_query_encoding(marker, "Q"):  # one encoding, one similarity matrix
            q = self.encoder.encode_query(query, "Q").vectors
            return q, q
        both = self.encoder.encode_queries([query], ("Q", marker))  # one forward batch
        return both[0][0].vectors, both[1][0].vectors

    def encode_query_batch(self, queries: Sequence[str], granularity: str = "sentence",
                           batch_size: int = 32) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """:meth:`encode_query` for many queries, ``batch_size`` per forward pass (equal to encoding
        each alone up to float rounding: padded positions are masked out of attention)."""
        out: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = []
        marker = self.encoder.settings.span_query_marker
        shared = granularity == "passage" or self.encoder.same_query_encoding(marker, "Q")
        for b in range(0, len(queries), batch_size):
            chunk = list(queries[b:b + batch_size])
            for text in chunk:
                if not isinstance(text, str) or not text.strip():
                    raise ValueError("query is empty")
            if shared:
                encoded = self.encoder.encode_queries(chunk, ("Q",))[0]
                out += [(e.vectors, None if granularity == "passage" else e.vectors) for e in encoded]
            else:
                first, second = self.encoder.encode_queries(chunk, ("Q", marker))
                out += [(a.vectors, c.vectors) for a, c in zip(first, second)]
        return out

    @staticmethod
    def _span_table(corpus: EncodedCorpus, spans) -> Dict[int, List[Tuple[Tuple[int, int], ...]]]:
        if spans is None:
            spans = corpus.spans
        if isinstance(spans, Mapping):
            unknown = set(spans) - set(corpus.ids)
            if unknown:
                raise ValueError(f"spans given for unknown passage ids {sorted(unknown)[:5]}")
            position = {pid: p for p, pid in enumerate(corpus.ids)}
            by_index = {position[pid]: list(s) for pid, s in spans.items()}
        else:
            spans = list(spans)
            if len(spans) != len(corpus):
                raise ValueError(f"spans: {len(spans)} lists for {len(corpus)} passages")
            by_index = {p: list(s) for p, s in enumerate(spans) if s}
        table = {}
        for p, items in by_index.items():
            text_length = len(corpus.texts[p])
            try:
                table[p] = [normalize_span(s, text_length) for s in items]
            except ValueError as exc:
                raise ValueError(f"passage {corpus.ids[p]!r}: {exc}") from None
        if not any(table.values()):
            raise ValueError("granularity 'span' needs spans for at least one passage")
        return table


class CorpusScores(NamedTuple):
    """Every score of one exhaustive pass: passages, sentences (``sentence`` granularity) and
    ``(passage, pieces, S')`` triples (``span`` granularity)."""

    passage: torch.Tensor  # [N] S(q,p)
    sentence: Optional[torch.Tensor]  # [S] S'(q,s), or None
    spans: List[Tuple[int, Tuple[Tuple[int, int], ...], float]]


def score_corpus(
    q_vecs: torch.Tensor,
    s_vecs: Optional[torch.Tensor],
    corpus: EncodedCorpus,
    granularity: str,
    *,
    span_table: Optional[Dict[int, List[Tuple[Tuple[int, int], ...]]]] = None,
    chunk_tokens: int = CHUNK_TOKENS,
    precise: bool = False,
) -> CorpusScores:
    """Exact scores of a (possibly memory-mapped) corpus, token chunk by token chunk.

    ``q_vecs`` is the ``[Q]`` query, ``s_vecs`` the sub-unit query (``[Q']`` or the same
    tensor object as ``q_vecs``, in which case one similarity matrix serves both). ``precise``:
    scores independent of how the corpus is batched (:func:`agrame.scoring.similarity`).
    """
    n_passages, n_sentences = len(corpus), int(corpus.sentences.shape[0])
    passage_scores = torch.full((n_passages,), scoring.NEG_INF)
    sentence_scores = torch.full((n_sentences,), scoring.NEG_INF) if granularity == "sentence" else None
    shared = s_vecs is q_vecs
    # Vectors that decompress as they are read (agrame.index.codec.CompressedVectors) ask for smaller chunks.
    chunk_tokens = min(chunk_tokens, getattr(corpus.vectors, "chunk_tokens", chunk_tokens))
    compressed_runs = _compressed_chunk_tokens(q_vecs, corpus, granularity, precise)
    chunk_tokens = compressed_runs or chunk_tokens

    def score_chunk(bounds: Tuple[int, int]) -> list:
        # Each chunk writes its own passages' and sentences' slices only, so chunks may run concurrently.
        p_lo, p_hi = bounds
        found: List[Tuple[int, Tuple[Tuple[int, int], ...], float]] = []
        t_lo, t_hi = int(corpus.passage_starts[p_lo]), int(corpus.passage_starts[p_hi])
        if compressed_runs:  # passages scored on their codes, never decompressed into an array
            starts = (corpus.passage_starts[p_lo:p_hi + 1] - t_lo).numpy()
            passage_scores[p_lo:p_hi] = scoring._query_sum(corpus.vectors.run_max(q_vecs, t_lo, t_hi, starts).T, None)
            return found
        vecs = _float32(corpus.vectors[t_lo:t_hi])
        if shared or granularity == "passage":
            sim = scoring.similarity(q_vecs, vecs, precise)
        else:  # both queries in one product: the token vectors are read from memory once
            both = scoring.similarity(torch.cat([q_vecs, s_vecs]), vecs, precise)
            sim, s_both = both[:q_vecs.shape[0]], both[q_vecs.shape[0]:]
        local_passage = corpus.token_passage[t_lo:t_hi] - p_lo
        if granularity == "sentence" and shared:
            tok_sent = corpus.token_sentence[t_lo:t_hi]
            inside = tok_sent[tok_sent >= 0]
            if inside.numel():  # one query for both: a passage's maxima from its sentences' (one scatter less)
                s_lo, s_hi = int(inside.min()), int(inside.max()) + 1
                local = torch.where(tok_sent >= 0, tok_sent - s_lo, tok_sent)
                sentence_scores[s_lo:s_hi], passage_scores[p_lo:p_hi] = scoring.nested_segment_maxsim(
                    sim, local, s_hi - s_lo, corpus.sentence_passage[s_lo:s_hi] - p_lo, local_passage, p_hi - p_lo)
                return found
        passage_scores[p_lo:p_hi] = scoring.segment_maxsim(sim, local_passage, p_hi - p_lo)
        if granularity == "passage":
            return found
        s_sim = sim if shared else s_both
        if granularity == "sentence":
            tok_sent = corpus.token_sentence[t_lo:t_hi]
            inside = tok_sent[tok_sent >= 0]
            if inside.numel():
                s_lo, s_hi = int(inside.min()), int(inside.max()) + 1
                local = torch.where(tok_sent >= 0, tok_sent - s_lo, tok_sent)
                sentence_scores[s_lo:s_hi] = scoring.segment_maxsim(s_sim, local, s_hi - s_lo)
            return found
        return _span_hits(corpus, span_table, s_sim, p_lo, p_hi, t_lo)

    chunks = list(_chunks(corpus.passage_starts, chunk_tokens))
    # Lazily decompressed vectors spend most of a chunk in numpy's gathers, which release the GIL: with
    # torch's threads (2 here) two chunks decompress at once (16 → 12 ms for 300 passages, a diagnostic
    # run). In order, so that span results keep the corpus order.
    workers = min(torch.get_num_threads(), len(chunks)) if hasattr(corpus.vectors, "chunk_tokens") else 1
    if workers > 1 and q_vecs.device.type == "cpu":
        per_chunk = list(_chunk_pool(workers).map(score_chunk, chunks))
    else:
        per_chunk = [score_chunk(bounds) for bounds in chunks]
    span_results = [hit for found in per_chunk for hit in found]
    return CorpusScores(passage_scores, sentence_scores, span_results)


def _compressed_chunk_tokens(q_vecs: torch.Tensor, corpus: EncodedCorpus, granularity: str,
                             precise: bool) -> Optional[int]:
    """Tokens a chunk when passage scores come from compressed vectors in one compiled pass
    (:func:`agrame.scoring.compressed_run_max`), else None (precise float64 scores, sentences and spans
    decompress). Its loop keeps a passage in the cache: one chunk per thread, no pool round trips to pay."""
    if not (granularity == "passage" and not precise and hasattr(corpus.vectors, "run_max")
            and q_vecs.device.type == "cpu" and scoring.compiled_runs()):
        return None
    return max(1, -(-int(corpus.passage_starts[-1]) // max(1, torch.get_num_threads())))


def _span_hits(corpus: EncodedCorpus, span_table, s_sim: torch.Tensor, p_lo: int, p_hi: int, t_lo: int) -> list:
    """``(passage, span, score)`` of the stored spans of passages ``p_lo:p_hi`` (their tokens' similarities
    ``s_sim``, whose first column is token ``t_lo``)."""
    found = []
    for p in range(p_lo, p_hi):
        if p not in span_table:
            continue
        sl = corpus.passage_tokens(p)
        mask = corpus.span_mask(p, span_table[p])
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"passage {corpus.ids[p]!r}: span {span_table[p][empty[0]]} covers "
                             "no scorable token (only punctuation or whitespace)")
        scores = scoring.span_maxsim(s_sim[:, sl.start - t_lo:sl.stop - t_lo], mask)
        found.extend((p, span, float(s)) for span, s in zip(span_table[p], scores))
    return found


def rank_corpus(
    q_vecs: torch.Tensor,
    s_vecs: Optional[torch.Tensor],
    corpus: EncodedCorpus,
    granularity: str,
    *,
    alpha: float,
    top_k: Optional[int],
    span_table: Optional[Dict[int, List[Tuple[Tuple[int, int], ...]]]] = None,
    chunk_tokens: int = CHUNK_TOKENS,
    precise: bool = False,
    keep_within: Optional[float] = None,
) -> List[ScoredSpan]:
    """Exact scoring of a corpus (:func:`score_corpus`), then the top-k units as ``ScoredSpan``s.

    ``keep_within``: also every unit scoring within this of the k-th (0: its ties), so that a caller
    merging several corpora can re-score or order the units near the cut its own way and still cut
    exactly."""
    passage_scores, sentence_scores, span_results = score_corpus(
        q_vecs, s_vecs, corpus, granularity, span_table=span_table, chunk_tokens=chunk_tokens, precise=precise)
    if granularity == "passage":
        hits = []
        for p in _top(passage_scores, top_k, keep_within):
            text, score = corpus.texts[p], float(passage_scores[p])  # a lazy corpus reads a record per access
            hits.append(ScoredSpan(corpus.ids[p], 0, len(text), score, score, score, text, ((0, len(text)),)))
        return hits
    if granularity == "sentence":
        owners = corpus.sentence_passage
        combined = scoring.combined_score(sentence_scores, passage_scores[owners], alpha)
        out = []
        for s in _top(combined, top_k, keep_within):
            p = int(owners[s])
            start, end = (int(x) for x in corpus.sentences[s])
            out.append(ScoredSpan(corpus.ids[p], start, end, float(combined[s]), float(sentence_scores[s]),
                                  float(passage_scores[p]), corpus.texts[p][start:end], ((start, end),)))
        return out
    span_scores = torch.tensor([s for _, _, s in span_results])
    owners = torch.tensor([p for p, _, _ in span_results], dtype=torch.long)
    combined = scoring.combined_score(span_scores, passage_scores[owners], alpha)
    out = []
    for i in _top(combined, top_k, keep_within):
        p, pieces, _ = span_results[i]
        text = corpus.texts[p]
        out.append(ScoredSpan(corpus.ids[p], pieces[0][0], pieces[-1][1], float(combined[i]),
                              float(span_scores[i]), float(passage_scores[p]),
                              " … ".join(text[s:e] for s, e in pieces), pieces))
    return out


def _float32(block) -> torch.Tensor:
    # Index vectors are float16 on disk; half-precision matmul is slow on CPUs.
    if isinstance(block, np.ndarray):
        return torch.from_numpy(np.asarray(block, dtype=np.float32))
    return block.to(torch.float32)


_POOLS: Dict[Tuple[int, int], "ThreadPoolExecutor"] = {}
_POOLS_LOCK = threading.Lock()


def _chunk_pool(workers: int) -> "ThreadPoolExecutor":
    """One pool of ``workers`` threads per process (keyed by pid: a forked child, e.g. a Ray or
    multiprocessing worker, inherits the parent's pool without its threads, and would wait forever)."""
    from concurrent.futures import ThreadPoolExecutor

    key = (os.getpid(), workers)
    with _POOLS_LOCK:
        if key not in _POOLS:
            # torch's thread count is per thread: the pool's workers run their ops on one thread each, the
            # pool being the parallelism. Each worker's OpenMP team of torch.get_num_threads() threads would
            # wake and sleep (OMP_WAIT_POLICY=PASSIVE) around every small op of every chunk, and two teams
            # oversubscribe the cores: a top 100 took 28 → 24–26 ms (nq-oracle, alternating diagnostic runs).
            _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="agrame-score",
                                             initializer=torch.set_num_threads, initargs=(1,))
        return _POOLS[key]


def _chunks(passage_starts: torch.Tensor, chunk_tokens: int) -> Iterable[Tuple[int, int]]:
    """Consecutive passage ranges of about ``chunk_tokens`` tokens (a passage is never split)."""
    n = passage_starts.shape[0] - 1
    lo = 0
    while lo < n:
        limit = int(passage_starts[lo]) + chunk_tokens
        hi = int(torch.searchsorted(passage_starts, limit, right=True)) - 1
        hi = min(max(hi, lo + 1), n)
        yield lo, hi
        lo = hi


def hit_order(hit: ScoredSpan) -> tuple:
    """The total order of search hits: score, best first; equal scores by passage id, then
    position — an order that does not depend on where a passage is stored, so that S shards'
    exact top-k merge into exactly the single index's."""
    return (-hit.score, hit.passage_id, hit.start, hit.end)


def _top(scores: torch.Tensor, k: Optional[int], keep_within: Optional[float] = None) -> List[int]:
    # Stable descending sort: ties keep corpus order, so results are deterministic.
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.isfinite(scores[order])]
    if k is None or k >= len(order):
        return order.tolist()
    if keep_within is not None:
        k = int((scores[order] >= scores[order[k - 1]] - keep_within).sum())
    return order[:k].tolist()

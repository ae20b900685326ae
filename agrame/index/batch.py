"""Batch search: many queries encoded a batch at a time, each searched like ``index.search``.

Works over every backend with an ``encoder`` and ``search_vectors`` (:class:`~agrame.index.Index`,
:class:`~agrame.index.sharded.ShardedIndex`, :class:`~agrame.index.distributed.RayShardedIndex`).
A 2,000-question evaluation is one model load and ~63 forward passes instead of 2,000 processes.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

from ..ranker import GRANULARITIES, Ranker, ScoredSpan


def search_batch(index, queries: Sequence[Tuple[str, str]], granularity: str = "sentence",
                 top_k: Optional[int] = 10, *, batch_size: int = 32, progress: bool = False,
                 **options) -> Iterator[Tuple[str, List[ScoredSpan]]]:
    """Yield ``(qid, hits)`` for each ``(qid, text)`` in order; ``options`` as :meth:`Index.search`
    takes them (``filter``, ``exact``, ``nprobe``, ``ncandidates``, ``alpha`` …)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be at least 1")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    for qid, text in queries:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"query {qid!r} is empty")
    if options.get("filter") is not None:
        from .metadata import parse_filter

        parse_filter(options["filter"])  # a bad filter fails before the model runs
    ranker = Ranker(index.encoder)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(queries), desc="searching", unit="q", disable=None)
    try:
        for b in range(0, len(queries), batch_size):
            chunk = queries[b:b + batch_size]
            vectors = ranker.encode_query_batch([t for _, t in chunk], granularity, batch_size)
            for (qid, _), (q, s) in zip(chunk, vectors):
                yield qid, index.search_vectors(q, s, granularity, top_k, **options)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()

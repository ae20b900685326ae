"""Hard negatives from a user's corpus for ``agrame train``: the start model's exact MaxSim ranking of every
passage beside BM25's (the research recipe's 4 mined + 3 BM25 of 7, ``training/mined.py``)."""

from __future__ import annotations

import heapq
from typing import Callable, List, Optional, Sequence

import torch

from agrame import scoring
from agrame.lexical import LexicalIndex, simple_tokenize

from .pairs import Corpus, Pair


def lexical_rankings(queries: Sequence[str], corpus: Corpus, depth: int) -> List[List[int]]:
    """BM25's top ``depth`` corpus positions for each query (documents holding a query term only)."""
    index = LexicalIndex([simple_tokenize(t) for t in corpus.texts])
    return [index.top(simple_tokenize(q), depth) for q in queries]


@torch.inference_mode()
def model_rankings(encoder, queries: Sequence[str], corpus: Corpus, depth: int, passages_per_chunk: int = 256,
                   queries_per_batch: int = 64, progress: Optional[Callable[[int], None]] = None) -> List[List[int]]:
    """The start model's top ``depth`` corpus positions for each query by exact MaxSim S(q,p): the corpus is
    encoded once, a chunk at a time, and every query scored against each chunk."""
    from agrame.ranker import Ranker

    ranker = Ranker(encoder)
    encoded = [q for q, _ in ranker.encode_query_batch(list(queries), "passage")]
    best: List[list] = [[] for _ in queries]  # a min-heap of (score, -position) per query
    for start in range(0, len(corpus), passages_per_chunk):
        texts = corpus.texts[start:start + passages_per_chunk]
        chunk = ranker.encode([(str(start + k), t) for k, t in enumerate(texts)])
        docs = chunk.vectors.float()
        for b in range(0, len(encoded), queries_per_batch):
            group = encoded[b:b + queries_per_batch]
            stacked = torch.cat(group)
            owner = torch.repeat_interleave(torch.arange(len(group)), torch.tensor([len(q) for q in group]))
            per_token = scoring.segment_max(scoring.similarity(stacked, docs), chunk.token_passage, len(texts))
            scores = torch.zeros(len(group), len(texts)).index_add_(0, owner, per_token.float())
            for k, row in enumerate(scores.tolist()):
                heap = best[b + k]
                for p, value in enumerate(row):
                    item = (value, -(start + p))
                    if len(heap) < depth:
                        heapq.heappush(heap, item)
                    elif item > heap[0]:
                        heapq.heapreplace(heap, item)
        if progress is not None:
            progress(len(texts))
    return [[-p for _, p in sorted(heap, reverse=True)] for heap in best]


def choose_negatives(pair: Pair, corpus: Corpus, by_model: Sequence[int], by_bm25: Sequence[int], count: int,
                     mined: int) -> List[str]:
    """The pair's own negatives first, then ``mined`` of the model's ranking, then BM25's, then the model's
    again, until ``count``: never the positive, nor a passage twice (texts compared)."""
    chosen: List[str] = []
    seen = {pair.positive}

    def take(texts, limit):
        for text in texts:
            if len(chosen) >= limit:
                return
            if text not in seen:
                seen.add(text)
                chosen.append(text)

    take(pair.negatives, count)
    take((corpus.texts[i] for i in by_model), min(count, len(chosen) + mined))
    take((corpus.texts[i] for i in by_bm25), count)
    take((corpus.texts[i] for i in by_model), count)
    return chosen

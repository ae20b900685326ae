"""Hard negatives from a user's corpus for ``agrame train``: the start model's exact MaxSim ranking of every
passage beside BM25's (the research recipe's 4 mined + 3 BM25 of 7, ``training/mined.py``)."""

from __future__ import annotations

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
    encoded once, a chunk at a time, every query scored against each chunk, and each query's best kept."""
    from agrame.ranker import Ranker

    ranker = Ranker(encoder)
    encoded = [q for q, _ in ranker.encode_query_batch(list(queries), "passage")]
    # each query's best so far: scores and corpus positions, ``[Q, ≤ depth]``
    best_scores = torch.empty(len(queries), 0)
    best_positions = torch.empty(len(queries), 0, dtype=torch.long)
    for start in range(0, len(corpus), passages_per_chunk):
        texts = corpus.texts[start:start + passages_per_chunk]
        chunk = ranker.encode([(str(start + k), t) for k, t in enumerate(texts)])
        docs = chunk.vectors.float()
        rows = []
        for b in range(0, len(encoded), queries_per_batch):
            group = encoded[b:b + queries_per_batch]
            stacked = torch.cat(group)
            owner = torch.repeat_interleave(torch.arange(len(group)), torch.tensor([len(q) for q in group]))
            per_token = scoring.segment_max(scoring.similarity(stacked, docs), chunk.token_passage, len(texts))
            rows.append(torch.zeros(len(group), len(texts)).index_add_(0, owner, per_token.float()))
        scores = torch.cat([best_scores, torch.cat(rows)], dim=1)
        positions = torch.cat([best_positions, torch.arange(start, start + len(texts)).expand(len(queries), -1)],
                              dim=1)
        # the kept columns (earlier chunks, already tie-broken) precede this chunk's, in position order: a stable
        # sort breaks every tie by the lower position
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :depth]
        best_scores, best_positions = scores.gather(1, order), positions.gather(1, order)
        if progress is not None:
            progress(len(texts))
    return best_positions.tolist()


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

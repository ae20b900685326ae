"""BM25 first stage (bm25s: Lucene idf, k1 1.5, b 0.75, English stopwords, Snowball stemmer).

Passages are retrieved with bm25s; sentences (or any text) are scored by the same formula
with the *pool's* statistics (document frequencies, average length) through
:func:`bm25_scores`, which is tested against bm25s's own passage scores.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from agrame.lexical import B, K1, bm25_scores  # noqa: F401 (one BM25 formula, re-exported)


def _stemmer():
    import Stemmer
    return Stemmer.Stemmer("english")


def tokenize(texts: Sequence[str]) -> List[List[str]]:
    import bm25s
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False)


class PoolBM25:
    """bm25s index of the pool plus the statistics needed to score other texts alike."""

    def __init__(self, texts: Sequence[str], cache_dir: Path | None = None):
        import bm25s

        key = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
        cached = cache_dir / f"bm25-{key}.pkl" if cache_dir else None
        if cached is not None and cached.exists():
            with open(cached, "rb") as f:
                self.retriever, self.df, self.n_docs, self.avgdl = pickle.load(f)
            return
        tokens = tokenize(texts)
        self.retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.retriever.index(tokens, show_progress=False)
        self.df: Dict[str, int] = Counter(t for doc in tokens for t in set(doc))
        self.n_docs = len(tokens)
        self.avgdl = sum(len(d) for d in tokens) / max(1, len(tokens))
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                pickle.dump((self.retriever, self.df, self.n_docs, self.avgdl), f)
            tmp.replace(cached)

    def retrieve(self, queries: Sequence[str], k: int = 100) -> Tuple[np.ndarray, np.ndarray]:
        """Top-k pool indices and scores per query (``[n, k]`` each)."""
        q_tokens = tokenize(queries)
        # A query of only stopwords has no tokens; give it one impossible token.
        q_tokens = [t if t else ["\x00"] for t in q_tokens]
        docs, scores = self.retriever.retrieve(q_tokens, k=k, show_progress=False, n_threads=0)
        return np.asarray(docs), np.asarray(scores)

    def scores_all(self, query: str) -> np.ndarray:
        """BM25 of every indexed text for ``query`` (bm25s's sparse scorer)."""
        tokens = tokenize([query])[0]
        if not tokens:
            return np.zeros(self.n_docs, dtype=np.float32)
        vocab = self.retriever.vocab_dict
        ids = [vocab[t] for t in tokens if t in vocab]
        return np.asarray(self.retriever.get_scores(ids)) if ids else np.zeros(self.n_docs, dtype=np.float32)

    def score_texts(self, query: str, texts: Sequence[str]) -> List[float]:
        """BM25 of each text for ``query`` with the pool's idf and average length."""
        return bm25_scores(tokenize([query])[0], tokenize(texts), self.df, self.n_docs, self.avgdl)

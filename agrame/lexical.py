"""Lexical scoring: the one BM25 formula of the package, and a dependency-free tokenizer.

The benchmarks tokenize with bm25s (stopwords + Snowball stemmer) and score with
:func:`bm25_scores`, tested against bm25s itself; PropCite's optional lexical prior uses
:func:`simple_tokenize` (NLTK's Porter stemmer, a core dependency) with the same formula.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from typing import Dict, List, Sequence

K1, B = 1.5, 0.75

_WORD = re.compile(r"\w+")
# Function words only: BM25's idf already damps frequent words inside a small collection,
# but with 2–10 passages every word is "frequent", so these carry no evidence at all.
_STOPWORDS = frozenset("""a an and are as at be been but by for from has have he her his in into is it its
of on or that the their them they this to was were which who will with""".split())


@functools.lru_cache(maxsize=1)
def _porter():
    from nltk.stem import PorterStemmer

    return PorterStemmer()


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _porter().stem(word)


def simple_tokenize(text: str) -> List[str]:
    """Lower-cased, Porter-stemmed words without a few function words."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


def bm25_scores(query: Sequence[str], docs: Sequence[Sequence[str]], df: Dict[str, int], n_docs: int,
                avgdl: float, k1: float = K1, b: float = B) -> List[float]:
    """Lucene BM25: Σ_t idf(t)·tf / (tf + k1·(1 − b + b·|d|/avgdl)), idf = ln(1 + (N − df + ½)/(df + ½)).

    Lucene (since 8.0) and bm25s drop the constant (k1+1) numerator; rankings are unchanged.
    """
    idf = {t: math.log(1 + (n_docs - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in set(query)}
    out = []
    for doc in docs:
        tf = Counter(doc)
        norm = k1 * (1 - b + b * len(doc) / avgdl)
        out.append(sum(idf[t] * tf[t] / (tf[t] + norm) for t in query if tf.get(t)))
    return out


class LexicalCollection:
    """BM25 statistics of a small collection (e.g. the K passages a generator saw)."""

    def __init__(self, docs: Sequence[Sequence[str]]):
        self.docs = [list(d) for d in docs]
        self.df: Dict[str, int] = Counter(t for d in self.docs for t in set(d))
        self.n_docs = len(self.docs)
        self.avgdl = max(1e-9, sum(len(d) for d in self.docs) / max(1, self.n_docs))

    def scores(self, query: Sequence[str]) -> List[float]:
        return bm25_scores(query, self.docs, self.df, self.n_docs, self.avgdl)


class LexicalIndex:
    """BM25 over a whole corpus through postings (:func:`bm25_scores`' formula, for every document at once):
    ``agrame train`` draws its lexical hard negatives from a user's corpus with it."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = K1, b: float = B):
        self.n_docs = len(docs)
        lengths = [len(d) for d in docs]
        avgdl = max(1e-9, sum(lengths) / max(1, self.n_docs))
        self.norm = [k1 * (1 - b + b * n / avgdl) for n in lengths]
        self.postings: Dict[str, List[tuple]] = {}
        for i, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                self.postings.setdefault(term, []).append((i, tf))

    def scores(self, query: Sequence[str]) -> Dict[int, float]:
        """``{document: score}`` for the documents holding a query term (the others score 0)."""
        out: Dict[int, float] = {}
        for term in set(query):
            posting = self.postings.get(term, ())
            idf = math.log(1 + (self.n_docs - len(posting) + 0.5) / (len(posting) + 0.5))
            weight = idf * sum(1 for t in query if t == term)
            for i, tf in posting:
                out[i] = out.get(i, 0.0) + weight * tf / (tf + self.norm[i])
        return out

    def top(self, query: Sequence[str], k: int) -> List[int]:
        """The ``k`` best documents (score, then position), only those holding a query term."""
        scored = self.scores(query)
        return sorted(scored, key=lambda i: (-scored[i], i))[:k]

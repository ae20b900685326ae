"""The re-ranking methods every passage+sentence benchmark compares, over one corpus.

A corpus is a list of passage texts with their sentence spans (Punkt, or a dataset's own
segmentation). BM25 retrieves candidates; each method returns the candidates re-ranked
and all of their sentences ranked (as global sentence ids).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from agrame.loading import load_encoder
from agrame.ranker import Ranker, rank_corpus

from .bm25 import PoolBM25
from .encodings import MultiVectorCache, SingleVectorEncoder, cache_root, sentence_texts, single_vectors

METHODS = ("bm25", "single-vector", "colbert-zeroshot-psg", "colbert-zeroshot-sent")
# A sample's candidates are encoded alone only while they are at most this share of the pool: squad-dev's
# 2,000 questions × BM25's 100 already name 31,161 of the 33,591 pool passages, and the next benchmark of the
# full protocol (nq-oracle, all questions) encodes the whole pool anyway — the subset was a second encoding
# of 93 % of it (~2 h of one thread for a 384-d model).
SUBSET_SHARE = 0.5

#: (query id, query text, candidate passage indices) → (ranked passages, ranked global sentence ids)
Method = Callable[[str, str, np.ndarray], Tuple[List[int], List[int]]]


def stable_order(scores: Sequence[float]) -> List[int]:
    """Indices by descending score; ties keep candidate order (deterministic)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def best_sentence_passages(ranked_sentences: Sequence[int], owner: Callable[[int], int]) -> List[int]:
    """Passages ordered by their best sentence (passage score = max over its sentences)."""
    seen, out = set(), []
    for g in ranked_sentences:
        p = owner(g)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


class Harness:
    """One corpus (texts + sentence spans), its BM25 index, and the methods over it."""

    def __init__(self, name: str, texts: Sequence[str], spans: Sequence[Sequence[Tuple[int, int]]],
                 model: Optional[str] = None, alpha: Optional[float] = None,
                 baseline_model: Optional[str] = None, span_query_marker: Optional[str] = None):
        self.baseline_model = baseline_model
        self.span_query_marker = span_query_marker  # override the model's (ablation A2: train [Q'], rank [Q])
        self.name, self.texts, self.spans = name, list(texts), [list(s) for s in spans]
        self.sentences, self.sent_starts = sentence_texts(self.texts, self.spans)
        self.model, self.alpha = model, alpha
        self._bm25: Optional[PoolBM25] = None

    @property
    def bm25(self) -> PoolBM25:
        if self._bm25 is None:
            self._bm25 = PoolBM25(self.texts, cache_root())
        return self._bm25

    def sentence_ids(self, cands: Sequence[int]) -> List[int]:
        return [g for p in cands for g in range(int(self.sent_starts[p]), int(self.sent_starts[p + 1]))]

    def owner(self, g: int) -> int:
        return int(np.searchsorted(self.sent_starts, g, side="right")) - 1

    def make(self, method: str, queries: Sequence[Tuple[str, str]],
             needed: Optional[Sequence[int]] = None, passages_only: bool = False) -> Tuple[Method, dict]:
        """The ranking function of ``method`` and a description of its model and settings.

        ``needed``: the only passages that will be asked for (a sample's candidates); the
        passage-level multi-vector method then encodes just those, unless they are most of the pool
        (``SUBSET_SHARE``). ``passages_only`` (single
        vectors): rank passages and return no sentence ranking, so the sentences' vectors (as many
        tokens as the passages', for a 12-layer model an hour of these CPUs) are not needed.
        """
        if passages_only and method != "single-vector":
            raise SystemExit("error: passages only is for the single-vector method (the others rank both at once)")
        if method == "bm25":
            def run(qid, text, cands):
                ids = self.sentence_ids(cands)
                scores = self.bm25.score_texts(text, [self.sentences[g] for g in ids])
                return [int(c) for c in cands], [ids[i] for i in stable_order(scores)]
            return run, {"model": "bm25s (lucene, k1 1.5, b 0.75, en stopwords, snowball)"}
        if method == "single-vector":
            encoder = SingleVectorEncoder(self.baseline_model)
            psg = single_vectors(self.texts, f"sv-{self.name}", encoder)
            sent = None if passages_only else single_vectors(self.sentences, "sv-sentences", encoder)
            qv = dict(zip((q for q, _ in queries), encoder.encode_queries([t for _, t in queries])))

            def run(qid, text, cands):
                v = qv[qid]
                p_scores = (psg[cands].astype(np.float32) @ v).tolist()
                passages = [int(cands[i]) for i in stable_order(p_scores)]
                if sent is None:
                    return passages, None
                ids = self.sentence_ids(cands)
                s_scores = (sent[ids].astype(np.float32) @ v).tolist()
                return passages, [ids[i] for i in stable_order(s_scores)]
            return run, {"model": f"{self.baseline_model or 'all-MiniLM-L6-v2'} mean pooling (passage-level "
                                  "for passages" + (")" if passages_only else ", sentence-level for sentences)"),
                         **({"granularities": "passages only"} if passages_only else {})}
        if method not in METHODS:
            raise SystemExit(f"error: unknown method {method!r}; choose one of {', '.join(METHODS)}")
        encoder = load_encoder(self.model)
        if self.span_query_marker is not None:
            encoder = encoder.with_settings(span_query_marker=self.span_query_marker)
        ranker = Ranker(encoder, alpha=self.alpha)
        info = {"model": encoder.source, "fingerprint": encoder.fingerprint()[:12], "alpha": ranker.alpha,
                "doc_maxlen": encoder.settings.doc_maxlen,
                "markers": encoder.settings.markers, "span_query_marker": encoder.settings.span_query_marker}
        if method == "colbert-zeroshot-psg":
            full = MultiVectorCache(encoder, self.texts, f"colbert-{self.name}", self.spans)
            if (needed is not None and len(needed) <= SUBSET_SHARE * len(self.texts) and not full.folder.exists()
                    and full.projected_base() is None):
                subset = list(needed)
                cache = MultiVectorCache(encoder, [self.texts[i] for i in subset], f"colbert-{self.name}-subset",
                                         [self.spans[i] for i in subset]).ensure()
                position = {p: k for k, p in enumerate(subset)}
            else:
                cache, position, subset = full.ensure(), None, None

            def pool_index(passage_id: str) -> int:  # subset caches number their passages 0..n-1
                return subset[int(passage_id)] if subset is not None else int(passage_id)

            def run(qid, text, cands):
                corpus = cache.select([position[int(c)] for c in cands] if position else cands)
                qv, sv = ranker.encode_query(text, "sentence")
                passages = rank_corpus(qv, None, corpus, "passage", alpha=ranker.alpha, top_k=None)
                sents = rank_corpus(qv, sv, corpus, "sentence", alpha=ranker.alpha, top_k=None)
                starts = {int(p): [s for s, _ in self.spans[int(p)]] for p in cands}
                return [pool_index(r.passage_id) for r in passages], \
                       [int(self.sent_starts[pool_index(r.passage_id)]) + starts[pool_index(r.passage_id)].index(r.start)
                        for r in sents]
            return run, info
        cache = MultiVectorCache(encoder, self.sentences, "colbert-sentences").ensure()

        def run(qid, text, cands):  # colbert-zeroshot-sent: every sentence encoded alone
            ids = self.sentence_ids(cands)
            qv, _ = ranker.encode_query(text, "passage")
            # The sentence cache's passage ids are global sentence ids.
            ranked = [int(r.passage_id) for r in rank_corpus(qv, None, cache.select(ids), "passage",
                                                             alpha=0, top_k=None)]
            return best_sentence_passages(ranked, self.owner), ranked
        return run, {**info, "alpha": None}

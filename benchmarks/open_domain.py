"""Open-domain passage and sentence ranking (AGRaME Table 3 analog) over the pooled corpus.

BM25 (bm25s) retrieves the top 100 pool passages per question; every method re-ranks
those 100 passages and all of their sentences.

    python -m benchmarks.open_domain --dataset squad-dev --method colbert-zeroshot-psg --limit 2000

Gold: squad-dev — its paragraph, and the sentence holding the answer offset; nq-oracle —
its gold passage, and that passage's sentences containing a normalised answer; nq-open,
entityquestions, trivia, webq — any passage / sentence containing a normalised answer.
Metrics (benchmarks.metrics): P@1 and R@5 (any gold in the top 5) for passages and
sentences, first-stage R@100; for answer-match datasets also over the answerable subset
(questions whose answer occurs somewhere in the pool).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
from tqdm.auto import tqdm

from agrame.encoder import load_encoder
from agrame.ranker import Ranker, rank_corpus

from .bm25 import PoolBM25
from .common import command_line, sample, sentence_of, write_result
from .data import OPEN_DOMAIN_DATASETS, Pool, PoolMatcher, Question, load_pool, load_questions, restrict_pool
from .encodings import (MultiVectorCache, SingleVectorEncoder, cache_root, pool_sentences, sentence_texts,
                        single_vectors)
from .metrics import has_answer, precision_at_1, recall_at_k, summarize

METHODS = ("bm25", "single-vector", "colbert-zeroshot-psg", "colbert-zeroshot-sent")
FIRST_STAGE_K = 100

#: A method maps (question, candidate pool indices) to (ranked pool indices, ranked global sentence ids).
Method = Callable[[Question, np.ndarray], Tuple[List[int], List[int]]]


def stable_order(scores: Sequence[float]) -> List[int]:
    """Indices by descending score; ties keep candidate order (deterministic)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


class Harness:
    def __init__(self, model: str | None, alpha: float | None, pool: Pool | None = None):
        self.pool = pool or load_pool()
        self.spans = pool_sentences(self.pool)
        self.sentences, self.sent_starts = sentence_texts(self.pool, self.spans)
        self.model, self.alpha = model, alpha

    def sentence_ids(self, cands: Sequence[int]) -> List[int]:
        return [g for p in cands for g in range(int(self.sent_starts[p]), int(self.sent_starts[p + 1]))]

    def owner(self, g: int) -> int:
        return int(np.searchsorted(self.sent_starts, g, side="right")) - 1

    # -- methods -------------------------------------------------------------------
    def make(self, name: str, questions: List[Question]) -> Tuple[Method, dict]:
        if name == "bm25":
            bm25 = self.bm25

            def run(q, cands):
                ids = self.sentence_ids(cands)
                scores = bm25.score_texts(q.text, [self.sentences[g] for g in ids])
                return list(cands), [ids[i] for i in stable_order(scores)]
            return run, {"model": "bm25s (lucene, k1 1.5, b 0.75, en stopwords, snowball)"}
        if name == "single-vector":
            encoder = SingleVectorEncoder()
            psg = single_vectors(self.pool.texts, "sv-pool", encoder)
            sent = single_vectors(self.sentences, "sv-sentences", encoder)
            qv = dict(zip((q.qid for q in questions), encoder.encode([q.text for q in questions])))

            def run(q, cands):
                v = qv[q.qid]
                p_scores = psg[cands].astype(np.float32) @ v
                ids = self.sentence_ids(cands)
                s_scores = sent[ids].astype(np.float32) @ v
                return [int(cands[i]) for i in stable_order(p_scores.tolist())], \
                       [ids[i] for i in stable_order(s_scores.tolist())]
            return run, {"model": "all-MiniLM-L6-v2 mean pooling (passage-level for passages, "
                                  "sentence-level for sentences)"}
        encoder = load_encoder(self.model)
        ranker = Ranker(encoder, alpha=self.alpha)
        info = {"model": encoder.source, "alpha": ranker.alpha, "doc_maxlen": encoder.settings.doc_maxlen,
                "markers": encoder.settings.markers, "span_query_marker": encoder.settings.span_query_marker}
        if name == "colbert-zeroshot-psg":
            cache = MultiVectorCache(encoder, self.pool.texts, "colbert-pool").ensure()

            def run(q, cands):
                corpus = cache.select(cands)
                qv, sv = ranker.encode_query(q.text, "sentence")
                passages = rank_corpus(qv, None, corpus, "passage", alpha=ranker.alpha, top_k=None)
                sents = rank_corpus(qv, sv, corpus, "sentence", alpha=ranker.alpha, top_k=None)
                starts = {int(p): [s for s, _ in self.spans[int(p)]] for p in cands}
                return [int(r.passage_id) for r in passages], \
                       [int(self.sent_starts[int(r.passage_id)]) + starts[int(r.passage_id)].index(r.start)
                        for r in sents]
            return run, info
        if name == "colbert-zeroshot-sent":
            cache = MultiVectorCache(encoder, self.sentences, "colbert-sentences").ensure()

            def run(q, cands):
                ids = self.sentence_ids(cands)
                corpus = cache.select(ids)
                qv, _ = ranker.encode_query(q.text, "passage")
                ranked = [int(r.passage_id) for r in rank_corpus(qv, None, corpus, "passage", alpha=0, top_k=None)]
                seen, passages = set(), []
                for g in ranked:  # passage score = max over its sentences
                    p = self.owner(g)
                    if p not in seen:
                        seen.add(p)
                        passages.append(p)
                return passages, ranked
            return run, {**info, "alpha": None}
        raise SystemExit(f"error: unknown method {name!r}; choose one of {', '.join(METHODS)}")

    @property
    def bm25(self) -> PoolBM25:
        if not hasattr(self, "_bm25"):
            self._bm25 = PoolBM25(self.pool.texts, cache_root())
        return self._bm25

    # -- gold ------------------------------------------------------------------------
    def judge(self, dataset: str, q: Question, passages: List[int], sentences: List[int],
              cands: np.ndarray) -> Dict[str, float]:
        if q.gold_passage is not None:
            psg_rel = [p == q.gold_passage for p in passages]
            first_stage = float(q.gold_passage in set(int(c) for c in cands))
            gold_start = int(self.sent_starts[q.gold_passage])
            if dataset == "squad-dev":
                gold_sents = {gold_start + sentence_of(self.spans[q.gold_passage], q.answer_start)}
            else:
                gold_sents = {gold_start + k for k in range(len(self.spans[q.gold_passage]))
                              if has_answer(self.sentences[gold_start + k], q.answers)}
            sent_rel = [g in gold_sents for g in sentences]
        else:
            psg_rel = [has_answer(self.pool.texts[p], q.answers) for p in passages]
            first_stage = float(any(psg_rel))
            sent_rel = [has_answer(self.sentences[g], q.answers) for g in sentences]
            gold_sents = {True}
        out = {"psg_p1": precision_at_1(psg_rel), "psg_r5": recall_at_k(psg_rel, 5), "first_stage_r100": first_stage}
        if gold_sents:  # nq-oracle: an answer split over two sentences has no gold sentence
            out.update({"sent_p1": precision_at_1(sent_rel), "sent_r5": recall_at_k(sent_rel, 5)})
        return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=OPEN_DOMAIN_DATASETS)
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--limit", type=int, default=None, help="questions sampled (fixed seed); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="multi-vector model folder (default: built-in)")
    parser.add_argument("--alpha", type=float, default=None, help="α in S'(q,s) + α·S(q,p) (default: model's)")
    parser.add_argument("--pool-limit", type=int, default=None,
                        help="smoke tests only: gold passages plus this many others (not comparable)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    pool = load_pool()
    all_questions = load_questions(args.dataset, pool)
    questions = sample(all_questions, args.limit, args.seed)
    if args.pool_limit is not None:
        keep = [q.gold_passage for q in questions if q.gold_passage is not None]
        pool, remap = restrict_pool(pool, keep, args.pool_limit, args.seed)
        for q in questions:
            q.gold_passage = remap.get(q.gold_passage) if q.gold_passage is not None else None
    harness = Harness(args.model, args.alpha, pool)
    answerable = None
    if questions[0].gold_passage is None:
        matcher = PoolMatcher(harness.pool.texts)
        answerable = {q.qid: matcher(q.answers) for q in questions}
    docs, _ = harness.bm25.retrieve([q.text for q in questions], min(FIRST_STAGE_K, len(harness.pool)))
    method, info = harness.make(args.method, questions)
    per_question = []
    start = time.perf_counter()
    for q, cands in tqdm(list(zip(questions, docs)), desc=f"{args.dataset} {args.method}", disable=None):
        passages, sentences = method(q, cands)
        per_question.append(harness.judge(args.dataset, q, passages, sentences, cands))
    seconds = time.perf_counter() - start
    metrics = summarize(per_question)
    result = {
        "benchmark": "open_domain", "dataset": args.dataset, "method": args.method, **info,
        "sample": {"questions": len(questions), "of": len(all_questions),
                   "seed": args.seed if args.limit else None,
                   "with_gold_sentence": sum("sent_p1" in m for m in per_question)},
        "first_stage": f"bm25 top-{FIRST_STAGE_K}", "pool_passages": len(harness.pool),
        "metrics": metrics, "ms_per_question": round(1000 * seconds / len(questions), 1),
    }
    if answerable is not None:
        subset = [m for q, m in zip(questions, per_question) if answerable[q.qid]]
        result["answerable_share"] = round(100 * len(subset) / len(questions), 1)
        result["metrics_answerable"] = summarize(subset)
    path = write_result(f"open_domain-{args.dataset}-{args.method}", result, args.out, command_line("benchmarks.open_domain", argv))
    print(f"{args.dataset} {args.method}: {metrics} → {path}")


if __name__ == "__main__":
    main()

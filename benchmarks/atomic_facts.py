"""Atomic-fact (proposition) retrieval (AGRaME Table 6 analog) on PropSegmEnt dev, Wikipedia part.

    python -m benchmarks.atomic_facts --method colbert-zeroshot-psg

Query: a hypothesis proposition (token mask inside its sentence) whose majority label is
ENTAILS. Candidates: all reference propositions of the dev and test Wikipedia clusters
(test ones are distractors), except those of the query's own sentence. Gold rules in
benchmarks.propsegment. Sentence score = the best score of its propositions (one rule for
every method); gold sentence = a premise sentence holding a supporting proposition.

Methods: ``bm25`` (proposition texts, statistics of the candidate set);
``single-vector`` (MiniLM mean pooling of each proposition's text alone);
``colbert-zeroshot-psg`` (candidate sentences and the query sentence each encoded whole,
sub-query → sub-unit MaxSim: only the query proposition's tokens score, against only
the candidate proposition's tokens; AGRaME §4.2); ``colbert-zeroshot-sent`` (proposition
texts encoded alone, multi-vector); ``subencoder-zeroshot`` (whole-sentence encoding,
mean pooling under each proposition's mask, no head); ``subencoder`` (the same plus an
MLP head, trained with SupCon on ENTAILS pairs, cross-validated by cluster: each query
is scored by a model that never saw its cluster).
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame.corpus import Passage
from agrame.loading import load_encoder
from agrame.ranker import Ranker
from agrame.scoring import similarity, span_maxsim
from agrame.spans import span_token_mask

from .bm25 import PoolBM25
from .common import add_model_args, command_line, sample, tagged, write_result
from .metrics import per_question, precision_at_1, recall_at_k, summarize
from .propsegment import JACCARD_MIN, AtomicData, Query, jaccard, load_atomic
from .rerank import stable_order

METHODS = ("bm25", "single-vector", "colbert-zeroshot-psg", "colbert-zeroshot-sent", "subencoder-zeroshot",
           "subencoder")


def candidate_texts(data: AtomicData) -> List[str]:
    return [data.sentences[k].proposition_text(t) for k, t in data.candidates]


def query_text(data: AtomicData, q: Query) -> str:
    return data.sentences[q.sentence].proposition_text(q.tokens)


def judge(data: AtomicData, q: Query, scores: np.ndarray) -> Dict[str, float]:
    """Metrics from one score per candidate; the query's own sentence is excluded here."""
    allowed = [i for i, (k, _) in enumerate(data.candidates) if k != q.sentence]
    order = [allowed[i] for i in stable_order(scores[allowed].tolist())]
    gold = set(q.gold)
    prop_rel = [i in gold for i in order]
    seen, sent_rel = set(), []
    for i in order:  # sentences ranked by their best proposition
        key = data.candidates[i][0]
        if key not in seen:
            seen.add(key)
            sent_rel.append(key in q.gold_sentences)
    return {"prop_p1": precision_at_1(prop_rel), "prop_r5": recall_at_k(prop_rel, 5),
            "sent_p1": precision_at_1(sent_rel), "sent_r5": recall_at_k(sent_rel, 5)}


# -- scorers: each returns scores[query, candidate] --------------------------------------

def score_bm25(data: AtomicData, queries: Sequence[Query]) -> np.ndarray:
    bm25 = PoolBM25(candidate_texts(data))
    return np.stack([bm25.scores_all(query_text(data, q)) for q in queries])


def score_single_vector(data: AtomicData, queries: Sequence[Query], baseline: Optional[str]) -> np.ndarray:
    from .encodings import SingleVectorEncoder

    encoder = SingleVectorEncoder(baseline)
    cands = encoder.encode(candidate_texts(data))
    qs = encoder.encode_queries([query_text(data, q) for q in queries])
    return qs @ cands.T


def score_colbert_psg(data: AtomicData, queries: Sequence[Query], model: Optional[str], alpha: float,
                      span_query_marker: Optional[str] = None, pool_factor=1) -> np.ndarray:
    encoder = load_encoder(model)
    if span_query_marker is not None:
        encoder = encoder.with_settings(span_query_marker=span_query_marker)
    ranker = Ranker(encoder)
    groups = data.by_sentence()
    corpus = ranker.encode([Passage(str(i), data.sentences[k].text) for i, k in enumerate(groups)])
    # Token pooling as an index with --pool-factor stores it: a proposition (a sub-sentence span) is then
    # scored by every pooled vector whose run of tokens it overlaps (agrame.pooling).
    corpus = corpus.pooled(pool_factor)
    by_sentence = dict(enumerate(groups.values()))  # corpus passage index → candidate indices
    masks = {}
    for p, cands in by_sentence.items():
        masks[p] = corpus.span_mask(p, [data.sentences[data.candidates[c][0]].pieces(data.candidates[c][1])
                                             for c in cands])
    out = np.zeros((len(queries), len(data.candidates)), dtype=np.float32)
    for qi, q in enumerate(tqdm(queries, desc="colbert sub-query", disable=None)):
        sentence = data.sentences[q.sentence]
        query = encoder.encode_query(sentence.text, encoder.settings.span_query_marker)  # the sub-unit query
        q_mask = span_token_mask(query.offsets, [sentence.pieces(q.tokens)])[0]
        sim = similarity(query.vectors, corpus.vectors)
        for p, cands in by_sentence.items():
            sl = corpus.passage_tokens(p)
            scores = span_maxsim(sim[:, sl], masks[p], q_mask)
            if alpha:
                scores = scores + alpha * span_maxsim(sim[:, sl], torch.ones((1, sl.stop - sl.start), dtype=torch.bool),
                                                      q_mask)
            out[qi, cands] = scores.numpy()
    return out


def score_colbert_sent(data: AtomicData, queries: Sequence[Query], model: Optional[str]) -> np.ndarray:
    encoder = load_encoder(model)
    ranker = Ranker(encoder)
    corpus = ranker.encode(candidate_texts(data))
    out = np.zeros((len(queries), len(data.candidates)), dtype=np.float32)
    for qi, q in enumerate(tqdm(queries, desc="colbert proposition alone", disable=None)):
        for r in ranker.rank(query_text(data, q), corpus, "passage", top_k=None):
            out[qi, int(r.passage_id)] = r.score
    return out


def _subencoder_scores(model, data: AtomicData, queries: Sequence[Query]) -> np.ndarray:
    groups = data.by_sentence()
    vectors = model.encode([data.sentences[k].text for k in groups],
                           [[data.sentences[k].pieces(data.candidates[c][1]) for c in cands]
                            for k, cands in groups.items()])
    cand = torch.empty_like(vectors)
    cand[torch.tensor([c for cands in groups.values() for c in cands])] = vectors
    qv = model.encode([data.sentences[q.sentence].text for q in queries],
                      [[data.sentences[q.sentence].pieces(q.tokens)] for q in queries])
    return (qv @ cand.T).numpy()


def score_subencoder_zeroshot(data: AtomicData, queries: Sequence[Query], baseline: Optional[str]) -> np.ndarray:
    from .subencoder import SubEncoder

    return _subencoder_scores(SubEncoder(head=False, model_path=baseline), data, queries)


def training_batches(data: AtomicData, queries: Sequence[Query], pairs_per_batch: int, seed: int) -> List[List]:
    """SupCon batches: each ENTAILS pair is a positive group; the other reference propositions
    of the two sentences (Jaccard < 0.5 to the pair's member) are negatives. Duplicate
    propositions within a batch are merged, and so are their labels."""
    import random

    rng = random.Random(seed)
    items_per_query = []
    for q in queries:
        hyp = data.sentences[q.sentence]
        group = [(hyp.text, hyp.pieces(q.tokens), "pos")]
        negatives = [(hyp.text, hyp.pieces(p)) for p in hyp.propositions if jaccard(p, q.tokens) < JACCARD_MIN]
        for premise, support in q.supports[:1]:
            s = data.sentences[premise]
            group.append((s.text, s.pieces(support), "pos"))
            negatives += [(s.text, s.pieces(p)) for p in s.propositions if jaccard(p, support) < JACCARD_MIN]
        items_per_query.append((group, negatives))
    rng.shuffle(items_per_query)
    batches = []
    for b in range(0, len(items_per_query), pairs_per_batch):
        label_of: Dict = {}
        parent: Dict[int, int] = {}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        next_label = 0
        for group, negatives in items_per_query[b:b + pairs_per_batch]:
            group_label = None
            for text, span, _ in group:
                key = (text, span)
                if key not in label_of:
                    label_of[key] = next_label
                    parent[next_label] = next_label
                    next_label += 1
                if group_label is None:
                    group_label = find(label_of[key])
                else:
                    parent[find(label_of[key])] = group_label
            for text, span in negatives:
                key = (text, span)
                if key not in label_of:
                    label_of[key] = next_label
                    parent[next_label] = next_label
                    next_label += 1
        batches.append([(text, span, find(label)) for (text, span), label in label_of.items()])
    return batches


def score_subencoder_cv(data: AtomicData, queries: Sequence[Query], folds: int, epochs: int, seed: int,
                        log, max_train_pairs: Optional[int] = None,
                        baseline: Optional[str] = None) -> tuple[np.ndarray, list]:
    from .subencoder import train_subencoder

    clusters = sorted({q.sentence[0] for q in data.queries})
    fold_of = {c: i % folds for i, c in enumerate(clusters)}
    out = np.zeros((len(queries), len(data.candidates)), dtype=np.float32)
    info = []
    for f in range(folds):
        train = [q for q in data.queries if fold_of[q.sentence[0]] != f][:max_train_pairs]
        test_idx = [i for i, q in enumerate(queries) if fold_of[q.sentence[0]] == f]
        if not test_idx:
            continue
        log(f"fold {f + 1}/{folds}: train on {len(train)} pairs, score {len(test_idx)} queries")
        model = train_subencoder(training_batches(data, train, 8, seed + f), epochs=epochs, seed=seed + f, log=log,
                                 model_path=baseline)
        out[test_idx] = _subencoder_scores(model, data, [queries[i] for i in test_idx])
        info.append({"fold": f, "train_pairs": len(train), "test_queries": len(test_idx),
                     "clusters": [c for c in clusters if fold_of[c] == f]})
    return out, info


def _factor(value: str):
    from agrame.pooling import check_pool_factor

    try:
        return check_pool_factor(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", required=True, choices=METHODS)
    add_model_args(parser, alpha_help="weight of the sub-query's score against the whole candidate sentence "
                                      "(default 0)", alpha_default=0.0)
    parser.add_argument("--folds", type=int, default=5, help="subencoder: cross-validation folds over clusters")
    parser.add_argument("--epochs", type=int, default=5, help="subencoder: training epochs per fold")
    parser.add_argument("--max-train-pairs", type=int, default=None, help="subencoder: smoke tests only")
    parser.add_argument("--pool-factor", type=_factor, default=1,
                        help="colbert-zeroshot-psg: pool the candidates' token vectors as an index with "
                             "--pool-factor stores them (agrame.pooling; default 1: none)")
    args = parser.parse_args(argv)
    if args.pool_factor != 1 and args.method != "colbert-zeroshot-psg":
        parser.error("--pool-factor goes with --method colbert-zeroshot-psg")

    data = load_atomic()
    queries = sample(data.queries, args.limit, args.seed)
    start = time.perf_counter()
    info: dict = {}
    if args.method == "bm25":
        scores = score_bm25(data, queries)
        info["model"] = "bm25s (lucene, k1 1.5, b 0.75) over candidate proposition texts"
    elif args.method == "single-vector":
        scores = score_single_vector(data, queries, args.baseline_model)
        info["model"] = f"{args.baseline_model or 'all-MiniLM-L6-v2'} mean pooling, proposition text alone"
    elif args.method == "colbert-zeroshot-psg":
        scores = score_colbert_psg(data, queries, args.model, args.alpha, args.span_query_marker, args.pool_factor)
        encoder = load_encoder(args.model)
        info.update(model=encoder.source, fingerprint=encoder.fingerprint()[:12], alpha=args.alpha,
                    span_query_marker=args.span_query_marker or encoder.settings.span_query_marker,
                    pool_factor=args.pool_factor)
    elif args.method == "colbert-zeroshot-sent":
        scores = score_colbert_sent(data, queries, args.model)
        info["model"] = load_encoder(args.model).source
    elif args.method == "subencoder-zeroshot":
        scores = score_subencoder_zeroshot(data, queries, args.baseline_model)
        info["model"] = f"{args.baseline_model or 'all-MiniLM-L6-v2'}, mask pooling, no head"
    else:
        scores, folds = score_subencoder_cv(data, queries, args.folds, args.epochs, args.seed, log=print,
                                            max_train_pairs=args.max_train_pairs, baseline=args.baseline_model)
        info.update(model=f"SubEncoder: {args.baseline_model or 'all-MiniLM-L6-v2'} + MLP head, SupCon τ 0.01, "
                          "lr 2e-5, 8 pairs/batch",
                    epochs=args.epochs, folds=folds)
    per_query = [judge(data, q, scores[i]) for i, q in enumerate(queries)]
    seconds = time.perf_counter() - start
    result = {
        "benchmark": "atomic_facts", "dataset": "propsegment-dev-wiki", "method": args.method, **info,
        "sample": {"questions": len(queries), "of": len(data.queries), "seed": args.seed if args.limit else None,
                   "candidates": len(data.candidates), "queries_without_gold": sum(not q.gold for q in queries)},
        "metrics": summarize(per_query), "ms_per_question": round(1000 * seconds / max(1, len(queries)), 1),
        "tag": args.tag, "per_question": per_question([q.qid for q in queries], per_query),
    }
    path = write_result(tagged(f"atomic_facts-{args.method}", args.tag), result, args.out, command_line("benchmarks.atomic_facts", argv))
    print(f"atomic facts {args.method}: {result['metrics']} → {path}")


if __name__ == "__main__":
    main()

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
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
from tqdm.auto import tqdm

from .common import add_model_args, command_line, sample, tagged, write_result
from .data import OPEN_DOMAIN_DATASETS, PoolMatcher, Question, load_pool, load_questions, restrict_pool
from .encodings import pool_sentences
from agrame.gold import gold_sentences
from .metrics import has_answer, per_question as per_question_block, precision_at_1, recall_at_k, summarize
from .rerank import METHODS, Harness

FIRST_STAGE_K = 100


def judge(dataset: str, harness: Harness, q: Question, passages: List[int], sentences: Optional[List[int]],
          cands) -> Dict[str, float]:
    """Per-question metrics; gold as described in the module docstring."""
    if q.gold_passage is not None:
        psg_rel = [p == q.gold_passage for p in passages]
        first_stage = float(q.gold_passage in {int(c) for c in cands})
        gold_start = int(harness.sent_starts[q.gold_passage])
        spans = harness.spans[q.gold_passage]
        gold_sents = {gold_start + k for k in gold_sentences(dataset, q, harness.texts[q.gold_passage], spans)}
        sent_rel = [g in gold_sents for g in sentences or []]
    else:
        psg_rel = [has_answer(harness.texts[p], q.answers) for p in passages]
        first_stage = float(any(psg_rel))
        sent_rel = [has_answer(harness.sentences[g], q.answers) for g in sentences or []]
        gold_sents = {True}
    out = {"psg_p1": precision_at_1(psg_rel), "psg_r5": recall_at_k(psg_rel, 5), "first_stage_r100": first_stage}
    # no gold sentence: nq-oracle's answer split over two sentences; no sentences: a passages-only run
    if gold_sents and sentences is not None:
        out.update({"sent_p1": precision_at_1(sent_rel), "sent_r5": recall_at_k(sent_rel, 5)})
    return out


def write_runs(folder: Path, dataset: str, harness: Harness, ids: List[str], ranked, tag: str) -> None:
    """The rankings as TREC runs with the run files' ids (:mod:`agrame.runs`); a score is the rank
    reversed (the methods return orders, and an order is all P@k and R@k read)."""
    from agrame.runs import atomic_text_file, span_docid

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_text_file(folder / f"{dataset}-passage.trec") as out:
        for qid, passages, _ in ranked:
            out.writelines(f"{qid} Q0 {span_docid(ids[p])} {r} {len(passages) - r + 1} {tag}\n"
                           for r, p in enumerate(passages, 1))
    if any(sentences is not None for _, _, sentences in ranked):
        with atomic_text_file(folder / f"{dataset}-sentence.trec") as out:
            for qid, _, sentences in ranked:
                for r, g in enumerate(sentences or [], 1):
                    p = int(np.searchsorted(harness.sent_starts, g, side="right")) - 1
                    span = harness.spans[p][g - int(harness.sent_starts[p])]
                    out.write(f"{qid} Q0 {span_docid(ids[p], [span])} {r} {len(sentences) - r + 1} {tag}\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=OPEN_DOMAIN_DATASETS)
    parser.add_argument("--method", required=True, choices=METHODS)
    add_model_args(parser)
    parser.add_argument("--depth", type=int, default=FIRST_STAGE_K,
                        help=f"BM25 candidates re-ranked per question (default {FIRST_STAGE_K})")
    parser.add_argument("--passages-only", action="store_true",
                        help="single-vector: rank passages only (no sentence vectors; no sentence metrics)")
    parser.add_argument("--runs", metavar="DIR", default=None,
                        help="also write the rankings as TREC runs (DIR/DATASET-passage.trec, -sentence.trec; "
                             "pool source ids, rank-based scores) for agrame evaluate with agrame qrels")
    parser.add_argument("--pool-limit", type=int, default=None,
                        help="smoke tests only: gold passages plus this many others (not comparable)")
    args = parser.parse_args(argv)

    pool = load_pool()
    all_questions = load_questions(args.dataset, pool)
    questions = sample(all_questions, args.limit, args.seed)
    if args.pool_limit is not None:
        keep = [q.gold_passage for q in questions if q.gold_passage is not None]
        pool, remap = restrict_pool(pool, keep, args.pool_limit, args.seed)
        for q in questions:
            q.gold_passage = remap.get(q.gold_passage) if q.gold_passage is not None else None
    harness = Harness("pool", pool.texts, pool_sentences(pool), args.model, args.alpha, args.baseline_model,
                      args.span_query_marker)
    answerable = None
    if questions[0].gold_passage is None:
        matcher = PoolMatcher(pool.texts)
        answerable = {q.qid: matcher(q.answers) for q in questions}
    docs, _ = harness.bm25.retrieve([q.text for q in questions], min(args.depth, len(pool)))
    # A sample encodes only its candidates (a trained model need not encode the whole pool).
    needed = sorted({int(c) for row in docs for c in row}) if args.limit else None
    method, info = harness.make(args.method, [(q.qid, q.text) for q in questions], needed=needed,
                                passages_only=args.passages_only)
    per_question, ranked = [], []
    start = time.perf_counter()
    for q, cands in tqdm(list(zip(questions, docs)), desc=f"{args.dataset} {args.method}", disable=None):
        passages, sentences = method(q.qid, q.text, cands)
        per_question.append(judge(args.dataset, harness, q, passages, sentences, cands))
        ranked.append((q.qid, passages, sentences))
    seconds = time.perf_counter() - start
    if args.runs:
        write_runs(Path(args.runs), args.dataset, harness, pool.ids, ranked, args.method)
    metrics = summarize(per_question)
    result = {
        "benchmark": "open_domain", "dataset": args.dataset, "method": args.method, **info,
        "sample": {"questions": len(questions), "of": len(all_questions),
                   "seed": args.seed if args.limit else None,
                   "with_gold_sentence": sum("sent_p1" in m for m in per_question)},
        "first_stage": f"bm25 top-{args.depth}", "pool_passages": len(pool), "tag": args.tag,
        "metrics": metrics, "ms_per_question": round(1000 * seconds / len(questions), 1),
        "per_question": per_question_block([q.qid for q in questions], per_question),
    }
    if answerable is not None:
        subset = [m for q, m in zip(questions, per_question) if answerable[q.qid]]
        result["answerable_share"] = round(100 * len(subset) / len(questions), 1)
        result["metrics_answerable"] = summarize(subset)
    path = write_result(tagged(f"open_domain-{args.dataset}-{args.method}", args.tag), result, args.out,
                        command_line("benchmarks.open_domain", argv))
    print(f"{args.dataset} {args.method}: {metrics} → {path}")


if __name__ == "__main__":
    main()

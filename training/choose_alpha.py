"""Choose α of Score(q,s) = S'(q,s) + α·S(q,p) on held-out SQuAD *train* questions.

    python -m training.choose_alpha --model runs/students/agrame/final --data runs/train/squad-train.jsonl \\
        --skip 3500 --limit 300 --write

    python -m training.choose_alpha --model e5-kd-128 --data runs/e5kd/squad-heldout.jsonl --skip 0 \
        --limit 300 --protocol pool

``--protocol records`` (the default): each question ranks every sentence of its k+1 passages
(gold paragraph + BM25 hard negatives). ``--protocol pool``: the benchmarks' full protocol on
train questions — BM25's top 100 of the pooled corpus (which holds SQuAD train paragraphs) and
all their sentences, re-ranked from the pool's cached vectors (``benchmarks.encodings``); a gold
paragraph BM25 misses is a miss, as in ``benchmarks.open_domain``. Over 100 candidates the
α·S(q,p) term matters more than among 8. Sentence P@1 is computed for each α of the grid. The
questions after the first ``--skip`` records were not used to train the student, and no
benchmark split is touched. ``--write`` stores the best α in the model's ``agrame.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from agrame import scoring
from agrame.encoder import SETTINGS_FILE
from agrame.loading import load_encoder
from agrame.ranker import Ranker

from agrame.training.choose_mix import GRID


def sentence_p1_by_alpha(ranker: Ranker, records: Sequence[dict], grid: Sequence[float] = GRID) -> dict:
    hits = {a: 0 for a in grid}
    for r in records:
        corpus = ranker.encode([(str(k), p["text"]) for k, p in enumerate(r["passages"])])
        q, s = ranker.encode_query(r["question"], "sentence")
        passage = scoring.segment_maxsim(scoring.similarity(q, corpus.vectors.float()), corpus.token_passage, len(corpus))
        s_sim = scoring.similarity(s, corpus.vectors.float())
        n = int(corpus.sentences.shape[0])
        sentence = scoring.segment_maxsim(s_sim, corpus.token_sentence, n)
        owner = corpus.sentence_passage
        # The gold paragraph comes first and the corpus splits sentences as the data did,
        # so its answer sentences are the first global sentence indices.
        gold = set(r["passages"][0]["answer_sentences"])
        for a in grid:
            combined = scoring.combined_score(sentence, passage[owner], a)
            best = int(torch.sort(combined, descending=True, stable=True).indices[0])
            hits[a] += best in gold
    return {a: round(100 * h / len(records), 1) for a, h in hits.items()}


def _gold_in_pool(record: dict, pool, spans) -> Tuple[Optional[int], set]:
    """The record's gold paragraph as a pool position, and the first characters of its answer
    sentences as the pool splits them."""
    from agrame.datasets import sentence_of

    gold = next(p for p in record["passages"] if p["positive"])
    position = pool.position.get(gold["text"])
    if position is None:
        return None, set()
    starts = [gold["sentences"][k][0] for k in gold["answer_sentences"]]
    return position, {spans[position][sentence_of(spans[position], c)][0] for c in starts}


def pool_top_sentences(encoder, records: Sequence[dict], grid: Sequence[float] = GRID, depth: int = 100,
                       pool=None) -> List[dict]:
    """Per record of ``--protocol pool``: its gold (pool position, answer sentences' first characters),
    the top passage, and for each α the top sentence as (pool position, first character); ``pool``:
    the pooled corpus (``benchmarks.data.load_pool()``, the default) or a smaller one for tests."""
    from agrame.datasets import load_pool
    from benchmarks.encodings import MultiVectorCache, pool_sentences
    from benchmarks.rerank import Harness
    from agrame.ranker import score_corpus

    pool = pool if pool is not None else load_pool()
    pool.position = {t: i for i, t in enumerate(pool.texts)}
    harness = Harness("pool", pool.texts, pool_sentences(pool))
    cache = MultiVectorCache(encoder, pool.texts, "colbert-pool", harness.spans).ensure()
    ranker = Ranker(encoder)
    docs, _ = harness.bm25.retrieve([r["question"] for r in records], min(depth, len(pool)))
    out = []
    for r, cands in zip(records, docs):
        gold, gold_starts = _gold_in_pool(r, pool, harness.spans)
        cands = [int(c) for c in cands]
        corpus = cache.select(cands)
        q, s = ranker.encode_query(r["question"], "sentence")
        passage, sentence = score_corpus(q, s, corpus, "sentence")[:2]
        owner = corpus.sentence_passage
        top = {}
        for a in grid:
            row = int(torch.sort(scoring.combined_score(sentence, passage[owner], a), descending=True,
                                 stable=True).indices[0])
            top[a] = (cands[int(owner[row])], int(corpus.sentences[row][0]))
        out.append({"gold": gold, "gold_starts": gold_starts, "top_sentence": top,
                    "top_passage": cands[int(torch.sort(passage, descending=True, stable=True).indices[0])]})
    return out


def pool_sentence_p1_by_alpha(encoder, records: Sequence[dict], grid: Sequence[float] = GRID, depth: int = 100,
                              pool=None) -> dict:
    """Sentence P@1 per α (and the α-free passage P@1) with ``--protocol pool``: a sentence is right when
    it lies in the gold paragraph and starts where an answer sentence does (as benchmarks.open_domain
    judges); a gold paragraph outside BM25's top ``depth`` is a miss at every α."""
    tops = [t for t in pool_top_sentences(encoder, records, grid, depth, pool) if t["gold"] is not None]
    if not tops:
        raise SystemExit("error: no record's gold paragraph is in the pooled corpus")
    n = len(tops)
    table = {a: round(100 * sum(t["top_sentence"][a][0] == t["gold"] and t["top_sentence"][a][1] in t["gold_starts"]
                                for t in tops) / n, 1) for a in grid}
    return {"sentence_p1_by_alpha": table, "passage_p1": round(100 * sum(t["top_passage"] == t["gold"] for t in tops) / n, 1),
            "questions_scored": n, "gold_not_in_pool": len(records) - n, "depth": depth}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from agrame.training.records import read

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the package default)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--skip", type=int, default=3500, help="records the labels (so the student) were made from: skipped")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--write", action="store_true", help="store the best α in the model's agrame.json")
    parser.add_argument("--protocol", choices=("records", "pool"), default="records",
                        help="records: the record's own passages; pool: BM25 top 100 of the pooled corpus")
    args = parser.parse_args(argv)
    records = read(args.data)[args.skip:args.skip + args.limit]
    if not records:
        raise SystemExit(f"error: no held-out records after the first {args.skip}")
    encoder = load_encoder(args.model)
    if args.protocol == "pool":
        found = pool_sentence_p1_by_alpha(encoder, records)
        table = found.pop("sentence_p1_by_alpha")
    else:
        found, table = {}, sentence_p1_by_alpha(Ranker(encoder), records)
    best = max(table, key=lambda a: (table[a], -abs(a - 0.5)))
    result = {"questions": len(records), "skip": args.skip, "protocol": args.protocol, "data": str(args.data),
              "model": encoder.source, "sentence_p1_by_alpha": table, "best_alpha": best, **found}
    print(json.dumps(result))
    if args.write:
        if args.model is None:
            raise SystemExit("error: --write needs --model (the package default is not rewritten)")
        path = Path(args.model) / SETTINGS_FILE
        meta = json.loads(path.read_text())
        meta["alpha"] = best
        path.write_text(json.dumps(meta, indent=2) + "\n")
        (Path(args.model) / "alpha.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

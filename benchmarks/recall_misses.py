"""Whose is a top-100 miss: the staged search's or the index's?

    python -m benchmarks.recall_misses --dataset squad-dev --limit 2000

Every question's passage top 100 by the staged search at the index's default settings (what
``benchmarks.plaid``'s AGRaME row runs: passage granularity, no sub-queries), and, for each question whose
gold passage it misses, the gold passage's rank in the compressed exhaustive scan (every stored passage
decompressed and scored exactly). A miss the scan has in its top 100 is the search's (its candidate stages
and budget); one the scan ranks below 100 is the index's (model and codec): no search setting recovers it. A
diagnostic of the search, not a choice: nothing here is tuned on the split it reads.
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional, Sequence

import torch
from tqdm.auto import tqdm

from agrame.index import Index

from .common import command_line, sample, write_result
from .data import load_questions
from .index_search import PoolVectors, build, codec_arg, encode_queries, exhaustive_scores
from .open_domain import judge
from .rerank import Harness

#: how deep a missed gold passage is looked for in the exhaustive ranking
DEPTH = 3000


def _hit(dataset: str, harness: Harness, question, ranked: List[int]) -> bool:
    return bool(judge(dataset, harness, question, ranked, [], ranked)["first_stage_r100"])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="squad-dev", choices=("squad-dev", "nq-oracle"))
    parser.add_argument("--limit", type=int, default=2000, help="questions sampled (default 2000, as benchmarks.plaid)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="multi-vector model (default: the package default)")
    parser.add_argument("--nbits", type=codec_arg, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    index = Index(build(vectors, args.nbits)[0], model=vectors.encoder)
    everything = load_questions(args.dataset, vectors.pool)
    questions = sample(everything, args.limit, args.seed)
    harness = Harness("pool", vectors.pool.texts, vectors.spans)
    encoded = encode_queries(vectors.encoder, [q.text for q in questions])
    alpha = vectors.encoder.settings.alpha
    hits, misses = 0, []
    for question, (q, s) in zip(tqdm(questions, desc="staged", disable=None), encoded):
        ranked = [int(h.passage_id) for h in index.search_vectors(q, None, "passage", 100)]
        if _hit(args.dataset, harness, question, ranked):
            hits += 1
        else:
            misses.append((question, q, s))
    rows = []
    for question, q, s in tqdm(misses, desc="exhaustive", disable=None):
        order = torch.argsort(exhaustive_scores(index, q, s, alpha)[0], descending=True).tolist()
        rank = next((r for r, pid in enumerate(order[:DEPTH], 1) if _hit(args.dataset, harness, question, [pid])),
                    None)
        rows.append({"question": question.text, "gold_rank_in_exhaustive_scan": rank})
    recoverable = sum(1 for r in rows if r["gold_rank_in_exhaustive_scan"] and r["gold_rank_in_exhaustive_scan"] <= 100)
    n = len(questions)
    result = {"benchmark": "recall_misses", "dataset": args.dataset, "model": vectors.encoder.source,
              "residuals": index.store.codec.name, "settings": index.defaults._asdict(),
              "sample": {"questions": n, "of": len(everything), "seed": args.seed},
              "staged_r100": round(100 * hits / n, 2), "staged_misses": len(misses),
              "misses_in_exhaustive_top100": recoverable,
              "misses_below_exhaustive_100": len(misses) - recoverable,
              "r100_with_the_search_misses_recovered": round(100 * (hits + recoverable) / n, 2),
              "depth_looked": DEPTH, "misses": rows,
              "note": "the recovered figure is an upper bound of the exhaustive scan's R@100: a question the staged "
                      "search finds could in principle fall below 100 in the scan (not checked)"}
    out = write_result(f"recall_misses-{args.dataset}", result, args.out, command_line("benchmarks.recall_misses", argv))
    print(json.dumps({k: v for k, v in result.items() if k not in ("misses", "machine")}, indent=1), "→", out)


if __name__ == "__main__":
    main()

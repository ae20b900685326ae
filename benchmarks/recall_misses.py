"""Whose is a top-100 miss: the staged search's or the index's?

    python -m benchmarks.recall_misses --dataset squad-dev --limit 2000

Every question's passage top 100 by the staged search at the index's default settings (what
``benchmarks.plaid``'s AGRaME row runs: passage granularity, no sub-queries), and, for each question whose
gold passage it misses, the gold passage's rank in the compressed exhaustive scan (every stored passage
decompressed and scored exactly). A miss the scan has in its top 100 is the search's (its candidate stages
and budget); one the scan ranks below 100 is the index's (model and codec): no search setting recovers it.
For each of the search's misses it also says which stage dropped the gold passage: stage 1 (no probed
centroid's list holds it), stage 2a (its score over the probed centroids ranks it below the
``PRUNE_FACTOR × ncandidates`` kept) or stage 2b (its score over all its tokens' centroids ranks it below
the ``ncandidates`` scored exactly). A diagnostic of the search, not a choice: nothing here is tuned on the
split it reads. ``--dataset squad-train`` reads SQuAD *train* questions (one per paragraph), the split a
search budget may be chosen on.
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame import scoring
from agrame.index import Index
from agrame.index.search import PRUNE_FACTOR

from .common import command_line, sample, write_result
from .data import load_questions
from .index_search import PoolVectors, _train_questions, build, codec_arg, encode_queries, exhaustive_scores
from .open_domain import judge
from .rerank import Harness

#: how deep a missed gold passage is looked for in the exhaustive ranking
DEPTH = 3000


def _hit(dataset: str, harness: Harness, question, ranked: List[int]) -> bool:
    return bool(judge(dataset, harness, question, ranked, [], ranked)["first_stage_r100"])


def lost_at(index: Index, q: torch.Tensor, position: int, nprobe: int, ncandidates: int) -> str:
    """Which stage of :meth:`Index.candidates` (``nprobe``, ``ncandidates``) drops stored ``position`` for
    query ``q``: "stage 1", "stage 2a", "stage 2b", or "kept" (it reaches the exact stage; a tie at a cut
    counts as kept)."""
    cs = scoring.centroid_scores(q.float(), torch.from_numpy(index.store.codec.centroids32))
    unique, approx = index.probed(cs, nprobe, ncandidates)
    where = (unique == position).nonzero()[0]
    if not len(where):
        return "stage 1"
    if len(unique) > PRUNE_FACTOR * ncandidates:
        # ties at the cut count as kept: the search's own order among ties is storage order
        if int((approx > approx[int(where[0])]).sum()) >= PRUNE_FACTOR * ncandidates:
            return "stage 2a"
        unique = unique[torch.argsort(approx, descending=True, stable=True)[:PRUNE_FACTOR * ncandidates].numpy()]
        if position not in set(unique.tolist()):
            unique = np.append(unique, position)
    if len(unique) > ncandidates:
        code = index.code_scores(cs, unique)
        mine = code[int((unique == position).nonzero()[0][0])]
        if int((code > mine).sum()) >= ncandidates:
            return "stage 2b"
    return "kept"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="squad-dev", choices=("squad-dev", "nq-oracle", "squad-train"))
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
    if args.dataset == "squad-train":
        everything = _train_questions(vectors.pool, None, args.seed)
    else:
        everything = load_questions(args.dataset, vectors.pool)
    questions = sample(everything, args.limit, args.seed)
    judged = "squad-dev" if args.dataset == "squad-train" else args.dataset  # the same gold: the paragraph
    harness = Harness("pool", vectors.pool.texts, vectors.spans)
    encoded = encode_queries(vectors.encoder, [q.text for q in questions])
    alpha = vectors.encoder.settings.alpha
    hits, misses = 0, []
    for question, (q, s) in zip(tqdm(questions, desc="staged", disable=None), encoded):
        ranked = [int(h.passage_id) for h in index.search_vectors(q, None, "passage", 100)]
        if _hit(judged, harness, question, ranked):
            hits += 1
        else:
            misses.append((question, q, s))
    rows = []
    for question, q, s in tqdm(misses, desc="exhaustive", disable=None):
        order = torch.argsort(exhaustive_scores(index, q, s, alpha)[0], descending=True).tolist()
        rank = next((r for r, pid in enumerate(order[:DEPTH], 1) if _hit(judged, harness, question, [pid])),
                    None)
        row = {"question": question.text, "gold_rank_in_exhaustive_scan": rank}
        if rank is not None:
            row["lost_at"] = lost_at(index, q, order[rank - 1], *index.budgets("passage", 100))
        rows.append(row)
    recoverable = sum(1 for r in rows if r["gold_rank_in_exhaustive_scan"] and r["gold_rank_in_exhaustive_scan"] <= 100)
    n = len(questions)
    result = {"benchmark": "recall_misses", "dataset": args.dataset, "model": vectors.encoder.source,
              "residuals": index.store.codec.name, "settings": index.defaults._asdict(),
              "sample": {"questions": n, "of": len(everything), "seed": args.seed},
              "staged_r100": round(100 * hits / n, 2), "staged_misses": len(misses),
              "misses_in_exhaustive_top100": recoverable,
              "misses_below_exhaustive_100": len(misses) - recoverable,
              "recoverable_lost_at": {stage: sum(1 for r in rows if r.get("lost_at") == stage and
                                                 r["gold_rank_in_exhaustive_scan"] <= 100)
                                      for stage in ("stage 1", "stage 2a", "stage 2b", "kept")},
              "r100_with_the_search_misses_recovered": round(100 * (hits + recoverable) / n, 2),
              "depth_looked": DEPTH, "misses": rows,
              "note": "the recovered figure is an upper bound of the exhaustive scan's R@100: a question the staged "
                      "search finds could in principle fall below 100 in the scan (not checked)"}
    out = write_result(f"recall_misses-{args.dataset}", result, args.out, command_line("benchmarks.recall_misses", argv))
    print(json.dumps({k: v for k, v in result.items() if k not in ("misses", "machine")}, indent=1), "→", out)


if __name__ == "__main__":
    main()

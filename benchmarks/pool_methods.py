"""Which token clustering to pool an index with (issue 53, a design choice, on SQuAD *train* only).

    python -m benchmarks.pool_methods --factor 2 --limit 300

Ward agglomeration of a passage's token vectors under three connectivities, at one budget rule
(``max(sentences, ceil(n / factor))`` vectors of sentence tokens a passage, protected tokens kept):

- ``adjacent``: only neighbouring runs of one sentence merge (:mod:`agrame.pooling`: a vector is one
  run of tokens, so spans keep their character rule);
- ``sentence``: any two clusters of one sentence merge (non-contiguous clusters inside a sentence);
- ``passage``: any two clusters of the passage merge (Clavié et al. 2024, PyLate; a cluster may hold
  tokens of several sentences: it then counts in each of them, a superset).

Exact float scoring (no codec) re-ranks, for each question, its gold passage and the unpooled
index's next 20 passages, so the differences are the pooling's alone. Reported: passage P@1 and
sentence P@1 (the combined score S' + α·S), against unpooled on the same candidates.
"""

from __future__ import annotations

import argparse
import heapq
import math
import time
from typing import Dict, List

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame import scoring
from agrame.index import Index
from agrame.index.search import SearchSettings

from .common import command_line, write_result
from .data import load_pool
from .index_search import PoolVectors, _train_questions, build, encode_queries

METHODS = ("none", "adjacent", "sentence", "passage")


def ward_clusters(x: np.ndarray, seg: np.ndarray, factor: float, connect: str) -> List[List[int]]:
    """Clusters (token lists) by greedy Ward merges under ``connect``; protected tokens (seg −1) alone."""
    n = len(seg)
    inside = seg >= 0
    target = max(len(set(seg[inside].tolist())), math.ceil(int(inside.sum()) / factor)) if inside.any() else 0
    merges = int(inside.sum()) - target
    clusters: Dict[int, List[int]] = {i: [i] for i in range(n)}
    if connect == "none" or merges <= 0:
        return [clusters[i] for i in range(n)]
    sums = {i: x[i].astype(np.float64) for i in range(n)}

    def joinable(a: int, b: int) -> bool:
        if seg[a] < 0 or seg[b] < 0:
            return False
        if connect == "passage":
            return True
        if seg[a] != seg[b]:
            return False
        return connect == "sentence" or abs(clusters[a][-1] - clusters[b][0]) == 1 or abs(clusters[b][-1] - clusters[a][0]) == 1

    def cost(a: int, b: int) -> float:
        na, nb = len(clusters[a]), len(clusters[b])
        d = sums[a] / na - sums[b] / nb
        return na * nb / (na + nb) * float(d @ d)

    heap = [(cost(a, b), a, b, 1, 1) for a in range(n) for b in range(a + 1, n) if joinable(a, b)]
    heapq.heapify(heap)
    while merges and heap:
        _, a, b, na, nb = heapq.heappop(heap)
        if a not in clusters or b not in clusters or len(clusters[a]) != na or len(clusters[b]) != nb:
            continue
        if not joinable(a, b):
            continue
        clusters[a] = sorted(clusters[a] + clusters.pop(b))
        sums[a] = sums[a] + sums.pop(b)
        merges -= 1
        for c in clusters:
            if c != a and joinable(min(a, c), max(a, c)):
                lo, hi = min(a, c), max(a, c)
                heapq.heappush(heap, (cost(lo, hi), lo, hi, len(clusters[lo]), len(clusters[hi])))
    return [clusters[k] for k in sorted(clusters)]


def pooled_passage(vectors: torch.Tensor, seg: torch.Tensor, factor: float, method: str):
    """Pooled vectors and, per vector, the set of sentences (local ids) it counts in."""
    clusters = ward_clusters(vectors.float().numpy(), seg.numpy(), factor, method if method != "none" else "none")
    pooled = torch.nn.functional.normalize(torch.stack([vectors[c].float().mean(0) for c in clusters]), dim=-1)
    owners = [sorted({int(seg[t]) for t in c if int(seg[t]) >= 0}) for c in clusters]
    return pooled, owners


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factor", type=float, default=2)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--others", type=int, default=20, help="the unpooled index's passages re-ranked beside the gold")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pool = load_pool()
    vectors = PoolVectors(args.model, pool)
    encoder = vectors.encoder
    alpha = encoder.settings.alpha
    corpus = vectors.corpus()
    index = Index(build(vectors, 2)[0], model=encoder)
    questions = _train_questions(pool, args.limit, args.seed)
    encoded = encode_queries(encoder, [q.text for q in questions])
    settings = SearchSettings(index.defaults.nprobe, index.defaults.ncandidates, index.defaults.per_hit)
    sent_starts = np.concatenate([[0], np.cumsum([len(s) for s in vectors.spans])])
    cache: Dict[tuple, tuple] = {}
    wins = {m: {"psg_p1": [], "sent_p1": []} for m in args.methods}
    vectors_kept = {m: [0, 0] for m in args.methods}
    started = time.perf_counter()
    for k, q in enumerate(tqdm(questions, desc="questions", disable=None)):
        qv, sv = encoded[k]
        hits = index.search_vectors(qv, sv, "passage", args.others + 1, **settings._asdict())
        cands = [q.gold_passage] + [int(h.passage_id) for h in hits if int(h.passage_id) != q.gold_passage][:args.others]
        gold_sentence = None
        if q.answer_start is not None:
            spans = vectors.spans[q.gold_passage]
            gold_sentence = next((i for i, (a, b) in enumerate(spans) if a <= q.answer_start < b), None)
        for method in args.methods:
            best_p, best_s = None, None
            for p in cands:
                key = (method, p)
                if key not in cache:
                    sl = corpus.passage_tokens(p)
                    seg = corpus.token_sentence[sl] - int(sent_starts[p])
                    seg = torch.where(corpus.token_sentence[sl] >= 0, seg, torch.full_like(seg, -1))
                    seg = torch.where(corpus.offsets[sl, 1] > corpus.offsets[sl, 0], seg, torch.full_like(seg, -1))
                    cache[key] = pooled_passage(corpus.vectors[sl].float(), seg, args.factor, method) + (sl.stop - sl.start,)
                pooled, owners, n = cache[key]
                sim = scoring.similarity(qv, pooled)
                passage_score = float(sim.amax(-1).sum())
                ssim = scoring.similarity(sv, pooled)
                n_sent = len(vectors.spans[p])
                for s in range(n_sent):
                    cols = [j for j, o in enumerate(owners) if s in o]
                    if not cols:
                        continue
                    score = float(ssim[:, cols].amax(-1).sum()) + alpha * passage_score
                    if best_s is None or score > best_s[0]:
                        best_s = (score, p, s)
                if best_p is None or passage_score > best_p[0]:
                    best_p = (passage_score, p)
                if k == 0 or p == q.gold_passage:
                    vectors_kept[method][0] += len(pooled)
                    vectors_kept[method][1] += n
            wins[method]["psg_p1"].append(float(best_p[1] == q.gold_passage))
            if gold_sentence is not None:
                wins[method]["sent_p1"].append(float(best_s[1] == q.gold_passage and best_s[2] == gold_sentence))
    rows = {m: {"psg_p1": round(100 * float(np.mean(w["psg_p1"])), 2), "sent_p1": round(100 * float(np.mean(w["sent_p1"])), 2),
                "vectors_per_token": round(vectors_kept[m][0] / max(1, vectors_kept[m][1]), 3)} for m, w in wins.items()}
    result = {"benchmark": "pool_methods", "model": encoder.source, "fingerprint": encoder.fingerprint()[:12],
              "factor": args.factor,
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}); each re-ranks its "
                      f"gold passage and the unpooled 2-bit index's next {args.others}, exact float scores",
              "rows": rows, "seconds": round(time.perf_counter() - started, 1)}
    out = write_result(f"pool_methods-f{args.factor:g}", result, None, command_line("benchmarks.pool_methods", argv))
    print(rows, "→", out)


if __name__ == "__main__":
    main()

"""colbert-ai's PLAID beside AGRaME's compressed index, on the same corpus, vectors and queries.

    pip install -e ".[colbert]"
    python -m benchmarks.plaid --model squad-a1 --dataset nq-oracle [--limit N] [--kmeans-passages 4096]

A fair side by side (DESIGN.md, *Index at scale*): colbert-ai 0.2.22 indexes the pooled
corpus with **our** model and searches with **our** query vectors (``Searcher.dense_search``),
so only the index and its search differ:

- the model is written in the Stanford layout (BertConfig, ``bert.*`` + ``linear.weight``,
  ``artifact.metadata``) and loaded by colbert-ai's own ``Checkpoint``; its document
  encoding is compared with ours on a few passages (``parity``: each colbert-ai token's best
  cosine among ours);
- colbert-ai's indexer gets the *cached* token vectors of ``benchmarks.encodings`` (the
  vectors AGRaME's index was built from) instead of encoding the corpus twice on this CPU
  (k-means sample, then the corpus); everything else — centroid count (the same
  2^floor(log2(16·√T)) as ours), 4-iteration k-means, 2-bit residual codec, inverted file,
  PLAID's search stages and their default settings for k — is colbert-ai's, run in this
  process (``CollectionIndexer``; no launcher, no GPU);
- its k-means sample is capped at ``--kmeans-passages`` passages (default 4,096, ~490k
  token vectors, 30 per centroid): its own rule would take 16·√(120·N) passages, 96% of
  this corpus, and k-means over ~4M vectors does not fit a CPU session.

Reported: index bytes per token, passage P@1 / R@100 on the dataset, search-only latency per
query (median, p95; 2 threads) at k = 10 and k = 100, next to the AGRaME index rows of
``benchmarks.index_search`` for the same model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from agrame.index import Index, Store
from agrame.index.store import default_residuals

from .common import busy_beside, command_line, sample, write_result
from .data import load_questions
from .encodings import cache_root
from .index_search import PoolVectors, encode_queries
from .index_search import build as build_agrame, codec_arg
from .metrics import summarize
from .open_domain import judge
from .rerank import Harness


#: colbert-ai 0.2.22's ndocs for k ≤ 10 and k ≤ 100 (Searcher.dense_search); its last stage
#: decompresses and scores ndocs/4 passages exactly.
PLAID_NDOCS = {10: 256, 100: 1024}


def export_stanford(encoder, folder: Path) -> Path:
    """Write ``encoder`` as a Stanford ColBERT checkpoint that colbert-ai loads unchanged."""
    from colbert.infra import ColBERTConfig
    from safetensors.torch import save_file

    if encoder.projection is None:
        raise SystemExit("error: colbert-ai needs a model with a projection (e.g. --model squad-a1)")
    folder.mkdir(parents=True, exist_ok=True)
    state = {f"bert.{k}": v.contiguous() for k, v in encoder.backbone.state_dict().items()}
    state["linear.weight"] = encoder.projection.weight.detach().contiguous()
    save_file(state, str(folder / "model.safetensors"))
    config = encoder.backbone.config
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    s = encoder.settings
    ColBERTConfig(dim=encoder.dim, doc_maxlen=s.doc_maxlen, query_maxlen=s.query_maxlen,
                  mask_punctuation=s.mask_punctuation, attend_to_mask_tokens=s.attend_to_mask_tokens,
                  query_token_id=s.markers["Q"] or "[unused0]", doc_token_id=s.markers["D"] or "[unused1]",
                  similarity="cosine").save_for_checkpoint(str(folder))
    return folder


class CachedVectors:
    """Stands in for colbert-ai's ``CollectionEncoder``: the pool's cached token vectors by text."""

    def __init__(self, vectors: PoolVectors):
        self.corpus = vectors.corpus()
        self.position = {t: i for i, t in enumerate(vectors.pool.texts)}

    def encode_passages(self, passages: Sequence[str]):
        rows, doclens = [], []
        for text in passages:
            p = self.position[text]
            a, b = int(self.corpus.passage_starts[p]), int(self.corpus.passage_starts[p + 1])
            rows.append(self.corpus.vectors[a:b])
            doclens.append(b - a)
        return torch.cat(rows).float(), doclens


def parity(encoder, ckpt: Path, texts: Sequence[str]) -> dict:
    """colbert-ai's document vectors against AGRaME's for ``texts``: for every colbert-ai token, the
    cosine of its best match among our tokens of the same passage (MaxSim ignores token order, and
    the two order a passage's special tokens differently), and how many passages differ in token
    count (punctuation rules; passages longer than doc_maxlen, which colbert-ai truncates and
    AGRaME encodes in windows)."""
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    cp = Checkpoint(str(ckpt), colbert_config=ColBERTConfig.load_from_checkpoint(str(ckpt)), verbose=0)
    theirs, doclens = cp.docFromText(list(texts), bsize=8, keep_dims="flatten")
    ours = encoder.encode_passages(list(texts))
    best, differ, start = [], 0, 0
    for n, mine in zip(doclens, ours):
        differ += n != mine.vectors.shape[0]
        best.append((theirs[start:start + n].float() @ mine.vectors.float().T).max(dim=1).values)
        start += n
    best = torch.cat(best)
    return {"passages": len(texts), "token_count_differs": differ,
            "mean_best_cosine": round(float(best.mean()), 4), "min_best_cosine": round(float(best.min()), 4)}


def build_plaid(vectors: PoolVectors, ckpt: Path, index_dir: Path, kmeans_passages: int, seed: int) -> Dict:
    from colbert.indexing.collection_indexer import CollectionIndexer
    from colbert.infra import ColBERTConfig, Run, RunConfig

    if (index_dir / "metadata.json").exists():
        return json.loads((index_dir / "agrame-build.json").read_text())
    tmp = index_dir.with_name(index_dir.name + ".tmp")
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    texts = vectors.pool.texts

    def capped_sample(self):  # colbert-ai's rule would take 96% of this corpus (see the docstring)
        random.seed(seed)
        return set(random.sample(range(len(self.collection)), min(kmeans_passages, len(self.collection))))

    CollectionIndexer._sample_pids = capped_sample
    start = time.perf_counter()
    with Run().context(RunConfig(nranks=1, rank=0, experiment="agrame-plaid", root=str(tmp.parent))):
        config = ColBERTConfig.from_existing(ColBERTConfig.load_from_checkpoint(str(ckpt)),
                                             ColBERTConfig(nbits=2, kmeans_niters=4, checkpoint=str(ckpt),
                                                           index_path=str(tmp), avoid_fork_if_possible=True),
                                             Run().config)
        indexer = CollectionIndexer(config=config, collection=list(texts), verbose=1)
        indexer.encoder = CachedVectors(vectors)
        indexer.run(shared_lists=[])
    info = {"build_seconds_from_cached_vectors": round(time.perf_counter() - start, 1),
            "num_partitions": int(indexer.num_partitions), "kmeans_passages": kmeans_passages,
            "kmeans_niters": 4, "nbits": 2}
    (tmp / "agrame-build.json").write_text(json.dumps(info))
    tmp.replace(index_dir)
    return info


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "agrame-build.json")


def plaid_search(searcher):
    """colbert-ai's search at its own defaults for k, on our query vectors: the ranked passage positions."""
    def plaid(q: torch.Tensor, k: int) -> List[int]:
        pids, _, _ = searcher.dense_search(q.unsqueeze(0).float(), k=k)
        return [int(p) for p in pids]
    return plaid


#: Written before the rows were measured (issue 64): top 100's exact-scoring budget is the smallest per_hit
#: (a search scores max(ncandidates, per_hit × k) passages exactly) whose top 100 agree with the model's float16
#: exhaustive scan at least as well as PLAID's do, on the same SQuAD *train* questions and vectors.
CHOOSE_RULE = ("per_hit: the smallest of PER_HITS whose mean top-100 overlap with the float16 exhaustive scan, on "
               "300 SQuAD train questions, is at least PLAID's (colbert-ai's defaults for k = 100)")
PER_HITS = (1, 2, 3, 4, 5)


def choose_budget(args, vectors: PoolVectors, ours: Index, plaid) -> None:
    from .index_search import PASSAGE_K, _overlap, _train_questions, float16_rankings, store_with_model

    encoder = vectors.encoder
    questions = _train_questions(vectors.pool, 300, args.seed)
    encoded = encode_queries(encoder, [q.text for q in questions])
    exact = float16_rankings(vectors, questions, encoded, encoder.settings.alpha, 300, args.seed)
    systems = {"plaid": lambda q: plaid(q, PASSAGE_K)}
    for per_hit in PER_HITS:
        systems[f"per_hit {per_hit}"] = (lambda ph: lambda q: [int(h.passage_id) for h in ours.search_vectors(
            q, None, "passage", PASSAGE_K, per_hit=ph)])(per_hit)
    overlap: Dict[str, List[float]] = {name: [] for name in systems}
    ms: Dict[str, List[float]] = {name: [] for name in systems}
    for q, (qv, _) in zip(tqdm(questions, desc="choose top 100's budget", disable=None), encoded):
        for name, search in systems.items():  # alternately: the same machine state for all
            t = time.perf_counter()
            ranked = search(qv)
            ms[name].append(1000 * (time.perf_counter() - t))
            overlap[name].append(_overlap(ranked, exact[q.qid]["passages"]))
    rows = {name: {"top100_overlap_vs_float16": round(100 * statistics.fmean(overlap[name]), 2),
                   "median_ms": round(statistics.median(ms[name]), 1)} for name in systems}
    bar = rows["plaid"]["top100_overlap_vs_float16"]
    ok = [ph for ph in PER_HITS if rows[f"per_hit {ph}"]["top100_overlap_vs_float16"] >= bar]
    chosen = min(ok) if ok else None
    result = {"benchmark": "plaid-budget", "what": "choose top 100's exact-scoring budget", "model": encoder.source,
              "fingerprint": encoder.fingerprint()[:12], "threads": args.threads,
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}) over the pool",
              "rule": CHOOSE_RULE, "rows": rows, "chosen_per_hit": chosen,
              "settings_before": dict(ours.defaults._asdict())}
    path = write_result(f"plaid-choose-budget-{encoder.fingerprint()[:12]}", result, args.out,
                        command_line("benchmarks.plaid", args.argv))
    print(json.dumps(rows), f"chosen per_hit: {chosen}", "→", path)
    if args.store and chosen is not None:
        search = {**dict(ours.defaults._asdict()), "per_hit": chosen}
        print(f"stored with the model: {store_with_model(args.model, 'search', search)}")


#: Written 2026-12-02 before its rows were measured (issue 64: R@100 ≥ PLAID's at ≤ its latency). The budget above
#: matched PLAID's agreement with the float16 scan, yet squad-dev's R@100 fell one question short of PLAID's; on
#: SQuAD train the search's recoverable misses are lost at stages 2a–2b (``benchmarks.recall_misses --dataset
#: squad-train``). This rule asks for the issue's own bar on SQuAD *train* and spends the latency the bar leaves on
#: recall, keeping a margin for a loaded machine (the issue lets the ratio move by 0.2 under load).
RECALL_RULE = ("top 100's budget: every setting of RECALL_GRID and PLAID (colbert-ai's defaults for k = 100) search "
               "2,000 SQuAD train questions (one per paragraph, seed 0) in turn, on the same query vectors; of the "
               "settings whose median top-100 latency is at most 0.9 × PLAID's, the one with the highest gold R@100, "
               "ties to the lower median latency; it must also reach PLAID's R@100, or today's settings stay")
#: (nprobe, per_hit, prune factor) — today's (8, 3, 4) first; stage 2a keeps prune factor × ncandidates.
RECALL_GRID = ((8, 3, 4), (8, 4, 4), (8, 5, 4), (8, 6, 4), (12, 3, 4), (8, 3, 8))
#: the share of PLAID's median top-100 latency a chosen setting may take
RECALL_LATENCY_MARGIN = 0.9


def _recall_name(setting) -> str:
    return "nprobe {} · per_hit {} · prune {}".format(*setting)


def choose_recall(args, vectors: PoolVectors, ours: Index, plaid) -> None:
    from agrame.index import search as staged

    from .index_search import PASSAGE_K, _train_questions, store_with_model

    encoder = vectors.encoder
    questions = _train_questions(vectors.pool, args.limit or 2000, args.seed)
    encoded = encode_queries(encoder, [q.text for q in questions])
    harness = Harness("pool", vectors.pool.texts, vectors.spans)

    def ours_with(nprobe: int, per_hit: int, prune: int):
        def search(q):
            staged.PRUNE_FACTOR = prune  # the module's constant, read at each call (restored below)
            return [int(h.passage_id) for h in ours.search_vectors(q, None, "passage", PASSAGE_K, nprobe=nprobe,
                                                                    per_hit=per_hit)]
        return search

    systems = {"plaid": lambda q: plaid(q, PASSAGE_K)}
    systems.update({_recall_name(setting): ours_with(*setting) for setting in RECALL_GRID})
    found: Dict[str, int] = {name: 0 for name in systems}
    ms: Dict[str, List[float]] = {name: [] for name in systems}
    before = staged.PRUNE_FACTOR
    plaid(encoded[0][0], PASSAGE_K)  # compiles colbert-ai's C++ extensions outside the timings
    try:
        with busy_beside(args.beside) as load_job:
            for q, (qv, _) in zip(tqdm(questions, desc="choose top 100's recall budget", disable=None), encoded):
                for name, search in systems.items():  # alternately: the same machine state for all
                    t = time.perf_counter()
                    ranked = search(qv)
                    ms[name].append(1000 * (time.perf_counter() - t))
                    found[name] += int(judge("squad-dev", harness, q, ranked, [], ranked)["first_stage_r100"])
    finally:
        staged.PRUNE_FACTOR = before
    rows = {name: {"r100": round(100 * found[name] / len(questions), 2), "found": found[name],
                   "median_ms": round(statistics.median(ms[name]), 2)} for name in systems}
    bar = rows["plaid"]
    fast = [s for s in RECALL_GRID if rows[_recall_name(s)]["median_ms"] <= RECALL_LATENCY_MARGIN * bar["median_ms"]]
    best = min(fast, key=lambda s: (-rows[_recall_name(s)]["found"], rows[_recall_name(s)]["median_ms"]), default=None)
    chosen = best if best is not None and rows[_recall_name(best)]["found"] >= bar["found"] else None
    result = {"benchmark": "plaid-recall", "what": "choose top 100's candidate budget for R@100",
              "model": encoder.source, "fingerprint": encoder.fingerprint()[:12], "threads": args.threads,
              "beside": load_job or "nothing",
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}) over the pool",
              "rule": RECALL_RULE, "latency_margin": RECALL_LATENCY_MARGIN, "rows": rows,
              "chosen": None if chosen is None else dict(zip(("nprobe", "per_hit", "prune_factor"), chosen)),
              "settings_before": {**dict(ours.defaults._asdict()), "prune_factor": before}}
    path = write_result(f"plaid-choose-recall-{encoder.fingerprint()[:12]}" + (f"-beside{args.beside}" if args.beside else ""),
                        result, args.out, command_line("benchmarks.plaid", args.argv))
    print(json.dumps(rows, indent=1), f"chosen: {result['chosen']}", "→", path)
    if args.store and chosen is not None:
        if chosen[2] != before:
            raise SystemExit(f"error: the chosen prune factor {chosen[2]} is not a stored setting (the search's is {before})")
        search = {**dict(ours.defaults._asdict()), "nprobe": chosen[0], "per_hit": chosen[1]}
        print(f"stored with the model: {store_with_model(args.model, 'search', search)}")


def time_systems(systems, questions, encoded, ours: Index, harness, args):
    """Every question through every system, alternately (the same machine state for all): per-question metrics,
    search ms at k = 100 (every question) and k = 10 (the first ``--latency-queries``), AGRaME's sentence top 10."""
    per_question: Dict[str, list] = {name: [] for name in systems}
    times: Dict[str, Dict[int, List[float]]] = {name: {10: [], 100: []} for name in systems}
    sentence_ms: List[float] = []  # AGRaME's sentence top 10 (the "sentence k = 10 ≤ PLAID ÷ 2")
    for n, (q, (qv, sv)) in enumerate(tqdm(list(zip(questions, encoded)), desc=f"{args.dataset}", disable=None)):
        for name, search in systems.items():  # alternately, so both see the same machine state
            t = time.perf_counter()
            ranked = search(qv, 100)
            times[name][100].append(1000 * (time.perf_counter() - t))
            metrics = judge(args.dataset, harness, q, ranked, [], ranked)
            metrics["psg_r100"] = metrics.pop("first_stage_r100")
            per_question[name].append({k: v for k, v in metrics.items() if k.startswith("psg")})
            if n < args.latency_queries:
                t = time.perf_counter()
                search(qv, 10)
                times[name][10].append(1000 * (time.perf_counter() - t))
        if n < args.latency_queries:
            t = time.perf_counter()
            ours.search_vectors(qv, sv, "sentence", 10)
            sentence_ms.append(1000 * (time.perf_counter() - t))
    return per_question, times, sentence_ms


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="squad-a1", help="a model with a projection (colbert-ai needs one)")
    parser.add_argument("--dataset", default="nq-oracle", choices=("nq-oracle", "squad-dev"))
    parser.add_argument("--limit", type=int, default=None, help="questions sampled (default: all)")
    parser.add_argument("--latency-queries", type=int, default=300)
    parser.add_argument("--kmeans-passages", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--tag", default=None, help="label of the model, kept in the result file name (e.g. zeroshot-128)")
    parser.add_argument("--beside", type=int, default=0, metavar="THREADS",
                        help="time the searches with a second job of THREADS threads beside them (issue 64: the "
                             "ratio to PLAID on a loaded machine; default 0: nothing beside)")
    parser.add_argument("--per-hit", type=int, default=None,
                        help="the AGRaME row's per_hit (default: the index's, as the model's settings built it)")
    parser.add_argument("--nbits", type=codec_arg, default=None,
                        help="the AGRaME index's residual codec (2, pq16x6, …; default: the model's own)")
    parser.add_argument("--choose-budget", action="store_true",
                        help="instead of a dataset's rows: choose top 100's per_hit on SQuAD *train* beside PLAID "
                             "on the same questions, by the rule written down before (CHOOSE_RULE in this file)")
    parser.add_argument("--choose-recall", action="store_true",
                        help="instead of a dataset's rows: choose top 100's candidate budget (nprobe, per_hit, prune "
                             "factor) on SQuAD *train* beside PLAID by gold R@100 and latency (RECALL_RULE in this file)")
    parser.add_argument("--store", action="store_true",
                        help="with --choose-budget / --choose-recall: write the choice into the shipped model's settings")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    if args.choose_budget and args.choose_recall:
        parser.error("--choose-budget and --choose-recall are two runs: give one")
    args.argv = list(argv if argv is not None else os.sys.argv[1:])
    import importlib.util

    if importlib.util.find_spec("colbert") is None:
        raise SystemExit('error: colbert-ai is not installed: pip install -e ".[colbert]"')
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_root() / "torch-extensions"))
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    tag = encoder.fingerprint()[:12]
    ckpt = export_stanford(encoder, cache_root() / f"stanford-{tag}")
    agree = parity(encoder, ckpt, vectors.pool.texts[:64])
    index_dir = cache_root() / f"plaid-pool-{tag}-2b-k{args.kmeans_passages}"
    info = build_plaid(vectors, ckpt, index_dir, args.kmeans_passages, args.seed)
    tokens = vectors.corpus().num_tokens
    size = folder_bytes(index_dir)

    from colbert import Searcher
    from colbert.infra import ColBERTConfig

    searcher = Searcher(index=str(index_dir), checkpoint=str(ckpt), collection=list(vectors.pool.texts),
                        config=ColBERTConfig(load_index_with_mmap=False), verbose=0)
    args.nbits = default_residuals(encoder, args.nbits)
    ours_path, _ = build_agrame(vectors, args.nbits)
    vectors._corpus = None
    ours = Index(ours_path, model=encoder)
    if args.choose_budget:
        return choose_budget(args, vectors, ours, plaid_search(searcher))
    if args.choose_recall:
        return choose_recall(args, vectors, ours, plaid_search(searcher))
    dataset_rows(args, vectors, ours, ours_path, plaid_search(searcher), {**info, "index_bytes": size}, agree, tokens)


def dataset_rows(args, vectors: PoolVectors, ours: Index, ours_path: Path, plaid, info: dict, agree, tokens: int) -> None:
    """The side by side on ``args.dataset``: PLAID (``info``: its build and ``index_bytes``; ``agree``: the model's
    parity in colbert-ai), AGRaME at its budget and at PLAID's, every question."""
    encoder = vectors.encoder
    tag = encoder.fingerprint()[:12]
    all_questions = load_questions(args.dataset, vectors.pool)
    questions = sample(all_questions, args.limit, args.seed)
    harness = Harness("pool", vectors.pool.texts, vectors.spans)
    encoded = encode_queries(encoder, [q.text for q in questions])

    def agrame(q: torch.Tensor, k: int) -> List[int]:
        return [int(h.passage_id) for h in ours.search_vectors(q, None, "passage", k, per_hit=args.per_hit)]

    def agrame_matched(q: torch.Tensor, k: int) -> List[int]:
        # PLAID's exact-scoring budget: it decompresses ndocs/4 passages (64 at k=10, 256 at k=100).
        budget = PLAID_NDOCS[k] // 4
        return [int(h.passage_id) for h in ours.search_vectors(q, None, "passage", k, ncandidates=budget,
                                                                per_hit=1)]

    systems = {"plaid": plaid, "agrame": agrame, "agrame-matched": agrame_matched}
    plaid(encoded[0][0], 100)  # compiles colbert-ai's C++ extensions outside the timings
    with busy_beside(args.beside) as load_job:  # (nothing beside by default)
        per_question, times, sentence_ms = time_systems(systems, questions, encoded, ours, harness, args)

    def stats(ms: List[float]) -> dict:
        return {"median": round(statistics.median(ms), 1), "p95": round(float(np.percentile(ms, 95)), 1),
                "queries": len(ms)}

    ours_size = Store(ours_path).bytes()
    result = {"benchmark": "plaid", "dataset": args.dataset, "model": encoder.source, "fingerprint": tag,
              "colbert_ai": "0.2.22", "parity": agree, "tokens": tokens, "threads": args.threads,
              "beside": load_job or "nothing (the machine's load is recorded under machine.load)",
              "sample": {"questions": len(questions), "of": len(all_questions),
                         "seed": args.seed if args.limit else None},
              "systems": {
                  "plaid": {**info, "bytes_per_token": round(info["index_bytes"] / tokens, 2),
                            "metrics": summarize(per_question["plaid"]),
                            "search_ms_k10": stats(times["plaid"][10]), "search_ms_k100": stats(times["plaid"][100]),
                            "settings": "colbert-ai's defaults per k (k=10: ncells 1, threshold 0.5, ndocs 256; "
                                        "k=100: ncells 2, 0.45, 1024)"},
                  "agrame-matched": {"index_bytes": ours_size, "bytes_per_token": round(ours_size / tokens, 2),
                                     "metrics": summarize(per_question["agrame-matched"]),
                                     "search_ms_k10": stats(times["agrame-matched"][10]),
                                     "search_ms_k100": stats(times["agrame-matched"][100]),
                                     "settings": {"nprobe": ours.defaults.nprobe,
                                                  "ncandidates": {k: v // 4 for k, v in PLAID_NDOCS.items()},
                                                  "why": "PLAID's number of exactly scored passages (ndocs/4)"}},
                  "agrame": {"index_bytes": ours_size, "bytes_per_token": round(ours_size / tokens, 2),
                             "metrics": summarize(per_question["agrame"]),
                             "search_ms_k10": stats(times["agrame"][10]), "search_ms_k100": stats(times["agrame"][100]),
                             "sentence_search_ms_k10": stats(sentence_ms),
                             "settings": {**ours.defaults._asdict(),
                                          **({"per_hit": args.per_hit} if args.per_hit else {})},
                             "num_centroids": ours.store.codec.num_centroids,
                             "residuals": ours.store.codec.name}},
              "note": "search only: query vectors encoded beforehand by AGRaME ([Q], no [MASK] padding) and given "
                      "to both; passage granularity; index bytes exclude the passage text (AGRaME's passages.jsonl, "
                      "colbert-ai keeps none); colbert-ai's build ran on cached vectors, its time beside other jobs"}
    name = f"plaid-{args.dataset}" + (f"-s{args.limit}" if args.limit else "") + (f"-{args.tag}" if args.tag else "") \
        + (f"-{ours.store.codec.name}" if ours.store.codec.name != "2bit" else "") \
        + (f"-beside{args.beside}" if args.beside else "")
    path = write_result(name, result, args.out, command_line("benchmarks.plaid", args.argv))
    print(json.dumps({k: {m: v[m] for m in ("bytes_per_token", "metrics", "search_ms_k10", "search_ms_k100")}
                      for k, v in result["systems"].items()}), "→", path)


if __name__ == "__main__":
    main()

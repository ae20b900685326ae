"""Scale-out: a Ray build against the local one, sharded search against the single index, and a
two-node Ray cluster simulated on this machine.

    python -m benchmarks.scale_out build [--passages N]     # local vs Ray with 1 and 2 workers, one codec
    python -m benchmarks.scale_out search --limit 100       # S = 1, 2, 4, 8 shards of the pool index
    python -m benchmarks.scale_out cluster --passages 400   # head + second raylet, shards pinned to each

``build`` encodes the first N passages of the pooled corpus (all by default) with the default model
three times — local (``build_compressed``, torch on every core), Ray with 1 worker (all cores),
Ray with 2 workers (one core each) — with one codec trained once beforehand, and checks that the
three indexes hold the same bytes. ``search`` splits the pool index (its codec, the pool's cached
vectors: no encoding) into S shards and compares, on SQuAD dev questions, each sharded index with
the single index: exact mode (every passage scored) must give the identical top-k; staged mode's
top-1 sentence and top-100 passages are compared with the single index's exhaustive scan.
Latency: query encoding excluded, the shards' stages 1–2 in the calling thread and the exact stage on every
thread (2 cores here), each index timed after one untimed pass over the queries, every index's search of a
query one after another (a rotating order).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame.corpus import Passage
from agrame.index import Index, read_manifest
from agrame.index.sharded import (FORMAT_SHARDED, ShardedIndex, shard_name, shard_of, write_shards_manifest)
from agrame.index.store import train_codec
from agrame.index.writer import build_compressed

from .common import command_line, machine, sample, write_result
from .data import load_questions
from .encodings import cache_root
from .index_search import PoolVectors, build, encode_queries, exhaustive_scores
from .lifecycle import _sentence_id, _Subset

SHARD_COUNTS = (1, 2, 4, 8)
PASSAGE_K, SENTENCE_K = 100, 10
SAME_BYTES = ("codes.bin", "residuals.bin", "doclens.bin", "sentcounts.bin", "sentences.bin", "sentence_tokens.bin",
              "passages.jsonl", "passage_offsets.bin", "ivf-1.offsets.bin", "ivf-1.pids.bin")


def _pct(xs, p) -> float:
    return round(float(np.percentile(xs, p)), 1)


def _same(a: Path, b: Path) -> bool:
    """The same bytes in every file both stores have (an index since 2026-12-01 has no ivf-1 files: its
    lists are derived from the codes compared here)."""
    names = [n for n in SAME_BYTES if (a / n).exists() or (b / n).exists()]
    return all((a / n).exists() and (b / n).exists() and (a / n).read_bytes() == (b / n).read_bytes() for n in names)


# -- build ----------------------------------------------------------------------------------------


def cmd_build(args) -> None:
    from agrame.loading import load_encoder
    from agrame.index.distributed import build_with_ray, connect

    vectors = PoolVectors(args.model)
    texts = vectors.pool.texts[:args.passages] if args.passages else vectors.pool.texts
    passages = [Passage(str(i), t) for i, t in enumerate(texts)]
    encoder = load_encoder(args.model)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    codec, _, codec_info = train_codec(encoder, passages, 2)
    codec_seconds = time.perf_counter() - t0
    root = Path(tempfile.mkdtemp(prefix="scale-out-build-", dir=args.work))
    runs: Dict[str, dict] = {}
    try:
        t0 = time.perf_counter()
        build_compressed(encoder, passages, root / "local", codec=codec, batch_size=args.batch_size)
        runs["local"] = {"seconds": time.perf_counter() - t0, "torch_threads": args.threads}
        t0 = time.perf_counter()
        ray = connect(None, num_cpus=args.threads)
        runs["ray_start_seconds"] = time.perf_counter() - t0
        for workers in (1, 2):
            t0 = time.perf_counter()
            build_with_ray(args.model, passages, root / f"ray{workers}", workers=workers, codec=codec,
                           batch_size=args.batch_size)
            runs[f"ray_{workers}_workers"] = {"seconds": time.perf_counter() - t0, **build_with_ray.last_stats}
        ray.shutdown()
        same = {f"ray_{w}_workers": _same(root / "local", root / f"ray{w}") for w in (1, 2)}
        tokens = read_manifest(root / "local")["num_tokens"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    local = runs["local"]["seconds"]
    for name, run in runs.items():
        if isinstance(run, dict):
            run["passages_per_second"] = round(len(passages) / run["seconds"], 1)
            run["time_vs_local"] = round(run["seconds"] / local, 3)
            run["seconds"] = round(run["seconds"], 1)
    result = {"benchmark": "scale_out", "what": "build: local vs Ray (Ray Data actor pool), one codec",
              "corpus": "pooled corpus (benchmarks.data), first N passages", "passages": len(passages),
              "tokens": tokens, "model": encoder.source, "nbits": 2, "batch_size": args.batch_size,
              "codec_training_seconds_excluded": round(codec_seconds, 1), "codec": codec_info,
              "ray_start_seconds": round(runs.pop("ray_start_seconds"), 1), "runs": runs,
              "identical_bytes_to_local": same, "machine": machine()}
    out = write_result("scale_out-build", result, args.out, command_line("benchmarks.scale_out", ["build", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


# -- sharded search -------------------------------------------------------------------------------


def _same_codec_and_budgets(sharded: Path, base: Path) -> bool:
    """Whether a cached sharded index still holds the single index's codec and search budgets: the cache is
    named by the model's weights, and ``build`` rebuilds the single index when the model's budgets change
    (issue 64), so shards kept from before would compare another codec or budget with it."""
    want = read_manifest(base)
    for name in json.loads((sharded / "shards.json").read_text())["shards"]:
        shard = read_manifest(sharded / name)
        if shard.get("search") != want.get("search") or any(
                shard["files"].get(f) != want["files"].get(f) for f in ("centroids.f16", "buckets.f32")):
            return False
    return True


def sharded_pool(vectors: PoolVectors, shards: int) -> Path:
    """The pool index split into ``shards`` shards (its codec, the cached vectors), cached."""
    base, _ = build(vectors, 2)
    path = cache_root() / f"{base.name}-sharded{shards}"
    if path.exists() and _same_codec_and_budgets(path, base):
        return path
    shutil.rmtree(path, ignore_errors=True)
    codec = Index(base, model=vectors.encoder).store.codec
    corpus = vectors.corpus()
    tmp = path.parent / f".{path.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    routed = np.array([shard_of(str(i), shards) for i in range(len(corpus))])
    names = []
    for s in range(shards):
        keep = np.flatnonzero(routed == s)
        passages = [Passage(str(i), vectors.pool.texts[i]) for i in keep]
        build_compressed(vectors.encoder, passages, tmp / shard_name(s), codec=codec, encoded=_Subset(corpus, keep),
                         sentences=[vectors.spans[i] for i in keep])
        names.append(shard_name(s))
    write_shards_manifest(tmp, {"format": FORMAT_SHARDED, "num_shards": shards, "shards": names,
                                "routing": "blake2b-64(utf-8 id) mod num_shards",
                                "model": read_manifest(base)["model"], "num_passages": len(corpus)})
    tmp.rename(path)
    return path


def _key(hits) -> List[tuple]:
    return [(h.passage_id, h.start, h.end, h.score) for h in hits]  # strict: the float itself


def _warm(index, queries, granularity: str, top_k: int) -> None:
    """One untimed pass: every index is timed with its files mapped in, as a running server's are (the
    single index's were by the exhaustive reference; the shards', never touched before, were not)."""
    for q, s in queries:
        index.search_vectors(q, s, granularity, top_k)


def cmd_search(args) -> None:
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    single = Index(build(vectors, 2)[0], model=vectors.encoder)
    alpha = vectors.encoder.settings.alpha
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    queries = encode_queries(vectors.encoder, [q.text for q in questions])
    exact_queries = queries[:args.exact_limit]
    refs = []
    for q, s in tqdm(queries, desc="exhaustive reference", disable=None):
        p_scores, s_scores = exhaustive_scores(single, q, s, alpha)
        refs.append((int(torch.argmax(s_scores)), torch.topk(p_scores, PASSAGE_K).indices.tolist()))
    single_exact = [{g: _key(single.search_vectors(q, s, g, k, exact=True))
                     for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K))} for q, s in exact_queries]
    indexes = {f"S={shards}": ShardedIndex(sharded_pool(vectors, shards), model=vectors.encoder, threads=args.threads)
               for shards in SHARD_COUNTS}
    timed = {"single": single, **indexes}
    ms = {(name, g): [] for name in timed for g in ("sentence", "passage")}
    rows = {name: {} for name in indexes}
    for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K)):
        for index in timed.values():
            _warm(index, queries, g, k)
        agree = {name: [] for name in indexes}
        names = list(timed)
        # Interleaved, each query's searches in a rotating order: every index meets the same moments of the
        # machine (timed in blocks, one index after another, S = 1 — the single index's own search — read
        # 1.03× and 1.16× of it in two runs).
        for j, ((q, s), (top_sentence, top_passages)) in enumerate(zip(tqdm(queries, desc=g, disable=None), refs)):
            for name in names[j % len(names):] + names[:j % len(names)]:
                t0 = time.perf_counter()
                hits = timed[name].search_vectors(q, s, g, k)
                ms[name, g].append(1000 * (time.perf_counter() - t0))
                if name == "single":
                    continue
                if g == "sentence":
                    agree[name].append(bool(hits) and _sentence_id(single, hits[0]) == top_sentence)
                else:
                    agree[name].append(len({int(h.passage_id) for h in hits} & set(top_passages)) / PASSAGE_K)
        for name, index in indexes.items():
            exact_same = sum(_key(index.search_vectors(q, s, g, k, exact=True)) == want[g]
                             for (q, s), want in zip(exact_queries, single_exact))
            times = ms[name, g]
            rows[name][g] = {"top_k": k, "ms_median": _pct(times, 50), "ms_p95": _pct(times, 95),
                             "ratio_to_single": round(_pct(times, 50) / _pct(ms["single", g], 50), 2),
                             "exact_mode_identical_top_k": f"{exact_same}/{len(exact_queries)}"}
            key = "staged_same_top1_sentence_as_exhaustive" if g == "sentence" else "staged_top100_overlap_with_exhaustive"
            rows[name][g][key] = round(float(np.mean(agree[name])), 4)
    for index in indexes.values():
        index.close()
    single_ms = {g: {"ms_median": _pct(ms["single", g], 50), "ms_p95": _pct(ms["single", g], 95)}
                 for g in ("sentence", "passage")}
    result = {"benchmark": "scale_out", "what": "sharded search vs the single pool index",
              "corpus": "pooled corpus", "passages": len(single), "model": vectors.encoder.source, "nbits": 2,
              "search": single.defaults._asdict(),  # the shards' too: built with the same model (sharded_pool)
              "queries": f"{len(queries)} squad-dev questions (seed {args.seed}); exact-mode check on the first "
                         f"{len(exact_queries)}", "threads": args.threads,
              "timing": "after one untimed pass over the queries per index and granularity; every index's search "
                        "of a query run one after another, in an order that rotates with the query",
              "single_index": single_ms, "sharded": rows, "machine": machine()}
    out = write_result("scale_out-search", result, args.out, command_line("benchmarks.scale_out", ["search", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def same_up_to_ties(a, b, tol: float = 1e-4) -> bool:
    """Two rankings with the same score at every rank (within ``tol``): their ids differ only where
    scores tie (two threads sum a MaxSim's terms in an order that varies, ~1e-6 apart: ties swap)."""
    return len(a) == len(b) and all(abs(x.score - y.score) <= tol for x, y in zip(a, b))


def cmd_exact(args) -> None:
    """Exact mode of S shards against the single index, strictly and up to float ties."""
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    single = Index(build(vectors, 2)[0], model=vectors.encoder)
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    queries = encode_queries(vectors.encoder, [q.text for q in questions])
    runs = {g: [single.search_vectors(q, s, g, k, exact=True) for q, s in queries]
            for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K))}
    again = {g: [single.search_vectors(q, s, g, k, exact=True) for q, s in queries]
             for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K))}
    rows = {"single index run twice": {g: {"strictly_identical": sum(_key(a) == _key(b) for a, b in zip(runs[g], again[g])),
                                           "identical_up_to_ties": sum(same_up_to_ties(a, b) for a, b in zip(runs[g], again[g]))}
                                       for g in runs}}
    for shards in SHARD_COUNTS[1:]:
        index = ShardedIndex(sharded_pool(vectors, shards), model=vectors.encoder, threads=args.threads)
        row = {}
        for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K)):
            got = [index.search_vectors(q, s, g, k, exact=True) for q, s in queries]
            diffs = [abs(x.score - y.score) for a, b in zip(got, runs[g]) for x, y in zip(a, b)]
            row[g] = {"strictly_identical": sum(_key(a) == _key(b) for a, b in zip(got, runs[g])),
                      "identical_up_to_ties": sum(same_up_to_ties(a, b) for a, b in zip(got, runs[g])),
                      "max_score_difference_at_a_rank": float(max(diffs))}
        rows[f"S={shards}"] = row
        index.close()
    result = {"benchmark": "scale_out", "what": "exact mode: sharded vs single, strictly and up to float ties",
              "passages": len(single), "model": vectors.encoder.source, "threads": args.threads,
              "queries": f"{len(queries)} squad-dev questions (seed {args.seed})", "tie_tolerance": 1e-4, "rows": rows}
    out = write_result("scale_out-exact", result, args.out, command_line("benchmarks.scale_out", ["exact", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


# -- two nodes on one machine ---------------------------------------------------------------------


def cmd_cluster(args) -> None:
    """A Ray head and a second raylet (each 1 CPU and a custom resource naming it): the Ray build's
    actors run on both; a 2-shard index's actors are pinned one per node."""
    import ray
    from ray.cluster_utils import Cluster

    from agrame.loading import load_encoder
    from agrame.index.distributed import WORKER_ENV, RayShardedIndex, build_with_ray
    from agrame.index.sharded import build_sharded

    vectors = PoolVectors(args.model)
    passages = [Passage(str(i), t) for i, t in enumerate(vectors.pool.texts[:args.passages])]
    encoder = load_encoder(args.model)
    codec, _, _ = train_codec(encoder, passages, 2)
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    root = Path(tempfile.mkdtemp(prefix="scale-out-cluster-", dir=args.work))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node-a": 1}})
    cluster.add_node(num_cpus=1, resources={"node-b": 1})
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, runtime_env={"env_vars": dict(WORKER_ENV)}, log_to_driver=False)
        nodes = [n["NodeID"][:8] for n in ray.nodes() if n["Alive"]]
        t0 = time.perf_counter()
        build_with_ray(args.model, passages, root / "ray", workers=2, codec=codec, block_passages=args.block,
                       shards=2)
        ray_build = time.perf_counter() - t0
        build_sharded(encoder, passages, root / "local", 2, codec=codec, chunk_passages=args.block)
        same_bytes = all(_same(root / "ray" / shard_name(s), root / "local" / shard_name(s)) for s in range(2))
        remote = RayShardedIndex(root / "ray", placement=[{"node-a": 0.01}, {"node-b": 0.01}])
        where = [r["node"][:8] for r in ray.get([a.ready.remote() for a in remote.actors])]
        local = ShardedIndex(root / "local", model=encoder)
        same, ms = {"sentence": 0, "passage": 0}, []
        for q in questions:
            for g, k in (("sentence", SENTENCE_K), ("passage", PASSAGE_K)):
                t0 = time.perf_counter()
                got = remote.search(q.text, g, top_k=k)
                ms.append(1000 * (time.perf_counter() - t0))
                same[g] += _key(got) == _key(local.search(q.text, g, top_k=k))
        remote.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    result = {"benchmark": "scale_out", "what": "two raylets on one machine (1 CPU each), shards pinned one per node",
              "passages": len(passages), "model": encoder.source, "nodes": len(nodes),
              "shard_actor_nodes": where, "shard_actors_on_distinct_nodes": len(set(where)) == 2, "ray_build_seconds_2_workers": round(ray_build, 1),
              "build_identical_bytes_to_local": same_bytes,
              "queries": f"{len(questions)} squad-dev questions (seed {args.seed})",
              "search_same_as_local": {g: f"{n}/{len(questions)}" for g, n in same.items()},
              "search_ms_median_incl_query_encoding": _pct(ms, 50), "machine": machine()}
    out = write_result("scale_out-cluster", result, args.out,
                       command_line("benchmarks.scale_out", ["cluster", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


class TextSeededVectors:
    """A stand-in encoder for scale runs: one token per whitespace-separated word, vectors drawn
    around 3 of 4,096 topic directions (σ = 0.08 per dimension, as ``index_search.SyntheticSource``),
    seeded by the text — so any process (a Ray actor) makes the same vectors for the same passage."""

    source = "synthetic-text-seeded"
    topics = 4096

    def __init__(self, dim: int = 128, seed: int = 0):
        from agrame.encoder import EncoderSettings

        self.dim = dim
        self.settings = EncoderSettings(dim=dim)
        self.centers = _unit(np.random.default_rng(seed).normal(size=(self.topics, dim))).astype(np.float32)

    def fingerprint(self) -> str:
        return f"synthetic-text-seeded-{self.dim}"

    def passage_offsets(self, texts) -> list:
        import re

        return [torch.tensor([m.span() for m in re.finditer(r"\S+", t)], dtype=torch.int64).reshape(-1, 2)
                for t in texts]

    def encode_passages(self, texts, batch_size: int = 16, progress: bool = False) -> list:
        import zlib

        from agrame.encoder import EncodedPassage

        out = []
        for text, offsets in zip(texts, self.passage_offsets(texts)):
            rng = np.random.default_rng(zlib.crc32(text.encode()))
            n = len(offsets)
            v = self.centers[rng.choice(rng.integers(0, self.topics, 3), n)]
            v = v + 0.08 * rng.normal(size=(n, self.dim)).astype(np.float32)
            out.append(EncodedPassage(torch.from_numpy(_unit(v).astype(np.float32)), offsets))
        return out


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def synthetic_passages(tokens: int, seed: int = 0) -> List[Passage]:
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < tokens:
        n = int(rng.integers(60, 201))
        out.append(Passage(str(len(out)), f"p{len(out)} " + "x " * (n - 1)))
        total += n
    return out


def cmd_synthetic(args) -> None:
    """N synthetic tokens: a single index built locally vs S shards built on Ray with 2 workers
    (one codec, trained once); scatter-gather search latency against the single index."""
    from agrame.index.distributed import build_with_ray, connect

    torch.set_num_threads(args.threads)
    model = TextSeededVectors()
    passages = synthetic_passages(int(args.tokens), args.seed)
    root = Path(args.work or cache_root()) / f"scale-out-synthetic-{int(args.tokens)}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        codec, _, codec_info = train_codec(model, passages, 2)
        kmeans = time.perf_counter() - t0
        t0 = time.perf_counter()
        build_compressed(model, passages, root / "single", codec=codec, chunk_passages=2048)
        single_build = time.perf_counter() - t0
        ray = connect(None, num_cpus=args.threads)
        t0 = time.perf_counter()
        build_with_ray(model, passages, root / "sharded", shards=args.shards, workers=2, codec=codec,
                       block_passages=2048)
        ray_build = time.perf_counter() - t0
        stats = dict(build_with_ray.last_stats)
        ray.shutdown()
        single = Index(root / "single", model=model)
        sharded = ShardedIndex(root / "sharded", model=model, threads=args.threads)
        rng = np.random.default_rng(1)
        times = {"single": [], "sharded": []}
        same_top1 = 0
        for i in range(args.queries + 5):
            p = passages[int(rng.integers(0, len(passages)))]
            v = model.encode_passages([p.text])[0].vectors.numpy()[:32]
            q = torch.from_numpy(_unit(v + 0.05 * rng.normal(size=v.shape)).astype(np.float32))
            hits = {}
            for name, index in (("single", single), ("sharded", sharded)):
                t = time.perf_counter()
                hits[name] = index.search_vectors(q, q, "sentence", 10, alpha=0.5)
                if i >= 5:
                    times[name].append(1000 * (time.perf_counter() - t))
            if i >= 5:
                same_top1 += hits["single"][0].passage_id == hits["sharded"][0].passage_id
        tokens = read_manifest(root / "single")["num_tokens"]
        sharded.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"benchmark": "scale_out", "what": "synthetic tokens: single local build vs sharded Ray build (2 workers)",
              "generator": TextSeededVectors.__doc__.split("\n")[0], "tokens": tokens, "passages": len(passages),
              "shards": args.shards, "dim": 128, "nbits": 2, "codec": codec_info,
              "kmeans_seconds_shared": round(kmeans, 1), "single_build_seconds": round(single_build, 1),
              "ray_sharded_build_seconds": round(ray_build, 1), "ray_build_stats": stats,
              "search": {"granularity": "sentence", "top_k": 10, "threads": args.threads, "queries": args.queries,
                         "single_ms_median": _pct(times["single"], 50), "single_ms_p95": _pct(times["single"], 95),
                         "sharded_ms_median": _pct(times["sharded"], 50),
                         "sharded_ms_p95": _pct(times["sharded"], 95),
                         "same_top1_passage": f"{same_top1}/{args.queries}"}}
    out = write_result(f"scale_out-synthetic-{int(args.tokens)}", result, args.out,
                       command_line("benchmarks.scale_out", ["synthetic", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_out", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="local vs Ray builds of the pooled corpus")
    b.add_argument("--passages", type=int, default=None, help="first N pool passages (default: all)")
    b.add_argument("--batch-size", type=int, default=16)
    s = sub.add_parser("search", help="sharded search vs the single pool index")
    s.add_argument("--limit", type=int, default=100, help="questions (default 100)")
    s.add_argument("--exact-limit", type=int, default=10, help="questions checked in exact mode (default 10)")
    c = sub.add_parser("cluster", help="two raylets on this machine")
    c.add_argument("--passages", type=int, default=400)
    c.add_argument("--limit", type=int, default=20, help="questions (default 20)")
    c.add_argument("--block", type=int, default=64, help="passages per block (default 64)")
    e = sub.add_parser("exact", help="exact mode of S shards vs the single index, strictly and up to ties")
    e.add_argument("--limit", type=int, default=10)
    y = sub.add_parser("synthetic", help="synthetic tokens: single local build vs sharded Ray build")
    y.add_argument("--tokens", type=float, default=1e7, help="tokens (default 1e7)")
    y.add_argument("--shards", type=int, default=8)
    y.add_argument("--queries", type=int, default=100)
    for p in (b, s, c, e, y):
        p.add_argument("--model", default=None)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--work", default=None, help="folder for temporary indexes (default: the system's)")
        p.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.argv = argv[1:]
    {"build": cmd_build, "search": cmd_search, "cluster": cmd_cluster, "exact": cmd_exact,
     "synthetic": cmd_synthetic}[args.command](args)


if __name__ == "__main__":
    main()

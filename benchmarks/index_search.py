"""Full-corpus retrieval with the compressed index: no BM25, the whole pooled corpus (issue 12).

    python -m benchmarks.index_search build --nbits 2 4          # compress the cached pool encodings
    python -m benchmarks.index_search choose                      # nprobe/ncandidates on SQuAD *train*
    python -m benchmarks.index_search run --dataset squad-dev --first-stage agrame --nbits 2
    python -m benchmarks.index_search run --dataset nq-oracle --first-stage exact
    python -m benchmarks.index_search run --dataset nq-oracle --first-stage single-vector --baseline-model e5-small
    python -m benchmarks.index_search latency --nbits 2           # ms per query, 2 threads
    python -m benchmarks.index_search build-time --models squad-a1 e5-kd-128   # build time, one run
    python -m benchmarks.index_search scale --tokens 10000000     # synthetic clustered tokens

``--first-stage agrame`` searches the compressed index (passages: top 100; sentences: top 5
over the survivors); ``exact`` scans every float16 token vector of the pool (the reference);
``single-vector`` ranks every passage and every sentence (each encoded alone) by its single vector
(``--baseline-model e5-small``: e5 as users would take it; cached by ``benchmarks.encodings``);
BM25 top-100 + re-rank rows come from ``benchmarks.open_domain``. Metrics and gold as in
``benchmarks.open_domain``; passage R@100 is over the whole pool. The pool's token vectors come
from ``benchmarks.encodings`` (cached), so every row here uses the same vectors.
"""

from __future__ import annotations

import argparse
import json
import re
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame.corpus import EncodedCorpus, Passage
from agrame.loading import load_encoder
from agrame.index import Index
from agrame.index.search import SearchSettings
from agrame.index import read_manifest
from agrame.index.store import offsets_stored
from agrame.index.writer import build_compressed
from agrame.ranker import _top, score_corpus
from agrame import scoring

from .common import command_line, peak_rss_mb, sample, squad_paragraphs, write_result
from .data import Pool, load_pool, load_questions, restrict_pool, squad_id
from .encodings import MultiVectorCache, SingleVectorEncoder, _hash, cache_root, pool_sentences, single_vectors
from .metrics import summarize
from .open_domain import judge
from .rerank import Harness

PASSAGE_K = 100
SENTENCE_K = 5
CHOOSE_GRID = {"nprobe": (2, 4, 8), "ncandidates": (128, 256, 512, 1024, 2048)}


class PoolVectors:
    """The pool's cached multi-vector encodings (``benchmarks.encodings``) as one corpus."""

    def __init__(self, model: Optional[str] = None, pool: Optional[Pool] = None):
        self.encoder = load_encoder(model)
        self.pool = pool if pool is not None else load_pool()
        self.spans = pool_sentences(self.pool)
        self.cache = MultiVectorCache(self.encoder, self.pool.texts, "colbert-pool", self.spans)
        self._corpus: Optional[EncodedCorpus] = None

    def corpus(self, float32: bool = False) -> EncodedCorpus:
        if self._corpus is None:
            self.cache.ensure()
            corpus = EncodedCorpus.concat(self.cache._shards)
            corpus.ids = [str(i) for i in range(len(corpus))]
            self._corpus = corpus
        if float32 and self._corpus.vectors.dtype != torch.float32:
            self._corpus.vectors = self._corpus.vectors.float()
        return self._corpus

    def index_path(self, nbits, pool_factor=1) -> Path:
        suffix = "" if pool_factor == 1 else f"-p{pool_factor:g}"
        return cache_root() / f"index-pool-{self.encoder.fingerprint()[:12]}-{_hash(self.pool.texts)}-{_bits(nbits)}{suffix}"


def _bits(nbits) -> str:
    """A residual codec in file names: ``2b`` (2 bits a dimension, the names cached results have), ``pq16x6``,
    ``opq16x7``."""
    from agrame.index.codec import parse_residuals

    kind, bits, m = parse_residuals(nbits)
    return f"{bits}b" if kind == "scalar" else f"{kind}{m}x{bits}"


def codec_arg(value: str):
    """``--nbits``: 1, 2, 4, 8 bits a dimension, ``pqMxB`` or ``opqMxB`` (:func:`agrame.index.codec.parse_residuals`)."""
    from agrame_app.commands.common import residual_codec

    return residual_codec(value)


def _exact_rankings_files(dataset: str, tag: Optional[str]) -> List[Path]:
    """The exact scan's cached rankings made with the same model (runs of another model carry its --tag)."""
    pattern = re.compile(rf"index_search-{re.escape(dataset)}-exact(-s\d+)?" + (f"-{re.escape(tag)}" if tag else "")
                         + r"-rankings\.json")
    return sorted(p for p in cache_root().glob(f"index_search-{dataset}-exact*-rankings.json")
                  if pattern.fullmatch(p.name))


def _model_args(args) -> List[str]:
    """``--model``/``--tag`` as given, for the command recorded beside a result made per ``--nbits``."""
    return (["--model", args.model] if args.model else []) + (["--tag", args.tag] if args.tag else [])


def _tagged(name: str, args) -> str:
    factor = getattr(args, "pool_factor", 1)
    name = name if factor == 1 else f"{name}-p{factor:g}"
    return f"{name}-{args.tag}" if getattr(args, "tag", None) else name


def build(vectors: PoolVectors, nbits: int, overwrite: bool = False, pool_factor=1) -> Tuple[Path, dict]:
    """The pool's index at ``nbits`` (token-pooled by ``pool_factor``, :mod:`agrame.pooling`), built from
    the cached vectors unless cached itself."""
    path = vectors.index_path(nbits, pool_factor)
    start = time.perf_counter()
    if path.exists():
        manifest = read_manifest(path)
        if offsets_stored(manifest):
            overwrite = True  # cached before token offsets were recomputed at search time: not today's layout
        elif manifest.get("search") != vectors.encoder.settings.search:
            # built before the model's budgets were re-chosen (issue 64's per_hit 3 → 4): a build with the model
            # today records its settings, and "default settings" in a result must mean those
            overwrite = True
    if not path.exists() or overwrite:  # the pool's vectors are loaded only to build
        corpus = vectors.corpus()
        passages = [Passage(str(i), t) for i, t in enumerate(vectors.pool.texts)]
        build_compressed(vectors.encoder, passages, path, nbits=nbits, sentences=vectors.spans, encoded=corpus,
                         overwrite=overwrite, pool_factor=pool_factor)
    seconds = time.perf_counter() - start
    return path, {"build_seconds_from_cached_vectors": round(seconds, 1)}


def size_report(path: Path, v1_tokens: int, dim: int) -> dict:
    index = Index(path)
    store = index.store
    files = store.manifest["files"]
    T = store.num_tokens
    per_file = {name: round(info["size"] / T, 3) for name, info in sorted(files.items())}
    total = store.bytes(include_text=False)
    original = int(store.manifest.get("num_original_tokens", T))
    # Version 1: float16 vectors + int32 offsets (8 B) + int32 token→sentence (4 B) per token.
    v1_per_token = 2 * dim + 12
    return {"tokens": T, "passages": len(store), "num_centroids": store.codec.num_centroids,
            "bytes_per_token_text_excluded": round(total / T, 2), "bytes_per_token_by_file": per_file,
            "pool_factor": store.pool_factor, "original_tokens": original,
            "bytes_per_original_token_text_excluded": round(total / original, 2),
            "index_bytes_text_excluded": total, "index_bytes_with_text": store.bytes(include_text=True),
            "v1_bytes_per_token": v1_per_token, "v1_bytes_text_excluded_estimate": v1_per_token * v1_tokens,
            "size_ratio_v1_over_v2": round(v1_per_token / (total / T), 2)}


def encode_queries(encoder, texts: Sequence[str], batch: int = 64) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``[Q]`` and sub-unit query vectors of every question (one forward batch per chunk)."""
    marker = encoder.settings.span_query_marker
    out = []
    for lo in tqdm(range(0, len(texts), batch), desc="encoding queries", disable=None):
        chunk = list(texts[lo:lo + batch])
        if encoder.same_query_encoding(marker, "Q"):
            qs = encoder.encode_queries(chunk, ("Q",))[0]
            out.extend((q.vectors, q.vectors) for q in qs)
        else:
            qs, ss = encoder.encode_queries(chunk, ("Q", marker))
            out.extend((q.vectors, s.vectors) for q, s in zip(qs, ss))
    return out


def exact_rankings(q, s, corpus: EncodedCorpus, alpha: float) -> Tuple[List[int], List[int]]:
    """Top-100 passages and top-5 sentences (global ids) by scanning every token (one pass)."""
    scores = score_corpus(q, s, corpus, "sentence", chunk_tokens=1 << 18)
    combined = scoring.combined_score(scores.sentence, scores.passage[corpus.sentence_passage], alpha)
    return _top(scores.passage, PASSAGE_K), _top(combined, SENTENCE_K)


def index_rankings(index: Index, q, s, alpha: float, settings: SearchSettings,
                   sent_starts: np.ndarray, spans) -> Tuple[List[int], List[int]]:
    passages = index.search_vectors(q, s, "passage", PASSAGE_K, alpha=alpha, **settings._asdict())
    sentences = index.search_vectors(q, s, "sentence", SENTENCE_K, alpha=alpha, **settings._asdict())
    ranked_p = [int(h.passage_id) for h in passages]
    ranked_s = [int(sent_starts[int(h.passage_id)]) + [a for a, _ in spans[int(h.passage_id)]].index(h.start)
                for h in sentences]
    return ranked_p, ranked_s


def single_vector_rankings(queries: np.ndarray, passages: np.ndarray, sentences: np.ndarray,
                           batch: int = 64) -> List[Tuple[List[int], List[int]]]:
    """Top-100 passages and top-5 sentences (global ids) of each query by dot product over every
    single vector of the pool (a sentence is encoded alone, so its score needs no passage score).
    Ties keep corpus order, as ``_top`` and the re-rank harness do."""
    out = []
    p32, s32 = torch.from_numpy(passages.astype(np.float32)), torch.from_numpy(sentences.astype(np.float32))
    for lo in range(0, len(queries), batch):
        q = torch.from_numpy(np.ascontiguousarray(queries[lo:lo + batch], dtype=np.float32))
        p_scores, s_scores = q @ p32.T, q @ s32.T
        out.extend((_top(p_scores[i], PASSAGE_K), _top(s_scores[i], SENTENCE_K)) for i in range(len(q)))
    return out


def _single_vector_ranker(args, pool: Pool, questions) -> Tuple[Callable, Harness, dict, float]:
    """Every question ranked up front by single vectors; the seconds are the search's alone."""
    harness = Harness("pool", pool.texts, pool_sentences(pool))
    sv = SingleVectorEncoder(args.baseline_model)
    query_vectors = sv.encode_queries([q.text for q in questions])
    passage_vectors = single_vectors(harness.texts, "sv-pool", sv)
    sentence_vectors = single_vectors(harness.sentences, "sv-sentences", sv)
    start = time.perf_counter()
    ranked = single_vector_rankings(query_vectors, passage_vectors, sentence_vectors)
    search_seconds = time.perf_counter() - start
    info = {"model": f"{args.baseline_model or 'all-MiniLM-L6-v2'} mean pooling", "fingerprint": sv.fingerprint(),
            "first_stage": "exhaustive dot product over single vectors (passages and sentences encoded alone)"}
    return ranked.__getitem__, harness, info, search_seconds


def _multi_vector_ranker(args, pool: Pool, questions) -> Tuple[Callable, Harness, dict, float]:
    """A question's rankings by the float16 exact scan (``exact``) or the compressed index (``agrame``)."""
    vectors = PoolVectors(args.model, pool)
    encoder = vectors.encoder
    harness = Harness("pool", pool.texts, vectors.spans)
    alpha = encoder.settings.alpha if args.alpha is None else args.alpha
    encoded = encode_queries(encoder, [q.text for q in questions])
    info = {"model": encoder.source, "fingerprint": encoder.fingerprint()[:12], "alpha": alpha}
    if args.first_stage == "exact":
        corpus = vectors.corpus(float32=True)
        info["first_stage"] = "exhaustive exact scan (float16 vectors)"
        return (lambda k: exact_rankings(*encoded[k], corpus, alpha)), harness, info, 0.0
    path, _ = build(vectors, args.nbits, pool_factor=args.pool_factor)
    index = Index(path, model=encoder)
    settings = SearchSettings(args.nprobe or index.defaults.nprobe, args.ncandidates or index.defaults.ncandidates,
                              args.per_hit or index.defaults.per_hit)
    info.update({"first_stage": f"agrame compressed index, {_bits(args.nbits)} residuals"
                                + (f", tokens pooled by {args.pool_factor:g}" if args.pool_factor != 1 else ""),
                 "pool_factor": args.pool_factor, "search": settings._asdict(),
                 "num_centroids": index.store.codec.num_centroids})
    rank = lambda k: index_rankings(index, *encoded[k], alpha, settings, harness.sent_starts,  # noqa: E731
                                    vectors.spans)
    return rank, harness, info, 0.0


def _pair_with_exact(result: dict, args, questions, per_question, rankings: dict) -> None:
    """Paired with the float16 exact scan where it ran (a sample: it costs ~2 s per question)."""
    for exact_file in _exact_rankings_files(args.dataset, getattr(args, "tag", None)):
        exact = json.loads(exact_file.read_text())
        result["agreement_with_exact"] = {"exact_run": exact_file.name.replace("-rankings.json", ""),
                                          **agreement(rankings, exact)}
        paired = [m for q, m in zip(questions, per_question) if q.qid in exact]
        result["metrics_on_exact_sample"] = summarize(paired)


def cmd_run(args) -> None:
    if args.first_stage == "single-vector" and args.model:
        raise SystemExit("error: --first-stage single-vector takes --baseline-model, not --model")
    if args.first_stage != "single-vector" and args.baseline_model:
        raise SystemExit("error: --baseline-model is for --first-stage single-vector")
    pool = load_pool()
    all_questions = load_questions(args.dataset, pool)
    questions = sample(all_questions, args.limit, args.seed)
    if args.pool_limit is not None:  # smoke tests: the sample's gold passages and seeded others
        pool, remap = restrict_pool(pool, [q.gold_passage for q in questions], args.pool_limit, args.seed)
        for q in questions:
            q.gold_passage = remap[q.gold_passage]
    ranker = _single_vector_ranker if args.first_stage == "single-vector" else _multi_vector_ranker
    rank, harness, info, search_seconds = ranker(args, pool, questions)
    per_question, rankings = [], {}
    start = time.perf_counter()
    for k, q in enumerate(tqdm(questions, desc=f"{args.dataset} {args.first_stage}", disable=None)):
        passages, sentences = rank(k)
        rankings[q.qid] = {"passages": passages, "sentences": sentences}
        metrics = judge(args.dataset, harness, q, passages, sentences, passages)
        metrics["psg_r100"] = metrics.pop("first_stage_r100")
        per_question.append(metrics)
    seconds = search_seconds + time.perf_counter() - start
    name = f"index_search-{args.dataset}-{args.first_stage}" + (f"-{_bits(args.nbits)}" if args.first_stage == "agrame" else "")
    if args.limit:
        name += f"-s{args.limit}"
    rankings_file = cache_root() / f"{_tagged(name, args)}-rankings.json"
    rankings_file.write_text(json.dumps(rankings))
    result = {
        "benchmark": "index_search", "dataset": args.dataset, **info,
        "sample": {"questions": len(questions), "of": len(all_questions), "seed": args.seed if args.limit else None,
                   "with_gold_sentence": sum("sent_p1" in m for m in per_question)},
        "pool_passages": len(pool), "metrics": summarize(per_question),
        "ms_per_question_passage_and_sentence_search": round(1000 * seconds / len(questions), 1),
        "threads": torch.get_num_threads(),
    }
    if args.first_stage == "agrame":
        _pair_with_exact(result, args, questions, per_question, rankings)
    path = write_result(_tagged(name, args), result, args.out, command_line("benchmarks.index_search", ["run", *args.argv]))
    print(f"{args.dataset} {args.first_stage}: {result['metrics']} → {path}")


def agreement(rankings: dict, exact: dict) -> dict:
    overlap, top1_p, top1_s = [], [], []
    for qid, r in rankings.items():
        if qid not in exact:
            continue
        e = exact[qid]
        overlap.append(len(set(r["passages"]) & set(e["passages"])) / max(1, len(e["passages"])))
        top1_p.append(float(r["passages"][:1] == e["passages"][:1]))
        top1_s.append(float(r["sentences"][:1] == e["sentences"][:1]))
    return {"questions": len(overlap), "top100_passage_overlap": round(100 * statistics.fmean(overlap), 2),
            "same_top1_passage": round(100 * statistics.fmean(top1_p), 2),
            "same_top1_sentence": round(100 * statistics.fmean(top1_s), 2)}


def cmd_build(args) -> None:
    vectors = PoolVectors(args.model)
    for nbits in args.nbits:
        path, timing = build(vectors, nbits, overwrite=args.overwrite, pool_factor=args.pool_factor)
        report = {**size_report(path, vectors.corpus().num_tokens, vectors.encoder.dim), **timing,
                  "codec": json.loads((path / "manifest.json").read_text())["codec"]}
        out = write_result(_tagged(f"index_search-size-{_bits(nbits)}", args), {"benchmark": "index_search", "what": "size",
                                                            "model": vectors.encoder.source, "nbits": nbits,
                                                            "pool_passages": len(vectors.pool), **report},
                           None, command_line("benchmarks.index_search", ["build", "--nbits", str(nbits)] + _model_args(args)
                                              + (["--pool-factor", f"{args.pool_factor:g}"] if args.pool_factor != 1 else [])))
        print(f"{nbits} bits: {report['bytes_per_token_text_excluded']} B/token → {out}")


def _train_questions(pool: Pool, limit: int, seed: int):
    """SQuAD *train* questions with their pool paragraph (never a reported split)."""
    from .data import Question

    out = []
    for p in squad_paragraphs("train"):
        gold = pool.alias[squad_id("train", p)]
        for qa in p["qas"][:1]:
            out.append(Question(qa["id"], qa["question"], [qa["answer"]], gold, qa["answer_start"]))
    return sample(out, limit, seed)


def exhaustive_scores(index: Index, q, s, alpha: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Passage scores and combined sentence scores S'(q,s)+α·S(q,p) of *every* stored position,
    decompressed, one pass per chunk (global passage and sentence order)."""
    store = index.store
    passage, combined = [], []
    for lo in range(0, len(store), 512):
        pids = np.arange(lo, min(lo + 512, len(store)))
        corpus = store.corpus(pids, with_offsets=False)
        scores = score_corpus(q, s, corpus, "sentence", chunk_tokens=1 << 18)
        passage.append(scores.passage)
        combined.append(scoring.combined_score(scores.sentence, scores.passage[corpus.sentence_passage], alpha))
    return torch.cat(passage), torch.cat(combined)


def compressed_exhaustive(index: Index, q, s, alpha: float) -> Tuple[List[int], List[int]]:
    """Top-100 passages and top-10 sentences (global ids) over every decompressed passage: what
    the staged search approximates (its codec error excluded)."""
    passage_t, combined_t = exhaustive_scores(index, q, s, alpha)
    return _top(passage_t, PASSAGE_K), _top(combined_t, 10)


def _overlap(a: Sequence[int], b: Sequence[int]) -> float:
    return len(set(a) & set(b)) / max(1, len(b))


def float16_rankings(vectors: PoolVectors, questions, encoded, alpha: float, limit: int, seed: int) -> dict:
    """The float16 exhaustive scan's rankings of SQuAD train ``questions`` (cached per model, sample and seed)."""
    encoder = vectors.encoder
    ref_file = cache_root() / f"choose-exact-{encoder.fingerprint()[:12]}-{limit}-{seed}.json"
    if not ref_file.exists():
        corpus = vectors.corpus(float32=True)
        ranked = {}
        for k in tqdm(range(len(questions)), desc="float16 scan", disable=None):
            p, s = exact_rankings(*encoded[k], corpus, alpha)
            ranked[questions[k].qid] = {"passages": p, "sentences": s}
        ref_file.write_text(json.dumps(ranked))
        vectors._corpus = None  # 6 GB at d = 384
    return json.loads(ref_file.read_text())


def store_with_model(model: Optional[str], field: str, value) -> Path:
    """Write a choice into a shipped model's settings (``agrame/models/NAME/agrame.json``): what an index
    built with it records (:class:`agrame.encoder.EncoderSettings` ``pool_factor`` / ``search``). The
    value's default removes the field. Only shipped models (by name, the default included)."""
    from agrame.encoder import EncoderSettings
    from agrame.loading import DEFAULT_MODEL, named_models

    name = model or DEFAULT_MODEL
    folders = named_models()
    if name not in folders:
        raise SystemExit(f"error: --store needs a shipped model (one of {sorted(folders)}), not {name!r}")
    path = folders[name] / "agrame.json"
    data = json.loads(path.read_text())
    data[field] = value
    settings = EncoderSettings.from_json({k: v for k, v in data.items() if k != "format"})  # checked
    out = {"format": data["format"], **settings.to_json()} if "format" in data else settings.to_json()
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def _compressed_reference(index: Index, path: Path, questions, encoded, alpha: float, limit: int, seed: int) -> dict:
    """The exhaustive scan of the index's own compressed vectors (cached per index, sample and seed)."""
    ref_file = cache_root() / f"choose-compressed-{path.name}-{limit}-{seed}.json"
    if ref_file.exists():
        return json.loads(ref_file.read_text())
    reference = {}
    for q, (qv, sv) in tqdm(list(zip(questions, encoded)), desc="exhaustive compressed", disable=None):
        p, s = compressed_exhaustive(index, qv, sv, alpha)
        reference[q.qid] = {"passages": p, "sentences": s}
    ref_file.write_text(json.dumps(reference))
    return reference


def _choose_row(index: Index, nprobe: int, ncand: int, questions, encoded, sentence_ids, reference: dict,
                float16: dict) -> dict:
    """One grid point: agreement with both scans and median latencies (sentence top 10, passage top 100)."""
    s_ms, p_ms, same_s, same_s16, ov, ov16 = [], [], [], [], [], []
    for q, (qv, sv) in zip(questions, encoded):
        t = time.perf_counter()
        sents = index.search_vectors(qv, sv, "sentence", 10, nprobe=nprobe, ncandidates=ncand, per_hit=1)
        s_ms.append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        psgs = index.search_vectors(qv, sv, "passage", PASSAGE_K, nprobe=nprobe, ncandidates=ncand, per_hit=1)
        p_ms.append(1000 * (time.perf_counter() - t))
        top_s = sentence_ids(sents[:1])
        same_s.append(float(top_s == reference[q.qid]["sentences"][:1]))
        same_s16.append(float(top_s == float16[q.qid]["sentences"][:1]))
        ranked = [int(h.passage_id) for h in psgs]
        ov.append(_overlap(ranked, reference[q.qid]["passages"]))
        ov16.append(_overlap(ranked, float16[q.qid]["passages"]))
    return {"nprobe": nprobe, "ncandidates": ncand,
            "same_top1_sentence_vs_compressed_scan": round(100 * statistics.fmean(same_s), 1),
            "same_top1_sentence_vs_float16": round(100 * statistics.fmean(same_s16), 1),
            "top100_overlap_vs_compressed_scan": round(100 * statistics.fmean(ov), 2),
            "top100_overlap_vs_float16": round(100 * statistics.fmean(ov16), 2),
            "median_ms_sentence_top10": round(statistics.median(s_ms), 1),
            "median_ms_passage_top100": round(statistics.median(p_ms), 1)}


CHOOSE_RULE = ("sentence top 10: cheapest with the same top sentence as the exhaustive compressed scan on "
               "≥ 99% of questions; passage top 100: cheapest with ≥ 97% overlap with that scan "
               "(per_hit = its ncandidates / 100); nprobe = the larger of the two")


def choose_settings(rows: Sequence[dict]) -> Tuple[Optional[dict], Optional[dict], Optional[dict]]:
    """``CHOOSE_RULE`` over the grid's rows: (sentence row, passage row, chosen settings or None)."""
    ok_s = [r for r in rows if r["same_top1_sentence_vs_compressed_scan"] >= 99]
    ok_p = [r for r in rows if r["top100_overlap_vs_compressed_scan"] >= 97]
    best_s = min(ok_s, key=lambda r: r["median_ms_sentence_top10"]) if ok_s else None
    best_p = min(ok_p, key=lambda r: r["median_ms_passage_top100"]) if ok_p else None
    if not (best_s and best_p):
        return best_s, best_p, None
    return best_s, best_p, {"nprobe": max(best_s["nprobe"], best_p["nprobe"]), "ncandidates": best_s["ncandidates"],
                            "per_hit": max(1, best_p["ncandidates"] // PASSAGE_K)}


def cmd_choose(args) -> None:
    """nprobe / ncandidates / per_hit on SQuAD *train* questions (never a reported split).

    Sentence search (top 10): the cheapest setting whose top sentence equals the exhaustive
    scan of the same compressed vectors on ≥ 99% of questions. Passage search (top 100): the
    cheapest whose top 100 overlap that scan's by ≥ 97%; its ``ncandidates / 100`` becomes
    ``per_hit`` (a search scores at least ``per_hit × top_k`` passages exactly). Agreement with
    the float16 exact scan (codec error included) is reported beside it.
    """
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    alpha = encoder.settings.alpha
    every = _train_questions(vectors.pool, 300, args.seed)
    encoded = encode_queries(encoder, [q.text for q in every])
    float16 = float16_rankings(vectors, every, encoded, alpha, 300, args.seed)  # the frontier's reference too
    questions, encoded = every[:args.limit], encoded[:args.limit]
    path, _ = build(vectors, args.nbits, pool_factor=args.pool_factor)
    index = Index(path, model=encoder)
    reference = _compressed_reference(index, path, questions, encoded, alpha, args.limit, args.seed)
    harness = Harness("pool", vectors.pool.texts, vectors.spans)

    def sentence_ids(hits):
        return [int(harness.sent_starts[int(h.passage_id)]) + [a for a, _ in vectors.spans[int(h.passage_id)]].index(h.start)
                for h in hits]

    rows = []
    for nprobe in CHOOSE_GRID["nprobe"]:
        for ncand in CHOOSE_GRID["ncandidates"]:
            rows.append(_choose_row(index, nprobe, ncand, questions, encoded, sentence_ids, reference, float16))
            print(rows[-1], flush=True)
    best_s, best_p, chosen = choose_settings(rows)
    ref_sizes = {"exhaustive_compressed_vs_float16_top100_overlap": round(100 * statistics.fmean(
        _overlap(reference[q.qid]["passages"], float16[q.qid]["passages"]) for q in questions), 2),
        "exhaustive_compressed_vs_float16_same_top1_sentence": round(100 * statistics.fmean(
            float(reference[q.qid]["sentences"][:1] == float16[q.qid]["sentences"][:1]) for q in questions), 1)}
    result = {"benchmark": "index_search", "what": "choose nprobe/ncandidates", "model": encoder.source,
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed})",
              "nbits": args.nbits, "threads": torch.get_num_threads(), "rule": CHOOSE_RULE,
              "codec_only": ref_sizes, "grid": rows, "chosen_sentence": best_s, "chosen_passage": best_p,
              "chosen": chosen}
    out = write_result(_tagged(f"index_search-choose-{_bits(args.nbits)}", args), result, None,
                       command_line("benchmarks.index_search", ["choose", *args.argv]))
    print(f"chosen: {chosen} → {out}")
    if args.store and chosen:
        print(f"stored with the model: {store_with_model(args.model, 'search', chosen)}")


def cmd_latency(args) -> None:
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    path, _ = build(vectors, args.nbits, pool_factor=args.pool_factor)
    index = Index(path, model=encoder)
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    # Warm-up as a serving process is warm: every index file read once (a build or a bigger job run just
    # before would otherwise leave one model's pages cold and another's cached), then lazy loads.
    warmed = 0
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        with open(f, "rb") as handle:
            while chunk := handle.read(1 << 24):
                warmed += len(chunk)
    for q in questions[:5]:
        index.search(q.text, "sentence", top_k=10)
    total, search_only = [], []
    for q in tqdm(questions, desc="latency", disable=None):
        t0 = time.perf_counter()
        qv, sv = index.encode_query(q.text, "sentence")
        t1 = time.perf_counter()
        index.search_vectors(qv, sv, "sentence", 10)
        t2 = time.perf_counter()
        total.append(1000 * (t2 - t0))
        search_only.append(1000 * (t2 - t1))
    pct = lambda xs, p: round(float(np.percentile(xs, p)), 1)  # noqa: E731
    result = {"benchmark": "index_search", "what": "latency", "model": encoder.source, "nbits": args.nbits,
              "granularity": "sentence", "top_k": 10, "threads": torch.get_num_threads(),
              "queries": f"squad-dev, {len(questions)} sampled (seed {args.seed})",
              "search": index.defaults._asdict(), "pool_passages": len(index),
              "warm_up": f"index files read once ({warmed / 1e6:.0f} MB), then 5 queries",
              "ms_with_query_encoding": {"median": pct(total, 50), "p95": pct(total, 95)},
              "ms_search_only": {"median": pct(search_only, 50), "p95": pct(search_only, 95)},
              "peak_rss_mb": peak_rss_mb()}
    out = write_result(_tagged(f"index_search-latency-{_bits(args.nbits)}", args), result, None,
                       command_line("benchmarks.index_search", ["latency", *args.argv]))
    print(result, "→", out)


FRONTIER_NBITS = (1, 2, 4)
FRONTIER_MODELS = ("default", "zero-shot-128")
#: The frontier's rule (issue 41, item 4): the default codec is the smallest whose P@1 is within this of the float16 scan's.
FRONTIER_MAX_LOSS = 0.5


def cmd_frontier(args) -> None:
    """Size against quality: each model's pooled index at 1, 2 and 4 bits (bytes per token) beside the
    float16 exhaustive scan of the same token vectors, on SQuAD *train* questions (the pool's only train
    split: a codec is chosen here, never on a reported one). Staged search at the index's defaults:
    passage P@1 / R@100, sentence P@1; the loss in P@1 against the float16 scan; and the smallest codec
    that loses at most ``FRONTIER_MAX_LOSS`` in passage and sentence P@1. ``zero-shot-128`` is the
    default backbone with its fixed 128-d principal projection (``training.projection``: fitted on SQuAD
    train paragraphs' token vectors), whose pool vectors are the 384-d cache projected (``projected_base``)."""
    torch.set_num_threads(args.threads)
    pool = load_pool()
    questions = _train_questions(pool, args.limit, args.seed)
    rows = []
    for model in args.models:
        vectors = PoolVectors(None if model == "default" else model, pool)
        encoder = vectors.encoder
        alpha = encoder.settings.alpha
        harness = Harness("pool", pool.texts, vectors.spans)
        encoded = encode_queries(encoder, [q.text for q in questions])

        def metrics(rank) -> dict:
            per = []
            for k, q in enumerate(questions):
                passages, sentences = rank(k)
                m = judge("squad-dev", harness, q, passages, sentences, passages)  # SQuAD's gold rule (answer_start)
                m["psg_r100"] = m.pop("first_stage_r100")
                per.append(m)
            return summarize(per)

        # The float16 scan's rankings, kept where `choose` reads its float16 reference (the same questions).
        ranked16 = float16_rankings(vectors, questions, encoded, alpha, args.limit, args.seed)
        float16 = metrics(lambda k: (ranked16[questions[k].qid]["passages"], ranked16[questions[k].qid]["sentences"]))
        dim = encoder.settings.dim or encoder.backbone.config.hidden_size
        rows.append({"model": model, "source": encoder.source, "fingerprint": encoder.fingerprint()[:12], "dim": dim,
                     "codec": "float16 scan", "nbits": 16, "bytes_per_token": 2 * dim, "metrics": float16})
        for nbits in args.nbits:
            path, built = build(vectors, nbits)
            index = Index(path, model=encoder)
            settings = SearchSettings(index.defaults.nprobe, index.defaults.ncandidates)
            size = index.store.bytes(include_text=False) / index.store.num_tokens
            m = metrics(lambda k: index_rankings(index, *encoded[k], alpha, settings, harness.sent_starts,
                                                 vectors.spans))
            rows.append({"model": model, "source": encoder.source, "fingerprint": encoder.fingerprint()[:12], "dim": dim,
                         "codec": f"{nbits}-bit residuals", "nbits": nbits, "bytes_per_token": round(size, 2),
                         "metrics": m, "search": index.defaults._asdict(),
                         "loss_vs_float16": {k: round(float16[k] - m[k], 2) for k in ("psg_p1", "sent_p1", "psg_r100")}})
            print(rows[-1], flush=True)
    within = [r for r in rows if "loss_vs_float16" in r and r["loss_vs_float16"]["psg_p1"] <= FRONTIER_MAX_LOSS
              and r["loss_vs_float16"]["sent_p1"] <= FRONTIER_MAX_LOSS]
    chosen = min(within, key=lambda r: r["bytes_per_token"]) if within else None
    result = {"benchmark": "index_search", "what": "size-quality frontier",
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}), pooled corpus",
              "threads": torch.get_num_threads(), "rows": rows,
              "rule": f"the smallest codec (bytes per token) whose passage and sentence P@1 are within "
                      f"{FRONTIER_MAX_LOSS} of its model's float16 scan",
              "chosen": None if chosen is None else {k: chosen[k] for k in ("model", "codec", "bytes_per_token")}}
    out = write_result("index_search-frontier", result, None, command_line("benchmarks.index_search",
                                                                            ["frontier", *args.argv]))
    print(json.dumps(result["chosen"]), "→", out)


POOL_FACTORS = (1, 2, 3, 4)
POOL_NBITS = (1, 2, 4)
#: The codec the pool factor is chosen at: the one shipped (the frontier's choice, issue 41).
POOL_SHIPPED_NBITS = 2
#: The rule for the shipped pool factor, written down before any pooled row was measured (issue 53): on
#: SQuAD *train* questions, at POOL_SHIPPED_NBITS, the largest factor (the smallest index) whose passage
#: P@1 and sentence P@1 are both within POOL_MAX_LOSS points of the unpooled index's (factor 1, same bits).
POOL_MAX_LOSS = 0.5


def _factor(value: str):
    from agrame.pooling import check_pool_factor

    try:
        return check_pool_factor(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_pooling(args) -> None:
    """Token pooling's frontier (:mod:`agrame.pooling`): the pool's index at each pool factor × residual
    bits, built from the cached vectors — bytes per *original* token (text excluded), build seconds
    from the cached vectors, and staged search at the index's defaults on SQuAD *train* questions
    (passage P@1 / R@100, sentence P@1), with each row's loss against factor 1 at the same bits; then the
    shipped factor by the rule written beside ``POOL_MAX_LOSS``. The result is rewritten after each row
    (the indexes are cached: a killed run resumes)."""
    torch.set_num_threads(args.threads)
    pool = load_pool()
    questions = _train_questions(pool, args.limit, args.seed)
    vectors = PoolVectors(args.model, pool)
    encoder = vectors.encoder
    alpha = encoder.settings.alpha
    harness = Harness("pool", pool.texts, vectors.spans)
    encoded = encode_queries(encoder, [q.text for q in questions])
    rows: List[dict] = []

    def finish() -> Path:
        for row in rows:
            base = next((r for r in rows if r["nbits"] == row["nbits"] and r["pool_factor"] == 1), None)
            if base is not None:
                row["loss_vs_factor_1"] = {k: round(base["metrics"][k] - row["metrics"][k], 2)
                                           for k in ("psg_p1", "sent_p1", "psg_r100")}
        within = [r for r in rows if r["nbits"] == POOL_SHIPPED_NBITS and "loss_vs_factor_1" in r
                  and r["loss_vs_factor_1"]["psg_p1"] <= POOL_MAX_LOSS and r["loss_vs_factor_1"]["sent_p1"] <= POOL_MAX_LOSS]
        chosen = min(within, key=lambda r: r["bytes_per_original_token"]) if within else None
        result = {"benchmark": "index_search", "what": "token pooling frontier", "model": encoder.source,
                  "fingerprint": encoder.fingerprint()[:12], "threads": torch.get_num_threads(),
                  "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}), "
                          f"the pool's {len(pool)} passages",
                  "rule": f"at {POOL_SHIPPED_NBITS} bits, the smallest index (bytes per original token) whose passage "
                          f"and sentence P@1 are within {POOL_MAX_LOSS} of factor 1's (written before the rows)",
                  "rows": rows,
                  "chosen": None if chosen is None else {k: chosen[k] for k in ("pool_factor", "nbits",
                                                                                 "bytes_per_original_token")}}
        out = write_result(_tagged("index_search-pooling", args), result, None,
                           command_line("benchmarks.index_search", ["pooling", *args.argv]))
        if args.store and chosen is not None and len(rows) == len(args.nbits) * len(args.factors):
            print(f"stored with the model: {store_with_model(args.model, 'pool_factor', chosen['pool_factor'])}")
        return out

    for nbits in args.nbits:
        for factor in args.factors:
            path, built = build(vectors, nbits, pool_factor=factor)
            index = Index(path, model=encoder)
            store = index.store
            original = int(store.manifest.get("num_original_tokens", store.num_tokens))
            settings = SearchSettings(index.defaults.nprobe, index.defaults.ncandidates, index.defaults.per_hit)
            per, start = [], time.perf_counter()
            for k, q in enumerate(tqdm(questions, desc=f"factor {factor:g}, {nbits} bits", disable=None)):
                passages, sentences = index_rankings(index, *encoded[k], alpha, settings, harness.sent_starts,
                                                     vectors.spans)
                m = judge("squad-dev", harness, q, passages, sentences, passages)  # SQuAD's gold rule (answer_start)
                m["psg_r100"] = m.pop("first_stage_r100")
                per.append(m)
            rows.append({"pool_factor": factor, "nbits": nbits, "stored_vectors": int(store.num_tokens),
                         "original_tokens": original,
                         "vectors_per_original_token": round(store.num_tokens / original, 4),
                         "bytes_per_original_token": round(store.bytes(include_text=False) / original, 2),
                         "num_centroids": store.codec.num_centroids, **built,
                         "ms_per_question_passage_and_sentence": round(1000 * (time.perf_counter() - start)
                                                                       / len(questions), 1),
                         "search": index.defaults._asdict(), "metrics": summarize(per)})
            print(rows[-1], flush=True)
            store.close()
            out = finish()
    print(f"→ {out}")


def cmd_pool_latency(args) -> None:
    """Search-only latency of the pool's index at each ``--factors`` (same bits, same defaults) at passage
    k = 10 / 100 and sentence k = 10, in passes A B … B A of one run over the same query vectors."""
    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    indexes = {f: Index(build(vectors, args.nbits, pool_factor=f)[0], model=encoder) for f in args.factors}
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    queries = encode_queries(encoder, [q.text for q in questions])
    for index in indexes.values():  # warm: every file read once, then a few queries per case
        for f in sorted(p for p in Path(index.path).rglob("*") if p.is_file()):
            with open(f, "rb") as handle:
                while handle.read(1 << 24):
                    pass
        for g, k in ENGINE_CASES:
            for q, s in queries[:5]:
                index.search_vectors(q, s, g, k)
    times = {f: {f"{g} k={k}": [] for g, k in ENGINE_CASES} for f in indexes}
    order = list(indexes)
    for f in order + order[::-1]:
        for g, k in ENGINE_CASES:
            for q, s in tqdm(queries, desc=f"factor {f:g}, {g} k={k}", disable=None):
                t = time.perf_counter()
                indexes[f].search_vectors(q, s, g, k)
                times[f][f"{g} k={k}"].append(1000 * (time.perf_counter() - t))
    pct = lambda xs, p: round(float(np.percentile(xs, p)), 1)  # noqa: E731
    ms = {f"{f:g}": {case: {"median": pct(xs, 50), "p95": pct(xs, 95)} for case, xs in cases.items()}
          for f, cases in times.items()}
    first = f"{order[0]:g}"
    result = {"benchmark": "index_search", "what": "token pooling latency", "model": encoder.source,
              "fingerprint": encoder.fingerprint()[:12], "nbits": args.nbits, "threads": torch.get_num_threads(),
              "queries": f"squad-dev, {len(questions)} sampled (seed {args.seed}), query vectors encoded beforehand",
              "search": {f"{f:g}": ix.defaults._asdict() for f, ix in indexes.items()},
              "ms_search_only": ms,
              "ratio_to_factor_" + first: {f: {case: round(v[case]["median"] / ms[first][case]["median"], 3)
                                                for case in v} for f, v in ms.items()}}
    out = write_result(_tagged(f"index_search-pool-latency-{_bits(args.nbits)}", args), result, None,
                       command_line("benchmarks.index_search", ["pool-latency", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


ENGINE_CASES = (("passage", 10), ("passage", 100), ("sentence", 10))
#: The exact stage's decompression chunk before issue 41 (the whole candidate set decompressed, then scored
#: in ranker.CHUNK_TOKENS chunks): the in-run baseline of ``engine``.
EAGER_CHUNK = 65_536
#: The passage budget shipped before the default model's own choice (``choose --model zero-shot``: 5).
PER_HIT_BEFORE = 10


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cmd_engine(args) -> None:
    """Search-only latency of the shipped defaults at passage k = 10 / 100 and sentence k = 10 beside
    the same engine at the passage budget shipped before (``PER_HIT_BEFORE`` per hit) and the engine
    before issue 41 (that budget, and one decompression of the candidate set, ``EAGER_CHUNK``), in passes
    A B C C B A of one run; and the engine's resident memory at search against the index's size on disk."""
    from agrame.index.codec import CompressedVectors

    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    path, _ = build(vectors, args.nbits, pool_factor=args.pool_factor)
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    queries = encode_queries(encoder, [q.text for q in questions])
    rss_before = _rss_mb()
    index = Index(path, model=encoder)
    disk = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    # name: (exact-stage chunk, passages scored exactly per hit)
    variants = {"shipped": (CompressedVectors.chunk_tokens, index.defaults.per_hit),
                f"per hit {PER_HIT_BEFORE}": (CompressedVectors.chunk_tokens, PER_HIT_BEFORE),
                "engine before": (EAGER_CHUNK, PER_HIT_BEFORE)}
    times: Dict[str, Dict[str, List[float]]] = {v: {f"{g} k={k}": [] for g, k in ENGINE_CASES} for v in variants}
    for g, k in ENGINE_CASES:  # warm-up: every case once per variant
        for chunk, per_hit in variants.values():
            CompressedVectors.chunk_tokens = chunk
            for q, s in queries[:5]:
                index.search_vectors(q, s, g, k, per_hit=per_hit)
    # Passes in the order A B C C B A: drift cancels, and no query is timed right after the engine before's
    # (it moves 180 MB per passage top 100, which slows whatever runs next). The engine's memory is read
    # after the first pass, before the engine before's big buffers have grown the heap.
    engine_mb = None
    names = list(variants)
    for name in names + names[::-1]:
        CompressedVectors.chunk_tokens, per_hit = variants[name]
        for g, k in ENGINE_CASES:
            for q, s in tqdm(queries, desc=f"{name}, {g} k={k}", disable=None):
                t = time.perf_counter()
                index.search_vectors(q, s, g, k, per_hit=per_hit)
                times[name][f"{g} k={k}"].append(1000 * (time.perf_counter() - t))
        if engine_mb is None:
            engine_mb = _rss_mb() - rss_before
    CompressedVectors.chunk_tokens = variants["shipped"][0]
    pct = lambda xs, p: round(float(np.percentile(xs, p)), 1)  # noqa: E731
    ms = {name: {case: {"median": pct(xs, 50), "p95": pct(xs, 95)} for case, xs in cases.items()}
          for name, cases in times.items()}
    ratios = {name: {case: round(ms["shipped"][case]["median"] / ms[name][case]["median"], 3) for case in times[name]}
              for name in names[1:]}
    result = {"benchmark": "index_search", "what": "engine latency", "model": encoder.source,
              "fingerprint": encoder.fingerprint()[:12], "nbits": args.nbits, "threads": torch.get_num_threads(),
              "queries": f"squad-dev, {len(questions)} sampled (seed {args.seed}), query vectors encoded beforehand",
              "search": index.defaults._asdict(), "pool_passages": len(index),
              "variants": {name: {"chunk_tokens": chunk, "per_hit": per_hit} for name, (chunk, per_hit) in variants.items()},
              "ms_search_only": ms, "ratio_shipped_over": ratios,
              "memory": {"index_bytes_on_disk": disk, "engine_rss_mb": round(engine_mb, 1),
                         "rss_over_index_size": round(engine_mb * 2 ** 20 / disk, 3),
                         "how": "resident memory after the first pass (every case, shipped) minus before the index was "
                                "opened (model and query vectors loaded before); memory-mapped pages read count"}}
    out = write_result(_tagged(f"index_search-engine-{_bits(args.nbits)}", args), result, None,
                       command_line("benchmarks.index_search", ["engine", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


STAGE_BUDGETS = (32, 64, 128, 256, 1024)
WARP_NPROBES = (4, 8, 16, 32)


def cmd_stages(args) -> None:
    """Candidate generation by centroid pruning (the engine's stages 1–2) beside WARP's lookup-table
    scoring of the probed centroids' tokens (``Index.warp_candidates``), on SQuAD *train* questions:
    recall of the exact top 10 within each candidate budget, and ms per candidate generation. The exact
    top 10 is taken over the union of both methods' 2,048 best (scored exactly, decompressed), which holds
    it unless both miss a passage. Also the compressed stage: scoring every token of the 128 best passages
    by tables against decompress-then-dot (the exact stage), ms each."""
    from agrame.index.lut import residual_tables, table_scores

    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    encoder = vectors.encoder
    path, _ = build(vectors, args.nbits, pool_factor=args.pool_factor)
    index = Index(path, model=encoder)
    store = index.store
    nprobe = index.defaults.nprobe
    queries = encode_queries(encoder, [q.text for q in _train_questions(vectors.pool, args.limit, args.seed)])
    index.warp_candidates(queries[0][0], 1, 1)  # the token lists are built once per opened index
    methods = {f"centroid pruning (nprobe {nprobe})": lambda q, n: index.candidates(q, nprobe, n)}
    methods.update({f"lookup tables (nprobe {p})": (lambda p: lambda q, n: index.warp_candidates(q, p, n))(p)
                    for p in WARP_NPROBES})
    recall = {m: {n: [] for n in STAGE_BUDGETS} for m in methods}
    ms = {m: [] for m in methods}
    compressed = {"tables": [], "decompress then dot": []}
    for q, _ in tqdm(queries, desc="stages", disable=None):
        union = np.union1d(index.candidates(q, nprobe, 2048), index.warp_candidates(q, nprobe, 2048))
        top = {h.passage_id for h in index._score(q, None, np.sort(union), "passage", 10, 0.5)}
        for name, method in methods.items():
            for n in STAGE_BUDGETS:
                got = {store.record(int(p))["id"] for p in method(q, n)}
                recall[name][n].append(len(top & got) / len(top))
            t = time.perf_counter()
            method(q, 128)
            ms[name].append(1000 * (time.perf_counter() - t))
        best = np.sort(index.candidates(q, nprobe, 128))
        rows = store.token_rows(best)
        t = time.perf_counter()
        length = q.shape[0]
        query_ids = np.repeat(np.arange(length), len(rows))
        table_scores(residual_tables(q, store.codec), query_ids, np.tile(store.residuals[rows], (length, 1)))
        compressed["tables"].append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        index._score(q, None, best, "passage", 10, 0.5)
        compressed["decompress then dot"].append(1000 * (time.perf_counter() - t))
    result = {"benchmark": "index_search", "what": "candidate stages", "model": encoder.source,
              "fingerprint": encoder.fingerprint()[:12], "nbits": args.nbits, "threads": torch.get_num_threads(),
              "queries": f"squad-train, {len(queries)} sampled (seed {args.seed}), one per paragraph",
              "pool_passages": len(index), "tokens": int(store.num_tokens),
              "recall_of_exact_top10": {m: {str(n): round(100 * float(np.mean(v)), 2) for n, v in r.items()}
                                        for m, r in recall.items()},
              "ms_candidates_128": {m: round(float(np.median(v)), 2) for m, v in ms.items()},
              "ms_compressed_stage_128_passages": {m: round(float(np.median(v)), 2) for m, v in compressed.items()}}
    out = write_result(_tagged(f"index_search-stages-{_bits(args.nbits)}", args), result, None,
                       command_line("benchmarks.index_search", ["stages", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def cmd_build_time(args) -> None:
    """The pooled index's build time for each of ``--models``, measured in one run so the ratios compare.

    Building is encoding every pool passage, then compressing the vectors. The first part is timed on
    a seeded sample of the pool (``--passages``, the same passages for every model, after a warm-up)
    and scaled to the pool by passage count; the second is timed whole, from the cached pool vectors
    (``benchmarks.encodings``), into a scratch folder. Every encoding of a model is done before any
    compression, so the models' encodings see the same machine state.
    """
    import gc
    import tempfile

    torch.set_num_threads(args.threads)
    pool = load_pool()
    if args.pool_limit is not None:
        pool, _ = restrict_pool(pool, [], args.pool_limit, args.seed)
    chosen = sorted(sample(range(len(pool)), args.passages, args.seed))
    texts = [pool.texts[i] for i in chosen]
    rows = []
    for model in args.models:
        encoder = load_encoder(model)
        encoder.encode_passages(texts[:16])  # warm-up: lazy loads, allocator
        start = time.perf_counter()
        encoded = encoder.encode_passages(texts)
        seconds = time.perf_counter() - start
        tokens = sum(e.vectors.shape[0] for e in encoded)
        for factor in args.pool_factors:  # the encoding is the same whatever the index pools
            rows.append({"model": model, "source": encoder.source, "dim": encoder.dim, "pool_factor": factor,
                         "sample_encode_seconds": round(seconds, 1), "sample_tokens": tokens,
                         "encode_seconds_pool_estimate": round(seconds * len(pool) / len(texts), 1)})
        del encoder, encoded
    for model in args.models:
        vectors = PoolVectors(model, pool)
        corpus = vectors.corpus()
        passages = [Passage(str(i), t) for i, t in enumerate(pool.texts)]
        for row in (r for r in rows if r["model"] == model):
            with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".build-time-") as tmp:
                start = time.perf_counter()
                build_compressed(vectors.encoder, passages, Path(tmp) / "index", nbits=args.nbits,
                                 sentences=vectors.spans, encoded=corpus, progress=False, pool_factor=row["pool_factor"])
                row["compress_seconds"] = round(time.perf_counter() - start, 1)
            row["pool_tokens"] = corpus.num_tokens
            row["build_seconds_estimate"] = round(row["encode_seconds_pool_estimate"] + row["compress_seconds"], 1)
        del vectors, corpus
        gc.collect()
    base = rows[0]["build_seconds_estimate"]
    for row in rows:
        row["ratio_to_first"] = round(row["build_seconds_estimate"] / base, 2)
    result = {"benchmark": "index_search", "what": "build time", "nbits": args.nbits, "threads": args.threads,
              "pool_passages": len(pool),
              "sample": {"passages": len(texts), "seed": args.seed, "of": "the pooled corpus"},
              "protocol": "encode: the sample's time × pool passages / sample passages; compress: the whole "
                          "pool from cached vectors; every model in this one run",
              "models": rows}
    name = "index_search-build-time-" + "-vs-".join(re.sub(r"[^A-Za-z0-9.]+", "_", Path(m).name) for m in args.models)
    if args.pool_factors != [1]:
        name += "-pool-" + "-".join(f"{f:g}" for f in args.pool_factors)
    out = write_result(name, result, args.out, command_line("benchmarks.index_search", ["build-time", *args.argv]))
    for row in rows:
        print(f"{row['model']} (pool factor {row['pool_factor']:g}): encode ≈ {row['encode_seconds_pool_estimate']} s + "
              f"compress {row['compress_seconds']} s"
              f" = {row['build_seconds_estimate']} s (×{row['ratio_to_first']})")
    print(f"→ {out}")


class SyntheticSource:
    """Clustered unit token vectors generated chunk by chunk (seeded), as an index build input.

    4,096 topic directions; each passage draws its tokens around 3 topics (noise σ = 0.08 per
    dimension, ‖noise‖ ≈ 0.9: tokens of one topic have cosine ≈ 0.55, like real contextual
    token vectors, not tight clusters); 60–200 tokens per passage; one sentence per passage.
    """

    topics = 4096

    def __init__(self, num_tokens: int, dim: int = 128, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.dim, self.seed = dim, seed
        self.centers = _unit(rng.normal(size=(self.topics, dim))).astype(np.float32)
        lengths = []
        total = 0
        while total < num_tokens:
            n = int(rng.integers(60, 201))
            lengths.append(n)
            total += n
        self.lengths = np.array(lengths, dtype=np.int64)
        self.num_tokens = int(total)

    def passages(self) -> List[Passage]:
        # Text is excluded from the size targets; a word per token keeps offsets valid.
        return [Passage(str(i), "x " * int(n)) for i, n in enumerate(self.lengths)]

    def sentences(self) -> List[List[Tuple[int, int]]]:
        return [[(0, 2 * int(n) - 1)] for n in self.lengths]

    def vectors(self, lo: int, hi: int) -> List[np.ndarray]:
        rng = np.random.default_rng([self.seed, lo])
        out = []
        for n in self.lengths[lo:hi]:
            topics = rng.integers(0, self.topics, 3)
            v = self.centers[rng.choice(topics, int(n))] + 0.08 * rng.normal(size=(int(n), self.dim)).astype(np.float32)
            out.append(_unit(v).astype(np.float32))
        return out

    def sample_vectors(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        picks = np.sort(rng.choice(len(self.lengths), min(len(self.lengths), n // 60 + 1), replace=False))
        rows = np.concatenate([self.vectors(int(p), int(p) + 1)[0] for p in picks])
        return rows[rng.choice(len(rows), min(n, len(rows)), replace=False)]

    def chunks(self, passages, chunk, bar):
        from agrame.encoder import EncodedPassage

        for lo in range(0, len(passages), chunk):
            part = list(passages[lo:lo + chunk])
            encoded = []
            for v in self.vectors(lo, lo + len(part)):
                n = len(v)
                offsets = np.stack([2 * np.arange(n), 2 * np.arange(n) + 1], axis=1)
                encoded.append(EncodedPassage(torch.from_numpy(v), torch.from_numpy(offsets)))
            if bar is not None:
                bar.update(len(part))
            yield lo, part, encoded


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def cmd_scale(args) -> None:
    """Build an index of synthetic tokens, then time searches in a fresh process (its own peak memory)."""
    import subprocess
    import sys

    tokens = int(args.tokens)
    path = cache_root() / f"index-synthetic-{tokens}-{args.nbits}b"
    if args.search_only:
        torch.set_num_threads(args.threads)
        index = Index(path, model=_SyntheticModel())
        source = SyntheticSource(tokens, seed=args.seed)
        rng = np.random.default_rng(1)
        times = []
        for i in range(args.queries + 5):
            p = int(rng.integers(0, len(source.lengths)))
            v = source.vectors(p, p + 1)[0][:32]
            q = torch.from_numpy(_unit(v + 0.05 * rng.normal(size=v.shape)).astype(np.float32))
            t = time.perf_counter()
            index.search_vectors(q, q, "sentence", 10, alpha=0.5)
            if i >= 5:
                times.append(1000 * (time.perf_counter() - t))
        print(json.dumps({"median_ms": round(statistics.median(times), 1),
                          "p95_ms": round(float(np.percentile(times, 95)), 1),
                          "peak_rss_mb": peak_rss_mb()}))
        return
    source = SyntheticSource(tokens, seed=args.seed)
    if path.exists() and offsets_stored(read_manifest(path)):
        shutil.rmtree(path)  # built before offsets were dropped from the format: not today's layout
    facts = path.with_name(path.name + ".codec")
    codec, codec_info = _synthetic_codec(source, facts, args.nbits)
    if path.exists() and not (facts / "build.json").exists():
        shutil.rmtree(path)  # its build was not timed (or was cut off): build again
    if not path.exists():
        start = time.perf_counter()
        build_compressed(_SyntheticModel(), source.passages(), path, nbits=args.nbits, sentences=source.sentences(),
                         encoded=source, chunk_passages=2048, codec=codec)
        # Kept beside the codec so that a later run (e.g. timing the search alone) reports the build.
        (facts / "build.json").write_text(json.dumps({
            "seconds": time.perf_counter() - start,
            "peak_rss_mb": peak_rss_mb()}))
    built = json.loads((facts / "build.json").read_text())
    manifest = json.loads((path / "manifest.json").read_text())
    store_bytes = Index(path, model=_SyntheticModel()).store.bytes(include_text=False)
    search = subprocess.run([sys.executable, "-m", "benchmarks.index_search", "scale", "--search-only",
                             "--tokens", str(tokens), "--nbits", str(args.nbits), "--threads", str(args.threads),
                             "--queries", str(args.queries), "--seed", str(args.seed)],
                            check=True, capture_output=True, text=True)
    timing = json.loads(search.stdout.strip().splitlines()[-1])
    result = {"benchmark": "index_search", "what": "scale (synthetic clustered token vectors)",
              "generator": SyntheticSource.__doc__.split("\n\n")[1].strip(), "tokens": manifest["num_tokens"],
              "passages": manifest["num_passages"], "dim": 128, "nbits": args.nbits,
              "num_centroids": manifest["num_centroids"], "codec": codec_info,
              "build_seconds": round(codec_info["kmeans_seconds"] + built["seconds"], 1),
              "build_seconds_after_kmeans": round(built["seconds"], 1),
              "build_peak_rss_mb": round(max(built["peak_rss_mb"], codec_info["peak_rss_mb"])),
              "disk_bytes_text_excluded": store_bytes,
              "disk_gb_text_excluded": round(store_bytes / 1e9, 3),
              "bytes_per_token": round(store_bytes / manifest["num_tokens"], 2),
              "search": {"granularity": "sentence", "top_k": 10, "threads": args.threads,
                         "queries": args.queries, **SearchSettings()._asdict(), **timing}}
    out = write_result(f"index_search-scale-{tokens}-{args.nbits}b", result, args.out,
                       command_line("benchmarks.index_search", ["scale", *args.argv]))
    print(result, "→", out)


def _synthetic_codec(source: "SyntheticSource", folder: Path, nbits: int):
    """The build's k-means (what build_compressed would train), kept on disk: at 10⁸ tokens it is
    ~¾ h of the ~2 h build on 2 cores, so a build cut off by a session's end restarts after it."""
    from agrame.index import ResidualCodec
    from agrame.index.store import train_codec_from

    if (folder / "codec.json").exists():
        info = json.loads((folder / "codec.json").read_text())
        arrays = np.load(folder / "codec.npz")
        return ResidualCodec(arrays["centroids"], arrays["cutoffs"], arrays["weights"], nbits), info
    codec, _, info = train_codec_from(source, nbits)
    info["peak_rss_mb"] = peak_rss_mb()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.savez(tmp / "codec.npz", centroids=codec.centroids, cutoffs=codec.cutoffs, weights=codec.weights)
    (tmp / "codec.json").write_text(json.dumps(info))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return codec, info


class _SyntheticModel:
    """What an index records of its model, for vectors that no model made."""

    source = "synthetic"

    def __init__(self):
        from agrame.encoder import EncoderSettings

        self.settings = EncoderSettings(dim=128)

    def fingerprint(self) -> str:
        return "synthetic"

    def passage_offsets(self, texts: Sequence[str]) -> List[torch.Tensor]:
        # One "x " word per token (SyntheticSource.passages): the tokenizer of these texts.
        return [torch.from_numpy(np.stack([2 * np.arange(len(t) // 2), 2 * np.arange(len(t) // 2) + 1], axis=1))
                for t in texts]


def _add_search_commands(sub) -> None:
    """The compressed index's commands: build, run, choose, latency, engine, stages, frontier, scale."""
    b = sub.add_parser("build", help="compress the cached pool encodings and report sizes")
    b.add_argument("--nbits", type=codec_arg, nargs="+", default=[2, 4])
    b.add_argument("--overwrite", action="store_true")
    r = sub.add_parser("run", help="full-corpus retrieval metrics")
    r.add_argument("--dataset", required=True, choices=("squad-dev", "nq-oracle"))
    r.add_argument("--first-stage", required=True, choices=("agrame", "exact", "single-vector"),
                   help="agrame: the compressed index; exact: every float16 token vector; single-vector: a "
                        "dot product over the single vectors of every passage and sentence (--baseline-model)")
    r.add_argument("--baseline-model", default=None,
                   help="single-vector model (all-MiniLM-L6-v2 by default; e5-small: multilingual-e5-small)")
    r.add_argument("--nbits", type=codec_arg, default=2)
    r.add_argument("--nprobe", type=int, default=None)
    r.add_argument("--ncandidates", type=int, default=None)
    r.add_argument("--per-hit", type=int, default=None,
                   help="a passage search scores at least per_hit × k passages exactly (default: the index's)")
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--alpha", type=float, default=None)
    r.add_argument("--out", default=None)
    r.add_argument("--pool-limit", type=int, default=None,
                   help="smoke tests only: the sample's gold passages and this many other pool passages")
    c = sub.add_parser("choose", help="choose nprobe/ncandidates on SQuAD train questions")
    c.add_argument("--nbits", type=codec_arg, default=2)
    c.add_argument("--limit", type=int, default=100)
    c.add_argument("--store", action="store_true",
                   help="write the choice into the shipped model's settings (agrame/models/NAME/agrame.json)")
    la = sub.add_parser("latency", help="median/p95 ms per sentence query")
    la.add_argument("--nbits", type=codec_arg, default=2)
    la.add_argument("--limit", type=int, default=300)
    la.add_argument("--threads", type=int, default=2)
    en = sub.add_parser("engine", help="search-only ms at passage k=10/100 and sentence k=10, the engine before "
                                       "beside (one run), and the engine's memory")
    en.add_argument("--nbits", type=codec_arg, default=2)
    en.add_argument("--limit", type=int, default=200)
    en.add_argument("--threads", type=int, default=2)
    sg = sub.add_parser("stages", help="candidate generation: centroid pruning beside lookup tables (WARP), on "
                                       "SQuAD train questions")
    sg.add_argument("--nbits", type=codec_arg, default=2)
    sg.add_argument("--limit", type=int, default=100)
    sg.add_argument("--threads", type=int, default=2)
    fr = sub.add_parser("frontier", help="bytes per token against P@1/R@100 of models x residual bits, beside "
                                         "each model's float16 scan (SQuAD train)")
    fr.add_argument("--models", nargs="+", default=list(FRONTIER_MODELS))
    fr.add_argument("--nbits", type=codec_arg, nargs="+", default=list(FRONTIER_NBITS))
    fr.add_argument("--limit", type=int, default=300)
    fr.add_argument("--seed", type=int, default=0)
    fr.add_argument("--threads", type=int, default=1)
    sc = sub.add_parser("scale", help="build and search synthetic indexes of --tokens tokens")
    sc.add_argument("--tokens", type=float, default=1e7)
    sc.add_argument("--nbits", type=int, default=2)
    sc.add_argument("--threads", type=int, default=2)
    sc.add_argument("--queries", type=int, default=100)
    sc.add_argument("--out", default=None, help="result file (default: benchmarks/results/…)")
    sc.add_argument("--search-only", action="store_true", help=argparse.SUPPRESS)
    for p in (b, r, c, la, en, sg):
        p.add_argument("--pool-factor", type=_factor, default=1,
                       help="token pooling of the index (agrame.pooling; default 1: one vector per token)")
    sc.set_defaults(pool_factor=1)
    for p in (b, r, c, la, en, sg, sc):
        p.add_argument("--model", default=None, help="multi-vector model (default: the package default)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tag", default=None, help="label of the model (kept in result file names, e.g. zeroshot)")


def _add_pooling_commands(sub) -> None:
    """Token pooling's commands and the build-time comparison of models."""
    po = sub.add_parser("pooling", help="token pooling's frontier: pool factors x residual bits on SQuAD train, "
                                        "and the shipped factor by its rule")
    po.add_argument("--factors", type=_factor, nargs="+", default=list(POOL_FACTORS))
    po.add_argument("--nbits", type=codec_arg, nargs="+", default=list(POOL_NBITS))
    po.add_argument("--limit", type=int, default=1000)
    po.add_argument("--threads", type=int, default=1)
    po.add_argument("--store", action="store_true",
                    help="write the chosen factor into the shipped model's settings (agrame/models/NAME/agrame.json)")
    pl = sub.add_parser("pool-latency", help="search-only ms of the pool's index at several pool factors, one run")
    pl.add_argument("--factors", type=_factor, nargs="+", default=[1, 2])
    pl.add_argument("--nbits", type=codec_arg, default=2)
    pl.add_argument("--limit", type=int, default=200)
    pl.add_argument("--threads", type=int, default=2)
    for p in (po, pl):
        p.add_argument("--model", default=None, help="multi-vector model (default: the package default)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tag", default=None, help="label of the model (kept in result file names)")
        p.set_defaults(pool_factor=1)
    bt = sub.add_parser("build-time", help="pooled-index build time of several models, in one run")
    bt.add_argument("--models", nargs="+", required=True, help="multi-vector models; ratios are to the first")
    bt.add_argument("--passages", type=int, default=1000, help="pool passages encoded per model (seeded sample)")
    bt.add_argument("--nbits", type=codec_arg, default=2)
    bt.add_argument("--threads", type=int, default=2)
    bt.add_argument("--seed", type=int, default=0)
    bt.add_argument("--out", default=None, help="result file (default: benchmarks/results/…)")
    bt.add_argument("--pool-limit", type=int, default=None, help="smoke tests only: this many pool passages")
    bt.add_argument("--pool-factors", type=_factor, nargs="+", default=[1],
                    help="token pooling of each model's index (agrame.pooling): one row per model and factor")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_search_commands(sub)
    _add_pooling_commands(sub)
    args = parser.parse_args(argv)
    args.argv = list(argv[1:] if argv is not None else os.sys.argv[2:])  # the arguments after the subcommand
    {"build": cmd_build, "run": cmd_run, "choose": cmd_choose, "latency": cmd_latency,
     "engine": cmd_engine, "stages": cmd_stages, "frontier": cmd_frontier, "scale": cmd_scale, "build-time": cmd_build_time,
     "pooling": cmd_pooling, "pool-latency": cmd_pool_latency}[args.cmd](args)


if __name__ == "__main__":
    main()

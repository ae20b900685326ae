"""Residual codecs at fixed centroids: what each would cost in bytes and P@1 (issue 64, ≤ 20 B/token).

    python -m benchmarks.residual_codecs --limit 1000 --threads 2

A compressed token is its centroid id plus a coded residual. Stages 1–2 of a search read centroid ids
only; the residual codec matters to the exact stage alone. So a candidate residual codec can be judged
without building an index: the default model's 2-bit pool index gives the centroids, every token's
centroid id and the candidates; each codec here codes the *same* residuals (the cached float16 pool
encodings minus their centroids), and the exact stage scores the reconstructions instead of the 2-bit
ones. The 2-bit row run this way equals the index's own decompression bit for bit (checked on every
run), so the other rows differ from it by their codec only.

Codecs: the index's scalar codec at 1 and 2 bits (one set of bucket quantiles for every dimension),
faiss product quantizers of the residuals (``m`` sub-vectors of ``128/m`` dimensions, ``2^b`` codewords
each, trained on a residual sample), ``m·b/8`` bytes a token, and the index's additive codec
(:class:`agrame.index.codec.AdditiveCodec`: ``m`` codebooks of whole 128-d codewords, faiss's residual
quantizer trained as a build trains it, tokens coded by its beam search), ``m·b/8`` bytes too. Bytes per token: the 2-bit index's files
without its residuals (centroid ids, centroids, inverted file, sentence tables), plus each codec's codes
and codebooks. Questions: SQuAD *train* (issue 53's sample), never a reported split.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from agrame.index import Index
from agrame.index.codec import pack_codes
from agrame.index.format import SearchSettings

#: Written on 2026-11-28, before any row below was measured (issue 64, item 2). Among the formats at
#: ≤ 20.0 bytes per original token, the default format becomes the one with the smallest
#: max(passage P@1 loss, sentence P@1 loss) against today's 2-bit format on SQuAD train (1,000 questions,
#: issue 53's sample), if that max is ≤ 0.5; otherwise the default stays 2-bit and the frontier is reported.
#: A residual codec measured here at fixed centroids is a candidate; one that passes is then built as a real
#: index format and measured again, with the same rule, on the reported splits (squad-dev, nq-oracle).
FORMAT_RULE = ("among formats at <= 20.0 bytes per original token, the smallest max(passage P@1 loss, sentence "
               "P@1 loss) against today's 2-bit format on SQuAD train (1,000 questions), if <= 0.5; else 2-bit stays")
MAX_BYTES = 20.0
MAX_LOSS = 0.5


@dataclass(frozen=True)
class Codec:
    name: str
    kind: str  # "scalar", "pq", "opq" (pq after a learned rotation, faiss's OPQMatrix) or "rq" (additive)
    nbits: int  # scalar: bits a dimension; pq: bits a sub-vector code
    m: int = 0  # pq: sub-vectors

    def bytes_per_token(self, dim: int) -> float:
        return dim * self.nbits / 8 if self.kind == "scalar" else self.m * self.nbits / 8


CODECS = (Codec("scalar 2-bit (today)", "scalar", 2), Codec("scalar 1-bit", "scalar", 1),
          Codec("PQ 32 × 8 bits", "pq", 8, 32), Codec("PQ 16 × 8 bits", "pq", 8, 16),
          Codec("PQ 16 × 6 bits", "pq", 6, 16), Codec("PQ 32 × 4 bits", "pq", 4, 32),
          Codec("PQ 8 × 8 bits", "pq", 8, 8), Codec("PQ 16 × 4 bits", "pq", 4, 16),
          # added 2026-11-29, under the same rule, before their rows were measured
          Codec("PQ 16 × 7 bits", "pq", 7, 16), Codec("OPQ 16 × 6 bits", "opq", 6, 16),
          Codec("OPQ 16 × 7 bits", "opq", 7, 16), Codec("OPQ 16 × 8 bits", "opq", 8, 16),
          # added 2026-12-01, under the same rule, before their rows were measured: residual quantization
          # (agrame.index.codec.AdditiveCodec, the codec a build trains and codes with)
          Codec("RQ 12 × 8 bits", "rq", 8, 12), Codec("RQ 13 × 8 bits", "rq", 8, 13),
          Codec("RQ 14 × 8 bits", "rq", 8, 14), Codec("RQ 16 × 7 bits", "rq", 7, 16),
          Codec("RQ 15 × 8 bits", "rq", 8, 15))
CHUNK = 1 << 18


class TableVectors:
    """Stands in for the store's codec in the exact stage: a "packed residual" is a token's row, decoded
    from a table of reconstructed (unnormalised) vectors and renormalised as the codec does."""

    def __init__(self, codec, table: np.ndarray):
        self.codec, self.table = codec, table

    def decompress(self, codes: np.ndarray, rows: np.ndarray, normalize: bool = True) -> torch.Tensor:
        vectors = torch.from_numpy(np.take(self.table, np.asarray(rows).reshape(-1), axis=0))
        if normalize and len(vectors):
            vectors /= vectors.norm(dim=1, keepdim=True).clamp_min_(1e-12)
        return vectors

    def table_form(self, codes: np.ndarray, packed: np.ndarray) -> tuple:
        """The compiled exact stage's form (:func:`agrame.scoring.compressed_run_max`): a zero centroid plus
        one group as wide as a token, its table row the token's reconstruction (the same float32 sums)."""
        return (np.zeros((1, self.table.shape[1]), dtype=np.float32), np.zeros(len(codes), dtype=np.int64),
                np.asarray(packed, dtype=np.int64).reshape(-1, 1), self.table)

    def __getattr__(self, name):
        return getattr(self.codec, name)


def residual_sample(original, codes: np.ndarray, centroids: np.ndarray, size: int, seed: int) -> np.ndarray:
    rows = np.sort(np.random.default_rng(seed).choice(len(codes), min(size, len(codes)), replace=False))
    return np.asarray(original[rows], dtype=np.float32) - centroids[codes[rows]]


def reconstruct(spec: Codec, index_codec, original, codes: np.ndarray, sample: np.ndarray) -> tuple:
    """Every token's centroid + coded residual ``[T, d]`` float32 (unnormalised), and the codebook bytes."""
    import faiss

    centroids = index_codec.centroids32
    dim = centroids.shape[1]
    if spec.kind == "scalar" and spec.nbits == index_codec.nbits:
        cutoffs, weights = index_codec.cutoffs, index_codec.weights  # the index's own: checked bit for bit
    elif spec.kind == "scalar":
        buckets = 1 << spec.nbits
        cutoffs = np.quantile(sample.ravel(), np.arange(1, buckets) / buckets).astype(np.float32)
        weights = np.quantile(sample.ravel(), (np.arange(buckets) + 0.5) / buckets).astype(np.float32)
    elif spec.kind == "rq":
        from agrame.index.codec import AdditiveCodec

        rq = AdditiveCodec(index_codec.centroids, AdditiveCodec.train_codebooks(sample, spec.m, spec.nbits, seed=0),
                           spec.nbits)
    else:
        rotation = None
        if spec.kind == "opq":
            rotation = faiss.OPQMatrix(dim, spec.m)
            rotation.train(np.ascontiguousarray(sample))
            sample = rotation.apply_py(np.ascontiguousarray(sample))
        pq = faiss.ProductQuantizer(dim, spec.m, spec.nbits)
        pq.train(np.ascontiguousarray(sample))
    table = np.empty((len(codes), dim), dtype=np.float32)
    for lo in range(0, len(codes), CHUNK):
        hi = min(lo + CHUNK, len(codes))
        base = centroids[codes[lo:hi]]
        residual = np.asarray(original[lo:hi], dtype=np.float32) - base
        if spec.kind == "scalar":
            coded = weights[np.searchsorted(cutoffs, residual, side="right")]
        elif spec.kind == "rq":  # the codec's own coding and decoding (its sum, in codebook order)
            packed = pack_codes(rq.quantize(residual), spec.nbits)
            table[lo:hi] = rq.decompress(codes[lo:hi], packed, normalize=False).numpy()
            continue
        elif rotation is None:
            coded = pq.decode(pq.compute_codes(np.ascontiguousarray(residual)))
        else:
            coded = rotation.reverse_transform(pq.decode(pq.compute_codes(rotation.apply_py(np.ascontiguousarray(residual)))))
        table[lo:hi] = base
        table[lo:hi] += coded  # (the codec's own order of operations: centroid, then += residual)
    book = 4 * (len(weights) + len(cutoffs)) if spec.kind == "scalar" else 4 * rq.codebooks.size if spec.kind == "rq" \
        else 4 * pq.M * pq.ksub * pq.dsub + (4 * dim * dim if spec.kind == "opq" else 0)
    return table, book


def score_codec(spec: Codec, store, codes: np.ndarray, original, sample: np.ndarray, position_of_row: np.ndarray,
                evaluate, rest: int, seed: int) -> dict:
    """One codec's row: its reconstructions put in place of the store's residuals for the exact stage, the
    questions ranked (``evaluate``), the store's own codec put back."""
    real_codec, real_residuals = store.codec, store.residuals
    start = time.perf_counter()
    table, book = reconstruct(spec, real_codec, original, codes, sample)
    # the exact stage reads store.residuals[rows] and codec.decompress(codes, that): rows map to table rows
    store.codec, store.residuals = TableVectors(real_codec, table), position_of_row.reshape(-1, 1)
    try:
        if spec.kind == "scalar" and spec.nbits == real_codec.nbits:
            check = np.random.default_rng(seed).choice(len(codes), 4096, replace=False)
            got = store.codec.decompress(codes[position_of_row[check]], position_of_row[check])
            want = real_codec.decompress(np.asarray(store.codes[check]), np.asarray(real_residuals[check]))
            if not torch.equal(got, want):
                raise SystemExit("error: the table's 2-bit vectors are not the index's decompressed ones")
            # and the exact stage's compiled loop gives the same scores from the table as from the codes
            from agrame import scoring
            hi = int(store.starts[min(200, len(store))])
            starts = np.asarray(store.starts[:min(200, len(store)) + 1])
            queries = torch.nn.functional.normalize(torch.randn(16, real_codec.dim, generator=torch.Generator().manual_seed(seed)), dim=1)
            got = scoring.compressed_run_max(queries, *store.codec.table_form(np.asarray(store.codes[:hi]),
                                                                              store.residuals[:hi]), starts)
            want = scoring.compressed_run_max(queries, *real_codec.table_form(np.asarray(store.codes[:hi]),
                                                                              np.asarray(real_residuals[:hi])), starts)
            if not torch.equal(got, want):
                raise SystemExit("error: the table's 2-bit scores are not the index's compiled ones")
        coded_seconds = time.perf_counter() - start
        metrics = evaluate(spec.name)
    finally:
        store.codec, store.residuals = real_codec, real_residuals
    original_tokens = int(store.num_tokens)
    residual_bytes = spec.bytes_per_token(real_codec.dim)
    row = {"codec": spec.name, "kind": spec.kind, "nbits": spec.nbits, "m": spec.m,
           "residual_bytes_per_token": residual_bytes, "codebook_bytes": book,
           "bytes_per_original_token": round((rest + residual_bytes * original_tokens + book) / original_tokens, 2),
           "code_seconds": round(coded_seconds, 1), "metrics": metrics}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def built_row(name: str, vectors, store, evaluate) -> dict:
    """A row for the pool's index *built* with codec ``name`` (``index_search build --nbits NAME``): what the
    format gives, its codec trained as a build trains it, where the simulated rows code every residual with a
    quantizer trained on a larger residual sample."""
    from .index_search import build

    path, _ = build(vectors, name)
    built = Index(path, model=vectors.encoder)
    if not (np.array_equal(built.store.codec.centroids, store.codec.centroids)
            and np.array_equal(np.asarray(built.store.codes), np.asarray(store.codes))):
        raise SystemExit(f"error: {path.name} does not share the 2-bit index's centroids and centroid ids")
    start = time.perf_counter()
    metrics = evaluate(f"built {name}", built)
    original = int(built.store.manifest.get("num_original_tokens", built.store.num_tokens))
    row = {"codec": f"built {built.store.codec.name}", "kind": "built", "index": path.name,
           "bytes_per_original_token": round(built.store.bytes(include_text=False) / original, 2),
           "seconds": round(time.perf_counter() - start, 1), "metrics": metrics}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


SPLITS = ("squad-dev", "nq-oracle")


def verdict(candidate: str, tag: str, store: bool, model: Optional[str], argv) -> None:
    """The rule's second step: the candidate built as a real index, on the reported splits. Reads the rows
    ``python -m benchmarks.index_search run --dataset D --first-stage agrame --nbits N --per-hit 3 --tag TAG``
    wrote for the candidate and for 2 bits (same centroids and centroid ids: only the residuals differ),
    applies the same rule to every split, and with ``--store`` names the candidate in the shipped model's
    settings (what an index built with it uses unless told otherwise) when it passes on all of them."""
    from agrame.index.codec import residuals_name
    from agrame.loading import DEFAULT_MODEL

    from .common import RESULTS, command_line, write_result
    from .index_search import _bits, store_with_model
    from .shipping import SIZE_TAGS

    candidate = residuals_name(candidate)
    name = model or DEFAULT_MODEL
    if name not in SIZE_TAGS:
        raise SystemExit(f"error: --verdict needs a shipped model with a size tag ({sorted(SIZE_TAGS)}), not {name!r}")
    size_file = RESULTS / f"index_search-size-{_bits(candidate)}-{SIZE_TAGS[name][0]}.json"
    if not size_file.exists():
        raise SystemExit(f"error: {size_file.name} is missing: run python -m benchmarks.index_search build "
                         f"--nbits {candidate} --tag {SIZE_TAGS[name][0]}" + (f" --model {model}" if model else ""))
    size = json.loads(size_file.read_text())
    bytes_per_token = size["bytes_per_original_token_text_excluded"]
    rows, fingerprints = [], set()
    for split in SPLITS:
        runs = {}
        for codec in ("2", candidate):
            path = RESULTS / f"index_search-{split}-agrame-{_bits(codec)}-{tag}.json"
            if not path.exists():
                raise SystemExit(f"error: {path.name} is missing: run python -m benchmarks.index_search run "
                                 f"--dataset {split} --first-stage agrame --nbits {codec} --per-hit 3 --tag {tag}")
            runs[codec] = json.loads(path.read_text())
            fingerprints.add(runs[codec]["fingerprint"])
        base, cand = runs["2"]["metrics"], runs[candidate]["metrics"]
        loss = {k: round(base[k] - cand[k], 2) for k in ("psg_p1", "sent_p1", "psg_r100")}
        rows.append({"split": split, "questions": runs[candidate]["sample"]["questions"],
                     "2bit": {k: base[k] for k in loss}, candidate: {k: cand[k] for k in loss},
                     "loss_vs_2bit": loss, "within": max(loss["psg_p1"], loss["sent_p1"]) <= MAX_LOSS})
    if len(fingerprints) != 1:
        raise SystemExit(f"error: the runs are of different models ({sorted(fingerprints)})")
    passes = bytes_per_token <= MAX_BYTES and all(r["within"] for r in rows)
    result = {"benchmark": "residual_codecs", "what": "verdict on the reported splits", "rule": FORMAT_RULE,
              "model": name, "size_file": size_file.name, "candidate": candidate,
              "bytes_per_original_token": bytes_per_token, "fingerprint": fingerprints.pop(),
              "rows": rows, "passes": passes,
              "default_format": candidate if passes else "2bit",
              "verdict": f"passes: the default format becomes {candidate}" if passes else
              "misses: the default format stays 2 bits" + ("" if bytes_per_token <= MAX_BYTES else " (over the bytes)")}
    if store and passes:
        result["stored_in"] = str(store_with_model(model, "residuals", candidate))
    out = write_result(f"residual_codecs-verdict-{_bits(candidate)}", result, None,
                       command_line("benchmarks.residual_codecs", argv))
    print(json.dumps({r["split"]: r["loss_vs_2bit"] for r in rows}), "passes" if passes else "misses", "→", out)


def _parser() -> argparse.ArgumentParser:
    from .index_search import codec_arg

    parser = argparse.ArgumentParser(prog="python -m benchmarks.residual_codecs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="the default model unless named")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sample", type=int, default=1 << 18, help="residuals the quantizers are trained on")
    parser.add_argument("--codecs", nargs="+", default=[c.name for c in CODECS], choices=[c.name for c in CODECS])
    parser.add_argument("--out", default=None)
    parser.add_argument("--built", nargs="*", type=codec_arg, default=[], metavar="CODEC",
                        help="also rank with the pool's index built with CODEC (e.g. pq16x6: its own trained codec, "
                             "same centroids and ids), beside the simulated rows")
    parser.add_argument("--verdict", type=codec_arg, metavar="CODEC", default=None,
                        help="instead: the rule on the reported splits for CODEC built as an index (e.g. pq16x6), "
                             "from index_search run rows tagged --tag")
    parser.add_argument("--tag", default="default-ph3", help="with --verdict: the runs' tag")
    parser.add_argument("--store", action="store_true",
                        help="with --verdict: name the codec in the shipped model's settings if it passes")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .common import command_line, write_result
    from .data import load_pool
    from .index_search import PoolVectors, _train_questions, build, encode_queries, index_rankings
    from .metrics import summarize
    from .open_domain import judge
    from .rerank import Harness

    parser = _parser()
    args = parser.parse_args(argv)
    if args.verdict is not None:
        return verdict(args.verdict, args.tag, args.store, args.model, argv)
    torch.set_num_threads(args.threads)
    pool = load_pool()
    vectors = PoolVectors(args.model, pool)
    encoder = vectors.encoder
    path, _ = build(vectors, 2)
    index = Index(path, model=encoder)
    store = index.store
    corpus = vectors.corpus()
    original = corpus.vectors.numpy() if isinstance(corpus.vectors, torch.Tensor) else np.asarray(corpus.vectors)
    n = len(store)
    if store.manifest.get("pool_factor", 1) != 1 or not np.array_equal(
            np.asarray(store.doclens[:n]), np.diff(corpus.passage_starts.numpy())):
        raise SystemExit("error: the index's tokens are not the cached encodings' (pooled, or another model)")
    rows_in_order = np.concatenate([np.arange(int(store.starts[p]), int(store.starts[p]) + int(store.doclens[p]))
                                    for p in range(n)])
    codes = np.asarray(store.codes[rows_in_order]).astype(np.int64)
    sample = residual_sample(original, codes, store.codec.centroids32, args.sample, args.seed)
    questions = _train_questions(pool, args.limit, args.seed)
    encoded = encode_queries(encoder, [q.text for q in questions])
    harness = Harness("pool", pool.texts, vectors.spans)
    shipped = json.loads((Path(encoder.source) / "agrame.json").read_text()).get("search", {}) \
        if (Path(encoder.source) / "agrame.json").exists() else {}
    settings = SearchSettings(**{**index.defaults._asdict(), **shipped})
    # what a residual codec does not change: the index's files without its residuals
    rest = store.bytes(include_text=False) - store.manifest["files"]["residuals.bin"]["size"]
    position_of_row = np.zeros(len(store.codes), dtype=np.int64)
    position_of_row[rows_in_order] = np.arange(len(rows_in_order))
    def evaluate(label: str, ranked_by: Index = index) -> dict:
        per = []
        for k, q in enumerate(tqdm(questions, desc=label, disable=None)):
            passages, sentences = index_rankings(ranked_by, *encoded[k], encoder.settings.alpha, settings,
                                                 harness.sent_starts, vectors.spans)
            m = judge("squad-dev", harness, q, passages, sentences, passages)  # SQuAD's gold rule (answer_start)
            m["psg_r100"] = m.pop("first_stage_r100")
            per.append(m)
        return summarize(per)

    rows = [score_codec(spec, store, codes, original, sample, position_of_row, evaluate, rest, args.seed)
            for spec in CODECS if spec.name in args.codecs]
    for name in args.built:
        rows.append(built_row(name, vectors, store, evaluate))
    base = next((r for r in rows if r["codec"] == CODECS[0].name), None)
    for r in rows:
        if base is not None:
            r["loss_vs_2bit"] = {k: round(base["metrics"][k] - r["metrics"][k], 2) for k in ("psg_p1", "sent_p1", "psg_r100")}
    eligible = [r for r in rows if "loss_vs_2bit" in r and r["bytes_per_original_token"] <= MAX_BYTES]
    best = min(eligible, key=lambda r: max(r["loss_vs_2bit"]["psg_p1"], r["loss_vs_2bit"]["sent_p1"]), default=None)
    passes = best is not None and max(best["loss_vs_2bit"]["psg_p1"], best["loss_vs_2bit"]["sent_p1"]) <= MAX_LOSS
    result = {"benchmark": "residual_codecs", "model": encoder.source, "fingerprint": encoder.fingerprint()[:12],
              "index": path.name, "threads": args.threads, "search": settings._asdict(),
              "data": f"SQuAD train, {len(questions)} questions (one per paragraph, seed {args.seed}), "
                      f"the pool's {n:,} passages", "quantizer_sample": len(sample), "rule": FORMAT_RULE,
              "rows": rows, "best_under_the_bytes": None if best is None else best["codec"],
              "chosen": best["codec"] if passes else "scalar 2-bit (today): no codec under the bytes is within the loss"}
    out = write_result(f"residual_codecs-{encoder.fingerprint()[:12]}" + ("-built" if args.built else ""), result, args.out,
                       command_line("benchmarks.residual_codecs", argv))
    print(json.dumps({r["codec"]: [r["bytes_per_original_token"], r.get("loss_vs_2bit")] for r in rows}), "→", out)


if __name__ == "__main__":
    main()

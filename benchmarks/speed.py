"""Speed: encoding throughput, and per-query cost of each granularity over pre-encoded passages.

Ratios are measured in one run on one machine, so they compare; absolute numbers are
this machine's. Passages and questions are a seeded sample of SQuAD v1.1 train.

    python -m benchmarks.speed --passages 100 --queries 50 --encode-passages 300
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agrame.corpus import Passage
from agrame.encoder import DEFAULT_MARKERS
from agrame.loading import load_encoder
from agrame.index.v1 import build_index
from agrame.ranker import Ranker
from agrame.spans import split_sentences

from .common import command_line, sample, squad_paragraphs, write_result


def median_ms(fn, queries, repeats: int = 1) -> float:
    times = []
    for q in queries:
        for _ in range(repeats):
            t = time.perf_counter()
            fn(q)
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=100, help="passages re-ranked per query")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--encode-passages", type=int, default=300, help="passages for the throughput test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    encoder = load_encoder(args.model)
    ranker = Ranker(encoder)
    paragraphs = sample(squad_paragraphs("train"), args.encode_passages, args.seed)
    texts = [p["context"] for p in paragraphs]
    questions = [p["qas"][0]["question"] for p in paragraphs[: args.queries]]

    encoder.encode_passages(texts[:16])  # warm-up
    t = time.perf_counter()
    encoded = encoder.encode_passages(texts)
    encode_s = time.perf_counter() - t
    n_tokens = sum(e.vectors.shape[0] for e in encoded)

    passages = [Passage(str(i), s) for i, s in enumerate(texts[: args.passages])]
    corpus = ranker.encode(passages)
    sentence_spans = {p.id: split_sentences(p.text) for p in passages}
    sentences = [Passage(f"{p.id}:{k}", p.text[s:e]) for p in passages for k, (s, e) in enumerate(sentence_spans[p.id])]
    t = time.perf_counter()
    sentence_corpus = ranker.encode(sentences)
    encode_sentences_s = time.perf_counter() - t
    t = time.perf_counter()
    ranker.encode(passages)
    encode_rerank_s = time.perf_counter() - t

    # A ranker whose sub-unit query has its own marker: two query encodings, two matrices.
    two_query_ranker = Ranker(encoder.with_settings(markers=dict(DEFAULT_MARKERS), span_query_marker="Q'"))

    for q in questions[:5]:  # warm-up
        ranker.rank(q, corpus, "sentence")
    timings = {
        "passage": median_ms(lambda q: ranker.rank(q, corpus, "passage", top_k=10), questions),
        "sentence": median_ms(lambda q: ranker.rank(q, corpus, "sentence", top_k=10), questions),
        "sentence_with_Q'": median_ms(lambda q: two_query_ranker.rank(q, corpus, "sentence", top_k=10), questions),
        "sentence_as_span_masks": median_ms(
            lambda q: ranker.rank(q, corpus, "span", spans=sentence_spans, top_k=10), questions),
        "sentence_encoded_separately": median_ms(
            lambda q: ranker.rank(q, sentence_corpus, "passage", top_k=10), questions),
    }
    q_only = median_ms(lambda q: encoder.encode_query(q, "Q"), questions)
    with tempfile.TemporaryDirectory() as tmp:
        build_index(encoder, [Passage(str(i), s) for i, s in enumerate(texts)], Path(tmp) / "idx", progress=False)
        index_bytes = folder_bytes(Path(tmp) / "idx")
    result = {
        "benchmark": "speed", "dataset": "squad-train (sample)", "model": encoder.source,
        "sample": {"encode_passages": len(texts), "rerank_passages": len(passages), "sentences": len(sentences),
                   "queries": len(questions), "seed": args.seed},
        "settings": {"doc_maxlen": encoder.settings.doc_maxlen, "query_maxlen": encoder.settings.query_maxlen,
                     "dim": encoder.dim, "markers": encoder.settings.markers,
                     "span_query_marker": encoder.settings.span_query_marker, "threads": torch.get_num_threads()},
        "metrics": {
            "passages_per_s": round(len(texts) / encode_s, 1),
            "tokens_per_passage": round(n_tokens / len(texts), 1),
            "median_ms_per_query": {k: round(v, 2) for k, v in timings.items()},
            "median_ms_query_encoding": round(q_only, 2),
            "ratio_sentence_vs_passage": round(timings["sentence"] / timings["passage"], 3),
            "ratio_sentence_Q'_vs_passage": round(timings["sentence_with_Q'"] / timings["passage"], 3),
            "encode_s_100_passages": round(encode_rerank_s, 2),
            "encode_s_their_sentences_separately": round(encode_sentences_s, 2),
            "index_bytes_per_passage": round(index_bytes / len(texts)),
        },
    }
    path = write_result("speed", result, args.out, command_line("benchmarks.speed", argv))
    for k, v in result["metrics"].items():
        print(f"{k}: {v}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""``agrame rank``: rank passages, sentences or spans of a passage file for one query."""

from __future__ import annotations

import argparse

from agrame.io import FORMATS, MAX_PASSAGE_CHARS, read_passages
from .common import DEFAULT_MODEL_HELP, UsageError, add_common, command_parser, model_names, positive_int, print_results


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "rank")
    p.add_argument("--query", "-q", required=True, help="the query text")
    p.add_argument("--passages", "-p", required=True, metavar="FILE",
                   help="passage file, or - for standard input")
    p.add_argument("--input-format", choices=FORMATS, default="auto",
                   help="passage file format (default: by extension, else by content)")
    p.add_argument("--max-passage-chars", type=positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                    help="refuse a passage longer than N characters (default: {:,}); split long "
                         "documents into passages".format(MAX_PASSAGE_CHARS))
    add_common(p, ("passage", "sentence", "span"), "sentence")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder (AGRaME, Stanford ColBERT or Hugging Face) or a shipped name ("
                        + model_names() + "); " + DEFAULT_MODEL_HELP)
    p.add_argument("--batch-size", type=positive_int, default=16, help="passages per forward pass (default: 16, fastest on CPU)")
    return p


def run(args) -> int:
    if not args.query.strip():
        raise UsageError("--query is empty")
    passages = read_passages(args.passages, args.input_format, args.max_passage_chars)
    if args.granularity == "span" and not any(p.spans for p in passages):
        raise UsageError(f"{args.passages}: --granularity span needs a JSONL 'spans' field on at least one passage")
    from agrame.ranker import Ranker

    ranker = Ranker(args.model, alpha=args.alpha, batch_size=args.batch_size)
    corpus = ranker.encode(passages, progress=len(passages) > 64)
    results = ranker.rank(args.query, corpus, args.granularity, top_k=args.top_k)
    print_results(results, args.query, args.format)
    return 0

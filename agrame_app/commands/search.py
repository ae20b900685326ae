"""``agrame search``: search a whole index for one query or a query file."""

from __future__ import annotations

import argparse
import json
import sys

from .common import (FILTER_HELP, UsageError, add_common, command_parser, parse_filter_arg, positive_int,
                     print_results, printable)


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "search")
    p.add_argument("query", nargs="?", default=None, help="the query text (or --queries FILE)")
    p.add_argument("--queries", metavar="FILE", default=None,
                   help="search every query of a TSV (qid<TAB>text) or JSONL ({\"id\", \"text\"}) file, "
                        "encoded in batches; output: JSONL lines {\"qid\", \"query\", \"results\"} "
                        "(or a table per query), or a TREC run with --run")
    p.add_argument("--queries-format", choices=("tsv", "jsonl"), default=None,
                   help="query file format (default: from the extension, else the content)")
    p.add_argument("--run", metavar="FILE", default=None,
                   help="write a TREC run file (qid Q0 docid rank score tag) instead of printing")
    p.add_argument("--run-tag", default="agrame", help="the run file's tag column (default: agrame)")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="queries encoded per forward pass (default: 32)")
    p.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    add_common(p, ("passage", "sentence", "span"), "sentence")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder or Hugging Face name org/name[@revision] (default: the one the index was built with)")
    p.add_argument("--exact", action="store_true",
                   help="score every passage exhaustively (the reference; slow on large indexes)")
    p.add_argument("--nprobe", type=positive_int, default=None,
                   help="centroids probed per query token (default: the index's, see benchmarks/README.md)")
    p.add_argument("--ncandidates", type=positive_int, default=None,
                   help="passages decompressed and scored exactly (default: the index's)")
    p.add_argument("--filter", metavar="JSON", default=None, help=FILTER_HELP)
    return p


def run(args) -> int:
    if (args.query is None) == (args.queries is None):
        raise UsageError("give one query text, or --queries FILE")
    if args.query is not None and not args.query.strip():
        raise UsageError("the query is empty")
    if args.query is not None and (args.run or args.queries_format):
        raise UsageError("--run and --queries-format go with --queries FILE")
    from agrame.index.sharded import open_index

    spec = parse_filter_arg(args.filter)
    options = dict(exact=args.exact, nprobe=args.nprobe, ncandidates=args.ncandidates, alpha=args.alpha, filter=spec)
    if args.queries is not None:
        return _search_batch(args, options)
    index = open_index(args.index, model=args.model)
    results = index.search(args.query, args.granularity, top_k=args.top_k, **options)
    print_results(results, args.query, args.format)
    return 0


def _search_batch(args, options: dict) -> int:
    from agrame.index.batch import search_batch
    from agrame.index.sharded import open_index
    from agrame.runs import read_queries, write_run

    if not args.run_tag.strip() or any(c.isspace() or c in "#%" for c in args.run_tag):
        raise UsageError(f"--run-tag {args.run_tag!r}: one word without '#' or '%'")
    queries = read_queries(args.queries, args.queries_format)  # bad lines fail before the model loads
    index = open_index(args.index, model=args.model)
    texts = dict(queries)
    results = search_batch(index, queries, args.granularity, args.top_k, batch_size=args.batch_size,
                           progress=True, **options)
    if args.run:
        from agrame.runs import atomic_text_file

        with atomic_text_file(args.run) as out:  # a run file is whole or absent
            for qid, hits in results:
                write_run(out, qid, hits, args.granularity, args.run_tag)
        print(f"wrote {args.run}: {len(queries)} queries, top {args.top_k} {args.granularity}s each", file=sys.stderr)
        return 0
    for qid, hits in results:
        if args.format == "jsonl":
            record = {"qid": qid, "query": texts[qid],
                      "results": [{**h._asdict(), "pieces": [list(p) for p in h.pieces]} for h in hits]}
            sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(f"== {printable(qid)}: {printable(texts[qid])}\n")
            print_results(hits, texts[qid], "table")
    return 0

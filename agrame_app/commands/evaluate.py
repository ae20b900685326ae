"""``agrame evaluate``: score a TREC run against qrels with ir_measures."""

from __future__ import annotations

import argparse
import json
import sys

from .common import UsageError, command_parser, printable


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "evaluate")
    p.add_argument("--run", required=True, metavar="FILE", help="TREC run: qid Q0 docid rank score tag")
    p.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels: qid 0 docid relevance")
    p.add_argument("--measures", default="nDCG@10 R@100 RR@10 P@1",
                   help="ir_measures names, space-separated (default: 'nDCG@10 R@100 RR@10 P@1')")
    p.add_argument("--per-query", action="store_true", help="also one line per query")
    p.add_argument("--format", "-f", choices=("table", "jsonl"), default="table",
                   help="table for reading, jsonl for piping (default: table)")
    return p


def run(args) -> int:
    from agrame.evaluation import check_granularity, evaluate, id_mismatch, parse_measures, span_mismatch
    from agrame.runs import read_qrels, read_run

    measures = args.measures.split()
    if not measures:
        raise UsageError("--measures is empty")
    parse_measures(measures)  # an unknown measure fails before the files are read
    run, qrels = read_run(args.run), read_qrels(args.qrels)
    check_granularity(run, qrels)  # EvaluationError (a ValueError): exit 2
    for warning in (id_mismatch(run, qrels), span_mismatch(run, qrels)):
        if warning:
            print(f"agrame: warning: {warning}", file=sys.stderr)
    mean, per = evaluate(run, qrels, measures, per_query=True)
    if args.format == "jsonl":
        if args.per_query:
            for qid, values in per.items():
                sys.stdout.write(json.dumps({"qid": qid, **values}) + "\n")
        sys.stdout.write(json.dumps({"qid": "all", "queries": len(per), **mean}) + "\n")
        return 0
    width = max(len(m) for m in measures)
    if args.per_query:
        for qid, values in per.items():
            sys.stdout.write(printable(qid) + "  " + "  ".join(f"{m}={v:.4f}" for m, v in values.items()) + "\n")
    sys.stdout.write(f"{len(per)} queries ({sum(q in run for q in qrels)} in the run)\n")
    for m in measures:
        sys.stdout.write(f"{m:<{width}}  {mean[m]:.4f}\n")
    return 0

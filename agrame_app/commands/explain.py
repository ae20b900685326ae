"""``agrame explain``: why a passage ranked: each query token's best passage token, each sentence's score."""

from __future__ import annotations

import argparse
import json
import os
import sys

from agrame.io import FORMATS, MAX_PASSAGE_CHARS, read_passages
from .common import DEFAULT_MODEL_HELP, UsageError, command_parser, finite_float, model_names, positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "explain")
    p.add_argument("--query", "-q", required=True, help="the query text")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--passages", "-p", metavar="FILE", help="passage file (same formats as rank), or -")
    source.add_argument("--index", "-i", metavar="DIR", help="an index folder (with --id)")
    p.add_argument("--id", dest="passage_id", default=None,
                   help="passage to explain (default: the passage that ranks first)")
    p.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    p.add_argument("--max-passage-chars", type=positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                 help="refuse a passage longer than N characters (default: {:,}); split long "
                      "documents into passages".format(MAX_PASSAGE_CHARS))
    p.add_argument("--alpha", type=finite_float, default=None, help="α of the combined sentence score")
    p.add_argument("--html", metavar="OUT", default=None, help="also write a self-contained HTML page")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text",
                   help="text for reading, json for piping (default: text)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="ANSI colours: auto = when standard output is a terminal and NO_COLOR is unset")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder or a shipped name (" + model_names() + "); " + DEFAULT_MODEL_HELP
                   + " (with --index: the index's)")
    return p


def run(args) -> int:
    import os

    from agrame.explain import render_html, render_text

    if not args.query.strip():
        raise UsageError("--query is empty")
    if args.index is not None:
        from agrame.index.sharded import open_index

        index = open_index(args.index, model=args.model)
        passage_id = args.passage_id
        if passage_id is None:
            hits = index.search(args.query, "passage", top_k=1)
            if not hits:
                raise UsageError(f"index {args.index}: no passage matches the query")
            passage_id = hits[0].passage_id
        explanation = index.explain(args.query, passage_id, alpha=args.alpha)
    else:
        passages = read_passages(args.passages, args.input_format, args.max_passage_chars)
        from agrame.ranker import Ranker

        ranker = Ranker(args.model, alpha=args.alpha)
        corpus = ranker.encode(passages, progress=len(passages) > 64)
        passage_id = args.passage_id
        if passage_id is None:
            passage_id = ranker.rank(args.query, corpus, "passage", top_k=1)[0].passage_id
        elif passage_id not in corpus.ids:
            raise UsageError(f"{args.passages}: no passage with id {passage_id!r}")
        explanation = ranker.explain(args.query, corpus, passage_id=passage_id)
    if args.html:
        from pathlib import Path

        out = Path(args.html)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            tmp.write_text(render_html([explanation]), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{out}: cannot write: {exc.strerror}") from None
        tmp.replace(out)
    if args.format == "json":
        sys.stdout.write(json.dumps(explanation.to_json(), ensure_ascii=False) + "\n")
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    sys.stdout.write(render_text(explanation, color))
    return 0

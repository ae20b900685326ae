"""``agrame cite``: add citations to a generated answer (PropCite)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from agrame.io import FORMATS, MAX_PASSAGE_CHARS, read_passages, read_text
from .common import DEFAULT_MODEL_HELP, UsageError, command_parser, finite_float, model_names, positive_int, printable


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "cite")
    p.add_argument("--answer", "-a", required=True, metavar="FILE", help="answer text file, or - for stdin")
    p.add_argument("--passages", "-p", required=True, metavar="FILE",
                   help="the passages the answer was generated from (same formats as rank)")
    p.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    p.add_argument("--max-passage-chars", type=positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                    help="refuse a passage longer than N characters (default: {:,}); split long "
                         "documents into passages".format(MAX_PASSAGE_CHARS))
    p.add_argument("--margin", type=finite_float, default=None,
                   help="cite a proposition only when its top passage beats the next by this much "
                        "(mean similarity per token; default: always cite)")
    p.add_argument("--lexical-weight", type=finite_float, default=0.0,
                   help="weight of a BM25 prior added to every proposition's passage scores "
                        "(default: 0, pure PropCite)")
    p.add_argument("--max-citations", type=positive_int, default=None, help="at most N passages per sentence")
    p.add_argument("--mode", default="propositions",
                   choices=("propositions", "proposition-alone", "sentence-top1", "sentence-top2"),
                   help="propositions as sub-queries (PropCite, default), each proposition encoded alone, "
                        "or the whole sentence's top 1 / top 2 passages")
    p.add_argument("--format", "-f", choices=("text", "jsonl"), default="text",
                   help="text: the cited answer and its references; jsonl: one record per sentence")
    p.add_argument("--model", "-m", metavar="PATH", default=None, help="model folder or a shipped name (" + model_names() + "); " + DEFAULT_MODEL_HELP)
    p.add_argument("--batch-size", type=positive_int, default=16, help="passages per forward pass (default: 16)")
    return p


def run(args) -> int:
    if args.answer == "-" and args.passages == "-":
        raise UsageError("--answer and --passages cannot both read standard input")
    if args.margin is not None and args.margin < 0:
        raise UsageError("--margin must be ≥ 0")
    if args.lexical_weight < 0:
        raise UsageError("--lexical-weight must be ≥ 0")
    answer = read_text(args.answer)
    if not answer.strip():
        raise UsageError(f"{'<stdin>' if args.answer == '-' else args.answer}: the answer is empty")
    passages = read_passages(args.passages, args.input_format, args.max_passage_chars)
    from propcite.citer import Citer

    citer = Citer(args.model, mode=args.mode, margin=args.margin, max_citations=args.max_citations,
                  batch_size=args.batch_size, lexical_weight=args.lexical_weight)
    result = citer.cite(answer, citer.encode(passages, progress=len(passages) > 64))
    out = sys.stdout
    if args.format == "jsonl":
        for n, sent in enumerate(result.sentences):
            record = {"sentence": n, "start": sent.start, "end": sent.end, "text": sent.text,
                      "citations": [passages[c].id for c in sent.citations],
                      "markers": [c + 1 for c in sent.citations],
                      "propositions": [{"text": p.text, "pieces": [list(x) for x in p.pieces],
                                        "passage_id": None if p.passage is None else passages[p.passage].id,
                                        "best_passage_id": passages[p.best_passage].id,
                                        "passage_span": list(p.passage_span),
                                        "score": round(p.score, 4),
                                        "runner_up": None if p.runner_up == float("-inf") else round(p.runner_up, 4)}
                                       for p in sent.propositions]}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        return 0
    out.write(result.text.rstrip("\n") + "\n")
    cited = sorted({c for s in result.sentences for c in s.citations})
    if cited:
        out.write("\n")
        width = shutil.get_terminal_size((120, 20)).columns
        for c in cited:
            line = f"[{c + 1}] {printable(passages[c].id)}: {printable(' '.join(passages[c].text.split()))}"
            out.write((line if len(line) <= width else line[: width - 1] + "…") + "\n")
    return 0

"""The ``agrame`` command line: ``rank``, ``index``, ``search``, ``delete``, ``compact``, ``explain``,
``serve`` and ``cite``.

Usage errors (bad arguments, unreadable or malformed input, a wrong model or index)
print ``agrame: error: …`` naming the file, line and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from typing import List, Optional, Sequence

from agrame import __version__
from agrame.io import FORMATS, MAX_PASSAGE_CHARS, read_passages, read_text
from agrame_app.commands import models as models_command
from agrame_app.serve.http import Timeouts

EXIT_USAGE = 2


class UsageError(ValueError):
    pass


FILTER_HELP = ("metadata filter (JSON): {\"field\": value}, $eq $ne $in $nin $gt $gte $lt $lte $exists, "
               "$and $or $not; e.g. '{\"year\": {\"$gte\": 2020}}'")


def _nonnegative_float(value: str) -> float:
    number = _finite_float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {value!r}")
    return number


def _share(value: str) -> float:
    number = _finite_float(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {value!r}")
    return number


def _add_writer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock-timeout", type=_nonnegative_float, default=0.0, metavar="SECONDS",
                   help="wait this long for another writer of the index to finish (default: 0, fail at once)")
    p.add_argument("--compact-threshold", type=_share, default=0.2, metavar="SHARE",
                   help="compact once this share of the stored passages is deleted (default: 0.2; 1 = never)")


def _say(message: str) -> None:
    print(f"agrame: {message}", file=sys.stderr)


def _positive_float(value: str) -> float:
    number = _finite_float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value!r}")
    return number


def _pool_factor(value: str):
    from agrame.pooling import check_pool_factor

    try:
        return check_pool_factor(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def _finite_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def _default_model_help() -> str:
    from agrame.backbones import ZERO_SHOT
    from agrame.loading import DEFAULT_MODEL

    return f"default: {DEFAULT_MODEL}, the trained 128-d model; {ZERO_SHOT} for untrained MiniLM"


def _model_names() -> str:
    from agrame.loading import shipped_names

    return ", ".join(shipped_names())


_DEFAULT_MODEL = _default_model_help()


def _add_common(p: argparse.ArgumentParser, granularities: Sequence[str], default_granularity: str) -> None:
    p.add_argument("--granularity", "-g", choices=granularities, default=default_granularity,
                   help=f"unit to rank (default: {default_granularity})")
    p.add_argument("--top-k", "-k", type=_positive_int, default=10, help="results to print (default: 10)")
    p.add_argument("--alpha", type=_finite_float, default=None,
                   help="weight of the passage score in S'(q,s) + α·S(q,p) (default: the model's, 0.5)")
    p.add_argument("--format", "-f", choices=("table", "jsonl"), default="table",
                   help="table for reading, jsonl for piping (default: table)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agrame",
        description="Any-granularity ranking: one multi-vector encoding of each passage ranks "
                    "passages, sentences or any character span inside them.",
    )
    parser.add_argument("--version", action="version", version=f"agrame {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    rank = sub.add_parser(
        "rank", help="rank passages, sentences or spans of a passage file for one query",
        description="Encode the passages once and rank them, all their sentences, or the spans "
                    "given in the JSONL 'spans' field, for a query.",
        epilog="Passage files: JSONL {\"id\", \"text\", \"spans\"?} (spans: [[start, end], …] in "
               "characters; a span may be a list of pieces), TSV id<TAB>text, or plain text with "
               "one passage per line. Example: agrame rank -g sentence -q 'What causes coral "
               "bleaching?' --passages passages.jsonl",
    )
    rank.add_argument("--query", "-q", required=True, help="the query text")
    rank.add_argument("--passages", "-p", required=True, metavar="FILE",
                      help="passage file, or - for standard input")
    rank.add_argument("--input-format", choices=FORMATS, default="auto",
                      help="passage file format (default: by extension, else by content)")
    rank.add_argument("--max-passage-chars", type=_positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                       help="refuse a passage longer than N characters (default: {:,}); split long "
                            "documents into passages".format(MAX_PASSAGE_CHARS))
    _add_common(rank, ("passage", "sentence", "span"), "sentence")
    rank.add_argument("--model", "-m", metavar="PATH", default=None,
                      help="model folder (AGRaME, Stanford ColBERT or Hugging Face) or a shipped name ("
                           + _model_names() + "); " + _DEFAULT_MODEL)
    rank.add_argument("--batch-size", type=_positive_int, default=16, help="passages per forward pass (default: 16, fastest on CPU)")

    index = sub.add_parser(
        "index", help="encode a passage file into an on-disk index folder (or --add to one)",
        description="Encode passages once into a compressed index folder: each token is a centroid id "
                    "plus a residual of --nbits bits per dimension (ColBERTv2's codec), with an inverted "
                    "file for search over the whole index. Tagged with the model's fingerprint.",
        epilog="Examples: agrame index -p corpus.jsonl -i my-index; "
               "agrame index --add -p more.jsonl -i my-index (same centroids, new passages, atomic); "
               "agrame index --upsert -p changed.jsonl -i my-index. JSONL passages may carry a "
               "\"metadata\" object (strings, numbers, booleans, lists) for search --filter.",
    )
    index.add_argument("--passages", "-p", required=True, metavar="FILE", help="passage file, or - for stdin")
    index.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder to create (or extend with --add)")
    index.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    index.add_argument("--max-passage-chars", type=_positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                       help="refuse a passage longer than N characters (default: {:,}); split long "
                            "documents into passages".format(MAX_PASSAGE_CHARS))
    index.add_argument("--model", "-m", metavar="PATH", default=None,
                       help="model folder or a shipped name (" + _model_names() + "); " + _DEFAULT_MODEL
                       + " (with --add: the index's own)")
    index.add_argument("--nbits", type=int, choices=(1, 2, 4, 8), default=2,
                       help="bits per dimension of each token's residual (default: 2, ~40 bytes per 128-d token)")
    index.add_argument("--pool-factor", type=_pool_factor, default=None, metavar="F",
                       help="keep about one vector per F tokens: adjacent tokens of a sentence pooled by Ward "
                            "clustering, so every sentence and span stays searchable (default: the model's own, 1 for most: "
                            "one vector per token; with --add/--upsert: the index's own, and another is refused)")
    index.add_argument("--format", dest="index_format", type=int, choices=(1, 2), default=2,
                       help="2: compressed (default); 1: float16 vectors, exhaustive search only")
    index.add_argument("--add", action="store_true",
                       help="append passages with new ids to an existing compressed index with its centroids")
    index.add_argument("--upsert", action="store_true",
                       help="replace the passages whose ids the index holds (text, vectors, metadata) and add the rest")
    index.add_argument("--overwrite", action="store_true",
                       help="replace an existing index (only an AGRaME index: any other folder is refused) "
                            "as a new generation; readers see the old or the new one")
    index.add_argument("--batch-size", type=_positive_int, default=16, help="passages per forward pass (default: 16, fastest on CPU)")
    index.add_argument("--shards", type=_positive_int, default=None, metavar="S",
                       help="split the index into S shards with one codec, passages routed by a hash of their id; "
                            "searched as one index (shards in parallel)")
    index.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="encode on a Ray cluster: an actor pool of encoders (one GPU each where the cluster "
                            "has GPUs). ADDRESS: 'auto' or HEAD:6379 (run on a node of the cluster), or none to start Ray "
                            "on this machine; Ray Client (ray://) is not supported "
                            "(needs pip install 'agrame[ray]')")
    index.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                       help="with --ray: encoder actors (default: one per GPU, else one per 2 CPUs)")
    index.add_argument("--resume", action="store_true",
                       help="with --ray: continue an interrupted build from its finished blocks")
    _add_writer_options(index)

    search = sub.add_parser(
        "search", help="rank passages, sentences or stored spans of a whole index for a query",
        description="Search a whole index: centroid-pruned candidates (PLAID), then exact "
                    "late-interaction scores of the survivors' passages, sentences or spans.",
        epilog="Examples: agrame search -i my-index -g sentence 'What causes coral bleaching?'; "
               "agrame search -i my-index --queries questions.tsv --run out.trec (a query file: TSV "
               "qid<TAB>text or JSONL {\"id\", \"text\"}; sentences and spans are named PASSAGE#START:END "
               "in runs, see agrame.runs)",
    )
    search.add_argument("query", nargs="?", default=None, help="the query text (or --queries FILE)")
    search.add_argument("--queries", metavar="FILE", default=None,
                        help="search every query of a TSV (qid<TAB>text) or JSONL ({\"id\", \"text\"}) file, "
                             "encoded in batches; output: JSONL lines {\"qid\", \"query\", \"results\"} "
                             "(or a table per query), or a TREC run with --run")
    search.add_argument("--queries-format", choices=("tsv", "jsonl"), default=None,
                        help="query file format (default: from the extension, else the content)")
    search.add_argument("--run", metavar="FILE", default=None,
                        help="write a TREC run file (qid Q0 docid rank score tag) instead of printing")
    search.add_argument("--run-tag", default="agrame", help="the run file's tag column (default: agrame)")
    search.add_argument("--batch-size", type=_positive_int, default=32,
                        help="queries encoded per forward pass (default: 32)")
    search.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    _add_common(search, ("passage", "sentence", "span"), "sentence")
    search.add_argument("--model", "-m", metavar="PATH", default=None,
                        help="model folder (default: the one the index was built with)")
    search.add_argument("--exact", action="store_true",
                        help="score every passage exhaustively (the reference; slow on large indexes)")
    search.add_argument("--nprobe", type=_positive_int, default=None,
                        help="centroids probed per query token (default: the index's, see benchmarks/README.md)")
    search.add_argument("--ncandidates", type=_positive_int, default=None,
                        help="passages decompressed and scored exactly (default: the index's)")
    search.add_argument("--filter", metavar="JSON", default=None, help=FILTER_HELP)

    evaluate = sub.add_parser(
        "evaluate", help="score a TREC run file against qrels (ir_measures)",
        description="Evaluate a run (agrame search --queries … --run) against TREC qrels with ir_measures: "
                    "mean of each measure over the qrels' queries. Sentence-level qrels name sentences "
                    "PASSAGE#START:END, as runs do.",
        epilog="Example: agrame evaluate --run out.trec --qrels dev.qrels --measures 'nDCG@10 R@100 RR@10 P@1'",
    )
    evaluate.add_argument("--run", required=True, metavar="FILE", help="TREC run: qid Q0 docid rank score tag")
    evaluate.add_argument("--qrels", required=True, metavar="FILE", help="TREC qrels: qid 0 docid relevance")
    evaluate.add_argument("--measures", default="nDCG@10 R@100 RR@10 P@1",
                          help="ir_measures names, space-separated (default: 'nDCG@10 R@100 RR@10 P@1')")
    evaluate.add_argument("--per-query", action="store_true", help="also one line per query")
    evaluate.add_argument("--format", "-f", choices=("table", "jsonl"), default="table",
                          help="table for reading, jsonl for piping (default: table)")

    qrels = sub.add_parser(
        "qrels", help="write the benchmarks' gold as TREC qrels (and the queries and corpus to search)",
        description="Write the gold of an open-domain benchmark dataset ($AGRAME_DATA) as TREC qrels in the run "
                    "files' id format, as benchmarks.open_domain judges: a passage is its pooled-corpus id, a "
                    "sentence PASSAGE#START:END with the index's own sentence spans (--index) or the ones an index "
                    "stores (agrame.spans.split_sentences). With --queries-out and --corpus-out it also writes the "
                    "questions and the pooled corpus, so that agrame index + agrame search --queries --run + agrame "
                    "evaluate reproduce the benchmark's metrics end to end.",
        epilog="Example: agrame qrels --dataset squad-dev --limit 2000 -g sentence -o dev.qrels --queries-out dev.tsv "
               "--corpus-out pool.jsonl",
    )
    qrels.add_argument("--dataset", required=True,
                       choices=("squad-dev", "nq-oracle", "nq-open", "entityquestions", "trivia", "webq"),
                       help="benchmark question set (its gold as benchmarks/README.md describes)")
    qrels.add_argument("--granularity", "-g", choices=("passage", "sentence"), default="sentence",
                       help="judge passages or sentences (default: sentence)")
    qrels.add_argument("--out", "-o", default="-", metavar="FILE", help="qrels file (default: standard output)")
    qrels.add_argument("--limit", type=_positive_int, default=None,
                       help="a seeded sample of this many questions, as the benchmarks' --limit (default: all)")
    qrels.add_argument("--seed", type=int, default=0, help="sample seed (default: 0, the benchmarks')")
    qrels.add_argument("--index", "-i", metavar="DIR", default=None,
                       help="take sentence spans from this index (its passage ids must be the pool's)")
    qrels.add_argument("--ids", choices=("source", "number"), default="source",
                       help="passage ids: the pool's source ids (squad-dev-3-5, nq-17, lead-4) or pool positions "
                            "(the ids of benchmarks.index_search's cached index) (default: source)")
    qrels.add_argument("--queries-out", metavar="FILE", default=None, help="also write the questions (TSV qid<TAB>text)")
    qrels.add_argument("--corpus-out", metavar="FILE", default=None,
                       help="also write the pooled corpus (JSONL {id, text}) to index")

    export = sub.add_parser(
        "export", help="write a model as a Stanford ColBERT (colbert-ai) or PyLate checkpoint",
        description="Export a model for colbert-ai 0.2.22 (--format stanford) or PyLate (--format pylate). "
                    "Both insert [Q]/[D] markers and pad queries with [MASK]; what the exported model does "
                    "differently from AGRaME is printed (and recorded in the folder).",
        epilog="Example: agrame export --model squad-a1 --format stanford exported/squad-a1-colbert",
    )
    export.add_argument("out", metavar="OUT", help="folder to write (must not exist, or be empty)")
    export.add_argument("--model", "-m", metavar="PATH", default=None,
                        help="model folder or shipped name (default: the package default)")
    export.add_argument("--format", choices=("stanford", "pylate"), required=True, help="checkpoint format")

    delete = sub.add_parser(
        "delete", help="delete passages from an index by id or by a metadata filter",
        description="Delete passages (tombstones committed as a new generation; ids are never renumbered). "
                    "The index is compacted automatically once the deleted share passes --compact-threshold.",
        epilog="Examples: agrame delete -i my-index doc-3 doc-9; agrame delete -i my-index --ids-file gone.txt; "
               "agrame delete -i my-index --filter '{\"source\": \"draft\"}'",
    )
    delete.add_argument("ids", nargs="*", metavar="ID", help="passage ids to delete")
    delete.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    delete.add_argument("--ids-file", metavar="FILE", default=None, help="a file with one id per line (or - for stdin)")
    delete.add_argument("--filter", metavar="JSON", default=None, help="delete every passage this filter admits")
    delete.add_argument("--missing", choices=("error", "ok"), default="error",
                        help="an id the index does not hold: error (exit 2, nothing deleted; default) or ok (skip it)")
    _add_writer_options(delete)

    compact = sub.add_parser(
        "compact", help="rewrite an index without its deleted passages (returns the disk space)",
        description="Copy the live passages into a new store as one generation; readers of the previous "
                    "generation keep working until they reload.",
        epilog="Example: agrame compact -i my-index",
    )
    compact.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    compact.add_argument("--lock-timeout", type=_nonnegative_float, default=0.0, metavar="SECONDS",
                         help="wait this long for another writer to finish (default: 0, fail at once)")
    models_command.add_parser(sub)

    serve = sub.add_parser(
        "serve", help="serve an index over HTTP: search/rank/cite API and a web page (extra: serve)",
        description="An HTTP API (POST /search, /rank, /cite; GET /health) and a one-page web UI at / "
                    "over an index folder, opened read-only; an --add or rebuild is picked up between "
                    "requests. Needs the serve extra: pip install 'agrame[serve]'.",
        epilog="Example: agrame serve -i my-index, then open http://127.0.0.1:8000/",
    )
    serve.add_argument("--index", "-i", metavar="DIR", default=None,
                       help="index folder (without one, only /rank and /cite are served)")
    serve.add_argument("--model", "-m", metavar="PATH", default=None,
                       help="model folder (default: the index's, else " + _DEFAULT_MODEL.split(": ", 1)[1] + ")")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=_positive_int, default=8000, help="port (default: 8000)")
    serve.add_argument("--allow-writes", action="store_true",
                       help="serve POST/DELETE /passages (needs an API key: --api-key-file or AGRAME_API_KEY)")
    serve.add_argument("--api-key-file", metavar="FILE", default=None,
                       help="file holding the API key that writes (and, with --protect-reads, reads) must send "
                            "as 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (default: $AGRAME_API_KEY)")
    serve.add_argument("--protect-reads", action="store_true", help="require the API key for every endpoint but / and /health")
    serve.add_argument("--header-timeout", type=_positive_float, default=Timeouts.header, metavar="SECONDS",
                       help="a request's head must arrive whole within this many seconds of the connection (of its first "
                            "byte on a kept-alive one), or a "
                            f"408 closes the connection (slow clients; default: {Timeouts.header:g})")
    serve.add_argument("--body-timeout", type=_positive_float, default=Timeouts.body, metavar="SECONDS",
                       help=f"and its body within this many seconds of its head (default: {Timeouts.body:g})")
    serve.add_argument("--keep-alive-timeout", type=_positive_int, default=Timeouts.keep_alive, metavar="SECONDS",
                       help="an idle connection between requests is closed after this many seconds "
                            f"(default: {Timeouts.keep_alive})")
    serve.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="serve a sharded index through one Ray actor per shard, spread over the cluster "
                            "('auto' or HEAD:6379 from a node of the cluster, or none for Ray on this machine; Ray Client, "
                            "ray://, is not supported); a shard whose actor "
                            "is down answers 503 unless the request sets allow_partial")

    explain = sub.add_parser(
        "explain", help="show why a passage ranked: matched tokens, best sentence, every score",
        description="Encode the passage once and show, for the query, which passage token each query "
                    "token matched (and how well), every passage token's best similarity, and every "
                    "sentence's S'(q,s) + α·S(q,p). Terminal: ANSI colours (plain [token] and »sentence« "
                    "markers when piped); --html writes a self-contained page.",
        epilog="Examples: agrame explain -q 'What causes coral bleaching?' -p examples/coral.jsonl; "
               "agrame explain -q 'coral' -i my-index --id doc-7 --html why.html",
    )
    explain.add_argument("--query", "-q", required=True, help="the query text")
    source = explain.add_mutually_exclusive_group(required=True)
    source.add_argument("--passages", "-p", metavar="FILE", help="passage file (same formats as rank), or -")
    source.add_argument("--index", "-i", metavar="DIR", help="an index folder (with --id)")
    explain.add_argument("--id", dest="passage_id", default=None,
                         help="passage to explain (default: the passage that ranks first)")
    explain.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    explain.add_argument("--max-passage-chars", type=_positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                       help="refuse a passage longer than N characters (default: {:,}); split long "
                            "documents into passages".format(MAX_PASSAGE_CHARS))
    explain.add_argument("--alpha", type=_finite_float, default=None, help="α of the combined sentence score")
    explain.add_argument("--html", metavar="OUT", default=None, help="also write a self-contained HTML page")
    explain.add_argument("--format", "-f", choices=("text", "json"), default="text",
                         help="text for reading, json for piping (default: text)")
    explain.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                         help="ANSI colours: auto = when standard output is a terminal and NO_COLOR is unset")
    explain.add_argument("--model", "-m", metavar="PATH", default=None,
                         help="model folder or a shipped name (" + _model_names() + "); " + _DEFAULT_MODEL
                         + " (with --index: the index's)")

    cite = sub.add_parser(
        "cite", help="add citations to a generated answer from the passages it was written from",
        description="PropCite: split each answer sentence into propositions, score every passage "
                    "with each proposition's query tokens, and cite the top passage of each.",
        epilog="Example: agrame cite --answer answer.txt --passages passages.jsonl. "
               "Markers are [n] for the n-th passage of the file.",
    )
    cite.add_argument("--answer", "-a", required=True, metavar="FILE", help="answer text file, or - for stdin")
    cite.add_argument("--passages", "-p", required=True, metavar="FILE",
                      help="the passages the answer was generated from (same formats as rank)")
    cite.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    cite.add_argument("--max-passage-chars", type=_positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                       help="refuse a passage longer than N characters (default: {:,}); split long "
                            "documents into passages".format(MAX_PASSAGE_CHARS))
    cite.add_argument("--margin", type=_finite_float, default=None,
                      help="cite a proposition only when its top passage beats the next by this much "
                           "(mean similarity per token; default: always cite)")
    cite.add_argument("--lexical-weight", type=_finite_float, default=0.0,
                      help="weight of a BM25 prior added to every proposition's passage scores "
                           "(default: 0, pure PropCite)")
    cite.add_argument("--max-citations", type=_positive_int, default=None, help="at most N passages per sentence")
    cite.add_argument("--mode", default="propositions",
                      choices=("propositions", "proposition-alone", "sentence-top1", "sentence-top2"),
                      help="propositions as sub-queries (PropCite, default), each proposition encoded alone, "
                           "or the whole sentence's top 1 / top 2 passages")
    cite.add_argument("--format", "-f", choices=("text", "jsonl"), default="text",
                      help="text: the cited answer and its references; jsonl: one record per sentence")
    cite.add_argument("--model", "-m", metavar="PATH", default=None, help="model folder or a shipped name (" + _model_names() + "); " + _DEFAULT_MODEL)
    cite.add_argument("--batch-size", type=_positive_int, default=16, help="passages per forward pass (default: 16)")
    return parser


def printable(text: str) -> str:
    """Text safe for a terminal: control and format characters (ESC, NUL, newlines, bidi
    overrides, zero-width marks …) written as ``\\x1b``-style escapes (JSONL keeps the text as it is)."""
    import unicodedata

    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
                   else ch for ch in text)


def _print_results(results, query: str, fmt: str, out=None) -> None:
    out = out or sys.stdout
    if fmt == "jsonl":
        for rank, r in enumerate(results, start=1):
            record = {"query": query, "rank": rank, **r._asdict()}
            record["pieces"] = [list(p) for p in r.pieces]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    if not results:
        out.write("no results\n")
        return
    width = shutil.get_terminal_size((120, 20)).columns
    ids = [printable(r.passage_id) for r in results]
    id_w = min(max(len("passage"), *(len(i) for i in ids)), 24)
    chars_w = max(len("chars"), *(len(f"{r.start}-{r.end}") for r in results))
    header = f"{'#':>3}  {'score':>8}  {'passage':<{id_w}}  {'chars':<{chars_w}}  text"
    out.write(header + "\n")
    text_w = max(20, width - len(header) + 4)
    for rank, (r, pid) in enumerate(zip(results, ids), start=1):
        text = printable(" ".join(r.text.split()))
        if len(text) > text_w:
            text = text[: text_w - 1] + "…"
        pid = pid if len(pid) <= id_w else pid[: id_w - 1] + "…"
        out.write(f"{rank:>3}  {r.score:>8.3f}  {pid:<{id_w}}  {f'{r.start}-{r.end}':<{chars_w}}  {text}\n")


def _cmd_rank(args) -> int:
    if not args.query.strip():
        raise UsageError("--query is empty")
    passages = read_passages(args.passages, args.input_format, args.max_passage_chars)
    if args.granularity == "span" and not any(p.spans for p in passages):
        raise UsageError(f"{args.passages}: --granularity span needs a JSONL 'spans' field on at least one passage")
    from agrame.ranker import Ranker

    ranker = Ranker(args.model, alpha=args.alpha, batch_size=args.batch_size)
    corpus = ranker.encode(passages, progress=len(passages) > 64)
    results = ranker.rank(args.query, corpus, args.granularity, top_k=args.top_k)
    _print_results(results, args.query, args.format)
    return 0


_UNSET_THRESHOLD = object()


def _threshold(args) -> Optional[float]:
    return None if args.compact_threshold >= 1 else args.compact_threshold


def _manifest(path: str) -> dict:
    from agrame.index import read_manifest

    return read_manifest(path)


def _live(manifest: dict) -> int:
    return int(manifest["num_passages"]) - int(manifest.get("num_deleted", 0))


def _writer(path: str, args, compact_threshold=_UNSET_THRESHOLD):
    """The writer of an index folder of either kind (single or sharded)."""
    from agrame.index import IndexWriter
    from agrame.index.sharded import ShardedWriter, is_sharded

    threshold = _threshold(args) if compact_threshold is _UNSET_THRESHOLD else compact_threshold
    if is_sharded(path):
        return ShardedWriter(path, lock_timeout=args.lock_timeout, compact_threshold=threshold, say=_say,
                             model=getattr(args, "model", None))
    return IndexWriter(path, lock_timeout=args.lock_timeout, compact_threshold=threshold, say=_say)


def _index_model(path: str, model):
    from agrame.index import read_manifest
    from agrame.index.format import load_index_model
    from agrame.index.sharded import is_sharded, read_shards

    if is_sharded(path):
        path = os.path.join(path, read_shards(path)["shards"][0])
    return load_index_model(read_manifest(path), path, model)


def _cmd_index(args) -> int:
    chosen = [f"--{name}" for name in ("add", "upsert", "overwrite", "resume") if getattr(args, name)]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} cannot be combined")
    if (args.add or args.upsert) and args.index_format == 1:
        raise UsageError("--add and --upsert need a compressed index (--format 2)")
    if (args.add or args.upsert) and (args.shards or args.ray):
        raise UsageError("--shards and --ray build a new index; --add/--upsert keep the index's own layout")
    if args.index_format == 1 and (args.shards or args.ray):
        raise UsageError("--shards and --ray build compressed indexes (--format 2)")
    if args.index_format == 1 and args.pool_factor not in (None, 1):
        raise UsageError("--pool-factor needs a compressed index (--format 2)")
    pool = args.pool_factor  # None: the model's own (a fresh build), the index's (--add/--upsert)
    if (args.workers or args.resume) and not args.ray:
        raise UsageError("--workers and --resume go with --ray")
    ray_session = None
    if args.ray:
        from agrame.index import distributed

        ray_session = distributed.check_ray()  # says how to install Ray (exit 2) before the passages are read
    passages = read_passages(args.passages, args.input_format, args.max_passage_chars)
    from agrame.loading import load_encoder
    from agrame.index import build_index

    if args.add or args.upsert:
        encoder = _index_model(args.index, args.model)
        with _writer(args.index, args) as writer:
            change = writer.upsert if args.upsert else writer.add
            new = change(encoder, passages, batch_size=args.batch_size, progress=True, pool_factor=args.pool_factor)
        print(f"{'upserted' if args.upsert else 'added'} {len(passages)} passages to {args.index} "
              f"({_live(new)} in all, generation {new['generation']})", file=sys.stderr)
        return 0
    if ray_session is not None:
        from agrame.index import distributed

        path = distributed.build_with_ray(args.model, passages, args.index, address=args.ray, workers=args.workers,
                                          shards=args.shards, nbits=args.nbits, batch_size=args.batch_size,
                                          overwrite=args.overwrite, resume=args.resume,
                                          lock_timeout=args.lock_timeout, say=_say, pool_factor=pool)
    elif args.shards:
        from agrame.index.sharded import build_sharded

        path = build_sharded(load_encoder(args.model), passages, args.index, args.shards, nbits=args.nbits,
                             batch_size=args.batch_size, overwrite=args.overwrite, lock_timeout=args.lock_timeout,
                             pool_factor=pool)
    else:
        path = build_index(load_encoder(args.model), passages, args.index, format=args.index_format,
                           nbits=args.nbits, batch_size=args.batch_size, overwrite=args.overwrite,
                           lock_timeout=args.lock_timeout, pool_factor=pool)
    shards = f" ({args.shards} shards)" if args.shards else ""
    print(f"indexed {len(passages)} passages into {path}{shards}", file=sys.stderr)
    return 0


def _read_ids(path: str) -> List[str]:
    from agrame.io import read_lines

    ids = [line.strip() for _, line in read_lines(path) if line.strip()]
    if not ids:
        raise UsageError(f"{'<stdin>' if path == '-' else path}: no ids (the file is empty)")
    return ids


def _parse_filter(text: Optional[str]):
    if text is None:
        return None
    from agrame.index.metadata import parse_filter

    parse_filter(text)  # FilterError (a ValueError) names the problem
    return json.loads(text)


def _cmd_delete(args) -> int:
    ids = list(args.ids) + (_read_ids(args.ids_file) if args.ids_file else [])
    if args.filter is not None and ids:
        raise UsageError("give ids or --filter, not both")
    if args.filter is None and not ids:
        raise UsageError("no ids given (pass IDs, --ids-file FILE or --filter JSON)")
    spec = _parse_filter(args.filter)
    with _writer(args.index, args) as writer:
        before = _live(writer.summary() if hasattr(writer, "summary") else _manifest(args.index))
        new = writer.delete_where(spec) if spec is not None else writer.delete(ids, missing=args.missing)
    print(f"deleted {before - _live(new)} passages from {args.index} ({_live(new)} left, "
          f"generation {new['generation']})", file=sys.stderr)
    return 0


def _cmd_compact(args) -> int:
    with _writer(args.index, args, compact_threshold=None) as writer:
        new = writer.compact()
    done = getattr(writer, "last_compaction", None) or {}
    print(f"compacted {args.index}: {done.get('passages_removed', 0)} deleted passages removed, "
          f"{done.get('bytes_returned', 0):,} bytes returned (generation {new['generation']})", file=sys.stderr)
    return 0


def _cmd_search(args) -> int:
    if (args.query is None) == (args.queries is None):
        raise UsageError("give one query text, or --queries FILE")
    if args.query is not None and not args.query.strip():
        raise UsageError("the query is empty")
    if args.query is not None and (args.run or args.queries_format):
        raise UsageError("--run and --queries-format go with --queries FILE")
    from agrame.index.sharded import open_index

    spec = _parse_filter(args.filter)
    options = dict(exact=args.exact, nprobe=args.nprobe, ncandidates=args.ncandidates, alpha=args.alpha, filter=spec)
    if args.queries is not None:
        return _search_batch(args, options)
    index = open_index(args.index, model=args.model)
    results = index.search(args.query, args.granularity, top_k=args.top_k, **options)
    _print_results(results, args.query, args.format)
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
            _print_results(hits, texts[qid], "table")
    return 0


def _cmd_evaluate(args) -> int:
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


def _cmd_qrels(args) -> int:
    from agrame.datasets import load_pool, load_questions, sample
    from agrame.gold import qrels
    from agrame.runs import atomic_text_file

    pool = _dataset_step(load_pool)
    questions = sample(_dataset_step(load_questions, args.dataset, pool), args.limit, args.seed)
    table = qrels(args.dataset, questions, pool, args.granularity,
                  None if args.index is None else _index_spans(args, pool), ids=args.ids)
    with atomic_text_file(args.out) as out:
        for qid, judged in table.items():
            out.writelines(f"{qid} 0 {doc} {rel}\n" for doc, rel in judged.items())
    if args.queries_out:
        with atomic_text_file(args.queries_out) as out:
            out.writelines(f"{q.qid}\t{' '.join(q.text.split())}\n" for q in questions)
    if args.corpus_out:
        with atomic_text_file(args.corpus_out) as out:
            for i, (pid, text) in enumerate(zip(pool.ids, pool.texts)):
                out.write(json.dumps({"id": pid if args.ids == "source" else str(i), "text": text},
                                     ensure_ascii=False) + "\n")
    left = len(questions) - len(table)
    print(f"agrame qrels: {args.dataset} {args.granularity}: {sum(map(len, table.values()))} judgments for "
          f"{len(table)} of {len(questions)} questions"
          + (f" ({left} without gold {args.granularity}s, as the benchmark leaves them out)" if left else "")
          + (f" → {args.out}" if args.out != "-" else ""), file=sys.stderr)
    return 0


def _index_spans(args, pool):
    """Sentence spans of pool passages as the index ``--index`` holds them (by ``--ids``)."""
    from agrame.index.sharded import open_index

    index = open_index(args.index)
    name = (lambda p: pool.ids[p]) if args.ids == "source" else str

    def spans_of(p: int):
        try:
            return index.sentence_spans(name(p))
        except ValueError:
            raise UsageError(f"--index {args.index}: no passage {name(p)!r} of the pooled corpus (was it "
                             f"built from agrame qrels --corpus-out, with --ids {args.ids}?)") from None
    return spans_of


def _dataset_step(step, *args):
    """A data loader's missing file as a usage error naming it, not a traceback (a missing
    $AGRAME_DATA or an unknown dataset is :class:`agrame.datasets.DataError`, a usage error already)."""
    try:
        return step(*args)
    except FileNotFoundError as exc:
        raise UsageError(f"{exc.filename}: not found — set AGRAME_DATA to the datasets' folder "
                         "(../shared/data/README.md)") from None


def _cmd_export(args) -> int:
    from agrame.loading import load_encoder
    from agrame.export import compatibility, export

    encoder = load_encoder(args.model)
    path = export(encoder, args.out, args.format)
    print(f"wrote {path}: {encoder.source} as a {args.format} checkpoint ({encoder.dim}-d)", file=sys.stderr)
    for note in compatibility(encoder):
        print(f"  differs from AGRaME: {note}", file=sys.stderr)
    return 0


def _cmd_serve(args) -> int:
    try:
        import uvicorn

        from agrame_app.serve import create_app
    except ImportError as exc:
        raise UsageError(f"agrame serve needs the serve extra (pip install 'agrame[serve]'): {exc}") from None
    api_key = None
    if args.api_key_file:
        try:
            api_key = open(args.api_key_file, encoding="utf-8").read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{args.api_key_file}: cannot read the API key: {exc}") from None
    elif os.environ.get("AGRAME_API_KEY"):
        api_key = os.environ["AGRAME_API_KEY"].strip()
    if (args.allow_writes or args.protect_reads) and not api_key:
        raise UsageError("--allow-writes and --protect-reads need an API key (--api-key-file FILE or AGRAME_API_KEY)")
    if args.allow_writes and args.index is None:
        raise UsageError("--allow-writes needs --index DIR")
    if args.ray:
        from agrame.index import distributed
        from agrame.index.sharded import is_sharded

        distributed.check_ray()
        if args.index is None or not is_sharded(args.index):
            raise UsageError("--ray serves a sharded index (build one with agrame index --shards S)")
    app = create_app(args.index, model=args.model, allow_writes=args.allow_writes, api_key=api_key,
                     protect_reads=args.protect_reads, ray_address=args.ray)
    from agrame_app.serve.http import server_config

    timeouts = Timeouts(header=args.header_timeout, body=args.body_timeout, keep_alive=args.keep_alive_timeout)
    print(f"serving on http://{args.host}:{args.port}/", file=sys.stderr)
    uvicorn.Server(server_config(app, args.host, args.port, timeouts, log_level="warning")).run()
    return 0


def _cmd_explain(args) -> int:
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


def _cmd_cite(args) -> int:
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
                                        "passage": None if p.passage is None else passages[p.passage].id,
                                        "best_passage": passages[p.best_passage].id,
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


def _check_arguments(args) -> None:
    """Refuse, before any model work, an argument that is not valid text (the shell passes bytes:
    Python keeps invalid UTF-8 as lone surrogates, which no tokenizer or file can take)."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    flag = name if name in ("query", "ids") else "--" + name.replace("_", "-")
                    raise UsageError(f"{flag}: not valid UTF-8 text ({ascii(item)[:60]})") from None
    if str(getattr(args, "ray", None) or "").startswith("ray://"):
        raise UsageError(f"--ray {args.ray}: Ray Client addresses (ray://) are not supported (docs/ray.md); run the "
                         "command on a node of the cluster with --ray auto or --ray HEAD:6379")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"rank": _cmd_rank, "index": _cmd_index, "search": _cmd_search, "evaluate": _cmd_evaluate, "qrels": _cmd_qrels,
                "export": _cmd_export, "delete": _cmd_delete,
                "compact": _cmd_compact, "explain": _cmd_explain, "serve": _cmd_serve, "cite": _cmd_cite,
                "models": models_command.run}
    try:
        _check_arguments(args)
        return handlers[args.command](args)
    except ValueError as exc:
        # InputError, UsageError, ModelError, IndexFolderError and the Ranker's own checks
        # (a span that covers no token, …) are all ValueErrors: the user's input is wrong.
        print(f"agrame: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `agrame … | head`
        sys.stderr.close()
        return 0
    except OSError as exc:  # a file system refusal no check above foresaw (permissions, disk full, …)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"agrame: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

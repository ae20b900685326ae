"""What the subcommands share: usage errors, argument types, the options several take, printing
results, opening an index's writer."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tomllib
from pathlib import Path
from typing import List, Optional, Sequence

EXIT_USAGE = 2


# One place for each subcommand's help, description and epilog (prose, beside the others'); the arguments are
# declared in the command's own module.
TEXTS = tomllib.loads(Path(__file__).with_name("texts.toml").read_text(encoding="utf-8"))


def command_parser(sub, name: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, **TEXTS[name])


class UsageError(ValueError):
    pass


FILTER_HELP = ("metadata filter (JSON): {\"field\": value}, $eq $ne $in $nin $gt $gte $lt $lte $exists, "
               "$and $or $not; e.g. '{\"year\": {\"$gte\": 2020}}'")


def nonnegative_float(value: str) -> float:
    number = finite_float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {value!r}")
    return number


def share(value: str) -> float:
    number = finite_float(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {value!r}")
    return number


def add_writer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock-timeout", type=nonnegative_float, default=0.0, metavar="SECONDS",
                   help="wait this long for another writer of the index to finish (default: 0, fail at once)")
    p.add_argument("--compact-threshold", type=share, default=0.2, metavar="SHARE",
                   help="compact once this share of the stored passages is deleted (default: 0.2; 1 = never)")


def say(message: str) -> None:
    print(f"agrame: {message}", file=sys.stderr)


def positive_float(value: str) -> float:
    number = finite_float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value!r}")
    return number


def pool_factor(value: str):
    from agrame.pooling import check_pool_factor

    try:
        return check_pool_factor(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def residual_codec(value: str):
    """``--nbits``: bits a dimension (1, 2, 4, 8) or a product quantizer ``pqMxB`` (e.g. ``pq16x6``), ``opqMxB``
    after a learned rotation (e.g. ``opq16x7``), or a residual quantizer ``rqMxB`` (e.g. ``rq14x8``)."""
    from agrame.index.codec import residuals_option

    try:
        return residuals_option(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def finite_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def default_model_help() -> str:
    from agrame.backbones import ZERO_SHOT
    from agrame.loading import DEFAULT_MODEL

    return f"default: {DEFAULT_MODEL}, the trained 128-d model; {ZERO_SHOT} for untrained MiniLM"


def model_names() -> str:
    from agrame.loading import shipped_names

    return ", ".join(shipped_names()) + "; or a Hugging Face name, org/name[@revision]"


DEFAULT_MODEL_HELP = default_model_help()


def add_common(p: argparse.ArgumentParser, granularities: Sequence[str], default_granularity: str) -> None:
    p.add_argument("--granularity", "-g", choices=granularities, default=default_granularity,
                   help=f"unit to rank (default: {default_granularity})")
    p.add_argument("--top-k", "-k", type=positive_int, default=10, help="results to print (default: 10)")
    p.add_argument("--alpha", type=finite_float, default=None,
                   help="weight of the passage score in S'(q,s) + α·S(q,p) (default: the model's, 0.5)")
    p.add_argument("--format", "-f", choices=("table", "jsonl"), default="table",
                   help="table for reading, jsonl for piping (default: table)")


def printable(text: str) -> str:
    """Text safe for a terminal: control and format characters (ESC, NUL, newlines, bidi
    overrides, zero-width marks …) written as ``\\x1b``-style escapes (JSONL keeps the text as it is)."""
    import unicodedata

    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
                   else ch for ch in text)


def print_results(results, query: str, fmt: str, out=None) -> None:
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


UNSET_THRESHOLD = object()


def compact_threshold_of(args) -> Optional[float]:
    return None if args.compact_threshold >= 1 else args.compact_threshold


def read_index_manifest(path: str) -> dict:
    from agrame.index import read_manifest

    return read_manifest(path)


def live_count(manifest: dict) -> int:
    return int(manifest["num_passages"]) - int(manifest.get("num_deleted", 0))


def open_writer(path: str, args, compact_threshold=UNSET_THRESHOLD):
    """The writer of an index folder of either kind (single or sharded)."""
    from agrame.index import IndexWriter
    from agrame.index.sharded import ShardedWriter, is_sharded

    threshold = compact_threshold_of(args) if compact_threshold is UNSET_THRESHOLD else compact_threshold
    if is_sharded(path):
        return ShardedWriter(path, lock_timeout=args.lock_timeout, compact_threshold=threshold, say=say,
                             model=getattr(args, "model", None))
    return IndexWriter(path, lock_timeout=args.lock_timeout, compact_threshold=threshold, say=say)


def index_model(path: str, model, action: str = "search it"):
    from agrame.index import read_manifest
    from agrame.index.format import load_index_model
    from agrame.index.sharded import is_sharded, read_shards

    if is_sharded(path):
        path = os.path.join(path, read_shards(path)["shards"][0])
    return load_index_model(read_manifest(path), path, model, action)


def read_ids(path: str) -> List[str]:
    from agrame.io import read_lines

    ids = [line.strip() for _, line in read_lines(path) if line.strip()]
    if not ids:
        raise UsageError(f"{'<stdin>' if path == '-' else path}: no ids (the file is empty)")
    return ids


def parse_filter_arg(text: Optional[str]):
    if text is None:
        return None
    from agrame.index.metadata import parse_filter

    parse_filter(text)  # FilterError (a ValueError) names the problem
    return json.loads(text)

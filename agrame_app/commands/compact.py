"""``agrame compact``: rewrite an index without its deleted passages."""

from __future__ import annotations

import argparse
import sys

from .common import command_parser, nonnegative_float, open_writer


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "compact")
    p.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    p.add_argument("--lock-timeout", type=nonnegative_float, default=0.0, metavar="SECONDS",
                   help="wait this long for another writer to finish (default: 0, fail at once)")
    return p


def run(args) -> int:
    with open_writer(args.index, args, compact_threshold=None) as writer:
        new = writer.compact()
    done = getattr(writer, "last_compaction", None) or {}
    print(f"compacted {args.index}: {done.get('passages_removed', 0)} deleted passages removed, "
          f"{done.get('bytes_returned', 0):,} bytes returned (generation {new['generation']})", file=sys.stderr)
    return 0

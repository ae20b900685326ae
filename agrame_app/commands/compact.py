"""``agrame compact``: rewrite an index without its deleted passages."""

from __future__ import annotations

import argparse
import sys

from .common import nonnegative_float, open_writer


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compact", help="rewrite an index without its deleted passages (returns the disk space)",
        description="Copy the live passages into a new store as one generation; readers of the previous "
                    "generation keep working until they reload.",
        epilog="Example: agrame compact -i my-index",
    )
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

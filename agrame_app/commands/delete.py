"""``agrame delete``: delete passages of an index by id or by filter."""

from __future__ import annotations

import argparse
import sys

from .common import (UsageError, add_writer_options, command_parser, live_count, open_writer, parse_filter_arg,
                     read_ids, read_index_manifest, share)


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "delete")
    p.add_argument("ids", nargs="*", metavar="ID", help="passage ids to delete")
    p.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder")
    p.add_argument("--ids-file", metavar="FILE", default=None, help="a file with one id per line (or - for stdin)")
    p.add_argument("--filter", metavar="JSON", default=None, help="delete every passage this filter admits")
    p.add_argument("--missing", choices=("error", "ok"), default="error",
                   help="an id the index does not hold: error (exit 2, nothing deleted; default) or ok (skip it)")
    add_writer_options(p)
    return p


def run(args) -> int:
    ids = list(args.ids) + (read_ids(args.ids_file) if args.ids_file else [])
    if args.filter is not None and ids:
        raise UsageError("give ids or --filter, not both")
    if args.filter is None and not ids:
        raise UsageError("no ids given (pass IDs, --ids-file FILE or --filter JSON)")
    spec = parse_filter_arg(args.filter)
    with open_writer(args.index, args) as writer:
        before = live_count(writer.summary() if hasattr(writer, "summary") else read_index_manifest(args.index))
        new = writer.delete_where(spec) if spec is not None else writer.delete(ids, missing=args.missing)
    print(f"deleted {before - live_count(new)} passages from {args.index} ({live_count(new)} left, "
          f"generation {new['generation']})", file=sys.stderr)
    return 0

"""``agrame export``: write a model as a colbert-ai or PyLate checkpoint."""

from __future__ import annotations

import argparse
import sys

from .common import command_parser


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "export")
    p.add_argument("out", metavar="OUT", help="folder to write (must not exist, or be empty)")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder, shipped name or Hugging Face name org/name[@revision] (default: the package default)")
    p.add_argument("--format", choices=("stanford", "pylate"), required=True, help="checkpoint format")
    return p


def run(args) -> int:
    from agrame.loading import load_encoder
    from agrame.export import compatibility, export

    encoder = load_encoder(args.model)
    path = export(encoder, args.out, args.format)
    print(f"wrote {path}: {encoder.source} as a {args.format} checkpoint ({encoder.dim}-d)", file=sys.stderr)
    for note in compatibility(encoder):
        print(f"  differs from AGRaME: {note}", file=sys.stderr)
    return 0

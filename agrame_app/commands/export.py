"""``agrame export``: write a model as a colbert-ai or PyLate checkpoint."""

from __future__ import annotations

import argparse
import sys



def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "export", help="write a model as a Stanford ColBERT (colbert-ai) or PyLate checkpoint",
        description="Export a model for colbert-ai 0.2.22 (--format stanford) or PyLate (--format pylate). "
                    "Both insert [Q]/[D] markers and pad queries with [MASK]; what the exported model does "
                    "differently from AGRaME is printed (and recorded in the folder).",
        epilog="Example: agrame export --model squad-a1 --format stanford exported/squad-a1-colbert",
    )
    p.add_argument("out", metavar="OUT", help="folder to write (must not exist, or be empty)")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder or shipped name (default: the package default)")
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

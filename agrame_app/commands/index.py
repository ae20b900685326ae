"""``agrame index``: encode a passage file into an index folder, or change one (--add, --upsert, --overwrite)."""

from __future__ import annotations

import argparse
import sys

from agrame.io import FORMATS, MAX_PASSAGE_CHARS, read_passages
from .common import (DEFAULT_MODEL_HELP, UsageError, add_writer_options, command_parser, index_model, live_count,
                     model_names, open_writer, pool_factor, positive_int, residual_codec, say)


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "index")
    p.add_argument("--passages", "-p", required=True, metavar="FILE", help="passage file, or - for stdin")
    p.add_argument("--index", "-i", required=True, metavar="DIR", help="index folder to create (or extend with --add)")
    p.add_argument("--input-format", choices=FORMATS, default="auto", help="passage file format")
    p.add_argument("--max-passage-chars", type=positive_int, default=MAX_PASSAGE_CHARS, metavar="N",
                   help="refuse a passage longer than N characters (default: {:,}); split long "
                        "documents into passages".format(MAX_PASSAGE_CHARS))
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder or a shipped name (" + model_names() + "); " + DEFAULT_MODEL_HELP
                   + " (with --add: the index's own)")
    p.add_argument("--nbits", type=residual_codec, default=None, metavar="B",
                   help="each token's residual: bits per dimension, 1, 2, 4 or 8 (2: ~37 bytes per 128-d token), "
                        "or a product quantizer pqMxB: M sub-vectors of B bits (pq16x6: ~17 bytes), opqMxB after "
                        "a learned rotation (opq16x7: ~19 bytes), or a residual quantizer rqMxB: M additive "
                        "codebooks of B bits (rq14x8: ~19 bytes); default: the model's own (2 for most)")
    p.add_argument("--pool-factor", type=pool_factor, default=None, metavar="F",
                   help="keep about one vector per F tokens, pooled by Ward clustering of each sentence's "
                        "tokens, so every sentence and span stays searchable (default: the model's own, 1 for "
                        "most: one vector per token; with --add/--upsert: the index's own, another is refused)")
    p.add_argument("--format", dest="index_format", type=int, choices=(1, 2), default=2,
                   help="2: compressed (default); 1: float16 vectors, exhaustive search only")
    p.add_argument("--add", action="store_true",
                   help="append passages with new ids to an existing compressed index with its centroids")
    p.add_argument("--upsert", action="store_true",
                   help="replace the passages whose ids the index holds (text, vectors, metadata) and add the rest")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing index (only an AGRaME index: any other folder is refused) "
                        "as a new generation; readers see the old or the new one")
    p.add_argument("--batch-size", type=positive_int, default=16, help="passages per forward pass (default: 16, fastest on CPU)")
    p.add_argument("--shards", type=positive_int, default=None, metavar="S",
                   help="split the index into S shards with one codec, passages routed by a hash of their id; "
                        "searched as one index (shards in parallel)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="encode on a Ray cluster: an actor pool of encoders (one GPU each where the cluster "
                        "has GPUs). ADDRESS: 'auto' or HEAD:6379 (run on a node of the cluster), or none to start Ray "
                        "on this machine; Ray Client (ray://) is not supported "
                        "(needs pip install 'agrame[ray]')")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="with --ray: encoder actors (default: one per GPU, else one per 2 CPUs)")
    p.add_argument("--resume", action="store_true",
                   help="with --ray: continue an interrupted build from its finished blocks")
    add_writer_options(p)
    return p


def run(args) -> int:
    chosen = [f"--{name}" for name in ("add", "upsert", "overwrite", "resume") if getattr(args, name)]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} cannot be combined")
    if (args.add or args.upsert) and args.index_format == 1:
        raise UsageError("--add and --upsert need a compressed index (--format 2)")
    if (args.add or args.upsert) and args.nbits is not None:
        raise UsageError("--add and --upsert keep the index's own residual codec; --nbits is for a new index")
    if args.index_format == 1 and args.nbits is not None:
        raise UsageError("--nbits needs a compressed index (--format 2)")
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
        encoder = index_model(args.index, args.model, "upsert into it" if args.upsert else "add to it")
        with open_writer(args.index, args) as writer:
            change = writer.upsert if args.upsert else writer.add
            new = change(encoder, passages, batch_size=args.batch_size, progress=True, pool_factor=args.pool_factor)
        print(f"{'upserted' if args.upsert else 'added'} {len(passages)} passages to {args.index} "
              f"({live_count(new)} in all, generation {new['generation']})", file=sys.stderr)
        return 0
    if ray_session is not None:
        from agrame.index import distributed

        path = distributed.build_with_ray(args.model, passages, args.index, address=args.ray, workers=args.workers,
                                          shards=args.shards, nbits=args.nbits, batch_size=args.batch_size,
                                          overwrite=args.overwrite, resume=args.resume,
                                          lock_timeout=args.lock_timeout, say=say, pool_factor=pool)
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

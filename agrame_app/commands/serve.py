"""``agrame serve``: serve an index over HTTP."""

from __future__ import annotations

import argparse
import os
import sys

from agrame_app.serve.http import Timeouts
from .common import DEFAULT_MODEL_HELP, UsageError, command_parser, positive_float, positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "serve")
    p.add_argument("--index", "-i", metavar="DIR", default=None,
                   help="index folder (without one, only /rank and /cite are served)")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="model folder or Hugging Face name org/name[@revision] (default: the index's, else " + DEFAULT_MODEL_HELP.split(": ", 1)[1] + ")")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=positive_int, default=8000, help="port (default: 8000)")
    p.add_argument("--allow-writes", action="store_true",
                   help="serve POST/DELETE /passages (needs an API key: --api-key-file or AGRAME_API_KEY)")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="file holding the API key that writes (and, with --protect-reads, reads) must send "
                        "as 'Authorization: Bearer KEY' or 'X-API-Key: KEY' (default: $AGRAME_API_KEY)")
    p.add_argument("--protect-reads", action="store_true", help="require the API key for every endpoint but / and /health")
    p.add_argument("--header-timeout", type=positive_float, default=Timeouts.header, metavar="SECONDS",
                   help="a request's head must arrive whole within this many seconds of the connection (of its first "
                        "byte on a kept-alive one), or a "
                        f"408 closes the connection (slow clients; default: {Timeouts.header:g})")
    p.add_argument("--body-timeout", type=positive_float, default=Timeouts.body, metavar="SECONDS",
                   help=f"and its body within this many seconds of its head (default: {Timeouts.body:g})")
    p.add_argument("--keep-alive-timeout", type=positive_int, default=Timeouts.keep_alive, metavar="SECONDS",
                   help="an idle connection between requests is closed after this many seconds "
                        f"(default: {Timeouts.keep_alive})")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="what the server logs to stderr: info = a line a request (method, path, status, ms) and "
                        "start-up; warning = problems only (default: info)")
    p.add_argument("--log-queries", action="store_true",
                   help="put request query strings in the access log (left out by default: they may hold a "
                        "user's search)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="serve a sharded index through one Ray actor per shard, spread over the cluster "
                        "('auto' or HEAD:6379 from a node of the cluster, or none for Ray on this machine; Ray Client, "
                        "ray://, is not supported); a shard whose actor "
                        "is down answers 503 unless the request sets allow_partial")
    return p


def _log_to_stderr(level: str) -> None:
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("agrame.access", "agrame.serve"):
        logger = logging.getLogger(name)
        logger.setLevel(level.upper())
        if not logger.handlers:
            logger.addHandler(handler)
        logger.propagate = False


def run(args) -> int:
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
                     protect_reads=args.protect_reads, ray_address=args.ray, log_queries=args.log_queries)
    from agrame_app.serve.http import server_config

    timeouts = Timeouts(header=args.header_timeout, body=args.body_timeout, keep_alive=args.keep_alive_timeout)
    print(f"serving on http://{args.host}:{args.port}/", file=sys.stderr)
    _log_to_stderr(args.log_level)
    # uvicorn's own access log is off: ours (agrame.access) has the status and the milliseconds, and no query text
    uvicorn.Server(server_config(app, args.host, args.port, timeouts, log_level=args.log_level,
                                 access_log=False)).run()
    return 0

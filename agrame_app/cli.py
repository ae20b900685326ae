"""The ``agrame`` command line: one module per subcommand in :mod:`agrame_app.commands`, each holding
its arguments (``add_parser``) beside its handler (``run``); here they are registered and run.

Usage errors (bad arguments, unreadable or malformed input, a wrong model or index)
print ``agrame: error: …`` naming the file, line and field, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from agrame import __version__
from agrame_app.commands import (cite, compact, delete, evaluate, explain, export, index, models, qrels, rank, search,
                                 serve, train)
from agrame_app.commands.common import EXIT_USAGE, UsageError, printable  # noqa: F401 (printable: re-exported)

#: The subcommands, in the order ``agrame --help`` lists them.
COMMANDS = (rank, index, search, evaluate, qrels, export, delete, compact, models, serve, explain, cite, train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agrame",
        description="Any-granularity ranking: one multi-vector encoding of each passage ranks "
                    "passages, sentences or any character span inside them.",
    )
    parser.add_argument("--version", action="version", version=f"agrame {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub).set_defaults(handler=command.run)
    return parser


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
    args = build_parser().parse_args(argv)
    try:
        _check_arguments(args)
        return args.handler(args)
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

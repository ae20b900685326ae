"""JSON read with a bound on its nesting, checked before parsing (Python's parser recurses): what every
reader of user JSON uses — passage files, run files, filters, request bodies. A module of its own, below
both :mod:`agrame.io` and :mod:`agrame.index.metadata`, so that neither imports the other for it."""

from __future__ import annotations

import json
import re

#: Deepest JSON nesting any reader accepts, checked before parsing (Python's parser recurses).
MAX_JSON_DEPTH = 64

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # (unrolled: linear, fast on long strings)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a JSON text (strings skipped), counted only up to ``limit + 1``: linear,
    without recursion, so it runs before a parser that would recurse on a hostile input."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if b"[" not in data and b"{" not in data:
        return 0
    depth = deepest = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b"", data)):
        if match.group() in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def loads_json(text: str | bytes, limit: int = MAX_JSON_DEPTH):
    """``json.loads`` of a text nested at most ``limit`` deep (deeper: ``json.JSONDecodeError``)."""
    if json_depth(text, limit) > limit:
        raise json.JSONDecodeError(f"nested more than {limit} deep", text if isinstance(text, str) else "", 0)
    return json.loads(text)


__all__ = ["MAX_JSON_DEPTH", "json_depth", "loads_json"]

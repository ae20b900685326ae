"""Query files, TREC run files and qrels: what batch search reads and writes, and evaluation reads.

**Document ids in runs and qrels.** A passage is its id; a sentence or span is its passage's id,
``#``, and its character span ``start:end`` (end exclusive, as ``ScoredSpan``), pieces joined by
``,``::

    doc-7              the passage "doc-7"
    doc-7#120:188      characters 120–188 of doc-7 (a sentence)
    doc-7#0:11,20:24   a span of two pieces

TREC columns are separated by whitespace, so the characters ``%``, ``#`` and whitespace inside a
passage id are percent-encoded (``my doc#1`` → ``my%20doc%231``); every other id is written as it
is. :func:`parse_docid` reverses both steps.

A run line is ``qid Q0 docid rank score tag`` (rank from 1); a qrels line ``qid 0 docid relevance``.
A query file is TSV (``qid<TAB>text``) or JSONL (``{"id": …, "text": …}``), one query a line.
Every reader names the file and line of the first bad one (:class:`RunFileError`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple

from .io import loads_json
from .ranker import ScoredSpan

#: Characters of a passage id that TREC columns cannot carry as they are.
_ESCAPE = re.compile(r"[%#\s]")
_UNESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_PIECE = re.compile(r"(\d+):(\d+)")


class RunFileError(ValueError):
    """A query file, run file or qrels file that cannot be read (file, line and what is wrong)."""


def _escape(passage_id: str) -> str:
    return _ESCAPE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), passage_id)


def _unescape(text: str) -> str:
    raw = _UNESCAPE.sub(lambda m: f"\x00{m.group(1)}", text)
    if "\x00" not in raw:
        return text
    out, parts = bytearray(), raw.split("\x00")
    out += parts[0].encode("utf-8")
    for part in parts[1:]:
        out.append(int(part[:2], 16))
        out += part[2:].encode("utf-8")
    return out.decode("utf-8", errors="strict")


def span_docid(passage_id: str, pieces: Sequence[Tuple[int, int]] = ()) -> str:
    """The run-file id of a passage (no ``pieces``) or of a span of it (see the module's documentation)."""
    pid = _escape(passage_id)
    if not pieces:
        return pid
    return pid + "#" + ",".join(f"{a}:{b}" for a, b in pieces)


def docid(hit: ScoredSpan, granularity: str) -> str:
    """The run-file id of a hit."""
    if granularity == "passage":
        return span_docid(hit.passage_id)
    return span_docid(hit.passage_id, hit.pieces or ((hit.start, hit.end),))


def parse_docid(text: str) -> Tuple[str, Tuple[Tuple[int, int], ...]]:
    """``(passage_id, pieces)``; ``pieces`` is empty for a passage."""
    pid, sep, span = text.partition("#")
    if not sep:
        return _unescape(pid), ()
    pieces = []
    for piece in span.split(","):
        m = _PIECE.fullmatch(piece)
        if not m or int(m.group(1)) > int(m.group(2)):
            raise ValueError(f"document id {text!r}: span {piece!r} is not START:END")
        pieces.append((int(m.group(1)), int(m.group(2))))
    return _unescape(pid), tuple(pieces)


def write_run(out: TextIO, qid: str, hits: Sequence[ScoredSpan], granularity: str, tag: str = "agrame") -> None:
    """Append one query's hits as TREC run lines."""
    if _ESCAPE.search(qid) or _ESCAPE.search(tag):
        raise ValueError(f"query id {qid!r} / tag {tag!r}: TREC columns cannot hold whitespace, '#' or '%'")
    for rank, hit in enumerate(hits, 1):
        out.write(f"{qid} Q0 {docid(hit, granularity)} {rank} {hit.score:.6f} {tag}\n")


@contextlib.contextmanager
def atomic_text_file(path: str | Path):
    """Write a text file under a temporary name and rename it into place when the block ends
    without an error: a run file is whole or absent (``-``: standard output)."""
    if str(path) == "-":
        yield sys.stdout
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _lines(path: str | Path) -> Iterable[Tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                yield n, line.rstrip("\n").rstrip("\r")
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_queries(path: str | Path, fmt: Optional[str] = None) -> List[Tuple[str, str]]:
    """``[(qid, text)]`` of a TSV or JSONL query file (``fmt``: "tsv" / "jsonl", else from the
    extension, else from the first line)."""
    out: List[Tuple[str, str]] = []
    seen: Dict[str, int] = {}
    name = str(path)
    if fmt is None:
        fmt = "jsonl" if name.endswith((".jsonl", ".json")) else "tsv" if name.endswith((".tsv", ".txt")) else None
    for n, line in _lines(path):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        if fmt is None:
            fmt = "jsonl" if line.lstrip().startswith("{") else "tsv"
        if fmt == "jsonl":
            try:
                record = loads_json(line)
            except json.JSONDecodeError as exc:
                raise RunFileError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise RunFileError(f"{where}: expected a JSON object with 'id' and 'text'")
            for field in ("id", "text"):
                if field not in record:
                    raise RunFileError(f"{where}: field {field!r} is missing")
            qid, text = record["id"], record["text"]
            if isinstance(qid, int) and not isinstance(qid, bool):
                qid = str(qid)
            if not isinstance(qid, str):
                raise RunFileError(f"{where}: field 'id': expected a string or integer, got {type(qid).__name__}")
            if not isinstance(text, str):
                raise RunFileError(f"{where}: field 'text': expected a string, got {type(text).__name__}")
        else:
            qid, tab, text = line.partition("\t")
            if not tab:
                raise RunFileError(f"{where}: expected 'qid<TAB>query text' (no tab on this line)")
        for field, value in (("id", qid), ("text", text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # JSON "\ud800": a lone surrogate no tokenizer or file can take
                raise RunFileError(f"{where}: field {field!r}: not valid Unicode text ({ascii(value)[:40]})") from None
        qid = qid.strip()
        if not qid:
            raise RunFileError(f"{where}: the query id is empty")
        if _ESCAPE.search(qid):
            raise RunFileError(f"{where}: query id {qid!r} holds whitespace, '#' or '%' (run files cannot)")
        if not text.strip():
            raise RunFileError(f"{where}: query {qid!r} is empty")
        if qid in seen:
            raise RunFileError(f"{where}: query id {qid!r} repeats line {seen[qid]}")
        seen[qid] = n
        out.append((qid, text))
    if not out:
        raise RunFileError(f"{name}: no queries")
    return out


def _columns(path: str | Path, count: int, layout: str) -> Iterable[Tuple[int, List[str]]]:
    """The whitespace-separated columns of each non-blank line, exactly ``count`` of them."""
    for n, line in _lines(path):
        if line.strip():
            cols = line.split()
            if len(cols) != count:
                raise RunFileError(f"{path}:{n}: expected {count} columns '{layout}', got {len(cols)}")
            yield n, cols


def _read_table(path: str | Path, count: int, layout: str, value, kind: str) -> Dict[str, Dict[str, Any]]:
    """``{qid: {docid: value(columns)}}`` of a run or qrels file; ``value`` raises ValueError (the line's
    problem) on a bad line."""
    out: Dict[str, Dict[str, Any]] = {}
    for n, cols in _columns(path, count, layout):
        try:
            out.setdefault(cols[0], {})[cols[2]] = value(cols)
        except ValueError as exc:
            raise RunFileError(f"{path}:{n}: {exc}") from None
    if not out:
        raise RunFileError(f"{path}: no {kind} lines")
    return out


def _run_score(cols: List[str]) -> float:
    try:
        int(cols[3])
        return float(cols[4])
    except ValueError:
        raise ValueError(f"rank {cols[3]!r} / score {cols[4]!r} are not numbers") from None


def _relevance(cols: List[str]) -> int:
    try:
        return int(cols[3])
    except ValueError:
        raise ValueError(f"relevance {cols[3]!r} is not an integer") from None


def read_run(path: str | Path) -> Dict[str, Dict[str, float]]:
    """``{qid: {docid: score}}`` of a TREC run file."""
    return _read_table(path, 6, "qid Q0 docid rank score tag", _run_score, "run")


def read_qrels(path: str | Path) -> Dict[str, Dict[str, int]]:
    """``{qid: {docid: relevance}}`` of a TREC qrels file."""
    return _read_table(path, 4, "qid 0 docid relevance", _relevance, "qrels")

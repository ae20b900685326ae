"""Reading passage files (JSONL, TSV, plain text, Parquet) with errors that name file, line (row) and field."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Iterator, List, Optional, Tuple

from .corpus import Passage
from .jsonbounds import MAX_JSON_DEPTH, json_depth, loads_json  # noqa: F401 (re-exported: readers' bound)
from .spans import normalize_span

FORMATS = ("auto", "jsonl", "tsv", "text", "parquet")
#: Longest passage read (characters; ``--max-passage-chars``): a passage is encoded in overlapping
#: windows, so its cost grows with its length (an 8 MB one ran past 90 s and 1.6 GB here).
MAX_PASSAGE_CHARS = 200_000
class InputError(ValueError):
    """Bad user input; ``str()`` reads ``FILE:LINE: field 'F': problem``."""

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None,
                 field: Optional[str] = None):
        self.message, self.path, self.line, self.field = message, path, line, field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path or ""
        if self.line is not None:
            where += f":{self.line}"
        prefix = f"{where}: " if where else ""
        field = f"field '{self.field}': " if self.field else ""
        return f"{prefix}{field}{self.message}"


def _open_binary(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path)
    if p.is_dir():
        raise InputError("is a folder, not a file", path)
    return p.open("rb")


def read_lines(path: str) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of each line, decoded strictly as UTF-8 (BOM tolerated)."""
    stream = _open_binary(path)
    name = "<stdin>" if path == "-" else path
    try:
        for number, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"invalid UTF-8 at byte {exc.start} of the line", name, number) from None
            if number == 1:
                line = line.lstrip("\ufeff")
            yield number, line.rstrip("\r\n")
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def detect_format(path: str, first_line: Optional[str]) -> str:
    suffix = Path(path).suffix.lower() if path != "-" else ""
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".tsv":
        return "tsv"
    if suffix == ".parquet":
        return "parquet"
    if first_line is not None and first_line.lstrip().startswith("{"):
        return "jsonl"
    return "text"


def read_passages(path: str, fmt: str = "auto", max_chars: Optional[int] = MAX_PASSAGE_CHARS) -> List[Passage]:
    """Read passages: JSONL ``{"id", "text", "spans"?, "metadata"?}``, TSV ``id<TAB>text`` or one per line.

    Blank lines are skipped. Ids must be unique; JSONL ids default to the passage's
    0-based position. ``spans`` (JSONL only) is a list of ``[start, end]`` or of lists of
    such pieces, in characters of ``text``. A text longer than ``max_chars`` is refused (None: any).
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; choose one of {', '.join(FORMATS)}")
    name = "<stdin>" if path == "-" else path
    if fmt == "parquet" or (fmt == "auto" and detect_format(path, None) == "parquet"):
        return _read_parquet(path, name, max_chars)
    lines = [(n, line) for n, line in read_lines(path) if line.strip()]
    if fmt == "auto":
        fmt = detect_format(path, lines[0][1] if lines else None)
    passages: List[Passage] = []
    seen = {}
    for number, line in lines:
        if fmt == "jsonl":
            passage = _parse_jsonl(line, name, number, len(passages))
        elif fmt == "tsv":
            if "\t" not in line:
                raise InputError("expected id<TAB>text, found no tab", name, number)
            pid, text = line.split("\t", 1)
            if not pid.strip():
                raise InputError("empty id", name, number, "id")
            if not text.strip():
                raise InputError("empty text", name, number, "text")
            passage = Passage(pid.strip(), text)
        else:
            passage = Passage(str(len(passages)), line)
        _check_length(passage, max_chars, name, number)
        _append_unique(passages, seen, passage, name, number, "line")
    if not passages:
        raise InputError("no passages (the input is empty)", name)
    return passages


def _check_length(passage: Passage, max_chars: Optional[int], name: str, number: int) -> None:
    if max_chars is not None and len(passage.text) > max_chars:
        raise InputError(f"{len(passage.text):,} characters, at most {max_chars:,} (--max-passage-chars; split "
                         "long documents into passages)", name, number, "text")


def _read_parquet(path: str, name: str, max_chars: Optional[int] = MAX_PASSAGE_CHARS) -> List[Passage]:
    """Rows of a Parquet file as passages: columns ``text`` (required), ``id``, ``spans``, ``metadata``
    (a struct, or a JSON object as a string); errors name the row (1-based) like a line."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet needs pyarrow (pip install 'agrame[ray]' or pip install pyarrow)",
                         name) from None
    if path == "-":
        raise InputError("Parquet cannot be read from standard input; give a file", name)
    _open_binary(path).close()  # no such file / a folder: named like the other formats
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise InputError(f"not a readable Parquet file ({exc})", name) from None
    if "text" not in table.column_names:
        raise InputError(f"no 'text' column (columns: {', '.join(table.column_names)})", name, field="text")
    passages, seen = [], {}
    for number, record in enumerate(table.to_pylist(), start=1):
        if isinstance(record.get("metadata"), str):
            try:
                record["metadata"] = loads_json(record["metadata"])
            except json.JSONDecodeError as exc:
                raise InputError(f"malformed JSON: {exc.msg}", name, number, "metadata") from None
        for key in [k for k, v in record.items() if v is None]:
            del record[key]
        passage = _parse_record(record, name, number, len(passages))
        _check_length(passage, max_chars, name, number)
        _append_unique(passages, seen, passage, name, number, "row")
    if not passages:
        raise InputError("no passages (the input is empty)", name)
    return passages


def _append_unique(passages: List[Passage], seen: dict, passage: Passage, name: str, number: int, unit: str) -> None:
    if passage.id in seen:
        raise InputError(f"duplicate id {passage.id!r} (first on {unit} {seen[passage.id]})", name, number, "id")
    seen[passage.id] = number
    passages.append(passage)


def _parse_jsonl(line: str, name: str, number: int, position: int) -> Passage:
    try:
        record = loads_json(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg} (column {exc.colno})", name, number) from None
    return _parse_record(record, name, number, position)


def _parse_record(record, name: str, number: int, position: int) -> Passage:
    if not isinstance(record, dict):
        raise InputError("expected a JSON object", name, number)
    if "text" not in record:
        raise InputError("missing", name, number, "text")
    text = record["text"]
    if not isinstance(text, str):
        raise InputError(f"expected a string, got {type(text).__name__}", name, number, "text")
    if not text.strip():
        raise InputError("empty text", name, number, "text")
    pid = record.get("id", position)
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise InputError(f"expected a string or integer, got {type(pid).__name__}", name, number, "id")
    pid = str(pid)
    if not pid.strip():
        raise InputError("empty id", name, number, "id")
    for field, value in (("id", pid), ("text", text)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a "\ud800" escape: JSON allows it, no text encoding does
            raise InputError("not valid Unicode (a lone surrogate escape)", name, number, field) from None
    spans = None
    if record.get("spans") is not None:
        raw = record["spans"]
        if not isinstance(raw, list):
            raise InputError("expected a list of [start, end] spans", name, number, "spans")
        try:
            spans = tuple(normalize_span(s, len(text)) for s in raw)
        except (ValueError, TypeError) as exc:
            raise InputError(str(exc), name, number, "spans") from None
    metadata = None
    if record.get("metadata") is not None:
        from .index.metadata import MetadataError, validate_metadata

        try:
            metadata = validate_metadata(record["metadata"], "metadata") or None
        except MetadataError as exc:
            raise InputError(str(exc).split(": ", 1)[-1], name, number, str(exc).split(": ", 1)[0]) from None
    return Passage(pid, text, spans, metadata)


def read_text(path: str) -> str:
    """Whole UTF-8 text of a file or stdin (``-``), with line-numbered decoding errors."""
    return "\n".join(line for _, line in read_lines(path))

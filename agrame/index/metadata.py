"""Passage metadata in an embedded SQLite file, and the JSON filter language compiled to
*parameterised* SQL (a key or a value is always a bound parameter, never SQL text).

Metadata: one JSON object per passage whose values are strings, numbers, booleans or lists
of those (no ``null``, no nested objects). A filter is a JSON object:

=============================  ======================================================
``{"source": "wiki"}``          equality (``$eq``); on a list field: the list contains it
``{"year": {"$gte": 2020}}``    ``$gt $gte $lt $lte`` (numbers with numbers, strings with strings)
``{"lang": {"$in": [..]}}``     ``$in``, ``$nin``, ``$ne`` (``$nin``/``$ne`` match a missing field)
``{"draft": {"$exists": false}}`` whether the field is present
``{"$and": [..]}``              also ``$or: [..]`` and ``$not: {..}``; several keys in one object: all must hold
=============================  ======================================================

Booleans equal only booleans (``true`` is not ``1``). :func:`matches` evaluates a filter in
plain Python; the SQL compiled by :func:`compile_filter` must agree with it (tested on random
metadata and random filters).

Storage (``meta.sqlite`` in the index's store folder, WAL mode, so readers are never blocked):
``passages(pos, id, meta)`` — one row per stored position, append-only like the store — and
``fields(pos, key, t, v)`` — one row per scalar value (``t``: ``s`` string, ``n`` number,
``b`` boolean, ``e`` an empty list), indexed by ``(key, t, v)``. A reader of generation G sees
positions below G's ``num_passages`` that G's tombstones do not mark, so rows a writer adds
for the next generation are invisible until its manifest commits.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import zlib
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..jsonbounds import loads_json
from .format import IndexFolderError, valid_digest, writing

METADATA_FILE = "meta.sqlite"
#: The manifest field that records the committed rows' digest (:meth:`MetadataDB.digest`).
DIGEST_FIELD = "metadata_digest"
#: Rows (passages + field values) whose digest is checked whenever an index is opened; a larger
#: file only with ``verify=True`` (reading and hashing runs at ~0.5 M rows a second here).
META_VERIFY_ROWS = 500_000
_MASK = (1 << 64) - 1
#: Bounds on a filter, checked before any SQL is built (SQLite refuses an expression deeper than 1,000
#: and more than 32,766 bound values): ``$in``/``$nin`` values in the whole filter, conditions and
#: ``$and``/``$or``/``$not`` nodes in it, and nesting depth.
MAX_FILTER_VALUES = 10_000
MAX_FILTER_TERMS = 256
MAX_FILTER_DEPTH = 32
COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
OPERATORS = ("$eq", "$ne", "$in", "$nin", "$exists", *COMPARISONS)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS passages (pos INTEGER PRIMARY KEY, id TEXT NOT NULL, meta TEXT);
CREATE INDEX IF NOT EXISTS passages_id ON passages(id);
CREATE TABLE IF NOT EXISTS fields (pos INTEGER NOT NULL, key TEXT NOT NULL, t TEXT NOT NULL, v);
CREATE INDEX IF NOT EXISTS fields_kv ON fields(key, t, v, pos);
CREATE INDEX IF NOT EXISTS fields_pos ON fields(pos);
"""


class FilterError(ValueError):
    """A filter that is not valid in the filter language (the message names where)."""


class MetadataError(ValueError):
    """Passage metadata outside what can be stored (the message names the field)."""


# -- values -------------------------------------------------------------------------------

def _kind(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    if isinstance(value, str):
        return "s"
    return None


def _check_string(value: str, where: str, error=MetadataError) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{where}: not valid Unicode (a lone surrogate)") from None


def _check_scalar(value: Any, where: str, error=MetadataError) -> str:
    kind = _kind(value)
    if kind is None:
        raise error(f"{where}: expected a string, number or boolean, got "
                    f"{'null' if value is None else type(value).__name__}")
    if kind == "n" and not math.isfinite(float(value)):
        raise error(f"{where}: numbers must be finite")
    if kind == "n" and isinstance(value, int) and abs(value) > 2 ** 53:
        raise error(f"{where}: integers beyond ±2^53 are not exact as stored numbers")
    if kind == "s":
        _check_string(value, where, error)
    return kind


def validate_metadata(meta: Any, where: str = "metadata") -> Dict[str, Any]:
    """``meta`` checked (an object of strings, numbers, booleans and lists of them), or MetadataError."""
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise MetadataError(f"{where}: expected a JSON object, got {type(meta).__name__}")
    out = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not key or key.startswith("$"):
            raise MetadataError(f"{where}: field name {key!r} must be a non-empty string not starting with '$'")
        _check_string(key, f"{where}: field name", MetadataError)
        if isinstance(value, list):
            for i, item in enumerate(value):
                _check_scalar(item, f"{where}.{key}[{i}]")
        else:
            _check_scalar(value, f"{where}.{key}")
        out[key] = list(value) if isinstance(value, list) else value
    return out


def _values(meta: Mapping[str, Any], key: str) -> List[Any]:
    if key not in meta:
        return []
    value = meta[key]
    return list(value) if isinstance(value, list) else [value]


def _same(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    return float(a) == float(b) if ka == "n" else a == b


# -- the filter language -------------------------------------------------------------------

def _operand(value: Any, where: str) -> Tuple[str, Any]:
    return _check_scalar(value, where, FilterError), value


def _stored(kind: str, value: Any) -> Any:
    """How a scalar is stored in (and compared by) SQLite: numbers as REAL, booleans as 0/1."""
    return float(value) if kind == "n" else int(value) if kind == "b" else value


class _Budget:
    """What a filter has used of its bounds so far (terms and ``$in`` values)."""

    def __init__(self):
        self.terms = self.values = 0

    def term(self, where: str) -> None:
        self.terms += 1
        if self.terms > MAX_FILTER_TERMS:
            raise FilterError(f"{where}: more than {MAX_FILTER_TERMS} conditions and $and/$or/$not terms in one "
                              "filter (for many values of one field use $in)")

    def add_values(self, n: int, where: str) -> None:
        self.values += n
        if self.values > MAX_FILTER_VALUES:
            raise FilterError(f"{where}: more than {MAX_FILTER_VALUES} $in/$nin values in one filter")


def _parse(node: Any, where: str, depth: int, budget: Optional[_Budget] = None):
    """A filter → a small tree: ("and", [..]) / ("or", [..]) / ("not", x) / ("field", key, op, arg)."""
    budget = budget or _Budget()
    if depth > MAX_FILTER_DEPTH:
        raise FilterError(f"{where}: nested more than {MAX_FILTER_DEPTH} deep")
    if not isinstance(node, Mapping):
        raise FilterError(f"{where}: expected a JSON object, got {type(node).__name__}")
    parts = []
    for key, value in node.items():
        if not isinstance(key, str):
            raise FilterError(f"{where}: keys must be strings")
        _check_string(key, f"{where}: key", FilterError)
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{where}.{key}: expected a non-empty list of filters")
            budget.term(f"{where}.{key}")
            if len(value) > MAX_FILTER_TERMS:
                raise FilterError(f"{where}.{key}: {len(value)} terms, at most {MAX_FILTER_TERMS} (for many values "
                                  "of one field use $in)")
            parts.append((key[1:], [_parse(v, f"{where}.{key}[{i}]", depth + 1, budget) for i, v in enumerate(value)]))
        elif key == "$not":
            budget.term(f"{where}.$not")
            parts.append(("not", _parse(value, f"{where}.$not", depth + 1, budget)))
        elif key.startswith("$"):
            raise FilterError(f"{where}: unknown operator {key!r} (at this level: $and, $or, $not, or a field name)")
        elif not key:
            raise FilterError(f"{where}: empty field name")
        elif isinstance(value, Mapping):
            if not value:
                raise FilterError(f"{where}.{key}: an empty condition")
            for op, arg in value.items():
                budget.term(f"{where}.{key}")
                parts.append(_condition(key, op, arg, f"{where}.{key}", budget))
        elif isinstance(value, list):
            raise FilterError(f"{where}.{key}: a list is not a value to compare with (use {{\"$in\": [...]}})")
        else:
            budget.term(f"{where}.{key}")
            parts.append(("field", key, "$eq", _operand(value, f"{where}.{key}")))
    return ("and", parts)


def _condition(key: str, op: Any, arg: Any, where: str, budget: _Budget):
    if op not in OPERATORS:
        raise FilterError(f"{where}: unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
    if op == "$exists":
        if not isinstance(arg, bool):
            raise FilterError(f"{where}.$exists: expected true or false")
        return ("field", key, op, arg)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise FilterError(f"{where}.{op}: expected a list of values")
        if len(arg) > MAX_FILTER_VALUES:
            raise FilterError(f"{where}.{op}: {len(arg)} values, at most {MAX_FILTER_VALUES}")
        budget.add_values(len(arg), f"{where}.{op}")
        return ("field", key, op, [_operand(v, f"{where}.{op}[{i}]") for i, v in enumerate(arg)])
    kind, value = _operand(arg, f"{where}.{op}")
    if op in COMPARISONS and kind == "b":
        raise FilterError(f"{where}.{op}: compare numbers or strings, not booleans")
    return ("field", key, op, (kind, value))


def parse_filter(spec: Any) -> tuple:
    """Check a filter (a dict, or its JSON text); the parsed tree, or FilterError naming the place."""
    if isinstance(spec, (str, bytes)):
        try:
            spec = loads_json(spec, MAX_FILTER_DEPTH * 2 + 2)  # (a level of the filter is an object and a list)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FilterError(f"filter: not valid JSON: {exc}") from None
    return _parse(spec, "filter", 0)


def matches(meta: Mapping[str, Any], spec: Any) -> bool:
    """Plain-Python evaluation of a filter on one passage's metadata (the reference for the SQL)."""
    return _eval(parse_filter(spec) if not isinstance(spec, tuple) else spec, meta)


def _eval(node, meta) -> bool:
    tag = node[0]
    if tag == "and":
        return all(_eval(n, meta) for n in node[1])
    if tag == "or":
        return any(_eval(n, meta) for n in node[1])
    if tag == "not":
        return not _eval(node[1], meta)
    _, key, op, arg = node
    values = _values(meta, key)
    if op == "$exists":
        return (key in meta) == arg
    if op in ("$eq", "$ne"):
        hit = any(_same(v, arg[1]) for v in values)
        return hit if op == "$eq" else not hit
    if op in ("$in", "$nin"):
        hit = any(_same(v, a[1]) for v in values for a in arg)
        return hit if op == "$in" else not hit
    kind, bound = arg
    compare = {"$gt": lambda a: a > bound, "$gte": lambda a: a >= bound,
               "$lt": lambda a: a < bound, "$lte": lambda a: a <= bound}[op]
    return any(_kind(v) == kind and compare(float(v) if kind == "n" else v) for v in values)


def compile_filter(spec: Any) -> Tuple[str, List[Any]]:
    """A filter → (SQL boolean expression over ``p.pos``, its parameters). Keys and values are
    only ever parameters."""
    params: List[Any] = []
    sql = _sql(parse_filter(spec) if not isinstance(spec, tuple) else spec, params)
    return sql, params


def _sql(node, params: List[Any]) -> str:
    tag = node[0]
    if tag in ("and", "or"):
        if not node[1]:
            return "1" if tag == "and" else "0"
        return "(" + f" {tag.upper()} ".join(_sql(n, params) for n in node[1]) + ")"
    if tag == "not":
        return f"NOT {_sql(node[1], params)}"
    _, key, op, arg = node
    sub = "p.pos IN (SELECT pos FROM fields WHERE key = ?"
    if op == "$exists":
        params.append(key)
        return f"({sub}))" if arg else f"(NOT {sub}))"
    if op in ("$in", "$nin"):
        if not arg:
            return "0" if op == "$in" else "1"
        by_kind: Dict[str, List[Any]] = {}
        for kind, value in arg:
            by_kind.setdefault(kind, []).append(value)
        ors = []
        params.append(key)
        for kind, values in by_kind.items():
            ors.append(f"(t = ? AND v IN ({', '.join('?' * len(values))}))")
            params.extend([kind, *(_stored(kind, v) for v in values)])
        expr = f"({sub} AND ({' OR '.join(ors)})))"
        return expr if op == "$in" else f"(NOT {expr})"
    kind, value = arg
    sign = "=" if op in ("$eq", "$ne") else COMPARISONS[op]
    params.extend([key, kind, _stored(kind, value)])
    expr = f"({sub} AND t = ? AND v {sign} ?))"
    return f"(NOT {expr})" if op == "$ne" else expr


def is_empty(spec: Any) -> bool:
    """Whether a filter restricts nothing (``None`` or ``{}``)."""
    return spec is None or (isinstance(spec, Mapping) and not spec)


# -- the SQLite file -----------------------------------------------------------------------

def _field_rows(pos: int, meta: Mapping[str, Any]) -> Iterable[tuple]:
    for key, value in meta.items():
        if isinstance(value, list) and not value:
            yield pos, key, "e", None
        for v in (value if isinstance(value, list) else [value]):
            kind = _kind(v)
            yield pos, key, kind, _stored(kind, v)


def _row_crc(row: tuple) -> int:
    return zlib.crc32(repr(row).encode())


def _check_row(row: tuple, crcs: Optional[np.ndarray]) -> None:
    """RowDamaged unless a passage row ``(pos, id, meta)`` matches the CRC recorded for its position (rows past
    the recorded ones, or an unverified file's, pass)."""
    if crcs is not None and row[0] < len(crcs) and _row_crc(row) != int(crcs[row[0]]):
        raise RowDamaged(f"the row of position {row[0]} was changed")


def _crc_sum(rows: Iterable[tuple]) -> int:
    return sum(map(zlib.crc32, map(str.encode, map(repr, rows)))) & _MASK


def _digest(passages: int, fields: int, field_rows: int) -> dict:
    return {"passages": f"crc32sum:{passages:016x}", "fields": f"crc32sum:{fields:016x}", "field_rows": field_rows}


def add_digests(a: Optional[Mapping[str, Any]], b: Mapping[str, Any]) -> dict:
    """The digest of two sets of rows together (``a`` None: ``b``)."""
    if a is None:
        return dict(b)
    value = lambda d, k: int(str(d[k]).split(":", 1)[1], 16)  # noqa: E731
    return _digest((value(a, "passages") + value(b, "passages")) & _MASK,
                   (value(a, "fields") + value(b, "fields")) & _MASK, int(a["field_rows"]) + int(b["field_rows"]))


_KIND_CODES = {"n": 0, "s": 1, "b": 2, "e": 3}
_COMPARE = {"$gt": np.greater, "$gte": np.greater_equal, "$lt": np.less, "$lte": np.less_equal}


class FieldColumns:
    """The field rows of a set of passages' metadata as arrays, one set per key: a filter evaluated on them in
    numpy (:meth:`mask`) — :func:`matches`'s answer for every position at once, without SQLite.

    A verified reader builds them once per generation from passage rows checked against their checksums
    (:meth:`MetadataDB.checked_positions`), so a filter is answered from a checked copy: an edited ``fields``
    row, which no row check sees, is never read (issue 62). Memory: ~13 bytes a field value (and the strings)."""

    def __init__(self, metas: Iterable[Tuple[int, Mapping[str, Any]]], num_positions: int):
        self.num_positions = int(num_positions)
        rows: Dict[str, Tuple[list, list, list, list]] = {}
        for pos, meta in metas:
            for _, key, kind, value in _field_rows(pos, meta):
                pos_, kinds, nums, texts = rows.setdefault(key, ([], [], [], []))
                pos_.append(pos)
                kinds.append(_KIND_CODES[kind])
                nums.append(float(value) if kind in ("n", "b") else math.nan)
                texts.append(value if kind == "s" else None)
        self.columns = {key: (np.asarray(p, dtype=np.int64), np.asarray(k, dtype=np.uint8),
                              np.asarray(n, dtype=np.float64), np.asarray(t, dtype=object))
                        for key, (p, k, n, t) in rows.items()}
        self._empty = (np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros(0, np.float64), np.zeros(0, object))

    def mask(self, spec: Any) -> np.ndarray:
        """Whether each position's metadata match the filter (a filter or its parsed tree)."""
        return self._eval(parse_filter(spec) if not isinstance(spec, tuple) else spec)

    def _positions(self, pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
        out = np.zeros(self.num_positions, dtype=bool)
        out[pos[rows]] = True
        return out

    def _equal(self, column, kind: str, value: Any) -> np.ndarray:
        _, kinds, nums, texts = column
        rows = kinds == _KIND_CODES[kind]
        if kind == "s":
            rows[rows] = np.asarray(texts[rows] == value, dtype=bool)
        else:  # (numbers compare as floats, booleans as 0/1 — as _same and the SQL do)
            rows &= nums == float(_stored(kind, value))
        return rows

    def _eval(self, node) -> np.ndarray:
        tag = node[0]
        if tag in ("and", "or"):
            out = np.full(self.num_positions, tag == "and")
            for child in node[1]:
                (np.logical_and if tag == "and" else np.logical_or)(out, self._eval(child), out=out)
            return out
        if tag == "not":
            return ~self._eval(node[1])
        _, key, op, arg = node
        column = self.columns.get(key, self._empty)
        pos, kinds, nums, texts = column
        if op == "$exists":
            has = self._positions(pos, np.ones(len(pos), dtype=bool))
            return has if arg else ~has
        if op in ("$eq", "$ne", "$in", "$nin"):
            rows = np.zeros(len(pos), dtype=bool)
            for kind, value in ([arg] if op in ("$eq", "$ne") else arg):
                rows |= self._equal(column, kind, value)
            hit = self._positions(pos, rows)
            return hit if op in ("$eq", "$in") else ~hit
        kind, bound = arg
        rows = kinds == _KIND_CODES[kind]
        if kind == "s":
            rows[rows] = np.asarray(_COMPARE[op](texts[rows], bound), dtype=bool)
        else:
            rows[rows] = _COMPARE[op](nums[rows], float(bound))
        return self._positions(pos, rows)


class RowDamaged(sqlite3.DatabaseError):
    """A passage row read does not match the checksum it had when the file was verified."""


class MetadataDB:
    """One store folder's ``meta.sqlite``: read-only for readers (``writable=False``), or a writer's."""

    def __init__(self, path: str | Path, writable: bool = False, create: bool = False):
        self.path = Path(path)
        #: CRC-32 of each passage row (by position) as verified against the manifest's digest: every row a
        #: reader returns is checked against it (None: the file was not verified at open)
        self.row_crcs: Optional[np.ndarray] = None
        self._columns: Optional[Tuple[np.ndarray, FieldColumns]] = None  # (checked_columns': for row_crcs)
        self._connect(writable, create)
        self._lock = threading.Lock()  # one connection shared by a server's threads

    def _connect(self, writable: bool = False, create: bool = False) -> None:
        self.writable, self.immutable = writable, False
        if writable:
            self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            with writing(self.path):
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=FULL")
                if create:
                    self.conn.executescript(_SCHEMA)
        else:
            if not self.path.exists():
                raise FileNotFoundError(str(self.path))
            self.conn = self._reader()
        self.conn.execute("PRAGMA busy_timeout=10000")

    def _reader(self) -> sqlite3.Connection:
        """A read-only connection. A WAL-mode file is read through its ``-shm`` index, which a reader must create
        when no writer left one: impossible on a read-only mount or a full disk (issue 62). Where that fails
        and no ``-wal`` holds anything, every committed row is in the file itself, and it is opened
        ``immutable`` (no ``-shm``, no locks); the generation's rows never change while it is open, and a
        writer's change to the file is still seen by its ``stat`` (:meth:`Store.check_unchanged`)."""
        uri = self.path.resolve().as_uri()
        conn = sqlite3.connect(uri + "?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            wal = self.path.with_name(self.path.name + "-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise sqlite3.OperationalError(
                    f"{exc} (its write-ahead log {wal.name} holds commits and its index cannot be created here: "
                    "a read-only or full file system)") from None
        conn = sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, check_same_thread=False, isolation_level=None)
        self.immutable = True
        return conn

    def close(self) -> None:
        self.conn.close()

    def reopen(self) -> None:
        """A fresh read connection: an open one keeps pages it has read in its cache, so bytes put back
        in the file would not be seen through it (issue 62)."""
        if self.writable:
            raise ValueError("reopen is for read connections")
        if not self.path.exists():
            raise FileNotFoundError(str(self.path))
        fresh = self._reader()  # (the open one stays in use until this one exists: a failure leaves it as it was)
        fresh.execute("PRAGMA busy_timeout=10000")
        with self._lock:
            old, self.conn = self.conn, fresh
        old.close()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list:
        with self._lock:
            return self.conn.execute(sql, params).fetchall()

    # writes (the caller holds the index's writer lock)
    def insert(self, rows: Iterable[Tuple[int, str, Optional[Mapping[str, Any]]]]) -> dict:
        """Add rows; the digest of what was added (:func:`add_digests` it to the manifest's)."""
        rows = [(int(pos), pid, meta) for pos, pid, meta in rows]
        passages = [(pos, pid, json.dumps(meta, ensure_ascii=False) if meta else None) for pos, pid, meta in rows]
        fields = [r for pos, _, meta in rows if meta for r in _field_rows(pos, meta)]
        with self._lock, writing(self.path):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self.conn.executemany("INSERT INTO passages(pos, id, meta) VALUES (?, ?, ?)", passages)
                self.conn.executemany("INSERT INTO fields(pos, key, t, v) VALUES (?, ?, ?, ?)", fields)
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # (SQLite may have rolled back itself: a full disk does)
                    self.conn.execute("ROLLBACK")
                raise
        return _digest(_crc_sum(passages), _crc_sum(fields), len(fields))

    # integrity: the file changes in place (SQLite pages), so it has no CRC in the manifest; the rows of
    # committed positions never change (appends only), so a digest of them is the same at every open
    def digest(self, num_positions: int) -> dict:
        return self._digest_rows(num_positions)[0]

    def _digest_rows(self, num_positions: int) -> Tuple[dict, np.ndarray]:
        """The digest of the committed rows as the searches read them: ``passages`` by position (ids
        and metadata), its id index (id → position), the field values through ``fields_kv`` (the
        filters' index) and in their table. A sum of the rows' CRC-32s: additive, so a commit adds
        its rows' digest. A change of up to 4 bytes in one row changes it for certain (CRC-32 catches
        every burst of up to 32 bits); other damage goes unseen with odds of about 2⁻³²."""
        with self._lock:
            rows = self.conn.execute("SELECT pos, id, meta FROM passages WHERE pos < ?", (num_positions,)).fetchall()
            by_id = self.conn.execute("SELECT pos, id FROM passages INDEXED BY passages_id WHERE pos < ?",
                                      (num_positions,)).fetchall()
            fields = self.conn.execute("SELECT pos, key, t, v FROM fields INDEXED BY fields_kv WHERE pos < ?",
                                       (num_positions,)).fetchall()
            table = self.conn.execute("SELECT pos, key, t, v FROM fields NOT INDEXED WHERE pos < ?",
                                      (num_positions,)).fetchall()
        if len(rows) != num_positions:
            raise sqlite3.DatabaseError(f"{len(rows)} passage rows for {num_positions} passages")
        if len(by_id) != len(rows) or _crc_sum(by_id) != _crc_sum((pos, pid) for pos, pid, _ in rows):
            raise sqlite3.DatabaseError("its id index disagrees with its passage rows")
        summed = _crc_sum(fields)
        if len(table) != len(fields) or _crc_sum(table) != summed:
            raise sqlite3.DatabaseError("its filter index disagrees with its field rows")
        crcs = np.zeros(num_positions, dtype=np.uint32)
        for row in rows:
            crcs[row[0]] = _row_crc(row)
        return _digest(_crc_sum(rows), summed, len(fields)), crcs

    def verify(self, manifest: Mapping[str, Any], index: Any, verify: bool | str = "auto") -> None:
        """Refuse (naming the file) metadata whose committed rows differ from the manifest's digest;
        also SQLite's ``quick_check``. ``"auto"`` checks files of up to :data:`META_VERIFY_ROWS` rows;
        an index written before digests has none to check."""
        recorded = manifest.get(DIGEST_FIELD)
        if recorded is None or verify is False:
            return
        if verify == "auto" and int(manifest["num_passages"]) + int(recorded["field_rows"]) > META_VERIFY_ROWS:
            return
        try:
            with self._lock:
                quick = self.conn.execute("PRAGMA quick_check").fetchall()
            if quick != [("ok",)]:
                raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in quick[:3]))
            actual, crcs = self._digest_rows(int(manifest["num_passages"]))
        except sqlite3.Error as exc:
            raise IndexFolderError(f"index {index} is damaged: {self.path.name}: {exc}") from None
        except IndexError:  # a position outside the committed ones
            raise IndexFolderError(f"index {index} is damaged: {self.path.name}: a passage row has a position "
                                   "beyond the committed ones") from None
        if actual != dict(recorded):
            raise IndexFolderError(f"index {index} is damaged: {self.path.name} does not match its digest "
                                   "(a stored id, metadata value or filter row was changed)")
        self.row_crcs = crcs  # (committed rows never change: every verified open gives the same table)

    def data_version(self) -> int:
        """SQLite's ``data_version``: changes when another connection commits to the file (one call, no I/O
        beyond the WAL index) — how a reader notices the file was written since it last looked."""
        return self._query("PRAGMA data_version")[0][0]

    def truncate(self, num_positions: int) -> int:
        """Drop rows of positions ≥ ``num_positions`` (a killed writer's uncommitted rows); how many."""
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            n = self.conn.execute("DELETE FROM passages WHERE pos >= ?", (num_positions,)).rowcount
            self.conn.execute("DELETE FROM fields WHERE pos >= ?", (num_positions,))
            self.conn.execute("COMMIT")
        return n

    def count(self) -> int:
        return self._query("SELECT COUNT(*) FROM passages")[0][0]

    def check(self) -> None:
        """SQLite's own integrity check (``verify_crc`` runs it: the file changes in place, so it has no CRC)."""
        result = self._query("PRAGMA integrity_check")
        if result != [("ok",)]:
            raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in result[:3]))

    # reads
    def positions(self, spec: Any, num_positions: int) -> np.ndarray:
        """Sorted positions below ``num_positions`` whose metadata match the filter."""
        sql, params = compile_filter(spec)
        rows = self._query(f"SELECT p.pos FROM passages p WHERE p.pos < ? AND {sql} ORDER BY p.pos",
                           [num_positions, *params])
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def checked_positions(self, spec: Any, num_positions: int) -> np.ndarray:
        """:meth:`positions`, answered from checked rows when the file was verified (:attr:`row_crcs`): SQLite
        answers from the ``fields`` rows, which no read returns and so no row check sees; an edit there would let
        a passage through a filter it fails, or keep one out (issue 62). Instead the passage rows are read once,
        each checked against its checksum (:class:`RowDamaged` otherwise), into :class:`FieldColumns`, and every
        filter is evaluated on those in numpy. Cost: one pass over the rows per generation (at its first filter),
        then ~1 ms a fresh filter for 33,591 passages — measured in ``benchmarks.read_verification``."""
        if self.row_crcs is None:
            return self.positions(spec, num_positions)
        return np.flatnonzero(self.checked_columns(num_positions).mask(spec))

    def checked_columns(self, num_positions: int) -> FieldColumns:
        """The field values of positions below ``num_positions`` from their checked passage rows (built once)."""
        crcs = self.row_crcs
        built = self._columns
        if built is not None and built[0] is crcs and built[1].num_positions == num_positions:
            return built[1]
        rows = self._query("SELECT pos, id, meta FROM passages WHERE pos < ? ORDER BY pos", (num_positions,))
        if len(crcs) >= num_positions and len(rows) != num_positions:
            raise RowDamaged(f"{len(rows)} passage rows for {num_positions} passages")
        for row in rows:
            _check_row(row, crcs)
        columns = FieldColumns(((row[0], json.loads(row[2])) for row in rows if row[2]), num_positions)
        self._columns = (crcs, columns)  # (one assignment: a server's threads see the old pair or the new)
        return columns

    def positions_of(self, ids: Sequence[str], num_positions: int) -> Dict[str, List[int]]:
        """Every stored position (below ``num_positions``) of each id, ascending."""
        out: Dict[str, List[int]] = {}
        ids = list(ids)
        for lo in range(0, len(ids), 500):
            part = ids[lo:lo + 500]
            for pos, pid in self._query(f"SELECT pos, id FROM passages WHERE pos < ? AND id IN "
                                        f"({', '.join('?' * len(part))}) ORDER BY pos", [num_positions, *part]):
                out.setdefault(pid, []).append(pos)
        return out

    def metadata(self, pos: int) -> Dict[str, Any]:
        """The metadata of position ``pos``, its row checked against :attr:`row_crcs` when the file was verified
        (:class:`RowDamaged` otherwise)."""
        return self.checked_rows([pos]).get(int(pos), (None, {}))[1]

    def checked_rows(self, positions: Sequence[int]) -> Dict[int, Tuple[str, Dict[str, Any]]]:
        """:meth:`metadata` of many positions in one query: ``{pos: (id, metadata)}``, each row checked
        as :meth:`metadata` checks it (a search's hits: one query instead of one a hit)."""
        crcs = self.row_crcs
        out: Dict[int, Tuple[str, Dict[str, Any]]] = {}
        positions = sorted({int(p) for p in positions})
        for lo in range(0, len(positions), 500):
            part = positions[lo:lo + 500]
            for row in self._query(f"SELECT pos, id, meta FROM passages WHERE pos IN ({', '.join('?' * len(part))})",
                                   part):
                _check_row(row, crcs)
                out[row[0]] = (row[1], json.loads(row[2]) if row[2] else {})
        missing = [p for p in positions if p not in out and crcs is not None and p < len(crcs)]
        if missing:
            raise RowDamaged(f"the row of position {missing[0]} is missing")
        return out

    def checked_metadata_of_ids(self, ids: Sequence[str], num_positions: int,
                                alive: Optional[np.ndarray]) -> Dict[str, Dict[str, Any]]:
        """``{id: metadata}`` of the newest live position (below ``num_positions``; ``alive``: None when all are) of
        each of ``ids`` that has one, in one query (a search's hits: :meth:`positions_of` then
        :meth:`checked_rows` in one), its row checked as :meth:`metadata` checks it."""
        crcs = self.row_crcs
        newest: Dict[str, tuple] = {}
        ids = list(ids)
        for lo in range(0, len(ids), 500):
            part = ids[lo:lo + 500]
            for row in self._query(f"SELECT pos, id, meta FROM passages WHERE pos < ? AND id IN "
                                   f"({', '.join('?' * len(part))}) ORDER BY pos", [num_positions, *part]):
                if alive is None or alive[row[0]]:
                    newest[row[1]] = row  # in position order: an upsert's newest copy is the live one
        for row in newest.values():
            _check_row(row, crcs)
        return {pid: json.loads(row[2]) if row[2] else {} for pid, row in newest.items()}

    def rows(self, positions: Sequence[int]) -> List[Tuple[int, str, Optional[dict]]]:
        """``(pos, id, metadata)`` of the given positions, in that order."""
        found = {}
        positions = [int(p) for p in positions]
        for lo in range(0, len(positions), 500):
            part = positions[lo:lo + 500]
            for pos, pid, meta in self._query(f"SELECT pos, id, meta FROM passages WHERE pos IN "
                                              f"({', '.join('?' * len(part))})", part):
                found[pos] = (pos, pid, json.loads(meta) if meta else None)
        return [found[p] for p in positions]


__all__ = ["DIGEST_FIELD", "FieldColumns", "FilterError", "MetadataDB", "RowDamaged", "add_digests", "valid_digest", "MetadataError", "compile_filter", "is_empty",
           "matches", "parse_filter",
           "validate_metadata", "METADATA_FILE"]

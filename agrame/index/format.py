"""Index folders: the manifest, file integrity, and which model an index belongs to.

Format ``agrame-index/2`` (compressed; :mod:`agrame.index.store`) and ``agrame-index/1``
(float16 vectors; :mod:`agrame.index.v1`) share the manifest's ``model`` block. A version-2
manifest also lists every data file with its committed size and CRC-32: files are
append-only, so a size *larger* than committed is an interrupted append (ignored, and cut
off by the next writer), a smaller one is a truncated file, and a CRC mismatch a damaged one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sqlite3
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, NamedTuple, Optional, Union

MANIFEST = "manifest.json"
FORMAT_V1 = "agrame-index/1"
FORMAT_V2 = "agrame-index/2"
FORMATS = (FORMAT_V1, FORMAT_V2)
#: Files up to this size are checksummed whenever an index is opened; larger ones by
#: ``verify=True`` (CRC-32 reads ~1 GB/s: a 100M-token store would add seconds to every open).
VERIFY_LIMIT = 1 << 30
_CRC_BLOCK = 1 << 24


class IndexFolderError(ValueError):
    """An index folder is missing, malformed, damaged, or belongs to another model."""


class IndexDamagedError(IndexFolderError):
    """A committed file of an open index no longer holds what its manifest committed (``file``:
    its name inside the index folder, ``problem``: what is wrong) — found by a running reader's
    :meth:`~agrame.index.store.Store.check_unchanged`."""

    def __init__(self, path, file: str, problem: str):
        super().__init__(f"index {path} is damaged: {file} {problem}")
        self.file, self.problem = file, problem


class ReadOnlyIndexError(IndexFolderError):
    """A write to an index on a read-only file system (a container's read-only volume): it can be searched and
    served, not written. ``mount``: the mount point the index lies under."""

    def __init__(self, path, mount: str):
        super().__init__(f"index {path} is on a read-only file system (mounted at {mount}): it can be searched "
                         "and served, not written")
        self.mount = mount


def mount_point(path: Union[str, Path]) -> str:
    """The mount point ``path`` lies under (the highest folder on the same device)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    device = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == device:
        path = path.parent
    return str(path)


#: A full disk, a quota, a file size limit (``ulimit -f``): out of room, whatever the device says.
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class NoSpaceError(IndexFolderError):
    """A write ran out of room writing ``file``; what was being written was not committed."""

    def __init__(self, message: str, file: str = "", reason: str = ""):
        super().__init__(message)
        self.file, self.reason = file, reason


def no_space(exc: BaseException) -> Optional[str]:
    """Why ``exc`` means the device (or a limit) had no room for a write, or None."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return exc.strerror or str(exc)
    # SQLite reports a short write as SQLITE_IOERR ("disk I/O error") or SQLITE_FULL
    if isinstance(exc, sqlite3.OperationalError) and ("disk I/O error" in str(exc) or "disk is full" in str(exc)):
        return f"SQLite: {exc}"
    return None


@contextmanager
def writing(file: Union[str, Path]):
    """Turn running out of room while writing ``file`` into :class:`NoSpaceError` naming it."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        reason = no_space(exc)
        if reason is None:
            raise
        name = Path(file).name
        raise NoSpaceError(f"no space left writing {name} ({reason})", name, reason) from None


def read_manifest(path: str | Path) -> dict:
    """The manifest of an index folder of either format (errors name the folder or file)."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            aside = aside_folders(path)
            hint = (f"; an interrupted --overwrite left an index aside as {aside[0]}: the next write to {path} "
                    "puts it back, or rename it yourself") if aside else ""
            raise IndexFolderError(f"index {path} does not exist{hint}")
        raise IndexFolderError(f"index {path} is not a folder")
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        raise IndexFolderError(f"{path} is not an AGRaME index (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFolderError(f"{manifest_file}: not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        raise IndexFolderError(f"{manifest_file}: expected \"format\": one of {', '.join(FORMATS)}")
    if "checksum" in manifest and manifest["checksum"] != manifest_checksum(manifest):
        raise IndexFolderError(f"index {path} is damaged: {MANIFEST} does not match its checksum")
    validate_manifest(path, manifest)
    return manifest


def manifest_checksum(manifest: dict) -> str:
    """CRC-32 of the manifest's canonical JSON (its own ``checksum`` field left out)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"crc32:{zlib.crc32(text.encode('ascii')):08x}"


def _is_int(value, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


#: Every top-level manifest field any version wrote; another name is a damaged (e.g. bit-flipped) key.
MANIFEST_FIELDS = {"format", "generation", "agrame_version", "created", "updated", "model", "dim", "nbits",
                   "num_centroids", "code_dtype", "codec", "num_passages", "num_tokens", "num_sentences", "has_spans",
                   "token_offsets", "files", "search", "ivf_generation", "tombstones", "num_deleted", "metadata",
                   "store", "checksum", "vectors_dtype", "metadata_digest", "pool_factor", "num_original_tokens",
                   "pq_subvectors", "ivf_pids", "pq_rotation", "rq_codebooks"}
#: The manifest fields beside ``nbits`` that name a residual codec (a sharded index's summary repeats them).
CODEC_FIELDS = ("pq_subvectors", "pq_rotation", "rq_codebooks")


CODE_SIZES = {"<u2": 2, "<i4": 4}  # bytes of a centroid code by its dtype
#: How an inverted file stores its lists' passages (manifest field ``"ivf_pids"``, absent: the first;
#: :mod:`.ivf`): int32, varint gaps since 2026-11-29, or not at all (``"derived"`` from the codes when the
#: index opens: no ``ivf-G`` files) since 2026-12-01.
IVF_PIDS = ("int32", "varint", "derived")


def residuals_of(manifest: dict) -> Optional[str]:
    """A compressed index's residual codec by name (``"2bit"``, ``"pq16x6"``; :func:`~.codec.parse_residuals`)."""
    if manifest.get("nbits") is None:
        return None
    if "pq_subvectors" in manifest:
        return f"{'opq' if manifest.get('pq_rotation') else 'pq'}{manifest['pq_subvectors']}x{manifest['nbits']}"
    if "rq_codebooks" in manifest:
        return f"rq{manifest['rq_codebooks']}x{manifest['nbits']}"
    return f"{manifest['nbits']}bit"


def validate_manifest(path: Path, m: dict) -> None:
    """Types, ranges and consistency of a manifest's fields with each other and with the committed
    file sizes it records; the first violation is ``index X is damaged: manifest field …``."""
    def bad(field: str, problem: str):
        raise IndexFolderError(f"index {path} is damaged: {MANIFEST} field '{field}' {problem}")

    unknown = sorted(set(m) - MANIFEST_FIELDS)
    if unknown:
        bad(unknown[0][:40], "is not a manifest field")
    if m.get("search") is not None:
        if not isinstance(m["search"], dict) or set(m["search"]) - set(SearchSettings._fields) \
                or not all(_is_int(v, 1) for v in m["search"].values()):
            bad("search", f"must map {', '.join(SearchSettings._fields)} to positive integers")

    for field in ("num_passages", "num_tokens", "num_sentences", "dim"):
        if not _is_int(m.get(field), 1 if field == "dim" else 0):
            bad(field, f"must be a {'positive' if field == 'dim' else 'non-negative'} integer, "
                       f"got {json.dumps(m.get(field))[:40]}")
    model = m.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("fingerprint"), str) \
            or not isinstance(model.get("settings", {}), dict):
        bad("model", "must be an object with a 'fingerprint' string and 'settings'")
    if m["format"] == FORMAT_V2:
        _check_v2_fields(m, bad)
        _check_v2_files(m, bad)


def _check_v2_fields(m: dict, bad) -> None:
    """A format-2 manifest's own fields (generations, codec, layout, pooling, metadata)."""
    if not _is_int(m.get("generation"), 1):
        bad("generation", "must be a positive integer")
    if not _is_int(m.get("ivf_generation", m["generation"]), 1, m["generation"]):
        bad("ivf_generation", "must be a positive integer no larger than 'generation'")
    if m.get("ivf_pids", IVF_PIDS[0]) not in IVF_PIDS:
        bad("ivf_pids", f"must be one of {', '.join(IVF_PIDS)}")
    if m.get("pq_rotation", True) is not True or ("pq_rotation" in m and "pq_subvectors" not in m):
        bad("pq_rotation", "must be true, and only beside 'pq_subvectors'")
    if "pq_subvectors" in m and "rq_codebooks" in m:
        bad("rq_codebooks", "cannot stand beside 'pq_subvectors' (one residual codec)")
    if "rq_codebooks" in m:
        if m.get("nbits") not in (4, 6, 7, 8):
            bad("nbits", "must be 4, 6, 7 or 8 (bits a residual-quantizer code)")
        if not _is_int(m["rq_codebooks"], 1, 1 << 16) or m["rq_codebooks"] % (8 // math.gcd(m["nbits"], 8)):
            bad("rq_codebooks", "must be a positive integer whose codes fill whole bytes")
    elif "pq_subvectors" in m:
        if m.get("nbits") not in (4, 6, 7, 8):
            bad("nbits", "must be 4, 6, 7 or 8 (bits a product-quantizer code)")
        sub = m["pq_subvectors"]
        # (a group of 8 / gcd(nbits, 8) codes fills whole bytes: 2 at 4 bits, 4 at 6, 8 at 7)
        if not _is_int(sub, 1, 1 << 16) or not _is_int(m.get("dim"), 1) or m["dim"] % sub \
                or sub % (8 // math.gcd(m["nbits"], 8)):
            bad("pq_subvectors", "must be a positive integer dividing dim whose codes fill whole bytes")
    elif m.get("nbits") not in (1, 2, 4, 8):
        bad("nbits", "must be 1, 2, 4 or 8")
    if not _is_int(m.get("num_centroids"), 1, 1 << 31):
        bad("num_centroids", "must be a positive integer")
    if m.get("code_dtype") not in CODE_SIZES or (m["code_dtype"] == "<u2" and m["num_centroids"] > 1 << 16):
        bad("code_dtype", "must be '<u2' (up to 65,536 centroids) or '<i4'")
    if "store" in m and not (isinstance(m["store"], str) and re.fullmatch(r"s\d+/", m["store"])):
        bad("store", "must be a store folder name like 's1/'")
    if m.get("token_offsets", "stored") not in ("stored", "tokenizer"):
        bad("token_offsets", "must be 'stored' or 'tokenizer'")
    if "pool_factor" in m:
        factor = m["pool_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 < factor <= 16:
            bad("pool_factor", "must be a number above 1 and at most 16 (an unpooled index has none)")
        if not _is_int(m.get("num_original_tokens"), m["num_tokens"]):
            bad("num_original_tokens", "must be an integer no smaller than num_tokens")
    elif "num_original_tokens" in m:
        bad("num_original_tokens", "is only written with a pool_factor")
    if "metadata" in m and m["metadata"] != "meta.sqlite":
        bad("metadata", "must be 'meta.sqlite'")
    if "metadata_digest" in m:
        if "metadata" not in m or not valid_digest(m["metadata_digest"]):
            bad("metadata_digest", "must be the digest object of the metadata file it names")


def _check_v2_files(m: dict, bad) -> None:
    """A format-2 manifest's files: each named with a size and a CRC, the sizes its counts make, tombstones."""
    files = m.get("files")
    if not isinstance(files, dict):
        bad("files", "must be an object")
    for name, info in files.items():
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not isinstance(info, dict) \
                or not _is_int(info.get("size")) or not _is_int(info.get("crc32"), 0, 0xFFFFFFFF):
            bad("files", f"entry {json.dumps(name)[:60]} must name a file in the folder with a size and a crc32")
    N, T, S, K, d = m["num_passages"], m["num_tokens"], m["num_sentences"], m["num_centroids"], m["dim"]
    g = m.get("ivf_generation", m["generation"])
    pq, rq = "pq_subvectors" in m, "rq_codebooks" in m
    per_token = (m["pq_subvectors"] if pq else m["rq_codebooks"] if rq else d) * m["nbits"]
    if per_token % 8:
        bad("dim", f"× nbits must be a whole number of bytes ({d} × {m['nbits']})")
    expected = {"centroids.f16": K * d * 2,
                **({"pq.f32": (1 << m["nbits"]) * d * 4} if pq else
                   {"rq.f32": m["rq_codebooks"] * (1 << m["nbits"]) * d * 4} if rq else
                   {"buckets.f32": ((2 << m["nbits"]) - 1) * 4}),
                **({"opq.f32": d * d * 4} if m.get("pq_rotation") else {}),
                "codes.bin": T * CODE_SIZES[m["code_dtype"]], "residuals.bin": T * per_token // 8,
                "doclens.bin": N * 4, "sentcounts.bin": N * 4, "sentences.bin": S * 8, "passage_offsets.bin": N * 8,
                **({} if m.get("ivf_pids") == "derived" else {f"ivf-{g}.offsets.bin": (K + 1) * 8, f"ivf-{g}.pids.bin": None}),
                "passages.jsonl": None,
                ("tokens.bin" if m.get("token_offsets", "stored") == "stored" else "sentence_tokens.bin"):
                    m.get("num_original_tokens", T) * 6 if m.get("token_offsets", "stored") == "stored" else S * 8,
                **({"pool.bin": m["num_original_tokens"], "origlens.bin": N * 4} if "pool_factor" in m else {})}
    for name, size in expected.items():
        if name not in files:
            bad("files", f"lacks {name}")
        if size is not None and files[name]["size"] != size:
            bad("files", f"records {files[name]['size']} bytes for {name}, but the counts make it {size}")
    tombstones = m.get("tombstones")
    dead = m.get("num_deleted", 0)
    if not _is_int(dead, 0, N):
        bad("num_deleted", "must be an integer between 0 and num_passages")
    if tombstones is not None:
        if tombstones not in files or files[tombstones]["size"] != dead * 4:
            bad("tombstones", "must name a file of num_deleted × 4 bytes in 'files'")
    elif dead:
        bad("num_deleted", "is not 0 but no tombstones file is named")


class SearchSettings(NamedTuple):
    """Candidate-generation settings, chosen with the default model (zero-shot MiniLM, 384-d) on 100 SQuAD
    *train* questions over the pooled corpus, 2-bit index (``python -m benchmarks.index_search choose --model
    zero-shot``; grid in benchmarks/README.md): the cheapest sentence search (top 10) whose top sentence
    equals the exhaustive compressed scan's on ≥ 99% of questions (nprobe 8, ncandidates 128), and the
    cheapest passage search (top 100) with ≥ 97% top-100 overlap with it (nprobe 8, 512 = 5 per hit;
    ``squad-a1``, the default before, needed 10 per hit)."""

    nprobe: int = 8
    ncandidates: int = 128
    #: A passage search scores at least ``per_hit × top_k`` passages exactly (PLAID's ndocs grows with k too).
    per_hit: int = 5


def valid_digest(d: Any) -> bool:
    return (isinstance(d, dict) and set(d) == {"passages", "fields", "field_rows"}
            and all(isinstance(d[k], str) and len(d[k]) == 25 and d[k].startswith("crc32sum:")
                    and all(c in "0123456789abcdef" for c in d[k][9:]) for k in ("passages", "fields"))
            and isinstance(d["field_rows"], int) and not isinstance(d["field_rows"], bool) and d["field_rows"] >= 0)


# -- sharded indexes' own manifest (shards.json) --------------------------------------------

FORMAT_SHARDED = "agrame-sharded/1"
SHARDS_FILE = "shards.json"
_SHARD_NAME = re.compile(r"shard-\d{3,6}")
MAX_SHARDS = 4096


def is_sharded(path: Union[str, Path]) -> bool:
    return (Path(path) / SHARDS_FILE).is_file()


def read_shards(path: Union[str, Path]) -> dict:
    """The sharded index's own manifest, validated (a damaged one is named, never half-used)."""
    path = Path(path)
    where = path / SHARDS_FILE
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFolderError(f"{path} is not a sharded index (no {SHARDS_FILE})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFolderError(f"sharded index {path} is damaged: {SHARDS_FILE}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_SHARDED:
        raise IndexFolderError(f"sharded index {path} is damaged: {SHARDS_FILE} is not an {FORMAT_SHARDED} manifest")
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise IndexFolderError(f"sharded index {path} is damaged: {SHARDS_FILE} checksum does not match")
    shards, n = manifest.get("shards"), manifest.get("num_shards")
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_SHARDS and isinstance(shards, list)
            and len(shards) == n and all(isinstance(s, str) and _SHARD_NAME.fullmatch(s) for s in shards)
            and len(set(shards)) == n):
        raise IndexFolderError(f"sharded index {path} is damaged: {SHARDS_FILE} field 'shards'/'num_shards'")
    return manifest


#: The data files of a format-1 index (its manifest lists none).
V1_FILES = ("vectors.f16", "offsets.npy", "token_sentence.npy", "passage_starts.npy", "sentences.npy",
            "sentence_passage.npy", "passages.jsonl")


def check_layout(path: str | Path, manifest: dict) -> None:
    """Refuse a folder that is not wholly the index its manifest describes — every file it lists
    present (a regular file, at least its committed size), the store folder and metadata file
    there — before anything in it is recovered, collected or written. A copied ``manifest.json``
    alone makes no index: a user's folder holding one is refused untouched. Sizes only (cheap);
    checksums are the readers' (:func:`check_files`)."""
    path = Path(path)
    if manifest["format"] == FORMAT_V2:
        root = store_root(path, manifest)
        prefix = str(manifest.get("store", ""))
        sizes = {name: info["size"] for name, info in manifest["files"].items()}
        if manifest.get("metadata"):
            sizes[manifest["metadata"]] = 1
    else:
        root, prefix, sizes = path, "", {name: 0 for name in V1_FILES}
    if prefix and not root.is_dir():
        raise IndexFolderError(f"{path} is not a whole AGRaME index: its store folder {prefix} is missing "
                               "(nothing in it was changed)")
    for name, size in sizes.items():
        file = root / name
        if file.is_symlink() or not file.is_file():
            raise IndexFolderError(f"{path} is not a whole AGRaME index: {prefix}{name} is missing"
                                   f"{'' if not file.exists() else ' (not a file)'} (nothing in it was changed)")
        actual = file.stat().st_size
        if actual < size:
            raise IndexFolderError(f"{path} is not a whole AGRaME index: {prefix}{name} has {actual} bytes, the "
                                   f"manifest records {size} (nothing in it was changed)")


def read_index(path: str | Path) -> dict:
    """The manifest of a folder proven to be an index by its whole layout (:func:`check_layout`)."""
    manifest = read_manifest(path)
    check_layout(path, manifest)
    return manifest


def store_root(path: Path, manifest: dict) -> Path:
    """The folder holding a version-2 index's store files: the index folder itself, or the
    sub-folder (``sN/``) that a compaction or an in-place rebuild wrote."""
    prefix = str(manifest.get("store", ""))
    if prefix and not re.fullmatch(r"s\d+/", prefix):
        raise IndexFolderError(f"index {path} is damaged: {MANIFEST} field 'store' is {prefix!r}")
    return Path(path) / prefix if prefix else Path(path)


def ivf_generation(manifest: dict) -> int:
    """Generation whose inverted file a manifest uses (a delete commits without writing one)."""
    return int(manifest.get("ivf_generation", manifest["generation"]))


def replace_file(folder: Path, name: str, data: bytes) -> None:
    """Write ``folder/name`` whole: a temporary name, fsync, one rename (readers see the old file or the
    new one, never a part); a failed write leaves no temporary file."""
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    try:
        with writing(name), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, folder / name)


def write_manifest(folder: Path, manifest: dict) -> None:
    """Commit a manifest with its checksum (:func:`replace_file`), then fsync of the folder so that the
    rename itself is durable."""
    manifest = {k: v for k, v in manifest.items() if k != "checksum"}
    manifest["checksum"] = manifest_checksum(manifest)
    replace_file(folder, MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def aside_folders(path: Path) -> list:
    """Folders ``.NAME.old-PID`` holding an index that an interrupted ``--overwrite`` of an earlier
    version moved aside (newest first)."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    found = [p for p in path.parent.iterdir()
             if p.name.startswith(f".{path.name}.old-") and p.name[len(path.name) + 6:].isdigit()
             and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def crc32_file(path: Path, size: Optional[int] = None, start: int = 0, crc: int = 0) -> int:
    """CRC-32 of bytes ``[start, size)`` of a file, continuing from ``crc``."""
    remaining = (path.stat().st_size if size is None else size) - start
    with open(path, "rb") as f:
        f.seek(start)
        while remaining > 0:
            block = f.read(min(_CRC_BLOCK, remaining))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            remaining -= len(block)
    return crc


def check_files(folder: Path, files: Dict[str, dict], verify: bool | str = "auto") -> None:
    """Refuse a missing, truncated or damaged file, naming it.

    ``verify``: ``"auto"`` checksums files up to :data:`VERIFY_LIMIT`, ``True`` all of them,
    ``False`` none (sizes are always checked).
    """
    for name, info in files.items():
        file = folder / name
        if not file.exists():
            raise IndexFolderError(f"index {folder} is damaged: {name} is missing")
        actual = file.stat().st_size
        if actual < info["size"]:
            raise IndexFolderError(f"index {folder} is damaged: {name} is truncated "
                                   f"({actual} bytes, the manifest records {info['size']})")
        if verify is True or (verify == "auto" and info["size"] <= VERIFY_LIMIT):
            if crc32_file(file, info["size"]) != info["crc32"]:
                raise IndexFolderError(f"index {folder} is damaged: {name} does not match its checksum")


# -- which model an index belongs to ---------------------------------------------------

def model_name(encoder) -> str:
    """What ``load_encoder`` takes to load this encoder again: ``default``, ``zero-shot``, a
    shipped model's name or a path."""
    from ..loading import named_models

    source = str(encoder.source)
    if source.startswith("default:"):
        return "default"
    if source.startswith("zero-shot:"):
        return "zero-shot"
    prefix = source.split(":", 1)[0]
    if ":" in source and prefix == "e5-small":
        return prefix
    if ":" in source and prefix in named_models():
        return prefix
    return source


def current_default_name() -> str:
    """``model_name`` of what ``load_encoder()`` loads now (a shipped model's name)."""
    from ..loading import DEFAULT_MODEL

    return DEFAULT_MODEL


def model_block(encoder) -> dict:
    return {"fingerprint": encoder.fingerprint(), "source": encoder.source, "name": model_name(encoder),
            "settings": encoder.settings.to_json()}


def index_model_name(manifest: dict) -> str:
    """The ``--model`` value that loads an index's model (older manifests lack ``name``)."""
    built = manifest["model"]
    if "name" in built:
        return built["name"]
    source = str(built["source"])
    if source.startswith("default:"):
        return "default"
    if source.startswith("zero-shot:"):
        return "zero-shot"
    return source


def load_index_model(manifest: dict, path: str | Path, model=None, action: str = "search it"):
    """The encoder to search an index with: ``model`` if given (an :class:`Encoder`, or an object with
    its ``fingerprint()``, ``source`` and ``passage_offsets``; checked), else the index's own."""
    from ..encoder import ModelError
    from ..loading import load_encoder, named_model_with_fingerprint

    if model is not None and not isinstance(model, (str, Path)):
        encoder = model
    else:
        name = index_model_name(manifest) if model is None else str(model)
        if model is None and name == "default":
            # Built with an earlier default that now ships under a name (squad-a1): load that.
            name = named_model_with_fingerprint(manifest["model"]["fingerprint"]) or name
        try:
            encoder = load_encoder(None if name == "default" else name)
        except ModelError as exc:
            if model is not None:  # the model asked for is the one missing, not the index's (issue 62)
                raise IndexFolderError(f"--model {name}: cannot be loaded ({exc})") from None
            raise IndexFolderError(f"index {path} was built with model {name!r}, which cannot be loaded "
                                   f"here ({exc}); pass the model folder with --model") from None
    check_model(manifest, encoder, path, action)
    return encoder


def check_model(manifest: dict, encoder, path: str | Path, action: str = "search it") -> None:
    """Refuse an encoder other than the one the index was built with, naming the flag that works for
    ``action`` (what the user was doing: "search it", "add to it")."""
    built = manifest["model"]
    if built["fingerprint"] == encoder.fingerprint():
        return
    name = index_model_name(manifest)
    from ..loading import named_model_with_fingerprint

    alias = named_model_with_fingerprint(built["fingerprint"]) if name == "default" else None
    if alias is not None:
        name = alias
        fix = f"it was built with an earlier default model, shipped now as {alias}: {action} with --model {alias}"
    elif name == "default" and model_name(encoder) == current_default_name():
        fix = "it was built with an earlier default model: rebuild it (agrame index --overwrite)"
    else:
        fix = f"{action} without --model" if name == "default" else f"{action} with --model {name}"
    raise IndexFolderError(
        f"index {path} was built with model {name} (fingerprint {built['fingerprint'][:12]}), "
        f"but the loaded model is {model_name(encoder)} (fingerprint {encoder.fingerprint()[:12]}); {fix}")

"""Changing an ``agrame-index/2`` folder: add, upsert, delete, compact, rebuild — one writer at a
time, every change one new generation committed by one manifest rename.

The SQLite/Lucene habits this follows:

- **Lock**: every writer holds ``DIR/.lock`` (:mod:`.lock`); readers never take it.
- **Write ahead of the commit**: a change appends past the committed sizes of the store files,
  writes new files under new names (``ivf-G.*``, ``deleted-G.bin``, a new store folder ``sN/``)
  and adds metadata rows for positions the old manifest does not count; only the rename of the
  manifest makes any of it visible. A reader keeps the generation it opened (its memory maps keep
  even files a later generation unlinks).
- **Recovery**: a writer's first act under the lock cuts uncommitted bytes and metadata rows and
  removes every file the manifest does not name (temporary files, a killed writer's new files,
  superseded inverted files and tombstones, old store folders), and stale temporary folders of
  dead writers beside the index, and says what it removed.

Deletes are tombstones (``deleted-G.bin``: sorted positions); an upsert is tombstones plus an
append in one generation, so a passage keeps its id and never half-exists. A compaction copies
the live passages' bytes into a new store folder (same codec: a compacted index equals a build
of the live passages with that codec) once the dead share passes ``compact_threshold``.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..corpus import Passage, as_passages
from ..encoder import Encoder
from .format import (FORMAT_V2, MANIFEST, IndexFolderError, check_model, ivf_generation, read_manifest, store_root,
                     write_manifest)
from .ivf import build_ivf, merge_ivf, unique_pairs
from .lock import LOCK_FILE, WriterLock, pid_alive
from .metadata import METADATA_FILE, MetadataDB, validate_metadata
from .store import (APPEND_FILES, SENTENCE_TOKENS_FILE, TOKENS_FILE, Store, _Appender, _ChunkWriter, _codec_files,
                    _encode_chunks, _ivf_files, _ranges, _write_fixed, append_files, offsets_stored, write_store)

log = logging.getLogger("agrame.index")

#: Dead share of the stored passages past which a change compacts the index (``compact_threshold``).
DEFAULT_COMPACT_THRESHOLD = 0.2
#: Passages copied per step of a compaction (bounds its memory).
COMPACT_CHUNK = 2048

_TEMP = re.compile(r"\..+\.tmp-(\d+)")
_EPOCH = re.compile(r"s(\d+)")
_OURS = re.compile(r"(ivf-\d+\.(offsets|pids)\.bin|deleted-\d+\.bin|meta\.sqlite(-wal|-shm|-journal)?|"
                   r"centroids\.f16|buckets\.f32|tokens\.bin|sentence_tokens\.bin|"
                   # format-1 files (an index rebuilt in place as format 2 drops them)
                   r"vectors\.f16|offsets\.npy|token_sentence\.npy|passage_starts\.npy|sentences\.npy|"
                   r"sentence_passage\.npy)")
_STORE_FILES = set(APPEND_FILES)


class UnknownIdsError(IndexFolderError):
    """Ids asked for that the index does not hold."""

    def __init__(self, path: Path, ids: Sequence[str]):
        self.ids = list(ids)
        shown = ", ".join(repr(i) for i in self.ids[:10]) + (f" and {len(self.ids) - 10} more" if len(self.ids) > 10 else "")
        super().__init__(f"index {path} has no passage with id {shown}")


def _ours(name: str) -> bool:
    return bool(_TEMP.fullmatch(name) or _OURS.fullmatch(name) or name in _STORE_FILES)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def collect_garbage(path: Path, manifest: dict) -> List[str]:
    """Remove what a committed version-2 manifest does not name: temporary files, superseded or
    uncommitted store files, other store folders. Only names AGRaME writes are touched."""
    prefix = str(manifest.get("store", ""))
    keep = {prefix + name for name in manifest.get("files", {})}
    if manifest.get("metadata"):
        keep |= {prefix + manifest["metadata"] + suffix for suffix in ("", "-wal", "-shm")}
    removed = []
    for entry in sorted(path.iterdir()):
        name = entry.name
        if name in (MANIFEST, LOCK_FILE):
            continue
        if entry.is_dir() and not entry.is_symlink() and _EPOCH.fullmatch(name):
            if prefix == name + "/":
                for sub in sorted(entry.iterdir()):
                    if f"{name}/{sub.name}" not in keep and _ours(sub.name):
                        _remove(sub)
                        removed.append(f"{name}/{sub.name}")
            else:
                _remove(entry)
                removed.append(name + "/")
        elif name not in keep and _ours(name):
            _remove(entry)
            removed.append(name)
    return removed


def stale_beside(path: Path) -> List[Path]:
    """Temporary folders of dead writers beside ``path`` (``.NAME.tmp-PID``)."""
    out = []
    if path.parent.is_dir():
        for entry in path.parent.glob(f".{glob_escape(path.name)}.tmp-*"):
            match = _TEMP.fullmatch(entry.name)
            if match and not pid_alive(int(match.group(1))):
                out.append(entry)
    return out


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def recover_aside(path: Path, say: Callable[[str], None]) -> None:
    """Put back an index that an interrupted ``--overwrite`` of an earlier version left aside as
    ``.NAME.old-PID`` while nothing is at ``path`` (the newest such folder with a manifest)."""
    if path.exists() or path.is_symlink():
        return
    from .format import aside_folders

    candidates = aside_folders(path)
    if candidates:
        os.rename(candidates[0], path)
        say(f"recovered {path} from {candidates[0].name}, left aside by an interrupted --overwrite")


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is None:
        raise IndexFolderError(f"{b}: cannot replace it atomically on this system; remove it first")
    at_fdcwd, rename_exchange = -100, 2
    if func(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(b))


def _folder_error(path: Path, exc: OSError) -> IndexFolderError:
    reason = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "read-only file system",
              errno.ENOSPC: "no space left on the device", errno.ENOTDIR: "a part of the path is not a folder",
              errno.ENOENT: "its parent folder does not exist",
              errno.EEXIST: "a part of the path is a file, not a folder"}.get(exc.errno, exc.strerror or str(exc))
    return IndexFolderError(f"cannot write index {path}: {reason}")


def build_new_folder(path: Path, overwrite: bool, write: Callable[[Path], Optional[dict]], *,
                     exchange: bool = False, say: Optional[Callable[[str], None]] = None) -> bool:
    """Build an index where none is: ``write(tmp)`` fills a temporary folder beside ``path`` (and
    returns the manifest to commit there, or writes one itself), then one rename puts it in place.

    False, having written nothing, when ``path`` is an index to be replaced in place
    (``overwrite``; the caller rebuilds it under its lock), unless ``exchange`` (format 1, which
    has no generations): then the new folder and the old swap places atomically. A folder that is
    not an index is never replaced; a file is never written through.
    """
    say = say or log.info
    path = Path(path)
    try:
        recover_aside(path, say)
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise IndexFolderError(f"{path} exists and is not a folder")
            empty = not any(path.iterdir())
            sharded = (path / "shards.json").is_file()
            if not empty:
                try:
                    if sharded:
                        from .sharded import read_shards
                        read_shards(path)
                    else:
                        read_manifest(path)
                except IndexFolderError as exc:
                    raise IndexFolderError(f"{path} exists and is not an AGRaME index ({exc}); --overwrite replaces "
                                           "only an index: choose another path or remove it yourself") from None
                if not overwrite:
                    raise IndexFolderError(f"{path} already exists (use --overwrite to replace it)")
                if not exchange and not sharded:  # a sharded index has no generations of its own: swap it whole
                    return False
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in stale_beside(path):
            _remove(stale)
            say(f"removed {stale.name}, left beside {path.name} by a writer that died")
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        _remove(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise _folder_error(path, exc) from None
    try:
        manifest = write(tmp)
        if manifest is not None:
            write_manifest(tmp, manifest)
        if path.exists() and any(path.iterdir()):
            _exchange(tmp, path)
            _remove(tmp)  # the old index, now at the temporary name
        else:
            try:
                os.rename(tmp, path)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise IndexFolderError(f"{path} was created by another writer while this one built; "
                                           "nothing of this build was kept") from None
                raise
    except OSError as exc:
        _remove(tmp)
        raise _folder_error(path, exc) from None
    except BaseException:
        _remove(tmp)
        raise
    return True


def check_passages(passages: Iterable, where: str = "passage") -> List[Passage]:
    """Passages normalised, ids unique, texts non-empty, metadata valid (errors name the passage)."""
    out = as_passages(passages)
    for p in out:
        for field, value in (("id", p.id), ("text", p.text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise IndexFolderError(f"{where} {p.id!r}: {field} is not valid Unicode (a lone surrogate)") from None
        if not p.text.strip():
            raise IndexFolderError(f"{where} {p.id!r}: empty text")
        validate_metadata(p.metadata, f"{where} {p.id!r}: metadata")
    return out


class IndexWriter:
    """Exclusive write access to one index folder (``with IndexWriter(path) as w: w.upsert(…)``).

    Entering takes the lock (waiting up to ``lock_timeout`` seconds, then
    :class:`~agrame.index.lock.IndexLockedError`) and recovers from any writer that died. Each
    method commits one generation (two when it triggers a compaction) and returns the manifest.
    """

    def __init__(self, path: str | Path, *, lock_timeout: float = 0.0,
                 compact_threshold: Optional[float] = DEFAULT_COMPACT_THRESHOLD,
                 say: Optional[Callable[[str], None]] = None):
        self.path = Path(path)
        self.lock = WriterLock(self.path, lock_timeout)
        self.compact_threshold = compact_threshold
        self.say = say or log.info
        self.recovered: List[str] = []
        self.last_compaction: Optional[dict] = None

    def __enter__(self) -> "IndexWriter":
        recover_aside(self.path, self.say)
        read_manifest(self.path)  # refuses what is not an index before a lock file is made in it
        try:
            self.lock.acquire()
        except IndexFolderError:
            raise
        try:
            self.recovered = self.recover()
        except BaseException:
            self.lock.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> List[str]:
        """Undo what a writer that died left: uncommitted bytes and rows, unnamed files, stale folders."""
        manifest = read_manifest(self.path)
        done: List[str] = []
        try:
            for stale in stale_beside(self.path):
                _remove(stale)
                done.append(f"../{stale.name}/")
            if manifest["format"] != FORMAT_V2:
                for entry in self.path.iterdir():
                    if _TEMP.fullmatch(entry.name):
                        _remove(entry)
                        done.append(entry.name)
            else:
                root = store_root(self.path, manifest)
                for name, info in manifest["files"].items():
                    file = root / name
                    if file.exists() and file.stat().st_size > info["size"]:
                        with open(file, "r+b") as f:
                            f.truncate(info["size"])
                        done.append(f"{name}: {file.stat().st_size - info['size']} uncommitted bytes")
                if manifest.get("metadata") and (root / manifest["metadata"]).exists():
                    db = MetadataDB(root / manifest["metadata"], writable=True)
                    try:
                        rows = db.truncate(int(manifest["num_passages"]))
                    finally:
                        db.close()
                    if rows:
                        done.append(f"{manifest['metadata']}: {rows} uncommitted rows")
                done += collect_garbage(self.path, manifest)
        except OSError as exc:
            raise _folder_error(self.path, exc) from None
        if done:
            self.say(f"recovered {self.path} from an interrupted write: removed {', '.join(done)}")
        return done

    # -- changes ----------------------------------------------------------------------------

    def _current(self) -> tuple:
        manifest = read_manifest(self.path)
        if manifest["format"] != FORMAT_V2:
            raise IndexFolderError(f"{self.path} is a {manifest['format']} index; changing it needs a compressed "
                                   f"({FORMAT_V2}) index (rebuild it with --overwrite)")
        # Sizes checked, checksums not recomputed: a change reads only what it touches, and the CRC of a
        # store of hundreds of MB would be most of a small delete's latency (readers check at open).
        return manifest, Store(self.path, manifest, verify=False)

    def add(self, encoder: Encoder, passages, **options) -> dict:
        """Append passages whose ids the index does not hold (an id it holds is an error)."""
        return self._change(encoder, passages, replace=False, **options)

    def upsert(self, encoder: Encoder, passages, **options) -> dict:
        """Replace the text, vectors and metadata of ids the index holds; add the rest."""
        return self._change(encoder, passages, replace=True, **options)

    def delete(self, ids: Sequence[str], missing: str = "error") -> dict:
        """Tombstone passages by id; an unknown id is :class:`UnknownIdsError` unless ``missing="ok"``."""
        if missing not in ("error", "ok"):
            raise ValueError("missing must be 'error' or 'ok'")
        manifest, store = self._current()
        try:
            ids = list(dict.fromkeys(ids))
            found = store.position_of(ids)
            unknown = [i for i in ids if i not in found]
            if unknown and missing == "error":
                raise UnknownIdsError(self.path, unknown)
            return self._commit(manifest, store, None, np.array(sorted(found.values()), dtype=np.int64))
        finally:
            store.close()

    def delete_where(self, spec) -> dict:
        """Tombstone every live passage a metadata filter admits."""
        from .metadata import is_empty

        if is_empty(spec):
            raise IndexFolderError("an empty filter would delete every passage; delete by id or rebuild instead")
        manifest, store = self._current()
        try:
            return self._commit(manifest, store, None, np.flatnonzero(store.allowed(spec)))
        finally:
            store.close()

    def _change(self, encoder: Encoder, passages, *, replace: bool, batch_size: int = 16,
                chunk_passages: int = 1024, progress: bool = False, sentences: Optional[Sequence] = None) -> dict:
        passages = check_passages(passages)
        if not passages:
            raise IndexFolderError("no passages given")
        if sentences is not None and len(sentences) != len(passages):
            raise ValueError(f"sentences: {len(sentences)} lists for {len(passages)} passages")
        manifest, store = self._current()
        try:
            check_model(manifest, encoder, self.path)
            found = store.position_of([p.id for p in passages])
            if found and not replace:
                raise IndexFolderError(f"passage ids already in {self.path}: {sorted(found)[:5]} "
                                       "(replace them with --upsert)")
            kill = np.array(sorted(found.values()), dtype=np.int64)
            append = (encoder, passages, sentences, batch_size, chunk_passages, progress)
            return self._commit(manifest, store, append, kill)
        finally:
            store.close()

    def _commit(self, manifest: dict, store: Store, append, kill: np.ndarray) -> dict:
        """One generation: ``append`` (encoder, passages, …) past the committed sizes, ``kill`` positions
        tombstoned, the manifest renamed into place."""
        if append is None and not len(kill):
            return manifest
        root, files = store.root, dict(manifest["files"])
        generation = int(manifest["generation"]) + 1
        new = {**manifest, "generation": generation, "ivf_generation": ivf_generation(manifest),
               "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        db = self._metadata(manifest, store, new)
        try:
            if append is not None:
                self._append(store, root, files, new, db, generation, *append)
            if len(kill):
                dead = np.union1d(store.deleted, kill)
                if manifest.get("tombstones"):
                    files.pop(manifest["tombstones"], None)
                name = f"deleted-{generation}.bin"
                _write_fixed(root, name, dead.astype("<i4").tobytes(), files)
                new["tombstones"] = name
                new["num_deleted"] = int(len(dead))
            new["files"] = files
            write_manifest(self.path, new)
        finally:
            db.close()
        collect_garbage(self.path, new)
        dead_share = new.get("num_deleted", 0) / max(1, new["num_passages"])
        if self.compact_threshold is not None and new.get("num_deleted") and dead_share > self.compact_threshold:
            new = self.compact()
        return new

    def _metadata(self, manifest: dict, store: Store, new: dict) -> MetadataDB:
        """The writable metadata file; an index written before metadata gets one (ids only) in this change."""
        name = manifest.get("metadata")
        if name:
            return MetadataDB(store.root / name, writable=True)
        file = store.root / METADATA_FILE
        for suffix in ("", "-wal", "-shm"):
            Path(str(file) + suffix).unlink(missing_ok=True)
        db = MetadataDB(file, writable=True, create=True)
        db.insert((pos, pid, None) for pos, pid in enumerate(store.ids()))
        new["metadata"] = METADATA_FILE
        return db

    def _append(self, store: Store, root: Path, files: Dict[str, dict], new: dict, db: MetadataDB,
                generation: int, encoder, passages, sentences, batch_size, chunk_passages, progress) -> None:
        stored = offsets_stored(new)
        out = _Appender(root, {k: files[k] for k in append_files(stored)}, stored)
        first = len(store)
        writer = _ChunkWriter(out, store.codec, first)
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(passages), desc="writing", unit="psg", disable=None)
        try:
            for lo, part, enc in _encode_chunks(encoder, passages, chunk_passages, batch_size, {}, bar):
                writer.write(part, enc, None if sentences is None else sentences[lo:lo + len(part)])
        finally:
            out.close()
            if bar is not None:
                bar.close()
        files.update(out.files)
        db.insert((first + i, p.id, p.metadata) for i, p in enumerate(passages))
        ivf = merge_ivf(store.ivf, np.concatenate(writer.pairs), store.codec.num_centroids)
        old = ivf_generation(new)
        for suffix in ("offsets", "pids"):
            files.pop(f"ivf-{old}.{suffix}.bin", None)
        _ivf_files(root, ivf, generation, files)
        new.update(ivf_generation=generation, num_passages=writer.next_pid,
                   num_tokens=int(new["num_tokens"]) + writer.tokens,
                   num_sentences=int(new["num_sentences"]) + writer.sentences,
                   has_spans=bool(new.get("has_spans")) or writer.has_spans)

    # -- compaction and rebuild -------------------------------------------------------------

    def _new_store_folder(self, manifest: dict) -> tuple:
        match = _EPOCH.fullmatch(str(manifest.get("store", "")).rstrip("/"))
        name = f"s{int(match.group(1)) + 1 if match else 1}"
        folder = self.path / name
        _remove(folder)
        folder.mkdir()
        return name, folder

    def compact(self) -> dict:
        """Rewrite the store without its dead passages into a new store folder, as one generation;
        the old files are removed once it commits (readers that mapped them keep them until they
        reload). A no-op when nothing is deleted."""
        manifest, store = self._current()
        try:
            if not len(store.deleted):
                self.last_compaction = {"passages_removed": 0, "bytes_returned": 0, "seconds": 0.0}
                return manifest
            started = time.perf_counter()
            before = _folder_bytes(self.path)
            name, folder = self._new_store_folder(manifest)
            generation = int(manifest["generation"]) + 1
            live = store.live_positions()
            files: Dict[str, dict] = {}
            _codec_files(folder, store.codec, files)
            stored = offsets_stored(manifest)
            out = _Appender(folder, files, stored)
            pairs, tokens, sentences = [], 0, 0
            try:
                for lo in range(0, len(live), COMPACT_CHUNK):
                    part = live[lo:lo + COMPACT_CHUNK]
                    rows = store.token_rows(part)
                    codes = np.asarray(store.codes[rows])
                    out.write("codes.bin", codes.tobytes())
                    out.write("residuals.bin", np.ascontiguousarray(store.residuals[rows]).tobytes())
                    sent_rows = _ranges(store.sent_starts[part], store.sentcounts[part])
                    if stored:
                        out.write(TOKENS_FILE, np.ascontiguousarray(store.tokens[rows]).tobytes())
                    else:
                        out.write(SENTENCE_TOKENS_FILE, np.ascontiguousarray(store.sentence_tokens[sent_rows]).tobytes())
                    out.write("doclens.bin", store.doclens[part].astype("<i4").tobytes())
                    out.write("sentcounts.bin", store.sentcounts[part].astype("<i4").tobytes())
                    out.write("sentences.bin", np.ascontiguousarray(store.sentences[sent_rows], dtype="<i4").tobytes())
                    starts = [out.write("passages.jsonl", store.record_bytes(int(p))) for p in part]
                    out.write("passage_offsets.bin", np.array(starts, dtype="<i8").tobytes())
                    owners = np.repeat(np.arange(lo, lo + len(part), dtype=np.int64), store.doclens[part])
                    pairs.append(unique_pairs(codes, owners))
                    tokens += len(rows)
                    sentences += len(sent_rows)
            finally:
                out.close()
            files.update(out.files)
            _ivf_files(folder, build_ivf(np.concatenate(pairs) if pairs else np.zeros(0, np.int64),
                                         store.codec.num_centroids), generation, files)
            db = MetadataDB(folder / METADATA_FILE, writable=True, create=True)
            try:
                if store.meta is not None:
                    old_rows = store.meta.rows(live)
                else:
                    ids = store.ids()
                    old_rows = [(int(p), ids[p], None) for p in live]
                db.insert((new_pos, pid, meta) for new_pos, (_, pid, meta) in enumerate(old_rows))
            finally:
                db.close()
            new = {k: v for k, v in manifest.items() if k not in ("tombstones", "num_deleted")}
            new.update(store=name + "/", generation=generation, ivf_generation=generation, files=files,
                       metadata=METADATA_FILE, num_passages=int(len(live)), num_tokens=tokens,
                       num_sentences=sentences, updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            write_manifest(self.path, new)
        finally:
            store.close()
        collect_garbage(self.path, new)
        self.last_compaction = {"passages_removed": int(len(store.deleted)),
                                "bytes_returned": int(before - _folder_bytes(self.path)),
                                "seconds": round(time.perf_counter() - started, 3)}
        self.say(f"compacted {self.path}: {len(store.deleted)} deleted passages removed, "
                 f"{self.last_compaction['bytes_returned']:,} bytes returned")
        return new

    def rebuild(self, encoder: Encoder, passages, **options) -> dict:
        """Replace the whole index in place (``--overwrite``): a new store folder, one generation."""
        passages = check_passages(passages)
        manifest = read_manifest(self.path)
        name, folder = self._new_store_folder(manifest)
        new = write_store(folder, encoder, passages, generation=int(manifest.get("generation", 1)) + 1, **options)
        new["store"] = name + "/"
        write_manifest(self.path, new)
        collect_garbage(self.path, new)
        return new


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


__all__ = ["DEFAULT_COMPACT_THRESHOLD", "IndexWriter", "UnknownIdsError", "build_new_folder", "check_passages",
           "collect_garbage"]

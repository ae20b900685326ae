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
import sqlite3
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..corpus import EncodedCorpus, Passage, as_passages
from ..encoder import Encoder
from ..pooling import check_pool_factor
from .format import (FORMAT_V2, MANIFEST, V1_FILES, IndexFolderError, NoSpaceError, check_layout, check_model, crc32_file,
                     ivf_generation, read_index, read_manifest, read_shards, store_root, write_manifest)
from .codec import ResidualCodec
from .ivf import _ranges, build_ivf, merge_ivf, unique_pairs
from .lock import LOCK_FILE, WriterLock, build_lock, pid_alive
from .metadata import DIGEST_FIELD, METADATA_FILE, MetadataDB, add_digests, validate_metadata
from .store import (APPEND_FILES, ORIGLENS_FILE, POOL_FILE, SENTENCE_TOKENS_FILE, TOKENS_FILE, Store, _Appender, _ChunkWriter,
                    _codec_files, _encode_chunks, _ivf_files, _write_fixed, append_files, default_pool_factor, ivf_pids,
                    offsets_stored, pool_factor,
                    write_store)

log = logging.getLogger("agrame.index")

#: Dead share of the stored passages past which a change compacts the index (``compact_threshold``).
DEFAULT_COMPACT_THRESHOLD = 0.2
#: Passages copied per step of a compaction (bounds its memory).
COMPACT_CHUNK = 2048

_TEMP = re.compile(r"\..+\.tmp-(\d+)")
#: Written first into a fresh build's temporary folder: what proves an otherwise empty one (a build
#: killed while it trained its codec) to be a build's, so that the next build there removes it.
BUILD_MARKER = ".agrame-build"
_EPOCH = re.compile(r"s(\d+)")
_SHARD = re.compile(r"shard-\d{3,6}")
_OURS = re.compile(r"(ivf-\d+\.(offsets|pids)\.bin|deleted-\d+\.bin|meta\.sqlite(-wal|-shm|-journal)?|"
                   r"centroids\.f16|buckets\.f32|o?pq\.f32|tokens\.bin|sentence_tokens\.bin|pool\.bin|origlens\.bin|"
                   # format-1 files (an index rebuilt in place as format 2 drops them)
                   r"vectors\.f16|offsets\.npy|token_sentence\.npy|passage_starts\.npy|sentences\.npy|"
                   r"sentence_passage\.npy)")
_STORE_FILES = set(APPEND_FILES)


class PoolFactorError(IndexFolderError, ValueError):
    """Passages to add with another pool factor than the index's."""


class UnknownIdsError(IndexFolderError):
    """Ids asked for that the index does not hold."""

    def __init__(self, path: Path, ids: Sequence[str]):
        self.ids = list(ids)
        shown = ", ".join(repr(i) for i in self.ids[:10]) + (f" and {len(self.ids) - 10} more" if len(self.ids) > 10 else "")
        super().__init__(f"index {path} has no passage with id {shown}")


def _ours(name: str) -> bool:
    return bool(_TEMP.fullmatch(name) or _OURS.fullmatch(name) or name in _STORE_FILES)


def _own_temp_file(entry: Path) -> bool:
    """A ``.NAME.tmp-PID`` *file* inside an index that a writer left: NAME is a file AGRaME writes
    and PID is this process (the lock holder's own failed write) or dead. Anything else of that
    shape (a user's ``.notes.tmp-1``, a folder) is not provably the store's own."""
    match = _TEMP.fullmatch(entry.name)
    if not match or entry.is_dir() or entry.is_symlink():
        return False
    inner = entry.name[1:entry.name.rindex(".tmp-")]
    if not (_OURS.fullmatch(inner) or inner in _STORE_FILES or inner in (MANIFEST, "shards.json")):
        return False
    pid = int(match.group(1))
    return pid == os.getpid() or not pid_alive(pid)


def _collectable(entry: Path) -> bool:
    """Whether garbage collection may remove this entry of an index or store folder: a name AGRaME
    writes that is a plain file, or a temporary entry proven to be a dead writer's (the rule that
    applies beside an index: :func:`_stale_temp` for folders)."""
    if _TEMP.fullmatch(entry.name):
        return _stale_temp(entry) if entry.is_dir() and not entry.is_symlink() else _own_temp_file(entry)
    return _ours(entry.name) and not entry.is_dir()


def left_alone(path: Path, manifest: dict) -> List[str]:
    """Entries of an index (and its store folder) shaped like AGRaME's temporary names that are not
    provably its own, so garbage collection keeps them: what a recovery reports as left alone."""
    prefix = str(manifest.get("store", ""))
    folders = [path] + ([path / prefix.rstrip("/")] if prefix else [])
    out = []
    for folder in folders:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if _TEMP.fullmatch(entry.name) and not _collectable(entry):
                out.append(str(entry.relative_to(path)) + ("/" if entry.is_dir() else ""))
    return out


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _ours_folder(entry: Path) -> bool:
    """Whether a store folder (``sN/``) holds only names AGRaME writes (a user's ``s3/`` is not ours)."""
    try:
        return all(_collectable(sub) and not sub.is_dir() for sub in entry.iterdir())
    except OSError:
        return False


def collect_garbage(path: Path, manifest: dict) -> List[str]:
    """Remove what a committed version-2 manifest does not name: temporary files, superseded or
    uncommitted store files, other store folders. Only names AGRaME writes are touched: a store
    folder holding anything else (a user's ``s3/``) is left where it is."""
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
                    if f"{name}/{sub.name}" not in keep and _collectable(sub):
                        _remove(sub)
                        removed.append(f"{name}/{sub.name}")
            elif _ours_folder(entry):
                _remove(entry)
                removed.append(name + "/")
        elif name not in keep and _collectable(entry):
            _remove(entry)
            removed.append(name)
    return removed


def _stale_temp(entry: Path, held: Optional[Path] = None) -> bool:
    """A ``.NAME.tmp-PID`` folder beside an index that a writer which died left: its pid is gone,
    nobody holds NAME's build lock, and it holds only what an index build writes."""
    match = _TEMP.fullmatch(entry.name)
    if not match or not entry.is_dir() or entry.is_symlink() or pid_alive(int(match.group(1))):
        return False
    try:
        names = {sub.name: sub.is_dir() for sub in entry.iterdir()}
        if not all(_ours(name) or name in (MANIFEST, LOCK_FILE, "shards.json", "journal.json", BUILD_MARKER)
                   or ((_EPOCH.fullmatch(name) or _SHARD.fullmatch(name)) and is_dir)
                   for name, is_dir in names.items()):
            return False
        # and something only a build writes first (an empty folder may be anybody's — but not one named
        # after the index this process is building: a build of it killed before its first write)
        if not names and held is not None and entry.parent / entry.name[1:entry.name.rindex(".tmp-")] == held:
            return True
        if not ({MANIFEST, "centroids.f16", "vectors.f16", "shards.json", BUILD_MARKER} & set(names)
                or any(_SHARD.fullmatch(name) for name in names)):
            return False
    except OSError:
        return False
    target = entry.parent / entry.name[1:entry.name.rindex(".tmp-")]
    if held is not None and target == held:
        return True  # this process holds that build lock: a dead pid's folder is a killed build's
    lock = build_lock(target)
    try:
        lock.acquire()
    except IndexFolderError:
        return False  # being built right now (by a process in another pid namespace, say)
    lock.release()
    return True


def stale_beside(path: Path, every: bool = False, held: bool = False) -> List[Path]:
    """Temporary folders of dead writers beside ``path`` (``.NAME.tmp-PID``); ``every``: of any
    index in ``path``'s parent (a fresh build's leftovers are cleaned by the next build there);
    ``held``: the caller holds ``path``'s build lock (a build of that path: its own earlier killed
    builds' folders are stale, though the lock they would be checked with is taken)."""
    out = []
    if path.parent.is_dir():
        pattern = ".*.tmp-*" if every else f".{glob_escape(path.name)}.tmp-*"
        for entry in path.parent.glob(pattern):
            if _stale_temp(entry, path if held else None):
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


def prove_index(path: Path) -> str:
    """``"sharded"`` or the format of the index at ``path``, proven by its whole layout (every
    shard's too), or :class:`IndexFolderError` saying why it is not one."""
    if (path / "shards.json").is_file():
        for shard in read_shards(path)["shards"]:
            read_index(path / shard)
        return "sharded"
    return read_index(path)["format"]


def foreign_entries(path: Path, kind: str) -> List[str]:
    """Entries of an index folder that its format does not own (a user's files put inside it):
    what replacing the folder whole would delete."""
    if kind == "sharded":
        owned = {MANIFEST, LOCK_FILE, "shards.json", "journal.json", *read_shards(path)["shards"]}
    elif kind == FORMAT_V2:
        return []  # rebuilt in place: collect_garbage removes only what is AGRaME's
    else:
        owned = {MANIFEST, LOCK_FILE, *V1_FILES}
    return sorted(e.name + ("/" if e.is_dir() else "") for e in path.iterdir()
                  if e.name not in owned and not _TEMP.fullmatch(e.name))


def build_new_folder(path: Path, overwrite: bool, write: Callable[[Path], Optional[dict]], *,
                     exchange: bool = False, say: Optional[Callable[[str], None]] = None,
                     lock_timeout: float = 0.0, held: bool = False) -> bool:
    """Build an index where none is: ``write(tmp)`` fills a temporary folder beside ``path`` (and
    returns the manifest to commit there, or writes one itself), then one rename puts it in place.

    The build holds ``path``'s build lock (:func:`~agrame.index.lock.build_lock`, beside it) from
    before it starts until the rename: a second build of the same path is refused naming this one
    (or waits ``lock_timeout`` seconds), and a path that appeared meanwhile is never replaced.

    False, having written nothing, when ``path`` is an index to be replaced in place
    (``overwrite``; the caller rebuilds it under its lock), unless ``exchange`` (format 1 and
    sharded indexes, which have no generations): then the new folder and the old swap places
    atomically. A folder is an index only by its whole layout (:func:`prove_index`); anything
    else is never replaced, nor an index holding files of the user's; a file is never written
    through.
    """
    say = say or log.info
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # (the build lock lives there)
    except OSError as exc:
        raise _folder_error(path, exc) from None
    if held:
        return _build_locked(path, overwrite, write, exchange, say)
    lock = build_lock(path, lock_timeout)
    lock.acquire()
    try:
        return _build_locked(path, overwrite, write, exchange, say)
    finally:
        lock.release()


def _build_locked(path: Path, overwrite: bool, write, exchange: bool, say) -> bool:
    replacing = False
    try:
        recover_aside(path, say)
        if path.exists() or path.is_symlink():
            if not path.is_dir() or path.is_symlink():
                raise IndexFolderError(f"{path} exists and is not a folder")
            if any(path.iterdir()):
                try:
                    kind = prove_index(path)
                except IndexFolderError as exc:
                    raise IndexFolderError(f"{path} exists and is not an AGRaME index ({exc}); --overwrite replaces "
                                           "only an index: choose another path or remove it yourself") from None
                if not overwrite:
                    raise IndexFolderError(f"{path} already exists (use --overwrite to replace it)")
                if not exchange and kind == FORMAT_V2:
                    return False
                foreign = foreign_entries(path, kind)
                if foreign:
                    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                    raise IndexFolderError(f"{path} holds files that are not the index's ({shown}); --overwrite "
                                           "would delete them: move them out first")
                replacing = True
        for stale in stale_beside(path, every=True, held=True):
            _remove(stale)
            say(f"removed {stale.name}, left beside {path.name} by a writer that died")
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
        _remove(tmp)
        tmp.mkdir()
        (tmp / BUILD_MARKER).write_text(f"{os.getpid()}\n")
    except OSError as exc:
        raise _folder_error(path, exc) from None
    try:
        manifest = write(tmp)
        if manifest is not None:
            write_manifest(tmp, manifest)
        (tmp / BUILD_MARKER).unlink(missing_ok=True)
        if replacing:
            _exchange(tmp, path)
            _remove(tmp)  # the old index, now at the temporary name
        elif (path.exists() or path.is_symlink()) and (not path.is_dir() or any(path.iterdir())):
            # Only a writer that does not take the build lock (an older AGRaME, a copy by hand) gets here.
            raise IndexFolderError(f"{path} appeared while this build ran, written by another process; it was "
                                   "left as it is and nothing of this build was kept")
        else:
            try:
                os.rename(tmp, path)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise IndexFolderError(f"{path} appeared while this build ran, written by another process; it "
                                           "was left as it is and nothing of this build was kept") from None
                raise
    except NoSpaceError as exc:
        _remove(tmp)
        raise NoSpaceError(f"no space left writing index {path} ({exc.file}: {exc.reason}); nothing of this build "
                           "was kept", exc.file, exc.reason) from None
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
        read_index(self.path)  # refuses what is not wholly an index before a lock file is made in it
        self.lock.acquire()
        try:
            self.recovered = self.recover()
        except NoSpaceError as exc:
            self.lock.release()
            raise self._no_space(exc) from None
        except BaseException:
            self.lock.release()
            raise
        return self

    def _no_space(self, exc: NoSpaceError) -> NoSpaceError:
        generation = read_manifest(self.path).get("generation", 1)
        return NoSpaceError(f"no space left writing index {self.path} ({exc.file}: {exc.reason}); it holds its last "
                            f"committed generation ({generation}) and nothing of this write", exc.file, exc.reason)

    def __exit__(self, kind=None, exc=None, tb=None) -> None:
        try:
            if exc is not None and not isinstance(exc, (UnknownIdsError, KeyboardInterrupt)):
                self._roll_back()
                if isinstance(exc, NoSpaceError):
                    raise self._no_space(exc) from None
        finally:
            self.lock.release()

    def _roll_back(self) -> None:
        """After a failed change: cut what it appended and drop its rows and files now (a full disk
        gets its room back) — what the next writer's recovery would do. Best effort: what cannot be
        undone now (SQLite may need room to delete) is undone by that recovery."""
        say, self.say = self.say, (lambda _: None)
        try:
            self.recover()
        except (OSError, ValueError, sqlite3.Error):
            pass
        finally:
            self.say = say

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> List[str]:
        """Undo what a writer that died left: uncommitted bytes and rows, unnamed files, stale folders.

        Everything is checked before anything is changed: the whole layout (:func:`check_layout`),
        the committed bytes of each file to be cut (their CRC-32: a longer file that is not this
        index's own is refused, not cut) and the committed metadata rows (their digest)."""
        manifest = read_manifest(self.path)
        check_layout(self.path, manifest)
        done: List[str] = []
        try:
            cuts: List[tuple] = []
            db = None
            if manifest["format"] == FORMAT_V2:
                root = store_root(self.path, manifest)
                for name, info in manifest["files"].items():
                    file = root / name
                    extra = file.stat().st_size - info["size"]
                    if extra > 0:
                        if crc32_file(file, info["size"]) != info["crc32"]:
                            raise IndexFolderError(f"index {self.path} is damaged: {name} does not match its "
                                                   "checksum (nothing in the index was changed)")
                        cuts.append((file, name, info["size"], extra))
                if manifest.get("metadata"):
                    db = MetadataDB(root / manifest["metadata"], writable=True)
            try:
                if db is not None:
                    db.verify(manifest, self.path, verify="auto")
                for stale in stale_beside(self.path, every=True):
                    _remove(stale)
                    done.append(f"../{stale.name}/")
                if manifest["format"] != FORMAT_V2:
                    for entry in self.path.iterdir():
                        if _own_temp_file(entry):
                            _remove(entry)
                            done.append(entry.name)
                    return self._said(done)
                for file, name, size, extra in cuts:
                    with open(file, "r+b") as f:
                        f.truncate(size)
                    done.append(f"{name}: {extra} uncommitted bytes")
                if db is not None:
                    rows = db.truncate(int(manifest["num_passages"]))
                    if rows:
                        done.append(f"{manifest['metadata']}: {rows} uncommitted rows")
            finally:
                if db is not None:
                    db.close()
            done += collect_garbage(self.path, manifest)
            kept = left_alone(self.path, manifest)
        except OSError as exc:
            raise _folder_error(self.path, exc) from None
        return self._said(done, kept)

    def _said(self, done: List[str], kept: Sequence[str] = ()) -> List[str]:
        if done:
            self.say(f"recovered {self.path} from an interrupted write: removed {', '.join(done)}")
        if kept:
            self.say(f"left alone in {self.path} (not written by AGRaME, or its writer is alive): {', '.join(kept)}")
        return done

    # -- changes ----------------------------------------------------------------------------

    def _current(self) -> tuple:
        manifest = read_manifest(self.path)
        if manifest["format"] != FORMAT_V2:
            raise IndexFolderError(f"{self.path} is a {manifest['format']} index; changing it needs a compressed "
                                   f"({FORMAT_V2}) index (rebuild it with --overwrite)")
        # Sizes checked, checksums not recomputed: a change reads only what it touches, and the CRC of a
        # store of hundreds of MB would be most of a small delete's latency (readers check at open).
        # The metadata's digest is checked (within its budget): a delete by filter or an upsert acts on what
        # the rows say, and must not act on damaged ones.
        return manifest, Store(self.path, manifest, verify=False, verify_meta="auto")

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
                chunk_passages: int = 1024, progress: bool = False, sentences: Optional[Sequence] = None,
                pool_factor=None) -> dict:
        """``pool_factor``: None takes the index's own; another than the index's is an error (an index
        holds vectors of one factor, :mod:`agrame.pooling`)."""
        if pool_factor is not None:
            pool_factor = check_pool_factor(pool_factor)
        passages = _given(passages, sentences, "no passages given")
        manifest, store = self._current()
        try:
            check_model(manifest, encoder, self.path)
            own = store.pool_factor
            if pool_factor is not None and pool_factor != own:
                raise PoolFactorError(f"index {self.path} was built with pool factor {own:g}; passages added to it "
                                      f"are pooled the same way, not with {pool_factor:g} (rebuild it with "
                                      f"--overwrite to change the factor)")
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
            db = MetadataDB(store.root / name, writable=True)
            if DIGEST_FIELD not in manifest:  # written before digests: its rows as they are now
                try:
                    new[DIGEST_FIELD] = db.digest(int(manifest["num_passages"]))
                except sqlite3.Error as exc:
                    db.close()
                    raise IndexFolderError(f"index {self.path} is damaged: {name}: {exc}") from None
            return db
        file = store.root / METADATA_FILE
        for suffix in ("", "-wal", "-shm"):
            Path(str(file) + suffix).unlink(missing_ok=True)
        db = MetadataDB(file, writable=True, create=True)
        new[DIGEST_FIELD] = db.insert((pos, pid, None) for pos, pid in enumerate(store.ids()))
        new["metadata"] = METADATA_FILE
        return db

    def _append(self, store: Store, root: Path, files: Dict[str, dict], new: dict, db: MetadataDB,
                generation: int, encoder, passages, sentences, batch_size, chunk_passages, progress) -> None:
        stored, factor = offsets_stored(new), pool_factor(new)
        out = _Appender(root, {k: files[k] for k in append_files(stored, factor != 1)}, stored, pooled=factor != 1)
        first = len(store)
        writer = _ChunkWriter(out, store.codec, first, pool_factor=factor)
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
        new[DIGEST_FIELD] = add_digests(new.get(DIGEST_FIELD),
                                        db.insert((first + i, p.id, p.metadata) for i, p in enumerate(passages)))
        if ivf_pids(new) != "derived":  # (an index that stores its lists: the new ones under a new name)
            ivf = merge_ivf(store.ivf, np.concatenate(writer.pairs), store.codec.num_centroids)
            old = ivf_generation(new)
            for suffix in ("offsets", "pids"):
                files.pop(f"ivf-{old}.{suffix}.bin", None)
            _ivf_files(root, ivf, generation, files, ivf_pids(new))
        if factor != 1:
            new["num_original_tokens"] = int(new["num_original_tokens"]) + writer.original_tokens
        new.update(ivf_generation=generation, num_passages=writer.next_pid,
                   num_tokens=int(new["num_tokens"]) + writer.tokens,
                   num_sentences=int(new["num_sentences"]) + writer.sentences,
                   has_spans=bool(new.get("has_spans")) or writer.has_spans)

    # -- compaction and rebuild -------------------------------------------------------------

    def _new_store_folder(self, manifest: dict) -> tuple:
        match = _EPOCH.fullmatch(str(manifest.get("store", "")).rstrip("/"))
        n = int(match.group(1)) + 1 if match else 1
        while (self.path / f"s{n}").exists() and not (
                (self.path / f"s{n}").is_dir() and _ours_folder(self.path / f"s{n}")):
            n += 1  # a user's folder of that name (or a file) is passed over, never emptied
        name = f"s{n}"
        folder = self.path / name
        _remove(folder)  # a killed writer's partial store folder
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
            stored, pooled = offsets_stored(manifest), store.pool_codes is not None
            out = _Appender(folder, files, stored, pooled=pooled)
            pairs, tokens, sentences, original = [], 0, 0, 0
            try:
                for lo in range(0, len(live), COMPACT_CHUNK):
                    part = live[lo:lo + COMPACT_CHUNK]
                    rows = store.token_rows(part)
                    codes = np.asarray(store.codes[rows])
                    out.write("codes.bin", codes.tobytes())
                    out.write("residuals.bin", np.ascontiguousarray(store.residuals[rows]).tobytes())
                    if pooled:
                        out.write(POOL_FILE, np.ascontiguousarray(
                            store.pool_codes[_ranges(store.orig_starts[part], store.origlens[part])]).tobytes())
                        out.write(ORIGLENS_FILE, store.origlens[part].astype("<i4").tobytes())
                        original += int(store.origlens[part].sum())
                    sent_rows = _ranges(store.sent_starts[part], store.sentcounts[part])
                    if stored:
                        token_rows = rows if not pooled else _ranges(store.orig_starts[part], store.origlens[part])
                        out.write(TOKENS_FILE, np.ascontiguousarray(store.tokens[token_rows]).tobytes())
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
            if ivf_pids(manifest) != "derived":
                _ivf_files(folder, build_ivf(np.concatenate(pairs) if pairs else np.zeros(0, np.int64),
                                             store.codec.num_centroids), generation, files, ivf_pids(manifest))
            db = MetadataDB(folder / METADATA_FILE, writable=True, create=True)
            try:
                if store.meta is not None:
                    old_rows = store.meta.rows(live)
                else:
                    ids = store.ids()
                    old_rows = [(int(p), ids[p], None) for p in live]
                digest = db.insert((new_pos, pid, meta) for new_pos, (_, pid, meta) in enumerate(old_rows))
            finally:
                db.close()
            new = {k: v for k, v in manifest.items() if k not in ("tombstones", "num_deleted")}
            new.update(store=name + "/", generation=generation, ivf_generation=generation, files=files,
                       metadata=METADATA_FILE, num_passages=int(len(live)), num_tokens=tokens, metadata_digest=digest,
                       num_sentences=sentences, updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if pooled:
                new["num_original_tokens"] = original
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


def build_compressed(encoder: Encoder, passages: Sequence[Passage], path: str | Path, *, nbits=None,
                     batch_size: int = 16, chunk_passages: int = 1024, overwrite: bool = False,
                     progress: bool = True, sentences: Optional[Sequence] = None,
                     codec: Optional[ResidualCodec] = None, encoded: Optional[EncodedCorpus] = None,
                     seed: int = 0, store_offsets: bool = False, lock_timeout: float = 0.0,
                     pool_factor=None) -> Path:
    """Write an ``agrame-index/2`` folder, streaming: encode a chunk, (pool it,) compress it, append it.

    ``codec`` reuses given centroids and buckets (e.g. another index's); ``encoded`` takes
    vectors already computed for ``passages`` (same order) instead of encoding them: an
    :class:`EncodedCorpus`, or any object with ``num_tokens``, ``sample_vectors(n, seed)`` and
    ``chunks(passages, chunk_passages, bar)`` (see :class:`VectorSource`; e.g. generated vectors).
    Token offsets are recomputed by searches from the text (``encoder.passage_offsets``; those of
    ``encoded`` vectors are checked against it at build time) unless ``store_offsets``.
    ``pool_factor`` > 1 stores about 1/factor of the token vectors, pooled within sentences
    (:mod:`agrame.pooling`); sentence and span search work on it as on any index. None: the factor the
    model is shipped for (its settings' ``pool_factor``).

    A new folder is written under a temporary name beside ``path`` and renamed into place; with
    ``overwrite``, an existing *index* is replaced in place, under its writer lock, as a new
    generation (:meth:`agrame.index.writer.IndexWriter.rebuild`): the path always holds the old or
    the new index. A folder that is not an index is never replaced.
    """
    path = Path(path)
    passages = _given(passages, sentences, "no passages to index")
    options = dict(nbits=nbits, batch_size=batch_size, chunk_passages=chunk_passages, progress=progress,
                   sentences=sentences, codec=codec, encoded=encoded, seed=seed, store_offsets=store_offsets,
                   pool_factor=default_pool_factor(encoder, pool_factor))
    if build_new_folder(path, overwrite, lambda folder: write_store(folder, encoder, passages, **options)):
        return path
    with IndexWriter(path, lock_timeout=lock_timeout) as writer:
        writer.rebuild(encoder, passages, **options)
    return path


def add_passages(path: str | Path, encoder: Encoder, passages: Sequence[Passage], *, batch_size: int = 16,
                 chunk_passages: int = 1024, progress: bool = True,
                 sentences: Optional[Sequence] = None, lock_timeout: float = 0.0, pool_factor=None) -> dict:
    """Append passages (new ids only) to an ``agrame-index/2`` folder with its centroids, as one new
    generation, under the writer lock (:class:`agrame.index.writer.IndexWriter`). Returns the new manifest."""
    with IndexWriter(path, lock_timeout=lock_timeout) as writer:
        return writer.add(encoder, passages, batch_size=batch_size, chunk_passages=chunk_passages,
                          progress=progress, sentences=sentences, pool_factor=pool_factor)


def _given(passages, sentences, when_none: str) -> List[Passage]:
    """Passages checked (:func:`check_passages`), at least one, with one sentence list each if given."""
    passages = check_passages(passages)
    if not passages:
        raise IndexFolderError(when_none)
    if sentences is not None and len(sentences) != len(passages):
        raise ValueError(f"sentences: {len(sentences)} lists for {len(passages)} passages")
    return passages


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


__all__ = ["DEFAULT_COMPACT_THRESHOLD", "IndexWriter", "PoolFactorError", "UnknownIdsError", "add_passages", "build_compressed",
           "build_new_folder", "check_passages", "collect_garbage"]

"""The index a server answers from: the current committed generation, reopened when a writer commits
a newer one (:class:`IndexHolder`), or an index object that follows its own (:class:`FixedHolder`)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

from .errors import RetryLater

#: Opens of a new generation tried before a request gives up on it (see :meth:`IndexHolder._open`).
OPEN_TRIES = 3


class _Generation:
    """One opened index generation with the (stat) key that identifies it on disk."""

    def __init__(self, index, key):
        self.index, self.key = index, key


class IndexHolder:
    """The current index generation; a newer committed one replaces it between requests."""

    def __init__(self, path: Path, model=None):
        """Open the index at ``path`` (once: its model is the one the server encodes queries with)."""
        from agrame.index.sharded import open_index

        self.path = path
        self._lock = threading.Lock()
        self.reload_error: Optional[str] = None
        self.mid_commit = False  # the newest generation could not be opened yet (a writer mid-commit)
        key = self._key()
        index = open_index(self.path, model=model)
        self.encoder = index.encoder
        self._current = _Generation(index, key)

    def _key(self):
        from agrame.index.sharded import is_sharded, read_shards

        folder = os.stat(self.path)
        if is_sharded(self.path):  # every shard's manifest: a write commits in one of them
            names = ["shards.json"] + [f"{n}/manifest.json" for n in read_shards(self.path)["shards"]]
        else:
            names = ["manifest.json"]
        stats = [os.stat(self.path / name) for name in names]
        return (folder.st_ino, *((m.st_ino, m.st_mtime_ns, m.st_size) for m in stats))

    def _open(self, verify="auto") -> _Generation:
        """The committed generation, opened. A writer committing meanwhile may replace the metadata file
        under the open (SQLite then says "disk I/O error"): that open is tried again on what is committed
        by then, and after :data:`OPEN_TRIES` the error goes to the caller."""
        from agrame.index.sharded import open_index

        for attempt in range(OPEN_TRIES):
            key = self._key()
            try:
                return _Generation(open_index(self.path, model=self.encoder, verify=verify), key)
            except sqlite3.OperationalError:
                if attempt == OPEN_TRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def current(self, wait: bool = False):
        """The newest committed generation (checked with two ``stat`` calls per request).

        One request reopens a newer generation while the others keep answering from the one they
        have (``wait``: a write's own request waits for it, so what it committed is what the next
        request reads). A reopened generation is checked as an index is at open (checksums of files up
        to ``VERIFY_LIMIT``, the metadata's digest): ~1 s a GB of store, once per generation."""
        from agrame.index.format import IndexDamagedError, IndexFolderError

        try:
            key = self._key()
        except OSError:  # mid-rename of a rebuilt folder: keep serving the open one
            return self._current.index
        except IndexFolderError as exc:  # shards.json no longer reads as the committed one
            problem = str(exc).split("shards.json", 1)[-1].lstrip(":").strip() or "cannot be read"
            raise IndexDamagedError(self.path, "shards.json", problem) from None
        if key != self._current.key and self._lock.acquire(blocking=wait):
            try:
                key = self._key()
                if key != self._current.key:
                    self.mid_commit = False
                    try:
                        self._current = self._open()
                        self.reload_error = None
                    except sqlite3.OperationalError as exc:  # still mid-commit: the next request tries again
                        self.reload_error, self.mid_commit = str(exc), True
                    except (ValueError, OSError) as exc:  # e.g. rebuilt with another model
                        self.reload_error = str(exc)
                        self._current = _Generation(self._current.index, key)
            finally:
                self._lock.release()
        return self._current.index

    def read(self):
        """The current generation for a read, checked to hold what was committed
        (:meth:`~agrame.index.base.BaseIndex.check_unchanged`: IndexDamagedError otherwise)."""
        from agrame.index.format import IndexDamagedError

        idx = self.current()
        try:
            idx.check_unchanged()
        except IndexDamagedError:
            # a writer that committed meanwhile removes what its generation supersedes (an old inverted
            # file, a compacted store): that is no damage, the newer generation is what to check and serve
            newer = self.current(wait=True)
            if newer is idx and self.mid_commit:
                raise RetryLater("the index is being updated; retry shortly") from None
            if newer is idx:
                raise
            newer.check_unchanged()
            return newer
        return idx


class FixedHolder:
    """An index object that follows its own generations (the Ray backend's actors reopen per call)."""

    reload_error: Optional[str] = None

    def __init__(self, index):
        self.index, self.path, self.encoder = index, Path(index.path), index.encoder

    def current(self, wait: bool = False):
        return self.index

    def read(self):
        self.index.check_unchanged()
        return self.index

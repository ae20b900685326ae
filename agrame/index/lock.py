"""One writer at a time: an OS file lock (``flock``) on ``DIR/.lock``, the holder's pid written inside.

The kernel drops the lock when its holder dies (even by SIGKILL), so a lock is never stale;
the pid in the file is only there to name the holder in a refusal. Readers never take it.

An index that does not exist yet has no folder to hold its lock: a new build takes
``PARENT/.NAME.lock`` beside it (:func:`build_lock`) before it starts and holds it through the
commit, so two fresh builds of one path never both commit. Its holder removes it on release; a
waiter that then holds a lock on the removed file sees that the name now leads elsewhere (or
nowhere) and locks anew, so no two holders ever overlap.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Optional

from .format import IndexFolderError, ReadOnlyIndexError, mount_point, writing

LOCK_FILE = ".lock"


class IndexLockedError(IndexFolderError):
    """Another writer holds the index's lock (``holder``: its pid, when it could be read)."""

    def __init__(self, path: Path, holder: Optional[int], waited: float, doing: str = "written"):
        self.holder = holder
        who = f"process {holder}" if holder else "another process"
        super().__init__(f"index {path} is being {doing} by {who}"
                         + (f" (waited {waited:g} s)" if waited else "")
                         + "; try again when it is done, or wait for it with --lock-timeout SECONDS")


class WriterLock:
    """``with WriterLock(folder, timeout):`` — exclusive writer access, waiting up to ``timeout`` seconds."""

    POLL = 0.05

    def __init__(self, folder: str | Path, timeout: float = 0.0, *, file: Optional[Path] = None,
                 doing: str = "written", remove: bool = False):
        self.folder = Path(folder)
        self.file = Path(file) if file is not None else self.folder / LOCK_FILE
        self.doing = doing
        self.remove = remove  # unlink the file on release (a lock file beside a folder, not inside it)
        self.timeout = max(0.0, float(timeout))
        self._fd: Optional[int] = None

    def acquire(self) -> "WriterLock":
        try:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise ReadOnlyIndexError(self.folder, mount_point(self.file.parent)) from None
            raise IndexFolderError(f"index {self.folder}: cannot open its lock file: {exc.strerror}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not self.remove or _same_file(fd, self.file):
                    break
                # locked a file its last holder removed meanwhile: lock the one the name leads to now
                os.close(fd)
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
                continue
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_pid(fd)
                    for _ in range(20):  # the holder writes its pid just after it locks: give it that moment
                        if holder:
                            break
                        time.sleep(0.025)
                        holder = _read_pid(fd)
                    os.close(fd)
                    raise IndexLockedError(self.folder, holder, self.timeout, self.doing) from None
                time.sleep(self.POLL)
        try:
            with writing(self.file):
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, str(self.file)) from None
        except BaseException:
            # (a full disk: the pid cannot be written) closing drops the flock: a lock taken by a write that
            # then failed was held until the process ended, every later writer refused (issue 62); a full disk
            # is a NoSpaceError naming the lock file (HTTP 507), another failure the OSError naming it
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                if self.remove:
                    try:
                        os.unlink(self.file)  # while still held: a waiter then sees a removed file
                    except FileNotFoundError:
                        pass
            finally:
                os.close(self._fd)  # closing drops the flock
                self._fd = None

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def build_lock(path: str | Path, timeout: float = 0.0) -> WriterLock:
    """The lock of a path that may not be an index yet: ``PARENT/.NAME.lock`` (a new build holds it
    from before it starts until its commit; ``--overwrite`` and the Ray build take it too)."""
    path = Path(path)
    return WriterLock(path, timeout, file=path.parent / f".{path.name}.lock", doing="built", remove=True)


def _same_file(fd: int, file: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(file)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_pid(fd: int) -> Optional[int]:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a temporary file's writer that may still be at work)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""Edits the suite makes to a served index's files (issue 62): a byte flipped and restored by a racing writer."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path


@contextlib.contextmanager
def toggling(file: Path, at: int, mask: int, period: float = 0.0003):
    """While inside: a thread flips the byte at ``at`` of ``file`` by ``mask`` and back every ``period`` seconds
    (``os.pwrite``, so every write changes the file's stat); on exit the byte is restored."""
    original = Path(file).read_bytes()[at:at + 1]
    flipped = bytes([original[0] ^ mask])
    stop = threading.Event()

    def toggle():
        fd = os.open(file, os.O_WRONLY)
        try:
            while not stop.is_set():
                os.pwrite(fd, flipped, at)
                time.sleep(period)
                os.pwrite(fd, original, at)
                time.sleep(period)
        finally:
            os.pwrite(fd, original, at)
            os.close(fd)

    writer = threading.Thread(target=toggle, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()

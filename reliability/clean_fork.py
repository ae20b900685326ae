"""The standing suite's children — the writers it kills, the reader whose disk is full — started from a fork
server (multiprocessing's ``forkserver``): one single-threaded process that imported the index code and loaded
the model once, and forks each child. Not ``os.fork()`` of the suite's own process.

Why: by its kill part the suite's process has served HTTP requests, run searches and the CLI, and started
threads of its own (a server's, tqdm's monitor, pyarrow's allocator); a child forked from it inherits the C
libraries' thread pools and locks as they were at that moment, with none of the threads. Once in CI (seed
953648, 2026-11-29) such a forked writer spun at 100 % CPU inside the model's first matrix product for 8+
minutes and the suite waited on it: a fork of a threaded process, not anything an index does. The fork
server has run nothing but the model's load and one single-threaded encoding (pyarrow's allocator thread, started
by the imports, is its only other thread), so each child starts as a fresh process would, in milliseconds.

A child that does not end is also bounded: :func:`finish` kills it after ``timeout`` seconds and says so.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Callable, Optional

#: the model folder the fork server loads at start (its environment is the suite's when it starts)
MODEL_ENV = "AGRAME_SUITE_CHILD_MODEL"
#: what the fork server imports before it forks anything (each child has them already)
PRELOAD = ["reliability.clean_fork", "reliability.standing", "agrame.index", "agrame.index.sharded"]

_encoder = None
_encoder_from: Optional[str] = None
_context = None


def _load(model: str):
    global _encoder, _encoder_from
    import faiss  # noqa: F401 - the codec's
    import torch

    from agrame.loading import load_encoder
    from agrame.spans import split_sentences

    torch.set_num_threads(1)  # a child is one of several processes on the machine's cores
    _encoder, _encoder_from = load_encoder(model), model
    # What each child would otherwise do first, once here (of a first add's 0.55 s: nltk's import 0.41, the
    # model's fingerprint 0.09, faiss's import 0.05); on one thread, these start no thread
    split_sentences("A first passage. Its second sentence.")
    _encoder.encode_passages(["A first passage."])
    _encoder.fingerprint()
    return _encoder


if os.environ.get("AGRAME_SUITE_FORKSERVER") == "1" and os.environ.get(MODEL_ENV):
    _load(os.environ[MODEL_ENV])  # in the fork server, at its start: every child inherits the loaded model


def encoder(model: Path):
    """The model of the folder ``model`` in a child: the fork server's copy when it loaded that folder."""
    if _encoder is not None and _encoder_from == str(model):
        return _encoder
    return _load(str(model))


def start(model: Path, target: Callable, *args) -> multiprocessing.Process:
    """``target(*args)`` in a child of the fork server for ``model`` (started at the first call, its start
    waited for, so that no child's time includes it); the running child."""
    global _context
    if _context is None:
        os.environ[MODEL_ENV] = str(model)
        os.environ["AGRAME_SUITE_FORKSERVER"] = "1"
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _context = context
        try:
            warm = _context.Process(target=_nothing, daemon=True)
            warm.start()
            warm.join()
        finally:
            del os.environ["AGRAME_SUITE_FORKSERVER"]
        if warm.exitcode != 0:  # e.g. a main module a child cannot import again (python - < script)
            _context = None
            raise RuntimeError(f"the fork server's first child failed (exit {warm.exitcode}); run the suite as "
                               "python -m reliability.probes suite")
    child = _context.Process(target=target, args=args, daemon=True)
    child.start()
    return child


def finish(child: multiprocessing.Process, timeout: Optional[float]) -> Optional[int]:
    """Wait up to ``timeout`` seconds (None: for ever) for ``child``; its exit code, or None when it was
    still running and was killed (SIGKILL) then."""
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
        child.join()
        return None
    return child.exitcode


def _nothing() -> None:
    pass

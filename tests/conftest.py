"""Shared fixtures: a tiny randomly initialised BERT that encodes in milliseconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def _make_tiny_encoder(doc_maxlen: int = 24, query_maxlen: int = 8, dim: int | None = 16, seed: int = 0):
    from benchmarks.common import tiny_encoder

    return tiny_encoder(doc_maxlen=doc_maxlen, query_maxlen=query_maxlen, dim=dim, seed=seed)


@pytest.fixture(scope="session")
def tiny_encoder():
    return _make_tiny_encoder()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_encoder) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny"
    tiny_encoder.save(path)
    return path


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "other"
    _make_tiny_encoder(seed=1).save(path)
    return path


@pytest.fixture(scope="session")
def make_tiny_encoder():
    return _make_tiny_encoder


@pytest.fixture
def marked_encoder(make_tiny_encoder):
    """The tiny model with AGRaME's query markers (what a training student looks like)."""
    enc = make_tiny_encoder(doc_maxlen=64, query_maxlen=8)
    return enc.with_settings(markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"},
                             span_query_marker="Q'")


@pytest.fixture
def coral_file() -> Path:
    return Path(__file__).resolve().parent.parent / "examples" / "coral.jsonl"


# -- the fast set (issue 63): `pytest` runs it, `pytest --full` (CI) runs everything ------------------------------
#: Whole files left out of the fast set: each takes tens of seconds to minutes (the docs' blocks with real models,
#: the GPU bundle's CPU runs, the standing suite, Ray clusters, the browser, mounts, the wheel build, colbert-ai and
#: PyLate parity, e5). Measured with `pytest --full --durations=0` on 2 cores (the README, Run the tests).
SLOW_FILES = {"test_docs.py", "test_bundle.py", "test_standing_suite.py", "test_ray.py", "test_ray_nodes.py",
              "test_e5.py", "test_e5_projection.py", "test_export.py", "test_export_pylate.py", "test_browser.py",
              "test_mounts.py", "test_package.py"}
#: Single tests over ~10 s in files that are otherwise fast (same measurement).
SLOW_TESTS = {"test_a_full_disk_is_a_clear_error_and_changes_nothing", "test_two_concurrent_fresh_builds_lose_nothing_silently",
              "test_kill_9_loop_leaves_before_or_after", "test_two_concurrent_adds_lose_nothing",
              "test_rag_quickstart_example_retrieves_and_cites", "test_index_scale_smoke",
              "test_a_full_disk_under_the_server_is_507", "test_segmentation_smoke", "test_index_build_time_smoke",
              "test_a_chunked_body_over_the_limit_is_a_413_not_a_reset",
              "test_against_commit_runs_both_codes_alternately_and_leaves_both_trees_results",
              "test_concat_of_read_only_vectors_warns_nothing"}


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run every test (CI); without it, the fast set: tests marked slow, SLOW_FILES and SLOW_TESTS "
                          "(tests/conftest.py) are deselected, unless their file is named on the command line")


def _named_files(config) -> set[Path]:
    """The test files named on the command line (a file or a node id, not a folder): what a user asked for by name
    runs even when it is slow — `pytest tests/test_export_pylate.py` deselecting its only tests (and exiting 5,
    "no tests ran") is what failed CI on 2026-11-28."""
    named = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve()
        if path.is_file():
            named.add(path)
    return named


#: Files whose tests share one machine-wide resource, run one after another by one pytest-xdist worker: a Ray
#: cluster — `ray start` records its cluster in /tmp/ray, and a local `ray.init(num_cpus=…)` in another worker
#: would find it and fail.
SHARED_SCOPES = {"test_ray.py": "ray clusters", "test_ray_nodes.py": "ray clusters"}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the test extra), absent without it
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` (the README's command) hands out whole files: a file's tests run in one worker, in
    order — its module fixtures are built once, its steps (the docs' blocks of one page) share their files —
    and files of :data:`SHARED_SCOPES` go to one worker together. (pytest-xdist's own ``loadgroup`` would
    need its group marks read into the tests' ids, which pytest 9 no longer lets it write.)"""
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return ByFile(config, log)


def worker_scope(nodeid: str) -> str:
    """What one worker runs whole (:func:`pytest_xdist_make_scheduler`): the test's file, or its shared scope."""
    file = nodeid.split("::", 1)[0]
    return SHARED_SCOPES.get(Path(file).name, file)


#: Files started first on pytest-xdist's workers, longest first (`pytest --full --durations=80` on 2 cores,
#: 2026-11-29): a long file started last would keep one worker busy while the other waits.
LONGEST_FIRST = ("test_docs.py", "test_standing_suite.py", "test_bundle.py", "test_ray.py", "test_ray_nodes.py",
                 "test_reliability.py", "test_e5.py", "test_lifecycle.py", "test_data_safety.py", "test_export.py")


def _longest_first(items) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike, as xdist requires
        _longest_first(items)
    if config.getoption("--full"):
        return
    named = _named_files(config)
    keep, left = [], []
    for item in items:
        slow = (item.get_closest_marker("slow") is not None or item.path.name in SLOW_FILES
                or item.originalname in SLOW_TESTS) and Path(item.path).resolve() not in named
        (left if slow else keep).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep

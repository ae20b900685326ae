"""The fast set's selection (tests/conftest.py): a slow file named on the command line still runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ONE_MOUNTS_TEST = "test_a_full_disk_breaks_no_read_answers_507_and_the_next_write_succeeds"


def _collected(*args: str) -> tuple[int, int]:
    """(tests kept, tests deselected) for a `pytest --collect-only` run (the project's addopts make it quiet)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    tail = out.stdout.strip().splitlines()[-1]
    kept = re.search(r"(\d+)(?:/\d+)? tests? collected", tail)
    left = re.search(r"(\d+) deselected", tail)
    return (int(kept.group(1)) if kept else 0), (int(left.group(1)) if left else 0)


def test_a_slow_file_named_on_the_command_line_is_not_deselected():
    # CI's PyLate step ran `pytest tests/test_export_pylate.py`: both its tests deselected, pytest's exit 5.
    # (test_mounts.py: a slow file that every environment collects; the PyLate one skips where PyLate is absent)
    every = _collected("tests/test_mounts.py", "--full")[0]
    assert every >= 2 and _collected("tests/test_mounts.py") == (every, 0)
    assert _collected("tests/test_mounts.py::" + ONE_MOUNTS_TEST) == (1, 0)


@pytest.mark.slow  # collects every test file, twice (~30 s)
def test_a_slow_file_is_deselected_when_only_its_folder_is_named():
    kept, left = _collected("tests", "-k", "test_mounts")
    assert kept == 0 and left >= 2
    assert _collected("tests", "-k", "test_mounts", "--full")[0] >= 2


def test_the_workers_are_handed_whole_files_and_the_ray_files_together():
    # `pytest --full -n 2` (the README's command): a docs page's blocks share files in order, and two Ray
    # clusters started at once in two workers find each other (tests/conftest.py's scheduler).
    from conftest import worker_scope as scope

    assert scope("tests/test_docs.py::test_block_runs[docs/cli.md:7]") == scope("tests/test_docs.py::test_block_runs[x]")
    assert scope("tests/test_docs.py::test_block_runs[x]") != scope("tests/test_pq.py::test_pack_unpack_codes_round_trip")
    assert scope("tests/test_ray.py::test_cli_index_on_ray") == scope("tests/test_ray_nodes.py::test_a_lost_node")
    assert scope("tests/test_ray.py::a") != scope("tests/test_sharded.py::a")


def test_the_workers_start_the_longest_files_first_each_in_its_own_order():
    from types import SimpleNamespace

    from conftest import _longest_first

    items = [SimpleNamespace(path=Path(f"tests/{name}"), k=k) for k, name in
             enumerate(["test_a.py", "test_standing_suite.py", "test_docs.py", "test_a.py", "test_docs.py"])]
    _longest_first(items)
    assert [(i.path.name, i.k) for i in items] == [("test_docs.py", 2), ("test_docs.py", 4),
                                                   ("test_standing_suite.py", 1), ("test_a.py", 0), ("test_a.py", 3)]

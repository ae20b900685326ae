"""Every code block of the README and of docs/ runs as written, or says why not (issue 54).

A block runs from the repository's root (bash with ``set -e``; Python in a fresh interpreter) and
must exit 0. A block preceded by ``<!-- not run: REASON -->`` is skipped for REASON (data, a GPU, a
cluster, files of the reader's own, a server that runs until stopped). The README's table of the
default model's rows is checked against ``agrame/models/cards.json``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+\S) -->$")


def blocks(page: Path):
    """``(language, first line number, code, reason not run or None)`` of each fenced block."""
    lines = page.read_text().split("\n")
    out, k = [], 0
    while k < len(lines):
        match = FENCE.match(lines[k])
        if match and match.group(1):
            end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
            before = next((lines[j] for j in range(k - 1, -1, -1) if lines[j].strip()), "")
            reason = NOT_RUN.match(before)
            out.append((match.group(1), k + 1, "\n".join(lines[k + 1:end]), reason.group(1) if reason else None))
            k = end
        k += 1
    return out


ALL = [(page, *block) for page in PAGES for block in blocks(page)]
RUN = [b for b in ALL if b[4] is None and b[1] in ("bash", "python")]


def test_every_block_runs_or_says_why_not():
    silent = [f"{p.relative_to(REPO)}:{n} ({lang})" for p, lang, n, _, reason in ALL
              if reason is None and lang not in ("bash", "python")]
    assert silent == [], "blocks neither run nor marked"
    assert sum(page.name == "README.md" for page, *_ in RUN) >= 4  # the README's tour


@pytest.fixture(scope="session")
def docs_tmp(tmp_path_factory) -> Path:
    """Where this run's blocks write what they write under /tmp: the pages name fixed paths (for a reader
    to copy), and two runs at once would otherwise share them (a run beside the CI failed that way)."""
    return tmp_path_factory.mktemp("docs-tmp")


@pytest.mark.parametrize("page,lang,line,code,reason", RUN,
                         ids=[f"{p.relative_to(REPO)}:{n}" for p, _, n, _, _ in RUN])
def test_block_runs(page, lang, line, code, reason, docs_tmp):
    code = code.replace("/tmp/", f"{docs_tmp}/")  # blocks of one run still share their files, as a reader's do
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{page.name}:{line}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"


def test_the_readme_quotes_the_default_models_rows_as_the_cards_hold_them():
    cards = json.loads((REPO / "agrame" / "models" / "cards.json").read_text())["models"]
    rows = re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \|$", (REPO / "README.md").read_text(), re.M)
    assert len(rows) >= 5
    for name, ours, zero in rows:
        assert float(ours) == cards["gpu2100-agrame128"]["rows"][name], name
        assert float(zero) == cards["zero-shot"]["rows"][name], name


def test_every_row_of_the_peer_table_has_a_block_that_runs():
    """docs/peers.md (issue 63): each row of the table names a block of the AGRaME column (``# row: NAME``), and
    the blocks are among those run above."""
    page = REPO / "docs" / "peers.md"
    text = page.read_text()
    rows = [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| row ") and not line.startswith("|---")]
    blocks = [code.splitlines()[0] for p, _, _, code, reason in RUN if p == page]
    assert len(rows) == 8 and sorted(rows) == sorted(b.removeprefix("# row: ") for b in blocks), (rows, blocks)

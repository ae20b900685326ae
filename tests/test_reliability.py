"""Issue 52 (reliability round three): the five failures of the hostile probe, each reproduced."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agrame.corpus import Passage
from agrame.index import Index, build_index
from agrame.index.format import read_manifest, store_root
from agrame_app.cli import main

from benchmarks.safety import TEXTS


def _passages(tag: str = "p", n: int = len(TEXTS)):
    return [Passage(f"{tag}{i}", TEXTS[i % len(TEXTS)], metadata={"source": "wiki" if i % 2 else "news", "n": i})
            for i in range(n)]


@pytest.fixture
def built(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, progress=False)
    return path


# -- 1. garbage collection inside an index removes only what is provably the store's own ----------

def test_a_users_temp_shaped_folder_and_files_inside_an_index_are_kept_and_reported(built, tiny_model_dir, capsys):
    root = store_root(built, read_manifest(built))
    users = [built / ".notes.tmp-1", built / ".thesis.tmp-999999"]
    for folder in users:
        folder.mkdir()
        (folder / "t.txt").write_text("thesis")
    (built / ".draft.tmp-999999").write_text("mine")  # a file whose name is no file AGRaME writes
    (root / ".todo.tmp-999999").write_text("mine too")
    dead = [built / ".manifest.json.tmp-999999", root / ".codes.bin.tmp-999999"]  # a killed writer's own
    for file in dead:
        file.write_bytes(b"\0" * 16)
    code = main(["delete", "-i", str(built), "p1"])
    err = capsys.readouterr().err
    assert code == 0, err
    for folder in users:
        assert (folder / "t.txt").read_text() == "thesis"
    assert (built / ".draft.tmp-999999").read_text() == "mine" and (root / ".todo.tmp-999999").exists()
    assert not any(f.exists() for f in dead)
    assert "left alone" in err and ".notes.tmp-1/" in err and ".draft.tmp-999999" in err, err
    assert "removed" in err and ".codes.bin.tmp-999999" in err
    # and compaction (a new store folder) keeps them too
    index = Index(built, model=str(tiny_model_dir))
    index.compact()
    for folder in users:
        assert (folder / "t.txt").read_text() == "thesis"
    assert (built / ".draft.tmp-999999").exists()

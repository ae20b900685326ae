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


# -- 4. the Python API refuses every filter bound with the CLI's FilterError -----------------------

def _nested(op: str, depth: int) -> dict:
    spec: dict = {"n": 1}
    for _ in range(depth):
        spec = {op: [spec]} if op != "$not" else {op: spec}
    return spec


@pytest.mark.parametrize("spec", [_nested("$or", 2000), _nested("$and", 2000), _nested("$not", 2000),
                                  _nested("$or", 33), {"$or": [{"n": i} for i in range(257)]},
                                  {"n": {"$in": list(range(10_001))}}],
                         ids=["or-2000", "and-2000", "not-2000", "or-33", "wide-257", "in-10001"])
def test_every_filter_bound_is_a_filter_error_in_the_python_api(built, tiny_encoder, spec):
    from agrame.index.metadata import FilterError

    index = Index(built, model=tiny_encoder)
    for call in (lambda: index.search("coral", "passage", filter=spec),
                 lambda: index.search("coral", "sentence", filter=spec, exact=True),
                 lambda: index.rank_ids("coral", ["p1"], filter=spec),
                 lambda: index.delete_where(spec)):
        with pytest.raises(FilterError):
            call()
    assert len(index) == len(TEXTS)

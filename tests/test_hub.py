"""Hugging Face names (issue 63, item 2): ``org/name[@revision]`` wherever a model is named, through
huggingface_hub and a cache laid out as the hub lays it out (blobs, snapshots of symlinks, refs), offline."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agrame import Ranker
from agrame.encoder import ModelError
from agrame.export import export
from agrame.hub import is_hub_name, split_name
from agrame.index import Index, build_index
from agrame.loading import load_encoder
from agrame_app.cli import main

PASSAGES = [{"id": "a", "text": "Coral reefs bleach when the water is too warm."},
            {"id": "b", "text": "The Eiffel Tower was built in 1889."}]


def _publish(cache: Path, repo: str, folder: Path, commit: str, ref: str = "main") -> None:
    """Lay ``folder`` out in ``cache`` as huggingface_hub's downloads do: content-addressed blobs,
    ``snapshots/<commit>/`` of relative symlinks to them, ``refs/<ref>`` holding the commit."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = root / "snapshots" / commit / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)


COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLDER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny_encoder, tiny_model_dir, other_model_dir):
    cache = tmp_path / "hf" / "hub"
    _publish(cache, "acme/tiny", tiny_model_dir, COMMIT)
    _publish(cache, "acme/tiny", other_model_dir, OLDER, ref="v0")  # an older revision, by tag
    folders = {"acme/tiny": tiny_model_dir}
    for fmt in ("stanford", "pylate"):
        folders[f"acme/tiny-{fmt}"] = export(tiny_encoder, tmp_path / fmt, fmt)
        _publish(cache, f"acme/tiny-{fmt}", folders[f"acme/tiny-{fmt}"], COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folders


def test_names_are_recognised_and_folders_win(tmp_path, monkeypatch):
    assert split_name("colbert-ir/colbertv2.0") == ("colbert-ir/colbertv2.0", None)
    assert split_name("lightonai/GTE-ModernColBERT-v1@main") == ("lightonai/GTE-ModernColBERT-v1", "main")
    for not_a_name in ("zero-shot", "a/b/c", "../x", "/abs/path", "org/", "org/name@"):
        assert split_name(not_a_name) is None, not_a_name
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_name("org/model")  # a folder of that relative path is loaded as a folder


@pytest.mark.parametrize("repo", ["acme/tiny", "acme/tiny-stanford", "acme/tiny-pylate"])
def test_a_hub_name_loads_from_the_cache_offline(hub, repo):
    """Each kind of checkpoint is recognised by its files, and loads as its folder does."""
    encoder = load_encoder(repo)
    assert encoder.source == f"{repo}@{COMMIT}"
    from_folder = load_encoder(hub[repo])
    assert encoder.fingerprint() == from_folder.fingerprint() and encoder.settings == from_folder.settings
    hits = Ranker(repo).rank("warm water coral", PASSAGES, granularity="sentence", top_k=2)
    expected = Ranker(from_folder).rank("warm water coral", PASSAGES, granularity="sentence", top_k=2)
    assert [(h.passage_id, h.start, h.score) for h in hits] == [(h.passage_id, h.start, h.score) for h in expected]


def test_a_revision_pin_loads_that_revision(hub, tiny_encoder, other_model_dir):
    assert load_encoder(f"acme/tiny@{COMMIT}").fingerprint() == tiny_encoder.fingerprint()
    older = load_encoder("acme/tiny@v0")
    assert older.fingerprint() == load_encoder(other_model_dir).fingerprint() != tiny_encoder.fingerprint()
    assert older.source == f"acme/tiny@{OLDER}"


def test_an_index_records_the_commit_and_loads_it_again(hub, tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(load_encoder("acme/tiny"), PASSAGES, path, progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"]["name"] == f"acme/tiny@{COMMIT}"
    assert Index(path).search("coral", "passage", top_k=1)[0].passage_id == "a"


def test_a_model_not_cached_offline_is_exit_2_saying_so(hub, tmp_path, capsys):
    passages = tmp_path / "p.jsonl"
    passages.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    assert main(["rank", "-q", "coral", "-p", str(passages), "--model", "acme/tiny"]) == 0
    capsys.readouterr()
    assert main(["rank", "-q", "coral", "-p", str(passages), "--model", "colbert-ir/colbertv2.0"]) == 2
    err = capsys.readouterr().err
    assert "colbert-ir/colbertv2.0" in err and "not in the Hugging Face cache" in err and "HF_HUB_OFFLINE" in err
    assert "Traceback" not in err
    with pytest.raises(ModelError, match="revision 'v9'"):
        load_encoder("acme/tiny@v9")


def test_train_and_serve_take_a_hub_name(hub, tmp_path, capsys):
    """`agrame train --model org/name` starts from the hub's snapshot; the served index loads it by its name."""
    out = tmp_path / "trained"
    examples = Path(__file__).resolve().parent.parent / "examples"
    assert main(["train", "--pairs", str(examples / "train_pairs.jsonl"), "--corpus", str(examples / "coral.jsonl"), "--out",
                 str(out), "--model", "acme/tiny", "--steps", "1", "--batch-size", "2", "--heldout", "0"]) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "train.json").read_text())["start"] == "acme/tiny"
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    path = tmp_path / "ix"
    build_index(load_encoder("acme/tiny"), PASSAGES, path, progress=False)
    client = TestClient(create_app(path, model="acme/tiny"))
    assert client.post("/search", json={"query": "coral", "top_k": 1}).status_code == 200

"""Smoke tests with the real default model (gpu2100-agrame128, a delta over all-MiniLM-L6-v2) and the
other shipped models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agrame_app.cli import main


@pytest.mark.slow
def test_default_model_puts_the_answer_sentence_first(capsys, coral_file):
    code = main(["rank", "--granularity", "sentence", "--query", "What causes coral bleaching?",
                 "--passages", str(coral_file), "--format", "jsonl", "--top-k", "3"])
    assert code == 0
    top = json.loads(capsys.readouterr().out.splitlines()[0])
    assert top["passage_id"] == "coral-reefs"
    assert top["text"].startswith("Warming ocean waters cause coral bleaching")


@pytest.mark.slow
def test_cite_example_cites_both_passages_for_the_mixed_sentence(capsys):
    """The bundled PropCite example: sentence 2 mixes a fact of passage 1 and one of passage 2."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "examples"
    code = main(["cite", "--answer", str(root / "curie_answer.txt"), "--passages", str(root / "curie_passages.jsonl"),
                 "--format", "jsonl"])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cited = [set(r["citations"]) for r in rows]
    assert cited == [{"curie-early-life"}, {"curie-early-life", "curie-chemistry"}, {"curie-chemistry"}]


@pytest.mark.slow
def test_default_is_the_128d_student_and_named_models_load_verified():
    from agrame.loading import DEFAULT_MODEL, load_encoder, named_models
    from agrame.index.format import model_name

    zero_shot = load_encoder("zero-shot")
    assert zero_shot.projection is None and zero_shot.source.startswith("zero-shot")
    default = load_encoder()
    # issue 51: the default is the shipped 128-d student, and an index built with it records its name
    assert DEFAULT_MODEL == "gpu2100-agrame128" and model_name(default) == "gpu2100-agrame128"
    assert default.fingerprint() == load_encoder("gpu2100-agrame128").fingerprint() != zero_shot.fingerprint()
    assert {"squad-a1", "zero-shot-128", "gpu2100-agrame", "gpu2100-agrame128"} <= set(named_models())
    gpu = load_encoder("gpu2100-agrame")  # rebuilt on MiniLM; a fingerprint mismatch raises
    # the fingerprint its full-protocol rows in benchmarks/results were measured with (tag gpu-agrame)
    assert gpu.fingerprint()[:12] == "a23430e88708" and gpu.dim == 384 and gpu.projection is None
    assert gpu.settings.markers["Q'"] == "[unused2]" and gpu.settings.markers["Q"] is None
    gpu128 = load_encoder("gpu2100-agrame128")  # its rows' fingerprint (tag gpu-agrame128-g2000)
    assert gpu128.fingerprint()[:12] == "7648f802339c" and gpu128.dim == 128
    assert gpu128.settings.markers["Q'"] == "[unused2]" and gpu128.settings.alpha == 0.5
    a1 = load_encoder("squad-a1")  # a fingerprint mismatch raises
    assert a1.dim == 128 and a1.settings.markers["Q"] == "[unused0]"
    compact = load_encoder("zero-shot-128")
    assert compact.dim == 128 and compact.settings.markers["Q"] is None
    # Same backbone as zero-shot: only the projection was added.
    for a, b in zip(compact.backbone.state_dict().values(), zero_shot.backbone.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_index_built_with_the_earlier_default_opens_with_its_new_name(tmp_path):
    """An index whose manifest says "default" but whose fingerprint is squad-a1's (built before
    the default became zero-shot) loads squad-a1; another model is refused naming it."""
    from agrame.loading import load_encoder
    from agrame.index import Index, build_index
    from agrame.index.format import IndexFolderError, read_manifest, write_manifest

    a1 = load_encoder("squad-a1")
    path = build_index(a1, ["Coral reefs bleach in warm water.", "The tower is tall."], tmp_path / "idx",
                       progress=False)
    manifest = read_manifest(path)
    manifest["model"]["name"] = "default"
    manifest["model"]["source"] = "default:agrame-minilm"
    write_manifest(path, manifest)
    index = Index(path)
    assert index.encoder.fingerprint() == a1.fingerprint()
    assert index.search("coral bleaching", granularity="passage", top_k=1)[0].passage_id == "0"
    with pytest.raises(IndexFolderError, match="--model squad-a1"):
        Index(path, model="zero-shot").search("coral", granularity="passage")


@pytest.mark.slow
def test_student_starts_from_untrained_minilm():
    """A training run must not start from the shipped model (it did once: A3 crashed on its projection)."""
    from agrame.loading import load_encoder
    from agrame.training.student import student_encoder

    student = student_encoder(128, False, 256)
    zero_shot = load_encoder("zero-shot")
    for a, b in zip(student.backbone.state_dict().values(), zero_shot.backbone.state_dict().values()):
        assert torch.equal(a, b)
    assert student.projection.weight.shape == (128, 384)


@pytest.mark.slow
def test_student_without_projection_round_trips(tmp_path):
    """``--dim 0`` trains MiniLM's own 384-d vectors: the saved model must say ``dim: null``, not 0
    (a 0 asks the loader for a projection file that is not there)."""
    from agrame.loading import load_encoder
    from agrame.training.student import student_encoder

    student = student_encoder(0, False, 256)
    assert student.projection is None and student.settings.dim is None
    student.save(tmp_path / "s")
    loaded = load_encoder(tmp_path / "s")
    assert loaded.projection is None and loaded.dim == 384


@pytest.mark.slow
def test_unmarked_student_ranks_passages_as_zero_shot(tmp_path):
    """``--query-marker none``: before training, the student's passage queries and passages are
    zero-shot MiniLM's own vectors (the mix's λ = 0 is then zero-shot, not zero-shot plus an
    untrained [Q]); sentence queries keep [Q']. Saved and loaded, the marker stays off."""
    from agrame.delta import export_delta
    from agrame.loading import load_encoder
    from agrame.training.student import start_from, student_encoder

    zero_shot = load_encoder("zero-shot")
    question, passage = "what causes coral bleaching", "Coral bleaches when the water is too warm."
    for marker, same in ((None, True), ("[unused0]", False)):
        student = student_encoder(0, False, 256, query_marker=marker)
        start_from(student, zero_shot)
        student.save(tmp_path / str(marker))
        export_delta(load_encoder(tmp_path / str(marker)), tmp_path / f"{marker}-delta")  # as it would ship
        loaded = load_encoder(tmp_path / f"{marker}-delta")
        assert (loaded.marker_id("Q") is None) == same and loaded.marker_id("Q'") is not None
        q, z = loaded.encode_query(question, "Q").vectors, zero_shot.encode_query(question, "Q").vectors
        assert (q.shape == z.shape and torch.allclose(q, z, atol=1e-5)) == same
        assert torch.allclose(loaded.encode_passages([passage])[0].vectors,
                              zero_shot.encode_passages([passage])[0].vectors, atol=1e-5)


@pytest.mark.slow
def test_rag_quickstart_example_retrieves_and_cites(tmp_path):
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "rag_quickstart.py"
    out = subprocess.run([sys.executable, str(example), "--index", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert "indexed 7 passages" in out.stdout
    first = [line for line in out.stdout.splitlines() if line.strip().startswith("1. [")][0]
    assert "curie-early-life" in first and "Warsaw" in first  # the birthplace sentence ranks first
    assert "→ curie-early-life" in out.stdout and "→ curie-chemistry" in out.stdout


LEGACY_ZERO_SHOT = Path(__file__).resolve().parent / "data" / "index-zero-shot-main-2026-11-27"


@pytest.mark.slow
def test_a_folder_written_by_the_zero_shot_default_opens_and_searches_with_its_own_model(tmp_path, capsys):
    """A copy of an index `agrame index` wrote before issue 51 (zero-shot MiniLM was the default;
    built by the main of 2026-11-27 from examples/coral.jsonl): searched, explained and extended
    without --model, with zero-shot MiniLM, and its results are zero-shot's."""
    import shutil

    from agrame.index import Index

    path = tmp_path / "legacy"
    shutil.copytree(LEGACY_ZERO_SHOT, path)
    index = Index(path)
    assert index.encoder.source.startswith("zero-shot") and index.encoder.dim == 384
    hits = index.search("What causes coral bleaching?", granularity="sentence", top_k=1)
    assert hits[0].passage_id == "coral-reefs" and hits[0].text.startswith("Warming ocean waters")
    assert main(["search", "-i", str(path), "-g", "passage", "-f", "jsonl", "-k", "1", "bleaching corals"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["passage_id"] == "coral-reefs"
    assert main(["explain", "-i", str(path), "--id", "coral-reefs", "-f", "json", "-q", "coral bleaching"]) == 0
    capsys.readouterr()
    new = tmp_path / "more.jsonl"
    new.write_text(json.dumps({"id": "kelp", "text": "Kelp forests grow in cold, nutrient-rich water."}) + "\n")
    assert main(["index", "--add", "-p", str(new), "-i", str(path)]) == 0
    assert Index(path).search("kelp forests", granularity="passage", top_k=1)[0].passage_id == "kelp"


@pytest.mark.slow
def test_index_built_with_zero_shot_keeps_its_model_and_refuses_another_by_name(tmp_path, coral_file, capsys):
    """--model zero-shot builds; search, explain, serve and --upsert then use zero-shot without being told;
    a --model other than the index's is refused naming both (exit 2)."""
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    path = tmp_path / "idx"
    assert main(["index", "-p", str(coral_file), "-i", str(path), "--model", "zero-shot"]) == 0
    assert json.loads((path / "manifest.json").read_text())["model"]["name"] == "zero-shot"
    assert main(["search", "-i", str(path), "-g", "sentence", "-f", "jsonl", "-k", "1",
                 "What causes coral bleaching?"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["text"].startswith("Warming ocean waters")
    assert main(["search", "-i", str(path), "--model", "gpu2100-agrame128", "coral"]) == 2
    err = capsys.readouterr().err
    assert "built with model zero-shot" in err and "gpu2100-agrame128" in err
    changed = tmp_path / "changed.jsonl"
    changed.write_text(json.dumps({"id": "coral-reefs", "text": "Reefs bleach when the sea is too warm."}) + "\n")
    assert main(["index", "--upsert", "-p", str(changed), "-i", str(path)]) == 0
    assert main(["explain", "-i", str(path), "--id", "coral-reefs", "-f", "json", "-q", "warm sea"]) == 0
    capsys.readouterr()
    client = TestClient(create_app(str(path)))
    health = client.get("/health").json()
    assert health["model"].startswith("zero-shot")
    top = client.post("/search", json={"query": "warm sea", "granularity": "passage", "top_k": 1}).json()
    assert top["results"][0]["passage_id"] == "coral-reefs"


@pytest.mark.slow
def test_a_damaged_or_edited_model_folder_is_refused_by_its_fingerprint(tmp_path):
    import shutil

    from agrame.encoder import ModelError
    from agrame.loading import load_encoder, named_models

    half = tmp_path / "half"
    shutil.copytree(named_models()["gpu2100-agrame128"], half)
    data = (half / "delta.safetensors").read_bytes()
    (half / "delta.safetensors").write_bytes(data[: len(data) // 2])  # a half-finished copy
    with pytest.raises(ModelError, match="cannot be read"):
        load_encoder(half)
    edited = tmp_path / "edited"
    shutil.copytree(named_models()["gpu2100-agrame128"], edited)
    settings = json.loads((edited / "agrame.json").read_text())
    settings["doc_maxlen"] = 128  # a document-side setting: another model than the one measured
    (edited / "agrame.json").write_text(json.dumps(settings))
    with pytest.raises(ModelError, match="fingerprint"):
        load_encoder(edited)
    assert main(["rank", "-m", str(half), "-q", "coral", "-p", "-"]) == 2


def test_a_model_name_that_is_not_shipped_exits_2_listing_the_shipped_ones(capsys, coral_file):
    assert main(["rank", "--model", "gpu9999-agrame", "-q", "coral", "-p", str(coral_file)]) == 2
    err = capsys.readouterr().err
    assert "gpu9999-agrame" in err and "gpu2100-agrame128" in err and "zero-shot" in err


def test_models_lists_the_default_first_with_its_rows_beside_zero_shot(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[1]
    assert first.startswith("gpu2100-agrame128 (default)") and " 128 " in first and "7648f802339c" in first
    assert "squad-dev sentence P@1" in out and "zero-shot" in out
    assert main(["models", "-f", "jsonl"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    default = next(m for m in listed if m["default"])
    zero = next(m for m in listed if m["name"] == "zero-shot")
    assert default["dim"] == 128 and default["bytes_per_token"] <= 40 and zero["dim"] == 384
    # each number comes from a committed result file (python -m benchmarks.shipping cards)
    assert default["rows"]["squad-dev sentence P@1"] >= zero["rows"]["squad-dev sentence P@1"] + 3

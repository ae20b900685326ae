"""Smoke test with the real default model (all-MiniLM-L6-v2 weights, zero-shot)."""

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
def test_default_is_zero_shot_until_a_trained_model_ships_and_named_models_load_verified():
    from agrame.delta import is_delta
    from agrame.encoder import SHIPPED_MODEL, load_encoder, named_models

    zero_shot = load_encoder("zero-shot")
    assert zero_shot.projection is None and zero_shot.source.startswith("zero-shot")
    default = load_encoder()
    if is_delta(SHIPPED_MODEL):  # a trained default: rebuilt on MiniLM, fingerprint-verified
        assert default.source == "default:agrame-minilm"
    else:
        assert default.fingerprint() == zero_shot.fingerprint()
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
    from agrame.encoder import load_encoder
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
    from agrame.encoder import load_encoder
    from training.student import student_encoder

    student = student_encoder(128, False, 256)
    zero_shot = load_encoder("zero-shot")
    for a, b in zip(student.backbone.state_dict().values(), zero_shot.backbone.state_dict().values()):
        assert torch.equal(a, b)
    assert student.projection.weight.shape == (128, 384)


@pytest.mark.slow
def test_student_without_projection_round_trips(tmp_path):
    """``--dim 0`` trains MiniLM's own 384-d vectors: the saved model must say ``dim: null``, not 0
    (a 0 asks the loader for a projection file that is not there)."""
    from agrame.encoder import load_encoder
    from training.student import student_encoder

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
    from agrame.encoder import load_encoder
    from training.student import start_from, student_encoder

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

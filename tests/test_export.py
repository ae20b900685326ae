"""Export to the Stanford ColBERT and PyLate formats, checked with the real colbert-ai 0.2.22 (PyLate's own
check is ``tests/test_export_pylate.py``, in PyLate's environment): every token encoded like AGRaME; both
folders load back in AGRaME."""

from __future__ import annotations

import json

import pytest
import torch

from agrame.encoder import ModelError
from agrame.loading import load_encoder
from agrame.export import compatibility, export
from agrame_app.cli import main

TEXTS = ["Coral reefs bleach when the water is too warm. Fish swim away!",
         "The Eiffel Tower (Paris) was built in 1889, by Gustave Eiffel's company.",
         "Marie Curie won two Nobel Prizes; radium and polonium were hers."]
QUERIES = ["coral bleaching", "eiffel tower?"]  # within the tiny model's query_maxlen (8)


def _colbert_order(vectors: torch.Tensor) -> torch.Tensor:
    # AGRaME keeps [CLS] [D] [SEP] first, then the passage's tokens; colbert-ai keeps sequence order.
    return torch.cat([vectors[:2], vectors[3:], vectors[2:3]])


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_encoder):
    root = tmp_path_factory.mktemp("export")
    return {fmt: export(tiny_encoder, root / fmt, fmt) for fmt in ("stanford", "pylate")}


SHORT = ["Coral reefs bleach.", "Fish swim away from warm water."]  # within the tiny model's doc_maxlen (24)


def test_stanford_folder_encodes_like_agrame_in_colbert_ai(exported, tiny_encoder):
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    checkpoint = Checkpoint(str(exported["stanford"]), colbert_config=ColBERTConfig())
    flat, lengths = checkpoint.docFromText(SHORT, bsize=8, keep_dims="flatten")
    for theirs, ours in zip(torch.split(flat, lengths), tiny_encoder.encode_passages(SHORT)):
        ours = _colbert_order(ours.vectors)
        assert theirs.shape == ours.shape and (theirs.float() * ours).sum(-1).min() > 0.999
    # a passage longer than doc_maxlen: colbert-ai truncates it (AGRaME windows it, keeping every token)
    long = [" ".join(TEXTS * 2)]
    _, lengths = checkpoint.docFromText(long, bsize=8, keep_dims="flatten")
    assert lengths[0] <= tiny_encoder.settings.doc_maxlen < len(tiny_encoder.encode_passages(long)[0].vectors)
    queries = checkpoint.queryFromText(QUERIES)
    for theirs, text in zip(queries, QUERIES):
        ours = tiny_encoder.encode_query(text, "Q").vectors  # padded with [MASK] like colbert-ai
        assert theirs.shape == ours.shape and (theirs.float() * ours).sum(-1).min() > 0.999


def test_both_formats_load_back_in_agrame(exported, make_tiny_encoder):
    tiny = make_tiny_encoder()
    want = tiny.encode_passages(TEXTS)
    for fmt, path in exported.items():
        back = load_encoder(path)
        assert back.dim == tiny.dim and back.settings.doc_maxlen == tiny.settings.doc_maxlen
        assert back.marker_id("Q") == tiny.marker_id("Q") and back.marker_id("D") == tiny.marker_id("D")
        for a, b in zip(back.encode_passages(TEXTS), want):
            assert torch.allclose(a.vectors, b.vectors, atol=1e-5) and torch.equal(a.offsets, b.offsets)
        if fmt == "pylate":
            assert back.settings.query_augmentation  # PyLate pads queries; the loaded model does too


def test_models_without_a_projection_or_with_prefixes(tmp_path, make_tiny_encoder):
    unprojected = make_tiny_encoder(dim=None)
    path = export(unprojected, tmp_path / "st", "stanford")
    meta = json.loads((path / "artifact.metadata").read_text())
    assert meta["dim"] == 32  # the identity keeps the backbone's width
    back = load_encoder(path)
    a, b = back.encode_passages(TEXTS[:1])[0], unprojected.encode_passages(TEXTS[:1])[0]
    assert torch.allclose(a.vectors, b.vectors, atol=1e-5)
    with pytest.raises(ModelError, match="text prefixes"):
        export(unprojected.with_settings(query_prefix="query:"), tmp_path / "e5", "pylate")
    with pytest.raises(ModelError, match="not empty"):
        export(unprojected, tmp_path / "st", "stanford")
    unmarked = unprojected.with_settings(markers={"Q": None, "Q'": None, "D": "[unused1]"}, query_augmentation=False)
    assert any("no [Q] marker" in n for n in compatibility(unmarked))


def test_cli_export(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "pl"
    assert main(["export", "--model", str(tiny_model_dir), "--format", "pylate", str(out)]) == 0
    assert (out / "1_Dense" / "model.safetensors").exists() and "differs from AGRaME" in capsys.readouterr().err
    assert main(["export", "--model", str(tiny_model_dir), "--format", "pylate", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_model_encodes_alike_in_colbert_ai(tmp_path):
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    encoder = load_encoder("squad-a1")
    st = export(encoder, tmp_path / "st", "stanford")
    ours = [_colbert_order(e.vectors) for e in encoder.encode_passages(TEXTS)]
    flat, lengths = Checkpoint(str(st), colbert_config=ColBERTConfig()).docFromText(TEXTS, bsize=8,
                                                                                     keep_dims="flatten")
    for a, c in zip(torch.split(flat.float(), lengths), ours):
        assert a.shape == c.shape and (a * c).sum(-1).min() > 0.999

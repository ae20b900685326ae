"""Encoder: markers, query augmentation, windows for long passages, checkpoint formats."""

from __future__ import annotations

import json
import string

import pytest
import torch

from agrame.encoder import EncoderSettings, ModelError
from agrame.loading import load_encoder
from agrame.spans import span_token_mask


def content_tokens(encoder, text):
    enc = encoder.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    punct = encoder._punctuation_ids()
    return [tuple(o) for i, o in zip(enc["input_ids"], enc["offset_mapping"]) if i not in punct]


def test_markers_resolve_to_unused_rows(tiny_encoder):
    vocab = tiny_encoder.tokenizer.get_vocab()
    assert tiny_encoder.marker_id("Q") == vocab["[unused0]"]
    assert tiny_encoder.marker_id("D") == vocab["[unused1]"]
    assert tiny_encoder.marker_id("Q'") == vocab["[unused2]"]


def test_query_is_padded_with_mask_tokens_and_never_truncated(tiny_encoder):
    short = tiny_encoder.encode_query("coral reefs", "Q")
    assert short.vectors.shape == (tiny_encoder.settings.query_maxlen, tiny_encoder.dim)
    assert torch.allclose(short.vectors.norm(dim=-1), torch.ones(short.vectors.shape[0]), atol=1e-5)
    long_text = " ".join(["reef"] * 20)
    long = tiny_encoder.encode_query(long_text, "Q")
    assert long.vectors.shape[0] == 20 + 3  # [CLS] [Q] 20 tokens [SEP], nothing cut
    assert span_token_mask(long.offsets, [(0, len(long_text))]).sum() == 20


def test_both_query_markers_in_one_batch_match_separate_encodings(tiny_encoder):
    texts = ["what causes coral bleaching?", "a much longer question about reefs and their fish"]
    both = tiny_encoder.encode_queries(texts, ("Q", "Q'"))
    for m, marker in enumerate(("Q", "Q'")):
        for i, text in enumerate(texts):
            alone = tiny_encoder.encode_query(text, marker)
            assert torch.allclose(both[m][i].vectors, alone.vectors, atol=1e-5)
    assert not torch.allclose(both[0][0].vectors, both[1][0].vectors)


def test_passage_encoding_is_independent_of_batch_padding(tiny_encoder):
    texts = ["short one.", "a somewhat longer passage about coral reefs and warm water"]
    together = tiny_encoder.encode_passages(texts)
    for text, enc in zip(texts, together):
        alone = tiny_encoder.encode_passages([text])[0]
        assert torch.allclose(enc.vectors, alone.vectors, atol=1e-5)
        assert torch.equal(enc.offsets, alone.offsets)


@pytest.mark.parametrize("n_words", [1, 20, 21, 22, 60, 500])
def test_long_passages_keep_every_token(tiny_encoder, n_words):
    # doc_maxlen 24 → 21 tokens per window: these sizes hit one window, the border and many windows.
    text = " ".join(f"w{i % 7}" if i % 3 else "reef" for i in range(n_words))
    enc = tiny_encoder.encode_passages([text])[0]
    expected = content_tokens(tiny_encoder, text)
    got = [tuple(o) for o in enc.offsets.tolist() if o[1] > o[0]]
    assert got == expected
    assert enc.vectors.shape[0] == len(expected) + 3  # plus [CLS] [D] [SEP]


def test_window_vectors_come_from_the_most_central_window(tiny_encoder):
    width = tiny_encoder._window_width()
    text = " ".join(["reef"] * (3 * width))
    enc = tiny_encoder.encode_passages([text])[0]
    starts = tiny_encoder._windows(3 * width)
    assert len(starts) > 2
    # A token in the middle of the second window equals that window encoded on its own.
    second = " ".join(["reef"] * width)
    middle = starts[1] + width // 2
    window_alone = tiny_encoder.encode_passages([second])[0]
    assert torch.allclose(enc.vectors[3 + middle], window_alone.vectors[3 + width // 2], atol=1e-5)


def test_spans_across_window_borders_map_to_tokens(tiny_encoder):
    words = [f"tok{i}" for i in range(80)]
    text = " ".join(words)
    enc = tiny_encoder.encode_passages([text])[0]
    width = tiny_encoder._window_width()
    for start in tiny_encoder._windows(len(content_tokens(tiny_encoder, text)))[1:]:
        # A character span around the first token of every later window.
        s, e = content_tokens(tiny_encoder, text)[start - 1][0], content_tokens(tiny_encoder, text)[start][1]
        assert span_token_mask(enc.offsets, [(s, e)]).sum() >= 2
    assert width > 0


def test_punctuation_is_masked_from_passages(tiny_encoder):
    enc = tiny_encoder.encode_passages(["reefs , fish ; and ( water ) !"])[0]
    text = "reefs , fish ; and ( water ) !"
    kept = [text[s:e] for s, e in enc.offsets.tolist() if e > s]
    assert kept == ["reefs", "fish", "and", "water"]
    assert not any(k in string.punctuation for k in kept)


def test_checkpoint_round_trip(tiny_encoder, tiny_model_dir):
    loaded = load_encoder(tiny_model_dir)
    assert loaded.fingerprint() == tiny_encoder.fingerprint()
    a = tiny_encoder.encode_passages(["coral reefs bleach in warm water"])[0]
    b = loaded.encode_passages(["coral reefs bleach in warm water"])[0]
    assert torch.allclose(a.vectors, b.vectors, atol=1e-6)


def test_fingerprint_distinguishes_models(tiny_encoder, other_model_dir):
    assert load_encoder(other_model_dir).fingerprint() != tiny_encoder.fingerprint()


def test_stanford_colbert_checkpoint_loads(tmp_path, tiny_encoder):
    from safetensors.torch import save_file

    folder = tmp_path / "colbert"
    tiny_encoder.backbone.save_pretrained(folder)
    tiny_encoder.tokenizer.save_pretrained(folder)
    weights = {f"bert.{k}": v.contiguous() for k, v in tiny_encoder.backbone.state_dict().items()}
    weights["linear.weight"] = tiny_encoder.projection.weight.detach().contiguous()
    (folder / "model.safetensors").unlink()
    save_file(weights, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "artifact.metadata").write_text(json.dumps(
        {"query_maxlen": 8, "doc_maxlen": 24, "dim": 16, "mask_punctuation": True,
         "query_token_id": "[unused0]", "doc_token_id": "[unused1]"}))
    colbert = load_encoder(folder)
    assert colbert.settings.span_query_marker == "Q"
    assert colbert.dim == 16
    text = "coral reefs bleach in warm water"
    assert torch.allclose(colbert.encode_passages([text])[0].vectors,
                          tiny_encoder.encode_passages([text])[0].vectors, atol=1e-5)
    assert torch.allclose(colbert.encode_query("why?", "Q").vectors,
                          tiny_encoder.encode_query("why?", "Q").vectors, atol=1e-5)


def test_missing_and_malformed_model_paths(tmp_path, tiny_model_dir):
    with pytest.raises(ModelError, match="does not exist"):
        load_encoder(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelError, match="not a folder"):
        load_encoder(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="not a model folder"):
        load_encoder(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "agrame.json").write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        load_encoder(broken)
    (broken / "agrame.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ModelError, match="format"):
        load_encoder(broken)
    no_proj = tmp_path / "no-proj"
    import shutil
    shutil.copytree(tiny_model_dir, no_proj)
    (no_proj / "projection.safetensors").unlink()
    with pytest.raises(ModelError, match="projection"):
        load_encoder(no_proj)
    bad_settings = tmp_path / "bad-settings"
    shutil.copytree(tiny_model_dir, bad_settings)
    meta = json.loads((bad_settings / "agrame.json").read_text())
    meta["bogus"] = 1
    (bad_settings / "agrame.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="unknown settings"):
        load_encoder(bad_settings)


def test_settings_validation():
    with pytest.raises(ModelError):
        EncoderSettings(doc_maxlen=16, doc_overlap=20).validate()
    with pytest.raises(ModelError):
        EncoderSettings(span_query_marker="X").validate()


def test_with_settings_shares_weights_and_changes_markers(tiny_encoder):
    unmarked = tiny_encoder.with_settings(markers={"Q": None, "Q'": None, "D": "[unused1]"})
    assert unmarked.backbone is tiny_encoder.backbone
    assert unmarked.marker_id("Q") is None and tiny_encoder.marker_id("Q") is not None
    assert unmarked.encode_query("reef", "Q").vectors.shape[0] == tiny_encoder.settings.query_maxlen
    # [CLS] reef [SEP] + masks: the unmarked query has one real token fewer before the masks
    assert not torch.allclose(unmarked.encode_query("reef", "Q").vectors, tiny_encoder.encode_query("reef", "Q").vectors)
    assert unmarked.same_query_encoding("Q", "Q'") and not tiny_encoder.same_query_encoding("Q", "Q'")


def test_default_zero_shot_settings_use_no_query_markers():
    from agrame.backbones import zero_shot_settings

    settings = zero_shot_settings()
    assert settings.dim is None
    assert settings.markers["Q"] is None and settings.markers["Q'"] is None
    assert settings.markers["D"] == "[unused1]"
    assert settings.query_augmentation is False


def test_fingerprint_ignores_query_side_settings_only(tiny_encoder):
    base = tiny_encoder.fingerprint()
    assert tiny_encoder.with_settings(query_augmentation=False, alpha=2.0, span_query_marker="Q",
                                      markers={"Q": None, "Q'": None, "D": "[unused1]"}).fingerprint() == base
    assert tiny_encoder.with_settings(doc_maxlen=30).fingerprint() != base
    assert tiny_encoder.with_settings(markers={"Q": "[unused0]", "Q'": "[unused2]", "D": None}).fingerprint() != base
    assert tiny_encoder.with_settings(mask_punctuation=False).fingerprint() != base


def test_query_augmentation_setting(tiny_encoder):
    plain = tiny_encoder.with_settings(query_augmentation=False)
    assert plain.encode_query("coral reefs", "Q").vectors.shape[0] == 2 + 3  # [CLS] [Q] 2 tokens [SEP]
    assert tiny_encoder.encode_query("coral reefs", "Q").vectors.shape[0] == tiny_encoder.settings.query_maxlen


def test_delta_roundtrip_and_fingerprint_check(tmp_path, make_tiny_encoder, tiny_model_dir):
    """A model saved as a delta over a base rebuilds to the same fingerprint; tampering is refused."""
    import json

    from agrame.delta import export_delta, load_delta
    from agrame.encoder import ModelError
    from agrame.loading import load_encoder

    base_dir = tiny_model_dir
    trained = load_encoder(base_dir).with_settings(markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"})
    with torch.no_grad():
        weight = trained.backbone.encoder.layer[-1].output.dense.weight
        weight.add_(0.01 * torch.linspace(-1, 1, weight.numel()).reshape(weight.shape))
        trained.backbone.get_input_embeddings().weight[1].add_(0.5)  # the [Q] row
    meta = export_delta(trained, tmp_path / "delta", base_path=base_dir)
    assert meta["embedding_rows"] == [1]
    assert "int8.encoder.layer.1.output.dense.weight" in meta["tensors"]  # a matrix: its difference, int8
    assert "backbone.encoder.layer.1.output.dense.bias" not in meta["tensors"]  # unchanged vector
    assert not any("layer.0" in t for t in meta["tensors"])  # untouched tensors are not stored
    rebuilt = load_delta(tmp_path / "delta", base_path=base_dir)
    assert rebuilt.fingerprint() == meta["fingerprint"]
    text = "Coral reefs bleach when the water warms."
    a = trained.encode_passages([text])[0].vectors
    b = rebuilt.encode_passages([text])[0].vectors
    assert torch.allclose(a, b, atol=2e-2)  # float16 / int8 storage of the changes
    changed = trained.backbone.encoder.layer[-1].output.dense.weight
    restored = rebuilt.backbone.encoder.layer[-1].output.dense.weight
    assert (changed - restored).abs().max() <= 0.01 / 254 + 1e-6  # int8 error bound: max|Δ| / 254
    info = json.loads((tmp_path / "delta" / "delta.json").read_text())
    info["fingerprint"] = "0" * 64
    (tmp_path / "delta" / "delta.json").write_text(json.dumps(info))
    with pytest.raises(ModelError, match="fingerprint"):
        load_delta(tmp_path / "delta", base_path=base_dir)

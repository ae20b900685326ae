"""Ranker results against a direct per-passage computation."""

from __future__ import annotations

import math

import pytest
import torch

from agrame import Passage, Ranker
from agrame.index.v1 import build_index, load_index
from agrame.ranker import rank_corpus
from agrame.spans import span_token_mask, split_sentences

PASSAGES = [
    "Coral reefs are built by polyps. Warm water causes coral bleaching. Reefs protect coasts.",
    "The Great Barrier Reef lies off Queensland. It is visible from space.",
    "Bleach is sodium hypochlorite. " * 12 + "It disinfects surfaces.",  # windowed (doc_maxlen 24)
    "Ocean acidification harms shellfish.",
]


def naive_scores(encoder, query, text, spans, alpha):
    q = encoder.encode_query(query, "Q").vectors
    qs = encoder.encode_query(query, encoder.settings.span_query_marker).vectors
    enc = encoder.encode_passages([text])[0]
    sim_p, sim_s = q @ enc.vectors.T, qs @ enc.vectors.T
    passage = sum(max(float(x) for x in row) for row in sim_p)
    out = []
    for span in spans:
        mask = span_token_mask(enc.offsets, [span])[0]
        span_score = sum(max(float(x) for x, m in zip(row, mask) if m) for row in sim_s)
        out.append((span_score + alpha * passage, span_score, passage))
    return passage, out


@pytest.mark.parametrize("marker", ["Q", "Q'"])
def test_sentence_ranking_matches_naive(make_tiny_encoder, marker):
    encoder = make_tiny_encoder()
    encoder.settings.span_query_marker = marker
    ranker = Ranker(encoder, alpha=0.7)
    results = ranker.rank("what causes bleaching?", PASSAGES, "sentence", top_k=None)
    assert len(results) == sum(len(split_sentences(t)) for t in PASSAGES)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    for r in results:
        text = PASSAGES[int(r.passage_id)]
        passage, [(score, span_score, _)] = naive_scores(encoder, "what causes bleaching?", text,
                                                          [(r.start, r.end)], 0.7)
        assert math.isclose(r.passage_score, passage, rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(r.span_score, span_score, rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(r.score, score, rel_tol=1e-4, abs_tol=1e-4)
        assert r.text == text[r.start:r.end]


def test_passage_ranking_matches_naive(tiny_encoder):
    ranker = Ranker(tiny_encoder)
    results = ranker.rank("reef in space", PASSAGES, "passage", top_k=None)
    assert sorted(r.passage_id for r in results) == ["0", "1", "2", "3"]
    for r in results:
        passage, _ = naive_scores(tiny_encoder, "reef in space", PASSAGES[int(r.passage_id)], [], 0)
        assert math.isclose(r.score, passage, rel_tol=1e-4, abs_tol=1e-4)
        assert (r.start, r.end) == (0, len(PASSAGES[int(r.passage_id)]))


def test_span_ranking_with_non_contiguous_and_overlapping_spans(tiny_encoder):
    ranker = Ranker(tiny_encoder, alpha=0.5)
    spans = {"0": [(0, 12), [(0, 5), (33, 50)], (40, 60)], "2": [(300, 350)]}
    results = ranker.rank("coral bleaching", PASSAGES, "span", spans=spans, top_k=None)
    assert len(results) == 4
    for r in results:
        text = PASSAGES[int(r.passage_id)]
        _, [(score, span_score, _)] = naive_scores(tiny_encoder, "coral bleaching", text, [r.pieces], 0.5)
        assert math.isclose(r.score, score, rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(r.span_score, span_score, rel_tol=1e-4, abs_tol=1e-4)
    two_piece = next(r for r in results if len(r.pieces) == 2)
    assert two_piece.text == PASSAGES[0][0:5] + " … " + PASSAGES[0][33:50]
    assert two_piece.pieces == ((0, 5), (33, 50)) and (two_piece.start, two_piece.end) == (0, 50)


def test_spans_from_passages_and_aligned_lists(tiny_encoder):
    ranker = Ranker(tiny_encoder)
    with_spans = [Passage("a", PASSAGES[0], ((0, 12),)), Passage("b", PASSAGES[1])]
    assert [r.passage_id for r in ranker.rank("coral", with_spans, "span")] == ["a"]
    aligned = ranker.rank("coral", PASSAGES[:2], "span", spans=[[(0, 12)], [(0, 10), (11, 20)]])
    assert len(aligned) == 3


def test_chunked_scoring_equals_one_chunk(tiny_encoder):
    ranker = Ranker(tiny_encoder)
    corpus = ranker.encode(PASSAGES)
    q = tiny_encoder.encode_query("reef bleaching", "Q").vectors
    qs = tiny_encoder.encode_query("reef bleaching", "Q'").vectors
    for granularity in ("passage", "sentence"):
        whole = rank_corpus(q, qs, corpus, granularity, alpha=0.5, top_k=None)
        tiny = rank_corpus(q, qs, corpus, granularity, alpha=0.5, top_k=None, chunk_tokens=5)
        assert [(r.passage_id, r.start) for r in whole] == [(r.passage_id, r.start) for r in tiny]
        assert torch.allclose(torch.tensor([r.score for r in whole]), torch.tensor([r.score for r in tiny]))


def test_index_round_trip_gives_same_ranking(tiny_encoder, tmp_path):
    ranker = Ranker(tiny_encoder)
    passages = [Passage(f"p{i}", t) for i, t in enumerate(PASSAGES)]
    build_index(tiny_encoder, passages, tmp_path / "idx", chunk_passages=2, progress=False)
    manifest, corpus = load_index(tmp_path / "idx")
    assert manifest["num_passages"] == 4
    in_memory = ranker.rank("bleaching", passages, "sentence", top_k=None)
    from_disk = ranker.rank("bleaching", corpus, "sentence", top_k=None)
    assert [(r.passage_id, r.start, r.end) for r in in_memory] == [(r.passage_id, r.start, r.end) for r in from_disk]
    # float16 storage moves scores only slightly
    for a, b in zip(in_memory, from_disk):
        assert math.isclose(a.score, b.score, abs_tol=0.05)


def test_failed_build_leaves_nothing(tiny_encoder, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = tiny_encoder.encode_passages

    def flaky(texts, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk on fire")
        return real(texts, **kw)

    monkeypatch.setattr(tiny_encoder, "encode_passages", flaky)
    with pytest.raises(RuntimeError):
        build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(PASSAGES)], tmp_path / "idx",
                    chunk_passages=1, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"granularity": "word"}, "unknown granularity"),
    ({"query": "  "}, "query is empty"),
    ({"top_k": 0}, "top_k"),
    ({"granularity": "span"}, "needs spans"),
    ({"granularity": "span", "spans": {"zz": [(0, 1)]}}, "unknown passage"),
    ({"granularity": "span", "spans": {"0": [(0, 1000)]}}, "beyond the text"),
    ({"granularity": "span", "spans": [[(0, 3)]]}, "lists for"),
])
def test_rank_rejects_bad_arguments(tiny_encoder, kwargs, message):
    args = {"query": "reef", "granularity": "sentence", **kwargs}
    with pytest.raises(ValueError, match=message):
        Ranker(tiny_encoder).rank(args.pop("query"), PASSAGES, **args)


def test_span_of_only_punctuation_is_an_error(tiny_encoder):
    with pytest.raises(ValueError, match="no scorable token"):
        Ranker(tiny_encoder).rank("reef", ["reefs ... fish"], "span", spans=[[(6, 9)]])


def test_duplicate_ids_are_rejected(tiny_encoder):
    with pytest.raises(ValueError, match="duplicate"):
        Ranker(tiny_encoder).rank("reef", [("a", "x y"), ("a", "z")], "passage")


def test_sub_unit_query_is_encoded_once_when_markers_coincide(tiny_encoder, monkeypatch):
    calls = []

    def spy(encoder):
        real = encoder.encode_queries
        monkeypatch.setattr(encoder, "encode_queries",
                            lambda texts, markers=("Q",): calls.append(tuple(markers)) or real(texts, markers))
        return encoder

    unmarked = spy(tiny_encoder.with_settings(markers={"Q": None, "Q'": None, "D": "[unused1]"},
                                              span_query_marker="Q'"))
    Ranker(unmarked).rank("reef", PASSAGES, "sentence")
    assert calls == [("Q",)]
    calls.clear()
    Ranker(spy(tiny_encoder)).rank("reef", PASSAGES, "sentence")  # [Q] and [Q'] differ: one batch of two
    assert calls == [("Q", "Q'")]


def test_select_and_concat_preserve_rankings(tiny_encoder, tmp_path):
    ranker = Ranker(tiny_encoder)
    corpus = ranker.encode(PASSAGES)
    picked = corpus.select([2, 0])
    direct = ranker.rank("bleaching reef", [("2", PASSAGES[2]), ("0", PASSAGES[0])], "sentence", top_k=None)
    via_select = ranker.rank("bleaching reef", picked, "sentence", top_k=None)
    assert [(r.passage_id, r.start, r.end) for r in direct] == [(r.passage_id, r.start, r.end) for r in via_select]
    assert torch.allclose(torch.tensor([r.score for r in direct]), torch.tensor([r.score for r in via_select]))
    rejoined = type(corpus).concat([corpus.select([0, 1]), corpus.select([2, 3])])
    for name in ("vectors", "offsets", "token_passage", "token_sentence", "sentences", "sentence_passage",
                 "passage_starts"):
        assert torch.equal(getattr(rejoined, name), getattr(corpus, name)), name
    # select also reads from a memory-mapped index
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(PASSAGES)], tmp_path / "idx", progress=False)
    _, on_disk = load_index(tmp_path / "idx")
    from_disk = ranker.rank("bleaching reef", on_disk.select([2, 0]), "sentence", top_k=None)
    assert [(r.passage_id, r.start) for r in from_disk] == [(r.passage_id, r.start) for r in via_select]


def test_concat_of_read_only_vectors_warns_nothing():
    # Cached encodings are read-only memory maps: concat's torch.from_numpy warned that the tensor must not be
    # written (none is: torch.cat copies). The warning is torch's warn-once, so a fresh process checks it.
    import subprocess
    import sys

    code = """
import warnings
warnings.simplefilter("error")
import numpy as np
from agrame import Ranker
from agrame.corpus import EncodedCorpus
from benchmarks.common import tiny_encoder
corpus = Ranker(tiny_encoder()).encode(["Alpha beta. Gamma delta.", "One two three."])
parts = [corpus.select([0]), corpus.select([1])]
for part in parts:
    part.vectors = part.vectors.numpy().copy()
    part.vectors.setflags(write=False)
joined = EncodedCorpus.concat(parts)
assert np.array_equal(joined.vectors.numpy(), corpus.vectors.numpy())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_given_sentence_spans_replace_punkt(tiny_encoder, tmp_path):
    texts = ["Alpha beta. Gamma delta", "One two three"]
    given = [[(0, 5), (6, 23)], [(0, 3), (4, 13)]]
    encoded = tiny_encoder.encode_passages(texts)
    from agrame.corpus import EncodedCorpus
    corpus = EncodedCorpus.build([Passage(str(i), t) for i, t in enumerate(texts)], encoded, given)
    assert corpus.sentences.tolist() == [[0, 5], [6, 23], [0, 3], [4, 13]]
    results = Ranker(tiny_encoder).rank("alpha", corpus, "sentence", top_k=None)
    assert sorted((r.passage_id, r.start, r.end) for r in results) == [("0", 0, 5), ("0", 6, 23), ("1", 0, 3), ("1", 4, 13)]
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(texts)], tmp_path / "i", progress=False,
                sentences=given)
    assert load_index(tmp_path / "i")[1].sentences.tolist() == corpus.sentences.tolist()
    with pytest.raises(ValueError, match="lists for"):
        EncodedCorpus.build([Passage("0", texts[0])], encoded[:1], given)

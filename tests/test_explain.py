"""Explanations are the ranker's own numbers, with where each maximum lies."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.explain import render_html, render_text
from agrame.ranker import Ranker

WORDS = ["coral", "reef", "warm", "water", "bleaching", "polyps", "fish", "tower", "paris", "algae", "the", "is"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8), min_size=1, max_size=4),
       st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
def test_explanation_matches_ranker_scores(tiny_encoder, sentences, query_words):
    text = " ".join(" ".join(s).capitalize() + "." for s in sentences)
    query = " ".join(query_words)
    ranker = Ranker(tiny_encoder)
    e = ranker.explain(query, ("p", text))
    (passage,) = ranker.rank(query, [("p", text)], "passage")
    assert e.passage_score == pytest.approx(passage.score, abs=1e-5)
    ranked = {(h.start, h.end): h for h in ranker.rank(query, [("p", text)], "sentence", top_k=None)}
    assert len(ranked) == len(e.sentences)
    for s in e.sentences:
        h = ranked[(s.start, s.end)]
        assert (s.score, s.span_score) == pytest.approx((h.score, h.span_score), abs=1e-5)
    assert e.sentences[e.best_sentence].score == pytest.approx(max(h.score for h in ranked.values()), abs=1e-5)
    # Query tokens' maxima sum to S(q,p); each passage token's value is its best over query tokens.
    assert sum(t.similarity for t in e.query_tokens) == pytest.approx(e.passage_score, abs=1e-4)
    for qt in e.query_tokens:
        assert e.passage_tokens[qt.passage_token].matched
        assert e.passage_tokens[qt.passage_token].similarity >= qt.similarity - 1e-6
    # A passage token's best value is one entry of its best query token's row, so at most that row's max.
    assert all(t.similarity <= e.query_tokens[t.query_token].similarity + 1e-6 for t in e.passage_tokens)


def test_rendering_marks_best_sentence_and_matches(tiny_encoder):
    text = "Coral reefs are built by polyps. Warm water causes coral bleaching. Reefs protect coasts."
    e = Ranker(tiny_encoder).explain("warm water bleaching", text)
    best = e.sentences[e.best_sentence]
    plain = render_text(e, color=False)
    marked = plain.splitlines()[2]
    assert marked.count("»") == 1 and marked.count("«") == 1 and "\x1b" not in plain
    inner = marked[marked.index("»") + 1:marked.index("«")]
    assert inner.replace("[", "").replace("]", "") == text[best.start:best.end]
    assert "[" in marked  # matched tokens
    assert "\x1b[4m" in render_text(e, color=True)
    page = render_html([e])
    assert f"data-start='{best.start}' data-end='{best.end}'" in page
    data = json.loads(page[page.index("id='data'>") + len("id='data'>"):page.index("</script>")])
    assert data[0]["passage_score"] == pytest.approx(e.passage_score)


def test_explain_rejects_bad_input(tiny_encoder):
    ranker = Ranker(tiny_encoder)
    with pytest.raises(ValueError, match="empty"):
        ranker.explain("  ", "text")
    corpus = ranker.encode([("a", "Alpha beta."), ("b", "Gamma delta.")])
    with pytest.raises(ValueError, match="no passage 'c'"):
        ranker.explain("alpha", corpus, passage_id="c")
    assert ranker.explain("gamma", corpus, passage_id="b").passage_id == "b"


def test_index_explain_uses_index_vectors(tmp_path, tiny_encoder):
    from agrame.corpus import Passage
    from agrame.index import Index, build_index

    texts = ["Coral reefs bleach in warm water.", "The Eiffel Tower is in Paris."]
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(texts)], tmp_path / "ix", nbits=8,
                progress=False)
    index = Index(tmp_path / "ix", model=tiny_encoder)
    e = index.explain("warm coral", "0")
    hit = [h for h in index.search("warm coral", "passage", top_k=None, exact=True) if h.passage_id == "0"][0]
    assert e.passage_score == pytest.approx(hit.score, abs=1e-5)
    with pytest.raises(ValueError, match="no passage"):
        index.explain("warm", "9")
    torch.manual_seed(0)

"""Benchmark metrics and BM25 on tiny hand-made cases."""

from __future__ import annotations

import math

import pytest

from benchmarks.metrics import has_answer, normalize_answer, precision_at_1, recall_at_k, summarize
from benchmarks.rerank import stable_order


def test_normalize_answer():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Théâtre") == "théâtre"


@pytest.mark.parametrize("text, answers, expected", [
    ("He landed in December 1972.", ["December 1972"], True),
    ("The party was fun.", ["art"], False),  # whole words only
    ("Denver Broncos won", ["the Denver Broncos"], True),  # articles do not matter
    ("nothing here", ["", "x"], False),
    ("U.S. Army", ["US army"], True),  # punctuation removed on both sides
])
def test_has_answer(text, answers, expected):
    assert has_answer(text, answers) is expected


def test_precision_and_recall_on_hand_made_rankings():
    assert precision_at_1([True, False]) == 1.0
    assert precision_at_1([False, True]) == 0.0
    assert precision_at_1([]) == 0.0
    assert recall_at_k([False, False, False, False, True], 5) == 1.0
    assert recall_at_k([False, False, False, False, False, True], 5) == 0.0
    # Two gold sentences (e.g. duplicates of one sentence) in the top 5 count once.
    assert recall_at_k([True, True, False], 5) == 1.0
    assert recall_at_k([], 5) == 0.0


def test_ties_keep_candidate_order():
    assert stable_order([1.0, 3.0, 3.0, 2.0, 3.0]) == [1, 2, 4, 3, 0]


def test_summarize_averages_over_questions_that_have_the_metric():
    per_q = [{"p1": 1.0, "s": 0.0}, {"p1": 0.0}, {"p1": 1.0, "s": 1.0}]
    assert summarize(per_q) == {"p1": pytest.approx(66.67), "s": 50.0}


def test_bm25_scores_match_bm25s():
    pytest.importorskip("bm25s")
    pytest.importorskip("Stemmer")
    from benchmarks.bm25 import PoolBM25, bm25_scores, tokenize

    texts = ["Coral reefs bleach when the water warms.", "Reefs protect coasts from storms and waves.",
             "Bleach is a chemical; bleach whitens laundry.", "Storms and storms again hit the coast."]
    pool = PoolBM25(texts)
    query = "why do coral reefs bleach in storms"
    q_tokens = tokenize([query])
    docs, scores = pool.retrieve([query], k=len(texts))
    ours = bm25_scores(q_tokens[0], tokenize(texts), pool.df, pool.n_docs, pool.avgdl)
    for d, s in zip(docs[0], scores[0]):
        assert math.isclose(ours[int(d)], float(s), rel_tol=1e-5, abs_tol=1e-5)
    assert pool.score_texts(query, texts) == pytest.approx(ours)


def test_citation_scores_hand_computed():
    from benchmarks.metrics import citation_scores

    cases = [
        ({0}, [{0}]),            # right
        ({0, 1}, [{1, 2}]),      # one right, one wrong; recall 1/2
        (set(), [{3}]),          # missed: recall 0
        ({2}, []),               # cited an unsupported claim: wrong
        (set(), []),             # unsupported left uncited
        ({4}, [{4, 5}, {4}]),    # second gold set fully cited: recall 1
    ]
    s = citation_scores(cases)
    assert s["precision"] == round(100 * 3 / 5, 1)           # right citations 0, 1, 4 of 5
    assert s["recall"] == round(100 * (1 + 0.5 + 0 + 1) / 4, 1)
    p, r = 3 / 5, 2.5 / 4
    assert s["f1"] == round(100 * 2 * p * r / (p + r), 1)
    assert s["uncited_unsupported"] == 50.0 and s["any_gold"] == 75.0
    assert (s["claims"], s["supported"], s["unsupported"], s["citations"]) == (6, 4, 2, 5)

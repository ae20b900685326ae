"""PropCite mechanics on the tiny model (the real model's behaviour is in test_default_model)."""

from __future__ import annotations

import pytest
import torch

from agrame import scoring
from agrame.ranker import Ranker
from propcite.citer import Citer, SentenceCitation, cite, insert_markers

PASSAGES = [("p1", "Coral reefs are built by polyps. They shelter marine species."),
            ("p2", "Household bleach is sodium hypochlorite. It whitens laundry."),
            ("p3", "The tower was built in 1889 for a fair.")]


def whole_and_halves(sentence):
    """A deterministic stand-in tagger: the first and the second half of the words."""
    words = sentence.split()
    if len(words) < 2:
        return [((0, len(sentence)),)]
    cut = sentence.index(words[len(words) // 2])
    return [((0, cut - 1),), ((cut, len(sentence)),)]


@pytest.fixture
def citer(tiny_encoder):
    return Citer(Ranker(tiny_encoder), tagger=whole_and_halves)


def test_each_proposition_cites_its_argmax_passage(citer, tiny_encoder):
    sentence = "Coral reefs shelter species and bleach whitens laundry."
    corpus = citer.encode(PASSAGES)
    result = citer.cite_sentence(sentence, corpus)
    q = tiny_encoder.encode_query(sentence, "Q")
    for prop in result.propositions:
        mask = torch.zeros(q.vectors.shape[0], dtype=torch.bool)
        for start, end in prop.pieces:
            mask |= (q.offsets[:, 0] < end) & (q.offsets[:, 1] > start) & (q.offsets[:, 1] > q.offsets[:, 0])
        naive = []
        for p in range(len(PASSAGES)):
            sim = scoring.similarity(q.vectors[mask], corpus.vectors[corpus.passage_tokens(p)])
            naive.append(float(sim.max(dim=1).values.mean()))
        assert prop.best_passage == max(range(3), key=lambda i: (naive[i], -i))
        assert prop.score == pytest.approx(max(naive), abs=1e-5)
        assert prop.runner_up == pytest.approx(sorted(naive)[-2], abs=1e-5)
    assert set(result.citations) == {p.passage for p in result.propositions}


def test_margin_and_max_citations(citer):
    corpus = citer.encode(PASSAGES)
    sentence = "Coral reefs shelter species and bleach whitens laundry."
    citer.margin = 10.0  # no gap in mean cosine similarity can reach it
    result = citer.cite_sentence(sentence, corpus)
    assert result.citations == () and all(p.passage is None for p in result.propositions)
    citer.margin = 0.0
    assert len(citer.cite_sentence(sentence, corpus).citations) >= 1
    citer.margin, citer.max_citations = None, 1
    assert len(citer.cite_sentence(sentence, corpus).citations) == 1


def test_sentence_modes(citer):
    corpus = citer.encode(PASSAGES)
    citer.mode = "sentence-top2"
    two = citer.cite_sentence("bleach whitens laundry", corpus)
    assert len(two.citations) == 2 and len(two.propositions) == 1
    citer.mode = "sentence-top1"
    one = citer.cite_sentence("bleach whitens laundry", corpus)
    assert one.citations == two.citations[:1]
    citer.mode = "proposition-alone"
    alone = citer.cite_sentence("bleach whitens laundry", corpus)
    assert len(alone.propositions) == 2


def test_cite_offsets_markers_and_stream(citer):
    answer = "Reefs shelter species. Bleach whitens laundry!"
    result = citer.cite(answer, PASSAGES)
    assert len(result.sentences) == 2
    for sent in result.sentences:
        assert answer[sent.start:sent.end] == sent.text
        for prop in sent.propositions:
            assert all(sent.start <= a < b <= sent.end for a, b in prop.pieces)
    streamed = list(citer.stream([s.text for s in result.sentences], citer.encode(PASSAGES)))
    assert [s.citations for s in streamed] == [s.citations for s in result.sentences]
    stripped = result.text
    for sent in result.sentences:
        for c in sent.citations:
            assert f"[{c + 1}]" in result.text
            stripped = stripped.replace(f"[{c + 1}]", "")
    assert " ".join(stripped.split()).replace(" .", ".").replace(" !", "!") == answer


def test_insert_markers_before_final_punctuation():
    answer = "One fact. Two facts!\nNo end"
    sents = [SentenceCitation(0, 9, "One fact.", (1,), ()), SentenceCitation(10, 20, "Two facts!", (2, 0), ()),
             SentenceCitation(21, 27, "No end", (), ())]
    assert insert_markers(answer, sents) == "One fact [2]. Two facts [1][3]!\nNo end"


def test_errors(tiny_encoder):
    with pytest.raises(ValueError, match="mode"):
        Citer(Ranker(tiny_encoder), mode="best")
    with pytest.raises(ValueError, match="margin"):
        Citer(Ranker(tiny_encoder), margin=-1)
    with pytest.raises(ValueError, match="no passages"):
        cite("Some answer.", [], model=Ranker(tiny_encoder))


def test_one_passage_is_always_cited(citer):
    result = citer.cite_sentence("reefs", citer.encode(PASSAGES[:1]))
    assert result.citations == (0,)
    assert result.propositions[0].runner_up == float("-inf")


def test_lexical_prior_is_max_normalised_bm25(citer):
    from agrame.lexical import LexicalCollection, simple_tokenize

    assert simple_tokenize("The reefs are bleaching") == ["reef", "bleach"]  # stopwords out, Porter stems
    corpus = citer.encode(PASSAGES)
    prior = citer.lexical_prior("bleach whitens laundry", corpus)
    raw = LexicalCollection([simple_tokenize(t) for _, t in PASSAGES]).scores(simple_tokenize("bleach whitens laundry"))
    assert prior.tolist() == pytest.approx([r / max(raw) for r in raw])
    assert int(prior.argmax()) == 1 and float(prior.max()) == 1.0
    assert citer.lexical_prior("zzz", corpus).tolist() == [0.0, 0.0, 0.0]
    citer.lexical_weight = 100.0  # the prior dominates: every proposition cites the lexical best
    result = citer.cite_sentence("bleach whitens laundry", corpus)
    assert result.citations == (1,)

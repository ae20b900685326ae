"""Proposition tagging (spaCy parse) and alignment of proposition texts to sentence spans."""

from __future__ import annotations

import numpy as np
import pytest

from propcite.propositions import affinity, align_propositions, span_text, tag_propositions


def texts(sentence, spans):
    return [span_text(sentence, s) for s in spans]


def test_coordinated_predicates_share_the_subject():
    s = "Marie Curie was born in Warsaw and raised in Poland."
    props = texts(s, tag_propositions(s))
    assert "Marie Curie was born in Warsaw" in props
    assert any(p.startswith("Marie Curie was") and p.endswith("raised in Poland") for p in props)
    assert len(props) == 2


def test_relative_clause_keeps_its_noun_and_apposition_its_head():
    s = "Obama, the 44th president, signed the act, which expanded health insurance."
    props = texts(s, tag_propositions(s))
    assert any("Obama" in p and "44th president" in p and "signed" not in p for p in props)
    assert any("act which expanded health insurance" in p for p in props)
    assert any(p.startswith("Obama signed the act") for p in props)


def test_single_proposition_sentence_is_one_span_over_its_words():
    s = "Paris is the capital of France."
    spans = tag_propositions(s)
    assert len(spans) == 1
    assert span_text(s, spans[0]) == "Paris is the capital of France"  # punctuation belongs to no proposition


def test_spans_are_valid_character_pieces():
    s = "He studied law, which he loved, and later founded a company that makes chips in Asia."
    for span in tag_propositions(s):
        assert all(0 <= a < b <= len(s) for a, b in span)
        assert list(span) == sorted(span)
        assert all(s[a:b].strip() == s[a:b] for a, b in span)


def test_empty_sentence_has_no_propositions():
    assert tag_propositions("   ") == []


def test_affinity_hand_computed():
    sent = ["the", "cats", "sat", "on", "the", "mat"]
    prop = ["the", "mat"]
    a = affinity(sent, prop)
    assert a.shape == (2, 6)
    # "the" matches positions 0 and 4; the one followed by "mat" (its diagonal neighbour) gets +0.1.
    assert a[0, 0] == pytest.approx(1.0) and a[0, 4] == pytest.approx(1.1)
    assert a[1, 5] == pytest.approx(1.1)
    assert a[1, 0] == 0.0
    assert affinity(sent, ["cat"])[0, 1] == pytest.approx(1.0)  # lemma/stem: cats ~ cat


def test_align_exact_lemma_and_added_words():
    s = "He was born in Ohio and raised in Texas."
    born, raised, nothing = align_propositions(s, ["He was born in Ohio.", "He was raised in Texas", "zzz qqq"])
    assert span_text(s, born) == "He was born in Ohio"
    assert span_text(s, raised) == "He was raised in Texas"
    assert raised == ((0, 6), (24, 39))
    assert nothing is None
    # "raises" aligns to "raised" through its stem; "he" through case folding.
    assert span_text(s, align_propositions(s, ["he raises"])[0]) == "He raised"


def test_align_picks_the_repeated_word_in_context():
    s = "The red car hit the blue car."
    (span,) = align_propositions(s, ["the blue car"])
    assert span_text(s, span) == "the blue car"


def test_align_hungarian_is_one_to_one():
    s = "dog dog"
    (span,) = align_propositions(s, ["dog"])
    assert len(span) == 1 and s[span[0][0]:span[0][1]] == "dog"
    rng = np.random.default_rng(0)
    words = ["a", "b", "c", "d"]
    sentence = " ".join(rng.choice(words, 12))
    for span in align_propositions(sentence, [" ".join(rng.choice(words, 5)) for _ in range(5)]):
        assert span is None or sum(len(sentence[a:b].split()) for a, b in span) <= 5


HAS_WORDNET = __import__("pathlib").Path("/usr/share/wordnet/data.noun").exists()


@pytest.mark.skipif(not HAS_WORDNET, reason="Debian's wordnet-base is not installed")
def test_wordnet_install_and_lemma_alignment(tmp_path):
    from propcite.propositions import install_wordnet

    home = install_wordnet(target=tmp_path)
    folder = home / "corpora" / "wordnet"
    lexnames = (folder / "lexnames").read_text().splitlines()
    assert len(lexnames) == 45 and lexnames[0] == "00\tadj.all\t3" and lexnames[-1] == "44\tadj.ppl\t3"
    assert not any(p.is_symlink() for p in folder.iterdir())
    # "ran" ~ "run" only through the WordNet lemma (Porter leaves "ran" alone).
    s = "She ran the company for years."
    (span,) = align_propositions(s, ["she run the company"])
    assert span_text(s, span) == "She ran the company"

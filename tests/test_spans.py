"""Span → token mapping and sentence segmentation."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.spans import normalize_span, span_token_mask, split_sentences, token_segments

WORDS = ["naïve", "café", "東京", "Ωmega", "co-op", "U.S.", "e.g.", "42", "😀", "straße", "the", "reef", "—", "..."]


@st.composite
def offsets_and_spans(draw):
    n = draw(st.integers(0, 15))
    cuts = sorted(draw(st.lists(st.integers(0, 60), min_size=2 * n, max_size=2 * n)))
    offsets = [(cuts[2 * i], cuts[2 * i + 1]) for i in range(n)]  # some empty = special tokens
    spans = draw(st.lists(
        st.lists(st.tuples(st.integers(0, 59), st.integers(1, 20)).map(lambda t: (t[0], t[0] + t[1])),
                 min_size=1, max_size=3),
        max_size=5))
    return offsets, spans


@given(offsets_and_spans())
@settings(max_examples=300, deadline=None)
def test_span_token_mask_matches_character_definition(data):
    offsets, spans = data
    mask = span_token_mask(torch.tensor(offsets, dtype=torch.long).reshape(-1, 2), spans)
    assert mask.shape == (len(spans), len(offsets))
    for i, span in enumerate(spans):
        chars = set()
        for s, e in span:
            chars.update(range(s, e))
        for j, (ts, te) in enumerate(offsets):
            assert bool(mask[i, j]) == bool(chars & set(range(ts, te)))


def test_special_tokens_belong_to_no_span():
    offsets = torch.tensor([[0, 0], [0, 0], [0, 5], [6, 9], [0, 0]])
    mask = span_token_mask(offsets, [(0, 100)])
    assert mask.tolist() == [[False, False, True, True, False]]


def test_token_segments_and_word_cut_in_half():
    offsets = torch.tensor([[0, 0], [0, 5], [6, 12], [13, 20]])
    # The second span starts inside the token (6, 12): the token still belongs to a span.
    segs = token_segments(offsets, [(0, 5), (8, 20)])
    assert segs.tolist() == [-1, 0, 1, 1]


@pytest.mark.parametrize("bad", [(5, 5), (7, 3), (-1, 2), [(0, 2), (4, 1)], [], "ab", [(0, "x")]])
def test_normalize_span_rejects_bad_spans(bad):
    with pytest.raises(ValueError):
        normalize_span(bad)


def test_normalize_span_shapes_and_bounds():
    assert normalize_span((1, 4)) == ((1, 4),)
    assert normalize_span([(1, 4), (6, 8)]) == ((1, 4), (6, 8))
    assert normalize_span([[1, 4]]) == ((1, 4),)
    with pytest.raises(ValueError, match="beyond"):
        normalize_span((0, 11), text_length=10)


def check_sentences(text):
    spans = split_sentences(text)
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert e1 <= s2, "sentences are ordered and disjoint"
    for s, e in spans:
        assert text[s:e] == text[s:e].strip() and re.search(r"\w", text[s:e])
    covered = set()
    for s, e in spans:
        covered.update(range(s, e))
    for m in re.finditer(r"\w", text):
        assert m.start() in covered, f"word character {m.group()!r} at {m.start()} is in no sentence"
    return spans


def test_split_sentences_punkt_abbreviations_and_whitespace():
    text = "  Dr. Smith went home.   He was tired!\n\nCoral reefs in the U.S. are big. Ok?  "
    spans = check_sentences(text)
    assert [text[s:e] for s, e in spans] == [
        "Dr. Smith went home.", "He was tired!", "Coral reefs in the U.S. are big.", "Ok?"]


def test_split_sentences_merges_punctuation_only_pieces():
    text = "... First one. ! Second one."
    spans = check_sentences(text)
    assert all(re.search(r"\w", text[s:e]) for s, e in spans)
    assert split_sentences("...!?") == []


@given(st.lists(st.sampled_from(WORDS + [".", "!", "?", " ", "  ", "\n", "\t"]), max_size=60))
@settings(max_examples=200, deadline=None)
def test_split_sentences_covers_every_word_character(tokens):
    check_sentences(" ".join(tokens))


def test_split_sentences_on_a_very_long_passage():
    text = " ".join(f"Sentence number {i} talks about reefs." for i in range(2000))
    spans = check_sentences(text)
    assert len(spans) == 2000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(0, 4), min_size=1, max_size=6),
                          st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12)),
                min_size=1, max_size=5))
def test_sorted_token_segments_equals_token_segments(passages):
    """Many passages at once by binary search == the mask rule passage by passage."""
    from agrame.spans import sorted_token_segments, token_segments

    all_offsets, groups, all_spans, starts, expected = [], [], [], [0], []
    for g, (length, gaps, toks) in enumerate(passages):
        spans, at = [], 0
        for gap in gaps:  # sorted, disjoint spans with gaps
            s = at + gap
            e = s + 1 + gap
            if e > length:
                break
            spans.append((s, e))
            at = e
        offsets, pos = [], 0
        for skip, width in toks:  # tokens in order; width 0 = special token
            s = min(pos + skip, length)
            e = min(s + width, length)
            offsets.append((s, e) if width else (0, 0))
            pos = e
        off = torch.tensor(offsets, dtype=torch.long).reshape(-1, 2)
        expected.append(token_segments(off, spans))
        all_offsets.append(off)
        groups.append(torch.full((len(offsets),), g, dtype=torch.long))
        all_spans.extend(spans)
        starts.append(starts[-1] + len(spans))
    got = sorted_token_segments(torch.cat(all_offsets), torch.tensor(all_spans, dtype=torch.long).reshape(-1, 2),
                                torch.cat(groups), torch.tensor(starts))
    assert got.tolist() == torch.cat(expected).tolist()


def test_full_width_sentence_ends_split_chinese_and_japanese():
    # issue 62: a three-sentence Chinese passage was one sentence (Punkt knows English only)
    text = "今天天气很好。我们去公园散步！你想一起去吗？"
    assert [text[s:e] for s, e in split_sentences(text)] == ["今天天气很好。", "我们去公园散步！", "你想一起去吗？"]
    text = "Reefs bleach. 「東京は大きい。」そうです。"
    assert [text[s:e] for s, e in split_sentences(text)] == ["Reefs bleach.", "「東京は大きい。」", "そうです。"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab 。！？」\n.", max_size=40))
def test_every_word_character_lies_in_exactly_one_sentence(text):
    covered = [0] * len(text)
    for s, e in split_sentences(text):
        for k in range(s, e):
            covered[k] += 1
    assert all(c <= 1 for c in covered)
    assert all(covered[k] == 1 for k, ch in enumerate(text) if ch in "ab")

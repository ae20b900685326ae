"""Encoded passages in one flat token layout, shared by the in-memory API and the index.

All token vectors of all passages sit in one ``[T, dim]`` matrix; each token knows its
passage and its sentence (global ids). One similarity matrix ``[Lq, T]`` then gives all
passage scores and all sentence scores by segment max, with no padding.
"""

from __future__ import annotations

import bisect
import warnings
from dataclasses import dataclass, field
from typing import Mapping, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .encoder import EncodedPassage
from .spans import SpanLike, split_sentences, token_segments


class Passage(NamedTuple):
    """An input passage; ``spans`` are only needed for ``granularity="span"``, ``metadata`` (a JSON
    object of strings, numbers, booleans and lists of them) only by an index's filters."""

    id: str
    text: str
    spans: Optional[Tuple[SpanLike, ...]] = None
    metadata: Optional[Mapping[str, object]] = None


PassageLike = Union[str, Passage, Tuple[str, str], Mapping[str, str]]


def as_passages(items: Iterable[PassageLike]) -> List[Passage]:
    """Normalise strings / ``(id, text)`` pairs / ``{"id", "text"}`` dicts / :class:`Passage` into
    passages with unique ids (a string or a dict without "id" gets its position)."""
    out: List[Passage] = []
    for i, item in enumerate(items):
        if isinstance(item, Passage):
            passage = item
        elif isinstance(item, str):
            passage = Passage(str(i), item)
        elif isinstance(item, tuple) and len(item) == 2:
            passage = Passage(str(item[0]), item[1])
        elif isinstance(item, Mapping) and "text" in item:
            passage = Passage(str(item.get("id", i)), item["text"], metadata=item.get("metadata"))
        else:
            raise TypeError(f"passage {i}: expected str, (id, text), a dict with 'text' or Passage, "
                            f"got {type(item).__name__}")
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
    #: Pooled passages (:mod:`agrame.pooling`): passage index → (original tokens' offsets [n, 2], the
    #: passage-local vector of each original token [n]) — what spans are told by.
    pool_members: Dict[int, Tuple[torch.Tensor, np.ndarray]] = field(default_factory=dict)
    #: id → the passage's metadata (those that have any), for the hits of an in-memory ranking
    metadata: Dict[str, Mapping[str, object]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_tokens(self) -> int:
        return int(self.vectors.shape[0])

    def passage_tokens(self, p: int) -> slice:
        return slice(int(self.passage_starts[p]), int(self.passage_starts[p + 1]))

    def span_mask(self, p: int, spans: Sequence[SpanLike]) -> torch.Tensor:
        """``[len(spans), n_p]``: passage ``p``'s vectors that each span holds (a pooled passage's: by
        their tokens, :func:`agrame.pooling.member_span_mask`; else by their characters)."""
        if p in self.pool_members:
            from .pooling import member_span_mask

            member_offsets, assignment = self.pool_members[p]
            return member_span_mask(member_offsets, assignment, spans)
        from .spans import span_token_mask

        return span_token_mask(self.offsets[self.passage_tokens(p)], spans)

    def select(self, indices: Sequence[int]) -> "EncodedCorpus":
        """A new corpus of the given passages, in the given order (e.g. first-stage candidates).

        Works on memory-mapped index vectors too: only the selected rows are read.
        """
        idx = [int(i) for i in indices]
        starts = self.passage_starts.tolist()
        sent_starts = torch.searchsorted(self.sentence_passage, torch.arange(len(self) + 1)).tolist()
        token_rows, sentence_rows, new_starts, sentence_map = [], [], [0], []
        base = 0
        for p in idx:
            lo, hi = starts[p], starts[p + 1]
            token_rows.append(np.arange(lo, hi))
            s_lo, s_hi = sent_starts[p], sent_starts[p + 1]
            sentence_rows.append(np.arange(s_lo, s_hi))
            sentence_map.append((s_lo, base))
            base += s_hi - s_lo
            new_starts.append(new_starts[-1] + hi - lo)
        rows = np.concatenate(token_rows) if token_rows else np.zeros(0, dtype=np.int64)
        srows = torch.from_numpy(np.concatenate(sentence_rows) if sentence_rows else np.zeros(0, dtype=np.int64))
        vectors = self.vectors[rows]
        if isinstance(vectors, np.ndarray):
            vectors = torch.from_numpy(np.ascontiguousarray(vectors))
        token_sentence = self.token_sentence[torch.from_numpy(rows)].clone()
        token_owner = torch.repeat_interleave(torch.arange(len(idx)), torch.tensor(new_starts).diff())
        for k, (old_first, new_first) in enumerate(sentence_map):
            inside = (token_owner == k) & (token_sentence >= 0)
            token_sentence[inside] += new_first - old_first
        return EncodedCorpus(
            ids=[self.ids[p] for p in idx], texts=[self.texts[p] for p in idx], vectors=vectors,
            offsets=self.offsets[torch.from_numpy(rows)], token_passage=token_owner,
            token_sentence=token_sentence, sentences=self.sentences[srows],
            sentence_passage=torch.repeat_interleave(
                torch.arange(len(idx)), torch.tensor([len(r) for r in sentence_rows], dtype=torch.long)),
            passage_starts=torch.tensor(new_starts, dtype=torch.long),
            spans={self.ids[p]: self.spans[self.ids[p]] for p in idx if self.ids[p] in self.spans},
            pool_members={k: self.pool_members[p] for k, p in enumerate(idx) if p in self.pool_members},
        )

    def pooled(self, factor) -> "EncodedCorpus":
        """This corpus with each passage's token vectors pooled within its sentences
        (:mod:`agrame.pooling`): about one vector per ``factor`` tokens; sentences and spans keep
        working (a pooled vector's offsets cover its run of tokens)."""
        from .pooling import check_pool_factor, pool_by_assignment, pooled_offsets, token_assignment

        factor = check_pool_factor(factor)
        if factor == 1:
            return self
        vectors, offsets, token_sentence, starts, members = [], [], [], [0], {}
        for p in range(len(self)):
            sl = self.passage_tokens(p)
            vec = self.vectors[sl]
            vec = torch.from_numpy(np.asarray(vec, dtype=np.float32)) if isinstance(vec, np.ndarray) else vec
            assignment = token_assignment(vec, self.offsets[sl], self.token_sentence[sl], factor)
            m = int(assignment.max(initial=-1)) + 1
            first = np.full(m, len(assignment), dtype=np.int64)
            np.minimum.at(first, assignment, np.arange(len(assignment)))
            vectors.append(pool_by_assignment(vec.float(), assignment).to(vec.dtype))
            offsets.append(pooled_offsets(self.offsets[sl], assignment))
            token_sentence.append(self.token_sentence[sl][torch.from_numpy(first)])
            starts.append(starts[-1] + m)
            members[p] = (self.offsets[sl], assignment)
        passage_starts = torch.tensor(starts, dtype=torch.long)
        return EncodedCorpus(
            ids=list(self.ids), texts=list(self.texts),
            vectors=torch.cat(vectors) if vectors else self.vectors[:0],
            offsets=torch.cat(offsets) if offsets else self.offsets[:0],
            token_passage=torch.repeat_interleave(torch.arange(len(self)), passage_starts.diff()),
            token_sentence=torch.cat(token_sentence) if token_sentence else self.token_sentence[:0],
            sentences=self.sentences, sentence_passage=self.sentence_passage, passage_starts=passage_starts,
            spans=dict(self.spans), pool_members=members)

    @classmethod
    def concat(cls, parts: Sequence["EncodedCorpus"]) -> "EncodedCorpus":
        """One corpus from several (e.g. index shards), renumbering passages and sentences. Ids and texts
        that are read lazily (an index's records) stay lazy: only the hits' are ever read."""
        token_base = sentence_base = passage_base = 0
        token_sentence, token_passage, sentence_passage, starts = [], [], [], [torch.zeros(1, dtype=torch.long)]
        for part in parts:
            ts = part.token_sentence
            token_sentence.append(torch.where(ts >= 0, ts + sentence_base, ts))
            token_passage.append(part.token_passage + passage_base)
            sentence_passage.append(part.sentence_passage + passage_base)
            starts.append(part.passage_starts[1:] + token_base)
            token_base += part.num_tokens
            sentence_base += int(part.sentences.shape[0])
            passage_base += len(part)
        with warnings.catch_warnings():
            # Parts read from a read-only memory map (cached encodings): torch warns that the tensor must not be
            # written, and none is — torch.cat below copies them into a new tensor.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            vectors = [torch.from_numpy(np.asarray(p.vectors)) if isinstance(p.vectors, np.ndarray) else p.vectors
                       for p in parts]
        # Vectors left compressed (agrame.index.codec.CompressedVectors) stay compressed: exact scoring
        # then runs once over every part instead of once a part (a sharded index's exact stage).
        joined = type(vectors[0]).concat(vectors) if hasattr(vectors[0], "concat") else torch.cat(vectors)
        spans: Dict[str, Tuple[SpanLike, ...]] = {}
        members: Dict[int, Tuple[torch.Tensor, np.ndarray]] = {}
        base = 0
        for part in parts:
            spans.update(part.spans)
            members.update({base + p: m for p, m in part.pool_members.items()})
            base += len(part)
        return cls(
            ids=joined_sequences([p.ids for p in parts]), texts=joined_sequences([p.texts for p in parts]),
            vectors=joined, offsets=torch.cat([p.offsets for p in parts]),
            token_passage=torch.cat(token_passage), token_sentence=torch.cat(token_sentence),
            sentences=torch.cat([p.sentences for p in parts]), sentence_passage=torch.cat(sentence_passage),
            passage_starts=torch.cat(starts), spans=spans, pool_members=members,
            metadata={k: v for part in parts for k, v in part.metadata.items()},
        )

    @classmethod
    def build(cls, passages: Sequence[Passage], encoded: Sequence[EncodedPassage],
              sentences: Optional[Sequence[Sequence[Tuple[int, int]]]] = None) -> "EncodedCorpus":
        """Flat corpus from encoded passages; sentence spans by Punkt unless ``sentences`` gives
        them per passage (disjoint, in order — e.g. a dataset's own segmentation)."""
        if sentences is not None and len(sentences) != len(passages):
            raise ValueError(f"sentences: {len(sentences)} lists for {len(passages)} passages")
        given = sentences
        vectors, offsets, token_passage, token_sentence = [], [], [], []
        sentences, sentence_passage, starts = [], [], [0]
        for p, (passage, enc) in enumerate(zip(passages, encoded)):
            spans = split_sentences(passage.text) if given is None else [tuple(s) for s in given[p]]
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
            metadata={p.id: dict(p.metadata) for p in passages if p.metadata},
        )


def joined_sequences(parts: Sequence[Sequence[str]]) -> Sequence[str]:
    """``parts`` read as one sequence: a list when they are lists, else a view that leaves lazily read
    parts (an index's records) unread."""
    if all(isinstance(p, list) for p in parts):
        return [x for p in parts for x in p]
    return ChainedSequence(parts)


class ChainedSequence(Sequence):
    """Several sequences read as one, without reading them (each item is read where it lies)."""

    def __init__(self, parts: Sequence[Sequence[str]]):
        self._parts = list(parts)
        self._ends = np.cumsum([len(p) for p in self._parts]).tolist()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        if not -n <= k < n:
            raise IndexError(k)
        k = k % n
        part = bisect.bisect_right(self._ends, k)
        return self._parts[part][k - (self._ends[part - 1] if part else 0)]

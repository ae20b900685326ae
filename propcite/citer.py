"""Post-hoc citation (AGRaME §4.3, PropCite).

Each answer sentence is encoded once as a query; each of its propositions (a set of
the sentence's characters, hence of its query tokens) scores every input passage with
only its own query token vectors (sub-query MaxSim); the top passage of each
proposition becomes one of the sentence's citations.

Length: a sub-query's sum of maxima grows with its number of tokens. Choosing a
proposition's top passage compares sums over the *same* tokens, so length plays no part
there; it does wherever scores of different token sets are compared — the margin (a
gap in per-token mean similarity, so one margin fits short and long propositions) and
the best-matching span inside the cited passage (the passage sentence holding the
proposition's per-token maxima, not the sentence with the largest sum, which would
favour long sentences).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from agrame import scoring
from agrame.corpus import EncodedCorpus, PassageLike
from agrame.encoder import Encoder
from agrame.lexical import LexicalCollection, simple_tokenize
from agrame.ranker import Ranker
from agrame.spans import span_token_mask, split_sentences

from .propositions import Span, span_text, tag_propositions

Mode = Literal["propositions", "proposition-alone", "sentence-top1", "sentence-top2"]
MODES: Tuple[str, ...] = ("propositions", "proposition-alone", "sentence-top1", "sentence-top2")
Tagger = Callable[[str], List[Span]]


class PropositionCitation(NamedTuple):
    """One proposition of a sentence and the passage that supports it best."""

    pieces: Span                    # character pieces in the sentence (or answer, see CitedAnswer)
    text: str
    passage: Optional[int]          # cited passage index; None when the margin was not met
    best_passage: int               # top passage, cited or not
    passage_span: Tuple[int, int]   # best-matching sentence of best_passage (characters)
    score: float                    # mean per-token similarity with best_passage (+ lexical prior)
    runner_up: float                # the same for the second passage (−inf with one passage)
    passage_scores: Tuple[float, ...] = ()  # the same for every passage


class SentenceCitation(NamedTuple):
    start: int
    end: int
    text: str
    citations: Tuple[int, ...]      # passage indices, best first
    propositions: Tuple[PropositionCitation, ...]


class CitedAnswer(NamedTuple):
    text: str                       # the answer with [n] markers (n = passage index + 1)
    sentences: Tuple[SentenceCitation, ...]


class Citer:
    """Attribute answer sentences to passages; reuse one instance (model loaded once).

    ``mode``: ``"propositions"`` (PropCite: sentence encoded whole, one sub-query per
    proposition), ``"proposition-alone"`` (each proposition encoded as its own query),
    ``"sentence-top1"`` / ``"sentence-top2"`` (the whole sentence as query, top 1 or 2
    passages). ``margin``: cite a proposition's top passage only when its per-token
    mean similarity beats the runner-up's by at least this much (None: always cite).
    ``max_citations``: keep at most this many passages per sentence (highest scores).
    ``lexical_weight``: λ of an optional lexical prior — every proposition's per-passage
    score gets λ·BM25(sentence, passage)/max over the passages (0: pure PropCite).
    """

    def __init__(self, model: Union[Ranker, Encoder, str, Path, None] = None, *, mode: Mode = "propositions",
                 margin: Optional[float] = None, max_citations: Optional[int] = None,
                 tagger: Optional[Tagger] = None, batch_size: int = 16, lexical_weight: float = 0.0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if margin is not None and margin < 0:
            raise ValueError("margin must be ≥ 0")
        if max_citations is not None and max_citations < 1:
            raise ValueError("max_citations must be at least 1")
        self.ranker = model if isinstance(model, Ranker) else Ranker(model, batch_size=batch_size)
        self.mode, self.margin, self.max_citations = mode, margin, max_citations
        self.tagger = tagger or tag_propositions
        if lexical_weight < 0:
            raise ValueError("lexical_weight must be ≥ 0")
        self.lexical_weight = float(lexical_weight)
        self._lexical_cache: Dict[int, Tuple[EncodedCorpus, LexicalCollection]] = {}

    @property
    def encoder(self) -> Encoder:
        return self.ranker.encoder

    def encode(self, passages: Union[EncodedCorpus, Iterable[PassageLike]], progress: bool = False) -> EncodedCorpus:
        """Encode the generator's input passages once (their sentences give citation spans)."""
        if isinstance(passages, EncodedCorpus):
            return passages
        passages = list(passages)
        if not passages:
            raise ValueError("no passages to cite")
        return self.ranker.encode(passages, progress=progress)

    # -- one sentence --------------------------------------------------------------
    def cite_sentence(self, sentence: str, passages: Union[EncodedCorpus, Iterable[PassageLike]],
                      propositions: Optional[Sequence[Span]] = None) -> SentenceCitation:
        """Citations for one sentence; offsets are relative to ``sentence``.

        ``propositions`` overrides the tagger (e.g. spans from :func:`align_propositions`).
        """
        corpus = self.encode(passages)
        if not sentence.strip():
            return SentenceCitation(0, len(sentence), sentence, (), ())
        whole: List[Span] = [((0, len(sentence)),)]
        if self.mode.startswith("sentence"):
            props = whole
        else:
            props = list(propositions) if propositions is not None else self.tagger(sentence)
            props = props or whole
        segments = corpus.token_passage
        vectors = corpus.vectors if corpus.vectors.dtype == torch.float32 else corpus.vectors.float()
        if self.mode == "proposition-alone":
            texts = [span_text(sentence, p) for p in props]
            encoded = self.encoder.encode_queries(texts, ("Q",))[0]
            rows, sims, counts = [], [], []
            for q in encoded:
                sim = scoring.similarity(q.vectors, vectors)
                rows.append(scoring.segment_maxsim(sim, segments, len(corpus)))
                sims.append(sim)
                counts.append(q.vectors.shape[0])
            scores = torch.stack(rows)
            n_tokens = torch.tensor(counts, dtype=scores.dtype)
            token_sims = sims
            token_masks = [None] * len(props)
        else:
            q = self.encoder.encode_query(sentence, "Q")
            sim = scoring.similarity(q.vectors, vectors)
            if self.mode.startswith("sentence"):
                masks = torch.ones((1, q.vectors.shape[0]), dtype=torch.bool)  # every query vector, as in S(q,p)
            else:
                masks = span_token_mask(q.offsets, props)
                keep = masks.any(dim=1)  # a proposition of punctuation only cannot score
                props = [p for p, k in zip(props, keep.tolist()) if k]
                masks = masks[keep]
                if not props:
                    props, masks = whole, torch.ones((1, q.vectors.shape[0]), dtype=torch.bool)
            scores = scoring.subquery_segment_maxsim(sim, masks, segments, len(corpus))
            n_tokens = masks.sum(dim=1).to(scores.dtype)
            token_sims = [sim] * len(props)
            token_masks = list(masks)
        means = scores / n_tokens.unsqueeze(1)
        if self.lexical_weight:
            means = means + self.lexical_weight * self.lexical_prior(sentence, corpus).unsqueeze(0)
        top = min(2, len(corpus))
        # Stable sort: ties go to the lower passage index, so results are deterministic.
        best = torch.sort(means, dim=1, descending=True, stable=True)  # columns 0 and 1 are used
        out_props = []
        for i, piece in enumerate(props):
            p = int(best.indices[i, 0])
            score = float(best.values[i, 0])
            runner = float(best.values[i, 1]) if top > 1 else float("-inf")
            cited = self.margin is None or score - runner >= self.margin
            span = self._best_span(corpus, p, token_sims[i], token_masks[i])
            out_props.append(PropositionCitation(piece, span_text(sentence, piece), p if cited else None, p,
                                                 span, score, runner, tuple(means[i].tolist())))
        citations = self._citations(out_props, means, best)
        return SentenceCitation(0, len(sentence), sentence, citations, tuple(out_props))

    def lexical_prior(self, sentence: str, corpus: EncodedCorpus) -> torch.Tensor:
        """BM25 of ``sentence`` against each passage (statistics of these passages), max-normalised to [0, 1]."""
        key = id(corpus)
        if key not in self._lexical_cache or self._lexical_cache[key][0] is not corpus:
            if len(self._lexical_cache) >= 8:
                self._lexical_cache.pop(next(iter(self._lexical_cache)))
            self._lexical_cache[key] = (corpus, LexicalCollection([simple_tokenize(t) for t in corpus.texts]))
        scores = torch.tensor(self._lexical_cache[key][1].scores(simple_tokenize(sentence)), dtype=torch.float32)
        top = float(scores.max()) if scores.numel() else 0.0
        return scores / top if top > 0 else torch.zeros_like(scores)

    def _citations(self, props: List[PropositionCitation], means: torch.Tensor, best) -> Tuple[int, ...]:
        if self.mode == "sentence-top2" and means.shape[1] > 1:
            # Top 2; with a margin, the second only when the first does not clear it.
            ranked = [int(best.indices[0, 0])]
            if self.margin is None or float(best.values[0, 0] - best.values[0, 1]) < self.margin:
                ranked.append(int(best.indices[0, 1]))
        else:
            strength = {}
            for prop in props:
                if prop.passage is not None:
                    strength[prop.passage] = max(strength.get(prop.passage, float("-inf")), prop.score)
            ranked = sorted(strength, key=lambda k: (-strength[k], k))
        if self.max_citations is not None:
            ranked = ranked[: self.max_citations]
        return tuple(ranked)

    @staticmethod
    def _best_span(corpus: EncodedCorpus, p: int, sim: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple[int, int]:
        """The sentence of passage ``p`` that holds most of the proposition's per-token maxima."""
        sl = corpus.passage_tokens(p)
        local = sim[:, sl] if mask is None else sim[mask][:, sl]
        values, where = local.max(dim=1)
        sentence_ids = corpus.token_sentence[sl][where]
        inside = sentence_ids >= 0
        if not bool(inside.any()):
            return (0, len(corpus.texts[p]))
        weight: dict = {}
        for s, v in zip(sentence_ids[inside].tolist(), values[inside].tolist()):
            weight[s] = weight.get(s, 0.0) + max(v, 0.0) + 1e-6
        s = max(weight, key=lambda k: (weight[k], -k))
        start, end = (int(x) for x in corpus.sentences[s])
        return (start, end)

    # -- answers -------------------------------------------------------------------
    def stream(self, sentences: Iterable[str], passages: Union[EncodedCorpus, Iterable[PassageLike]]
               ) -> Iterator[SentenceCitation]:
        """Cite sentences one at a time as a generator produces them (passages encoded once)."""
        corpus = self.encode(passages)
        for sentence in sentences:
            yield self.cite_sentence(sentence, corpus)

    def cite(self, answer: str, passages: Union[EncodedCorpus, Iterable[PassageLike]]) -> CitedAnswer:
        """Split ``answer`` into sentences, cite each, and return it with ``[n]`` markers."""
        corpus = self.encode(passages)
        cited = []
        for start, end in split_sentences(answer):
            one = self.cite_sentence(answer[start:end], corpus)
            props = tuple(pc._replace(pieces=tuple((s + start, e + start) for s, e in pc.pieces))
                          for pc in one.propositions)
            cited.append(one._replace(start=start, end=end, propositions=props))
        return CitedAnswer(insert_markers(answer, cited), tuple(cited))


_CLOSING = re.compile(r"[.!?;:]+[\"'”’)\]]*$")


def insert_markers(answer: str, sentences: Sequence[SentenceCitation]) -> str:
    """``answer`` with ``[n]`` (passage index + 1) before each cited sentence's final punctuation."""
    out, last = [], 0
    for sent in sentences:
        if not sent.citations:
            continue
        body = answer[sent.start:sent.end]
        tail = _CLOSING.search(body)
        at = sent.start + (tail.start() if tail else len(body))
        out.append(answer[last:at])
        out.append(" " + "".join(f"[{c + 1}]" for c in sorted(sent.citations)))
        last = at
    out.append(answer[last:])
    return "".join(out)


def cite(answer: str, passages: Union[EncodedCorpus, Iterable[PassageLike]], *,
         model: Union[Ranker, Encoder, str, Path, None] = None, margin: Optional[float] = None,
         max_citations: Optional[int] = None, mode: Mode = "propositions",
         lexical_weight: float = 0.0) -> CitedAnswer:
    """Attribute every proposition of ``answer`` to ``passages`` and add ``[n]`` citations.

    >>> result = cite(answer, [passage_1, passage_2])
    >>> result.text                       # "… sentence one [1]. Sentence two [1][2]."
    >>> result.sentences[1].propositions  # per proposition: passage, span in it, score
    """
    return Citer(model, mode=mode, margin=margin, max_citations=max_citations,
                 lexical_weight=lexical_weight).cite(answer, passages)


__all__ = ["cite", "Citer", "CitedAnswer", "SentenceCitation", "PropositionCitation", "insert_markers", "MODES"]

"""PropSegmEnt (Wikipedia part): sentences, reference propositions as character spans, ENTAILS queries.

Rules (documented in benchmarks/README.md through the atomic-facts section):

- Wikipedia part: clusters listed in ``document_clusters.<split>.json``.
- Candidates: the reference segmentation's propositions (``is_reference_response``) of
  every Wikipedia sentence of dev and test (test sentences are distractors).
- Queries: dev relationships whose majority (> half of the raters) label is ENTAILS; the
  query is the hypothesis proposition inside its sentence.
- Gold propositions: for each entailing rater's supporting proposition, the candidate of
  its premise sentence with the highest token Jaccard to it, if that is ≥ 0.5 (an exact
  match has Jaccard 1; ties all count). Gold sentences: every premise sentence holding a
  supporting proposition. Queries with no gold proposition count as misses.
- The query's own sentence never provides candidates.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Sequence, Tuple

from .common import data_dir

JACCARD_MIN = 0.5
SentenceKey = Tuple[str, str, int]  # cluster id, document id, sentence index


@dataclass
class Sentence:
    key: SentenceKey
    split: str
    text: str
    token_spans: List[Tuple[int, int]]  # character span of each PropSegmEnt token
    propositions: List[FrozenSet[int]] = field(default_factory=list)  # reference segmentation

    def pieces(self, tokens: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
        """Character pieces of a proposition (a token index set), adjacent tokens merged."""
        pieces: List[Tuple[int, int]] = []
        for t in sorted(tokens):
            s, e = self.token_spans[t]
            if pieces and s - pieces[-1][1] <= 1 and self.text[pieces[-1][1]:s].strip() == "":
                pieces[-1] = (pieces[-1][0], e)
            else:
                pieces.append((s, e))
        return tuple(pieces)

    def proposition_text(self, tokens: Sequence[int]) -> str:
        return " ".join(self.text[s:e] for s, e in self.pieces(tokens))


@dataclass
class Query:
    qid: str
    sentence: SentenceKey
    tokens: FrozenSet[int]
    supports: List[Tuple[SentenceKey, FrozenSet[int]]]  # every entailing rater's supporting proposition
    gold: List[int] = field(default_factory=list)  # candidate indices

    @property
    def gold_sentences(self) -> set:
        return {key for key, _ in self.supports}


def jaccard(a: FrozenSet[int], b: FrozenSet[int]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def load_sentences(split: str) -> Dict[SentenceKey, Sentence]:
    clusters = json.loads((data_dir() / "propsegment" / f"document_clusters.{split}.json").read_text())
    out: Dict[SentenceKey, Sentence] = {}
    for cluster in clusters:
        for doc in cluster["documents"]:
            for k, sent in enumerate(doc["sentences"]):
                text = sent["sentence_text"]
                spans = [(t["character_offset_of_token_in_sentence"],
                          t["character_offset_of_token_in_sentence"] + len(t["text"])) for t in sent["tokens"]]
                key = (cluster["cluster_id"], doc["document_id"], k)
                out[key] = Sentence(key, split, text, spans)
    props = json.loads((data_dir() / "propsegment" / f"propositions.{split}.json").read_text())
    for record in props:
        sid = record["sentence_id"]
        key = (sid["cluster_id"], sid["document_id"], sid["sentence_index"])
        if key not in out:
            continue  # NewsHead sentence (no text offline)
        for response in record["segmentation_responses"]:
            if response.get("is_reference_response"):
                out[key].propositions = [frozenset(p["token_indices"]) for p in response["propositions"]
                                         if p.get("token_indices")]
    return out


@dataclass
class AtomicData:
    sentences: Dict[SentenceKey, Sentence]
    candidates: List[Tuple[SentenceKey, FrozenSet[int]]]  # (sentence, proposition tokens)
    queries: List[Query]
    no_gold: int  # queries whose supporting proposition matches no candidate

    def by_sentence(self) -> Dict[SentenceKey, List[int]]:
        """Candidate indices grouped by their sentence, sentences in sorted order."""
        return group_by_sentence(self.candidates)


def group_by_sentence(candidates: Sequence[Tuple[SentenceKey, FrozenSet[int]]]) -> Dict[SentenceKey, List[int]]:
    groups: Dict[SentenceKey, List[int]] = {}
    for i, (key, _) in enumerate(candidates):
        groups.setdefault(key, []).append(i)
    return dict(sorted(groups.items()))


def load_atomic() -> AtomicData:
    sentences = {**load_sentences("dev"), **load_sentences("test")}
    candidates = [(key, prop) for key, s in sentences.items() for prop in s.propositions]
    by_sentence = group_by_sentence(candidates)
    relationships = json.loads((data_dir() / "propsegment" / "relationships.dev.json").read_text())
    queries: List[Query] = []
    no_gold = 0
    for n, rel in enumerate(relationships):
        responses = rel["relationship_responses"]
        label, count = Counter(r["relationship"] for r in responses).most_common(1)[0]
        if label != "RELATIONSHIP_ENTAILS" or count * 2 <= len(responses):
            continue
        hyp = rel["hypothesis_proposition"]
        key = (rel["cluster_id"], hyp["document_id"], hyp["sentence_index"])
        if key not in sentences:
            continue
        supports = [r["supporting_premise_proposition"] for r in responses
                    if r["relationship"] == "RELATIONSHIP_ENTAILS" and r.get("supporting_premise_proposition")]
        if not supports:
            continue
        support_sets = [((rel["cluster_id"], rel["premise_document_id"], s["sentence_index"]),
                         frozenset(s["proposition"]["token_indices"])) for s in supports]
        query = Query(f"rel-{n}", key, frozenset(hyp["proposition"]["token_indices"]), support_sets)
        gold = set()
        for premise, support in support_sets:
            scored = [(jaccard(candidates[i][1], support), i) for i in by_sentence.get(premise, [])]
            best = max((j for j, _ in scored), default=0.0)
            if best >= JACCARD_MIN:
                gold.update(i for j, i in scored if j == best)
        query.gold = sorted(gold)
        no_gold += not query.gold
        queries.append(query)
    return AtomicData(sentences, candidates, queries, no_gold)

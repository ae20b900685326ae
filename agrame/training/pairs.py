"""A user's training pairs for ``agrame train``: read, checked line by line, and made into training records.

One JSON object a line::

    {"query": "...",                       # required
     "positive": "...",                    # required: the passage text, or the id of a --corpus passage
     "negatives": ["...", ...],            # optional: texts or corpus ids (hard negatives mined when absent)
     "sentences": [0, 2],                  # optional: the positive's answering sentences (agrame's split)
     "spans": [[120, 188]],                # optional: answering character spans of the positive
     "scores": [9.1, 2.0, ...]}            # optional: a teacher's logits for the positive, then each negative

``sentences`` index the positive's sentences as :func:`agrame.spans.split_sentences` splits it (``agrame
rank --granularity sentence`` shows the same split); a span labels every sentence it overlaps. Any error
names the file, the line and the field (:class:`agrame.io.InputError`), before anything is written."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from agrame.io import InputError, read_lines
from agrame.spans import split_sentences

from .records import answer_sentences

#: The gold label's teacher logit: p(gold) ≈ 0.98 among 4 passages (the research recipe's ``labels`` teacher).
GOLD_LOGIT = 5.0
FIELDS = ("query", "positive", "negatives", "sentences", "spans", "scores", "id")


@dataclass
class Pair:
    query: str
    positive: str                               # the positive passage's text
    negatives: List[str] = field(default_factory=list)
    answer_sentences: Optional[List[int]] = None  # None: no sentence labels
    scores: Optional[List[float]] = None
    qid: str = ""
    line: int = 0


class Corpus:
    """The passages negatives come from: ``--corpus`` (ids and texts), or the pairs' own texts."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str]):
        self.ids, self.texts = list(ids), list(texts)
        self.by_id = {pid: i for i, pid in enumerate(self.ids)}
        self.by_text: Dict[str, int] = {}
        for i, t in enumerate(self.texts):
            self.by_text.setdefault(t, i)

    def __len__(self) -> int:
        return len(self.texts)

    def resolve(self, value: str) -> Optional[int]:
        """A passage named by its id, else by its exact text; None when it is neither."""
        if value in self.by_id:
            return self.by_id[value]
        return self.by_text.get(value)


def read_corpus(path: str, fmt: str = "auto") -> Corpus:
    from agrame.io import read_passages

    passages = read_passages(path, fmt)
    return Corpus([p.id for p in passages], [p.text for p in passages])


def _strings(value, name: str, where: tuple) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError("expected a list of non-empty strings", *where, name)
    return value


def _labels(record: dict, text: str, where: tuple) -> Optional[List[int]]:
    """The positive's answering sentences from ``sentences`` and ``spans``; None when neither is given."""
    if "sentences" not in record and "spans" not in record:
        return None
    bounds = [list(s) for s in split_sentences(text)]
    chosen = set()
    if "sentences" in record:
        value = record["sentences"]
        if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in value):
            raise InputError("expected a non-empty list of sentence numbers", *where, "sentences")
        for i in value:
            if not 0 <= i < len(bounds):
                raise InputError(f"sentence {i} is outside the positive passage, which has {len(bounds)} "
                                 f"sentence(s), numbered from 0", *where, "sentences")
        chosen.update(value)
    if "spans" in record:
        value = record["spans"]
        if not isinstance(value, list) or not value:
            raise InputError("expected a non-empty list of [start, end] character spans", *where, "spans")
        for span in value:
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                       for x in span)):
                raise InputError(f"{json.dumps(span)}: expected [start, end] in characters", *where, "spans")
            start, end = span
            if not 0 <= start < end <= len(text):
                raise InputError(f"span [{start}, {end}] is outside the positive passage ({len(text)} characters)",
                                 *where, "spans")
            chosen.update(answer_sentences(bounds, start, end))
    return sorted(chosen)


def _pair(record, corpus: Optional[Corpus], where: tuple) -> Pair:
    if not isinstance(record, dict):
        raise InputError("expected a JSON object {\"query\", \"positive\", ...}", *where)
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise InputError(f"unknown field(s) {', '.join(unknown)}; a pair has {', '.join(FIELDS)}", *where, unknown[0])
    for name in ("query", "positive"):
        if not isinstance(record.get(name), str) or not record[name].strip():
            raise InputError("missing or empty (a non-empty string is required)", *where, name)
    positive = record["positive"]
    negatives = _strings(record["negatives"], "negatives", where) if "negatives" in record else []
    if corpus is not None:
        found = corpus.resolve(positive)
        if found is None:
            raise InputError(f"{positive[:60]!r} is not in the corpus (neither a passage id nor a passage text "
                             "of --corpus)", *where, "positive")
        positive = corpus.texts[found]
        resolved = []
        for value in negatives:
            k = corpus.resolve(value)
            if k is None:
                raise InputError(f"{value[:60]!r} is not in the corpus (neither a passage id nor a passage text "
                                 "of --corpus)", *where, "negatives")
            resolved.append(corpus.texts[k])
        negatives = resolved
    if positive in negatives:
        raise InputError("the positive passage is also listed as a negative", *where, "negatives")
    scores = None
    if "scores" in record:
        value = record["scores"]
        if not isinstance(value, list) or len(value) != 1 + len(negatives) or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in value):
            raise InputError(f"expected {1 + len(negatives)} finite numbers: the positive's teacher logit, then "
                             "one for each negative", *where, "scores")
        scores = [float(s) for s in value]
    qid = record.get("id", "")
    return Pair(record["query"], positive, negatives, _labels(record, positive, where), scores,
                str(qid) if qid != "" else f"line-{where[1]}", where[1])


def read_pairs(path: str, corpus: Optional[Corpus] = None) -> List[Pair]:
    """Every pair of ``path`` (JSONL), checked; an :class:`InputError` names the first bad line and field."""
    pairs: List[Pair] = []
    for number, line in read_lines(path):
        if not line.strip():
            continue
        where = (path, number)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON ({exc.msg} at column {exc.colno})", *where) from None
        pairs.append(_pair(record, corpus, where))
    if not pairs:
        raise InputError("no training pairs (the file is empty)", path)
    return pairs


def pairs_corpus(pairs: Sequence[Pair]) -> Corpus:
    """Without ``--corpus``: every distinct passage text the pairs hold is the pool negatives come from."""
    texts: Dict[str, None] = {}
    for p in pairs:
        texts.setdefault(p.positive)
        for n in p.negatives:
            texts.setdefault(n)
    return Corpus([str(i) for i in range(len(texts))], list(texts))


def to_record(pair: Pair, negatives: Sequence[str], strength: float = GOLD_LOGIT) -> dict:
    """A training record (:mod:`agrame.training.records`): the positive first, then ``negatives``; the teacher
    is the pair's scores (a mined negative beyond them: the lowest of them) or the gold labels."""
    passages = []
    for k, text in enumerate([pair.positive, *negatives]):
        sentences = [list(s) for s in split_sentences(text)]
        gold = (pair.answer_sentences or []) if k == 0 else []
        if pair.scores is not None:
            teacher = pair.scores[k] if k < len(pair.scores) else min(pair.scores)
        else:
            teacher = strength if k == 0 else 0.0
        passages.append({"pid": f"{pair.qid}-{k}", "text": text, "sentences": sentences, "positive": k == 0,
                         "answer_sentences": gold, "teacher": teacher,
                         "teacher_sentences": [strength if j in gold else 0.0 for j in range(len(sentences))]})
    return {"qid": pair.qid, "question": pair.query, "passages": passages,
            "sentence_labels": pair.answer_sentences is not None}

"""Metric definitions and answer matching: each defined once, here.

Ranked lists are judged as lists of booleans (is the item at rank r relevant?), so the
same functions serve passages, sentences and propositions, and ties are whatever order
the ranker produced (the Ranker breaks ties by corpus order, deterministically).
"""

from __future__ import annotations

import re
import string
import unicodedata
from typing import Dict, Iterable, List, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/DPR normalisation: NFKC, lower case, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def has_answer(text: str, answers: Iterable[str]) -> bool:
    """Whether ``text`` contains a normalised answer as a whole-word sequence."""
    haystack = f" {normalize_answer(text)} "
    return any(f" {a} " in haystack for a in (normalize_answer(x) for x in answers) if a)


def precision_at_1(relevant: Sequence[bool]) -> float:
    """1 if the top-ranked item is relevant (P@1), else 0; an empty ranking scores 0."""
    return float(bool(relevant) and bool(relevant[0]))


def recall_at_k(relevant: Sequence[bool], k: int) -> float:
    """1 if any relevant item is in the top k, else 0 (answer recall / success@k, as in DPR
    and the AGRaME tables); several relevant items in the top k still count once."""
    return float(any(relevant[:k]))


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return 100.0 * sum(values) / len(values) if values else float("nan")


def summarize(per_question: List[Dict[str, float]]) -> Dict[str, float]:
    """Mean (in %) of each metric over the questions that have it."""
    keys = sorted({k for q in per_question for k in q})
    return {k: round(mean(q[k] for q in per_question if k in q), 2) for k in keys}


def citation_scores(cases: Iterable[tuple]) -> Dict[str, float]:
    """Citation precision / recall / F1 (in %) over claims.

    ``cases``: ``(cited, gold_sets)`` per claim — ``cited`` the set of passages cited,
    ``gold_sets`` alternative sufficient sets of supporting passages (empty: the claim has
    no support and should stay uncited).

    - precision: cited passages in some gold set / all cited passages (micro; every
      citation on an unsupported claim is wrong);
    - recall: per supported claim, the best share of one gold set that was cited, averaged;
    - F1: their harmonic mean; ``uncited_unsupported``: share of unsupported claims left
      without citation; ``any_gold``: supported claims with at least one gold citation.
    """
    n_cited = n_right = 0
    recalls: List[float] = []
    hits: List[float] = []
    unsupported: List[float] = []
    for cited, gold_sets in cases:
        cited = set(cited)
        gold_sets = [set(g) for g in gold_sets if g]
        union = set().union(*gold_sets) if gold_sets else set()
        n_cited += len(cited)
        n_right += len(cited & union)
        if gold_sets:
            recalls.append(max(len(cited & g) / len(g) for g in gold_sets))
            hits.append(float(bool(cited & union)))
        else:
            unsupported.append(float(not cited))
    precision = 100.0 * n_right / n_cited if n_cited else 0.0
    recall = mean(recalls) if recalls else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 1), "recall": round(recall, 1), "f1": round(f1, 1),
            "any_gold": round(mean(hits), 1) if hits else float("nan"),
            "uncited_unsupported": round(mean(unsupported), 1) if unsupported else float("nan"),
            "claims": len(recalls) + len(unsupported), "supported": len(recalls),
            "unsupported": len(unsupported), "citations": n_cited}

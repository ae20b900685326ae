"""Metric definitions, each defined once, here (answer matching: :mod:`agrame.datasets`).

Ranked lists are judged as lists of booleans (is the item at rank r relevant?), so the
same functions serve passages, sentences and propositions, and ties are whatever order
the ranker produced (the Ranker breaks ties by corpus order, deterministically).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

from agrame.datasets import has_answer, normalize_answer  # noqa: F401 (answer matching: defined in the product)


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
        cited_n, right_n, recall = citation_claim_counts(cited, gold_sets)
        n_cited += cited_n
        n_right += right_n
        if recall is not None:
            recalls.append(recall)
            hits.append(float(right_n > 0))
        else:
            unsupported.append(float(not cited_n))
    precision, recall, f1 = precision_recall_f1(n_cited, n_right, sum(recalls), len(recalls))
    return {"precision": round(precision, 1), "recall": round(recall, 1), "f1": round(f1, 1),
            "any_gold": round(mean(hits), 1) if hits else float("nan"),
            "uncited_unsupported": round(mean(unsupported), 1) if unsupported else float("nan"),
            "claims": len(recalls) + len(unsupported), "supported": len(recalls),
            "unsupported": len(unsupported), "citations": n_cited}


def per_question(ids: Sequence[str], rows: Sequence[Dict[str, float]],
                 keys: Sequence[str] = ("psg_p1", "sent_p1", "prop_p1")) -> Dict[str, list]:
    """Each question's value of ``keys`` (None where a question lacks the metric), in question order,
    with the question ids: what a paired test between two runs on the same questions reads."""
    out: Dict[str, list] = {"ids": [str(i) for i in ids]}
    for key in keys:
        if any(key in r for r in rows):
            out[key] = [r.get(key) for r in rows]
    return out


def precision_recall_f1(n_cited, n_right, recall_sum, n_supported):
    """Citation precision, recall and F1 (in %) from the sums over claims (micro precision, recall averaged
    over the supported claims); numbers or arrays of them (the paired test's swaps), which broadcast."""
    import numpy as np

    n_cited, n_right = np.asarray(n_cited, dtype=float), np.asarray(n_right, dtype=float)
    precision = 100.0 * np.divide(n_right, n_cited, out=np.zeros_like(n_right), where=n_cited > 0)
    recall = 100.0 * np.asarray(recall_sum, dtype=float) / n_supported if n_supported else np.zeros_like(precision)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    return (float(precision), float(recall), float(f1)) if np.ndim(f1) == 0 else (precision, recall, f1)


def citation_claim_counts(cited, gold_sets) -> list:
    """One claim's part of :func:`citation_scores`: ``[citations, right citations, recall or None]``."""
    cited = set(cited)
    gold_sets = [set(g) for g in gold_sets if g]
    union = set().union(*gold_sets) if gold_sets else set()
    recall = max(len(cited & g) / len(g) for g in gold_sets) if gold_sets else None
    return [len(cited), len(cited & union), recall]


def paired_test(candidate: Sequence, baseline: Sequence, kind: str = "mean", trials: int = 10_000,
                seed: int = 0) -> Dict[str, float]:
    """Is ``candidate`` below ``baseline`` on the same questions? A paired randomisation test.

    Each question's pair of outcomes is swapped between the two systems with probability ½
    (Fisher's randomisation test, the one Smucker, Allan & Carterette 2007 recommend for IR
    metrics); ``p`` is the one-sided share of swaps whose difference is at most the observed one
    (with the observed assignment counted, so ``p > 0``). ``kind="mean"``: per-question values
    (None = the question lacks the metric in both; it is dropped), the statistic their mean in
    points; ``kind="citation"``: :func:`citation_claim_counts` rows, the statistic citation F1.
    ``se``: the standard deviation of the randomisation distribution (the difference's standard
    error under no difference), in points.
    """
    import numpy as np

    if len(candidate) != len(baseline):
        raise ValueError(f"paired test: {len(candidate)} against {len(baseline)} questions")
    rng = np.random.default_rng(seed)
    if kind == "mean":
        pairs = [(a, b) for a, b in zip(candidate, baseline) if a is not None and b is not None]
        a = np.array([p[0] for p in pairs], dtype=float)
        b = np.array([p[1] for p in pairs], dtype=float)
        d = 100.0 * (a - b)
        n = len(d)
        observed = float(d.mean()) if n else 0.0
        flips = rng.choice((-1.0, 1.0), size=(trials, n))
        null = (flips * d).mean(axis=1) if n else np.zeros(trials)
    elif kind == "citation":
        a = np.array([[c, r, -1.0 if rec is None else rec] for c, r, rec in candidate], dtype=float)
        b = np.array([[c, r, -1.0 if rec is None else rec] for c, r, rec in baseline], dtype=float)
        supported = a[:, 2] >= 0
        if not np.array_equal(supported, b[:, 2] >= 0):
            raise ValueError("paired test: the two runs judge different claims as supported")
        n, n_sup = len(a), int(supported.sum())
        a[:, 2] = np.where(supported, a[:, 2], 0.0)
        b[:, 2] = np.where(supported, b[:, 2], 0.0)

        def f1(rows):
            return precision_recall_f1(rows[..., 0].sum(-1), rows[..., 1].sum(-1), rows[..., 2].sum(-1), n_sup)[2]

        observed = float(f1(a) - f1(b))
        swap = rng.random((trials, n)) < 0.5
        left = np.where(swap[..., None], b[None], a[None])
        right = np.where(swap[..., None], a[None], b[None])
        null = f1(left) - f1(right)
    else:
        raise ValueError(f"paired test: unknown kind {kind!r}")
    p = (1 + int((null <= observed + 1e-9).sum())) / (trials + 1)
    return {"difference": round(observed, 2), "p": round(p, 4), "se": round(float(np.std(null)), 2),
            "questions": int(n), "trials": trials}

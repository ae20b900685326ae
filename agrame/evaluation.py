"""Evaluation of run files through ``ir_measures`` (``pip install "agrame[eval]"``), the field's
common interface to trec_eval and friends: the same numbers a pyserini or PyTerrier user gets.

Passage- and sentence-level runs are evaluated alike: qrels name sentences as runs do
(``PASSAGE#START:END``, :mod:`agrame.runs`).
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

DEFAULT_MEASURES = ("nDCG@10", "R@100", "RR@10", "P@1")


class EvaluationError(ValueError):
    """An unknown measure, or ``ir_measures`` missing."""


def _ir_measures():
    try:
        import ir_measures
    except ImportError:
        raise EvaluationError('evaluation needs ir_measures: pip install "agrame[eval]"') from None
    return ir_measures


def parse_measures(names: Sequence[str]) -> list:
    ir_measures = _ir_measures()
    out = []
    for name in names:
        try:
            out.append(ir_measures.parse_measure(name))
        except (NameError, ValueError, TypeError, SyntaxError) as exc:
            raise EvaluationError(f"unknown measure {name!r} ({exc}); e.g. {' '.join(DEFAULT_MEASURES)}") from None
    return out


def evaluate(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
             measures: Sequence[str] = DEFAULT_MEASURES, per_query: bool = False):
    """Mean of each measure over the qrels' queries (a query the run lacks scores 0, as trec_eval
    with ``-c``); with ``per_query``, also ``{qid: {measure: value}}``."""
    ir_measures = _ir_measures()
    parsed = parse_measures(measures)
    names = {m: n for m, n in zip(parsed, measures)}
    per: Dict[str, Dict[str, float]] = {qid: {n: 0.0 for n in measures} for qid in qrels}
    for row in ir_measures.iter_calc(parsed, qrels, run):
        if row.query_id in per:
            per[row.query_id][names[row.measure]] = float(row.value)
    mean = {n: (sum(v[n] for v in per.values()) / len(per) if per else 0.0) for n in measures}
    return (mean, per) if per_query else mean

"""Evaluation of run files through ``ir_measures`` (``pip install "agrame[eval]"``), the field's
common interface to trec_eval and friends: the same numbers a pyserini or PyTerrier user gets.

Passage- and sentence-level runs are evaluated alike: qrels name sentences as runs do
(``PASSAGE#START:END``, :mod:`agrame.runs`).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

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


def granularity(docid: str) -> str:
    """``passage`` for a passage id, ``sentence`` for ``PASSAGE#START:END`` (a sentence or span: a
    passage id's own ``#`` is always percent-encoded, :mod:`agrame.runs`)."""
    return "sentence" if "#" in docid else "passage"


def check_granularity(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> None:
    """Refuse a run whose docids are of another granularity than the qrels' (every docid would count
    as unjudged: 0.0 on every measure, silently)."""
    def kinds(table) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for docs in table.values():
            for d in docs:
                out.setdefault(granularity(d), d)
        return out

    in_run, in_qrels = kinds(run), kinds(qrels)
    if in_run and in_qrels and not set(in_run) & set(in_qrels):
        (r, rd), (q, qd) = next(iter(in_run.items())), next(iter(in_qrels.items()))
        raise EvaluationError(f"the run ranks {r}s (e.g. {rd!r}) but the qrels judge {q}s (e.g. {qd!r}): evaluate a "
                              f"{q} run (agrame search -g {q} --run FILE) or qrels that judge {r}s")


def span_mismatch(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> Optional[str]:
    """A warning when most judged sentences whose passage the run ranks are not among the run's own
    sentence ids: the qrels' sentence spans are not AGRaME's (e.g. another sentence splitter), so
    hits on the right sentence would count as misses."""
    near = exact = 0
    for qid, judged in qrels.items():
        ranked = run.get(qid, {})
        if not ranked:
            continue
        passages = {d.split("#", 1)[0] for d in ranked}
        for d in judged:
            if "#" in d and d.split("#", 1)[0] in passages:
                near += 1
                exact += d in ranked
    if near >= 10 and exact < near / 2:
        return (f"of {near} judged sentences whose passage the run ranks, only {exact} are among its sentence ids: "
                "sentence qrels must name AGRaME's own sentence spans (agrame.spans.split_sentences, as an index "
                "stores them), not another splitter's")
    return None


def id_mismatch(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> Optional[str]:
    """A warning when the run and the qrels do not seem to name the same things: most of the run's
    queries are not in the qrels, or most of them rank no passage the qrels judge at all (the run
    came from an index of other ids — e.g. pool positions against source ids — and would score 0)."""
    shared = [q for q in run if q in qrels]
    if run and len(shared) < len(run) / 2:
        example = next(q for q in run if q not in qrels)
        return (f"only {len(shared)} of the run's {len(run)} queries are in the qrels (e.g. {example!r} is not): "
                "are the query ids the same?")
    judged = {d.split("#", 1)[0] for table in qrels.values() for d in table}
    touching = sum(any(d.split("#", 1)[0] in judged for d in run[q]) for q in shared)
    if len(shared) >= 10 and touching < len(shared) / 2:
        ranked = next(iter(run[shared[0]]), "")
        return (f"in {len(shared) - touching} of {len(shared)} queries the run ranks no passage the qrels judge "
                f"(run ids like {ranked!r}, qrels ids like {next(iter(sorted(judged)))!r}): are they ids of the "
                "same corpus?")
    return None


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

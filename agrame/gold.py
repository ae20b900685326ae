"""What the open-domain benchmarks count as relevant — the one place for it — and the same gold as
TREC qrels (``agrame qrels``), so that ``agrame search --queries … --run`` + ``agrame evaluate``
reproduce ``benchmarks.open_domain``'s P@1 and R@k end to end.

Gold (as ``benchmarks.open_domain`` judges): squad-dev — the question's paragraph, and the sentence
holding the answer offset; nq-oracle — its gold passage, and that passage's sentences containing a
normalised answer (none when the answer is split over two sentences: the question then has no
sentence qrels, as the benchmark leaves it out of sentence P@1); nq-open, entityquestions, trivia,
webq — every pool passage, and every sentence of those passages, containing a normalised answer
(questions whose answer occurs nowhere have no qrels: the benchmark's ``metrics_answerable``).

Document ids are the run files' (:mod:`agrame.runs`): a passage's id — the pool's source id
(``squad-dev-3-5``, ``nq-17``, ``lead-4``) or, with ``ids="number"``, its position in the pool (the
ids of ``benchmarks.index_search``'s cached index) — and ``PASSAGE#START:END`` for a sentence, with
the sentence spans of the index the run came from (:func:`agrame.spans.split_sentences` unless an
index's own are given).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .datasets import Pool, Question, has_answer, normalize_answer, sentence_of
from .runs import span_docid

Spans = Sequence[Tuple[int, int]]


def gold_sentences(dataset: str, q: Question, text: str, spans: Spans) -> Set[int]:
    """Indices (within the passage) of the gold sentences of ``q`` in a passage it judges relevant."""
    if dataset == "squad-dev" and q.gold_passage is not None:
        return {sentence_of(spans, q.answer_start)}
    return {k for k, (s, e) in enumerate(spans) if has_answer(text[s:e], q.answers)}


class AnswerIndex:
    """Which pool passages contain a normalised answer (``has_answer`` over the whole pool, with
    each passage normalised once)."""

    def __init__(self, texts: Sequence[str]):
        self._norm = [f" {normalize_answer(t)} " for t in texts]

    def __call__(self, answers: Iterable[str]) -> List[int]:
        needles = [f" {a} " for a in (normalize_answer(x) for x in answers) if a]
        return [p for p, hay in enumerate(self._norm) if any(n in hay for n in needles)]


def gold_passages(q: Question, answers: Optional[AnswerIndex]) -> List[int]:
    """Pool indices of the passages relevant to ``q``."""
    if q.gold_passage is not None:
        return [q.gold_passage]
    assert answers is not None, "answer-match datasets need the pool's AnswerIndex"
    return answers(q.answers)


def qrels(dataset: str, questions: Sequence[Question], pool: Pool, granularity: str,
          spans_of: Optional[Callable[[int], Spans]] = None, ids: str = "source") -> Dict[str, Dict[str, int]]:
    """``{qid: {docid: 1}}`` of ``questions`` at ``granularity`` (``passage`` or ``sentence``).

    ``spans_of(p)``: the sentence spans of pool passage ``p`` as the index holds them (default:
    :func:`agrame.spans.split_sentences`, what an index stores when given none).
    """
    from .spans import split_sentences

    if granularity not in ("passage", "sentence"):
        raise ValueError(f"granularity {granularity!r}: qrels judge passages or sentences")
    if ids not in ("source", "number"):
        raise ValueError(f"ids {ids!r}: 'source' (the pool's source ids) or 'number' (pool positions)")
    spans_of = spans_of or (lambda p: split_sentences(pool.texts[p]))
    answers = None if all(q.gold_passage is not None for q in questions) else AnswerIndex(pool.texts)
    name = (lambda p: pool.ids[p]) if ids == "source" else str
    out: Dict[str, Dict[str, int]] = {}
    for q in questions:
        judged: Dict[str, int] = {}
        for p in gold_passages(q, answers):
            if granularity == "passage":
                judged[span_docid(name(p))] = 1
                continue
            spans = list(spans_of(p))
            for k in sorted(gold_sentences(dataset, q, pool.texts[p], spans)):
                judged[span_docid(name(p), [spans[k]])] = 1
        if judged:
            out[q.qid] = judged
    return out

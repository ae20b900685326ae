"""Benchmark data: the pooled corpus and the question sets live in :mod:`agrame.datasets` (``agrame qrels``
reads them too); here what only the benchmarks use."""

from __future__ import annotations

from typing import List, Sequence

from agrame.datasets import (OPEN_DOMAIN_DATASETS, Pool, Question, load_pool, load_questions,  # noqa: F401 (re-exported)
                             normalize_answer, restrict_pool, squad_id)


class PoolMatcher:
    """Does a normalised answer occur anywhere in the pool? (An upper bound on answerability.)"""

    def __init__(self, pool_texts: Sequence[str]):
        # One string with a separator no normalised text contains: one search per answer.
        self._haystack = " \x00 ".join(normalize_answer(t) for t in pool_texts)
        self._haystack = f" {self._haystack} "

    def __call__(self, answers: Sequence[str]) -> bool:
        return any(f" {a} " in self._haystack for a in (normalize_answer(x) for x in answers) if a)


def mixed_questions(pool: "Pool", n: int, seed: int = 0) -> List[str]:
    """``n`` question texts, half SQuAD dev and half nq-oracle (seeded samples): parity checks of
    encoders want both styles of question."""
    from .common import sample

    out = [q.text for q in sample(load_questions("squad-dev", pool), n // 2, seed)]
    return out + [q.text for q in sample(load_questions("nq-oracle", pool), n - len(out), seed)]

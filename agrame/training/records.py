"""The training record, one JSONL line per query — the one format every trainer here reads::

    {"qid", "question", "answer"?,
     "passages": [{"pid", "text", "sentences": [[start, end], ...], "positive": bool,
                   "answer_sentences": [i, ...]}, ...],          # the positive first
     "teacher": {"passage": [...], "sentence": [[...], ...]}?}   # a teacher's logits (distillation)

``agrame train`` makes these from a user's pairs (:mod:`agrame.training.pairs`); the research scripts from
SQuAD, SciFact and the DPR sets (``training/mined.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, List, Sequence


def answer_sentences(sentences: Sequence[Sequence[int]], start: int, end: int) -> List[int]:
    """Indices of the sentences that overlap the answer span ``[start, end)``."""
    return [i for i, (s, e) in enumerate(sentences) if s < end and e > start]


def read(path: str | Path) -> List[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def write_jsonl(records: Iterable[dict], path: str | Path) -> int:
    """Write records atomically (temporary name, then rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    n = 0
    with open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n

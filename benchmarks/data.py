"""Benchmark data: the pooled Wikipedia corpus and the open-domain question sets."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .common import data_dir, squad_paragraphs
from .metrics import normalize_answer

OPEN_DOMAIN_DATASETS = ("squad-dev", "nq-oracle", "nq-open", "entityquestions", "trivia", "webq")


@dataclass
class Pool:
    """The pooled corpus: SQuAD train+dev paragraphs, NQ oracle gold passages, Wikipedia leads."""

    ids: List[str]
    texts: List[str]
    alias: Dict[str, int] = field(default_factory=dict)  # every source id → pool index (duplicates merged)

    def __len__(self) -> int:
        return len(self.ids)


def _nq_oracle() -> List[dict]:
    with gzip.open(data_dir() / "nq" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def squad_id(split: str, paragraph: dict) -> str:
    """Pool source id of a SQuAD paragraph."""
    return f"squad-{split}-{paragraph['article']}-{paragraph['paragraph']}"


def load_pool() -> Pool:
    """Build the pool in a fixed order; exact duplicate texts are merged into their first copy."""
    sources: List[Tuple[str, str]] = []
    for split in ("train", "dev"):
        for p in squad_paragraphs(split):
            sources.append((squad_id(split, p), p["context"]))
    for i, record in enumerate(_nq_oracle()):
        sources.append((f"nq-{i}", record["ctxs"][0]["text"]))
    with open(data_dir() / "wiki-leads" / "leads.jsonl", encoding="utf-8") as f:
        for i, line in enumerate(f):
            sources.append((f"lead-{i}", json.loads(line)["text"]))
    pool = Pool([], [])
    by_text: Dict[str, int] = {}
    for sid, text in sources:
        key = text  # exact duplicates only (33,651 → 33,591)
        if key in by_text:
            pool.alias[sid] = by_text[key]
            continue
        by_text[key] = len(pool.ids)
        pool.alias[sid] = len(pool.ids)
        pool.ids.append(sid)
        pool.texts.append(text)
    return pool


def restrict_pool(pool: Pool, keep: Sequence[int], extra: int, seed: int) -> Tuple[Pool, Dict[int, int]]:
    """A smaller pool for smoke tests: the ``keep`` passages plus ``extra`` seeded others.

    Returns the new pool and the old → new index map. Results on it are not comparable
    with the full pool (the result file records the pool size).
    """
    import random

    chosen = set(keep)
    others = [i for i in range(len(pool)) if i not in chosen]
    chosen.update(random.Random(seed).sample(others, min(extra, len(others))))
    order = sorted(chosen)
    remap = {old: new for new, old in enumerate(order)}
    alias = {sid: remap[i] for sid, i in pool.alias.items() if i in remap}
    return Pool([pool.ids[i] for i in order], [pool.texts[i] for i in order], alias), remap


@dataclass
class Question:
    qid: str
    text: str
    answers: List[str]
    gold_passage: Optional[int] = None  # pool index, for datasets with a known gold passage
    answer_start: Optional[int] = None  # character offset in the gold passage (squad-dev)


def load_questions(name: str, pool: Pool) -> List[Question]:
    if name == "squad-dev":
        out = []
        for p in squad_paragraphs("dev"):
            gold = pool.alias[squad_id("dev", p)]
            for qa in p["qas"]:
                out.append(Question(qa["id"], qa["question"], [qa["answer"]], gold, qa["answer_start"]))
        return out
    if name == "nq-oracle":
        return [Question(f"nq-{i}", r["question"], list(r["answers"]), pool.alias[f"nq-{i}"])
                for i, r in enumerate(_nq_oracle())]
    files = {"nq-open": ("nq", "nq-open-dev.jsonl", "answer"),
             "entityquestions": ("entityquestions", "dev.jsonl", "answers"),
             # DPR's TriviaQA dev split also holds training.mined's guard questions (issue 13): a
             # mix chosen on them must not be reported on `trivia` (use it for checks, not claims)
             "trivia": ("dpr-topics", "trivia-dev.jsonl", "answers"),
             "webq": ("dpr-topics", "wq-test.jsonl", "answers")}
    if name not in files:
        raise SystemExit(f"error: unknown dataset {name!r}; choose one of {', '.join(OPEN_DOMAIN_DATASETS)}")
    folder, filename, key = files[name]
    out = []
    with open(data_dir() / folder / filename, encoding="utf-8") as f:
        for i, line in enumerate(f):
            record = json.loads(line)
            out.append(Question(f"{name}-{i}", record["question"], list(record[key])))
    return out


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

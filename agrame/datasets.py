"""The open-domain data the benchmarks and ``agrame qrels`` read: where it lives, the pooled corpus,
the question sets, and answer matching — one place for each, in the product (the benchmarks import
them from here; the product imports nothing from ``benchmarks``).

The data is read-only and is not shipped: ``$AGRAME_DATA`` (default ``../shared/data`` beside the
repository; ``../shared/data/README.md``). A missing file or folder is a :class:`DataError` naming it.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import string
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
OPEN_DOMAIN_DATASETS = ("squad-dev", "nq-oracle", "nq-open", "entityquestions", "trivia", "webq")


class DataError(ValueError):
    """The benchmark data is missing or a dataset name is unknown (a usage error, not a crash)."""


def data_path() -> Path:
    """The read-only data bundle: ``$AGRAME_DATA``, by default ``../shared/data`` beside the repo."""
    return Path(os.environ.get("AGRAME_DATA", REPO.parent / "shared" / "data"))


def data_dir() -> Path:
    """:func:`data_path`, or :class:`DataError` naming the setting when it is missing."""
    path = data_path()
    if not path.is_dir():
        raise DataError(f"data folder {path} not found (set AGRAME_DATA)")
    return path


def sample(items: Sequence, limit: Optional[int], seed: int) -> List:
    """``limit`` items drawn with ``seed`` (all of them, in order, when ``limit`` is None or larger)."""
    items = list(items)
    if limit is None or limit >= len(items):
        return items
    return random.Random(seed).sample(items, limit)


def sentence_of(spans: Sequence[Tuple[int, int]], char: int) -> int:
    """Index of the sentence span holding character ``char`` (nearest following one if between)."""
    for i, (s, e) in enumerate(spans):
        if char < e:
            return i
    return len(spans) - 1


# -- answer matching --------------------------------------------------------------------------

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


# -- SQuAD, the pool, the questions ------------------------------------------------------------

def squad_paragraphs(split: str) -> List[dict]:
    """SQuAD v1.1 paragraphs: ``{"article", "paragraph", "title", "context", "qas": [{"id", "question", "answer",
    "answer_start"}]}`` (article and paragraph are 0-based positions in the official order)."""
    name = {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}[split]
    data = json.loads((data_dir() / "squad" / name).read_text())
    out = []
    for a, article in enumerate(data["data"]):
        for k, paragraph in enumerate(article["paragraphs"]):
            qas = [{"id": qa["id"], "question": qa["question"], "answer": qa["answers"][0]["text"],
                    "answer_start": qa["answers"][0]["answer_start"]} for qa in paragraph["qas"]]
            out.append({"article": a, "paragraph": k, "title": article["title"], "context": paragraph["context"],
                        "qas": qas})
    return out


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
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(OPEN_DOMAIN_DATASETS)}")
    folder, filename, key = files[name]
    out = []
    with open(data_dir() / folder / filename, encoding="utf-8") as f:
        for i, line in enumerate(f):
            record = json.loads(line)
            out.append(Question(f"{name}-{i}", record["question"], list(record[key])))
    return out


__all__ = ["DataError", "OPEN_DOMAIN_DATASETS", "Pool", "Question", "data_dir", "data_path", "has_answer", "load_pool",
           "load_questions", "normalize_answer", "restrict_pool", "sample", "sentence_of", "squad_id", "squad_paragraphs"]

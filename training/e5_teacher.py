"""multilingual-e5-small as the teacher of the multi-granular KL recipe (issue 30).

e5 is the only retrieval-trained encoder reachable here (``agrame.e5``). As a teacher it gives
every training record's passages and sentences a logit from its single vectors:

* passage: cos(query: q, passage: p) / τ;
* sentence, ``--sentence-mode text``: cos(query: q, passage: s) / τ, the sentence encoded alone;
  ``marked``: the passage with the sentence wrapped in ``$ … $`` (as the marked cross-encoder
  teacher sees it), so the sentence keeps its context.

τ = 0.01 is e5's own training temperature (its contrastive loss), so the logits have the spread e5
learnt to rank with. Which sentence mode agrees better with gold answer sentences is chosen on
*held-out SQuAD train* records (``choose``), never on a reported split.

    python -m training.e5_teacher choose --data runs/big/heldout.jsonl --limit 500
    python -m training.e5_teacher score --data runs/big/train.jsonl --out runs/big/train-e5.jsonl \
        --sentence-mode text
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

TEMPERATURE = 0.01
MODES = ("text", "marked")


class E5Teacher:
    def __init__(self, batch_size: int = 32, loaded=None, device: str = "cpu"):
        from agrame.e5 import PASSAGE_PREFIX, QUERY_PREFIX, load_e5

        self.model, self.tokenizer = loaded or load_e5()
        self.model.to(device)
        self.query_prefix, self.passage_prefix = QUERY_PREFIX, PASSAGE_PREFIX
        self.batch_size = batch_size

    def _embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        from agrame.e5 import embed

        return embed(self.model, self.tokenizer, list(texts), prefix, batch_size=self.batch_size)

    @staticmethod
    def marked(text: str, span: Sequence[int]) -> str:
        a, b = span
        return f"{text[:a]}$ {text[a:b]} ${text[b:]}"

    def scores(self, record: dict, mode: str = "text", sentences_of: Optional[Sequence[int]] = None) -> Dict[str, list]:
        """``{"passages": [logit per passage], "sentences": [[logit per sentence] per passage]}``;
        ``sentences_of``: only these passages' sentences are scored (the others get [])."""
        if mode not in MODES:
            raise ValueError(f"unknown sentence mode {mode!r}; choose one of {', '.join(MODES)}")
        q = self._embed([record["question"]], self.query_prefix)[0]
        passages = record["passages"]
        p = self._embed([x["text"] for x in passages], self.passage_prefix)
        return {"passages": (p @ q / TEMPERATURE).tolist(),
                "sentences": self.sentence_logits(q, passages, mode, sentences_of)}

    def sentence_logits(self, q: np.ndarray, passages: Sequence[dict], mode: str,
                        sentences_of: Optional[Sequence[int]] = None) -> List[list]:
        """Per passage, the logit of each sentence against the query vector ``q`` (as :meth:`scores`)."""
        which = set(range(len(passages)) if sentences_of is None else sentences_of)
        units = [(x["text"][a:b] if mode == "text" else self.marked(x["text"], (a, b)))
                 for i, x in enumerate(passages) if i in which for a, b in x["sentences"]]
        s = self._embed(units, self.passage_prefix) if units else np.zeros((0, len(q)), np.float32)
        sent_logits = (s @ q / TEMPERATURE).tolist()
        out, first = [], 0
        for i, x in enumerate(passages):
            n = len(x["sentences"]) if i in which else 0
            out.append(sent_logits[first:first + n])
            first += n
        return out


def scored(records: Sequence[dict], mode: str, teacher: Optional[E5Teacher] = None,
           gold_strength: float = 0.0) -> Iterator[dict]:
    """Each record with ``teacher`` / ``teacher_sentences`` logits (the fields the student reads);
    ``gold_strength`` is added to a labelled record's gold passage and answer sentences (as
    ``training.e5_projection --gold-strength``: e5-kd-128 was picked with 5, the labels teacher's logit)."""
    from tqdm import tqdm

    teacher = teacher or E5Teacher()
    for r in tqdm(records, desc=f"e5 teacher ({mode})", disable=None):
        s = teacher.scores(r, mode)
        for p, score, sentences in zip(r["passages"], s["passages"], s["sentences"]):
            gold = gold_strength if p.get("positive") else 0.0
            answers = set(p.get("answer_sentences") or []) if p.get("positive") else set()
            p["teacher"] = round(score + gold, 4)
            p["teacher_sentences"] = [round(x + (gold_strength if k in answers else 0.0), 4)
                                      for k, x in enumerate(sentences)]
        yield r


def agreement(records: Sequence[dict], modes: Sequence[str] = MODES, teacher: Optional[E5Teacher] = None) -> dict:
    """Per mode, how often the top sentence of the gold paragraph is an answer sentence (sentence
    P@1), and passage P@1 among the record's passages, over records with a gold answer sentence."""
    teacher = teacher or E5Teacher()
    hits: Dict[str, List[float]] = {m: [] for m in modes}
    passage_hits: List[float] = []
    for r in records:
        gold = [i for i, p in enumerate(r["passages"]) if p.get("positive")]
        if not gold or not r["passages"][gold[0]].get("answer_sentences"):
            continue
        g = gold[0]
        q = teacher._embed([r["question"]], teacher.query_prefix)[0]
        p = teacher._embed([x["text"] for x in r["passages"]], teacher.passage_prefix)
        passage_hits.append(float(int(np.argmax(p @ q)) in gold))
        for m in modes:  # only the gold passage's sentences are ranked
            logits = teacher.sentence_logits(q, r["passages"], m, [g])[g]
            hits[m].append(float(int(np.argmax(logits)) in r["passages"][g]["answer_sentences"]))
    return {"records": len(passage_hits), "passage_p1": round(100 * float(np.mean(passage_hits)), 1),
            "sentence_p1": {m: round(100 * float(np.mean(v)), 1) for m, v in hits.items()},
            "chosen": max(modes, key=lambda m: np.mean(hits[m]))}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .data import read, write_jsonl

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("choose", help="sentence mode that agrees better with gold sentences (held-out train data)")
    s = sub.add_parser("score", help="e5 logits for every passage and sentence of a training file")
    s.add_argument("--out", required=True)
    s.add_argument("--sentence-mode", choices=MODES, required=True)
    s.add_argument("--gold-strength", type=float, default=0.0,
                   help="added to the gold passage's and answer sentences' logits of labelled records (0: e5 alone)")
    for p in (c, s):
        p.add_argument("--data", required=True, help="JSONL from python -m training.data (train questions only)")
        p.add_argument("--limit", type=int, default=None)
        p.add_argument("--device", default="cpu", help="torch device of e5, e.g. cuda")
    args = parser.parse_args(argv)
    records = read(args.data)[: args.limit]
    teacher = E5Teacher(device=args.device)
    if args.command == "choose":
        print(json.dumps(agreement(records, teacher=teacher), indent=1))
        return
    written = write_jsonl(scored(records, args.sentence_mode, teacher, gold_strength=args.gold_strength), args.out)
    print(f"wrote {written} records to {args.out}")


if __name__ == "__main__":
    main()

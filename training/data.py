"""Training data from SQuAD v1.1 *train*: questions, their paragraph, BM25 hard negatives, sentences.

    python -m training.data --out runs/train/squad-train.jsonl --questions 3000 --negatives 3

One JSONL record per question::

    {"qid", "question", "answer",
     "passages": [{"pid", "text", "sentences": [[start, end], ...], "positive": bool,
                   "answer_sentences": [i, ...]}, ...]}          # positive first

- Negatives come from BM25 (bm25s, the benchmarks' tokenizer) over the *train* paragraphs
  only; the gold paragraph and any paragraph containing the (normalised) answer string are
  skipped, so a negative is unlikely to be a false negative.
- The answer sentence is the sentence holding the answer span (``answer_start``; the data
  bundle recomputes it as the first occurrence, see its README) — the same rule as the
  benchmarks'.
- Questions are sampled with a seed, at most one per paragraph, so the sample spreads over
  articles.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from tqdm import tqdm

from agrame.spans import split_sentences
from agrame.training.records import answer_sentences, read, write_jsonl  # noqa: F401 (the record format's home)


def build(questions: int, negatives: int, seed: int = 0, depth: int = 30) -> Iterator[dict]:
    from benchmarks.bm25 import PoolBM25
    from agrame.datasets import has_answer, squad_paragraphs

    paragraphs = squad_paragraphs("train")
    texts = [p["context"] for p in paragraphs]
    bm25 = PoolBM25(texts)
    rng = random.Random(seed)
    chosen = []
    for p_index in rng.sample(range(len(paragraphs)), min(questions, len(paragraphs))):
        qa = rng.choice(paragraphs[p_index]["qas"])
        chosen.append((p_index, qa))
    sentence_cache: Dict[int, List[List[int]]] = {}

    def sentences_of(i: int) -> List[List[int]]:
        if i not in sentence_cache:
            sentence_cache[i] = [list(s) for s in split_sentences(texts[i])]
        return sentence_cache[i]

    batch = 256
    for b in range(0, len(chosen), batch):
        part = chosen[b:b + batch]
        docs, _ = bm25.retrieve([qa["question"] for _, qa in part], k=depth)
        for (p_index, qa), ranked in zip(part, docs):
            answer = qa["answer"]
            start = qa["answer_start"]
            end = start + len(answer)
            negs = []
            for d in ranked.tolist():
                if d == p_index or has_answer(texts[d], [answer]):
                    continue
                negs.append(d)
                if len(negs) == negatives:
                    break
            if len(negs) < negatives:
                continue  # too few clean negatives in the top `depth`: skip rather than pad
            gold_sentences = sentences_of(p_index)
            passages = [{"pid": f"train-{p_index}", "text": texts[p_index], "sentences": gold_sentences,
                         "positive": True, "answer_sentences": answer_sentences(gold_sentences, start, end)}]
            passages += [{"pid": f"train-{d}", "text": texts[d], "sentences": sentences_of(d),
                          "positive": False, "answer_sentences": []} for d in negs]
            yield {"qid": qa["id"], "question": qa["question"], "answer": answer, "passages": passages}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--questions", type=int, default=3000)
    parser.add_argument("--negatives", type=int, default=3, help="k hard negatives per question")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    records = tqdm(build(args.questions, args.negatives, args.seed), total=args.questions, desc="squad train",
                   disable=None)
    n = write_jsonl(records, args.out)
    print(f"wrote {n} questions to {args.out}")


if __name__ == "__main__":
    main()

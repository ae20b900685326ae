"""Choose α of Score(q,s) = S'(q,s) + α·S(q,p) on held-out SQuAD *train* questions.

    python -m training.choose_alpha --model runs/students/agrame/final --data runs/train/squad-train.jsonl \\
        --skip 3500 --limit 300 --write

Each question ranks every sentence of its k+1 passages (gold paragraph + BM25 hard
negatives); sentence P@1 is computed for each α of the grid. The questions after the
first ``--skip`` records were not used to train the student, and no benchmark split is
touched. ``--write`` stores the best α in the model's ``agrame.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from agrame import scoring
from agrame.encoder import SETTINGS_FILE, load_encoder
from agrame.ranker import Ranker

GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def sentence_p1_by_alpha(ranker: Ranker, records: Sequence[dict], grid: Sequence[float] = GRID) -> dict:
    hits = {a: 0 for a in grid}
    for r in records:
        corpus = ranker.encode([(str(k), p["text"]) for k, p in enumerate(r["passages"])])
        q, s = ranker.encode_query(r["question"], "sentence")
        passage = scoring.segment_maxsim(scoring.similarity(q, corpus.vectors.float()), corpus.token_passage, len(corpus))
        s_sim = scoring.similarity(s, corpus.vectors.float())
        n = int(corpus.sentences.shape[0])
        sentence = scoring.segment_maxsim(s_sim, corpus.token_sentence, n)
        owner = corpus.sentence_passage
        # The gold paragraph comes first and the corpus splits sentences as the data did,
        # so its answer sentences are the first global sentence indices.
        gold = set(r["passages"][0]["answer_sentences"])
        for a in grid:
            combined = scoring.combined_score(sentence, passage[owner], a)
            best = int(torch.sort(combined, descending=True, stable=True).indices[0])
            hits[a] += best in gold
    return {a: round(100 * h / len(records), 1) for a, h in hits.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .data import read

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the package default)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--skip", type=int, default=3500, help="records the labels (so the student) were made from: skipped")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--write", action="store_true", help="store the best α in the model's agrame.json")
    args = parser.parse_args(argv)
    records = read(args.data)[args.skip:args.skip + args.limit]
    if not records:
        raise SystemExit(f"error: no held-out records after the first {args.skip}")
    ranker = Ranker(load_encoder(args.model))
    table = sentence_p1_by_alpha(ranker, records)
    best = max(table, key=lambda a: (table[a], -abs(a - 0.5)))
    result = {"questions": len(records), "skip": args.skip, "sentence_p1_by_alpha": table, "best_alpha": best}
    print(json.dumps(result))
    if args.write:
        if args.model is None:
            raise SystemExit("error: --write needs --model (the package default is not rewritten)")
        path = Path(args.model) / SETTINGS_FILE
        meta = json.loads(path.read_text())
        meta["alpha"] = best
        path.write_text(json.dumps(meta, indent=2) + "\n")
        (Path(args.model) / "alpha.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

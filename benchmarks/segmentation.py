"""Proposition segmentation against PropSegmEnt's reference (Wikipedia part).

    python -m benchmarks.segmentation --split dev

Protocol (the sub-sentence encoder paper's Table 7): every Wikipedia sentence of the
split; predicted and reference propositions are sets of PropSegmEnt tokens (punctuation
tokens dropped on both sides); a predicted proposition is correct when some reference
proposition of the same sentence has token Jaccard ≥ θ, and a reference proposition is
recovered when some prediction has Jaccard ≥ θ with it. Precision, recall and F1 are
micro-averaged over propositions, at θ = 0.5 and 0.8.

Rows: the dependency tagger (with and without splitting prepositional modifiers), the
whole sentence as one proposition (the trivial baseline), and the aligner fed the
reference propositions' own text (how much the text → mask step loses). Tagger choices
were made on the *test* split; dev is the reported one.
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from agrame.spans import span_token_mask
from propcite.propositions import align_propositions, tag_many

from .common import command_line, write_result
from .propsegment import Sentence, jaccard, load_sentences

THRESHOLDS = (0.5, 0.8)


def content_tokens(sentence: Sentence) -> FrozenSet[int]:
    return frozenset(i for i, (s, e) in enumerate(sentence.token_spans)
                     if any(ch.isalnum() for ch in sentence.text[s:e]))


def to_tokens(sentence: Sentence, spans: Iterable) -> List[FrozenSet[int]]:
    """PropSegmEnt token sets of character spans (the overlap rule of agrame.spans)."""
    spans = [s for s in spans if s]
    if not spans:
        return []
    mask = span_token_mask(sentence.token_spans, spans)
    keep = content_tokens(sentence)
    out = []
    for row in mask:
        tokens = frozenset(i for i in row.nonzero().flatten().tolist() if i in keep)
        if tokens:
            out.append(tokens)
    return out


def match_counts(predicted: Sequence[FrozenSet[int]], reference: Sequence[FrozenSet[int]],
                 theta: float) -> Tuple[int, int]:
    """(predictions matching some reference, references matched by some prediction)."""
    good_pred = sum(any(jaccard(p, r) >= theta for r in reference) for p in predicted)
    good_ref = sum(any(jaccard(p, r) >= theta for p in predicted) for r in reference)
    return good_pred, good_ref


def prf(pred_ok: int, n_pred: int, ref_ok: int, n_ref: int) -> Dict[str, float]:
    p = pred_ok / n_pred if n_pred else 0.0
    r = ref_ok / n_ref if n_ref else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(100 * p, 1), "recall": round(100 * r, 1), "f1": round(100 * f, 1)}


def evaluate(sentences: Sequence[Sentence], predictions: Sequence[List[FrozenSet[int]]]) -> dict:
    out = {"propositions": sum(len(p) for p in predictions),
           "per_sentence": round(sum(len(p) for p in predictions) / max(1, len(predictions)), 2)}
    for theta in THRESHOLDS:
        totals = [0, 0, 0, 0]
        for sent, pred in zip(sentences, predictions):
            ref = [frozenset(r & content_tokens(sent)) for r in sent.propositions]
            ref = [r for r in ref if r]
            a, b = match_counts(pred, ref, theta)
            totals = [totals[0] + a, totals[1] + len(pred), totals[2] + b, totals[3] + len(ref)]
        out[f"theta_{theta}"] = prf(*totals)
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("dev", "test"), default="dev")
    parser.add_argument("--limit", type=int, default=None, help="first N sentences (default all)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    sentences = [s for s in load_sentences(args.split).values() if s.propositions][: args.limit]
    texts = [s.text for s in sentences]
    rows = []
    for name, make in (
        ("whole sentence", lambda: [[((0, len(t)),)] for t in texts]),
        ("dependency tagger", lambda: tag_many(texts)),
        ("dependency tagger, no PP split", lambda: tag_many(texts, prepositions=False)),
        ("aligner on reference texts", lambda: [align_propositions(s.text, [s.proposition_text(sorted(r))
                                                                           for r in s.propositions])
                                                for s in sentences]),
    ):
        t0 = time.perf_counter()
        spans = make()
        ms = 1000 * (time.perf_counter() - t0) / max(1, len(texts))
        predictions = [to_tokens(s, sp) for s, sp in zip(sentences, spans)]
        rows.append({"method": name, **evaluate(sentences, predictions), "ms_per_sentence": round(ms, 2)})
        print(rows[-1])
    result = {"benchmark": "segmentation", "dataset": f"propsegment-{args.split}-wikipedia",
              "sample": {"sentences": len(sentences),
                         "reference_propositions": sum(len(s.propositions) for s in sentences)},
              "rows": rows}
    path = write_result(f"segmentation-{args.split}", result, args.out, command_line("benchmarks.segmentation", argv))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Zero-shot choice of the query settings: [Q'] vs [Q] vs no marker, with or without [MASK] padding.

The untrained default model has never seen any marker, so whether encoding the
sentence-level query with [Q'] (AGRaME's second marker) helps is an empirical question.
Measured on a sample of SQuAD v1.1 *train* questions (never on an evaluation split):
candidates are all paragraphs of the question's article, sentences ranked by
S'(q,s) + α·S(q,p), gold = the sentence holding the answer.

    python -m benchmarks.marker_choice --articles 25 --per-article 12 --seed 0
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict

from tqdm.auto import tqdm

from agrame.corpus import Passage
from agrame.encoder import DEFAULT_MARKERS
from agrame.loading import load_encoder
from agrame.ranker import Ranker, rank_corpus
from agrame.spans import split_sentences

from .common import command_line, sentence_of, squad_paragraphs, write_result

#: label → (marker of the passage query, marker of the sub-unit query, [MASK] padding).
VARIANTS = {
    "[Q] + [Q']": ("Q", "Q'", True),
    "[Q] + [Q]": ("Q", "Q", True),
    "[Q] + no marker": ("Q", None, True),
    "no marker + no marker": (None, None, True),
    "no marker + no marker, no [MASK] padding": (None, None, False),
}
BASELINE = "[Q] + [Q']"


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test p-value over the discordant questions."""
    from math import comb

    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, default=25)
    parser.add_argument("--per-article", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--model", default="zero-shot", help="model whose markers are chosen (default: zero-shot MiniLM)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    # Markers named explicitly, whatever the model's own settings say.
    encoder = load_encoder(args.model).with_settings(markers=dict(DEFAULT_MARKERS))
    ranker = Ranker(encoder)
    paragraphs = squad_paragraphs("train")
    by_article = defaultdict(list)
    for p in paragraphs:
        by_article[p["article"]].append(p)
    rng = random.Random(args.seed)
    articles = rng.sample(sorted(by_article), args.articles)
    hits = {name: {"sent_p1_article": 0, "sent_p1_in_gold_paragraph": 0} for name in VARIANTS}
    per_question = {name: [] for name in VARIANTS}
    markers = sorted({m for v in VARIANTS.values() for m in v[:2]}, key=str)
    unpadded = encoder.with_settings(query_augmentation=False)
    n = 0
    start = time.perf_counter()
    for a in tqdm(articles, desc="articles"):
        paras = by_article[a]
        corpus = ranker.encode([Passage(str(i), p["context"]) for i, p in enumerate(paras)])
        questions = [(i, qa) for i, p in enumerate(paras) for qa in p["qas"]]
        questions = rng.sample(questions, min(args.per_article, len(questions)))
        texts = [qa["question"] for _, qa in questions]
        encoded = {(m, True): e for m, e in zip(markers, encoder.encode_queries(texts, markers))}
        encoded.update({(m, False): e for m, e in zip(markers, unpadded.encode_queries(texts, markers))})
        for k, (i, qa) in enumerate(questions):
            spans = split_sentences(paras[i]["context"])
            gold_sentence = spans[sentence_of(spans, qa["answer_start"])]
            for name, (psg_marker, span_marker, padded) in VARIANTS.items():
                q, qs = encoded[psg_marker, padded][k].vectors, encoded[span_marker, padded][k].vectors
                ranked = rank_corpus(q, q if psg_marker == span_marker else qs, corpus, "sentence",
                                     alpha=args.alpha, top_k=None)
                top = ranked[0]
                hit = top.passage_id == str(i) and (top.start, top.end) == gold_sentence
                hits[name]["sent_p1_article"] += hit
                per_question[name].append(hit)
                in_gold = next(r for r in ranked if r.passage_id == str(i))
                hits[name]["sent_p1_in_gold_paragraph"] += (in_gold.start, in_gold.end) == gold_sentence
            n += 1
    metrics = {name: {k: round(100 * v / n, 1) for k, v in h.items()} for name, h in hits.items()}
    for name in VARIANTS:
        wins = sum(a and not b for a, b in zip(per_question[name], per_question[BASELINE]))
        losses = sum(b and not a for a, b in zip(per_question[name], per_question[BASELINE]))
        metrics[name].update({"wins_vs_baseline": wins, "losses_vs_baseline": losses,
                              "sign_test_p": round(sign_test(wins, losses), 3)})
    result = {
        "benchmark": "marker_choice", "dataset": "squad-train (sample)", "model": encoder.source,
        "sample": {"articles": args.articles, "questions": n, "seed": args.seed}, "alpha": args.alpha,
        "baseline": BASELINE,
        "metrics": metrics, "seconds": round(time.perf_counter() - start, 1),
    }
    path = write_result("marker_choice", result, args.out, command_line("benchmarks.marker_choice", argv))
    for name, m in metrics.items():
        print(f"{name:>42}: sentence P@1 over article {m['sent_p1_article']:5.1f}  "
              f"within gold paragraph {m['sent_p1_in_gold_paragraph']:5.1f}  "
              f"vs {BASELINE}: +{m['wins_vs_baseline']}/-{m['losses_vs_baseline']} p={m['sign_test_p']}")
    print(f"{n} questions; wrote {path}")


if __name__ == "__main__":
    main()

"""Evidence-sentence ranking on WiCE dev: each claim ranks the sentences of its own cited article.

    python -m benchmarks.evidence --model gpu2100-agrame128 --tag ship-gpu2100-agrame128
    python -m benchmarks.evidence --model zero-shot --tag ship-zero-shot

Protocol: the claims of ``wice/dev.jsonl`` with at least one supporting sentence set (supported
and partially supported; not_supported claims have no gold and are left out). A claim's article
(its ``evidence`` sentences, joined by single spaces) is encoded once as one passage, whose
sentences are exactly WiCE's (their character spans are given, no re-segmentation); the claim
ranks them by S'(q,s) (within one passage α·S(q,p) is the same for every sentence, so it does not
change the order). Gold: the union of the claim's supporting sentence sets. Metrics per claim:
P@1 (the top sentence is gold), Hit@5 (a gold sentence in the top 5), MRR (1 / rank of the first
gold sentence); BM25 (bm25s, the article's sentences as its collection) beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Dict, List, Sequence, Tuple

from tqdm.auto import tqdm

from agrame.corpus import EncodedCorpus, Passage
from agrame.lexical import LexicalCollection
from agrame.ranker import Ranker

from .bm25 import tokenize
from .common import command_line, data_dir, sample, tagged, write_result
from .metrics import per_question, precision_at_1, recall_at_k, summarize


#: WiCE's files by split: dev is the reported row; train (its non-supported-tokens claims, all partially
#: supported and each with its supporting sentences) is for choosing — a guard that sees the evidence drift a
#: mix's guard sets missed (issue 61), never a reported number.
SPLITS = {"dev": "dev.jsonl", "train": "non-supported-tokens-train.jsonl"}


def load_claims(split: str = "dev") -> List[dict]:
    """WiCE claims with gold: ``{"id", "claim", "sentences", "gold"}`` (gold: sentence indices)."""
    out = []
    for n, line in enumerate((data_dir() / "wice" / SPLITS[split]).read_text().splitlines()):
        record = json.loads(line)
        gold = {i for s in record["supporting_sentences"] for i in s}
        if record["label"] == "not_supported" or not gold:
            continue
        out.append({"id": f"wice-{n}" if split == "dev" else f"wice-{split}-{n}", "claim": record["claim"].strip(),
                    "sentences": [e.strip() for e in record["evidence"]], "gold": gold})
    return out


def article(sentences: Sequence[str]) -> Tuple[str, List[Tuple[int, int]]]:
    """The article's text and each sentence's character span (an empty sentence keeps a place as ".")."""
    parts, spans, at = [], [], 0
    for s in sentences:
        s = s or "."
        spans.append((at, at + len(s)))
        parts.append(s)
        at += len(s) + 1
    return " ".join(parts), spans


def judge(order: Sequence[int], gold: set) -> Dict[str, float]:
    rel = [i in gold for i in order]
    first = next((r for r, hit in enumerate(rel, 1) if hit), None)
    return {"sent_p1": precision_at_1(rel), "sent_hit5": recall_at_k(rel, 5),
            "sent_mrr": 1.0 / first if first else 0.0}


def rank_model(ranker: Ranker, claim: dict) -> List[int]:
    text, spans = article(claim["sentences"])
    encoded = ranker.encoder.encode_passages([text], batch_size=ranker.batch_size)
    corpus = EncodedCorpus.build([Passage(claim["id"], text)], encoded, sentences=[spans])
    start = {s: i for i, (s, _) in enumerate(spans)}
    hits = ranker.rank(claim["claim"], corpus, "sentence", top_k=None)
    return [start[h.start] for h in hits]


def rank_bm25(claim: dict) -> List[int]:
    collection = LexicalCollection(tokenize([s or "." for s in claim["sentences"]]))
    scores = collection.scores(tokenize([claim["claim"]])[0])
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="multi-vector model folder or shipped name "
                                                      "(default: the package default)")
    parser.add_argument("--limit", type=int, default=None, help="claims sampled (fixed seed); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default=None, help="label of this run, kept in the result and its file name")
    parser.add_argument("--out", default=None, help="result file (default: benchmarks/results/<name>.json)")
    parser.add_argument("--split", choices=sorted(SPLITS), default="dev",
                        help="dev (the reported row) or train (374 partially supported claims: for choosing, e.g. "
                             "as a guard row beside a mix's guard sets)")
    args = parser.parse_args(argv)
    all_claims = load_claims(args.split)
    claims = sample(all_claims, args.limit, args.seed)
    ranker = Ranker(args.model)
    rows: Dict[str, List[dict]] = {"model": [], "bm25": []}
    start = time.perf_counter()
    for claim in tqdm(claims, desc="wice evidence", unit="claim", disable=None):
        rows["model"].append(judge(rank_model(ranker, claim), claim["gold"]))
        rows["bm25"].append(judge(rank_bm25(claim), claim["gold"]))
    seconds = time.perf_counter() - start
    ids = [c["id"] for c in claims]
    keys = ("sent_p1", "sent_hit5", "sent_mrr")
    encoder = ranker.encoder
    result = {
        "benchmark": "evidence", "dataset": f"wice-{args.split}", "method": "colbert-zeroshot-psg",
        "model": encoder.source, "fingerprint": encoder.fingerprint()[:12],
        "span_query_marker": encoder.settings.span_query_marker,
        "sample": {"questions": len(claims), "of": len(all_claims), "seed": args.seed if args.limit else None,
                   "sentences_per_article": round(sum(len(c["sentences"]) for c in claims) / max(1, len(claims)), 1),
                   "gold_per_claim": round(sum(len(c["gold"]) for c in claims) / max(1, len(claims)), 2)},
        "tag": args.tag, "metrics": summarize(rows["model"]), "bm25": summarize(rows["bm25"]),
        "ms_per_question": round(1000 * seconds / max(1, len(claims)), 1),
        "per_question": per_question(ids, rows["model"], keys), "per_question_bm25": per_question(ids, rows["bm25"], keys),
    }
    path = write_result(tagged(f"evidence-wice-{args.split}", args.tag), result, args.out, command_line("benchmarks.evidence", argv))
    print(f"wice evidence: {result['metrics']} (bm25 {result['bm25']}) → {path}")


if __name__ == "__main__":
    main()

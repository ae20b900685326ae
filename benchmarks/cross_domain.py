"""Cross-domain passage and sentence ranking (AGRaME Table 4 analog) on SciFact.

RobustQA, the paper's cross-domain suite, cannot be obtained offline; SciFact
(biomedical claims → abstracts and rationale sentences) stands in for it.

    python -m benchmarks.cross_domain --dataset scifact --method colbert-zeroshot-psg

Corpus: the 5,183 abstracts, text = their sentences joined by one space (no titles),
with the dataset's own sentence segmentation as sentence spans; abstracts longer than the
model's length are encoded in windows, never cut. Claims: those of the split with
rationales. BM25 retrieves the top 100 abstracts per claim and every method re-ranks
them and all of their sentences. Gold passages: the abstracts with rationales for the
claim; gold sentences: their rationale sentences (any rationale set).

A model trained on SciFact *train* has seen the rationale sentences of the abstracts its
training claims cite, and half the dev claims cite one of those. ``--taught RECORDS.jsonl``
(the training records, e.g. ``runs/big/scifact.jsonl`` of ``training.mined``) adds the
metrics over the dev claims none of whose gold abstracts was a training positive: the part
of SciFact that stays out of domain for that model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from tqdm.auto import tqdm

from .common import add_model_args, command_line, data_dir, sample, tagged, write_result
from .metrics import per_question, precision_at_1, recall_at_k, summarize
from .rerank import METHODS, Harness

FIRST_STAGE_K = 100


def load_scifact() -> Tuple[List[int], List[str], List[List[Tuple[int, int]]], List[Dict[int, int]]]:
    """doc ids, texts, sentence spans, and per abstract the map original sentence index → span index."""
    doc_ids, texts, spans, index_maps = [], [], [], []
    with open(data_dir() / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            parts, sp, imap, pos = [], [], {}, 0
            for k, sentence in enumerate(record["sentences"]):
                sentence = " ".join(sentence.split())  # verbatim sentences end in stray whitespace
                if not sentence:
                    continue
                if parts:
                    pos += 1
                imap[k] = len(sp)
                sp.append((pos, pos + len(sentence)))
                parts.append(sentence)
                pos += len(sentence)
            doc_ids.append(int(record["doc_id"]))
            texts.append(" ".join(parts))
            spans.append(sp)
            index_maps.append(imap)
    return doc_ids, texts, spans, index_maps


def load_claims(split: str) -> List[dict]:
    with open(data_dir() / "scifact" / f"claims_{split}.jsonl", encoding="utf-8") as f:
        claims = [json.loads(line) for line in f]
    return [c for c in claims if c["evidence"]]


def taught_abstracts(path: Path) -> Set[int]:
    """SciFact doc ids that training records (``training.mined``'s format) have as their positive."""
    taught = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                gold = json.loads(line)["passages"][0]
            except (ValueError, KeyError, IndexError) as e:
                raise SystemExit(f"{path}:{n}: not a training record ({e!r})")
            if gold.get("positive") and str(gold.get("pid", "")).startswith("scifact-"):
                taught.add(int(gold["pid"].split("-", 1)[1]))
    return taught


def untaught_summary(claims: List[dict], per_claim: List[dict], taught: Set[int], source: str) -> dict:
    kept = [m for c, m in zip(claims, per_claim) if not {int(d) for d in c["evidence"]} & taught]
    return {"questions": len(kept), "taught_abstracts": len(taught), "taught_from": source,
            "metrics": summarize(kept) if kept else None}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="scifact", choices=("scifact",))
    parser.add_argument("--split", default="dev", choices=("dev", "train"),
                        help="claims to evaluate (dev is reported; train is for choosing settings)")
    parser.add_argument("--method", required=True, choices=METHODS)
    add_model_args(parser)
    parser.add_argument("--corpus-limit", type=int, default=None,
                        help="smoke tests only: gold abstracts plus this many others (not comparable)")
    parser.add_argument("--taught", type=Path, default=None,
                        help="training records (JSONL): also report the claims whose gold abstracts none of them taught")
    args = parser.parse_args(argv)
    if args.taught is not None and not args.taught.is_file():
        parser.error(f"--taught {args.taught}: no such file")
    taught: Optional[Set[int]] = taught_abstracts(args.taught) if args.taught is not None else None

    doc_ids, texts, spans, index_maps = load_scifact()
    all_claims = load_claims(args.split)
    claims = sample(all_claims, args.limit, args.seed)
    if args.corpus_limit is not None:
        import random
        gold = {int(d) for c in claims for d in c["evidence"]}
        keep = sorted({i for i, d in enumerate(doc_ids) if d in gold} |
                      set(random.Random(args.seed).sample(range(len(doc_ids)), args.corpus_limit)))
        doc_ids, texts, spans, index_maps = ([x[i] for i in keep] for x in (doc_ids, texts, spans, index_maps))
    position = {d: i for i, d in enumerate(doc_ids)}
    harness = Harness("scifact", texts, spans, args.model, args.alpha, args.baseline_model, args.span_query_marker)
    queries = [(str(c["id"]), c["claim"]) for c in claims]
    docs, _ = harness.bm25.retrieve([t for _, t in queries], min(FIRST_STAGE_K, len(texts)))
    method, info = harness.make(args.method, queries)
    per_claim = []
    start = time.perf_counter()
    for claim, (qid, text), cands in tqdm(list(zip(claims, queries, docs)), desc=f"scifact {args.method}",
                                          disable=None):
        passages, sentences = method(qid, text, cands)
        gold_docs = {position[int(d)] for d in claim["evidence"]}
        gold_sents = set()
        for d, sets in claim["evidence"].items():
            p = position[int(d)]
            for evidence in sets:
                gold_sents.update(int(harness.sent_starts[p]) + index_maps[p][k]
                                  for k in evidence["sentences"] if k in index_maps[p])
        psg_rel = [p in gold_docs for p in passages]
        sent_rel = [g in gold_sents for g in sentences]
        per_claim.append({"psg_p1": precision_at_1(psg_rel), "psg_r5": recall_at_k(psg_rel, 5),
                          "sent_p1": precision_at_1(sent_rel), "sent_r5": recall_at_k(sent_rel, 5),
                          "first_stage_r100": float(bool(gold_docs & {int(c) for c in cands}))})
    seconds = time.perf_counter() - start
    result = {
        "benchmark": "cross_domain", "dataset": f"scifact-{args.split}", "method": args.method, **info,
        "sample": {"questions": len(claims), "of": len(all_claims), "seed": args.seed if args.limit else None},
        "first_stage": f"bm25 top-{FIRST_STAGE_K}", "corpus_passages": len(texts), "tag": args.tag,
        "metrics": summarize(per_claim), "ms_per_question": round(1000 * seconds / max(1, len(claims)), 1),
        "per_question": per_question([qid for qid, _ in queries], per_claim),
    }
    if taught is not None:
        result["untaught"] = untaught_summary(claims, per_claim, taught, args.taught.name)
    path = write_result(tagged(f"cross_domain-scifact-{args.split}-{args.method}", args.tag), result, args.out,
                        command_line("benchmarks.cross_domain", argv))
    print(f"scifact-{args.split} {args.method}: {result['metrics']} → {path}")


if __name__ == "__main__":
    main()

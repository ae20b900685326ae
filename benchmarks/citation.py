"""Post-hoc citation: PropCite against post-hoc baselines on ExpertQA and WiCE.

    python -m benchmarks.citation --dataset expertqa --split rand_val     # chooses the margin
    python -m benchmarks.citation --dataset expertqa --split domain_val   # uses rand_val's margin
    python -m benchmarks.citation --dataset wice                          # WiCE dev, same margin
    python -m benchmarks.citation --dataset latency                       # ms per sentence, K = 5, 10

Protocols:

- ExpertQA (validation splits): answers of the systems that kept evidence text
  (``rr_*``, ``post_hoc_*``). Candidates for every claim of an answer: all evidence passages
  cited anywhere in that answer (deduplicated by text). A claim's gold is its own evidence
  when its human support label is Complete; a claim labelled Missing should stay uncited
  (any citation on it is wrong). Partial/Incomplete claims (gold = their own evidence) are
  scored separately; N/A and unlabelled claims, and Complete claims whose evidence has no
  text, are left out. Citation markers (``[3]``) are stripped from claim texts.
- WiCE dev: candidates are the claim's evidence sentences, gold its supporting sentence
  sets (any one set suffices for recall); not_supported claims should stay uncited. For the
  partially supported claims of ``non-supported-tokens-dev.jsonl`` the tagger's
  propositions are split into unsupported (≥ half of their characters inside annotated
  non-supported tokens) and supported ones, and we count how many of each stay uncited.
- Metrics: :func:`benchmarks.metrics.citation_scores`.
- Margin: chosen on ExpertQA ``rand_val`` (best F1 among positive margins of the grid) and
  reused unchanged on ``domain_val`` and WiCE.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm import tqdm

from agrame.lexical import LexicalCollection
from propcite.citer import Citer

from .bm25 import tokenize
from .common import RESULTS, command_line, data_dir, sample, tagged, write_result
from .encodings import SingleVectorEncoder
from .metrics import citation_claim_counts, citation_scores

TEXT_SYSTEMS = ("rr_gs_gpt4", "rr_sphere_gpt4", "post_hoc_gs_gpt4", "post_hoc_sphere_gpt4")
MARGINS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2)
PARTIAL_TOKENS = "partial-tokens"
_MARKER = re.compile(r"\s*\[\d+\]")


@dataclass
class Claim:
    cid: str
    text: str
    label: str                                   # support label as in the dataset
    gold: List[FrozenSet[int]]                   # alternative sufficient sets; [] = should stay uncited
    unsupported: List[Tuple[int, int]] = field(default_factory=list)  # WiCE non-supported char spans


@dataclass
class Task:
    tid: str
    passages: List[str]
    claims: List[Claim]


def _evidence_text(evidence: str) -> Optional[str]:
    """``"[n] URL\\n\\npassage"`` → passage (None for a bare URL)."""
    parts = evidence.split("\n\n", 1)
    if len(parts) < 2 or not parts[1].strip():
        return None
    return parts[1].strip()


def load_expertqa(split: str) -> List[Task]:
    tasks: List[Task] = []
    path = data_dir() / "expertqa" / f"{split}.jsonl"
    for n, line in enumerate(path.read_text().splitlines()):
        record = json.loads(line)
        for system, answer in record["answers"].items():
            if system not in TEXT_SYSTEMS:
                continue
            passages: List[str] = []
            position: Dict[str, int] = {}
            own: List[List[int]] = []
            for claim in answer["claims"]:
                ids = []
                for ev in claim.get("evidence") or []:
                    text = _evidence_text(ev)
                    if text is None:
                        continue
                    if text not in position:
                        position[text] = len(passages)
                        passages.append(text)
                    ids.append(position[text])
                own.append(sorted(set(ids)))
            if not passages:
                continue
            claims = []
            for k, (claim, ids) in enumerate(zip(answer["claims"], own)):
                label = claim.get("support")
                text = _MARKER.sub("", claim["claim_string"]).strip()
                if not text or label not in ("Complete", "Partial", "Incomplete", "Missing"):
                    continue
                if label == "Missing":
                    gold = []
                elif ids:
                    gold = [frozenset(ids)]
                else:
                    continue  # supported, but its evidence has no text to cite
                claims.append(Claim(f"{split}-{n}-{k}", text, label, gold))
            if claims:
                tasks.append(Task(f"{split}-{n}", passages, claims))
    return tasks


def _token_spans(text: str, tokens: Sequence[str]) -> List[Tuple[int, int]]:
    spans, at = [], 0
    for tok in tokens:
        where = text.find(tok, at)
        if where < 0:
            spans.append((at, at))
            continue
        spans.append((where, where + len(tok)))
        at = where + len(tok)
    return spans


def load_wice(partial: bool = False) -> List[Task]:
    name = "non-supported-tokens-dev.jsonl" if partial else "dev.jsonl"
    tasks = []
    for n, line in enumerate((data_dir() / "wice" / name).read_text().splitlines()):
        record = json.loads(line)
        gold = [frozenset(s) for s in record["supporting_sentences"] if s] if record["label"] != "not_supported" else []
        unsupported = []
        if partial:
            spans = _token_spans(record["claim"], record["claim_tokens"])
            unsupported = [sp for sp, flag in zip(spans, record["non_supported_spans"]) if flag and sp[1] > sp[0]]
        # Claims of the non-supported-tokens file form their own group (another claim set).
        label = PARTIAL_TOKENS if partial else record["label"]
        claim = Claim(f"wice{'-tokens' if partial else ''}-{n}", record["claim"].strip(), label, gold, unsupported)
        tasks.append(Task(f"wice-{n}", [e.strip() or "." for e in record["evidence"]], [claim]))
    return tasks


# -- methods -----------------------------------------------------------------------

def _top(scores: Sequence[float], k: int) -> List[int]:
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:k]


def bm25_top1(task: Task) -> Dict[str, set]:
    """BM25 with the task's candidate passages as the collection (idf and length from them)."""
    collection = LexicalCollection(tokenize(task.passages))
    out = {}
    for claim in task.claims:
        out[claim.cid] = set(_top(collection.scores(tokenize([claim.text])[0]), 1))
    return out


def single_vector_top1(task: Task, encoder: SingleVectorEncoder) -> Dict[str, set]:
    p = encoder.encode(task.passages)
    q = encoder.encode_queries([c.text for c in task.claims])
    sims = q @ p.T
    return {c.cid: set(_top(sims[i].tolist(), 1)) for i, c in enumerate(task.claims)}


@dataclass
class PropRecord:
    scores: np.ndarray      # mean per-token similarity with every passage
    lexical: np.ndarray     # the sentence's lexical prior per passage (shared by its propositions)
    unsupported: bool = False

    def decide(self, margin: Optional[float], lexical_weight: float = 0.0) -> Optional[int]:
        """The cited passage under a margin and lexical weight (None: left uncited)."""
        fused = self.scores + lexical_weight * self.lexical
        order = np.argsort(-fused, kind="stable")
        gap = fused[order[0]] - fused[order[1]] if len(order) > 1 else np.inf
        return int(order[0]) if margin is None or gap >= margin else None


def _unsupported_share(pieces, spans: Sequence[Tuple[int, int]], text: str) -> float:
    chars = [i for s, e in pieces for i in range(s, e) if text[i].isalnum()]
    if not chars:
        return 0.0
    inside = sum(any(a <= i < b for a, b in spans) for i in chars)
    return inside / len(chars)


def with_margin(records: Sequence[PropRecord], margin: Optional[float], lexical_weight: float = 0.0) -> set:
    return {p for p in (r.decide(margin, lexical_weight) for r in records) if p is not None}


def run_task(task: Task, citer: Citer, sv: Optional[SingleVectorEncoder],
             modes: Sequence[str]) -> Tuple[Dict[str, Dict[str, set]], Dict[str, List[PropRecord]]]:
    preds: Dict[str, Dict[str, set]] = {"bm25-top1": bm25_top1(task)}
    if sv is not None:
        preds["single-vector-top1"] = single_vector_top1(task, sv)
    corpus = citer.encode(task.passages)
    records: Dict[str, List[PropRecord]] = {}
    for mode in modes:
        citer.mode = mode
        preds[mode] = {}
        for claim in task.claims:
            result = citer.cite_sentence(claim.text, corpus)
            preds[mode][claim.cid] = set(result.citations)
            if mode == "propositions":
                lexical = citer.lexical_prior(claim.text, corpus).numpy()
                records[claim.cid] = [PropRecord(np.asarray(p.passage_scores), lexical,
                                                 _unsupported_share(p.pieces, claim.unsupported, claim.text) >= 0.5)
                                      for p in result.propositions]
    citer.mode = "propositions"
    return preds, records


def collect(tasks: Sequence[Task], citer: Citer, sv: Optional[SingleVectorEncoder], modes: Sequence[str],
            desc: str) -> Tuple[Dict[str, Dict[str, set]], Dict[str, List[PropRecord]]]:
    """Every method's citations per claim, and PropCite's per-proposition records (the costly part)."""
    preds: Dict[str, Dict[str, set]] = {}
    records: Dict[str, List[PropRecord]] = {}
    for task in tqdm(tasks, desc=desc, unit="task", disable=None):
        p, r = run_task(task, citer, sv, modes)
        for method, by_claim in p.items():
            preds.setdefault(method, {}).update(by_claim)
        records.update(r)
    return preds, records


@dataclass
class Choice:
    """Settings chosen on ExpertQA rand_val: the paper's margin, and a lexical weight with its margin."""

    margin: float
    lexical_weight: float
    lexical_margin: float


def score(claims: Sequence[Claim], preds: Dict[str, Dict[str, set]], records: Dict[str, List[PropRecord]],
          choice: Choice, groups: Dict[str, Tuple[str, ...]]) -> dict:
    preds = dict(preds)
    if records:
        preds["propositions+margin"] = {c.cid: with_margin(records[c.cid], choice.margin) for c in claims}
        preds["propositions+lexical+margin"] = {
            c.cid: with_margin(records[c.cid], choice.lexical_margin, choice.lexical_weight) for c in claims}
    table = {method: {g: citation_scores((by_claim[c.cid], c.gold) for c in claims if c.label in labels)
                      for g, labels in groups.items()}
             for method, by_claim in preds.items()}
    partial = None
    flat = [r for c in claims if c.unsupported and c.cid in records for r in records[c.cid]]
    if flat:
        partial = {"propositions": len(flat), "unsupported": sum(r.unsupported for r in flat)}
        for name, m, lam in (("margin", choice.margin, 0.0),
                             ("lexical+margin", choice.lexical_margin, choice.lexical_weight)):
            for kind, subset in (("unsupported", [r for r in flat if r.unsupported]),
                                 ("supported", [r for r in flat if not r.unsupported])):
                uncited = sum(r.decide(m, lam) is None for r in subset)
                partial[f"uncited_{kind} ({name})"] = round(100 * uncited / max(1, len(subset)), 1)
    props = [len(records[c.cid]) for c in claims if c.cid in records]
    return {"methods": table, "partial_support": partial,
            "propositions_per_claim": round(statistics.mean(props), 2) if props else None}


LEXICAL_WEIGHTS = (0.1, 0.2, 0.3)


def sweep(claims: Sequence[Claim], records: Dict[str, List[PropRecord]], labels: Tuple[str, ...]) -> List[dict]:
    """F1 of PropCite over the grid of lexical weights × margins (the choice is made on this)."""
    rows = []
    for lam in (0.0, *LEXICAL_WEIGHTS):
        for m in MARGINS:
            scores = citation_scores((with_margin(records[c.cid], m, lam), c.gold) for c in claims if c.label in labels)
            rows.append({"lexical_weight": lam, "margin": m, **scores})
    return rows


def choose(rows: Sequence[dict]) -> Choice:
    """Best F1: among positive margins without the lexical prior, and over the whole grid with it."""
    def best(candidates):
        return max(candidates, key=lambda r: (r["f1"], -r["margin"], -r["lexical_weight"]))
    plain = best(r for r in rows if r["lexical_weight"] == 0 and r["margin"] > 0)
    lexical = best(r for r in rows if r["lexical_weight"] > 0)
    return Choice(plain["margin"], lexical["lexical_weight"], lexical["margin"])


def chosen_settings(tag: Optional[str] = None, results: Optional[Path] = None) -> Choice:
    """The margins and λ chosen on ExpertQA rand_val by the run with the same tag (the same model)."""
    path = (results or RESULTS) / f"{tagged('citation-expertqa-rand_val', tag)}.json"
    if not path.exists():
        again = f" --tag {tag}" if tag else ""
        raise SystemExit(f"{path} is missing: run `python -m benchmarks.citation --dataset expertqa "
                         f"--split rand_val{again}` with the same model first (the margin and lexical weight "
                         "are chosen there)")
    return Choice(**json.loads(path.read_text())["chosen"])


def latency(citer: Citer, tasks: Sequence[Task], ks: Sequence[int], limit: int, seed: int) -> dict:
    """Median ms per answer sentence with K passages already encoded (tagging + query + scoring)."""
    pool = [p for t in tasks for p in t.passages]
    claims = sample([(t, c) for t in tasks for c in t.claims], limit, seed)
    out = {}
    for k in ks:
        times, tag_times = [], []
        for n, (task, claim) in enumerate(claims):
            passages = (task.passages + [p for p in pool if p not in task.passages])[:k]
            corpus = citer.encode(passages)
            if n == 0:  # warm-up: first calls allocate
                for _ in range(3):
                    citer.cite_sentence(claim.text, corpus)
            t0 = time.perf_counter()
            props = citer.tagger(claim.text)
            t1 = time.perf_counter()
            citer.cite_sentence(claim.text, corpus, propositions=props)
            t2 = time.perf_counter()
            times.append(1000 * (t2 - t0))
            tag_times.append(1000 * (t1 - t0))
        out[f"K={k}"] = {"median_ms": round(statistics.median(times), 1),
                         "p90_ms": round(float(np.percentile(times, 90)), 1),
                         "median_tagging_ms": round(statistics.median(tag_times), 1), "sentences": len(times)}
        print(k, out[f"K={k}"])
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=("expertqa", "wice", "latency"), required=True)
    parser.add_argument("--split", choices=("rand_val", "domain_val"), default="rand_val",
                        help="ExpertQA split (latency uses rand_val)")
    parser.add_argument("--limit", type=int, default=None, help="tasks sampled (fixed seed); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="multi-vector model folder (default: built-in)")
    parser.add_argument("--baseline-model", default=None, help="single-vector baseline folder (default: MiniLM)")
    parser.add_argument("--no-single-vector", action="store_true", help="skip the single-vector baseline")
    parser.add_argument("--tag", default=None,
                        help="suffix of the result file, so a second model's run keeps the first's (rand_val's "
                             "choice is read from the file with the same tag)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    citer = Citer(args.model)
    # The encoder's own name and fingerprint, not "default": what the default is changes.
    model = {"model": citer.ranker.encoder.source, "fingerprint": citer.ranker.encoder.fingerprint()[:12]}
    command = command_line("benchmarks.citation", argv)
    if args.dataset == "latency":
        tasks = load_expertqa("rand_val")
        result = {"benchmark": "citation-latency", "dataset": "expertqa-rand_val",
                  "sample": {"claims": args.limit or 100, "seed": args.seed},
                  **model, "latency": latency(citer, tasks, (5, 10), args.limit or 100, args.seed)}
        path = write_result("citation-latency", result, args.out, command)
        print(f"wrote {path}")
        return
    sv = None if args.no_single_vector else SingleVectorEncoder(args.baseline_model)
    modes = ("propositions", "proposition-alone", "sentence-top1", "sentence-top2")
    if args.dataset == "expertqa":
        tasks = sample(load_expertqa(args.split), args.limit, args.seed)
        groups = {"complete+missing": ("Complete", "Missing"), "partial+incomplete": ("Partial", "Incomplete"),
                  "all": ("Complete", "Missing", "Partial", "Incomplete")}
        name, dataset = f"citation-expertqa-{args.split}", f"expertqa-{args.split}"
    else:
        tasks = sample(load_wice(), args.limit, args.seed) + sample(load_wice(partial=True), args.limit, args.seed)
        groups = {"dev": ("supported", "partially_supported", "not_supported"),
                  "supported": ("supported",), "partially_supported": ("partially_supported",),
                  "not_supported": ("not_supported",), "partial_tokens": (PARTIAL_TOKENS,)}
        name, dataset = "citation-wice-dev", "wice-dev"
    claims = [c for t in tasks for c in t.claims]
    preds, records = collect(tasks, citer, sv, modes, dataset)
    grid = sweep(claims, records, next(iter(groups.values())))
    if args.dataset == "expertqa" and args.split == "rand_val":
        choice = choose(grid)
        source = "chosen here (ExpertQA rand_val, complete+missing F1; see margin_sweep)"
    else:
        choice = chosen_settings(args.tag)
        source = f"chosen on ExpertQA rand_val (benchmarks/results/{tagged('citation-expertqa-rand_val', args.tag)}.json)"
    result = score(claims, preds, records, choice, groups)
    result["margin_sweep"] = grid
    # PropCite's citations claim by claim (the first label group, as the F1 rows): a paired test reads them
    first = next(iter(groups.values()))
    judged = [c for c in claims if c.label in first]
    result["per_claim"] = {"ids": [c.cid for c in judged], "propositions": [
        citation_claim_counts(preds["propositions"][c.cid], c.gold) for c in judged]}
    out = {"benchmark": "citation", "dataset": dataset, **model,
           "baseline_model": args.baseline_model or "MiniLM (all-MiniLM-L6-v2)",
           "sample": {"tasks": len(tasks), "claims": len(claims), "limit": args.limit, "seed": args.seed,
                      "labels": {lab: sum(c.label == lab for c in claims) for lab in sorted({c.label for c in claims})},
                      "candidates_per_task": round(statistics.mean(len(t.passages) for t in tasks), 2)},
           "chosen": vars(choice), "chosen_source": source, "tag": args.tag, **result}
    path = write_result(tagged(name, args.tag), out, args.out, command)
    for method, row in result["methods"].items():
        print(f"{method:24s}", {g: (r["precision"], r["recall"], r["f1"], r["uncited_unsupported"]) for g, r in row.items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

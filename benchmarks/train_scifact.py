"""Issue 60's measure of ``agrame train``: SciFact's *train* claims with their rationale sentences, trained from
the default on 2 CPU cores, beside the same run with the passage loss alone (``benchmarks/train_scifact.sh``).

    python -m benchmarks.train_scifact data --out runs/train-scifact        # pairs.jsonl + corpus.jsonl
    python -m benchmarks.train_scifact guard --model M --guard G --out F    # the NQ guard row of a model
    python -m benchmarks.train_scifact report --runs runs/train-scifact     # training/results/train-scifact.json

Pairs: every SciFact train claim with rationales, its gold abstract (the lowest corpus position among them, as
``training/mined.py`` takes it) as a corpus id, its rationale sentences as character ``spans``; the corpus is
SciFact's 5,183 abstracts as ``benchmarks.cross_domain`` reads them. ``agrame train`` holds out 20 % of the
pairs itself (the only data that chooses the mix). Reported: SciFact *dev* (``benchmarks.cross_domain``, the
shipping rule's method) and the 2,000-question NQ guard set (``training.mined guard``; ``choose_mix``'s
protocol: gold + 7 BM25 passages), against the default's committed rows of the same commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_SCIFACT = RESULTS / "cross_domain-scifact-dev-colbert-zeroshot-psg-ship-gpu2100-agrame128.json"
# the default is gpu2100-agrame128's λ = 0.5 mix, chosen under these guard rows (training/results/README.md)
DEFAULT_GUARD = REPO / "training" / "results" / "choose-mix-gpu2100-agrame128-guarded2000.json"
KINDS = {"agrame": "multi-granular (sentence spans)", "passage": "passage loss only (--sentence-loss off)"}


def write_data(out: Path) -> dict:
    from benchmarks.cross_domain import load_claims, load_scifact

    doc_ids, texts, spans, index_maps = load_scifact()
    position = {d: k for k, d in enumerate(doc_ids)}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w") as f:
        for d, t in zip(doc_ids, texts):
            f.write(json.dumps({"id": str(d), "text": t}) + "\n")
    n = 0
    with open(out / "pairs.jsonl", "w") as f:
        for claim in load_claims("train"):
            evidence = {position[int(d)]: sets for d, sets in claim["evidence"].items() if int(d) in position}
            if not evidence:
                continue
            gold = min(evidence)
            chosen = sorted({index_maps[gold][s] for rs in evidence[gold] for s in rs["sentences"]
                             if s in index_maps[gold]})
            if not chosen:
                continue
            f.write(json.dumps({"id": f"scifact-{claim['id']}", "query": claim["claim"], "positive": str(doc_ids[gold]),
                                "spans": [list(spans[gold][k]) for k in chosen]}) + "\n")
            n += 1
    return {"pairs": n, "corpus": len(texts)}


def guard_row(model: str, guard: Path) -> dict:
    from agrame.loading import load_encoder
    from agrame.training.choose_mix import evaluate
    from agrame.training.records import read

    encoder = load_encoder(model)
    row = evaluate(encoder, read(guard))
    alpha = encoder.settings.alpha
    return {"questions": row["questions"], "passage_p1": row["passage_p1"], "alpha": alpha,
            "sentence_p1": row["sentence_p1_by_alpha"][str(float(alpha))], "file": guard.name}


def report(runs: Path, name: str = "train-scifact") -> dict:
    default_sci = json.loads(DEFAULT_SCIFACT.read_text())["metrics"]
    default_guard = json.loads(DEFAULT_GUARD.read_text())["rows"]["mix=0.5"]["nq"]
    rows = {"default": {"scifact_dev_passage_p1": default_sci["psg_p1"], "scifact_dev_sentence_p1": default_sci["sent_p1"],
                        "nq_guard_passage_p1": default_guard["passage_p1"],
                        "nq_guard_sentence_p1": default_guard["sentence_p1_by_alpha"]["0.5"]}}
    def read(path: Path) -> dict:  # a stage not run yet: its numbers are None ("not measured")
        return json.loads(path.read_text()) if path.is_file() else {}

    for kind in KINDS:
        trained = json.loads((runs / kind / "train.json").read_text())
        sci = read(RESULTS / f"cross_domain-scifact-dev-colbert-zeroshot-psg-{name}-{kind}.json").get(
            "metrics", {})
        guard = read(runs / f"{kind}-guard.json")
        rows[kind] = {"loss": KINDS[kind], "scifact_dev_passage_p1": sci.get("psg_p1"),
                      "scifact_dev_sentence_p1": sci.get("sent_p1"), "nq_guard_passage_p1": guard.get("passage_p1"),
                      "nq_guard_sentence_p1": guard.get("sentence_p1"), "chosen": trained["chosen"],
                      "seconds": trained["seconds"], "pairs": trained["pairs"], "train_pairs": trained["train_pairs"],
                      "heldout_pairs": trained["heldout_pairs"], "steps": trained["settings"]["steps"],
                      "attention_dropout": trained["settings"].get("attention_dropout", "model (0.1)"),
                      "heldout_rows": {m: r["heldout"] for m, r in trained.get("rows", {}).items()}}
    d = rows["default"]
    targets = {
        "sentence P@1 ≥ default + 3": (rows["agrame"]["scifact_dev_sentence_p1"], d["scifact_dev_sentence_p1"] + 3),
        "passage P@1 ≥ default": (rows["agrame"]["scifact_dev_passage_p1"], d["scifact_dev_passage_p1"]),
        "NQ guard passage P@1 ≥ default − 1": (rows["agrame"]["nq_guard_passage_p1"], d["nq_guard_passage_p1"] - 1),
        "train time ≤ 30 min": (-rows["agrame"]["seconds"]["total"] / 60, -30.0),
    }
    return {"benchmark": name, "rows": rows,
            "targets": {k: ({"measured": round(abs(v), 2), "bound": round(abs(b), 2), "met": v >= b - 1e-9}
                            if v is not None else {"measured": None, "met": None, "note": "not measured"})
                        for k, (v, b) in targets.items()},
            "data": "SciFact train claims with rationales (pairs), SciFact dev (188 claims), guard2000-nq-dev.jsonl"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data")
    d.add_argument("--out", type=Path, required=True)
    g = sub.add_parser("guard")
    g.add_argument("--model", required=True)
    g.add_argument("--guard", type=Path, required=True)
    g.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("--runs", type=Path, required=True)
    r.add_argument("--name", default="train-scifact", help="the run's name (benchmarks/train_scifact.sh's NAME)")
    r.add_argument("--out", type=Path, default=None, help="default: training/results/NAME.json")
    args = parser.parse_args(argv)
    if args.command == "data":
        print(write_data(args.out))
    elif args.command == "guard":
        args.out.write_text(json.dumps(guard_row(args.model, args.guard), indent=2))
        print(args.out.read_text())
    else:
        result = report(args.runs, args.name)
        args.out = args.out or REPO / "training" / "results" / f"{args.name}.json"
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["targets"], indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()

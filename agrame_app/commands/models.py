"""``agrame models``: the shipped models, their size and their full-protocol rows beside zero-shot."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional

from .common import command_parser


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "models")
    p.add_argument("folders", nargs="*", metavar="FOLDER",
                   help="describe these model folders instead (e.g. agrame train's output: its start, mix and "
                        "held-out rows)")
    p.add_argument("--format", "-f", choices=("table", "jsonl"), default="table",
                   help="table for reading, jsonl for piping (default: table)")
    return p


def describe(folder: str) -> Dict:
    """A model folder as ``--model`` loads it, and what ``agrame train`` recorded of it (``train.json``)."""
    from agrame.loading import load_encoder

    encoder = load_encoder(folder)  # ModelError (exit 2) names what is wrong
    out = {"name": folder, "source": encoder.source, "dim": encoder.dim, "alpha": encoder.settings.alpha,
           "sentence_marker": encoder.settings.span_query_marker, "fingerprint": encoder.fingerprint()[:12]}
    report = Path(folder) / "train.json"
    if report.is_file():
        trained = json.loads(report.read_text())
        chosen = trained.get("chosen", {})
        out["trained"] = {"start": trained.get("start"), "loss": trained.get("loss"), "pairs": trained.get("pairs"),
                          "mix": chosen.get("mix"), "alpha": chosen.get("alpha"),
                          "rows": {m: {n: {"passage_p1": r["passage_p1"],
                                           "sentence_p1": max(r["sentence_p1_by_alpha"].values())}
                                       for n, r in sets.items()} for m, sets in trained.get("rows", {}).items()}}
    return out


def _cards() -> dict:
    from agrame.loading import MODELS_DIR

    path = Path(MODELS_DIR) / "cards.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"rows": [], "models": {}}


def models(cards: Optional[dict] = None) -> List[Dict]:
    """Every shipped name with what is known of it; a model the cards do not list yet has no rows."""
    from agrame.loading import DEFAULT_MODEL, named_models, shipped_names

    from agrame.loading import not_installed_hint

    cards = _cards() if cards is None else cards
    folders = named_models()
    out = []
    absent = [n for n in cards["models"] if n not in shipped_names() and not_installed_hint(n)]
    for name in [*shipped_names(), *absent]:
        card = dict(cards["models"].get(name, {}))
        if not card.get("fingerprint") and name in folders:
            meta = json.loads((folders[name] / "delta.json").read_text())
            card["fingerprint"] = str(meta.get("fingerprint", ""))[:12]
        out.append({"name": name, "default": name == DEFAULT_MODEL, "dim": card.get("dim"),
                    "bytes_per_token": card.get("bytes_per_token"),
                    "bytes_per_token_estimated_from": card.get("bytes_per_token_estimated_from"),
                    "fingerprint": card.get("fingerprint"),
                    "rows": card.get("rows", {}), "installed": name not in absent,
                    **({"how": not_installed_hint(name)} if name in absent else {})})
    out.sort(key=lambda m: not m["default"])
    return out


def _fmt(x) -> str:
    return "—" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x))


def run(args) -> int:
    if args.folders:
        described = [describe(f) for f in args.folders]
        for d in described:
            if args.format == "jsonl":
                print(json.dumps(d, ensure_ascii=False))
                continue
            print(f"{d['name']}: {d['dim']}-d, α {d['alpha']:g}, sentence queries {d['sentence_marker']}, "
                  f"fingerprint {d['fingerprint']} ({d['source']})")
            t = d.get("trained")
            if t:
                print(f"  agrame train from {t['start']} on {t['pairs']} pairs, {t['loss']}; kept λ = {t['mix']:g}, "
                      f"α = {t['alpha']}")
                for mix, sets in t["rows"].items():
                    cells = "; ".join(f"{n} passage {r['passage_p1']:.1f} sentence {r['sentence_p1']:.1f}"
                                      for n, r in sets.items())
                    print(f"  λ = {mix}{' (start)' if mix == '0' else ''}: {cells}")
        return 0
    cards = _cards()
    listed = models(cards)
    if args.format == "jsonl":
        for m in listed:
            print(json.dumps(m, ensure_ascii=False))
        return 0
    width = max(len(m["name"]) for m in listed) + 10
    print(f"{'model':<{width}} {'dim':>4} {'B/token':>8}  fingerprint")
    for m in listed:
        label = m["name"] + (" (default)" if m["default"] else "") + ("" if m["installed"] else " (not installed)")
        size = ("≈" if m.get("bytes_per_token_estimated_from") else "") + _fmt(m["bytes_per_token"])
        print(f"{label:<{width}} {_fmt(m['dim']):>4} {size:>8}  {m['fingerprint'] or '—'}")
    estimated = sorted({m["bytes_per_token_estimated_from"] for m in listed if m.get("bytes_per_token_estimated_from")})
    if estimated:
        print("B/token: a 2-bit index of the benchmark pool, text excluded; ≈ estimated from "
              f"{', '.join(estimated)} (same tokenizer; residuals and centroids at the model's dimension)")
    if any(not m["installed"] for m in listed):
        print("not installed: the wheel carries the default model only; load the others by their folder in a clone "
              "of the repository (--model CLONE/agrame/models/NAME) or install the clone (pip install -e CLONE)")
    measured = [m for m in listed if m["rows"]]
    rows = cards["rows"]
    if measured and rows:
        names = [m["name"] for m in measured]
        first = max(len(r) for r in rows) + 2
        print("\nfull-protocol rows (%; benchmarks/README.md, The shipping rule):")
        print(f"{'':<{first}}" + "".join(f"{n:>{max(10, len(n) + 2)}}" for n in names))
        for r in rows:
            print(f"{r:<{first}}" + "".join(f"{_fmt(m['rows'].get(r)):>{max(10, len(m['name']) + 2)}}"
                                           for m in measured))
    return 0

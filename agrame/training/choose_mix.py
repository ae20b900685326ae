"""Choose the WiSE-FT mixing coefficient λ (and α) on held-out *train* data, in and out of domain.

    python -m training.choose_mix --start runs/models/a1-init --tuned default --mix 0 0.25 0.5 0.75 1 \\
        --held squad=runs/train/squad-train.jsonl:3500:300 --held scifact=runs/big/scifact-heldout.jsonl \\
        --reference zero-shot --out runs/choose-mix.json

Every held-out record is a question with its gold passage and k negatives; each model ranks
the passages (P@1) and every sentence of them (sentence P@1 for each α of the grid) —
:func:`training.choose_alpha.sentence_p1_by_alpha`'s protocol. Held-out sets: SQuAD train
questions the student never saw (``FILE:skip:limit``) and SciFact *train* claims held out by
``training.mined scifact``: one in the training domain, one outside it, neither a reported
split. λ (with its best α) maximises the mean sentence P@1 over the sets; ``--reference``
models (zero-shot MiniLM) are measured alike, so "never worse than zero-shot" is checked on
the same questions.

Both held-out sets come from the training mix's own sources, so they reward forgetting
nothing: the scaled student chose λ = 1 on them and lost passage P@1 on nq-oracle and
EntityQuestions. ``--guard`` sets (``training.mined guard``: DPR NQ / TriviaQA development
questions, outside the mix) are measured alike but only constrain: a (λ, α) is admissible
when on every guard set its passage P@1 and sentence P@1 are no more than ``--tolerance``
points below the first reference's (at that reference's best α) — the issue's "never worse
than zero-shot" on held-out data. The best admissible setting wins; if none is, the one
whose worst guard deficit is smallest, and the result says so.

``--reuse RESULT`` takes a ``--reference`` row from an earlier result that measured the same
reference (same name, or same folder fingerprint) on the same ``--held``/``--guard`` sets (same
specs, sizes and, where recorded, file fingerprints): zero-shot's row is ~10 minutes on a CPU
and the same for every candidate. The result names the rows it reused.

Each measured row is kept in ``OUT.partial`` as it finishes, so a run cut off (a CPU session's end)
goes on from the next row; the rows are reused only for the same models and held-out sets.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from agrame import scoring
from agrame.corpus import EncodedCorpus, as_passages
from agrame.encoder import Encoder
from agrame.loading import load_encoder
from agrame.ranker import Ranker

#: the α grid of Score(q,s) = S'(q,s) + α·S(q,p) that every mix and α choice is measured on
GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def load_model(spec: str) -> Encoder:
    return load_encoder(None if spec == "default" else spec)


def record_scores(ranker: Ranker, record: dict, encoded: Optional[Sequence] = None,
                  query: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A record's passage scores ``[P]``, the scores of all their sentences ``[S]`` (the record's own
    sentences, in passage order) and each sentence's passage ``[S]``: MaxSim of the ``[Q]`` query
    and of the sentence query (``[Q']``), as ``agrame rank`` scores them. ``encoded`` (its passages)
    and ``query`` (``Ranker.encode_query(…, "sentence")``) may come from a batch of records."""
    encoder = ranker.encoder
    items = as_passages([(str(k), p["text"]) for k, p in enumerate(record["passages"])])
    if encoded is None:
        encoded = encoder.encode_passages([p.text for p in items], batch_size=ranker.batch_size)
    # The record's own sentences (SciFact's are the dataset's), so the gold passage's answer
    # sentences are the first global sentence indices.
    corpus = EncodedCorpus.build(items, list(encoded), sentences=[p["sentences"] for p in record["passages"]])
    q, s = query if query is not None else ranker.encode_query(record["question"], "sentence")
    passage = scoring.segment_maxsim(scoring.similarity(q, corpus.vectors.float()), corpus.token_passage, len(corpus))
    sentence = scoring.segment_maxsim(scoring.similarity(s, corpus.vectors.float()), corpus.token_sentence,
                                      int(corpus.sentences.shape[0]))
    return passage, sentence, corpus.sentence_passage


def batch_record_scores(ranker: Ranker, records: Sequence[dict], passages_per_pass: int = 64,
                        questions_per_pass: int = 32):
    """:func:`record_scores` of each record, the distinct passage texts of all ``records`` encoded once
    (``passages_per_pass`` a forward pass, by length) and their questions in batches: on a GPU, one record
    at a time is a few small forward passes (the first device call's teacher stage ran out its time); on
    the CPU, records drawn from one corpus share passages (a 2,000-question guard set's 16,000 are 9,662
    texts), each encoded once instead of in every record that has it."""
    distinct: Dict[str, int] = {}
    for r in records:
        for p in r["passages"]:
            distinct.setdefault(p["text"], len(distinct))
    encoded = ranker.encoder.encode_passages(list(distinct), batch_size=passages_per_pass)
    queries = ranker.encode_query_batch([r["question"] for r in records], "sentence", batch_size=questions_per_pass)
    for r, query in zip(records, queries):
        yield record_scores(ranker, r, [encoded[distinct[p["text"]]] for p in r["passages"]], query)


def evaluate(encoder: Encoder, records: Sequence[dict], grid: Sequence[float] = GRID) -> dict:
    """Passage P@1 among each record's passages, and sentence P@1 over all their sentences per α."""
    ranker = Ranker(encoder)
    hits = {a: 0 for a in grid}
    passage_hits = 0
    with torch.inference_mode():
        for r, (passage, sentence, owner) in zip(records, batch_record_scores(ranker, records, ranker.batch_size)):
            passage_hits += int(torch.sort(passage, descending=True, stable=True).indices[0]) == 0
            gold = set(r["passages"][0]["answer_sentences"])
            for a in grid:
                combined = scoring.combined_score(sentence, passage[owner], a)
                hits[a] += int(torch.sort(combined, descending=True, stable=True).indices[0]) in gold
    n = max(1, len(records))
    return {"questions": len(records), "passage_p1": round(100 * passage_hits / n, 1),
            "sentence_p1_by_alpha": {str(a): round(100 * h / n, 1) for a, h in hits.items()}}


def read_window(spec: str) -> List[dict]:
    """The records of ``FILE[:skip[:limit]]`` (``ValueError`` naming the spec otherwise)."""
    from .records import read

    path, *window = spec.split(":")
    if not path or not Path(path).is_file() or len(window) > 2 or not all(w.isdigit() for w in window):
        raise ValueError(f"{spec}: expected FILE[:skip[:limit]] with an existing FILE")
    records = read(path)
    if window:
        skip, limit = int(window[0]), int(window[1]) if len(window) > 1 else None
        records = records[skip:skip + limit] if limit else records[skip:]
    return records


def read_held(spec: str) -> tuple:
    name, _, rest = spec.partition("=")
    try:
        if not name:
            raise ValueError
        return name, read_window(rest)
    except ValueError:
        raise ValueError(f"--held {spec}: expected NAME=FILE[:skip[:limit]] with an existing FILE") from None


def guard_deficit(sets: Dict[str, dict], alpha: str, reference: Dict[str, dict], guards: Sequence[str]) -> float:
    """Worst shortfall (points) below the reference on the guard sets, passage or sentence P@1; ≤ 0 when none."""
    worst = float("-inf")
    for g in guards:
        mine, ref = sets[g], reference[g]
        worst = max(worst, ref["passage_p1"] - mine["passage_p1"],
                    max(ref["sentence_p1_by_alpha"].values()) - mine["sentence_p1_by_alpha"][alpha])
    # the rows are rounded to 0.1: 16.1 − 15.1 is 1.0000000000000009 in floating point, which a 1-point
    # tolerance would refuse
    return round(worst, 6)


def best_setting(rows: Dict[str, Dict[str, dict]], guards: Sequence[str] = (),
                 reference: Optional[Dict[str, dict]] = None, tolerance: float = 1.0) -> dict:
    """(model, α) with the highest mean sentence P@1 over the held-out (non-guard) sets, among those
    within ``tolerance`` of ``reference`` on every guard set."""
    best = None
    for model, sets in rows.items():
        held = [s for name, s in sets.items() if name not in guards]
        for a in held[0]["sentence_p1_by_alpha"]:
            mean = sum(s["sentence_p1_by_alpha"][a] for s in held) / len(held)
            deficit = guard_deficit(sets, a, reference, guards) if guards else float("-inf")
            # admissible settings first; among the rest the smallest worst deficit
            key = (deficit <= tolerance, -max(deficit, tolerance), mean, -abs(float(a) - 0.5))
            if best is None or key > best[0]:
                setting = {"model": model, "alpha": float(a), "mean_sentence_p1": round(mean, 2)}
                if guards:
                    setting["guard_deficit"] = round(deficit, 2)
                    setting["guard"] = "admissible" if deficit <= tolerance else "none admissible: smallest deficit"
                best = (key, setting)
    return best[1]


def fingerprint(spec: str) -> str:
    """A model folder's files (name, size, content hash): a model trained again invalidates kept rows, a
    copy of the same files does not (by mtime it did: ../shared/models, copied afresh for a session, lost
    every kept guard-2000 row of the last one)."""
    import hashlib

    folder = Path(spec)
    if not folder.is_dir():
        return spec
    return ";".join(f"{f.name}:{f.stat().st_size}:{hashlib.sha256(f.read_bytes()).hexdigest()[:16]}"
                    for f in sorted(folder.iterdir()) if f.is_file())


def fingerprint_file(spec: str) -> str:
    """A ``NAME=FILE[:skip[:limit]]`` set's file (size, mtime): a set written again invalidates reuse."""
    path = Path(spec.partition("=")[2].split(":")[0])
    return f"{path.stat().st_size}:{path.stat().st_mtime_ns}" if path.is_file() else ""


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)


def reusable_rows(path: Path, references: Sequence[str], sets: dict) -> Dict[str, Dict[str, dict]]:
    """The ``references`` rows of an earlier result ``path`` measured on the same ``sets`` (``held_out_files``,
    ``guard_files``, ``held_out`` sizes and, where both record them, ``set_fingerprints``); {} if none."""
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict) or any(saved.get(k) != v for k, v in sets.items() if k != "set_fingerprints"):
        return {}
    if saved.get("set_fingerprints", sets["set_fingerprints"]) != sets["set_fingerprints"]:
        return {}
    stored = saved.get("reference_fingerprints", {})
    rows = saved.get("rows", {})
    # A name (zero-shot) is its own identity; a folder must match the fingerprint the result recorded.
    return {ref: rows[ref] for ref in references
            if ref in rows and stored.get(ref, None if Path(ref).is_dir() else ref) == fingerprint(ref)}


def measure_rows(measure: Dict[str, Callable[[], Dict[str, dict]]], partial: Path, signature: dict) -> Dict[str, Dict[str, dict]]:
    """Each named row (in order), reusing those ``partial`` holds for the same ``signature``."""
    kept: Dict[str, Dict[str, dict]] = {}
    if partial.is_file():
        saved = json.loads(partial.read_text())
        if saved.get("signature") == signature:
            kept = saved["rows"]
    rows: Dict[str, Dict[str, dict]] = {}
    for name, run in measure.items():
        if name in kept:
            rows[name] = kept[name]
            print(name, "(kept from", partial, ")", flush=True)
            continue
        rows[name] = run()
        print(name, json.dumps(rows[name]), flush=True)
        _write_json(partial, {"signature": signature, "rows": {**kept, **rows}})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .interpolate import interpolate, projection_agreement

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="θ₀ (the model training started from)")
    parser.add_argument("--tuned", required=True, help="θ₁: the fine-tuned model (a folder, or a shipped name such as squad-a1)")
    parser.add_argument("--mix", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--held", action="append", required=True, help="NAME=FILE[:skip[:limit]] (repeatable)")
    parser.add_argument("--guard", action="append", default=[],
                        help="NAME=FILE[:skip[:limit]]: a set that only constrains the choice (needs --reference)")
    parser.add_argument("--tolerance", type=float, default=1.0,
                        help="points a guard set may fall below the first reference (default 1)")
    parser.add_argument("--reference", action="append", default=[], help="models measured alike (e.g. zero-shot)")
    parser.add_argument("--reuse", type=Path, action="append", default=[], metavar="RESULT",
                        help="an earlier choose_mix result whose --reference rows on the same sets are taken "
                             "instead of measured again (repeatable; others are ignored)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.guard and not args.reference:
        parser.error("--guard needs --reference (the model the guard sets compare with)")
    try:
        held = [read_held(h) for h in args.held + args.guard]
    except ValueError as exc:
        parser.error(str(exc))  # exit status 2
    guards = [name for name, _ in held[len(args.held):]]
    if len({name for name, _ in held}) < len(held):
        parser.error("--held and --guard names must differ")
    start, tuned = load_model(args.start), load_model(args.tuned)
    if projection_agreement(start, tuned) < 0.5:
        raise SystemExit("error: --tuned was not trained from --start's projection (training.interpolate)")

    def on_held(make: Callable[[], Encoder]) -> Callable[[], Dict[str, dict]]:
        def run() -> Dict[str, dict]:
            model = make()
            return {name: evaluate(model, records) for name, records in held}
        return run

    def mixed(mix: float) -> Callable[[], Dict[str, dict]]:
        return on_held(lambda: interpolate(start, tuned, mix))

    def reference(ref: str) -> Callable[[], Dict[str, dict]]:
        return on_held(lambda: load_model(ref))

    sets = {"held_out_files": args.held, "guard_files": args.guard, "held_out": {n: len(r) for n, r in held},
            "set_fingerprints": {spec: fingerprint_file(spec) for spec in args.held + args.guard}}
    reused: Dict[str, str] = {}
    reused_rows: Dict[str, Dict[str, dict]] = {}
    for path in args.reuse:
        for ref, row in reusable_rows(path, [r for r in args.reference if r not in reused], sets).items():
            reused[ref], reused_rows[ref] = str(path), row
            print(ref, "(reused from", path, ")", flush=True)

    def reference_row(ref: str) -> Callable[[], Dict[str, dict]]:
        return (lambda: reused_rows[ref]) if ref in reused else reference(ref)

    mix_names = [f"mix={mix:g}" for mix in args.mix]
    # The references first and then the largest λ: a run stopped part-way (on this CPU, by a session's end)
    # has already measured what its rows are read against and what training gained most.
    measure = {**{ref: reference_row(ref) for ref in args.reference},
               **{n: mixed(m) for m, n in sorted(zip(args.mix, mix_names), reverse=True)}}
    signature = {"start": fingerprint(args.start), "tuned": fingerprint(args.tuned), "held": args.held}
    if args.guard:  # (absent without guards: rows kept before --guard existed stay valid)
        signature["guard"] = args.guard
    partial = args.out.with_name(args.out.name + ".partial")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = measure_rows(measure, partial, signature)
    mixes = {n: rows[n] for n in mix_names}
    result = {"start": args.start, "tuned": args.tuned, **sets, "tolerance": args.tolerance,
              "reference_fingerprints": {ref: fingerprint(ref) for ref in args.reference}, "reused": reused,
              "rows": rows, "best": best_setting(mixes, guards, rows.get(args.reference[0]) if guards else None,
                                                 args.tolerance),
              "command": "python -m training.choose_mix " + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
    _write_json(args.out, result)
    partial.unlink()
    print(json.dumps(result["best"]))


if __name__ == "__main__":
    main()

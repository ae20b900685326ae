"""``agrame train``: adapt a model to your own queries and passages (:mod:`agrame.training.trainer`)."""

from __future__ import annotations

import argparse
import json
import sys

from .common import DEFAULT_MODEL_HELP, UsageError, command_parser, model_names, positive_int, say, share


def _mix(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"expected a mix λ in (0, 1], got {value!r}")
    return number


def _heldout(value: str) -> float:
    number = 0.0 if value == "0" else share(value)
    if number >= 1:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1), got {value!r}")
    return number


def _dropout(value: str):
    if value == "model":
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1) or 'model', got {value!r}")
    return number


def add_parser(sub) -> argparse.ArgumentParser:
    from agrame.training.trainer import SENTENCE_LOSS, TrainSettings

    d = TrainSettings()
    p = command_parser(sub, "train")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--pairs", metavar="FILE",
                      help='training pairs, JSONL: {"query", "positive", "negatives"?, "sentences"?, "spans"?, '
                           '"scores"?} (docs/training.md)')
    data.add_argument("--records", nargs="+", metavar="FILE[@N]",
                      help="prepared training records instead of pairs (the research scripts' files, teacher logits "
                           "included; @N: N copies), with --heldout-records")
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="the model folder to write (new or empty)")
    p.add_argument("--corpus", metavar="FILE", default=None,
                   help="passages negatives are mined from, in any format agrame index reads; positives and "
                        "negatives may then be its ids (default: the pairs' own passages)")
    p.add_argument("--model", "-m", metavar="PATH", default=None,
                   help="the start: a model folder or a shipped name (" + model_names() + "); " + DEFAULT_MODEL_HELP)
    p.add_argument("--negatives", type=positive_int, default=d.negatives, metavar="K",
                   help=f"passages beside the positive in each training example (default: {d.negatives})")
    p.add_argument("--mined", type=int, default=d.mined, metavar="M",
                   help=f"of them, mined by the start model's exact MaxSim; the rest by BM25 (default: {d.mined})")
    p.add_argument("--steps", type=positive_int, default=d.steps, help=f"optimizer steps (default: {d.steps})")
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size,
                   help=f"queries a step (default: {d.batch_size}; their passages are each other's negatives too)")
    p.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default: {d.lr:g})")
    p.add_argument("--layers", type=positive_int, default=d.layers,
                   help=f"top transformer layers tuned (default: {d.layers})")
    p.add_argument("--attention-dropout", type=_dropout, default=d.attention_dropout, metavar="P",
                   help=f"dropout on attention probabilities while training, or 'model' for the start's own "
                        f"(default: {d.attention_dropout:g}: on a CPU it is most of a step's time)")
    p.add_argument("--sentence-loss", choices=SENTENCE_LOSS, default=d.sentence_loss,
                   help="the sentence KL loss beside the passage loss: auto = when any pair labels sentences or "
                        "spans (default)")
    p.add_argument("--heldout", type=_heldout, default=d.heldout, metavar="SHARE",
                   help=f"share of the pairs held out to choose the mix λ and α (default: {d.heldout:g}; "
                        "0: keep the trained model unmixed)")
    p.add_argument("--heldout-records", nargs="+", default=[], metavar="FILE[:SKIP:LIMIT]",
                   help="with --records: the held-out records that choose the mix")
    p.add_argument("--mix", type=_mix, nargs="+", default=list(d.mixes), metavar="λ",
                   help="WiSE-FT mixes tried between the start (λ = 0, always a candidate) and the trained model "
                        "(default: " + " ".join(f"{m:g}" for m in d.mixes) + ")")
    p.add_argument("--guard", action="append", default=[], metavar="FILE",
                   help="a file of queries the result must not rank worse than the start model on by more than "
                        "--tolerance points (pairs with their own negatives, or training records); repeatable")
    p.add_argument("--tolerance", type=float, default=d.tolerance, help="points below the start on a guard "
                   f"(default: {d.tolerance:g})")
    p.add_argument("--device", default=d.device, help="torch device, e.g. cuda (default: cpu)")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop training after this many minutes; the same command resumes")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="print the report (train.json) as JSON on stdout")
    return p


def run(args) -> int:
    from agrame.training.trainer import TrainSettings, train

    if not 0 <= args.mined <= args.negatives:
        raise UsageError(f"--mined {args.mined}: between 0 and --negatives ({args.negatives})")
    if args.heldout_records and not args.records:
        raise UsageError("--heldout-records goes with --records (pairs hold out their own --heldout share)")
    if args.corpus and args.records:
        raise UsageError("--corpus goes with --pairs (prepared records hold their negatives)")
    if args.lr <= 0:
        raise UsageError(f"--lr {args.lr:g}: must be > 0")
    if args.minutes is not None and args.minutes <= 0:
        raise UsageError(f"--minutes {args.minutes:g}: must be > 0")
    if args.device != "cpu":
        import torch

        try:
            torch.empty(0, device=args.device)
        except (RuntimeError, AssertionError) as exc:
            raise UsageError(f"--device {args.device}: {str(exc).splitlines()[0]}") from None
    settings = TrainSettings(model=args.model, negatives=args.negatives, mined=args.mined, steps=args.steps,
                             batch_size=args.batch_size, lr=args.lr, layers=args.layers, heldout=args.heldout,
                             attention_dropout=args.attention_dropout,
                             mixes=tuple(args.mix), tolerance=args.tolerance, sentence_loss=args.sentence_loss,
                             device=args.device, minutes=args.minutes, seed=args.seed, guards=tuple(args.guard),
                             records=tuple(args.records or ()), heldout_records=tuple(args.heldout_records))
    report = train(args.pairs, args.out, settings, corpus=args.corpus, say=say)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    elif report.get("done"):
        print(_table(report))
    return 0


def _table(report: dict) -> str:
    """The held-out rows beside the start model's, as a table."""
    rows = report.get("rows")
    if not rows:
        return f"wrote the trained model unmixed ({report['chosen'].get('note', '')})"
    names = list(next(iter(rows.values())))  # the held-out sets, then the guards
    head = ["λ"] + [f"{n} passage P@1" for n in names] + [f"{n} sentence P@1" for n in names]
    lines = ["\t".join(head)]
    for mix, sets in rows.items():
        mark = " (start)" if mix == "0" else (" (chosen)" if float(mix) == report["chosen"]["mix"] else "")
        lines.append("\t".join([mix + mark] + [f"{sets[n]['passage_p1']:.1f}" for n in names]
                               + [f"{max(sets[n]['sentence_p1_by_alpha'].values()):.1f}" for n in names]))
    return "\n".join(lines)

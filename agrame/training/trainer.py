"""``agrame train``: adapt a model to a user's own queries and passages (issue 60).

    from agrame.training import TrainSettings, train
    report = train("pairs.jsonl", "my-model", corpus="corpus.jsonl")     # then Ranker("my-model"), --model my-model

The stages, each the research recipe's (docs/training.md):

1. **read** the pairs (:mod:`agrame.training.pairs`) and the corpus, every line checked before anything is
   written; the start model loaded (the default, a shipped name or any model folder);
2. **split** a seeded held-out slice of the pairs (``heldout``, 20 %) that chooses the mix;
3. **mine** each pair's hard negatives up to ``negatives``: its own first, then ``mined`` of the start model's
   exact MaxSim ranking of the corpus, then BM25's (:mod:`agrame.training.mining`);
4. **train** the start model with the multi-granular KL loss when sentence or span labels exist (the passage
   loss alone otherwise), in-batch negatives, the top ``layers`` layers with layer-wise learning-rate decay;
   checkpoints every 25 steps in a work folder beside the output, so the same call resumes;
5. **mix**: WiSE-FT λ between the start and the trained model, and α, chosen on the held-out slice among the
   mixes no more than ``tolerance`` points below the start model on every guard file; λ = 0 (the start
   itself) is a candidate, so a run that does not help leaves the start model's ranking;
6. **write** the chosen mix as a model folder (one rename), with ``train.json``: every row beside the start's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from agrame.encoder import Encoder, ModelError
from agrame.io import InputError

from .pairs import Corpus, Pair, pairs_corpus, read_corpus, read_pairs, to_record

SENTENCE_LOSS = ("auto", "on", "off")
REPORT = "train.json"


@dataclass
class TrainSettings:
    model: Optional[str] = None          # the start: a shipped name or a model folder; None = the default
    negatives: int = 7                   # passages beside the positive in each training record
    mined: int = 4                       # of them, from the start model's ranking (the rest: BM25's)
    steps: int = 300
    batch_size: int = 8
    lr: float = 1e-4
    layers: int = 6                      # top transformer layers tuned (with the projection and marker rows)
    layer_lr_decay: float = 0.8
    #: dropout on the attention probabilities while training (None: the start model's own, 0.1 for BERTs); 0
    #: by default because on a CPU it is most of a step's time (set_attention_dropout's note)
    attention_dropout: Optional[float] = 0.0
    warmup: float = 0.05
    heldout: float = 0.2                 # share of the pairs that chooses the mix (0: none, the trained model as is)
    min_heldout: int = 10
    mixes: Sequence[float] = (0.25, 0.5, 0.75, 1.0)
    tolerance: float = 1.0               # points a mix may fall below the start model on a guard file
    sentence_loss: str = "auto"          # auto: on when any pair labels sentences or spans
    device: str = "cpu"
    precision: str = "auto"
    minutes: Optional[float] = None      # stop (resumable) after this much training time
    seed: int = 0
    depth: int = 30                      # ranking depth negatives are mined from
    guards: Sequence[str] = field(default_factory=tuple)
    #: Prepared training records instead of pairs (FILE or FILE@N: N copies; the research scripts' SQuAD, SciFact
    #: and distillation files, teacher logits included), and the held-out records that choose the mix
    #: (FILE or FILE:SKIP:LIMIT): the recipe that made the default as one call (docs/training.md).
    records: Sequence[str] = field(default_factory=tuple)
    heldout_records: Sequence[str] = field(default_factory=tuple)


@dataclass
class Prepared:
    """Everything read and checked, before anything is written."""
    pairs: List[Pair]
    corpus: Corpus
    train: List[Pair]
    heldout: List[Pair]
    guards: Dict[str, List[dict]]
    sentence_weight: float
    start: Encoder
    records: Optional[List[dict]] = None           # --records: the training records as given
    heldout_sets: Optional[Dict[str, List[dict]]] = None  # --heldout-records: name → records


def _check_settings(s: TrainSettings) -> None:
    problems = []
    for name in ("negatives", "steps", "batch_size", "layers", "depth"):
        if getattr(s, name) < 1:
            problems.append(f"{name.replace('_', '-')} must be at least 1")
    if not 0 <= s.mined <= s.negatives:
        problems.append(f"mined must be between 0 and negatives ({s.negatives})")
    if not 0 <= s.heldout < 1:
        problems.append("heldout must be a share in [0, 1)")
    if not all(0 < m <= 1 for m in s.mixes):
        problems.append("mixes must lie in (0, 1]")
    if s.sentence_loss not in SENTENCE_LOSS:
        problems.append(f"sentence_loss must be one of {', '.join(SENTENCE_LOSS)}")
    if s.attention_dropout is not None and not 0 <= s.attention_dropout < 1:
        problems.append("attention-dropout must be in [0, 1)")
    if s.lr <= 0 or not 0 <= s.warmup < 1 or s.layer_lr_decay <= 0:
        problems.append("lr and layer-lr-decay must be > 0, warmup in [0, 1)")
    if problems:
        raise ValueError("; ".join(problems))


def trainable(encoder: Encoder) -> None:
    """A start model must be a BERT-style encoder with layers to tune (``agrame train`` tunes the top ones)."""
    layers = getattr(getattr(encoder.backbone, "encoder", None), "layer", None)
    if layers is None or len(layers) == 0:
        raise ModelError(f"the start model {encoder.source} cannot be trained here: its backbone "
                         f"({type(encoder.backbone).__name__}) has no transformer layers agrame train can tune")


def read_guard(path: str) -> List[dict]:
    """A guard file: training records (``passages``, the research scripts' guard sets) or pairs with their own
    ``negatives``; either is ranked as the held-out slice is."""
    from .records import read

    try:
        with open(path) as f:
            first = next((json.loads(line) for line in f if line.strip()), None)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read a guard file: {exc}", path) from None
    if isinstance(first, dict) and "passages" in first:
        return read(path)
    pairs = read_pairs(path)
    for p in pairs:
        if not p.negatives:
            raise InputError("a guard pair needs its own negatives (a guard is ranked, not mined)", path, p.line,
                             "negatives")
    return [to_record(p, p.negatives) for p in pairs]


def read_held(spec: str) -> List[dict]:
    """``FILE`` or ``FILE:SKIP:LIMIT`` of training records."""
    from .choose_mix import read_window

    try:
        return read_window(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def prepare_records(settings: TrainSettings) -> Prepared:
    """``--records``: the records as they are (no mining, no split); the held-out sets from ``heldout_records``."""
    from agrame.loading import load_encoder

    from .student import read_mixture

    try:
        records = read_mixture(settings.records)
    except SystemExit as exc:  # (read_mixture's own refusals)
        raise InputError(str(exc).removeprefix("error: ")) from None
    if not records:
        raise InputError("no training records", settings.records[0])
    if settings.heldout and not settings.heldout_records:
        raise InputError("--records needs --heldout-records to choose the mix (or --heldout 0)")
    held = {Path(h.split(":")[0]).stem: read_held(h) for h in settings.heldout_records} if settings.heldout else {}
    guards = {Path(g).stem: read_guard(g) for g in settings.guards}
    start = load_encoder(settings.model)
    trainable(start)
    weight = 0.0 if settings.sentence_loss == "off" else 1.0
    return Prepared([], Corpus([], []), [], [], guards, weight, start, records, held)


def prepare(pairs: Optional[str], settings: TrainSettings, corpus: Optional[str] = None) -> Prepared:
    """Read and check everything (pairs, corpus, guards, the start model); raises before anything is written."""
    from agrame.loading import load_encoder

    _check_settings(settings)
    if settings.records:
        if pairs or corpus:
            raise InputError("give pairs (with an optional corpus) or prepared records, not both")
        return prepare_records(settings)
    if not pairs:
        raise InputError("no training data: give pairs (or prepared records)")
    pool = read_corpus(corpus) if corpus else None
    every = read_pairs(pairs, pool)
    pool = pool or pairs_corpus(every)
    if len(pool) < 2:
        raise InputError("the corpus holds one passage: negatives need at least two", corpus or pairs)
    guards = {Path(g).stem: read_guard(g) for g in settings.guards}
    labelled = any(p.answer_sentences is not None for p in every)
    if settings.sentence_loss == "on" and not labelled:
        raise InputError("sentence_loss 'on' needs sentence or span labels; no pair has 'sentences' or 'spans'",
                         pairs)
    weight = 1.0 if (settings.sentence_loss == "on" or settings.sentence_loss == "auto" and labelled) else 0.0
    order = list(range(len(every)))
    random.Random(settings.seed).shuffle(order)
    n_held = round(settings.heldout * len(every))
    if settings.heldout > 0 and n_held < settings.min_heldout:
        raise InputError(f"{len(every)} pairs leave {n_held} for the held-out slice that chooses the mix; it needs "
                         f"at least {settings.min_heldout} ({settings.min_heldout / settings.heldout:.0f} pairs at "
                         f"--heldout {settings.heldout:g}), or --heldout 0 to keep the trained model unmixed", pairs)
    held = sorted(order[:n_held])
    train_ids = sorted(order[n_held:])
    if not train_ids:
        raise InputError("no pairs left to train on after the held-out slice", pairs)
    start = load_encoder(settings.model)
    trainable(start)
    return Prepared(every, pool, [every[i] for i in train_ids], [every[i] for i in held], guards, weight, start)


def signature(pairs: Optional[str], corpus: Optional[str], settings: TrainSettings) -> str:
    """What a resumed run must share with the one it continues: the inputs' bytes and every setting."""
    digest = hashlib.sha256()
    files = [r.split("@")[0] for r in settings.records] + [h.split(":")[0] for h in settings.heldout_records]
    for path in (pairs, corpus, *settings.guards, *files):
        digest.update(Path(path).read_bytes() if path else b"-")
    keep = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("minutes", "device", "precision")
            and not (k in ("records", "heldout_records") and not v)}  # (pairs runs: as before records existed)
    digest.update(json.dumps(keep, sort_keys=True, default=list).encode())
    return digest.hexdigest()[:16]


def make_records(prep: Prepared, settings: TrainSettings, say: Callable[[str], None]) -> Dict[str, List[dict]]:
    """Training and held-out records, every pair with the same number of passages (its own negatives first)."""
    from tqdm import tqdm

    from .mining import choose_negatives, lexical_rankings, model_rankings

    count = min(settings.negatives, len(prep.corpus) - 1)
    needy = [p for p in prep.pairs if len(p.negatives) < count]
    by_model: Dict[int, List[int]] = {}
    by_bm25: Dict[int, List[int]] = {}
    if needy:
        queries = [p.query for p in needy]
        say(f"mining negatives for {len(needy)} pairs from {len(prep.corpus):,} passages "
            f"({settings.mined} by the start model, the rest by BM25)")
        lexical = lexical_rankings(queries, prep.corpus, settings.depth)
        ranked: List[List[int]] = [[] for _ in needy]
        if settings.mined:
            with tqdm(total=len(prep.corpus), desc="mine", unit="passage", disable=None) as bar:
                ranked = model_rankings(prep.start, queries, prep.corpus, settings.depth, progress=bar.update)
        for p, m, b in zip(needy, ranked, lexical):
            by_model[id(p)], by_bm25[id(p)] = m, b
    out: Dict[str, List[dict]] = {"train": [], "heldout": []}
    for part, pairs in (("train", prep.train), ("heldout", prep.heldout)):
        for p in pairs:
            negatives = choose_negatives(p, prep.corpus, by_model.get(id(p), []), by_bm25.get(id(p), []), count,
                                         settings.mined)
            if len(negatives) < count:  # a tiny corpus of near-duplicates: fill from the whole corpus
                negatives += [t for t in prep.corpus.texts if t != p.positive and t not in negatives][
                             :count - len(negatives)]
            out[part].append(to_record(p, negatives))
    return out


def _train_student(prep: Prepared, records: List[dict], settings: TrainSettings, folder: Path) -> dict:
    from agrame.loading import load_encoder

    from . import precision
    from .loop import LoopSettings, train as loop
    from .losses import MultiGranularKLLoss
    from .student import StudentScorer, layerwise_groups, make_loss, set_attention_dropout, trainable_parameters

    torch.manual_seed(settings.seed)
    encoder = load_encoder(settings.model).to(settings.device)
    if prep.sentence_weight and encoder.marker_id("Q'") is None and encoder.settings.query_prefix == "":
        # the method's sentence-query marker, learned here when the start has none (zero-shot-128, the recipe's
        # start: training.student's student_encoder adds the same)
        from agrame.encoder import DEFAULT_MARKERS

        encoder = encoder.with_settings(markers={**encoder.settings.markers, "Q'": DEFAULT_MARKERS["Q'"]},
                                        span_query_marker="Q'")
    precision.apply(encoder, settings.device, settings.precision)
    if settings.attention_dropout is not None:
        set_attention_dropout(encoder, settings.attention_dropout)
    params = trainable_parameters(encoder, min(settings.layers, len(encoder.backbone.encoder.layer)))
    if settings.layer_lr_decay != 1.0:
        params = layerwise_groups(encoder, params, settings.layer_lr_decay)
    marker = encoder.settings.span_query_marker or "Q"
    scorer = StudentScorer(encoder, marker, in_batch=True, pool_factor=encoder.settings.pool_factor)
    criterion = MultiGranularKLLoss("softmax", prep.sentence_weight)
    loop_settings = LoopSettings(steps=settings.steps, batch_size=min(settings.batch_size, len(records)),
                                 lr=settings.lr, warmup=settings.warmup, seed=settings.seed,
                                 minutes=settings.minutes, checkpoint_every=25)

    def save(path: Path) -> None:
        encoder.to("cpu").save(path)

    return loop(scorer, records, make_loss(scorer, criterion), loop_settings, folder, params=params, save=save)


def choose(rows: Dict[str, Dict[str, dict]], guards: Sequence[str], sentence: bool, tolerance: float) -> dict:
    """The mix to keep: with the sentence loss, the held-out slice's best mean sentence P@1 (any α) among the
    admissible (:func:`agrame.training.choose_mix.best_setting`); with the passage loss alone, its best
    passage P@1 (the start's α). ``rows["0"]`` is the start model itself."""
    from .choose_mix import best_setting, guard_deficit

    reference = rows["0"]
    if sentence:
        return best_setting(rows, guards, reference, tolerance)
    best = None
    for name, sets in rows.items():
        alpha = "start"
        deficit = max((guard_deficit(sets, max(sets[g]["sentence_p1_by_alpha"]), reference, [g]) for g in guards),
                      default=float("-inf"))
        held = [s["passage_p1"] for n, s in sets.items() if n not in guards]
        passage = round(sum(held) / len(held), 2)
        key = (deficit <= tolerance, passage, -float(name))
        if best is None or key > best[0]:
            best = (key, {"model": name, "alpha": alpha, "passage_p1": passage,
                          **({"guard_deficit": round(deficit, 2)} if guards else {})})
    return best[1]


def mix_rows(prep: Prepared, tuned: Encoder, held: Dict[str, List[dict]], settings: TrainSettings,
             say: Callable[[str], None]) -> Dict[str, Dict[str, dict]]:
    """Every candidate's rows: the start (λ = 0), then each λ, on each held-out set and each guard."""
    from .choose_mix import evaluate
    from .interpolate import interpolate

    rows: Dict[str, Dict[str, dict]] = {}
    for mix in (0.0, *sorted(settings.mixes)):
        model = prep.start if mix == 0 else interpolate(prep.start, tuned, mix)
        row = {name: evaluate(model, recs) for name, recs in held.items()}
        row.update({g: evaluate(model, recs) for g, recs in prep.guards.items()})
        rows[f"{mix:g}"] = row
        say(f"λ = {mix:g}: " + "; ".join(f"{name} passage P@1 {r['passage_p1']}, sentence P@1 "
                                         f"{max(r['sentence_p1_by_alpha'].values())} (best α)"
                                         for name, r in row.items()))
    return rows


def _write_model(model: Encoder, out: Path, report: dict) -> None:
    """The chosen model and its report, committed by one rename."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    (tmp / REPORT).write_text(json.dumps(report, indent=2))
    if out.exists():
        shutil.rmtree(out)  # (only an empty folder reaches here: train() refuses any other)
    tmp.rename(out)


def work_folder(out: Path) -> Path:
    return out.with_name(f".{out.name}.train")


def train(pairs: Optional[str], out: str | Path, settings: Optional[TrainSettings] = None, corpus: Optional[str] = None,
          say: Callable[[str], None] = print) -> dict:
    """Train on ``pairs`` and write the chosen model folder to ``out``; returns the report (``train.json``).
    A run stopped by ``minutes`` returns ``{"done": False, ...}``: the same call resumes it."""
    from agrame.loading import load_encoder

    from .interpolate import interpolate
    from .records import read, write_jsonl

    began = time.time()
    settings = settings or TrainSettings()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError("the output exists and is not an empty folder; choose a new folder for the model", str(out))
    prep = prepare(pairs, settings, corpus)
    work = work_folder(out)
    sig = signature(pairs, corpus, settings)
    stamp = work / "signature"
    if work.exists() and (not stamp.exists() or stamp.read_text() != sig):
        raise InputError(f"{work} holds another run (other pairs, corpus or settings); remove it to start over",
                         str(work))
    work.mkdir(parents=True, exist_ok=True)
    stamp.write_text(sig)
    # seconds of each stage, summed over the calls of a resumed run
    times = json.loads((work / "seconds.json").read_text()) if (work / "seconds.json").exists() else {}

    def timed(stage: str, began: float) -> None:
        times[stage] = round(times.get(stage, 0.0) + time.time() - began, 1)
        (work / "seconds.json").write_text(json.dumps(times))

    timed("read", began)
    if prep.records is not None:  # --records: as given
        train_records, held_sets = prep.records, prep.heldout_sets or {}
    else:
        if not (work / "heldout.jsonl").exists():
            t = time.time()
            records = make_records(prep, settings, say)
            write_jsonl(records["train"], work / "train.jsonl")
            write_jsonl(records["heldout"], work / "heldout.jsonl")
            timed("mine", t)
        train_records, held = read(work / "train.jsonl"), read(work / "heldout.jsonl")
        held_sets = {"heldout": held} if held else {}
    held_count = sum(len(v) for v in held_sets.values())
    loss = "multi-granular (passage + sentence KL)" if prep.sentence_weight else "passage KL only"
    say(f"training {settings.model or 'the default model'} on {len(train_records)} pairs "
        f"({held_count} held out), {len(train_records[0]['passages'])} passages each, loss: {loss}")
    student = work / "student"
    if not (student / "final" / "agrame.json").exists():
        t = time.time()
        state = _train_student(prep, train_records, settings, student)
        timed("train", t)
        if not state["done"]:
            say(f"stopped at step {state['step']} of {settings.steps} (--minutes); run the same command to resume")
            return {"done": False, "step": state["step"], "work": str(work)}
    tuned = load_encoder(student / "final")
    report = {"done": True, "start": settings.model or "default", "pairs": len(prep.pairs),
              "train_pairs": len(train_records), "heldout_pairs": held_count,
              "labelled_pairs": sum(p.answer_sentences is not None for p in prep.pairs),
              "passages_per_pair": len(train_records[0]["passages"]), "loss": loss,
              "sentence_weight": prep.sentence_weight, "settings": dataclasses.asdict(settings),
              "training_log": (student / "train.log").read_text().splitlines()[-3:]}
    t = time.time()
    if held_sets:
        rows = mix_rows(prep, tuned, held_sets, settings, say)
        chosen = choose(rows, list(prep.guards), bool(prep.sentence_weight), settings.tolerance)
        mix = float(chosen["model"])
        model = prep.start if mix == 0 else interpolate(prep.start, tuned, mix)
        if chosen["alpha"] != "start":
            model = model.with_settings(alpha=float(chosen["alpha"]))
        report.update(rows=rows, chosen={**chosen, "mix": mix})
    else:
        model, report["chosen"] = tuned, {"mix": 1.0, "alpha": "start", "note": "--heldout 0: unmixed"}
    timed("mix", t)
    report["seconds"] = {**times, "total": round(sum(times.values()), 1)}
    model.source = f"agrame train from {settings.model or 'default'} (λ = {report['chosen']['mix']:g})"
    _write_model(model, out, report)
    shutil.rmtree(work, ignore_errors=True)
    say(f"wrote {out}: λ = {report['chosen']['mix']:g}, α = {report['chosen']['alpha']}")
    return report

"""A ``dim``-d projection of *frozen* multilingual-e5-small token vectors, distilled from e5's own
single vectors with the multi-granular KL loss (issue 30, steps 3–4).

Why frozen: on this project's 2 CPU cores a student that trains e5's 12 layers costs hours a
thousand steps; with the backbone fixed every token vector is computed once (``cache``) and a
training step only projects cached vectors (milliseconds), so the whole recipe runs in minutes.
The projection is bias-free and the vectors are re-normalised after it, so projecting e5's *unit*
token vectors gives exactly the vectors of the model (normalise(W·h) = normalise(W·h/|h|)): the
benchmarks reuse e5-small's cached pool encodings for it (``benchmarks.encodings``).

Stages (each resumable):

    python -m training.e5_projection cache --data R/squad.jsonl --out R/cache/squad [--sentence-mode text]
    python -m training.e5_projection train --train R/cache/squad R/cache/nq --held R/cache/squad-heldout \\
        --guard R/cache/guard-nq-dev --out R/e5-kd-128 [--dim 128 --steps 2000]

``cache``: per record, e5 once over the question (``query: …``) and each passage as the student
encodes it (``[CLS] passage: … [SEP]``, one window): the unit token vectors (float16), the scored
positions, each token's sentence, and the teacher's logits from the same forward pass — e5's
single vector is the mean of that very row (specials included) — at τ = 0.01 (e5_teacher); a
passage longer than one window is given its teacher vector by e5's own recipe (512 tokens).
Sentence logits: ``--sentence-mode`` (e5_teacher; chosen there on held-out train records).

``train``: W starts at the top ``dim`` right singular vectors of the cached unit token vectors
(the principal projection, as ``training.projection``), then Adam on L_psg + L_sent
(``MultiGranularKLLoss``; ``--sentence-weight 0``: the passage-only twin). Every ``--eval-every``
steps the held-out and guard records are scored (passage P@1 among a record's passages, sentence
P@1 in its gold passage); the checkpoint kept is the best mean sentence P@1 on ``--held`` among
those within ``--tolerance`` of the zero-shot 384-d vectors' passage P@1 on every ``--guard`` set.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from agrame.encoder import Encoder
from agrame.backbones import E5_SMALL, ZERO_SHOT
from agrame.loading import load_encoder
from agrame.spans import token_segments

from .e5_teacher import MODES, TEMPERATURE, E5Teacher
from agrame.training.losses import MultiGranularKLLoss
from agrame.training.student import _pad, late_interaction

CHUNK = 100  # records per cache file


@torch.inference_mode()
def _hidden(encoder: Encoder, rows: Sequence[Sequence[int]], batch_size: int = 16) -> List[torch.Tensor]:
    """e5's last hidden states of each token row (no projection, not normalised)."""
    out: List[Optional[torch.Tensor]] = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        ids, mask = _pad([rows[i] for i in idx], encoder.tokenizer.pad_token_id)
        h = encoder.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        for k, i in enumerate(idx):
            out[i] = h[k, :len(rows[i])].clone()
    return out  # type: ignore[return-value]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.normalize(x.float(), dim=-1)


def _backbone_pass(records: Sequence[dict], encoder: Encoder):
    """The backbone once over ``records``: each distinct passage's inputs (training.student's one window)
    and hidden states, and each question's hidden states (its own row, no marker)."""
    texts = sorted({p["text"] for r in records for p in r["passages"]})
    inputs = {t: encoder.passage_inputs(t) for t in texts}
    hidden = dict(zip(texts, _hidden(encoder, [inputs[t][0] for t in texts])))
    q_hidden = _hidden(encoder, encoder.query_inputs([r["question"] for r in records], None)[0])
    return texts, inputs, hidden, q_hidden


def _student_fields(p: dict, inputs: dict, hidden: dict) -> dict:
    """A passage's cached student side: unit token vectors, scored positions, each token's sentence."""
    _, scored, offsets = inputs[p["text"]]
    seg = token_segments(torch.tensor(offsets, dtype=torch.long), [tuple(s) for s in p["sentences"]])
    return {"vectors": _unit(hidden[p["text"]]).half(), "scored": torch.tensor(scored), "segments": seg.to(torch.int16)}


def cache_chunk(records: Sequence[dict], encoder: Encoder, teacher: E5Teacher, mode: Optional[str]) -> List[dict]:
    """The cached form of ``records`` (see the module docstring)."""
    texts, inputs, hidden, q_hidden = _backbone_pass(records, encoder)
    width = encoder._window_width()
    ids_list, _ = encoder._tokenize(texts)
    long = [t for t, ids in zip(texts, ids_list) if len(ids) > width]
    exact = dict(zip(long, teacher._embed(long, teacher.passage_prefix))) if long else {}
    out = []
    for r, qh in zip(records, q_hidden):
        q_vec = _unit(qh.mean(0))  # e5's query vector: the mean of its "query: …" row
        passages = []
        for p in r["passages"]:
            p_vec = torch.from_numpy(exact[p["text"]]) if p["text"] in exact else _unit(hidden[p["text"]].mean(0))
            passages.append({**_student_fields(p, inputs, hidden), "n_sent": len(p["sentences"]),
                             "teacher": float(p_vec @ q_vec) / TEMPERATURE,
                             "positive": bool(p.get("positive")), "answer_sentences": p.get("answer_sentences", [])})
        # mode None: evaluation records, which need no sentence logits (the costly half of the teacher)
        sentence = teacher.sentence_logits(q_vec.numpy(), r["passages"], mode) if mode else [[]] * len(passages)
        for item, logits in zip(passages, sentence):
            item["teacher_sentences"] = logits
        out.append({"qid": r["qid"], "query": _unit(qh).half(), "passages": passages})
    return out


def restudent_chunk(records: Sequence[dict], taught: Sequence[dict], encoder: Encoder) -> List[dict]:
    """``taught`` (an e5 cache of the same ``records``) with every vector and sentence id from ``encoder``
    instead: another student backbone under the same teacher logits, without running e5 again."""
    _, inputs, hidden, q_hidden = _backbone_pass(records, encoder)
    out = []
    for r, t, qh in zip(records, taught, q_hidden):
        if t["qid"] != r["qid"] or len(t["passages"]) != len(r["passages"]):
            raise ValueError(f"the teacher cache does not hold these records (record {r['qid']} vs {t['qid']})")
        passages = [{**tp, **_student_fields(p, inputs, hidden)} for p, tp in zip(r["passages"], t["passages"])]
        out.append({**t, "query": _unit(qh).half(), "passages": passages})
    return out


def cache(records: Sequence[dict], out: Path, mode: Optional[str], encoder: Optional[Encoder] = None,
          teacher_from: Optional[Path] = None) -> int:
    """Write ``out/chunk-NNNNN.pt`` for every ``CHUNK`` records not cached yet; returns the chunk count.
    ``teacher_from``: an e5 cache of the same records whose teacher logits are kept (``encoder``: another
    backbone, e.g. zero-shot MiniLM, as the student)."""
    from tqdm.auto import tqdm

    encoder = encoder or load_encoder(E5_SMALL)
    if encoder.projection is not None or encoder.settings.query_augmentation:
        raise ValueError("cache the backbone's own vectors: an encoder without projection or [MASK] padding")
    teacher = None if teacher_from else E5Teacher(loaded=(encoder.backbone, encoder.tokenizer))
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps({"sentence_mode": mode, "model": encoder.source,
                                               "fingerprint": encoder.fingerprint()[:12], "records": len(records)}))
    n = (len(records) + CHUNK - 1) // CHUNK
    for i in tqdm(range(n), desc=f"caching {out.name}", unit="chunk", disable=None):
        path = out / f"chunk-{i:05d}.pt"
        if path.exists():
            continue
        chunk = records[i * CHUNK:(i + 1) * CHUNK]
        if teacher_from is not None:
            taught = Path(teacher_from) / path.name
            if not taught.exists():
                raise ValueError(f"{teacher_from}: no {path.name} (the teacher cache holds fewer records)")
            part = restudent_chunk(chunk, torch.load(taught, weights_only=False), encoder)
        else:
            part = cache_chunk(chunk, encoder, teacher, mode)
        tmp = path.with_suffix(".tmp")
        torch.save(part, tmp)
        tmp.replace(path)
    return n


def load_cached(folder: Path) -> List[dict]:
    chunks = sorted(Path(folder).glob("chunk-*.pt"))
    if not chunks:
        raise SystemExit(f"error: {folder}: no cached records (run the cache stage)")
    return [r for c in chunks for r in torch.load(c, weights_only=False)]


def batch_tensors(records: Sequence[dict], gold_strength: float = 0.0) -> dict:
    """Padded ``query`` ``[B, Lq, 384]``, ``docs`` ``[B, P, W, 384]`` and the masks/segments/teacher logits;
    ``gold_strength`` is added to the teacher's logit of a labelled record's gold passage and answer
    sentences (0: e5 alone; the labels teacher of training.teachers gives gold 5 and the rest 0)."""
    n_p = len(records[0]["passages"])
    if any(len(r["passages"]) != n_p for r in records):
        raise ValueError("every record of a batch needs the same number of passages")
    lq = max(r["query"].shape[0] for r in records)
    width = max(p["vectors"].shape[0] for r in records for p in r["passages"])
    n_sent = max(max(p["n_sent"] for p in r["passages"]) for r in records)
    dim = records[0]["query"].shape[1]
    b = len(records)
    q = torch.zeros((b, lq, dim))
    q_mask = torch.zeros((b, lq), dtype=torch.bool)
    docs = torch.zeros((b, n_p, width, dim))
    doc_mask = torch.zeros((b, n_p, width), dtype=torch.bool)
    seg = torch.full((b, n_p, width), -1, dtype=torch.long)
    t_psg = torch.zeros((b, n_p))
    t_sent = torch.zeros((b, n_p, n_sent))
    for i, r in enumerate(records):
        q[i, :len(r["query"])] = r["query"].float()
        q_mask[i, :len(r["query"])] = True
        for j, p in enumerate(r["passages"]):
            n = p["vectors"].shape[0]
            docs[i, j, :n] = p["vectors"].float()
            doc_mask[i, j, :n] = p["scored"]
            seg[i, j, :n] = torch.where(p["scored"], p["segments"].long(), torch.full((n,), -1, dtype=torch.long))
            t_psg[i, j] = p["teacher"] + gold_strength * p["positive"]
            t_sent[i, j, :len(p["teacher_sentences"])] = torch.tensor(p["teacher_sentences"][:n_sent])
            for k in p["answer_sentences"]:
                t_sent[i, j, k] += gold_strength
    return {"q": q, "q_mask": q_mask, "docs": docs, "doc_mask": doc_mask, "seg": seg, "n_sent": n_sent,
            "t_psg": t_psg, "t_sent": t_sent}


def scores(projection: Optional[nn.Linear], t: dict) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student S(q,p) ``[B, P]``, S'(q,s) ``[B, P, S]`` and the sentence mask under ``projection``
    (None: e5's own 384-d vectors, the zero-shot reference)."""
    q, docs = t["q"], t["docs"]
    if projection is not None:
        q, docs = _unit(projection(q)), _unit(projection(docs))
    return late_interaction(q, t["q_mask"], None, t["q_mask"], docs, t["doc_mask"], t["seg"], t["n_sent"])


@torch.no_grad()
def evaluate(projection: Optional[nn.Linear], records: Sequence[dict], batch_size: int = 32) -> Dict[str, float]:
    """Passage P@1 among each record's passages; sentence P@1 of the gold passage's sentences
    (within one passage the α·S(q,p) term of the sentence score is a constant)."""
    psg, sent = [], []
    for b in range(0, len(records), batch_size):
        part = records[b:b + batch_size]
        p_scores, s_scores, s_mask = scores(projection, batch_tensors(part))
        for r, ps, ss, sm in zip(part, p_scores, s_scores, s_mask):
            gold = [j for j, p in enumerate(r["passages"]) if p["positive"]]
            if not gold:
                continue
            psg.append(float(int(ps.argmax()) in gold))
            g = gold[0]
            answers = r["passages"][g]["answer_sentences"]
            if answers:
                sent.append(float(int(ss[g].masked_fill(~sm[g], float("-inf")).argmax()) in answers))
    return {"passage_p1": round(100 * float(np.mean(psg)), 1) if psg else float("nan"),
            "sentence_p1": round(100 * float(np.mean(sent)), 1) if sent else float("nan"), "n": len(psg)}


def principal_projection(records: Sequence[dict], dim: int, tokens: int = 200_000, seed: int = 0) -> nn.Linear:
    """Top ``dim`` right singular vectors (uncentred: MaxSim uses dot products) of cached unit token vectors."""
    vectors = torch.cat([p["vectors"][p["scored"]].float() for r in records for p in r["passages"]])
    if len(vectors) > tokens:
        g = torch.Generator().manual_seed(seed)
        vectors = vectors[torch.randperm(len(vectors), generator=g)[:tokens]]
    _, _, v = torch.linalg.svd(vectors, full_matrices=False)
    layer = nn.Linear(vectors.shape[1], dim, bias=False)
    with torch.no_grad():
        layer.weight.copy_(v[:dim])
    return layer


def train(train_records: Sequence[dict], held: Dict[str, Sequence[dict]], guard: Dict[str, Sequence[dict]],
          dim: int = 128, steps: int = 2000, batch_size: int = 16, lr: float = 1e-3, sentence_weight: float = 1.0,
          eval_every: int = 250, tolerance: float = 1.0, seed: int = 0, keep: str = "best",
          gold_strength: float = 0.0, log=print) -> Tuple[nn.Linear, dict]:
    """The projection chosen as the module docstring says (``keep="last"``: the last one), and the
    history of every evaluation."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    projection = principal_projection(train_records, dim, seed=seed)
    criterion = MultiGranularKLLoss(sentence_weight=sentence_weight)
    optimizer = torch.optim.Adam(projection.parameters(), lr=lr)
    reference = {name: evaluate(None, recs) for name, recs in guard.items()}
    log(json.dumps({"reference_384d": reference}))

    def measure(step: int) -> dict:
        row = {"step": step, **{name: evaluate(projection, recs) for name, recs in {**held, **guard}.items()}}
        row["held_sentence_p1"] = float(np.mean([row[n]["sentence_p1"] for n in held]))
        row["guard_deficit"] = max([reference[n]["passage_p1"] - row[n]["passage_p1"] for n in guard], default=0.0)
        log(json.dumps(row))
        return row

    history = [measure(0)]
    best, best_state = history[0], projection.state_dict()
    order: List[int] = []
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order = list(range(len(train_records)))
            rng.shuffle(order)
        # group by passage count: SciFact-style records may carry fewer passages
        first = train_records[order[0]]
        pick = [i for i in order if len(train_records[i]["passages"]) == len(first["passages"])][:batch_size]
        taken = set(pick)
        order = [i for i in order if i not in taken]
        t = batch_tensors([train_records[i] for i in pick], gold_strength)
        passage, sentence, mask = scores(projection, t)
        loss = criterion(t["t_psg"], passage, t["t_sent"], sentence, mask)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % eval_every == 0 or step == steps:
            row = measure(step)
            row["loss"] = round(float(loss.detach()), 4)
            history.append(row)
            admissible = row["guard_deficit"] <= tolerance
            if admissible and row["held_sentence_p1"] > best["held_sentence_p1"]:
                best, best_state = row, {k: v.clone() for k, v in projection.state_dict().items()}
    if keep == "best":
        projection.load_state_dict(best_state)
    # admissible: false when not even the principal start stays within the guard tolerance (then step 0 is kept)
    return projection, {"chosen_step": best["step"], "chosen": best, "admissible": best["guard_deficit"] <= tolerance,
                        "reference_384d": reference, "history": history}


def projected_model(projection: nn.Linear, base_name: str = E5_SMALL) -> Encoder:
    """A zero-shot backbone — e5-small (prefixes, no markers, α 0.5) or MiniLM (``zero-shot``) — with
    ``projection`` after it, the backbone frozen, its settings otherwise unchanged."""
    import dataclasses

    base = load_encoder(base_name)
    settings = dataclasses.replace(base.settings, dim=projection.out_features)
    return Encoder(base.backbone, base.tokenizer, settings, projection, source=f"{base_name}-kd-projection")


def pick(models: Sequence[Path], out: Path) -> Tuple[str, dict]:
    """The model whose chosen step has the best held-out sentence P@1 (each was chosen within its guard
    tolerance), copied to ``out`` with ``pick.json`` recording every candidate's chosen row."""
    import shutil

    rows = {}
    for folder in models:
        report = json.loads((Path(folder) / "training.json").read_text())
        rows[Path(folder).name] = {"held_sentence_p1": report["chosen"]["held_sentence_p1"],
                                   "guard_deficit": report["chosen"]["guard_deficit"], "settings": report["settings"]}
    # an admissible model before any other, then the better held-out sentence P@1 (the first of equals)
    best = max(models, key=lambda f: (rows[Path(f).name]["guard_deficit"] <= rows[Path(f).name]["settings"].get(
        "tolerance", 1.0), rows[Path(f).name]["held_sentence_p1"]))
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(best, tmp)
    (tmp / "pick.json").write_text(json.dumps({"picked": Path(best).name, "candidates": rows}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return Path(best).name, rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .data import read

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cache", help="e5 token vectors and teacher logits of training records")
    c.add_argument("--data", required=True, help="JSONL from python -m training.mined")
    c.add_argument("--out", type=Path, required=True, help="cache folder (resumed when present)")
    c.add_argument("--sentence-mode", choices=(*MODES, "none"), default="text",
                   help="teacher sentence logits (none: for held-out and guard records, which need none)")
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--teacher-from", type=Path, default=None,
                   help="e5 cache of the same records: keep its teacher logits, vectors from --model")
    t = sub.add_parser("train", help="the projection, distilled on cached records")
    t.add_argument("--train", type=Path, nargs="+", required=True, help="cache folders")
    t.add_argument("--held", type=Path, nargs="+", required=True, help="cache folders of held-out train records")
    t.add_argument("--guard", type=Path, nargs="*", default=[], help="cache folders of guard records")
    t.add_argument("--out", type=Path, required=True, help="model folder written (a delta over e5: --model OUT)")
    t.add_argument("--dim", type=int, default=128)
    for q in (c, t):
        q.add_argument("--model", choices=(E5_SMALL, ZERO_SHOT), default=E5_SMALL,
                       help="the frozen student backbone (its vectors are what the cache holds)")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--sentence-weight", type=float, default=1.0, help="0: the passage-loss-only twin")
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--tolerance", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--gold-strength", type=float, default=0.0,
                   help="added to the teacher logits of labelled records' gold passage and answer sentences")
    k = sub.add_parser("pick", help="of trained projections, the best on the held-out records (copied to --out)")
    k.add_argument("--models", type=Path, nargs="+", required=True, help="folders written by the train stage")
    k.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for name in ("limit", "dim", "steps", "batch_size", "eval_every"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    def cached(folder: Path) -> Path:
        if not any(Path(folder).glob("chunk-*.pt")):
            parser.error(f"{folder}: no cached records (make them: python -m training.e5_projection cache "
                         f"--data … --out {folder})")
        return folder

    if args.command == "pick":
        for folder in args.models:
            if not (folder / "training.json").is_file():
                parser.error(f"{folder}: no training.json (not a folder the train stage wrote)")
        name, report = pick(args.models, args.out)
        print(f"picked {name} → {args.out}: {json.dumps(report[name])}")
        return
    if args.command == "cache":
        if not Path(args.data).is_file():
            parser.error(f"--data {args.data}: no such file")
        if args.teacher_from is not None:
            cached(args.teacher_from)
        try:
            records = [r for r in read(args.data) if not r.get("skipped")][: args.limit]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            parser.error(f"--data {args.data}: not JSON lines ({exc})")
        if not records or any(not isinstance(r, dict) or "question" not in r or "passages" not in r
                              for r in records):
            parser.error(f"--data {args.data}: no records with 'question' and 'passages' (python -m training.mined)")
        try:
            n = cache(records, args.out, None if args.sentence_mode == "none" else args.sentence_mode,
                      load_encoder(args.model), args.teacher_from)
        except ValueError as exc:  # a teacher cache of other records; chunks written so far are whole
            parser.error(str(exc))
        print(f"cached {len(records)} records in {n} chunks under {args.out}")
        return
    train_records = [r for folder in args.train for r in load_cached(cached(folder))]
    held = {f.name: load_cached(cached(f)) for f in args.held}
    guard = {f.name: load_cached(cached(f)) for f in args.guard}
    projection, report = train(train_records, held, guard, args.dim, args.steps, args.batch_size, args.lr,
                               args.sentence_weight, args.eval_every, args.tolerance, args.seed,
                               gold_strength=args.gold_strength)
    from agrame.delta import BASE_E5, BASE_MINILM, export_delta

    # the backbone is e5's own: the delta holds the projection alone (float16, ~100 KB at 128-d)
    meta = export_delta(projected_model(projection, args.model), args.out,
                        base=BASE_E5 if args.model == E5_SMALL else BASE_MINILM)
    report.update({"train": [str(f) for f in args.train], "train_records": len(train_records),
                   "held": [str(f) for f in args.held], "guard": [str(f) for f in args.guard],
                   "settings": {k: getattr(args, k) for k in ("dim", "steps", "batch_size", "lr", "sentence_weight",
                                                               "eval_every", "tolerance", "seed", "gold_strength",
                                                               "model")}})
    (args.out / "training.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} (fingerprint {meta['fingerprint'][:12]}): step {report['chosen_step']} chosen, "
          f"{json.dumps(report['chosen'])}")


if __name__ == "__main__":
    main()

"""Cross-encoder teachers (AGRaME §3.3): passage CE, sentence CE' (``$``-marked) and a one-pass CE'.

    python -m training.teachers train --kind one-pass --data runs/train/squad-train.jsonl --out runs/teachers/one-pass
    python -m training.teachers evaluate --model runs/teachers/one-pass/final --limit 300
    python -m training.teachers multivector --model zero-shot --data runs/big/distill-nq-dev.jsonl \
        --out runs/big/distill-nq-dev-scored.jsonl   # self-distillation (no cross-encoder)

Kinds (all fine-tuned from the MiniLM backbone):

- ``passage``: ``[CLS] question [SEP] passage [SEP]``, score from ``[CLS]``; listwise softmax
  cross-entropy over the question's k+1 passages (positive first).
- ``marked``: the passage with the target sentence wrapped in ``$ … $``; score from
  ``[CLS]``; binary cross-entropy (the answer sentence positive, the passage's other
  sentences negative). One forward pass per sentence.
- ``one-pass``: ``[CLS] question [SEP] [unused3] s1 [unused3] s2 … [SEP]``; every sentence
  is scored at its marker (binary cross-entropy, as ``marked``) and the passage at
  ``[CLS]`` (listwise, as ``passage``) — CE and CE' in one model and one forward pass per
  passage.

A teacher folder holds the Hugging Face backbone, ``heads.safetensors`` and
``teacher.json`` (kind, max length).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from agrame.backbones import default_model_path

from agrame.training import precision as compute

KINDS = ("passage", "marked", "one-pass")
SENTENCE_MARKER = "[unused3]"  # DESIGN.md's proposition/sentence marker slot


class CrossEncoder(nn.Module):
    def __init__(self, kind: str, model_path: Optional[str] = None, max_length: int = 256,
                 listwise_sentences: bool = False):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown teacher kind {kind!r}; choose one of {', '.join(KINDS)}")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        path = str(model_path or default_model_path())
        self.kind, self.max_length = kind, max_length
        # Also a softmax cross-entropy over the gold paragraph's sentences (answer vs its
        # siblings): BCE alone taught the one-pass head little more than "early sentences
        # first" in 400 CPU steps (sentence P@1 34.7 on SQuAD dev), see training notes.
        self.listwise_sentences = listwise_sentences
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.backbone = AutoModel.from_pretrained(path, add_pooling_layer=False)
        hidden = self.backbone.config.hidden_size
        self.passage_head = nn.Linear(hidden, 1)
        self.sentence_head = nn.Linear(hidden, 1)
        self.marker_id = self.tokenizer.convert_tokens_to_ids(SENTENCE_MARKER)

    # -- inputs --------------------------------------------------------------------
    def _one_pass_ids(self, question: str, text: str, sentences: Sequence[Sequence[int]]) -> Tuple[List[int], List[int]]:
        """Token ids and the position of each sentence's marker (−1: cut off by max_length)."""
        tok = self.tokenizer
        q = tok(question, add_special_tokens=False)["input_ids"][:64]
        ids = [tok.cls_token_id] + q + [tok.sep_token_id]
        pieces = tok([text[s:e] for s, e in sentences], add_special_tokens=False)["input_ids"] if sentences else []
        where = []
        for piece in pieces:
            if len(ids) + 2 > self.max_length - 1:
                where.append(-1)
                continue
            where.append(len(ids))
            ids += [self.marker_id] + piece[: self.max_length - 1 - len(ids) - 1]
        ids = ids[: self.max_length - 1] + [tok.sep_token_id]
        return ids, where

    def _pair_ids(self, question: str, text: str) -> List[int]:
        enc = self.tokenizer(question, text, truncation="only_second", max_length=self.max_length)
        return enc["input_ids"]

    @staticmethod
    def marked_text(text: str, span: Sequence[int]) -> str:
        s, e = span
        return f"{text[:s]}$ {text[s:e]} ${text[e:]}"

    def _run(self, rows: List[List[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        return self.backbone(input_ids=ids, attention_mask=mask).last_hidden_state

    # -- scoring -------------------------------------------------------------------
    def passage_logits(self, question: str, passages: Sequence[dict]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Passage logits ``[P]`` and, for ``one-pass``, sentence logits per passage (else empty)."""
        if self.kind == "one-pass":
            built = [self._one_pass_ids(question, p["text"], p["sentences"]) for p in passages]
            hidden = self._run([ids for ids, _ in built])
            scores = self.passage_head(hidden[:, 0]).squeeze(-1)
            sentence = []
            for b, (_, where) in enumerate(built):
                pos = torch.tensor([max(w, 0) for w in where], dtype=torch.long)
                logits = self.sentence_head(hidden[b, pos]).squeeze(-1) if len(where) else torch.zeros(0)
                cut = torch.tensor([w < 0 for w in where], dtype=torch.bool)
                sentence.append(logits.masked_fill(cut, -1e4))  # a cut-off sentence is never the answer
            return scores, sentence
        if self.kind != "passage":
            raise ValueError("a marked CE' scores sentences, not passages")
        hidden = self._run([self._pair_ids(question, p["text"]) for p in passages])
        return self.passage_head(hidden[:, 0]).squeeze(-1), []

    def sentence_logits(self, question: str, passage: dict) -> torch.Tensor:
        """Logits of every sentence of one passage."""
        if self.kind == "one-pass":
            return self.passage_logits(question, [passage])[1][0]
        if self.kind != "marked":
            raise ValueError("a passage CE does not score sentences")
        rows = [self._pair_ids(question, self.marked_text(passage["text"], s)) for s in passage["sentences"]]
        hidden = self._run(rows)
        return self.sentence_head(hidden[:, 0]).squeeze(-1)

    # -- training ------------------------------------------------------------------
    def loss(self, batch: Sequence[dict]) -> torch.Tensor:
        bce = nn.functional.binary_cross_entropy_with_logits
        total = torch.zeros(())
        for record in batch:
            passages = record["passages"]
            if self.kind == "marked":
                positive = passages[0]
                labels = torch.zeros(len(positive["sentences"]))
                labels[positive["answer_sentences"]] = 1.0
                logits = self.sentence_logits(record["question"], positive)
                total = total + bce(logits, labels) + self._listwise(logits, positive["answer_sentences"])
                continue
            scores, sentence = self.passage_logits(record["question"], passages)
            total = total + nn.functional.cross_entropy(scores.unsqueeze(0), torch.zeros(1, dtype=torch.long))
            if self.kind == "one-pass":
                logits = torch.cat(sentence)
                labels = torch.cat([torch.zeros(len(p["sentences"])) for p in passages])
                labels[passages[0]["answer_sentences"]] = 1.0  # the positive passage comes first
                # An answer sentence cut off by max_length has a constant −1e4 logit: it adds a
                # large constant to the logged loss (rare spikes in train.log) but no gradient.
                total = total + bce(logits, labels) + self._listwise(sentence[0], passages[0]["answer_sentences"])
        return total / len(batch)

    def _listwise(self, logits: torch.Tensor, answers: Sequence[int]) -> torch.Tensor:
        """−log Σ_{a ∈ answers} softmax(logits)_a over one paragraph's sentences (0 when off or no answer)."""
        if not self.listwise_sentences or not answers:
            return torch.zeros(())
        return -torch.logsumexp(torch.log_softmax(logits, dim=0)[list(answers)], dim=0)

    # -- files ---------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        save_file({"passage.weight": self.passage_head.weight, "passage.bias": self.passage_head.bias,
                   "sentence.weight": self.sentence_head.weight, "sentence.bias": self.sentence_head.bias},
                  folder / "heads.safetensors")
        (folder / "teacher.json").write_text(json.dumps({"kind": self.kind, "max_length": self.max_length,
                                                         "listwise_sentences": self.listwise_sentences}))

    @classmethod
    def load(cls, folder: str | Path) -> "CrossEncoder":
        from safetensors.torch import load_file

        folder = Path(folder)
        meta = json.loads((folder / "teacher.json").read_text())
        model = cls(meta["kind"], str(folder), meta["max_length"], meta.get("listwise_sentences", False))
        heads = load_file(folder / "heads.safetensors")
        model.passage_head.load_state_dict({"weight": heads["passage.weight"], "bias": heads["passage.bias"]})
        model.sentence_head.load_state_dict({"weight": heads["sentence.weight"], "bias": heads["sentence.bias"]})
        return model.eval()


# -- evaluation on SQuAD dev ------------------------------------------------------

def evaluate(model: Optional[CrossEncoder], limit: int, seed: int, depth: int, student: Optional[str] = None) -> dict:
    """Passage P@1 among the BM25 top-``depth`` pool candidates (gold forced in when BM25 missed
    it, so P@1 measures the re-ranker), and sentence P@1 within the gold paragraph.

    ``model=None`` evaluates the multi-vector student (``student`` folder or the default) alike.
    """
    from agrame.ranker import Ranker
    from agrame.datasets import load_pool, load_questions, sample
    from benchmarks.bm25 import PoolBM25
    from benchmarks.encodings import cache_root
    from agrame.spans import split_sentences

    pool = load_pool()
    questions = sample(load_questions("squad-dev", pool), limit, seed)
    bm25 = PoolBM25(pool.texts, cache_root())
    docs, _ = bm25.retrieve([q.text for q in questions], k=depth)
    ranker = Ranker(student) if model is None else None
    psg_hits, sent_hits, t_psg, t_sent = [], [], 0.0, 0.0
    with torch.inference_mode():
        for q, ranked in zip(questions, docs):
            cands = [int(d) for d in ranked.tolist()]
            if q.gold_passage not in cands:
                cands[-1] = q.gold_passage
            passages = [{"text": pool.texts[c], "sentences": split_sentences(pool.texts[c])} for c in cands]
            gold = passages[cands.index(q.gold_passage)]
            answer_sentence = [i for i, (s, e) in enumerate(gold["sentences"]) if s <= q.answer_start < e]
            t0 = time.perf_counter()
            if model is None:
                top = ranker.rank(q.text, [(str(i), p["text"]) for i, p in enumerate(passages)], "passage", top_k=1)
                best_p = int(top[0].passage_id)
            elif model.kind == "marked":
                best_p = None
            else:
                best_p = int(torch.argmax(model.passage_logits(q.text, passages)[0]))
            t1 = time.perf_counter()
            if model is None:
                top = ranker.rank(q.text, [("g", gold["text"])], "sentence", top_k=1)
                best_s = next(i for i, (s, e) in enumerate(gold["sentences"]) if s == top[0].start)
            elif model.kind == "passage":
                best_s = None
            else:
                best_s = int(torch.argmax(model.sentence_logits(q.text, gold)))
            t2 = time.perf_counter()
            if best_p is not None:
                psg_hits.append(float(cands[best_p] == q.gold_passage))
                t_psg += t1 - t0
            if best_s is not None:
                sent_hits.append(float(best_s in answer_sentence))
                t_sent += t2 - t1
    out = {"questions": len(questions), "depth": depth}
    if psg_hits:
        out["passage_p1"] = round(100 * sum(psg_hits) / len(psg_hits), 1)
        out["ms_per_query_passages"] = round(1000 * t_psg / len(psg_hits), 1)
    if sent_hits:
        out["sentence_p1_gold_paragraph"] = round(100 * sum(sent_hits) / len(sent_hits), 1)
        out["ms_per_query_sentences"] = round(1000 * t_sent / len(sent_hits), 1)
    return out


def multivector_scored(model: str, records: Sequence[dict], device: str = "cpu", records_per_batch: int = 16,
                       precision: str = "auto"):
    """Each record with ``teacher`` (passage MaxSim) and ``teacher_sentences`` (each sentence's
    MaxSim with the sentence query) from ``model``, as ``agrame rank`` scores them. The raw sums
    are the logits: a student that starts from this model then starts at zero passage loss.
    ``records_per_batch`` records' passages and questions are encoded together (see
    ``choose_mix.batch_record_scores``)."""
    from tqdm import tqdm

    from agrame.ranker import Ranker

    from agrame.training.choose_mix import batch_record_scores, load_model

    encoder = load_model(model).to(device)
    compute.apply(encoder, device, precision)  # bf16 autocast on a GPU (the scores still sum float32 vectors)
    ranker = Ranker(encoder)
    records = list(records)
    with torch.inference_mode(), tqdm(total=len(records), desc=f"{model} scores", disable=None) as bar:
        for lo in range(0, len(records), records_per_batch):
            chunk = records[lo:lo + records_per_batch]
            for r, (passage, sentence, _) in zip(chunk, batch_record_scores(ranker, chunk)):
                # A sentence with no scored token has no score: 0, and the student masks it anyway.
                sentence = torch.nan_to_num(sentence, nan=0.0, posinf=0.0, neginf=0.0)
                first = 0
                for p, score in zip(r["passages"], passage.tolist()):
                    n = len(p["sentences"])
                    p["teacher"] = round(score, 4)
                    p["teacher_sentences"] = [round(x, 4) for x in sentence[first:first + n].tolist()]
                    first += n
                if first != len(sentence):
                    raise ValueError(f"record {r.get('qid')}: {len(sentence)} sentence scores for {first} sentences")
                yield r
            bar.update(len(chunk))


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .data import read
    from agrame.training.loop import LoopSettings, train

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="fine-tune a teacher (resumable)")
    t.add_argument("--kind", choices=KINDS, required=True)
    t.add_argument("--data", required=True, help="JSONL from python -m training.data")
    t.add_argument("--out", required=True, help="run folder (checkpoints, train.log, final/)")
    t.add_argument("--max-length", type=int, default=256)
    t.add_argument("--steps", type=int, default=400)
    t.add_argument("--batch-size", type=int, default=4, help="questions per step")
    t.add_argument("--lr", type=float, default=3e-5)
    t.add_argument("--minutes", type=float, default=None, help="stop (resumably) after this much time")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--init", default=None, help="continue from this teacher folder (e.g. a second stage)")
    t.add_argument("--listwise-sentences", action="store_true",
                   help="add a softmax cross-entropy over the gold paragraph's sentences (one-pass and marked)")
    sc = sub.add_parser("score", help="teacher scores for every passage and sentence of a training file")
    sc.add_argument("--model", required=True, help="teacher folder (one-pass: passages and sentences together)")
    sc.add_argument("--sentence-model", default=None, help="another teacher for sentences (e.g. a marked CE')")
    sc.add_argument("--data", required=True)
    sc.add_argument("--out", required=True)
    sc.add_argument("--limit", type=int, default=None)
    lab = sub.add_parser("labels", help="the gold labels as a teacher: a logit of --strength for the gold "
                                        "paragraph and its answer sentences, 0 elsewhere")
    lab.add_argument("--data", required=True)
    lab.add_argument("--out", required=True)
    lab.add_argument("--strength", type=float, default=5.0, help="gold logit (5: p(gold) ≈ 0.98 among 4 passages)")
    lab.add_argument("--limit", type=int, default=None)
    mv = sub.add_parser("multivector", help="a multi-vector model's own MaxSim scores as the teacher (self-"
                                            "distillation, e.g. zero-shot MiniLM on questions outside SQuAD)")
    mv.add_argument("--model", default="zero-shot", help="model name or folder (default: zero-shot MiniLM)")
    mv.add_argument("--data", required=True)
    mv.add_argument("--out", required=True)
    mv.add_argument("--limit", type=int, default=None)
    mv.add_argument("--device", default="cpu", help="torch device of the model (e.g. cuda)")
    mv.add_argument("--precision", choices=compute.CHOICES, default="auto",
                    help="auto: bfloat16 autocast and TF32 on CUDA, float32 elsewhere (training.precision)")
    e = sub.add_parser("evaluate", help="accuracy on SQuAD dev (passage P@1 among BM25 candidates, sentence P@1)")
    e.add_argument("--model", default=None, help="teacher folder; omit with --student to evaluate a multi-vector model")
    e.add_argument("--student", action="store_true", help="evaluate the multi-vector model (default or --student-model)")
    e.add_argument("--student-model", default=None)
    e.add_argument("--limit", type=int, default=300)
    e.add_argument("--depth", type=int, default=10)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/teachers-<name>.json)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.command == "train":
        examples = read(args.data)
        if args.init:
            model = CrossEncoder.load(args.init)
            if model.kind != args.kind:
                raise SystemExit(f"error: --init is a {model.kind} teacher, not {args.kind}")
            model.listwise_sentences = args.listwise_sentences
        else:
            model = CrossEncoder(args.kind, max_length=args.max_length, listwise_sentences=args.listwise_sentences)
        settings = LoopSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                                minutes=args.minutes, checkpoint_every=25)
        print(train(model, examples, model.loss, settings, args.out, save=model.save))
        return
    if args.command == "labels":
        from .data import write_jsonl

        def labelled():
            for r in read(args.data)[: args.limit]:
                for p in r["passages"]:
                    p["teacher"] = args.strength if p["positive"] else 0.0
                    p["teacher_sentences"] = [args.strength if j in p["answer_sentences"] else 0.0
                                              for j in range(len(p["sentences"]))]
                yield r

        print(f"wrote {write_jsonl(labelled(), args.out)} records to {args.out}")
        return
    if args.command == "multivector":
        from .data import write_jsonl

        records = read(args.data)[: args.limit]
        written = write_jsonl(multivector_scored(args.model, records, args.device, precision=args.precision), args.out)
        print(f"wrote {written} records to {args.out}")
        return
    if args.command == "score":
        from .data import write_jsonl
        from tqdm import tqdm

        teacher = CrossEncoder.load(args.model)
        sentence_teacher = CrossEncoder.load(args.sentence_model) if args.sentence_model else teacher
        records = read(args.data)[: args.limit]

        def scored():
            with torch.inference_mode():
                for r in tqdm(records, desc="teacher scores", disable=None):
                    psg, sents = teacher.passage_logits(r["question"], r["passages"])
                    if sentence_teacher is not teacher:
                        sents = [sentence_teacher.sentence_logits(r["question"], p) for p in r["passages"]]
                    for p, score, s in zip(r["passages"], psg.tolist(), sents):
                        p["teacher"] = round(score, 4)
                        p["teacher_sentences"] = [round(x, 4) for x in s.tolist()]
                    yield r

        print(f"wrote {write_jsonl(scored(), args.out)} records to {args.out}")
        return
    from benchmarks.common import command_line, write_result

    model = None if args.student else CrossEncoder.load(args.model)
    def folder_name(path: str) -> str:
        return Path(path).parent.name if Path(path).name == "final" else Path(path).name

    if args.student:
        name = "student" + (f"-{folder_name(args.student_model)}" if args.student_model else "")
    else:
        name = folder_name(args.model)
    result = {"benchmark": "teachers", "dataset": "squad-dev",
              "model": (args.student_model or "default") if args.student else args.model,
              "kind": "multi-vector student" if args.student else model.kind,
              "sample": {"questions": args.limit, "seed": args.seed, "depth": args.depth},
              **evaluate(model, args.limit, args.seed, args.depth, args.student_model)}
    path = write_result(f"teachers-{name}", result, args.out, command_line("training.teachers", argv))
    print(json.dumps(result), f"→ {path}")


if __name__ == "__main__":
    main()

"""The scaled training set: every SQuAD train question, negatives mined with a model, SciFact train.

    python -m training.mined squad --out runs/big/squad.jsonl --heldout runs/big/squad-heldout.jsonl \\
        --negatives 7 --mined 4 --mine-model zero-shot-128 --index runs/big/train-index
    python -m training.mined scifact --out runs/big/scifact.jsonl --heldout runs/big/scifact-heldout.jsonl

Records have :mod:`training.data`'s format (gold paragraph first, then ``--negatives``
negatives), so ``python -m training.teachers labels`` and the student read them unchanged.

- **Questions**: all of them (87,599 in SQuAD v1.1 train), not one per paragraph. Whole
  *articles* are held out (``--heldout-share`` of them, seeded): held-out questions never
  share a paragraph, or an article, with training ones, so choices made on them (steps,
  interpolation, α) are not flattered by paragraphs the model was trained on.
- **Negatives**: ``--mined`` of them are the model's own top-ranked train paragraphs — a
  search of an AGRaME index of all train paragraphs (built once at ``--index``), i.e. what
  the model confuses today — and the rest BM25's; in both, the gold paragraph and any
  paragraph containing the normalised answer are skipped (likely false negatives).
- **Guard sets** (``python -m training.mined guard --topics nq-dev|trivia-dev``): questions of
  DPR's NQ and TriviaQA *development* splits (carved from those datasets' training data; no
  benchmark here reports them) over SQuAD train paragraphs and the Wikipedia leads (no
  reported split's text); the positive is BM25's first passage holding an answer, the
  negatives BM25's top passages holding none, the answer sentences those holding an answer.
  Neither source is in the training mix, so ``training.choose_mix --guard`` can refuse a
  mix that forgets what zero-shot knew outside SQuAD and SciFact.
- **Distillation questions** (``python -m training.mined distill --topics nq-dev --exclude
  guard-nq-dev.jsonl``): the rest of those DPR questions, unlabelled, each with BM25's top 1 + k
  passages of the same corpus; ``training.teachers multivector --model zero-shot`` scores them,
  so that the student keeps zero-shot's ranking of non-SQuAD questions (the issue's third guard
  against forgetting). Answer-matched labels are no teacher here: on the guard set most
  "positives" merely contain the answer string. ``--topics wiki-claims``: statements instead of
  questions, one sentence of each Wikipedia lead, its own lead left out of the candidates.
- **SciFact train** (claims with rationales): the first cited abstract with rationales is
  the positive, its rationale sentences the "answer sentences"; negatives are BM25's top
  abstracts with no rationale for the claim. Sentences are the dataset's own. Claims are held
  out, not abstracts, and half the held-out claims cite an abstract that a training claim
  cites too: ``python -m training.mined unseen`` keeps the held-out claims whose gold abstract
  no training record has as its positive, so a choice is not flattered by rationale sentences
  the model was trained on.

Writing is resumable: records go to ``<out>.partial`` in a fixed order and a rerun skips the
ones already there; the file is renamed to ``--out`` when complete.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from tqdm import tqdm

from agrame.spans import split_sentences

from agrame.training import precision as compute
from .data import answer_sentences


def heldout_articles(n_articles: int, share: float, seed: int) -> set:
    k = max(1, round(share * n_articles)) if share > 0 else 0
    return set(random.Random(seed).sample(range(n_articles), k))


def squad_questions(seed: int, heldout_share: float) -> Tuple[List[tuple], List[tuple], List[dict]]:
    """(train, held-out) lists of ``(paragraph index, qa)`` in a seeded order, and the paragraphs."""
    from agrame.datasets import squad_paragraphs

    paragraphs = squad_paragraphs("train")
    held = heldout_articles(1 + max(p["article"] for p in paragraphs), heldout_share, seed)
    train, heldout = [], []
    for i, p in enumerate(paragraphs):
        for qa in p["qas"]:
            (heldout if p["article"] in held else train).append((i, qa))
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(heldout)
    return train, heldout, paragraphs


class Miner:
    """Top train paragraphs of a question by the model (AGRaME index search) and by BM25."""

    def __init__(self, texts: Sequence[str], model: Optional[str], index_path: Optional[Path], depth: int = 30,
                 ranking: Optional[Dict[str, List[int]]] = None):
        from benchmarks.bm25 import PoolBM25

        self.texts = texts
        self.depth = depth
        self.bm25 = PoolBM25(texts)
        self.index = None
        #: question id → the model's ranking made elsewhere (``exact-rank`` on a GPU: --ranking)
        self.ranking = ranking
        if model is not None:
            from agrame.loading import load_encoder
            from agrame.index import Index, build_index

            encoder = load_encoder(None if model == "default" else model)
            if index_path is None:
                raise SystemExit("error: --mine-model needs --index (the folder of the train-paragraph index)")
            if not (index_path / "manifest.json").exists():
                build_index(encoder, [(f"train-{i}", t) for i, t in enumerate(texts)], index_path)
            self.index = Index(index_path, model=encoder)

    def ranked(self, questions: Sequence[str], qids: Optional[Sequence[str]] = None
               ) -> Tuple[List[List[int]], List[List[int]]]:
        """Per question: the model's ranking (empty without a model) and BM25's, as paragraph indices."""
        docs, _ = self.bm25.retrieve(list(questions), k=self.depth)
        by_bm25 = [row.tolist() for row in docs]
        by_model: List[List[int]] = [[] for _ in questions]
        if self.ranking is not None:
            by_model = [list(self.ranking.get(q, []))[: self.depth] for q in (qids or [])]
        if self.index is not None:
            for k, question in enumerate(questions):
                hits = self.index.search(question, granularity="passage", top_k=self.depth, per_hit=2)
                by_model[k] = [int(h.passage_id.split("-", 1)[1]) for h in hits]
        return by_model, by_bm25


def _number(pid: str) -> int:
    """``train-N`` → N: a SQuAD train paragraph's number."""
    return int(str(pid).rsplit("-", 1)[1])


def exact_rankings(model, records: Sequence[dict], depth: int = 30, device: str = "cpu", questions_per_batch: int = 32,
                   passages_per_chunk: int = 2048, precision: str = "auto") -> Iterator[Tuple[str, List[int]]]:
    """Each record's question ranked against every distinct passage of the records (their ``pid``
    ``train-N``) by exact MaxSim with ``model`` on ``device`` — what mining with the index search did
    on the CPU, as one scan a GPU runs in seconds: ``(qid, [N, …])``, best first (ties by position)."""
    import torch

    from agrame import scoring
    from agrame.ranker import Ranker

    texts: Dict[int, str] = {}
    for r in records:
        for p in r["passages"]:
            texts.setdefault(_number(p["pid"]), p["text"])
    pids = sorted(texts)
    ranker = Ranker(model.to(device))
    compute.apply(model, device, precision)  # bf16 autocast encoding and TF32 on a GPU
    with torch.inference_mode():
        encoded = model.encode_passages([texts[i] for i in pids], batch_size=64)
        width = max(len(e.vectors) for e in encoded)
        dim = encoded[0].vectors.shape[-1]
        # float16 on a GPU: half the memory (~25k paragraphs × their tokens) and twice the matmul speed
        dtype = torch.float16 if str(device).startswith("cuda") else encoded[0].vectors.dtype
        vectors = torch.zeros(len(pids), width, dim, device=device, dtype=dtype)
        mask = torch.zeros(len(pids), width, dtype=torch.bool, device=device)
        for k, e in enumerate(encoded):
            vectors[k, :len(e.vectors)] = e.vectors.to(device)
            mask[k, :len(e.vectors)] = True
        del encoded
        for lo in range(0, len(records), questions_per_batch):
            part = records[lo:lo + questions_per_batch]
            # one forward pass for the batch's questions (it was one per question)
            qs = [q for q, _ in ranker.encode_query_batch([r["question"] for r in part], "passage", len(part))]
            q = torch.zeros(len(qs), max(len(x) for x in qs), dim, device=device, dtype=vectors.dtype)
            q_mask = torch.zeros(q.shape[:2], dtype=torch.bool, device=device)
            for k, x in enumerate(qs):
                q[k, :len(x)] = x.to(device=device, dtype=vectors.dtype)
                q_mask[k, :len(x)] = True
            scores = scoring.padded_maxsim(q, q_mask, vectors, mask, passages_per_chunk)
            order = torch.sort(scores.float(), dim=1, descending=True, stable=True).indices[:, :depth].cpu()
            for r, row in zip(part, order.tolist()):
                yield r["qid"], [pids[i] for i in row]


def choose_negatives(gold: int, answer: str, by_model: Sequence[int], by_bm25: Sequence[int], texts: Sequence[str],
                     negatives: int, mined: int) -> Optional[List[int]]:
    """``mined`` clean negatives from the model's ranking, the rest from BM25's (no repeats);
    None when there are too few clean ones (the question is skipped rather than padded)."""
    from agrame.datasets import has_answer

    chosen: List[int] = []

    def take(ranking: Sequence[int], limit: int) -> None:
        for d in ranking:
            if len(chosen) >= limit:
                return
            if d == gold or d in chosen or has_answer(texts[d], [answer]):
                continue
            chosen.append(d)

    take(by_model, min(mined, negatives))
    take(by_bm25, negatives)
    take(by_model, negatives)  # BM25 ran short: more of the model's
    return chosen if len(chosen) == negatives else None


def remix_records(records: Sequence[dict], ranking: Dict[str, Sequence[int]], mined: int) -> Iterator[dict]:
    """``records`` (BM25-only negatives, as the GPU students' data) with their negatives chosen again as the
    recipe does: ``mined`` clean ones from the model's ``ranking`` (qid → paragraph numbers, best first:
    ``exact-rank``'s), the rest from the record's own negatives in their (BM25) order —
    :func:`choose_negatives` with the record's clean BM25 negatives as BM25's ranking, so a record comes
    out as ``squad_records`` would have written it with that ranking. The new negatives' texts and
    sentences are the records' own (the scan ranks only their passages); a labelled record
    (``training.teachers labels``) keeps its labels, a negative's all 0. A question missing from the
    ranking keeps its record."""
    passages: Dict[int, dict] = {}
    for r in records:
        for p in r.get("passages", ()):  # (a skipped question has none)
            passages.setdefault(_number(p["pid"]), p)
    texts = {n: p["text"] for n, p in passages.items()}
    for r in records:
        if r["qid"] not in ranking or not r.get("passages"):
            yield r
            continue
        if "answer" not in r:
            raise ValueError(f"record {r['qid']}: no answer, so its mined negatives cannot be checked for it")
        gold, own = r["passages"][0], [_number(p["pid"]) for p in r["passages"][1:]]
        chosen = choose_negatives(_number(gold["pid"]), r["answer"], [d for d in ranking[r["qid"]] if d in texts],
                                  own, texts, len(own), mined)
        if chosen is None:  # (its own negatives are clean, so only a record with an answer in them)
            yield r
            continue
        negatives = []
        for d in chosen:
            p = passages[d]
            negative = {"pid": p["pid"], "text": p["text"], "sentences": p["sentences"], "positive": False,
                        "answer_sentences": []}
            if "teacher" in gold:
                negative.update(teacher=0.0, teacher_sentences=[0.0] * len(p["sentences"]))
            negatives.append(negative)
        yield {**r, "passages": [gold] + negatives}


def read_ranking(path: Path) -> Dict[str, List[int]]:
    """``exact-rank``'s JSONL ``{qid, ranked}`` as qid → paragraph numbers."""
    ranking: Dict[str, List[int]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                ranking[row["qid"]] = row["ranked"]
    return ranking


def squad_records(items: Sequence[tuple], paragraphs: List[dict], miner: Miner, negatives: int, mined: int,
                  start: int = 0, batch: int = 256) -> Iterator[dict]:
    texts = miner.texts
    cache: Dict[int, List[List[int]]] = {}

    def sentences_of(i: int) -> List[List[int]]:
        if i not in cache:
            if len(cache) > 50_000:
                cache.clear()
            cache[i] = [list(s) for s in split_sentences(texts[i])]
        return cache[i]

    for b in range(start - start % batch, len(items), batch):
        part = items[b:b + batch]
        by_model, by_bm25 = miner.ranked([qa["question"] for _, qa in part], [qa["id"] for _, qa in part])
        for k, ((p_index, qa), m, r) in enumerate(zip(part, by_model, by_bm25)):
            if b + k < start:
                continue
            negs = choose_negatives(p_index, qa["answer"], m, r, texts, negatives, mined)
            record = {"qid": qa["id"], "question": qa["question"], "answer": qa["answer"], "source": "squad"}
            if negs is None:
                yield {**record, "skipped": True}
                continue
            start_char = qa["answer_start"]
            gold_sentences = sentences_of(p_index)
            record["passages"] = [
                {"pid": f"train-{p_index}", "text": texts[p_index], "sentences": gold_sentences, "positive": True,
                 "answer_sentences": answer_sentences(gold_sentences, start_char, start_char + len(qa["answer"]))}]
            record["passages"] += [{"pid": f"train-{d}", "text": texts[d], "sentences": sentences_of(d),
                                    "positive": False, "answer_sentences": []} for d in negs]
            yield record


def scifact_records(claims: Sequence[dict], negatives: int, depth: int = 50) -> Iterator[dict]:
    from benchmarks.bm25 import PoolBM25
    from benchmarks.cross_domain import load_scifact

    doc_ids, texts, spans, index_maps = load_scifact()
    position = {d: k for k, d in enumerate(doc_ids)}
    bm25 = PoolBM25(texts)
    docs, _ = bm25.retrieve([c["claim"] for c in claims], k=depth)
    for claim, ranked in zip(claims, docs):
        evidence = {position[int(d)]: sets for d, sets in claim["evidence"].items() if int(d) in position}
        if not evidence:
            continue
        gold = min(evidence)  # deterministic: the lowest corpus position among the rationale abstracts
        gold_sentences = sorted({index_maps[gold][s] for rs in evidence[gold] for s in rs["sentences"]
                                 if s in index_maps[gold]})
        negs = [d for d in ranked.tolist() if d not in evidence][:negatives]
        if not gold_sentences or len(negs) < negatives:
            continue
        passages = [{"pid": f"scifact-{doc_ids[gold]}", "text": texts[gold], "sentences": [list(s) for s in spans[gold]],
                     "positive": True, "answer_sentences": gold_sentences}]
        passages += [{"pid": f"scifact-{doc_ids[d]}", "text": texts[d], "sentences": [list(s) for s in spans[d]],
                      "positive": False, "answer_sentences": []} for d in negs]
        yield {"qid": f"scifact-{claim['id']}", "question": claim["claim"], "answer": "", "source": "scifact",
               "passages": passages}


GUARD_TOPICS = ("nq-dev", "trivia-dev")


def bm25_ranked(questions: Sequence[Tuple[str, str, List[str]]], texts: Sequence[str], depth: int,
                batch: int = 256) -> Iterator[Tuple[Tuple[str, str, List[str]], List[int]]]:
    """Each (qid, question, answers) with BM25's top ``depth`` indices into ``texts``; retrieved
    ``batch`` questions at a time and only as far as the caller reads."""
    from benchmarks.bm25 import PoolBM25

    bm25 = PoolBM25(texts)
    for b in range(0, len(questions), batch):
        part = questions[b:b + batch]
        docs, _ = bm25.retrieve([q for _, q, _ in part], k=min(depth, len(texts)))
        for item, row in zip(part, docs):
            yield item, row.tolist()


def _guard_passage(texts: Sequence[str], d: int) -> dict:
    return {"pid": f"guard-{d}", "text": texts[d], "sentences": [list(sp) for sp in split_sentences(texts[d])]}


def guard_records(questions: Sequence[Tuple[str, str, List[str]]], texts: Sequence[str], negatives: int,
                  limit: int, depth: int = 50, batch: int = 256) -> Iterator[dict]:
    """Up to ``limit`` records of (qid, question, answers) with an answer-holding BM25 passage."""
    from agrame.datasets import has_answer

    written = 0
    for (qid, question, answers), ranked in bm25_ranked(questions, texts, depth, batch):
        holds = [has_answer(texts[d], answers) for d in ranked]
        gold = next((d for d, h in zip(ranked, holds) if h), None)
        negs = [d for d, h in zip(ranked, holds) if not h][:negatives]
        if gold is None or len(negs) < negatives:
            continue
        positive = _guard_passage(texts, gold)
        answer_sents = [k for k, (s, e) in enumerate(positive["sentences"]) if has_answer(texts[gold][s:e], answers)]
        if not answer_sents:  # the answer straddles a sentence boundary
            continue
        passages = [dict(positive, positive=True, answer_sentences=answer_sents)]
        passages += [dict(_guard_passage(texts, d), positive=False, answer_sentences=[]) for d in negs]
        yield {"qid": qid, "question": question, "answer": answers[0], "source": "guard", "passages": passages}
        written += 1
        if written >= limit:
            return


def distill_records(questions: Sequence[Tuple[str, str, List[str]]], texts: Sequence[str], passages: int,
                    limit: int, batch: int = 256, own: Optional[Dict[str, int]] = None) -> Iterator[dict]:
    """Up to ``limit`` unlabelled records: each question with BM25's top ``passages`` texts (for a
    teacher that scores them all, ``training.teachers multivector``; no answer is consulted).
    ``own``: qid → the index of the text a query was taken from, left out of its candidates."""
    own = own or {}
    written = 0
    # one more when a query's own text may be among BM25's top ones (it is then dropped)
    for (qid, question, _), ranked in bm25_ranked(questions, texts, passages + bool(own), batch):
        if written >= limit:
            return
        ranked = [d for d in ranked if d != own.get(qid)][:passages]
        if len(ranked) < passages:
            continue
        yield {"qid": qid, "question": question, "source": "distill",
               "passages": [_guard_passage(texts, d) for d in ranked]}
        written += 1


CLAIM_TOPICS = "wiki-claims"  # declarative queries: one sentence of each Wikipedia lead


def lead_claims(leads: Sequence[str], seed: int, offset: int,
                min_words: int = 8) -> Tuple[List[Tuple[str, str, List[str]]], Dict[str, int]]:
    """One sentence of at least ``min_words`` words from each lead, as a query (qid
    ``wiki-claims-<line>``), shuffled by ``seed``; and qid → its lead's index in a corpus where the
    leads start at ``offset`` (``guard_corpus``), so that its own lead is no candidate.

    Why: the dev sets the question-trained student loses on out of domain (atomic facts, citation)
    query with statements, not questions; zero-shot's scores for statements are kept this way."""
    rng = random.Random(seed)
    claims, own = [], {}
    for i, text in enumerate(leads):
        long = [text[a:b] for a, b in split_sentences(text) if len(text[a:b].split()) >= min_words]
        if long:
            qid = f"{CLAIM_TOPICS}-{i}"
            claims.append((qid, rng.choice(long), []))
            own[qid] = offset + i
    rng.shuffle(claims)
    return claims, own


def dpr_questions(topics: str, seed: int) -> List[Tuple[str, str, List[str]]]:
    """(qid, question, answers) of a DPR topic file, shuffled by ``seed`` (qid: topics-line)."""
    from agrame.datasets import data_dir

    with open(data_dir() / "dpr-topics" / f"{topics}.jsonl", encoding="utf-8") as f:
        questions = [(f"{topics}-{i}", r["question"], list(r["answers"])) for i, r in enumerate(map(json.loads, f))]
    random.Random(seed).shuffle(questions)
    return questions


def guard_corpus() -> List[str]:
    """SQuAD train paragraphs and the Wikipedia leads: Wikipedia text of no reported split."""
    from agrame.datasets import squad_paragraphs

    return [p["context"] for p in squad_paragraphs("train")] + wiki_leads()


def wiki_leads() -> List[str]:
    """The Wikipedia lead paragraphs (../shared/data/wiki-leads), in file order."""
    from agrame.datasets import data_dir

    with open(data_dir() / "wiki-leads" / "leads.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def unseen(heldout: Iterable[dict], train: Iterable[dict]) -> List[dict]:
    """Held-out records whose positive passage is no training record's positive."""
    seen = {r["passages"][0]["pid"] for r in train}
    return [r for r in heldout if r["passages"][0]["pid"] not in seen]


def write_resumable(records_from, total: int, out: Path, desc: str) -> int:
    """Append records to ``<out>.partial`` (a rerun continues after the last complete line), then rename.

    ``records_from(start)`` yields the records from position ``start``; skipped questions are
    counted as positions but not written, so positions are tracked in a side file.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    done_file = out.with_name(out.name + ".partial.done")  # "<position> <bytes>" of the last flush
    start, size = 0, 0
    if partial.exists() and done_file.exists():
        start, size = (int(x) for x in done_file.read_text().split())
    with open(partial, "ab") as f:
        f.truncate(size)  # lines written after the last recorded flush are written again
    written = sum(1 for _ in open(partial, "rb"))
    bar = tqdm(total=total, initial=start, desc=desc, disable=None)
    with open(partial, "a", encoding="utf-8") as f:
        position = start
        for record in records_from(start):
            if not record.pop("skipped", False):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
            position += 1
            bar.update(1)
            if position % 256 == 0:
                f.flush()
                done_file.write_text(f"{position} {f.tell()}")
    bar.close()
    partial.replace(out)
    done_file.unlink(missing_ok=True)
    return written


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="source", required=True)
    sq = sub.add_parser("squad", help="all SQuAD v1.1 train questions")
    sq.add_argument("--mined", type=int, default=4, help="negatives from the model's ranking (the rest: BM25)")
    sq.add_argument("--mine-model", default="zero-shot-128",
                    help="model whose ranking gives the mined negatives (a name such as zero-shot-128 — where "
                         "training starts —, 'default', or a folder; 'none': BM25 only)")
    sq.add_argument("--index", type=Path, default=None, help="index of the train paragraphs (built if missing)")
    sq.add_argument("--ranking", type=Path, default=None,
                    help="the model's rankings made elsewhere instead of an index search: JSONL {qid, ranked} of "
                         "exact-rank (on a GPU: training.bundle's run)")
    er = sub.add_parser("exact-rank", help="rank every record's question against all the records' passages by exact "
                                           "MaxSim (the mining scan, for a GPU)")
    er.add_argument("--model", default="zero-shot-128")
    er.add_argument("--records", type=Path, required=True, help="SQuAD records (training.mined squad's)")
    er.add_argument("--out", type=Path, required=True)
    er.add_argument("--depth", type=int, default=30)
    er.add_argument("--device", default="cpu")
    er.add_argument("--precision", choices=compute.CHOICES, default="auto",
                    help="auto: bfloat16 autocast and TF32 on CUDA, float32 elsewhere (training.precision)")
    sq.add_argument("--heldout-questions", type=int, default=2000, help="held-out questions written (of the held-out articles)")
    sf = sub.add_parser("scifact", help="SciFact train claims with rationales")
    gd = sub.add_parser("guard", help="held-out questions from outside the training mix (DPR NQ / TriviaQA dev)")
    gd.add_argument("--topics", choices=GUARD_TOPICS, required=True)
    gd.add_argument("--out", type=Path, required=True)
    gd.add_argument("--limit", type=int, default=500, help="records written")
    gd.add_argument("--negatives", type=int, default=7)
    gd.add_argument("--seed", type=int, default=0)
    gd.add_argument("--exclude", type=Path, action="append", default=[],
                    help="records whose questions (qid) must not be used, e.g. the distill files (repeatable)")
    ds = sub.add_parser("distill", help="unlabelled DPR NQ / TriviaQA dev questions (the guard sets' excluded), or "
                                        "sentences of the Wikipedia leads as statements (wiki-claims), with BM25 "
                                        "passages, for a self-distillation teacher")
    ds.add_argument("--topics", choices=(*GUARD_TOPICS, CLAIM_TOPICS), required=True)
    ds.add_argument("--exclude", type=Path, action="append", default=[],
                    help="records whose questions (qid) must not be used, e.g. the guard set (repeatable)")
    ds.add_argument("--out", type=Path, required=True)
    ds.add_argument("--limit", type=int, default=2000, help="records written")
    ds.add_argument("--negatives", type=int, default=7, help="passages per question: 1 + this (as the other sources)")
    ds.add_argument("--seed", type=int, default=0, help="shuffle of the questions")
    un = sub.add_parser("unseen", help="held-out records whose gold passage no training record has as positive")
    un.add_argument("--heldout", type=Path, required=True)
    un.add_argument("--train", type=Path, required=True)
    un.add_argument("--out", type=Path, required=True)
    for p in (sq, sf):
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--heldout", type=Path, required=True, help="held-out records (articles / claims) for choosing")
        p.add_argument("--heldout-share", type=float, default=0.05 if p is sq else 0.2)
        p.add_argument("--negatives", type=int, default=7, help="k negatives per question")
        p.add_argument("--limit", type=int, default=None, help="only the first N training questions")
        p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    def excluded() -> set:
        from .data import read
        for path in args.exclude:
            if not path.is_file():
                parser.error(f"--exclude {path}: no such file")
        return {r["qid"] for path in args.exclude for r in read(path)}

    if args.source == "guard":
        from .data import write_jsonl
        skip = excluded()
        questions = [q for q in dpr_questions(args.topics, args.seed) if q[0] not in skip]
        n = write_jsonl(guard_records(questions, guard_corpus(), args.negatives, args.limit), args.out)
        print(f"wrote {n} {args.topics} questions ({len(skip)} excluded) to {args.out}")
        return
    if args.source == "distill":
        from .data import write_jsonl
        skip = excluded()
        corpus, own = guard_corpus(), None
        if args.topics == CLAIM_TOPICS:
            leads = wiki_leads()
            questions, own = lead_claims(leads, args.seed, offset=len(corpus) - len(leads))  # the corpus ends with them
        else:
            questions = dpr_questions(args.topics, args.seed)
        questions = [q for q in questions if q[0] not in skip]
        n = write_jsonl(distill_records(questions, corpus, 1 + args.negatives, args.limit, own=own), args.out)
        print(f"wrote {n} {args.topics} questions ({len(skip)} excluded) to {args.out}")
        return
    if args.source == "unseen":
        from .data import read, write_jsonl
        for flag, path in (("--heldout", args.heldout), ("--train", args.train)):
            if not path.is_file():
                parser.error(f"{flag} {path}: no such file")
        held = read(args.heldout)
        kept = unseen(held, read(args.train))
        print(f"wrote {write_jsonl(kept, args.out)} of {len(held)} held-out records to {args.out}")
        return
    if args.source == "exact-rank":
        from agrame.loading import load_encoder

        from .data import read

        records = [r for r in read(args.records) if r.get("passages")]
        partial = Path(f"{args.out}.partial")  # renamed when whole: a call cut short leaves no ranking
        with open(partial, "w") as f:
            for qid, ranked in exact_rankings(load_encoder(args.model), records, args.depth, args.device,
                                           precision=args.precision):
                f.write(json.dumps({"qid": qid, "ranked": ranked}) + "\n")
        partial.replace(args.out)
        print(f"ranked {len(records)} questions into {args.out}")
        return
    if args.source == "squad":
        train, heldout, paragraphs = squad_questions(args.seed, args.heldout_share)
        train = train[:args.limit] if args.limit else train
        heldout = heldout[:args.heldout_questions]
        model = None if args.mine_model == "none" or args.ranking else args.mine_model
        ranking = read_ranking(args.ranking) if args.ranking else None
        miner = Miner([p["context"] for p in paragraphs], model, args.index, ranking=ranking)
        for items, out in ((heldout, args.heldout), (train, args.out)):
            if out.exists():
                print(f"{out} exists: kept")
                continue
            n = write_resumable(lambda s, items=items: squad_records(items, paragraphs, miner, args.negatives,
                                                                      args.mined, start=s),
                                len(items), out, out.name)
            print(f"wrote {n} of {len(items)} questions to {out}")
        return
    from benchmarks.cross_domain import load_claims

    claims = load_claims("train")
    random.Random(args.seed).shuffle(claims)
    n_held = round(args.heldout_share * len(claims))
    from .data import write_jsonl
    for part, out in ((claims[:n_held], args.heldout), (claims[n_held:][:args.limit] if args.limit else claims[n_held:],
                                                        args.out)):
        print(f"wrote {write_jsonl(scifact_records(part, args.negatives), out)} claims to {out}")


if __name__ == "__main__":
    main()

"""``agrame qrels``: write a benchmark's gold as TREC qrels (and its queries and corpus)."""

from __future__ import annotations

import argparse
import json
import sys

from .common import UsageError, command_parser, positive_int


def add_parser(sub) -> argparse.ArgumentParser:
    p = command_parser(sub, "qrels")
    p.add_argument("--dataset", required=True,
                   choices=("squad-dev", "nq-oracle", "nq-open", "entityquestions", "trivia", "webq"),
                   help="benchmark question set (its gold as benchmarks/README.md describes)")
    p.add_argument("--granularity", "-g", choices=("passage", "sentence"), default="sentence",
                   help="judge passages or sentences (default: sentence)")
    p.add_argument("--out", "-o", default="-", metavar="FILE", help="qrels file (default: standard output)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="a seeded sample of this many questions, as the benchmarks' --limit (default: all)")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default: 0, the benchmarks')")
    p.add_argument("--index", "-i", metavar="DIR", default=None,
                   help="take sentence spans from this index (its passage ids must be the pool's)")
    p.add_argument("--ids", choices=("source", "number"), default="source",
                   help="passage ids: the pool's source ids (squad-dev-3-5, nq-17, lead-4) or pool positions "
                        "(the ids of benchmarks.index_search's cached index) (default: source)")
    p.add_argument("--queries-out", metavar="FILE", default=None, help="also write the questions (TSV qid<TAB>text)")
    p.add_argument("--corpus-out", metavar="FILE", default=None,
                   help="also write the pooled corpus (JSONL {id, text}) to index")
    return p


def run(args) -> int:
    from agrame.datasets import load_pool, load_questions, sample
    from agrame.gold import qrels
    from agrame.runs import atomic_text_file

    pool = _dataset_step(load_pool)
    questions = sample(_dataset_step(load_questions, args.dataset, pool), args.limit, args.seed)
    table = qrels(args.dataset, questions, pool, args.granularity,
                  None if args.index is None else _index_spans(args, pool), ids=args.ids)
    with atomic_text_file(args.out) as out:
        for qid, judged in table.items():
            out.writelines(f"{qid} 0 {doc} {rel}\n" for doc, rel in judged.items())
    if args.queries_out:
        with atomic_text_file(args.queries_out) as out:
            out.writelines(f"{q.qid}\t{' '.join(q.text.split())}\n" for q in questions)
    if args.corpus_out:
        with atomic_text_file(args.corpus_out) as out:
            for i, (pid, text) in enumerate(zip(pool.ids, pool.texts)):
                out.write(json.dumps({"id": pid if args.ids == "source" else str(i), "text": text},
                                     ensure_ascii=False) + "\n")
    left = len(questions) - len(table)
    print(f"agrame qrels: {args.dataset} {args.granularity}: {sum(map(len, table.values()))} judgments for "
          f"{len(table)} of {len(questions)} questions"
          + (f" ({left} without gold {args.granularity}s, as the benchmark leaves them out)" if left else "")
          + (f" → {args.out}" if args.out != "-" else ""), file=sys.stderr)
    return 0


def _index_spans(args, pool):
    """Sentence spans of pool passages as the index ``--index`` holds them (by ``--ids``)."""
    from agrame.index.sharded import open_index

    index = open_index(args.index)
    name = (lambda p: pool.ids[p]) if args.ids == "source" else str

    def spans_of(p: int):
        try:
            return index.sentence_spans(name(p))
        except ValueError:
            raise UsageError(f"--index {args.index}: no passage {name(p)!r} of the pooled corpus (was it "
                             f"built from agrame qrels --corpus-out, with --ids {args.ids}?)") from None
    return spans_of


def _dataset_step(step, *args):
    """A data loader's missing file as a usage error naming it, not a traceback (a missing
    $AGRAME_DATA or an unknown dataset is :class:`agrame.datasets.DataError`, a usage error already)."""
    try:
        return step(*args)
    except FileNotFoundError as exc:
        raise UsageError(f"{exc.filename}: not found — set AGRAME_DATA to the datasets' folder "
                         "(../shared/data/README.md)") from None

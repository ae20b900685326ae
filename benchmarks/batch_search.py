"""Batch search throughput: ``agrame search --queries FILE --run`` against one ``agrame search``
process per query, on the pooled-corpus index (default model, 2-bit), 2 threads.

    python -m benchmarks.batch_search [--limit 2000 --calls 20 --granularity sentence]

Batch: one process, every question of a SQuAD dev sample (seed 0) written as a TSV query file,
searched to a TREC run; its wall time includes starting Python, loading the model and opening the
index, like a user's command. Per call: ``--calls`` single-query processes (the first questions of
the sample); queries per second = calls / their total wall time. The batch run's file is checked
to hold every query (and the per-call answers are compared with the batch run's for those queries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agrame.ranker import ScoredSpan
from agrame.runs import docid, read_run

from .common import command_line, sample, write_result
from .data import load_questions
from .index_search import PoolVectors, build


def _agrame(*args: str, threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, "-m", "agrame_app.cli", *args], env=env, capture_output=True,
                          text=True, check=True)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=2000, help="questions in the batch (default 2000)")
    parser.add_argument("--calls", type=int, default=20, help="single-query processes timed (default 20)")
    parser.add_argument("--granularity", default="sentence", choices=("passage", "sentence"))
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    vectors = PoolVectors(args.model)
    index, _ = build(vectors, 2)
    questions = sample(load_questions("squad-dev", vectors.pool), args.limit, args.seed)
    queries = [(f"q{i}", " ".join(q.text.split())) for i, q in enumerate(questions)]
    with tempfile.TemporaryDirectory(prefix="batch-search-") as tmp:
        qfile, run = Path(tmp) / "queries.tsv", Path(tmp) / "out.trec"
        qfile.write_text("".join(f"{qid}\t{text}\n" for qid, text in queries))
        t0 = time.perf_counter()
        _agrame("search", "-i", str(index), "--queries", str(qfile), "--run", str(run), "-g", args.granularity,
                "-k", str(args.top_k), threads=args.threads)
        batch_seconds = time.perf_counter() - t0
        batch = read_run(run)
    assert len(batch) == len(queries), "the run file lacks queries"
    per_call, agree = [], 0
    for qid, text in queries[:args.calls]:
        t0 = time.perf_counter()
        out = _agrame("search", "-i", str(index), "-g", args.granularity, "-k", str(args.top_k), "-f", "jsonl", text,
                      threads=args.threads)
        per_call.append(time.perf_counter() - t0)
        hits = [json.loads(line) for line in out.stdout.splitlines()]
        top = max(batch[qid], key=batch[qid].get)
        if hits:
            h = hits[0]
            agree += top == docid(ScoredSpan(h["passage_id"], h["start"], h["end"], h["score"], 0, 0, "",
                                             tuple(map(tuple, h["pieces"]))), args.granularity)
    batch_qps, call_qps = len(queries) / batch_seconds, len(per_call) / sum(per_call)
    result = {"benchmark": "batch_search", "what": "agrame search --queries (one process) vs one process per query",
              "index": "pooled corpus, default model, 2-bit", "model": vectors.encoder.source,
              "queries": f"{len(queries)} squad-dev questions (seed {args.seed})", "granularity": args.granularity,
              "top_k": args.top_k, "threads": args.threads,
              "batch": {"seconds": round(batch_seconds, 1), "queries_per_second": round(batch_qps, 2)},
              "per_call": {"calls": len(per_call), "seconds_median": round(sorted(per_call)[len(per_call) // 2], 2),
                           "queries_per_second": round(call_qps, 3)},
              "speedup": round(batch_qps / call_qps, 1),
              "per_call_top1_same_as_batch": f"{agree}/{len(per_call)}"}
    out = write_result(f"batch_search-{args.granularity}", result, args.out,
                       command_line("benchmarks.batch_search", argv))
    print(json.dumps(result, indent=1), "→", out)


if __name__ == "__main__":
    main()

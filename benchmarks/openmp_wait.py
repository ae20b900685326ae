"""How OpenMP's wait policy changes search latency, idle and with a second job beside it (issue 64).

    python -m benchmarks.openmp_wait --model gpu2100-agrame128 --dataset nq-oracle --limit 100 --threads 2

libgomp's threads spin after each parallel region before they sleep (``GOMP_SPINCOUNT``, 300,000
spins by default; ``OMP_WAIT_POLICY=PASSIVE`` sleeps at once). On 2 cores with another job, spinning
threads take the cores the job and this search's own next region need. ``agrame`` sets PASSIVE
before torch loads unless the environment says otherwise (``agrame/__init__.py``); this benchmark is
the measurement behind that default. Each setting runs in a child process that imports torch *before*
agrame, so the child's OpenMP runtime reads exactly the environment given here; settings alternate in
order per round, the same questions (encoded in the child, not timed) and index for each.

Reported per condition (idle; a ``--beside``-thread job beside) and setting: median search-only
latency of passage top 10 and top 100 (``--per-hit``) and sentence top 10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

#: name → the OpenMP variables of a child (others removed): libgomp's default, agrame's, two spin counts.
SETTINGS: Dict[str, Dict[str, str]] = {
    "libgomp default": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
}
_OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: what each child times: (label, granularity, top_k)
SEARCHES = (("passage top 10", "passage", 10), ("passage top 100", "passage", 100), ("sentence top 10", "sentence", 10))


def child(args) -> None:
    """Time the searches in this process (torch was imported before agrame: see :func:`run_child`)."""
    import torch

    from agrame.index import Index

    from .data import load_questions
    from .common import sample
    from .index_search import PoolVectors, build

    torch.set_num_threads(args.threads)
    vectors = PoolVectors(args.model)
    path, _ = build(vectors, 2)
    index = Index(path, model=vectors.encoder)
    questions = sample(load_questions(args.dataset, vectors.pool), args.limit, args.seed)
    encoded = {g: [index.encode_query(q.text, g) for q in questions] for g in ("passage", "sentence")}
    for q in encoded["passage"][:5]:
        index.search_vectors(*q, "passage", top_k=100, per_hit=args.per_hit)
    out = {}
    for label, granularity, k in SEARCHES:
        times = []
        for q, s in encoded[granularity]:
            t = time.perf_counter()
            index.search_vectors(q, s, granularity, top_k=k, per_hit=args.per_hit)
            times.append(1000 * (time.perf_counter() - t))
        out[label] = round(statistics.median(times), 1)
    print(json.dumps(out))


def run_child(setting: str, args) -> Dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in _OMP_VARS}
    env.update(SETTINGS[setting])
    argv = ["benchmarks.openmp_wait", "--child", "--model", args.model, "--dataset", args.dataset, "--limit",
            str(args.limit), "--seed", str(args.seed), "--threads", str(args.threads), "--per-hit", str(args.per_hit)]
    # torch first: agrame then leaves OpenMP's variables as this environment has them (agrame/__init__.py).
    code = f"import torch, runpy, sys; sys.argv = {argv!r}; runpy.run_module('benchmarks.openmp_wait', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.openmp_wait", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpu2100-agrame128")
    parser.add_argument("--dataset", default="nq-oracle", choices=("nq-oracle", "squad-dev"))
    parser.add_argument("--limit", type=int, default=100, help="questions sampled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-hit", type=int, default=3)
    parser.add_argument("--beside", type=int, default=2, metavar="THREADS", help="the second job's threads")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    from .common import busy_beside, command_line, load_snapshot, machine_load, write_result

    conditions: List[dict] = []
    for beside in (0, args.beside):
        with busy_beside(beside) as job:
            since = load_snapshot()
            rows: Dict[str, List[Dict[str, float]]] = {s: [] for s in args.settings}
            for r in range(args.rounds):
                for setting in (args.settings if r % 2 == 0 else args.settings[::-1]):
                    rows[setting].append(run_child(setting, args))
                    print(beside, setting, rows[setting][-1], file=sys.stderr, flush=True)
            conditions.append({
                "beside": f"a {beside}-thread job beside" if beside else "idle", "job": job, "load": machine_load(since),
                "ms": {s: {label: round(statistics.median(run[label] for run in runs), 1) for label, _, _ in SEARCHES}
                       for s, runs in rows.items()}})
    result = {"benchmark": "openmp_wait", "model": args.model, "dataset": args.dataset,
              "sample": {"questions": args.limit, "seed": args.seed}, "threads": args.threads,
              "per_hit": args.per_hit, "rounds": args.rounds, "settings": {s: SETTINGS[s] for s in args.settings},
              "conditions": conditions,
              "note": "median search-only ms a query (query encoding not timed), each setting in its own process"}
    name = f"openmp_wait-{args.dataset}"
    out = write_result(name, result, args.out, command_line("benchmarks.openmp_wait", argv))
    print(json.dumps(conditions, indent=1), "→", out)


if __name__ == "__main__":
    main()

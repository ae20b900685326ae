"""A training step's clustering for pooling-aware training: the batch on a device vs the host (issue 61).

    python -m benchmarks.pool_batch --device cuda --out pool-batch.json   # on a GPU (the device call runs it)
    python -m benchmarks.pool_batch --device cpu --passages 64            # here

A step of the device call trains 64 questions × 8 passages = 512 passages; before this, each was clustered on
the host (``agrame.pooling.pool_assignment``, ~1.8 ms a passage on one core: a ~4 s step). The target: the
512 clustered in ≤ 0.15 s, with assignments identical to the host's. The passages are synthetic with the
shape of the recipe's (``--doc-maxlen 256``: 100–256 scored tokens, sentences of 8–40 tokens, three protected
tokens, unit vectors of ``--dim`` 128); the device loop's cost depends on those sizes (its rounds are a
passage's merges), not on the values. Timed: the host's plan (what the sentences tell), the device clustering
(:func:`agrame.pooling.batch_pool_assignment`, synchronised) and the pooled means (:func:`batch_pool`), each
repeat; the host clustering of the same passages once, on one core, with the count of identical assignments.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch


def synthetic_passages(count: int, dim: int, seed: int = 0):
    """``count`` passages as (unit vectors ``[n, dim]`` float32, sentences ``[n]``), the recipe's shape."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        tokens = int(rng.integers(100, 257))
        seg, s = [-1, -1], 0
        while len(seg) < tokens - 1:
            seg += [s] * min(int(rng.integers(8, 41)), tokens - 1 - len(seg))
            s += 1
        seg.append(-1)
        x = rng.normal(size=(len(seg), dim))
        out.append(((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), np.array(seg)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(device: str, passages: int = 512, factor: float = 2, dim: int = 128, repeats: int = 3,
            seed: int = 0) -> dict:
    from agrame.pooling import BatchPlan, batch_pool, batch_pool_assignment, pool_assignment

    dev = torch.device(device)
    cases = synthetic_passages(passages, dim, seed)
    width = max(len(s) for _, s in cases)
    vectors = torch.zeros(passages, width, dim)
    segments = torch.full((passages, width), -1, dtype=torch.long)
    for b, (x, s) in enumerate(cases):
        vectors[b, :len(s)] = torch.from_numpy(x)
        segments[b, :len(s)] = torch.from_numpy(s)
    vectors, segments = vectors.to(dev), segments.to(dev)
    runs = []
    for _ in range(repeats + 1):  # the first warms the device up and is not counted
        _sync(dev)
        t0 = time.perf_counter()
        plan = BatchPlan([s for _, s in cases], factor, dim)
        t1 = time.perf_counter()
        assignment = batch_pool_assignment(vectors, plan)
        _sync(dev)
        t2 = time.perf_counter()
        batch_pool(vectors, assignment, plan.counts, segments)
        _sync(dev)
        t3 = time.perf_counter()
        runs.append({"plan_s": t1 - t0, "cluster_s": t2 - t1, "pool_s": t3 - t2, "total_s": t3 - t0})
    runs = runs[1:]
    got = assignment.cpu().numpy()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    identical = sum(bool((pool_assignment(x, s, factor) == got[b, :len(s)]).all()) for b, (x, s) in enumerate(cases))
    host = time.perf_counter() - t0
    torch.set_num_threads(threads)
    best = min(runs, key=lambda r: r["total_s"])
    return {"device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "torch": torch.__version__, "passages": passages, "factor": factor, "dim": dim, "seed": seed,
            "tokens": int(sum(len(s) for _, s in cases)), "rounds": plan.rounds,
            "repeats": [{k: round(v, 4) for k, v in r.items()} for r in runs],
            "best_total_s": round(best["total_s"], 4), "host_one_core_s": round(host, 3),
            "identical": identical, "target_s": 0.15, "met": best["total_s"] <= 0.15 and identical == passages}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--passages", type=int, default=512, help="a device step's: 64 questions × 8 passages")
    parser.add_argument("--factor", type=float, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here too")
    args = parser.parse_args(argv)
    result = measure(args.device, args.passages, args.factor, args.dim, args.repeats, args.seed)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()


__all__: List[str] = ["measure", "synthetic_passages"]
